#include "core/comm/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <sstream>

#include "core/comm/socket.h"
#include "core/error.h"

namespace tessel::comm {

namespace {
// Wire format. Request: op u8, nkeys u32, keys (u32 len + bytes), value (u32
// len + bytes). Response: u32 len + bytes.
enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4 };

void PutU32(std::vector<char>& out, uint32_t v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + 4);
}

bool ReadBlob(int fd, std::vector<char>* out) {
  uint32_t len = 0;
  if (!ReadFull(fd, &len, 4)) return false;
  out->resize(len);
  return len == 0 || ReadFull(fd, out->data(), len);
}

bool WriteBlob(int fd, const std::vector<char>& blob) {
  std::vector<char> msg;
  PutU32(msg, static_cast<uint32_t>(blob.size()));
  msg.insert(msg.end(), blob.begin(), blob.end());
  return WriteFull(fd, msg.data(), msg.size());
}

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::ostringstream os;
  for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << keys[i];
  return os.str();
}
}  // namespace

// ---------------------------------------------------------------- server

TcpStoreServer::TcpStoreServer(int port) {
  listen_fd_ = ListenTcp(port, &port_);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  CloseSocket(listen_fd_);
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : conn_fds_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(conn_threads_);
  }
  for (auto& t : threads) t.join();
  for (int fd : conn_fds_) CloseSocket(fd);
}

void TcpStoreServer::AcceptLoop() {
  while (!stopping_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, 200);
    if (rc <= 0 || stopping_) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    conn_fds_.push_back(fd);
    conn_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  while (true) {
    uint8_t op = 0;
    uint32_t nkeys = 0;
    if (!ReadFull(fd, &op, 1) || !ReadFull(fd, &nkeys, 4)) return;
    std::vector<std::string> keys(nkeys);
    std::vector<char> blob;
    for (auto& key : keys) {
      if (!ReadBlob(fd, &blob)) return;
      key.assign(blob.begin(), blob.end());
    }
    std::vector<char> value;
    if (!ReadBlob(fd, &value)) return;

    // Every op but CHECK names exactly one key; anything else is not a
    // tessel client: drop the connection rather than guess.
    if (op != kCheck && keys.size() != 1) return;
    if (op == kAdd && value.size() != sizeof(int64_t)) return;
    std::vector<char> reply;
    {
      std::lock_guard<std::mutex> lock(mu_);
      switch (op) {
        case kSet:
          data_[keys[0]] = value;
          break;
        case kGet: {
          auto it = data_.find(keys[0]);
          reply.push_back(it != data_.end() ? 1 : 0);
          if (it != data_.end()) reply.insert(reply.end(), it->second.begin(), it->second.end());
          break;
        }
        case kAdd: {
          int64_t delta = 0, current = 0;
          std::memcpy(&delta, value.data(), sizeof(delta));
          auto& slot = data_[keys[0]];
          if (slot.size() == sizeof(int64_t)) std::memcpy(&current, slot.data(), sizeof(current));
          current += delta;
          slot.assign(reinterpret_cast<char*>(&current), reinterpret_cast<char*>(&current) + 8);
          reply = slot;
          break;
        }
        case kCheck:
          for (const auto& key : keys) reply.push_back(data_.count(key) ? 1 : 0);
          break;
        default:
          return;  // unknown op: drop the connection
      }
    }
    if (!WriteBlob(fd, reply)) return;
  }
}

// ---------------------------------------------------------------- client

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : address_(host + ":" + std::to_string(port)), timeout_(timeout) {
  fd_ = ConnectTcp(host, port, timeout);
}

TcpStore::~TcpStore() { CloseSocket(fd_); }

std::vector<char> TcpStore::Request(uint8_t op, const std::vector<std::string>& keys,
                                    const std::vector<char>& value) {
  std::vector<char> msg;
  msg.push_back(static_cast<char>(op));
  PutU32(msg, static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) {
    PutU32(msg, static_cast<uint32_t>(key.size()));
    msg.insert(msg.end(), key.begin(), key.end());
  }
  PutU32(msg, static_cast<uint32_t>(value.size()));
  msg.insert(msg.end(), value.begin(), value.end());

  std::lock_guard<std::mutex> lock(mu_);
  std::vector<char> reply;
  TESSEL_CHECK_CODE(WriteFull(fd_, msg.data(), msg.size()) && ReadBlob(fd_, &reply), StatusCode::kUnavailable)
      << "lost the connection to the rendezvous store at " << address_
      << " (rank 0, which serves it, may have exited) while accessing key(s) " << JoinKeys(keys);
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) { Request(kSet, {key}, value); }

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<char> reply = Request(kGet, {key}, {});
  return std::vector<char>(reply.begin() + 1, reply.end());
}

int64_t TcpStore::Add(const std::string& key, int64_t delta) {
  std::vector<char> value(reinterpret_cast<char*>(&delta), reinterpret_cast<char*>(&delta) + 8);
  std::vector<char> reply = Request(kAdd, {key}, value);
  int64_t result = 0;
  std::memcpy(&result, reply.data(), sizeof(result));
  return result;
}

std::vector<bool> TcpStore::Check(const std::vector<std::string>& keys) {
  std::vector<char> reply = Request(kCheck, keys, {});
  return std::vector<bool>(reply.begin(), reply.end());
}

std::vector<std::string> TcpStore::WaitFor(const std::vector<std::string>& keys,
                                           std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(1);
  while (true) {
    std::vector<bool> present = Check(keys);
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!present[i]) missing.push_back(keys[i]);
    }
    if (missing.empty() || Clock::now() >= deadline) return missing;
    std::this_thread::sleep_for(
        std::min(backoff, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) +
                              std::chrono::milliseconds(1)));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
  }
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
