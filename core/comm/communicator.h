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
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
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
  Communicator();
  virtual ~Communicator();

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
  void AllReduce(void* buf, int64_t count, DType dtype, ReduceOp op);
  // out[r*count .. (r+1)*count) = member r's `in`.
  void AllGather(const void* in, int64_t count, void* out, DType dtype);
  // Member r contributes counts[r] elements; out is their concatenation.
  void AllGatherV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype);
  // in has size()*count elements; out receives the reduction of block rank().
  void ReduceScatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  // in is the concatenation of blocks of counts[r]; out receives the
  // reduction of block rank() (counts[rank()] elements).
  void ReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                      ReduceOp op);
  // Block r of `in` (count elements) goes to member r; block r of `out` comes from it.
  void AllToAll(const void* in, void* out, int64_t count, DType dtype);
  void AllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DType dtype);
  // `root` is a group rank; buf is input on root and output elsewhere.
  void Broadcast(void* buf, int64_t count, DType dtype, int root);
  void Barrier();

  // Asynchronous collectives: each returns at once and runs on the group's
  // own thread (its communication stream), in the order issued; every
  // member issues them in the same order, as for blocking calls. Wait()
  // returns when the collective is done or throws its error (naming op,
  // group and rank; each collective keeps its deadline, so nothing hangs).
  // Buffers must stay alive and untouched until then. A blocking call, or a
  // point-to-point post, first waits for the queued collectives, so the
  // order is the same on every rank. What data-parallel gradient buckets
  // and actors use to overlap communication with compute.
  std::unique_ptr<Work> IAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op);
  std::unique_ptr<Work> IAllGatherV(const void* in, void* out, const std::vector<int64_t>& counts,
                                    DType dtype);
  std::unique_ptr<Work> IReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts,
                                        DType dtype, ReduceOp op);
  std::unique_ptr<Work> IBroadcast(void* buf, int64_t count, DType dtype, int root);
  // Collectives queued and not finished (for tests and reports).
  size_t QueuedCollectives() const;

  // Point-to-point with group ranks; `tag` tells concurrent streams apart
  // (see MakeTag and NextTag). A send completes only once the peer has
  // posted the matching receive, so exchanges in a cycle need ISend/IRecv
  // (or a consistent order). The buffer must stay alive until the Work is
  // waited for.
  std::unique_ptr<Work> ISend(const void* buf, int64_t count, DType dtype, int dst, uint32_t tag = 0);
  std::unique_ptr<Work> IRecv(void* buf, int64_t count, DType dtype, int src, uint32_t tag = 0);
  void Send(const void* buf, int64_t count, DType dtype, int dst, uint32_t tag = 0) {
    ISend(buf, count, dtype, dst, tag)->Wait();
  }
  void Recv(void* buf, int64_t count, DType dtype, int src, uint32_t tag = 0) {
    IRecv(buf, count, dtype, src, tag)->Wait();
  }

  // Tags: a channel (what the transfers belong to: boxing, a pipeline edge)
  // in the top 8 bits and a sequence number in the low 24. NextTag counts
  // the messages of one channel to (or from) one peer: a sender and its
  // receiver that post the same messages in the same order get the same
  // tags, and two channels never share one, so concurrent transfers
  // (boxing during a pipeline's sends) cannot be matched with each other.
  static constexpr uint32_t kSeqBits = 24;
  // Channel 0 is what a plain Send/Recv with the default tag uses; boxing
  // transfers use kBoxingChannel; a compiled graph's stage transfers use
  // kStageTransferChannel with the transfer's index as the sequence (the
  // same on both sides, whatever order they run their transfers in);
  // kFirstFreeChannel and above are for whoever schedules concurrent
  // streams.
  static constexpr uint8_t kBoxingChannel = 1;
  static constexpr uint8_t kStageTransferChannel = 2;
  static constexpr uint8_t kFirstFreeChannel = 16;
  static uint32_t MakeTag(uint8_t channel, uint32_t seq) {
    return (static_cast<uint32_t>(channel) << kSeqBits) | (seq & ((1u << kSeqBits) - 1));
  }
  enum class Direction { kSend, kRecv };
  uint32_t NextTag(uint8_t channel, int peer, Direction direction);

  // Closes the group's connections: peers still waiting on this rank in a
  // collective fail at once instead of at their timeout. Later calls throw.
  // Queued asynchronous collectives run (or fail) first.
  virtual void Close() = 0;

  // Tensor conveniences (contiguous host tensors for the Gloo backend).
  void AllReduce(Tensor& t, ReduceOp op = ReduceOp::kSum) {
    AllReduce(t.raw_data(), t.numel(), t.dtype(), op);
  }
  void Broadcast(Tensor& t, int root) { Broadcast(t.raw_data(), t.numel(), t.dtype(), root); }

 protected:
  // What a backend implements. The blocking entry points above wait for the
  // queue and call these; the group's thread calls them for queued ones.
  virtual void DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual void DoAllGatherV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) = 0;
  virtual void DoReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                                ReduceOp op) = 0;
  virtual void DoAllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                           const std::vector<int64_t>& recv_counts, DType dtype) = 0;
  virtual void DoBroadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  virtual std::unique_ptr<Work> DoISend(const void* buf, int64_t count, DType dtype, int dst,
                                        uint32_t tag) = 0;
  virtual std::unique_ptr<Work> DoIRecv(void* buf, int64_t count, DType dtype, int src, uint32_t tag) = 0;
  virtual void DoBarrier() = 0;
  // Runs what is queued and stops the group's thread; a backend's
  // destructor and Close() call it before tearing down what queued
  // collectives use.
  void StopAsync();

  // Throws if `counts` does not have one entry per member, or any is negative.
  void CheckCounts(const char* op, const std::vector<int64_t>& counts) const;
  void CheckPeer(const char* op, int peer) const;

 private:
  // Blocks until no queued collective is left (returns at once on the
  // group's own thread).
  void WaitQueued();
  std::unique_ptr<Work> Enqueue(const char* op, std::function<void()> run);
  struct AsyncQueue;
  std::unique_ptr<AsyncQueue> async_;
  mutable std::mutex async_mu_;  // guards creating async_
  std::mutex tags_mu_;
  std::map<std::tuple<uint8_t, int, int>, uint32_t> next_seq_;  // (channel, peer, direction)
};

}  // namespace tessel::comm
