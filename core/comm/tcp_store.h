// Rendezvous key-value store over TCP, served by rank 0.
//
// TcpStoreServer runs in rank 0's process (or a launcher) on MASTER_PORT;
// every rank, rank 0 included, talks to it through a TcpStore client. The
// client implements Gloo's rendezvous Store, so Gloo contexts connect
// through it, and it carries other bootstrap data (e.g. NCCL unique ids).
// Every blocking call has a deadline and fails naming the keys it awaited.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessel::comm {

class TcpStoreServer {
 public:
  // Binds `port` (0 = any free port); throws if the port is in use.
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;  // guards data_, conns_
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> conn_fds_;
  std::vector<std::thread> conn_threads_;
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying for up to `timeout`, which is also the
  // default deadline of get() and wait().
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
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
  std::vector<char> Request(uint8_t op, const std::vector<std::string>& keys, const std::vector<char>& value);

  int fd_ = -1;
  std::string address_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

}  // namespace tessel::comm
