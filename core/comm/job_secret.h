// The job secret that ranks prove to the rendezvous store.
//
// tessel-launch makes a fresh one per job and hands it to its ranks in
// TESSEL_JOB_SECRET. Jobs spanning several nodes, or launched by hand, give
// every rank the same value through TESSEL_JOB_SECRET or a file named by
// TESSEL_JOB_SECRET_FILE (readable by its owner only).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace tessel::comm {

inline constexpr size_t kMinSecretChars = 16;
inline constexpr size_t kMaxSecretChars = 4096;

// 64 hex characters from the kernel's random source.
std::string NewJobSecret();
// The secret from TESSEL_JOB_SECRET or TESSEL_JOB_SECRET_FILE (in `vars`);
// empty when neither is set. Throws an Error naming the variable or file
// when the value is too short or too long, or the file is unreadable,
// oversized or readable by other users.
std::string JobSecretFrom(const std::map<std::string, std::string>& vars);
std::string ReadJobSecret();  // from the process environment
// Reads and checks a secret file (as above).
std::string ReadSecretFile(const std::string& path);
// HMAC-SHA256 of `message` keyed by the secret: how a process proves it
// knows the secret without sending it (the store's handshake, Gloo pairs).
std::array<uint8_t, 32> SecretMac(const std::string& secret, std::string_view message);

}  // namespace tessel::comm
