#include "core/comm/gloo_pair_guard.h"

#include <arpa/inet.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace tessel::comm {
namespace {

sockaddr_storage Loopback(int port) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(port));
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ss;
}

TEST(GlooPairGuard, AProofNamesTheSecretAndBothEnds) {
  PairProof proof = MakePairProof("secret-one-0123456789", Loopback(5000), Loopback(40000));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(proof.data()), 8), "TSLPAIR1");
  // HMAC-SHA256(secret, "tessel-gloo-pair" + (family u16 LE, port, IPv4) of
  // listener then connector), computed with Python's hmac.
  std::string mac;
  for (size_t i = 8; i < proof.size(); ++i) {
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", proof[i]);
    mac += hex;
  }
  EXPECT_EQ(mac, "d30a0abfe3e02621197c94475d9e6378ba096ec76e233a05e32f09d87a972c1f");
  EXPECT_EQ(proof, MakePairProof("secret-one-0123456789", Loopback(5000), Loopback(40000)));
  EXPECT_NE(proof, MakePairProof("secret-two-0123456789", Loopback(5000), Loopback(40000)));
  EXPECT_NE(proof, MakePairProof("secret-one-0123456789", Loopback(5001), Loopback(40000)));
  EXPECT_NE(proof, MakePairProof("secret-one-0123456789", Loopback(5000), Loopback(40001)));
}

// The TCP ports this process listens on.
std::set<int> OwnListeningPorts() {
  std::set<std::string> inodes;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::set<int> ports;
  std::ifstream table("/proc/self/net/tcp");
  std::string line;
  std::getline(table, line);
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, skip, inode;
    fields >> slot >> local >> remote >> state;
    for (int i = 0; i < 5; ++i) fields >> skip;
    fields >> inode;
    if (state == "0A" && inodes.count(inode))
      ports.insert(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
  }
  return ports;
}

// Rank r of 2 connects its Gloo pair through `store` and all-reduces *value.
void ConnectAndSum(gloo::rendezvous::Store& store, std::shared_ptr<gloo::transport::Device>& device, int r,
                   float* value) {
  auto context = std::make_shared<gloo::rendezvous::Context>(r, 2);
  context->setTimeout(std::chrono::seconds(30));
  context->connectFullMesh(store, device);
  gloo::AllreduceOptions opts(context);
  opts.setOutput(value, 1);
  opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::allreduce(opts);
}

void Poke(int port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_storage ss = Loopback(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), sizeof(sockaddr_in)) == 0 && !bytes.empty())
    (void)!::write(fd, bytes.data(), bytes.size());
  ::close(fd);
}

// Two ranks in this process connect a Gloo pair through the guard while a
// stranger sends garbage, an HTTP request, a forged proof and bare
// connections to every listening socket: the pair connects to the right
// peer and an all-reduce gives the right sum. Rank 1 arrives late, so rank
// 0's listener waits for it under the stranger's connections.
TEST(GlooPairGuard, OnlyTheWholeRightProofIsAccepted) {
  const PairProof expected = MakePairProof("secret-one-0123456789", Loopback(5000), Loopback(40000));
  EXPECT_EQ(CheckPairProof(expected.data(), 0, expected), ProofCheck::kNeedMore);
  EXPECT_EQ(CheckPairProof(expected.data(), 20, expected), ProofCheck::kNeedMore);
  EXPECT_EQ(CheckPairProof(expected.data(), expected.size(), expected), ProofCheck::kProven);
  PairProof wrong = expected;
  wrong.back() ^= 1;
  EXPECT_EQ(CheckPairProof(wrong.data(), wrong.size(), expected), ProofCheck::kWrongProof);
  const uint8_t http[] = {'G', 'E', 'T', ' '};
  EXPECT_EQ(CheckPairProof(http, 1, expected), ProofCheck::kNotAProof);  // decided at the first byte
}

TEST(GlooPairGuard, APairConnectsToItsPeerWhileAStrangerHitsItsListener) {
  GuardGlooPairs("guard-test-secret-0123456789");
  ASSERT_TRUE(GlooPairsGuarded());
  const int64_t refused_before = GlooPairConnectionsRefused();
  gloo::rendezvous::HashStore store;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  const std::set<int> before = OwnListeningPorts();

  std::atomic<bool> done{false};
  std::thread stranger([&] {
    const std::string forged = "TSLPAIR1" + std::string(32, 'x');
    const std::string kinds[] = {"\x01\x00\x00\x00\x00\x00\x00\x00garbage", "GET / HTTP/1.1\r\n\r\n", forged,
                                 ""};
    int n = 0;
    while (!done) {
      for (int port : OwnListeningPorts())
        if (!before.count(port)) Poke(port, kinds[n++ % 4]);
    }
  });
  float sums[2] = {1.0f, 2.0f};
  auto rank = [&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ConnectAndSum(store, device, r, &sums[r]);
  };
  std::thread rank0(rank, 0), rank1(rank, 1);
  rank0.join();
  rank1.join();
  done = true;
  stranger.join();
  EXPECT_FLOAT_EQ(sums[0], 3.0f);
  EXPECT_FLOAT_EQ(sums[1], 3.0f);
  EXPECT_GT(GlooPairConnectionsRefused(), refused_before);
}

// With the process out of descriptors the gatekeeper cannot accept: the
// listener rests instead of spinning, and the pair still connects once
// descriptors are back.
TEST(GlooPairGuard, OutOfDescriptorsDoesNotSpin) {
  GuardGlooPairs("guard-test-secret-0123456789");
  gloo::rendezvous::HashStore store;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  const std::set<int> before = OwnListeningPorts();
  float sums[2] = {1.0f, 2.0f};
  auto rank = [&](int r) { ConnectAndSum(store, device, r, &sums[r]); };
  std::thread rank0(rank, 0);
  std::set<int> listeners;
  for (int i = 0; i < 500 && listeners.empty(); ++i) {
    for (int port : OwnListeningPorts())
      if (!before.count(port)) listeners.insert(port);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_FALSE(listeners.empty());
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  rlimit old{};
  ::getrlimit(RLIMIT_NOFILE, &old);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                                     std::filesystem::directory_iterator{}));
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  for (int fd : held) {
    sockaddr_storage ss = Loopback(*listeners.begin());
    ::connect(fd, reinterpret_cast<sockaddr*>(&ss), sizeof(sockaddr_in));
  }
  auto cpu_seconds = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  const double cpu_before = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double spent = cpu_seconds() - cpu_before;
  ::setrlimit(RLIMIT_NOFILE, &old);
  for (int fd : held) ::close(fd);
  EXPECT_LT(spent, 0.25) << "the process used " << spent << " s of CPU in 0.5 s while out of descriptors";
  std::thread rank1(rank, 1);
  rank0.join();
  rank1.join();
  EXPECT_FLOAT_EQ(sums[0], 3.0f);
  EXPECT_FLOAT_EQ(sums[1], 3.0f);
}

}  // namespace
}  // namespace tessel::comm
