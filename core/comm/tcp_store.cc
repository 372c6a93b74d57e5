#include "core/comm/tcp_store.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/comm/socket.h"
#include "core/comm/store_protocol.h"
#include "core/error.h"

namespace tessel::comm {

using store::Clock;

namespace {
std::string JoinKeys(const std::vector<std::string>& keys) {
  std::ostringstream os;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) os << (i ? ", " : "") << keys[i];
  if (keys.size() > 8) os << ", ... (" << keys.size() << " keys)";
  return os.str();
}

// Logged individually up to this many; then one line per kDropLogEvery.
constexpr int64_t kDropLogFirst = 20;
constexpr int64_t kDropLogEvery = 1000;
constexpr size_t kReadChunk = 64u << 10;
}  // namespace

// ---------------------------------------------------------------- server

struct TcpStoreServer::Socket {
  int fd = -1;
  int id = 0;
  std::string peer;
  std::string wbuf;  // taken from the core, not yet written
  uint32_t interest = 0;
};

TcpStoreServer::TcpStoreServer(Options options) : options_(std::move(options)) {
  listen_fd_ = ListenTcp(options_.host, options_.port, &port_);
  ::fcntl(listen_fd_, F_SETFL, O_NONBLOCK);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  TESSEL_CHECK_CODE(epoll_fd_ >= 0 && wake_fd_ >= 0, StatusCode::kUnavailable)
      << "cannot start the store's event loop: " << std::strerror(errno);
  for (int fd : {listen_fd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = static_cast<uint64_t>(fd == listen_fd_ ? -1 : -2);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  store::StoreServerCore::Options core_options;
  core_options.secret = options_.secret;
  core_options.handshake_timeout = options_.handshake_timeout;
  core_ = std::make_unique<store::StoreServerCore>(core_options);
  thread_ = std::thread([this] { Loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  thread_.join();
  for (auto& [id, s] : sockets_) CloseSocket(s->fd);
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_, reserve_fd_}) CloseSocket(fd);
}

TcpStoreServer::Stats TcpStoreServer::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.open = sockets_.size();
  return s;
}

std::multiset<int> TcpStoreServer::ConnectedRanks() {
  std::lock_guard<std::mutex> lock(mu_);
  return core_->ConnectedRanks();
}

void TcpStoreServer::LogDrop(const std::string& peer, const std::string& why) {
  ++logged_drops_;
  if (logged_drops_ <= kDropLogFirst) {
    LOG(WARNING) << "rendezvous store: dropped a connection from " << peer << ": " << why;
  } else if (logged_drops_ % kDropLogEvery == 0) {
    LOG(WARNING) << "rendezvous store: " << logged_drops_ << " connections dropped so far (latest from "
                 << peer << ": " << why << ")";
  }
}

void TcpStoreServer::Loop() {
  epoll_event events[64];
  while (!stopping_) {
    int timeout_ms = 1000;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto next = core_->NextDeadline();
      if (next != Clock::time_point::max()) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
        timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
      }
      if (accept_paused_until_ != Clock::time_point{}) timeout_ms = std::min(timeout_ms, 100);
    }
    int n = ::epoll_wait(epoll_fd_, events, 64, timeout_ms);
    if (stopping_) break;
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < n; ++i) {
      auto tag = static_cast<int64_t>(events[i].data.u64);
      if (tag == -2) continue;  // wake-up for shutdown
      if (tag == -1) {
        AcceptAll();
        continue;
      }
      auto it = sockets_.find(static_cast<int>(tag));
      if (it == sockets_.end()) continue;
      Socket& s = *it->second;
      uint32_t ev = events[i].events;
      if (ev & EPOLLIN) OnReadable(s);
      if (!sockets_.count(static_cast<int>(tag))) continue;  // dropped while reading
      if (ev & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
        Drop(s.id, "");  // the peer went away
        continue;
      }
      if (ev & EPOLLOUT) Flush(s);
    }
    auto now = Clock::now();
    if (accept_paused_until_ != Clock::time_point{} && now >= accept_paused_until_) {
      accept_paused_until_ = {};
      if (reserve_fd_ < 0) reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = static_cast<uint64_t>(-1);
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    }
    for (int id : core_->Expire(now)) Drop(id, core_->reason(id));
    for (int id : core_->TakeWoken()) {
      auto it = sockets_.find(id);
      if (it != sockets_.end()) Flush(*it->second);
    }
  }
}

