#include "core/comm/tcp_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"

namespace tessel::comm {
namespace {

using std::chrono::milliseconds;

TEST(TcpStore, SetGetAddCheckAcrossClients) {
  TcpStoreServer server(0);
  TcpStore a("127.0.0.1", server.port(), milliseconds(5000));
  TcpStore b("localhost", server.port(), milliseconds(5000));
  a.set("k", {'x', 'y'});
  EXPECT_EQ(b.get("k"), (std::vector<char>{'x', 'y'}));
  EXPECT_EQ(a.Add("n", 2), 2);
  EXPECT_EQ(b.Add("n", 3), 5);
  EXPECT_EQ(b.Check({"k", "missing", "n"}), (std::vector<bool>{true, false, true}));
  a.set("empty", {});
  EXPECT_TRUE(b.get("empty").empty());
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  TcpStoreServer server(0);
  TcpStore a("127.0.0.1", server.port(), milliseconds(5000));
  std::thread setter([&] {
    TcpStore b("127.0.0.1", server.port(), milliseconds(5000));
    std::this_thread::sleep_for(milliseconds(100));
    b.set("late", {'1'});
  });
  EXPECT_EQ(a.get("late"), (std::vector<char>{'1'}));
  setter.join();
}

TEST(TcpStore, WaitTimesOutNamingTheKey) {
  TcpStoreServer server(0);
  TcpStore a("127.0.0.1", server.port(), milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  try {
    a.wait({"never"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("waiting for key(s) never"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(TcpStore, PortInUseAndUnreachableMaster) {
  TcpStoreServer server(0);
  try {
    TcpStoreServer again(server.port());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("MASTER_PORT " + std::to_string(server.port()) + " is already in use"),
        std::string::npos)
        << e.what();
  }
  int port = server.port();
  {
    TcpStoreServer probe(0);
    port = probe.port();
  }  // a port nobody listens on now
  try {
    TcpStore c("127.0.0.1", port, milliseconds(300));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach the rendezvous master at MASTER_ADDR=127.0.0.1"),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, LostServerIsReported) {
  auto server = std::make_unique<TcpStoreServer>(0);
  TcpStore a("127.0.0.1", server->port(), milliseconds(500));
  a.set("k", {'v'});
  server.reset();
  EXPECT_THROW(a.set("k", {'w'}), Error);
}

}  // namespace
}  // namespace tessel::comm
