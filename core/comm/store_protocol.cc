#include "core/comm/store_protocol.h"

#include <openssl/crypto.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/comm/job_secret.h"
#include "core/comm/socket.h"
#include "core/error.h"

namespace tessel::comm::store {

namespace {
// Stop parsing a connection's requests while this much reply is unsent:
// a client that pipelines requests without reading replies gets no more.
constexpr size_t kMaxPendingOutput = 1u << 20;
// Input kept while a connection may not be served (waiting, or output full).
constexpr size_t kMaxBufferedInput = kMaxFrameBytes + 4 + (64u << 10);

Mac ComputeMac(const char* label, const std::string& secret, const Nonce& server_nonce,
               const Nonce& client_nonce, int32_t rank) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  msg.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  msg.append(reinterpret_cast<const char*>(&rank), sizeof(rank));
  return SecretMac(secret, msg);
}

}  // namespace

Mac ClientMac(const std::string& secret, const Nonce& server_nonce, const Nonce& client_nonce, int32_t rank) {
  return ComputeMac("tessel-store-client", secret, server_nonce, client_nonce, rank);
}

Mac ServerMac(const std::string& secret, const Nonce& server_nonce, const Nonce& client_nonce, int32_t rank) {
  return ComputeMac("tessel-store-server", secret, server_nonce, client_nonce, rank);
}