void TcpStoreServer::AcceptAll() {
  while (true) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: shed this connection with the spare one, and
        // stop polling the listen socket for a moment so it cannot spin the
        // loop while the process has none to give.
        if (reserve_fd_ >= 0) {
          ::close(reserve_fd_);
          int shed = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (shed >= 0) {
            ::close(shed);
            ++stats_.dropped;
            LogDrop("?", "this process is out of file descriptors");
          }
          reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
        return;
      }
      return;  // EAGAIN: nothing more to accept
    }
    ++stats_.accepted;
    std::string peer = PeerAddress(fd);
    if (sockets_.size() >= options_.max_connections) {
      ::close(fd);
      ++stats_.dropped;
      LogDrop(peer, "refused: " + std::to_string(options_.max_connections) + " connections are open");
      continue;
    }
    auto s = std::make_unique<Socket>();
    s->fd = fd;
    s->peer = peer;
    s->id = core_->Open(Clock::now(), peer);
    Socket& ref = *s;
    sockets_[s->id] = std::move(s);
    Flush(ref);  // the server hello
    if (core_->num_pending() > options_.max_pending) {
      int oldest = core_->OldestPending();
      Drop(oldest, "dropped: more than " + std::to_string(options_.max_pending) +
                       " connections were waiting to authenticate");
    }
  }
}

void TcpStoreServer::OnReadable(Socket& s) {
  const int id = s.id;  // `s` dies if the connection is dropped
  char buf[kReadChunk];
  while (s.wbuf.empty() && core_->WantsInput(s.id)) {
    ssize_t n = ::recv(s.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      Drop(s.id, "");  // closed by the peer
      return;
    }
    bool was_authenticated = core_->authenticated(s.id);
    if (!core_->Feed(s.id, buf, static_cast<size_t>(n), Clock::now())) {
      Drop(s.id, core_->reason(s.id));
      return;
    }
    if (!was_authenticated && core_->authenticated(s.id)) ++stats_.authenticated;
    Flush(s);
    if (!sockets_.count(id)) return;
  }
  UpdateInterest(s);
}

