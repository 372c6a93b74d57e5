#include "core/comm/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace tessel::comm {

namespace {
struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head) ::freeaddrinfo(head);
  }
};

int PortOf(const sockaddr_storage& ss) {
  return ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
}

std::string Format(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    std::string out = "[";  // appended piecewise: GCC 12 warns (-Wrestrict) on the + chain
    out += host;
    out += "]:";
    out += std::to_string(port);
    return out;
  }
  return std::string(host) + ":" + std::to_string(port);
}

bool IsLoopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

// Waits until fd is ready for `events` or the deadline passes.
IoResult WaitReady(int fd, short events, SteadyTime deadline) {
  while (true) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return IoResult::kTimeout;
    pollfd pfd{fd, events, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return IoResult::kClosed;
    if (rc > 0) return IoResult::kOk;
  }
}
}  // namespace

int ListenTcp(const std::string& host, int port, int* bound_port) {
  TESSEL_CHECK(port >= 0 && port <= 65535) << "port " << port << " is out of range; expected 0..65535";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  AddrInfoList res;
  std::string port_text = std::to_string(port);
  int gai = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res.head);
  TESSEL_CHECK_CODE(gai == 0, StatusCode::kUnavailable)
      << "cannot resolve the store's listen address '" << host << "': " << ::gai_strerror(gai);
  int err = 0;
  for (addrinfo* ai = res.head; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      // "::" is dual-stack only when asked for explicitly; a specific v6
      // address is that address only.
      int v6only = IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr) ? 0 : 1;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    }
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      ::close(fd);
      continue;
    }
    TESSEL_CHECK_CODE(::listen(fd, 512) == 0, StatusCode::kUnavailable)
        << "listen on " << Format(ai->ai_addr) << ": " << std::strerror(errno);
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    *bound_port = PortOf(ss);
    return fd;
  }
  TESSEL_CHECK_CODE(err != EADDRINUSE, StatusCode::kUnavailable)
      << "MASTER_PORT " << port << " is already in use on " << host << "; pick a free port "
      << "(tessel-launch --master_port N, or 0 for any free port)";
  TESSEL_CHECK_CODE(err != EADDRNOTAVAIL, StatusCode::kUnavailable)
      << "cannot listen on MASTER_ADDR=" << host << ": it is not an address of this machine; set MASTER_ADDR "
      << "(tessel-launch --master_addr) to this host's address, or --store_bind_addr to the local address "
      << "that MASTER_ADDR reaches";
  TESSEL_THROW(StatusCode::kUnavailable)
      << "cannot listen on " << host << ":" << port << ": " << std::strerror(err);
}

int ConnectTcp(const std::string& host, int port, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    AddrInfoList res;
    std::string port_text = std::to_string(port);
    int gai = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res.head);
    if (gai != 0) {
      last_error = std::string("cannot resolve host: ") + ::gai_strerror(gai);
    } else {
      for (addrinfo* ai = res.head; ai != nullptr; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return fd;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    if (Clock::now() + backoff > deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  TESSEL_THROW(StatusCode::kUnavailable)
      << "cannot reach the rendezvous master at MASTER_ADDR=" << host << " MASTER_PORT=" << port << " within "
      << timeout.count() / 1000.0 << " s (" << last_error << "); is rank 0 running and the address right?";
}

IoResult ReadFull(int fd, void* buf, size_t n, SteadyTime deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    IoResult ready = WaitReady(fd, POLLIN, deadline);
    if (ready != IoResult::kOk) return ready;
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return IoResult::kClosed;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return IoResult::kOk;
}

IoResult WriteFull(int fd, const void* buf, size_t n, SteadyTime deadline) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    IoResult ready = WaitReady(fd, POLLOUT, deadline);
    if (ready != IoResult::kOk) return ready;
    ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return IoResult::kClosed;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return IoResult::kOk;
}

void CloseSocket(int fd) {
  if (fd >= 0) ::close(fd);
}

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return Format(reinterpret_cast<sockaddr*>(&ss));
}

std::string LocalAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return Format(reinterpret_cast<sockaddr*>(&ss));
}

std::string PrintableBytes(std::string_view bytes, size_t max) {
  std::string out = "\"";
  for (size_t i = 0; i < std::min(bytes.size(), max); ++i) {
    const unsigned char ch = static_cast<unsigned char>(bytes[i]);
    if (ch >= 0x20 && ch < 0x7f) {
      out += static_cast<char>(ch);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  return out + "\"";
}

bool IsLoopbackHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  AddrInfoList res;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res.head) != 0 || res.head == nullptr) return false;
  for (addrinfo* ai = res.head; ai != nullptr; ai = ai->ai_next) {
    if (!IsLoopback(ai->ai_addr)) return false;
  }
  return true;
}

}  // namespace tessel::comm
