// The rendezvous store's wire protocol and its server logic, without sockets.
//
// StoreServerCore holds the key-value data and one state machine per
// connection: bytes in, bytes out. The TCP server (tcp_store.cc) only moves
// bytes between sockets and this core; the fuzz target drives it directly.
//
// Every connection first proves it knows the job secret (challenge-response
// with HMAC-SHA256, both ways; the secret never crosses the wire). Until it
// has, the only thing read from it is one fixed-size hello. After that,
// requests are length-prefixed frames whose every length and count is
// checked against the limits below before anything is allocated: memory
// grows only with bytes that actually arrived, and never past a frame.
//
// Wire format (little-endian):
//   server hello  "TSLSTOR2" + nonce_s[32]
//   client hello  "TSLCLNT2" + rank i32 + nonce_c[32] + mac_c[32]
//                 mac_c = HMAC(secret, "tessel-store-client" nonce_s nonce_c rank)
//   server proof  "TSLOKAY2" + mac_s[32]
//                 mac_s = HMAC(secret, "tessel-store-server" nonce_s nonce_c rank)
//              or "TSLDENY2", then the server closes
//   request frame u32 length + body: op u8, then per op
//     kSet   key, value            -> status
//     kGet   key, wait_ms u32      -> status, value (kTimeout if absent)
//     kAdd   key, delta i64        -> status, new value i64
//     kCheck n u32, n keys         -> status, n bytes (1 = present)
//     kWait  n u32, n keys, wait_ms u32 -> status, n bytes present at reply
//   reply frame   u32 length + status u8 + payload (kError: a message)
//   key/value     u32 length + bytes
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace tessel::comm::store {

using Clock = std::chrono::steady_clock;
using Nonce = std::array<uint8_t, 32>;
using Mac = std::array<uint8_t, 32>;

// Limits, checked before any allocation.
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = 64u << 20;
inline constexpr size_t kMaxKeysPerRequest = 1u << 16;
inline constexpr size_t kMaxFrameBytes = kMaxValueBytes + (64u << 10);
inline constexpr uint32_t kMaxWaitMs = 24u * 3600 * 1000;
inline constexpr size_t kMaxStoreBytes = size_t{1} << 30;  // all keys and values together

inline constexpr char kServerHelloMagic[8] = {'T', 'S', 'L', 'S', 'T', 'O', 'R', '2'};
inline constexpr char kClientHelloMagic[8] = {'T', 'S', 'L', 'C', 'L', 'N', 'T', '2'};
inline constexpr char kProofMagic[8] = {'T', 'S', 'L', 'O', 'K', 'A', 'Y', '2'};
inline constexpr char kDenyMagic[8] = {'T', 'S', 'L', 'D', 'E', 'N', 'Y', '2'};
inline constexpr size_t kServerHelloBytes = 8 + 32;
inline constexpr size_t kClientHelloBytes = 8 + 4 + 32 + 32;
inline constexpr size_t kProofBytes = 8 + 32;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

Mac ClientMac(const std::string& secret, const Nonce& server_nonce, const Nonce& client_nonce, int32_t rank);
Mac ServerMac(const std::string& secret, const Nonce& server_nonce, const Nonce& client_nonce, int32_t rank);
bool MacEqual(const Mac& a, const Mac& b);  // constant time
Nonce RandomNonce();

// Little-endian framing helpers shared by client and server.
void PutU32(std::string& out, uint32_t v);
void PutBlob(std::string& out, const char* data, size_t n);
inline void PutBlob(std::string& out, const std::string& s) { PutBlob(out, s.data(), s.size()); }

// Reads fields from a received frame body; every read checks what is left.
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), left_(size) {}
  bool U8(uint8_t* v);
  bool U32(uint32_t* v);
  bool I64(int64_t* v);
  // A u32-length-prefixed blob of at most `max` bytes.
  bool Blob(std::string* out, size_t max);
  bool AtEnd() const { return left_ == 0; }

 private:
  const char* p_;
  size_t left_;
};

class StoreServerCore {
 public:
  struct Options {
    std::string secret;
    std::function<Nonce()> make_nonce = RandomNonce;
    std::chrono::milliseconds handshake_timeout{10000};
    size_t max_store_bytes = kMaxStoreBytes;
  };
  explicit StoreServerCore(Options options);
  ~StoreServerCore();

  // A new connection; its server hello is queued as output.
  int Open(Clock::time_point now, std::string peer);
  // Bytes received on `id`. Returns false when the connection must close;
  // reason() then says why (for the log).
  bool Feed(int id, const char* data, size_t n, Clock::time_point now);
  // Takes the bytes queued for `id` (the caller writes them).
  std::string TakeOutput(int id);
  bool HasOutput(int id) const;
  // Whether `id` wants more input now (false while it waits on keys or has
  // unsent output: clients speak one request at a time).
  bool WantsInput(int id) const;
  void Close(int id);
  // Answers waits whose deadline passed; returns connections whose
  // handshake took too long (the caller closes them).
  std::vector<int> Expire(Clock::time_point now);
  Clock::time_point NextDeadline() const;
  // Connections with output produced by another connection's request (a
  // set that completed their wait); cleared by the call.
  std::vector<int> TakeWoken();

  const std::string& reason(int id) const;
  bool authenticated(int id) const;
  size_t num_connections() const { return conns_.size(); }
  size_t num_pending() const;  // not yet authenticated
  // The oldest connection that has not authenticated, or -1.
  int OldestPending() const;
  // Ranks (from their hellos) with an open authenticated connection.
  std::multiset<int> ConnectedRanks() const;
  size_t data_bytes() const { return data_bytes_; }

 private:
  struct Conn;
  bool Handshake(Conn& c);
  bool ServeFrames(Conn& c, Clock::time_point now);
  bool Dispatch(Conn& c, const std::string& body, Clock::time_point now);
  void Reply(Conn& c, Status status, const std::string& payload);
  void FinishWait(Conn& c);
  void ParkWait(Conn& c, std::vector<std::string> keys, Clock::time_point deadline);
  void Unpark(Conn& c);
  bool Set(Conn& c, const std::string& key, std::string value);

  Options options_;
  int next_id_ = 1;
  std::map<int, std::unique_ptr<Conn>> conns_;
  std::map<std::string, std::string> data_;
  size_t data_bytes_ = 0;
  std::map<std::string, std::set<int>> waiters_;  // key -> connections waiting on it
  std::vector<int> woken_;
};

}  // namespace tessel::comm::store
