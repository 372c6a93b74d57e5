// Small blocking-socket helpers shared by the TCP store's server and client.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tessel::comm {

// Listens on `port` on all interfaces (port 0 picks a free one). Throws an
// Error naming the port if it is in use or cannot be bound.
int ListenTcp(int port, int* bound_port);
// Connects to host:port, retrying until `timeout` passes (the server may not
// be up yet). Throws an Error naming the address and the last OS error.
int ConnectTcp(const std::string& host, int port, std::chrono::milliseconds timeout);
// Read/write exactly n bytes; false when the peer closed or an error occurred.
bool ReadFull(int fd, void* buf, size_t n);
bool WriteFull(int fd, const void* buf, size_t n);
void CloseSocket(int fd);

}  // namespace tessel::comm
