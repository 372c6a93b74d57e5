#include "core/comm/gloo_pair_guard.h"

#include <elf.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <link.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "core/comm/job_secret.h"
#include "core/comm/socket.h"
#include "core/error.h"

// How the guard sits under Gloo without blocking Gloo's event loop.
//
// Gloo registers a pair's listening socket with its epoll loop and calls
// accept(2) when the loop reports it readable. The guard's epoll_ctl puts an
// eventfd in the loop's set in the listener's place and hands the listener
// (a duplicate of its descriptor) to the guard's own thread, the gatekeeper.
// The gatekeeper accepts and reads proofs; when one is right it keeps that
// connection for the listener and signals the eventfd, so Gloo's loop calls
// accept, and the guard's accept returns the proven connection. Gloo's loop
// never waits on a connection that has not proven itself: with the loop
// blocked on one listener, ranks waiting on each other's loops in a ring
// could deadlock during start-up.

namespace tessel::comm {

namespace {

using Clock = std::chrono::steady_clock;

void AppendAddress(std::string& out, const sockaddr_storage& ss) {
  uint16_t family = ss.ss_family;
  out.append(reinterpret_cast<const char*>(&family), sizeof(family));
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    out.append(reinterpret_cast<const char*>(&in->sin_port), sizeof(in->sin_port));
    out.append(reinterpret_cast<const char*>(&in->sin_addr), sizeof(in->sin_addr));
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    out.append(reinterpret_cast<const char*>(&in6->sin6_port), sizeof(in6->sin6_port));
    out.append(reinterpret_cast<const char*>(&in6->sin6_addr), sizeof(in6->sin6_addr));
  }
}

bool SockName(int fd, sockaddr_storage* ss, bool peer) {
  socklen_t len = sizeof(*ss);
  std::memset(ss, 0, sizeof(*ss));
  int rv = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(ss), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(ss), &len);
  return rv == 0;
}

// One listener of a Gloo pair, from its registration with Gloo's loop until
// Gloo takes its connection (or closes the pair).
struct GuardedListener {
  int gloo_fd = -1;   // Gloo's descriptor (Gloo closes it)
  int own_fd = -1;    // the gatekeeper's duplicate (closed when done)
  int wake_fd = -1;   // eventfd in Gloo's loop in the listener's place
  int epoll_fd = -1;  // Gloo's loop
  sockaddr_storage address{};
  std::string address_text;
  int proven_fd = -1;  // the connection for Gloo, once one proved the secret
  // Out of descriptors: the listener stays readable but nothing can be
  // accepted, so it rests instead of spinning the gatekeeper.
  Clock::time_point rest_until{};
};

struct Candidate {
  int fd = -1;
  int listener = -1;  // gloo_fd of its listener
  Clock::time_point since;
  PairProof bytes{};
  size_t got = 0;
  std::string peer;
};

struct Guard {
  std::string secret;
  PairGuardOptions options;
  std::mutex mu;
  std::map<int, GuardedListener> listeners;  // by Gloo's descriptor
  std::vector<Candidate> candidates;
  int control_fd = -1;  // eventfd: the listener set changed
  std::atomic<int64_t> refused{0};
};

Guard* g_guard = nullptr;  // never destroyed: Gloo may call in until exit
std::mutex g_install_mu;

void Notify(int fd) {
  uint64_t one = 1;
  ssize_t ignored = ::write(fd, &one, sizeof(one));
  (void)ignored;
}

void Refuse(Guard& g, Candidate& c, const std::string& listener, const std::string& why) {
  g.refused.fetch_add(1);
  LOG_FIRST_N(WARNING, 16) << "refused a connection to communication listener " << listener << " from "
                           << c.peer << ": " << why
                           << " (it did not prove the job's secret; Gloo never saw it)";
  ::close(c.fd);
  c.fd = -1;
}

