// Communicator over Gloo's TCP transport: the CPU backend.
#pragma once

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <map>
#include <memory>
#include <mutex>

#include "core/comm/communicator.h"

namespace tessel::comm {

class GlooCommunicator final : public Communicator {
 public:
  // Connects a full mesh among `world_ranks` through `store` (keys are
  // prefixed by `store_prefix`, unique per group). `rank` is this process's
  // position in world_ranks. Throws with the group named if peers do not
  // show up within `timeout`.
  GlooCommunicator(gloo::rendezvous::Store& store, const std::string& store_prefix,
                   std::shared_ptr<gloo::transport::Device> device, std::vector<int> world_ranks, int rank,
                   std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::string backend() const override { return "gloo"; }

  ~GlooCommunicator() override;
  void Close() override;

 protected:
  void DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void DoAllGatherV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) override;
  void DoReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                        ReduceOp op) override;
  void DoAllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                   const std::vector<int64_t>& recv_counts, DType dtype) override;
  void DoBroadcast(void* buf, int64_t count, DType dtype, int root) override;
  std::unique_ptr<Work> DoISend(const void* buf, int64_t count, DType dtype, int dst, uint32_t tag) override;
  std::unique_ptr<Work> DoIRecv(void* buf, int64_t count, DType dtype, int src, uint32_t tag) override;
  void DoBarrier() override;

 private:
  friend class GlooWork;
  // Runs fn, recording it in the flight recorder and turning Gloo's
  // exceptions into an Error naming op, group, rank. Collectives count in
  // the group's sequence; point-to-point transfers (`p2p_peer` >= 0) are
  // recorded on the pair instead.
  template <typename Fn>
  void Guard(const std::string& op, int64_t bytes, Fn&& fn, int p2p_peer = -1);

  std::shared_ptr<gloo::Context> context_;
  std::vector<int> world_ranks_;
  int rank_;
  std::chrono::milliseconds timeout_;
  // Call counts for the flight recorder. A pipeline posts transfers on one
  // thread and waits for them on another, so they are counted under a lock.
  std::mutex seq_mu_;
  uint64_t seq_ = 0;  // collectives issued on this group
  std::map<int, uint64_t> p2p_seq_;
};

// One TCP device per process, bound to `hostname` (the address peers use).
std::shared_ptr<gloo::transport::Device> CreateGlooTcpDevice(const std::string& hostname);

}  // namespace tessel::comm
