// Authenticated connections for Gloo's TCP pairs.
//
// Gloo's TCP transport (the version tessel builds with) gives every pair of
// ranks a listening socket of its own and takes the first connection that
// reaches it as the peer, with no handshake: during start-up a port scan, an
// HTTP request or stray bytes became a rank's "peer" (the real one was then
// refused), and a malformed Gloo header from such a connection aborts the
// process in Gloo's event-loop thread.
//
// The guard puts a proof of the job secret in front of every pair
// connection, below Gloo: Gloo's own calls to connect(2) and accept(2) are
// redirected (its entries in the dynamic linker's table are replaced, so no
// other caller in the process is affected).
// - connect: once the TCP connection is up, the connecting rank sends
//   "TSLPAIR1" + HMAC-SHA256(secret, "tessel-gloo-pair", listener address,
//   connector address) before Gloo writes anything.
// - accept: the listening rank accepts every connection that arrives, reads
//   up to 40 bytes from each (several at once, each bounded in time) and hands
//   Gloo the first that carries the right proof; the others are closed and
//   logged. A proof names both ends of its own connection, so it cannot be
//   replayed on another one.
// Gloo never reads a byte from a connection that did not prove the secret.
#pragma once

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace tessel::comm {

inline constexpr char kPairProofMagic[8] = {'T', 'S', 'L', 'P', 'A', 'I', 'R', '1'};
inline constexpr size_t kPairProofBytes = 8 + 32;
using PairProof = std::array<uint8_t, kPairProofBytes>;

// The proof a connection from `connector` to `listener` carries.
PairProof MakePairProof(const std::string& secret, const sockaddr_storage& listener,
                        const sockaddr_storage& connector);

// What the bytes a connection sent so far (at most kPairProofBytes; more is
// never read) say, against the proof it must carry: the magic is checked as
// it arrives, the MAC only whole and in constant time.
enum class ProofCheck { kNeedMore, kNotAProof, kWrongProof, kProven };
ProofCheck CheckPairProof(const uint8_t* bytes, size_t size, const PairProof& expected);

struct PairGuardOptions {
  // How long a connecting rank waits for its TCP connection (and its proof
  // to be written), and a listener for a connection with the right proof.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(300)};
  // How long one arriving connection may take to send its 40 bytes.
  std::chrono::milliseconds proof_timeout{std::chrono::seconds(10)};
  // Connections read at once by one listener; past it the oldest is dropped.
  int max_pending = 64;
};

// Installs the guard in this process (before the first Gloo pair is made);
// a later call (a new world in the same process) replaces secret and
// options. Throws an Error if Gloo's calls cannot be redirected (Gloo not a
// shared library); nothing is redirected then.
void GuardGlooPairs(const std::string& secret, const PairGuardOptions& options = {});
bool GlooPairsGuarded();
// Connections the guard closed without handing them to Gloo (this process).
int64_t GlooPairConnectionsRefused();

}  // namespace tessel::comm
