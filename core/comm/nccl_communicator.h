// Communicator over NCCL: the CUDA backend's collectives, on buffers in GPU
// memory, run on the group's own CUDA stream. Built when the CUDA toolkit
// has NCCL (TESSEL_HAS_NCCL).
//
// Group rank 0 makes the NCCL unique id and publishes it in the rendezvous
// store; every member reads it there. The communicator is non-blocking, so
// every call has the group's deadline: a peer that never arrives or dies is
// an Error naming the op, the group and this rank (the communicator is
// aborted), never a hang.
//
// Each member must own its GPU: NCCL refuses two ranks of one group on the
// same device. Ranks that share a GPU use the Gloo path (boxing copies
// shards through the host).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"

namespace tessel::comm {

class TcpStore;

class NcclCommunicator final : public Communicator {
 public:
  // `rank` is this process's position in world_ranks; `device_index` the
  // CUDA device its buffers are on. Keys in `store` start with `store_prefix`.
  NcclCommunicator(TcpStore& store, const std::string& store_prefix, std::vector<int> world_ranks, int rank,
                   int device_index, std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::string backend() const override { return "nccl"; }
  void Close() override;

 protected:
  void DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void DoAllGatherV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) override;
  void DoReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                        ReduceOp op) override;
  void DoAllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                   const std::vector<int64_t>& recv_counts, DType dtype) override;
  void DoBroadcast(void* buf, int64_t count, DType dtype, int root) override;
  // NCCL has no tags: transfers between two ranks match in the order they
  // are posted, which is what tessel's tags guarantee anyway.
  std::unique_ptr<Work> DoISend(const void* buf, int64_t count, DType dtype, int dst, uint32_t tag) override;
  std::unique_ptr<Work> DoIRecv(void* buf, int64_t count, DType dtype, int src, uint32_t tag) override;
  void DoBarrier() override;

 private:
  struct State;
  friend class NcclWork;
  // Orders the group's stream after the compute stream, enqueues with
  // `enqueue` (NCCL calls, grouped as one), and returns the event that
  // marks its end on the group's stream.
  void* Enqueue(const char* op, const std::function<void()>& enqueue);
  // Blocks until `event` is reached, or throws naming `op` at the deadline
  // (the communicator is aborted then: NCCL cannot cancel one op).
  void WaitEvent(const char* op, void* event);
  void Run(const char* op, const std::function<void()>& enqueue);

  std::unique_ptr<State> state_;
  std::vector<int> world_ranks_;
  int rank_;
  int device_index_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tessel::comm