// Reads what a candidate sent; true when it is decided (proven or refused).
bool ReadProof(Guard& g, Candidate& c, GuardedListener& l) {
  ssize_t n = ::recv(c.fd, c.bytes.data() + c.got, c.bytes.size() - c.got, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
  if (n <= 0) {
    Refuse(g, c, l.address_text,
           n == 0 ? "closed before sending a proof" : std::string("read: ") + std::strerror(errno));
    return true;
  }
  c.got += static_cast<size_t>(n);
  // The MAC names the listener and the connecting side (its address here).
  sockaddr_storage peer{};
  PairProof expected{};
  if (c.got == c.bytes.size()) {
    if (!SockName(c.fd, &peer, /*peer=*/true)) {
      Refuse(g, c, l.address_text, "its address is unknown");
      return true;
    }
    expected = MakePairProof(g.secret, l.address, peer);
  }
  switch (CheckPairProof(c.bytes.data(), c.got, expected)) {
    case ProofCheck::kNeedMore:
      return false;
    case ProofCheck::kNotAProof:
      Refuse(g, c, l.address_text,
             "sent " +
                 PrintableBytes(std::string_view(reinterpret_cast<const char*>(c.bytes.data()), c.got)) +
                 ", not a tessel pair proof");
      return true;
    case ProofCheck::kWrongProof:
      Refuse(g, c, l.address_text, "wrong proof (a process with another job's secret?)");
      return true;
    case ProofCheck::kProven:
      break;
  }
  l.proven_fd = c.fd;
  c.fd = -1;
  Notify(l.wake_fd);
  return true;
}

void CloseListenerLocked(Guard& g, GuardedListener& l) {
  for (Candidate& c : g.candidates)
    if (c.listener == l.gloo_fd && c.fd >= 0)
      Refuse(g, c, l.address_text, "its pair has its peer or has closed");
  if (l.own_fd >= 0) ::close(l.own_fd);
  l.own_fd = -1;
}

void RunGatekeeper(Guard& g) {
  std::vector<pollfd> fds;
  // Per pollfd: what it is (control, listener, candidate) and which (Gloo's
  // descriptor of the listener, or the candidate's index).
  enum class Kind { kControl, kListener, kCandidate };
  std::vector<std::pair<Kind, int>> owners;
  for (;;) {
    fds.clear();
    owners.clear();
    Clock::time_point next_deadline = Clock::now() + std::chrono::seconds(60);
    {
      std::lock_guard<std::mutex> lock(g.mu);
      fds.push_back({g.control_fd, POLLIN, 0});
      owners.push_back({Kind::kControl, -1});
      const Clock::time_point now = Clock::now();
      for (auto& [gloo_fd, l] : g.listeners) {
        if (l.own_fd < 0 || l.proven_fd >= 0) continue;
        if (now < l.rest_until) {
          next_deadline = std::min(next_deadline, l.rest_until);
          continue;
        }
        fds.push_back({l.own_fd, POLLIN, 0});
        owners.push_back({Kind::kListener, gloo_fd});
      }
      for (size_t i = 0; i < g.candidates.size(); ++i) {
        fds.push_back({g.candidates[i].fd, POLLIN, 0});
        owners.push_back({Kind::kCandidate, static_cast<int>(i)});
        next_deadline = std::min(next_deadline, g.candidates[i].since + g.options.proof_timeout);
      }
    }
    auto wait_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now()).count();
    int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait_ms + 1, 0, 60000)));
    if (ready < 0 && errno != EINTR) PLOG(FATAL) << "the communication gatekeeper's poll failed";

    std::lock_guard<std::mutex> lock(g.mu);
    const Clock::time_point now = Clock::now();
    for (size_t k = 0; k < fds.size() && ready > 0; ++k) {
      if (fds[k].revents == 0) continue;
      const auto [kind, which] = owners[k];
      if (kind == Kind::kControl) {
        uint64_t count;
        ssize_t ignored = ::read(g.control_fd, &count, sizeof(count));
        (void)ignored;
        continue;
      }
      if (kind == Kind::kListener) {
        auto it = g.listeners.find(which);
        if (it == g.listeners.end() || it->second.own_fd != fds[k].fd || it->second.proven_fd >= 0) continue;
        // Take the connections waiting (the kernel's queue stays short), a
        // bounded number per pass so that one flooded listener cannot hold
        // the others' readers back.
        for (int taken = 0; taken < 256; ++taken) {
          int fd = ::accept4(it->second.own_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
              it->second.rest_until = now + std::chrono::milliseconds(100);
            break;
          }
          Candidate c;
          c.fd = fd;
          c.listener = it->first;
          c.since = now;
          c.peer = PeerAddress(fd);
          int pending = 0;
          for (Candidate& other : g.candidates) pending += other.listener == c.listener && other.fd >= 0;
          if (pending >= g.options.max_pending) {
            for (Candidate& oldest : g.candidates) {
              if (oldest.listener == c.listener && oldest.fd >= 0) {
                Refuse(g, oldest, it->second.address_text, "dropped: too many connections waiting at once");
                break;
              }
            }
          }
          g.candidates.push_back(std::move(c));
        }
        continue;
      }
      size_t index = static_cast<size_t>(which);
      if (index >= g.candidates.size()) continue;
      Candidate& c = g.candidates[index];
      if (c.fd != fds[k].fd) continue;
      auto it = g.listeners.find(c.listener);
      if (it == g.listeners.end() || it->second.proven_fd >= 0) {
        ::close(c.fd);
        c.fd = -1;
        continue;
      }
      if (ReadProof(g, c, it->second) && it->second.proven_fd >= 0) CloseListenerLocked(g, it->second);
    }
    for (Candidate& c : g.candidates) {
      if (c.fd < 0 || now - c.since < g.options.proof_timeout) continue;
      auto it = g.listeners.find(c.listener);
      Refuse(g, c, it == g.listeners.end() ? std::string("?") : it->second.address_text,
             "sent no proof within " + std::to_string(g.options.proof_timeout.count() / 1000.0) + " s");
    }
    std::erase_if(g.candidates, [](const Candidate& c) { return c.fd < 0; });
  }
}