void TcpStoreServer::Flush(Socket& s) {
  while (true) {
    s.wbuf += core_->TakeOutput(s.id);
    while (!s.wbuf.empty()) {
      ssize_t n = ::send(s.fd, s.wbuf.data(), s.wbuf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      if (n <= 0) {
        Drop(s.id, "");
        return;
      }
      s.wbuf.erase(0, static_cast<size_t>(n));
    }
    if (!s.wbuf.empty()) break;
    // All sent: requests that arrived behind a wait or a full buffer can
    // be served now.
    if (!core_->WantsInput(s.id) || !core_->Feed(s.id, nullptr, 0, Clock::now())) {
      if (!core_->reason(s.id).empty()) {
        Drop(s.id, core_->reason(s.id));
        return;
      }
      break;
    }
    if (!core_->HasOutput(s.id)) break;
  }
  UpdateInterest(s);
}

void TcpStoreServer::UpdateInterest(Socket& s) {
  uint32_t want = EPOLLRDHUP;
  if (!s.wbuf.empty()) {
    want |= EPOLLOUT;
  } else if (core_->WantsInput(s.id)) {
    want |= EPOLLIN;
  }
  if (want == s.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = static_cast<uint64_t>(s.id);
  ::epoll_ctl(epoll_fd_, s.interest == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, s.fd, &ev);
  s.interest = want;
}

void TcpStoreServer::Drop(int id, const std::string& why) {
  auto it = sockets_.find(id);
  if (it == sockets_.end()) return;
  Socket& s = *it->second;
  if (!why.empty()) {
    // Best effort: a rejected client learns why (e.g. a wrong secret).
    std::string last = s.wbuf + core_->TakeOutput(id);
    if (!last.empty()) [[maybe_unused]]
      ssize_t n = ::send(s.fd, last.data(), last.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ++stats_.dropped;
    LogDrop(s.peer, why);
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.fd, nullptr);
  CloseSocket(s.fd);
  core_->Close(id);
  sockets_.erase(it);
}

// ---------------------------------------------------------------- client

TcpStore::TcpStore(const std::string& host, int port, const std::string& secret, int rank,
                   std::chrono::milliseconds timeout)
    : address_(host + ":" + std::to_string(port)), timeout_(timeout) {
  Connect(host, port, secret, rank);
}

TcpStore::~TcpStore() { CloseSocket(fd_); }

void TcpStore::Connect(const std::string& host, int port, const std::string& secret, int rank) {
  auto deadline = Clock::now() + timeout_;
  auto backoff = std::chrono::milliseconds(10);
  std::string last = "no answer";
  auto seconds = timeout_.count() / 1000.0;
  bool first = true;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    int fd = ConnectTcp(host, port, first ? timeout_ : std::max(left, std::chrono::milliseconds(1)));
    first = false;
    char hello[store::kServerHelloBytes];
    IoResult r = ReadFull(fd, hello, sizeof(hello), deadline);
    if (r == IoResult::kOk) {
      if (std::memcmp(hello, store::kServerHelloMagic, 8) != 0) {
        CloseSocket(fd);
        TESSEL_THROW(StatusCode::kUnavailable)
            << "the process listening at MASTER_ADDR:MASTER_PORT=" << address_
            << " is not a tessel rendezvous store (its greeting is not tessel's); another program holds the "
               "port";
      }
      store::Nonce server_nonce{}, client_nonce = store::RandomNonce();
      std::memcpy(server_nonce.data(), hello + 8, 32);
      int32_t r32 = rank;
      store::Mac mac = store::ClientMac(secret, server_nonce, client_nonce, r32);
      std::string reply(store::kClientHelloMagic, 8);
      reply.append(reinterpret_cast<const char*>(&r32), 4);
      reply.append(reinterpret_cast<const char*>(client_nonce.data()), 32);
      reply.append(reinterpret_cast<const char*>(mac.data()), 32);
      char proof[store::kProofBytes];
      r = WriteFull(fd, reply.data(), reply.size(), deadline);
      if (r == IoResult::kOk) r = ReadFull(fd, proof, 8, deadline);
      if (r == IoResult::kOk && std::memcmp(proof, store::kDenyMagic, 8) == 0) {
        CloseSocket(fd);
        TESSEL_THROW(StatusCode::kInvalidArgument)
            << "the rendezvous store at " << address_
            << " rejected this rank's job secret: every rank must have "
            << "the same TESSEL_JOB_SECRET (tessel-launch sets it; on several nodes give each launcher the "
               "same "
            << "--secret_file)";
      }
      if (r == IoResult::kOk) r = ReadFull(fd, proof + 8, 32, deadline);
      if (r == IoResult::kOk) {
        store::Mac got{};
        std::memcpy(got.data(), proof + 8, 32);
        if (std::memcmp(proof, store::kProofMagic, 8) != 0 ||
            !store::MacEqual(got, store::ServerMac(secret, server_nonce, client_nonce, r32))) {
          CloseSocket(fd);
          TESSEL_THROW(StatusCode::kInvalidArgument)
              << "the process at " << address_
              << " could not prove it knows this job's secret: it is another "
              << "job's store, or TESSEL_JOB_SECRET differs between ranks";
        }
        fd_ = fd;
        return;
      }
    }
    CloseSocket(fd);
    if (r == IoResult::kTimeout) {
      TESSEL_THROW(StatusCode::kTimeout)
          << "the rendezvous store at MASTER_ADDR:MASTER_PORT=" << address_
          << " accepted the connection but did "
          << "not answer within " << seconds << " s: rank 0 (which serves it) may be stopped or hung, or a "
          << "program that is not tessel's store holds the port";
    }
    // Closed during the handshake: the server may have shed us under load.
    last = "the connection was closed during the handshake";
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  TESSEL_THROW(StatusCode::kUnavailable)
      << "cannot join the rendezvous store at " << address_ << " within " << seconds << " s: " << last;
}

std::pair<uint8_t, std::string> TcpStore::Request(const std::string& body,
                                                  std::chrono::milliseconds extra_wait,
                                                  const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSEL_CHECK_CODE(fd_ >= 0, StatusCode::kUnavailable)
      << "the connection to the rendezvous store at " << address_
      << " was lost earlier; cannot access key(s) " << JoinKeys(keys);
  auto deadline = Clock::now() + timeout_ + extra_wait;
  std::string frame;
  store::PutU32(frame, static_cast<uint32_t>(body.size()));
  frame += body;
  IoResult r = WriteFull(fd_, frame.data(), frame.size(), deadline);
  uint32_t len = 0;
  if (r == IoResult::kOk) r = ReadFull(fd_, &len, 4, deadline);
  std::string reply;
  if (r == IoResult::kOk) {
    if (len == 0 || len > store::kMaxFrameBytes + 1) {
      r = IoResult::kClosed;  // not a reply tessel's store sends
    } else {
      reply.resize(len);
      r = ReadFull(fd_, reply.data(), len, deadline);
    }
  }
  if (r != IoResult::kOk) {
    CloseSocket(fd_);
    fd_ = -1;
    TESSEL_CHECK_CODE(r != IoResult::kTimeout, StatusCode::kTimeout)
        << "the rendezvous store at " << address_ << " did not answer within "
        << (timeout_ + extra_wait).count() / 1000.0 << " s while accessing key(s) " << JoinKeys(keys)
        << "; rank 0, which serves it, may be stopped or hung";
    TESSEL_THROW(StatusCode::kUnavailable)
        << "lost the connection to the rendezvous store at " << address_
        << " (rank 0, which serves it, may have exited) while accessing key(s) " << JoinKeys(keys);
  }
  uint8_t status = static_cast<uint8_t>(reply[0]);
  reply.erase(0, 1);
  TESSEL_CHECK_CODE(status != store::kError, StatusCode::kInvalidArgument)
      << "the rendezvous store at " << address_ << " refused a request: " << reply;
  return {status, std::move(reply)};
}

namespace {
void CheckKey(const std::string& key) {
  TESSEL_CHECK(key.size() <= store::kMaxKeyBytes)
      << "store key of " << key.size() << " bytes ('" << key.substr(0, 64)
      << "...'); the store takes keys of at most " << store::kMaxKeyBytes << " bytes";
}
uint32_t WaitMs(std::chrono::milliseconds timeout) {
  return static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, store::kMaxWaitMs));
}
}  // namespace

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  CheckKey(key);
  TESSEL_CHECK(value.size() <= store::kMaxValueBytes)
      << "store value of " << value.size() << " bytes for key '" << key << "'; the store takes at most "
      << store::kMaxValueBytes << " bytes";
  std::string body(1, static_cast<char>(store::kSet));
  store::PutBlob(body, key);
  store::PutBlob(body, value.data(), value.size());
  Request(body, {}, {key});
}

