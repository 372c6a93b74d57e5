// What a Gloo pair's listener reads from an arriving connection before Gloo
// may see it, reached as the gatekeeper reaches it: at most 40 bytes, in
// pieces (cut where the input's first byte says), each step checked with
// CheckPairProof. Only the exact proof is accepted, and a verdict once
// given never changes.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstring>

#include "core/comm/gloo_pair_guard.h"

namespace {
sockaddr_storage Loopback(int port) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(port));
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ss;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tessel::comm::ProofCheck;
  static const tessel::comm::PairProof expected =
      tessel::comm::MakePairProof("fuzz-secret-0123456789", Loopback(5000), Loopback(40000));
  if (size == 0) return 0;
  const size_t cut = data[0];
  const uint8_t* bytes = data + 1;
  const size_t n = std::min(size - 1, tessel::comm::kPairProofBytes);  // the gatekeeper reads no more
  ProofCheck verdict = ProofCheck::kNeedMore;
  for (size_t got : {std::min(cut, n), n}) {
    verdict = tessel::comm::CheckPairProof(bytes, got, expected);
    if (verdict != ProofCheck::kNeedMore) break;
  }
  const bool exact = n == expected.size() && std::memcmp(bytes, expected.data(), n) == 0;
  if ((verdict == ProofCheck::kProven) != exact) __builtin_trap();
  if (verdict == ProofCheck::kNeedMore && n == expected.size()) __builtin_trap();
  return 0;
}