bool IsListening(int fd) {
  int listening = 0;
  socklen_t len = sizeof(listening);
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0;
}

// ---- What Gloo calls instead of the C library -----------------------------

int GuardedEpollCtl(int epfd, int op, int fd, epoll_event* event) {
  Guard& g = *g_guard;
  if (op == EPOLL_CTL_ADD && event != nullptr && (event->events & EPOLLIN) && IsListening(fd)) {
    GuardedListener l;
    l.gloo_fd = fd;
    l.epoll_fd = epfd;
    l.own_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    l.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l.own_fd < 0 || l.wake_fd < 0 || !SockName(fd, &l.address, /*peer=*/false)) {
      int saved = errno;
      if (l.own_fd >= 0) ::close(l.own_fd);
      if (l.wake_fd >= 0) ::close(l.wake_fd);
      errno = saved;
      return -1;
    }
    l.address_text = LocalAddress(fd);
    // Gloo listens with a backlog of one; the gatekeeper drains the queue,
    // but a burst of strangers should not push the real peer's SYN out.
    ::listen(l.own_fd, 128);
    ::fcntl(l.own_fd, F_SETFL, ::fcntl(l.own_fd, F_GETFL) | O_NONBLOCK);
    epoll_event wake{};
    wake.events = EPOLLIN;
    wake.data = event->data;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, l.wake_fd, &wake) != 0) {
      int saved = errno;
      ::close(l.own_fd);
      ::close(l.wake_fd);
      errno = saved;
      return -1;
    }
    {
      std::lock_guard<std::mutex> lock(g.mu);
      g.listeners[fd] = l;
    }
    Notify(g.control_fd);
    return 0;
  }
  if (op == EPOLL_CTL_DEL || op == EPOLL_CTL_MOD) {
    std::lock_guard<std::mutex> lock(g.mu);
    auto it = g.listeners.find(fd);
    if (it != g.listeners.end()) {
      GuardedListener& l = it->second;
      if (op == EPOLL_CTL_MOD) {  // Gloo does not modify a listener; keep the wake-up in its place
        epoll_event wake{};
        wake.events = EPOLLIN;
        if (event != nullptr) wake.data = event->data;
        return ::epoll_ctl(l.epoll_fd, EPOLL_CTL_MOD, l.wake_fd, &wake);
      }
      ::epoll_ctl(l.epoll_fd, EPOLL_CTL_DEL, l.wake_fd, nullptr);
      ::close(l.wake_fd);
      CloseListenerLocked(g, l);
      if (l.proven_fd >= 0) ::close(l.proven_fd);  // the pair closed before taking it
      g.listeners.erase(it);
      Notify(g.control_fd);
      return 0;
    }
  }
  return ::epoll_ctl(epfd, op, fd, event);
}

int GuardedAccept(int fd, sockaddr* address, socklen_t* address_len) {
  Guard& g = *g_guard;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    auto it = g.listeners.find(fd);
    if (it != g.listeners.end()) {
      GuardedListener& l = it->second;
      uint64_t count;
      ssize_t ignored = ::read(l.wake_fd, &count, sizeof(count));
      (void)ignored;
      if (l.proven_fd < 0) {  // not signalled: nothing for Gloo yet
        errno = EAGAIN;
        return -1;
      }
      int proven = l.proven_fd;
      l.proven_fd = -1;
      if (address != nullptr && address_len != nullptr) ::getpeername(proven, address, address_len);
      return proven;
    }
  }
  return ::accept(fd, address, address_len);
}

