#include "core/comm/tcp_store.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "core/comm/socket.h"
#include "core/comm/store_protocol.h"
#include "core/error.h"

namespace tessel::comm {
namespace {

using std::chrono::milliseconds;
const std::string kSecret = "0123456789abcdef-test-secret";

TcpStoreServer::Options Local(std::string secret = kSecret) {
  TcpStoreServer::Options o;
  o.secret = std::move(secret);
  return o;
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

size_t CountEntries(const char* dir) {
  size_t n = 0;
  DIR* d = ::opendir(dir);
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// Sends `bytes` on a fresh connection, then reads until the server closes
// it or `wait` passes; returns what the server sent.
std::string Poke(int port, const std::string& bytes, milliseconds wait = milliseconds(2000)) {
  int fd = ConnectTcp("127.0.0.1", port, milliseconds(2000));
  auto deadline = std::chrono::steady_clock::now() + wait;
  WriteFull(fd, bytes.data(), bytes.size(), deadline);
  std::string got;
  char c;
  while (ReadFull(fd, &c, 1, deadline) == IoResult::kOk) got += c;
  CloseSocket(fd);
  return got;
}

TEST(TcpStore, SetGetAddCheckAcrossClients) {
  TcpStoreServer server(Local());
  TcpStore a("127.0.0.1", server.port(), kSecret, 0, milliseconds(5000));
  TcpStore b("localhost", server.port(), kSecret, 1, milliseconds(5000));
  a.set("k", {'x', 'y'});
  EXPECT_EQ(b.get("k"), (std::vector<char>{'x', 'y'}));
  EXPECT_EQ(a.Add("n", 2), 2);
  EXPECT_EQ(b.Add("n", 3), 5);
  EXPECT_EQ(b.Check({"k", "missing", "n"}), (std::vector<bool>{true, false, true}));
  a.set("empty", {});
  EXPECT_TRUE(b.get("empty").empty());
  EXPECT_EQ(server.ConnectedRanks(), (std::multiset<int>{0, 1}));
}

TEST(TcpStore, GetAndWaitBlockUntilAnotherClientSets) {
  TcpStoreServer server(Local());
  TcpStore a("127.0.0.1", server.port(), kSecret, 0, milliseconds(5000));
  std::thread setter([&] {
    TcpStore b("127.0.0.1", server.port(), kSecret, 1, milliseconds(5000));
    std::this_thread::sleep_for(milliseconds(100));
    b.set("late", {'1'});
    std::this_thread::sleep_for(milliseconds(100));
    b.set("later", {'2'});
  });
  EXPECT_EQ(a.get("late"), (std::vector<char>{'1'}));
  a.wait({"late", "later"});
  EXPECT_EQ(a.get("later"), (std::vector<char>{'2'}));
  setter.join();
}

TEST(TcpStore, WaitTimesOutNamingTheKey) {
  TcpStoreServer server(Local());
  TcpStore a("127.0.0.1", server.port(), kSecret, 0, milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  std::string err = ErrorOf([&] { a.wait({"never"}); });
  EXPECT_NE(err.find("waiting for key(s) never"), std::string::npos) << err;
  EXPECT_EQ(a.WaitFor({"never", "nor"}, milliseconds(50)), (std::vector<std::string>{"never", "nor"}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(TcpStore, PortInUseAndUnreachableMaster) {
  TcpStoreServer server(Local());
  auto again = Local();
  again.port = server.port();
  std::string err = ErrorOf([&] { TcpStoreServer twice(again); });
  EXPECT_NE(err.find("MASTER_PORT " + std::to_string(server.port()) + " is already in use"),
            std::string::npos)
      << err;
  int port = 0;
  {
    TcpStoreServer probe(Local());
    port = probe.port();
  }  // a port nobody listens on now
  err = ErrorOf([&] { TcpStore c("127.0.0.1", port, kSecret, 0, milliseconds(300)); });
  EXPECT_NE(err.find("cannot reach the rendezvous master at MASTER_ADDR=127.0.0.1"), std::string::npos)
      << err;
}

TEST(TcpStore, ListensOnLoopbackOnly) {
  TcpStoreServer server(Local());
  // The store is bound to 127.0.0.1: its port is not open on another
  // address of this host's loopback range.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(0x7f000002);  // 127.0.0.2
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
}

TEST(TcpStore, LostServerIsReported) {
  auto server = std::make_unique<TcpStoreServer>(Local());
  TcpStore a("127.0.0.1", server->port(), kSecret, 0, milliseconds(500));
  a.set("k", {'v'});
  server.reset();
  EXPECT_THROW(a.set("k", {'w'}), Error);
}

TEST(TcpStoreSecurity, WrongSecretIsRejectedAndCannotTouchKeys) {
  TcpStoreServer server(Local());
  TcpStore good("127.0.0.1", server.port(), kSecret, 0, milliseconds(2000));
  good.set("tessel/group/0,1/0", {'a', 'd', 'd', 'r'});
  std::string err = ErrorOf(
      [&] { TcpStore bad("127.0.0.1", server.port(), "another-jobs-secret!!", 1, milliseconds(2000)); });
  EXPECT_NE(err.find("rejected this rank's job secret"), std::string::npos) << err;
  // A client that skips the handshake and sends a get frame is dropped
  // without an answer, and cannot write either.
  std::string body(1, static_cast<char>(store::kGet));
  store::PutBlob(body, std::string("tessel/group/0,1/0"));
  store::PutU32(body, 0);
  std::string frame;
  store::PutU32(frame, static_cast<uint32_t>(body.size()));
  frame += body;
  std::string got = Poke(server.port(), frame);
  EXPECT_EQ(got, std::string(store::kServerHelloMagic, 8) + got.substr(8, 32)) << "only the hello came back";
  std::string set_body(1, static_cast<char>(store::kSet));
  store::PutBlob(set_body, std::string("tessel/group/0,1/0"));
  store::PutBlob(set_body, std::string("evil"));
  std::string set_frame;
  store::PutU32(set_frame, static_cast<uint32_t>(set_body.size()));
  Poke(server.port(), set_frame + set_body);
  EXPECT_EQ(good.get("tessel/group/0,1/0"), (std::vector<char>{'a', 'd', 'd', 'r'}));
}

TEST(TcpStoreSecurity, ClientRejectsAStoreThatDoesNotKnowTheSecret) {
  TcpStoreServer impostor(Local("impostor-secret-xyz"));
  std::string err =
      ErrorOf([&] { TcpStore c("127.0.0.1", impostor.port(), kSecret, 0, milliseconds(2000)); });
  // The impostor denies our MAC first; either way the client refuses.
  EXPECT_NE(err.find("secret"), std::string::npos) << err;
}

TEST(TcpStoreRobustness, StrayBytesHttpAndHugeCountsNeverKillTheServer) {
  TcpStoreServer server(Local());
  TcpStore a("127.0.0.1", server.port(), kSecret, 0, milliseconds(5000));
  a.set("k", {'v'});
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    std::string junk(1 + rng() % 300, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    Poke(server.port(), junk, milliseconds(300));
  }
  Poke(server.port(), "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", milliseconds(300));
  // The old protocol's attack: op + a count of 16 Mi keys, then nothing.
  Poke(server.port(), std::string("\x04\x00\x00\x00\x01", 5), milliseconds(300));
  // An authenticated peer that claims a 2 GiB frame is dropped at once.
  {
    int fd = ConnectTcp("127.0.0.1", server.port(), milliseconds(1000));
    auto deadline = std::chrono::steady_clock::now() + milliseconds(2000);
    char hello[store::kServerHelloBytes];
    ASSERT_EQ(ReadFull(fd, hello, sizeof(hello), deadline), IoResult::kOk);
    store::Nonce ns{}, nc{};
    std::memcpy(ns.data(), hello + 8, 32);
    store::Mac mac = store::ClientMac(kSecret, ns, nc, 5);
    std::string reply(store::kClientHelloMagic, 8);
    int32_t rank = 5;
    reply.append(reinterpret_cast<char*>(&rank), 4);
    reply.append(reinterpret_cast<char*>(nc.data()), 32);
    reply.append(reinterpret_cast<char*>(mac.data()), 32);
    reply += std::string("\x00\x00\x00\x80", 4);
    WriteFull(fd, reply.data(), reply.size(), deadline);
    char proof[store::kProofBytes];
    EXPECT_EQ(ReadFull(fd, proof, sizeof(proof), deadline), IoResult::kOk);
    char more;
    EXPECT_EQ(ReadFull(fd, &more, 1, deadline), IoResult::kClosed);
    CloseSocket(fd);
  }
  EXPECT_EQ(a.get("k"), (std::vector<char>{'v'}));
  EXPECT_GE(server.stats().dropped, 52);
}

TEST(TcpStoreRobustness, ThousandsOfShortConnectionsLeaveNoDescriptorsOrThreads) {
  TcpStoreServer server(Local());
  TcpStore a("127.0.0.1", server.port(), kSecret, 0, milliseconds(5000));
  size_t fds = CountEntries("/proc/self/fd"), threads = CountEntries("/proc/self/task");
  for (int i = 0; i < 2000; ++i) {
    int fd = ConnectTcp("127.0.0.1", server.port(), milliseconds(1000));
    if (i % 2) [[maybe_unused]]
      ssize_t n = ::send(fd, "hello", 5, MSG_NOSIGNAL);
    CloseSocket(fd);
  }
  a.set("after", {'1'});  // a round trip: the loop has caught up with every close
  for (int i = 0; i < 100 && server.stats().open > 1; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server.stats().open, 1u);
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds);
  EXPECT_EQ(CountEntries("/proc/self/task"), threads);
}

TEST(TcpStoreRobustness, SilentPeersAreDroppedAfterTheHandshakeTimeout) {
  auto options = Local();
  options.handshake_timeout = milliseconds(300);
  options.max_pending = 4;
  TcpStoreServer server(options);
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(ConnectTcp("127.0.0.1", server.port(), milliseconds(1000)));
  // Six were shed at once (only 4 may wait), the rest after 300 ms, and a
  // real client still gets in.
  TcpStore a("127.0.0.1", server.port(), kSecret, 0, milliseconds(5000));
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(server.stats().open, 1u);
  EXPECT_EQ(server.stats().dropped, 10);
  for (int fd : idle) CloseSocket(fd);
}

TEST(TcpStoreRobustness, SilentListenerIsATimeoutNamingTheAddress) {
  int port = 0;
  int fd = ListenTcp("127.0.0.1", 0, &port);  // accepts (backlog) but never answers
  auto start = std::chrono::steady_clock::now();
  std::string err = ErrorOf([&] { TcpStore c("127.0.0.1", port, kSecret, 1, milliseconds(500)); });
  EXPECT_NE(err.find("did not answer within 0.5 s"), std::string::npos) << err;
  EXPECT_NE(err.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  CloseSocket(fd);
}

TEST(TcpStoreRobustness, OutOfDescriptorsDoesNotSpinOrStop) {
  TcpStoreServer server(Local());
  TcpStore a("127.0.0.1", server.port(), kSecret, 0, milliseconds(5000));
  rlimit old{};
  ::getrlimit(RLIMIT_NOFILE, &old);
  size_t open_now = CountEntries("/proc/self/fd");
  rlimit tight = old;
  tight.rlim_cur = open_now + 8;
  ::setrlimit(RLIMIT_NOFILE, &tight);
  std::vector<int> held;
  for (int i = 0; i < 20; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server.port()));
    addr.sin_addr.s_addr = htonl(0x7f000001);
    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    held.push_back(fd);
  }
  std::this_thread::sleep_for(milliseconds(300));
  for (int fd : held) CloseSocket(fd);
  ::setrlimit(RLIMIT_NOFILE, &old);
  a.set("still", {'1'});
  EXPECT_EQ(a.get("still"), (std::vector<char>{'1'}));
}

// The protocol core alone: limits are checked before allocation.
TEST(StoreProtocol, HugeClaimsAllocateNothing) {
  store::StoreServerCore::Options o;
  o.secret = kSecret;
  store::StoreServerCore core(o);
  auto now = store::Clock::now();
  int id = core.Open(now, "test");
  core.TakeOutput(id);
  EXPECT_FALSE(core.Feed(id, "GET / HTTP/1.1\r\n", 16, now));
  EXPECT_NE(core.reason(id).find("not a tessel store client (first bytes \"GET / HTTP/1.1"),
            std::string::npos)
      << core.reason(id);
}

}  // namespace
}  // namespace tessel::comm
