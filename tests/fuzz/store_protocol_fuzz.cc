// The rendezvous store's wire protocol, server side, without sockets. The
// first input byte picks a scenario: raw bytes from a stranger, or a
// correctly authenticated client (so the fuzzer reaches the request
// parser); a second connection waits on keys so sets wake it. Chunk sizes
// and clock steps come from the input too. The core must never crash,
// allocate past its limits, or keep more than its bounded buffers.
#include <cstdint>
#include <cstring>
#include <string>

#include "core/comm/store_protocol.h"

namespace store = tessel::comm::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string secret = "fuzz-secret-0123456789";
  store::StoreServerCore::Options options;
  options.secret = secret;
  options.make_nonce = [] { return store::Nonce{}; };  // deterministic
  options.max_store_bytes = 1 << 20;
  store::StoreServerCore core(options);
  auto now = store::Clock::time_point{} + std::chrono::hours(1);
  int a = core.Open(now, "a");
  int b = core.Open(now, "b");
  uint8_t scenario = data[0], chunking = data[1];
  data += 2;
  size -= 2;

  auto hello = [&](int32_t rank) {
    store::Nonce client{};
    store::Mac mac = store::ClientMac(secret, store::Nonce{}, client, rank);
    std::string h(store::kClientHelloMagic, 8);
    h.append(reinterpret_cast<const char*>(&rank), 4);
    h.append(reinterpret_cast<const char*>(client.data()), 32);
    h.append(reinterpret_cast<const char*>(mac.data()), 32);
    return h;
  };
  bool a_open = true, b_open = true;
  if (scenario & 1) a_open = core.Feed(a, hello(0).data(), store::kClientHelloBytes, now);
  // b: authenticated, waits on two keys for up to 5 s.
  {
    std::string frame = hello(1), body(1, static_cast<char>(store::kWait));
    store::PutU32(body, 2);
    store::PutBlob(body, std::string("k"));
    store::PutBlob(body, std::string("tessel/x"));
    store::PutU32(body, 5000);
    store::PutU32(frame, static_cast<uint32_t>(body.size()));
    frame += body;
    b_open = core.Feed(b, frame.data(), frame.size(), now);
  }
  size_t chunk = 1 + chunking % 64;
  for (size_t pos = 0; pos < size && a_open; pos += chunk) {
    size_t n = std::min(chunk, size - pos);
    a_open = core.Feed(a, reinterpret_cast<const char*>(data + pos), n, now);
    if (core.TakeOutput(a).size() > store::kMaxFrameBytes + (2u << 20)) __builtin_trap();
    now += std::chrono::milliseconds(data[pos] * 10);
    for (int id : core.Expire(now)) {
      if (id == a) a_open = false;
      if (id == b) b_open = false;
      core.Close(id);
    }
    for (int id : core.TakeWoken()) {
      if ((id == a && a_open) || (id == b && b_open)) core.TakeOutput(id);
    }
    if (core.data_bytes() > options.max_store_bytes) __builtin_trap();
  }
  return 0;
}