int GuardedConnect(int fd, const sockaddr* address, socklen_t address_len) {
  Guard& g = *g_guard;
  std::string secret;
  Clock::time_point deadline;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    secret = g.secret;
    deadline = Clock::now() + g.options.connect_timeout;
  }
  int rv = ::connect(fd, address, address_len);
  if (rv != 0 && errno != EINPROGRESS) return rv;
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60000)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r > 0) break;
  }
  int error = 0;
  socklen_t len = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return -1;
  if (error != 0) {
    errno = error;
    return -1;
  }
  sockaddr_storage listener{}, self{};
  std::memcpy(&listener, address, std::min<size_t>(address_len, sizeof(listener)));
  if (!SockName(fd, &self, /*peer=*/false)) return -1;
  PairProof proof = MakePairProof(secret, listener, self);
  IoResult sent = WriteFull(fd, proof.data(), proof.size(), deadline);
  if (sent != IoResult::kOk) {
    errno = sent == IoResult::kTimeout ? ETIMEDOUT : ECONNRESET;
    return -1;
  }
  return 0;
}

// ---- Redirecting Gloo's calls ---------------------------------------------

struct Redirect {
  const char* name;
  void* target;
  int patched = 0;
};

struct PatchSearch {
  std::vector<Redirect>* redirects = nullptr;
  bool apply = false;  // first a pass that only finds every slot, so a failure patches nothing
  std::string object;
  std::string error;
};

template <typename Rela>
void PatchTable(const Rela* table, size_t bytes, const ElfW(Sym) * symbols, const char* strings,
                ElfW(Addr) base, ElfW(Addr) relro_begin, ElfW(Addr) relro_end, PatchSearch& search) {
  const long page = ::sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < bytes / sizeof(Rela); ++i) {
#if __WORDSIZE == 64
    const size_t symbol = ELF64_R_SYM(table[i].r_info);
#else
    const size_t symbol = ELF32_R_SYM(table[i].r_info);
#endif
    if (symbol == 0) continue;
    std::string_view name(strings + symbols[symbol].st_name);
    for (Redirect& r : *search.redirects) {
      if (name != r.name) continue;
      if (!search.apply) {
        ++r.patched;
        continue;
      }
      auto* slot = reinterpret_cast<void**>(base + table[i].r_offset);
      auto page_start = reinterpret_cast<uintptr_t>(slot) & ~static_cast<uintptr_t>(page - 1);
      if (::mprotect(reinterpret_cast<void*>(page_start), page, PROT_READ | PROT_WRITE) != 0) {
        search.error = std::string("mprotect: ") + std::strerror(errno);
        return;
      }
      *slot = r.target;
      const auto at = reinterpret_cast<ElfW(Addr)>(slot);
      const bool relro = at >= relro_begin && at < relro_end;
      ::mprotect(reinterpret_cast<void*>(page_start), page, relro ? PROT_READ : PROT_READ | PROT_WRITE);
      ++r.patched;
    }
  }
}

int PatchObject(dl_phdr_info* info, size_t, void* data) {
  auto& search = *static_cast<PatchSearch*>(data);
  std::string_view path(info->dlpi_name ? info->dlpi_name : "");
  std::string_view file = path.substr(path.rfind('/') == std::string_view::npos ? 0 : path.rfind('/') + 1);
  if (!file.starts_with("libgloo.so")) return 0;
  search.object = std::string(path);
  const ElfW(Addr) base = info->dlpi_addr;
  const ElfW(Dyn)* dynamic = nullptr;
  ElfW(Addr) relro_begin = 0, relro_end = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_DYNAMIC) dynamic = reinterpret_cast<const ElfW(Dyn)*>(base + ph.p_vaddr);
    if (ph.p_type == PT_GNU_RELRO) {
      relro_begin = base + ph.p_vaddr;
      relro_end = relro_begin + ph.p_memsz;
    }
  }
  if (dynamic == nullptr) {
    search.error = "it has no dynamic section";
    return 1;
  }
  // The dynamic linker has usually made these absolute; some targets keep
  // them relative to the load address.
  auto absolute = [&](ElfW(Addr) p) { return p < base ? p + base : p; };
  const ElfW(Sym)* symbols = nullptr;
  const char* strings = nullptr;
  ElfW(Addr) plt = 0, rela = 0;
  size_t plt_bytes = 0, rela_bytes = 0;
  int64_t plt_kind = DT_RELA;
  for (const ElfW(Dyn)* d = dynamic; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        symbols = reinterpret_cast<const ElfW(Sym)*>(absolute(d->d_un.d_ptr));
        break;
      case DT_STRTAB:
        strings = reinterpret_cast<const char*>(absolute(d->d_un.d_ptr));
        break;
      case DT_JMPREL:
        plt = absolute(d->d_un.d_ptr);
        break;
      case DT_PLTRELSZ:
        plt_bytes = d->d_un.d_val;
        break;
      case DT_PLTREL:
        plt_kind = static_cast<int64_t>(d->d_un.d_val);
        break;
      case DT_RELA:
        rela = absolute(d->d_un.d_ptr);
        break;
      case DT_RELASZ:
        rela_bytes = d->d_un.d_val;
        break;
      default:
        break;
    }
  }
  if (symbols == nullptr || strings == nullptr || plt_kind != DT_RELA) {
    search.error = "its relocation tables are not the kind the guard reads (RELA)";
    return 1;
  }
  if (plt != 0)
    PatchTable(reinterpret_cast<const ElfW(Rela)*>(plt), plt_bytes, symbols, strings, base, relro_begin,
               relro_end, search);
  if (rela != 0 && search.error.empty())
    PatchTable(reinterpret_cast<const ElfW(Rela)*>(rela), rela_bytes, symbols, strings, base, relro_begin,
               relro_end, search);
  return 1;
}

}  // namespace

