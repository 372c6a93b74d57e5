// Small socket helpers shared by the TCP store's server and client.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessel::comm {

using SteadyTime = std::chrono::steady_clock::time_point;

// Listens on `host`:`port` (port 0 picks a free one). `host` is resolved
// and bound as given: "127.0.0.1" listens on loopback only, a host's own
// address on that interface only. Never all interfaces unless `host` is
// "0.0.0.0" or "::". Throws an Error naming the address if it is in use or
// is not an address of this machine.
int ListenTcp(const std::string& host, int port, int* bound_port);
// Connects to host:port, retrying until `timeout` passes (the server may not
// be up yet). Throws an Error naming the address and the last OS error.
int ConnectTcp(const std::string& host, int port, std::chrono::milliseconds timeout);

enum class IoResult { kOk, kClosed, kTimeout };
// Read/write exactly n bytes, giving up at `deadline` (blocking sockets;
// poll() bounds every wait).
IoResult ReadFull(int fd, void* buf, size_t n, SteadyTime deadline);
IoResult WriteFull(int fd, const void* buf, size_t n, SteadyTime deadline);
void CloseSocket(int fd);
// "127.0.0.1:5000" for the peer of a connected socket ("?" if unknown).
std::string PeerAddress(int fd);
// The same for the socket's own address ("0.0.0.0:5000" for a listener on all).
std::string LocalAddress(int fd);
// The first `max` bytes a stranger sent, quoted and printable (others as
// \xNN), for a log line that says why a connection was dropped.
std::string PrintableBytes(std::string_view bytes, size_t max = 16);
// Whether `host` resolves only to loopback addresses.
bool IsLoopbackHost(const std::string& host);

}  // namespace tessel::comm
