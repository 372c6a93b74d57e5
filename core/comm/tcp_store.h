// Rendezvous key-value store over TCP, served by rank 0.
//
// TcpStoreServer runs in rank 0's process on MASTER_PORT; every rank, rank
// 0 included, talks to it through a TcpStore client. The client implements
// Gloo's rendezvous Store, so Gloo contexts connect through it, and it
// carries other bootstrap data (e.g. NCCL unique ids).
//
// The server is one event-loop thread over non-blocking sockets: stray or
// hostile connections cost a bounded amount of memory and one descriptor
// until they are dropped, and never stop the process (protocol and limits:
// store_protocol.h). Clients prove the job secret before any command, and
// every client call has a deadline: a stopped server or a silent listener
// on MASTER_PORT is an error naming the address, never a hang.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tessel::comm {

namespace store {
class StoreServerCore;
}

class TcpStoreServer {
 public:
  struct Options {
    // Listen address: loopback for one host; MASTER_ADDR's interface for
    // several. Never all interfaces unless set to "0.0.0.0" or "::".
    std::string host = "127.0.0.1";
    int port = 0;  // 0 = any free port
    std::string secret;
    size_t max_connections = 4096;
    // Connections that have not authenticated yet; beyond this the oldest
    // is dropped, so a flood cannot hold the slots legitimate ranks need.
    size_t max_pending = 128;
    std::chrono::milliseconds handshake_timeout{10000};
  };
  // Binds and starts serving; throws if the address cannot be bound.
  explicit TcpStoreServer(Options options);
  ~TcpStoreServer();
  int port() const { return port_; }

  struct Stats {
    int64_t accepted = 0;
    int64_t authenticated = 0;
    int64_t dropped = 0;  // closed by the server: malformed, unauthenticated, late, refused
    size_t open = 0;
  };
  Stats stats();
  // Ranks (as their hellos claim) with an open authenticated connection.
  std::multiset<int> ConnectedRanks();

 private:
  struct Socket;
  void Loop();
  void AcceptAll();
  void OnReadable(Socket& s);
  void Flush(Socket& s);
  void Drop(int id, const std::string& why);
  void UpdateInterest(Socket& s);
  void LogDrop(const std::string& peer, const std::string& why);

  Options options_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int reserve_fd_ = -1;  // spare descriptor, given up to shed a connection when the process runs out
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // guards everything below against stats()/ConnectedRanks()
  std::unique_ptr<store::StoreServerCore> core_;
  std::map<int, std::unique_ptr<Socket>> sockets_;  // by connection id
  Stats stats_;
  int64_t logged_drops_ = 0;
  std::chrono::steady_clock::time_point accept_paused_until_{};
  std::thread thread_;
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to host:port and authenticates with `secret` as `rank`,
  // retrying for up to `timeout`, which is also the deadline of each call
  // (get() and wait() wait up to it for keys to appear).
  TcpStore(const std::string& host, int port, const std::string& secret, int rank,
           std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& value) override;
  // Blocks until `key` exists (up to the default timeout) and returns it.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Atomically adds `delta` to the integer at `key` (0 if absent); returns the new value.
  int64_t Add(const std::string& key, int64_t delta);
  // Which of `keys` exist now, without waiting.
  std::vector<bool> Check(const std::vector<std::string>& keys);
  // Like wait(), but returns the keys still missing at the deadline instead of throwing.
  std::vector<std::string> WaitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& address() const { return address_; }

 private:
  void Connect(const std::string& host, int port, const std::string& secret, int rank);
  // Sends one request frame and returns the reply's status and payload.
  std::pair<uint8_t, std::string> Request(const std::string& body, std::chrono::milliseconds extra_wait,
                                          const std::vector<std::string>& keys);

  int fd_ = -1;
  std::string address_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

}  // namespace tessel::comm