PairProof MakePairProof(const std::string& secret, const sockaddr_storage& listener,
                        const sockaddr_storage& connector) {
  std::string message = "tessel-gloo-pair";
  AppendAddress(message, listener);
  AppendAddress(message, connector);
  PairProof proof{};
  std::memcpy(proof.data(), kPairProofMagic, sizeof(kPairProofMagic));
  const std::array<uint8_t, 32> mac = SecretMac(secret, message);
  std::memcpy(proof.data() + sizeof(kPairProofMagic), mac.data(), mac.size());
  return proof;
}

ProofCheck CheckPairProof(const uint8_t* bytes, size_t size, const PairProof& expected) {
  if (size > kPairProofBytes) return ProofCheck::kNotAProof;
  const size_t magic = std::min(size, sizeof(kPairProofMagic));
  if (std::memcmp(bytes, kPairProofMagic, magic) != 0) return ProofCheck::kNotAProof;
  if (size < kPairProofBytes) return ProofCheck::kNeedMore;
  return CRYPTO_memcmp(bytes, expected.data(), kPairProofBytes) == 0 ? ProofCheck::kProven
                                                                     : ProofCheck::kWrongProof;
}

void GuardGlooPairs(const std::string& secret, const PairGuardOptions& options) {
  std::lock_guard<std::mutex> lock(g_install_mu);
  TESSEL_CHECK(!secret.empty()) << "guarding Gloo's pairs needs the job secret";
  if (g_guard != nullptr) {  // a later world in this process (its own secret)
    std::lock_guard<std::mutex> guard_lock(g_guard->mu);
    g_guard->secret = secret;
    g_guard->options = options;
    return;
  }
  auto guard = std::make_unique<Guard>();
  guard->secret = secret;
  guard->options = options;
  guard->control_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  TESSEL_CHECK_CODE(guard->control_fd >= 0, StatusCode::kUnavailable) << "eventfd: " << std::strerror(errno);

  std::vector<Redirect> redirects = {{"epoll_ctl", reinterpret_cast<void*>(&GuardedEpollCtl)},
                                     {"accept", reinterpret_cast<void*>(&GuardedAccept)},
                                     {"connect", reinterpret_cast<void*>(&GuardedConnect)}};
  PatchSearch search;
  search.redirects = &redirects;
  ::dl_iterate_phdr(&PatchObject, &search);
  std::string missing;
  for (const Redirect& r : redirects)
    if (r.patched == 0) missing += std::string(missing.empty() ? "" : ", ") + r.name;
  TESSEL_CHECK_CODE(!search.object.empty(), StatusCode::kUnavailable)
      << "cannot guard Gloo's connections: no libgloo.so is loaded in this process (tessel needs Gloo as a "
         "shared library)";
  TESSEL_CHECK_CODE(search.error.empty() && missing.empty(), StatusCode::kUnavailable)
      << "cannot guard Gloo's connections in " << search.object << ": "
      << (search.error.empty() ? "it does not call " + missing + " through its relocation table"
                               : search.error);
  // Every slot is there: only now is the guard installed (set before any
  // redirected call can arrive), so a refusal above leaves nothing behind.
  g_guard = guard.release();
  for (Redirect& r : redirects) r.patched = 0;
  search.apply = true;
  ::dl_iterate_phdr(&PatchObject, &search);
  TESSEL_CHECK_CODE(search.error.empty(), StatusCode::kUnavailable)
      << "cannot guard Gloo's connections in " << search.object << ": " << search.error;
  std::thread(RunGatekeeper, std::ref(*g_guard)).detach();  // lives as the process does
}

bool GlooPairsGuarded() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  return g_guard != nullptr;
}

int64_t GlooPairConnectionsRefused() { return g_guard == nullptr ? 0 : g_guard->refused.load(); }

}  // namespace tessel::comm