bool MacEqual(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

Nonce RandomNonce() {
  Nonce nonce{};
  size_t done = 0;
  while (done < nonce.size()) {
    ssize_t n = ::getrandom(nonce.data() + done, nonce.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    TESSEL_CHECK_CODE(n > 0, StatusCode::kInternal) << "getrandom: " << std::strerror(errno);
    done += static_cast<size_t>(n);
  }
  return nonce;
}

void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

void PutBlob(std::string& out, const char* data, size_t n) {
  PutU32(out, static_cast<uint32_t>(n));
  out.append(data, n);
}

bool Reader::U8(uint8_t* v) {
  if (left_ < 1) return false;
  *v = static_cast<uint8_t>(*p_);
  ++p_;
  --left_;
  return true;
}

bool Reader::U32(uint32_t* v) {
  if (left_ < 4) return false;
  std::memcpy(v, p_, 4);
  p_ += 4;
  left_ -= 4;
  return true;
}

bool Reader::I64(int64_t* v) {
  if (left_ < 8) return false;
  std::memcpy(v, p_, 8);
  p_ += 8;
  left_ -= 8;
  return true;
}

bool Reader::Blob(std::string* out, size_t max) {
  uint32_t len = 0;
  if (!U32(&len) || len > max || len > left_) return false;
  out->assign(p_, len);
  p_ += len;
  left_ -= len;
  return true;
}

// ---------------------------------------------------------------- server core

struct StoreServerCore::Conn {
  int id = 0;
  std::string peer;
  Clock::time_point opened;
  Nonce server_nonce{};
  bool authenticated = false;
  int32_t rank = -1;
  std::string in;      // received, not yet parsed
  std::string out;     // replies not yet taken
  std::string reason;  // why it must close
  // A parked kGet/kWait.
  bool waiting = false;
  uint8_t wait_op = 0;
  std::vector<std::string> wait_keys;
  size_t missing = 0;
  Clock::time_point wait_deadline;
};

StoreServerCore::StoreServerCore(Options options) : options_(std::move(options)) {}
StoreServerCore::~StoreServerCore() = default;

int StoreServerCore::Open(Clock::time_point now, std::string peer) {
  auto c = std::make_unique<Conn>();
  c->id = next_id_++;
  c->peer = std::move(peer);
  c->opened = now;
  c->server_nonce = options_.make_nonce();
  c->out.append(kServerHelloMagic, 8);
  c->out.append(reinterpret_cast<const char*>(c->server_nonce.data()), 32);
  int id = c->id;
  conns_[id] = std::move(c);
  return id;
}

bool StoreServerCore::Feed(int id, const char* data, size_t n, Clock::time_point now) {
  Conn& c = *conns_.at(id);
  if (c.in.size() + n > kMaxBufferedInput) {
    c.reason = "sent more than " + std::to_string(kMaxBufferedInput) + " bytes without reading its replies";
    return false;
  }
  c.in.append(data, n);
  if (!c.authenticated) {
    // Check the magic as soon as it arrives, so a stray client is dropped
    // at once rather than after the handshake timeout.
    size_t have = std::min<size_t>(c.in.size(), 8);
    if (std::memcmp(c.in.data(), kClientHelloMagic, have) != 0) {
      c.reason = "not a tessel store client (first bytes " + PrintableBytes(c.in) + ")";
      return false;
    }
    if (c.in.size() < kClientHelloBytes) return true;
    if (!Handshake(c)) return false;
  }
  return ServeFrames(c, now);
}

bool StoreServerCore::Handshake(Conn& c) {
  Nonce client_nonce{};
  Mac mac{};
  int32_t rank = -1;
  std::memcpy(&rank, c.in.data() + 8, 4);
  std::memcpy(client_nonce.data(), c.in.data() + 12, 32);
  std::memcpy(mac.data(), c.in.data() + 44, 32);
  c.in.erase(0, kClientHelloBytes);
  if (!MacEqual(mac, ClientMac(options_.secret, c.server_nonce, client_nonce, rank))) {
    c.out.append(kDenyMagic, 8);
    c.reason = "failed authentication (it does not know this job's secret; claimed rank " +
               std::to_string(rank) + ")";
    return false;
  }
  c.authenticated = true;
  c.rank = rank;
  Mac proof = ServerMac(options_.secret, c.server_nonce, client_nonce, rank);
  c.out.append(kProofMagic, 8);
  c.out.append(reinterpret_cast<const char*>(proof.data()), proof.size());
  return true;
}

bool StoreServerCore::ServeFrames(Conn& c, Clock::time_point now) {
  size_t pos = 0;
  bool ok = true;
  while (!c.waiting && c.out.size() < kMaxPendingOutput && c.in.size() - pos >= 4) {
    uint32_t len = 0;
    std::memcpy(&len, c.in.data() + pos, 4);
    if (len == 0 || len > kMaxFrameBytes) {
      c.reason =
          "sent a frame of " + std::to_string(len) + " bytes; expected 1.." + std::to_string(kMaxFrameBytes);
      ok = false;
      break;
    }
    if (c.in.size() - pos - 4 < len) break;  // the rest has not arrived yet
    std::string body = c.in.substr(pos + 4, len);
    pos += 4 + len;
    if (!Dispatch(c, body, now)) {
      ok = false;
      break;
    }
  }
  c.in.erase(0, pos);
  return ok;
}

void StoreServerCore::Reply(Conn& c, Status status, const std::string& payload) {
  PutU32(c.out, static_cast<uint32_t>(payload.size() + 1));
  c.out.push_back(static_cast<char>(status));
  c.out += payload;
}

bool StoreServerCore::Set(Conn& c, const std::string& key, std::string value) {
  auto it = data_.find(key);
  size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
  size_t added = key.size() + value.size();
  if (data_bytes_ - old + added > options_.max_store_bytes) {
    Reply(c, kError,
          "the store is full (" + std::to_string(data_bytes_) + " of " +
              std::to_string(options_.max_store_bytes) + " bytes); key '" + key + "' was not set");
    return false;
  }
  data_bytes_ = data_bytes_ - old + added;
  data_[key] = std::move(value);
  auto w = waiters_.find(key);
  if (w != waiters_.end()) {
    std::set<int> ids = std::move(w->second);
    waiters_.erase(w);
    for (int id : ids) {
      auto cit = conns_.find(id);
      if (cit == conns_.end()) continue;
      Conn& waiter = *cit->second;
      if (--waiter.missing == 0) {
        FinishWait(waiter);
        if (waiter.id != c.id) woken_.push_back(waiter.id);
      }
    }
  }
  return true;
}

void StoreServerCore::ParkWait(Conn& c, std::vector<std::string> keys, Clock::time_point deadline) {
  std::set<std::string> missing;
  for (const auto& k : keys) {
    if (!data_.count(k)) missing.insert(k);
  }
  c.waiting = true;
  c.wait_keys = std::move(keys);
  c.missing = missing.size();
  c.wait_deadline = deadline;
  for (const auto& k : missing) waiters_[k].insert(c.id);
}

void StoreServerCore::Unpark(Conn& c) {
  for (const auto& k : c.wait_keys) {
    auto w = waiters_.find(k);
    if (w == waiters_.end()) continue;
    w->second.erase(c.id);
    if (w->second.empty()) waiters_.erase(w);
  }
  c.waiting = false;
}

void StoreServerCore::FinishWait(Conn& c) {
  Unpark(c);
  if (c.wait_op == kGet) {
    auto it = data_.find(c.wait_keys[0]);
    if (it == data_.end()) {
      Reply(c, kTimeout, "");
    } else {
      Reply(c, kOk, it->second);
    }
  } else {
    std::string present;
    bool all = true;
    for (const auto& k : c.wait_keys) {
      bool has = data_.count(k) > 0;
      all &= has;
      present.push_back(has ? 1 : 0);
    }
    Reply(c, all ? kOk : kTimeout, present);
  }
  c.wait_keys.clear();
}

bool StoreServerCore::Dispatch(Conn& c, const std::string& body, Clock::time_point now) {
  Reader r(body.data(), body.size());
  uint8_t op = 0;
  r.U8(&op);
  auto malformed = [&](const char* what) {
    c.reason =
        std::string("sent a malformed ") + what + " request (" + std::to_string(body.size()) + " bytes)";
    return false;
  };
  switch (op) {
    case kSet: {
      std::string key, value;
      if (!r.Blob(&key, kMaxKeyBytes) || !r.Blob(&value, kMaxValueBytes) || !r.AtEnd())
        return malformed("set");
      if (Set(c, key, std::move(value))) Reply(c, kOk, "");
      return true;
    }
    case kGet: {
      std::string key;
      uint32_t wait_ms = 0;
      if (!r.Blob(&key, kMaxKeyBytes) || !r.U32(&wait_ms) || !r.AtEnd() || wait_ms > kMaxWaitMs)
        return malformed("get");
      auto it = data_.find(key);
      if (it != data_.end()) {
        Reply(c, kOk, it->second);
      } else if (wait_ms == 0) {
        Reply(c, kTimeout, "");
      } else {
        c.wait_op = kGet;
        ParkWait(c, {key}, now + std::chrono::milliseconds(wait_ms));
      }
      return true;
    }
    case kAdd: {
      std::string key;
      int64_t delta = 0;
      if (!r.Blob(&key, kMaxKeyBytes) || !r.I64(&delta) || !r.AtEnd()) return malformed("add");
      uint64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        if (it->second.size() != 8) {
          Reply(c, kError,
                "key '" + key + "' holds a " + std::to_string(it->second.size()) +
                    "-byte value, not a counter");
          return true;
        }
        std::memcpy(&current, it->second.data(), 8);
      }
      current += static_cast<uint64_t>(delta);  // wraps like a two's-complement counter
      std::string value(reinterpret_cast<const char*>(&current), 8);
      if (Set(c, key, value)) Reply(c, kOk, value);
      return true;
    }
    case kCheck:
    case kWait: {
      uint32_t n = 0;
      // Each key takes at least its 4-byte length: a count the body cannot
      // hold is rejected before anything is reserved.
      if (!r.U32(&n) || n > kMaxKeysPerRequest || size_t{n} * 4 > body.size()) return malformed("check/wait");
      std::vector<std::string> keys(n);
      for (auto& k : keys) {
        if (!r.Blob(&k, kMaxKeyBytes)) return malformed("check/wait");
      }
      if (op == kCheck) {
        if (!r.AtEnd()) return malformed("check");
        std::string present;
        for (const auto& k : keys) present.push_back(data_.count(k) ? 1 : 0);
        Reply(c, kOk, present);
        return true;
      }
      uint32_t wait_ms = 0;
      if (!r.U32(&wait_ms) || !r.AtEnd() || wait_ms > kMaxWaitMs) return malformed("wait");
      c.wait_op = kWait;
      ParkWait(c, std::move(keys), now + std::chrono::milliseconds(wait_ms));
      if (c.missing == 0) FinishWait(c);
      return true;
    }
    default:
      c.reason = "sent unknown op " + std::to_string(op);
      return false;
  }
}

std::string StoreServerCore::TakeOutput(int id) {
  std::string out;
  out.swap(conns_.at(id)->out);
  return out;
}

bool StoreServerCore::HasOutput(int id) const { return !conns_.at(id)->out.empty(); }

bool StoreServerCore::WantsInput(int id) const {
  const Conn& c = *conns_.at(id);
  return !c.waiting && c.out.empty();
}

void StoreServerCore::Close(int id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (it->second->waiting) Unpark(*it->second);
  conns_.erase(it);
}

std::vector<int> StoreServerCore::Expire(Clock::time_point now) {
  std::vector<int> late;
  for (auto& [id, c] : conns_) {
    if (!c->authenticated && now - c->opened >= options_.handshake_timeout) {
      c->reason =
          "sent no valid hello within " + std::to_string(options_.handshake_timeout.count() / 1000.0) + " s";
      late.push_back(id);
    } else if (c->waiting && now >= c->wait_deadline) {
      FinishWait(*c);
      woken_.push_back(id);
    }
  }
  return late;
}

Clock::time_point StoreServerCore::NextDeadline() const {
  Clock::time_point next = Clock::time_point::max();
  for (const auto& [id, c] : conns_) {
    if (!c->authenticated) next = std::min(next, c->opened + options_.handshake_timeout);
    if (c->waiting) next = std::min(next, c->wait_deadline);
  }
  return next;
}

std::vector<int> StoreServerCore::TakeWoken() {
  std::vector<int> woken;
  woken.swap(woken_);
  return woken;
}

const std::string& StoreServerCore::reason(int id) const { return conns_.at(id)->reason; }
bool StoreServerCore::authenticated(int id) const { return conns_.at(id)->authenticated; }

size_t StoreServerCore::num_pending() const {
  size_t n = 0;
  for (const auto& [id, c] : conns_) n += c->authenticated ? 0 : 1;
  return n;
}

int StoreServerCore::OldestPending() const {
  for (const auto& [id, c] : conns_) {
    if (!c->authenticated) return id;  // ids grow with time
  }
  return -1;
}

std::multiset<int> StoreServerCore::ConnectedRanks() const {
  std::multiset<int> ranks;
  for (const auto& [id, c] : conns_) {
    if (c->authenticated) ranks.insert(c->rank);
  }
  return ranks;
}

}  // namespace tessel::comm::store
