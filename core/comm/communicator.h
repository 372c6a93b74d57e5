// The collective-communication interface every backend implements.
//
// A Communicator spans a group of ranks (a subset of the world, in a fixed
// order). Buffers are raw device pointers with a DType and element counts;
// "v" variants take a count per group member. All calls are collective in
// lockstep: every member calls them in the same order. Every call has a
// deadline (timeout()) and throws an Error naming the op, the group and this
// rank instead of blocking forever when a peer dies or never arrives.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace tessel::comm {

enum class ReduceOp { kSum, kMax };
const char* ReduceOpName(ReduceOp op);

// A pending point-to-point transfer. Wait() blocks until it completes or the
// communicator's timeout passes (then it throws naming the op and peer).
// A Work that is destroyed unwaited is waited for in its destructor.
class Work {
 public:
  virtual ~Work() = default;
  virtual void Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Position of this process in the group, and the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // World ranks of the members, in group order.
  virtual const std::vector<int>& world_ranks() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual std::string backend() const = 0;
  // "group [0, 1, 2, 3]"; used in error messages.
  std::string Describe() const;

  // In place: buf holds this rank's input and receives the reduction.
  virtual void AllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  // out[r*count .. (r+1)*count) = member r's `in`.
  void AllGather(const void* in, int64_t count, void* out, DType dtype);
  // Member r contributes counts[r] elements; out is their concatenation.
  virtual void AllGatherV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) = 0;
  // in has size()*count elements; out receives the reduction of block rank().
  void ReduceScatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  // in is the concatenation of blocks of counts[r]; out receives the
  // reduction of block rank() (counts[rank()] elements).
  virtual void ReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                              ReduceOp op) = 0;
  // Block r of `in` (count elements) goes to member r; block r of `out` comes from it.
  void AllToAll(const void* in, void* out, int64_t count, DType dtype);
  virtual void AllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                         const std::vector<int64_t>& recv_counts, DType dtype) = 0;
  // `root` is a group rank; buf is input on root and output elsewhere.
  virtual void Broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  // Point-to-point with group ranks; `tag` tells concurrent streams apart.
  // A send completes only once the peer has posted the matching receive, so
  // exchanges in a cycle need ISend/IRecv (or a consistent order). The
  // buffer must stay alive until the Work is waited for.
  virtual std::unique_ptr<Work> ISend(const void* buf, int64_t count, DType dtype, int dst,
                                      uint32_t tag = 0) = 0;
  virtual std::unique_ptr<Work> IRecv(void* buf, int64_t count, DType dtype, int src, uint32_t tag = 0) = 0;
  void Send(const void* buf, int64_t count, DType dtype, int dst, uint32_t tag = 0) {
    ISend(buf, count, dtype, dst, tag)->Wait();
  }
  void Recv(void* buf, int64_t count, DType dtype, int src, uint32_t tag = 0) {
    IRecv(buf, count, dtype, src, tag)->Wait();
  }
  virtual void Barrier() = 0;
  // Closes the group's connections: peers still waiting on this rank in a
  // collective fail at once instead of at their timeout. Later calls throw.
  virtual void Close() = 0;

  // Tensor conveniences (contiguous host tensors for the Gloo backend).
  void AllReduce(Tensor& t, ReduceOp op = ReduceOp::kSum) {
    AllReduce(t.raw_data(), t.numel(), t.dtype(), op);
  }
  void Broadcast(Tensor& t, int root) { Broadcast(t.raw_data(), t.numel(), t.dtype(), root); }

 protected:
  // Throws if `counts` does not have one entry per member, or any is negative.
  void CheckCounts(const char* op, const std::vector<int64_t>& counts) const;
  void CheckPeer(const char* op, int peer) const;
};

}  // namespace tessel::comm