std::vector<char> TcpStore::get(const std::string& key) {
  CheckKey(key);
  std::string body(1, static_cast<char>(store::kGet));
  store::PutBlob(body, key);
  store::PutU32(body, WaitMs(timeout_));
  auto [status, value] = Request(body, timeout_, {key});
  TESSEL_CHECK_CODE(status == store::kOk, StatusCode::kTimeout)
      << "rendezvous timed out after " << timeout_.count() / 1000.0 << " s waiting for key(s) " << key
      << " in the store at " << address_
      << "; a rank has not reached this point (crashed, hung, or never started)";
  return std::vector<char>(value.begin(), value.end());
}

int64_t TcpStore::Add(const std::string& key, int64_t delta) {
  CheckKey(key);
  std::string body(1, static_cast<char>(store::kAdd));
  store::PutBlob(body, key);
  body.append(reinterpret_cast<const char*>(&delta), 8);
  auto [status, value] = Request(body, {}, {key});
  TESSEL_CHECK_CODE(value.size() == 8, StatusCode::kInternal) << "malformed reply to add on key " << key;
  int64_t result = 0;
  std::memcpy(&result, value.data(), sizeof(result));
  return result;
}

std::vector<bool> TcpStore::Check(const std::vector<std::string>& keys) {
  std::vector<bool> present;
  for (size_t begin = 0; begin < keys.size(); begin += store::kMaxKeysPerRequest) {
    std::vector<std::string> chunk(keys.begin() + begin,
                                   keys.begin() + std::min(keys.size(), begin + store::kMaxKeysPerRequest));
    std::string body(1, static_cast<char>(store::kCheck));
    store::PutU32(body, static_cast<uint32_t>(chunk.size()));
    for (const auto& k : chunk) {
      CheckKey(k);
      store::PutBlob(body, k);
    }
    auto [status, reply] = Request(body, {}, chunk);
    TESSEL_CHECK_CODE(reply.size() == chunk.size(), StatusCode::kInternal) << "malformed reply to check";
    for (char c : reply) present.push_back(c != 0);
  }
  return present;
}

std::vector<std::string> TcpStore::WaitFor(const std::vector<std::string>& keys,
                                           std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::vector<std::string> missing;
  for (size_t begin = 0; begin < keys.size(); begin += store::kMaxKeysPerRequest) {
    std::vector<std::string> chunk(keys.begin() + begin,
                                   keys.begin() + std::min(keys.size(), begin + store::kMaxKeysPerRequest));
    auto left = std::max(std::chrono::milliseconds(0),
                         std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    std::string body(1, static_cast<char>(store::kWait));
    store::PutU32(body, static_cast<uint32_t>(chunk.size()));
    for (const auto& k : chunk) {
      CheckKey(k);
      store::PutBlob(body, k);
    }
    store::PutU32(body, WaitMs(left));
    auto [status, present] = Request(body, left, chunk);
    TESSEL_CHECK_CODE(present.size() == chunk.size(), StatusCode::kInternal) << "malformed reply to wait";
    for (size_t i = 0; i < chunk.size(); ++i) {
      if (!present[i]) missing.push_back(chunk[i]);
    }
  }
  return missing;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> missing = WaitFor(keys, timeout);
  TESSEL_CHECK_CODE(missing.empty(), StatusCode::kTimeout)
      << "rendezvous timed out after " << timeout.count() / 1000.0 << " s waiting for key(s) "
      << JoinKeys(missing) << " in the store at " << address_
      << "; a rank has not reached this point (crashed, hung, or never started)";
}

}  // namespace tessel::comm
