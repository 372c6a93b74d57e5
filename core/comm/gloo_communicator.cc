#include "core/comm/gloo_communicator.h"

#include <glog/logging.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "core/comm/comm_trace.h"
#include "core/comm/flight_recorder.h"
#include "core/error.h"

namespace tessel::comm {

namespace {

// Gloo's store wrapper with this group's key prefix; unlike Gloo's own
// PrefixStore it keeps the deadline the caller gave instead of 30 s.
class GroupStore : public gloo::rendezvous::Store {
 public:
  GroupStore(std::string prefix, gloo::rendezvous::Store& store, std::chrono::milliseconds timeout)
      : prefix_(std::move(prefix)), store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(Key(key), data); }
  std::vector<char> get(const std::string& key) override {
    store_.wait({Key(key)}, timeout_);
    return store_.get(Key(key));
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(Key(k));
    store_.wait(full, timeout);
  }

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  std::string prefix_;
  gloo::rendezvous::Store& store_;
  std::chrono::milliseconds timeout_;
};

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

// max that propagates NaN whichever operand holds it (PyTorch's max does;
// std::max's answer depends on the operand order, so on the rank order).
template <typename T>
T MaxOf(T x, T y) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(x)) return x;
    if (std::isnan(y)) return y;
  }
  return x < y ? y : x;
}

bool IsHalf(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// Half-precision sums are reduced in f32 and rounded once at the end, as
// NCCL does: rounding after every pairwise step loses small summands (bf16
// 1 + 3 * 2^-9 would stay 1).
std::vector<float> Widen(const void* p, int64_t n, DType dtype) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out[i] = dtype == DType::kFloat16 ? static_cast<float>(static_cast<const Float16*>(p)[i])
                                      : static_cast<float>(static_cast<const BFloat16*>(p)[i]);
  }
  return out;
}

void Narrow(const float* in, int64_t n, void* p, DType dtype) {
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kFloat16) {
      static_cast<Float16*>(p)[i] = Float16(in[i]);
    } else {
      static_cast<BFloat16*>(p)[i] = BFloat16(in[i]);
    }
  }
}

template <typename T>
ReduceFn MakeReduce(ReduceOp op) {
  return [op](void* out, const void* a, const void* b, size_t n) {
    auto* o = static_cast<T*>(out);
    const auto* x = static_cast<const T*>(a);
    const auto* y = static_cast<const T*>(b);
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      // Only reached for max (sums of half types run in f32, see IsHalf).
      for (size_t i = 0; i < n; ++i) {
        float fx = static_cast<float>(x[i]), fy = static_cast<float>(y[i]);
        o[i] = T(op == ReduceOp::kSum ? fx + fy : MaxOf(fx, fy));
      }
    } else if constexpr (std::is_same_v<T, bool>) {
      for (size_t i = 0; i < n; ++i) o[i] = x[i] || y[i];  // sum and max of bools are both "any"
    } else {
      if (op == ReduceOp::kSum) {
        for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
      } else {
        for (size_t i = 0; i < n; ++i) o[i] = MaxOf(x[i], y[i]);
      }
    }
  };
}

ReduceFn GetReduce(DType dtype, ReduceOp op) {
  return VisitDType(dtype, [op](auto zero) { return MakeReduce<decltype(zero)>(op); });
}

// Gloo's typed option setters only use sizeof(T); pick an unsigned type of
// the dtype's width.
template <typename Fn>
void VisitWidth(DType dtype, Fn&& fn) {
  switch (ElementSize(dtype)) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    case 8:
      return fn(uint64_t{});
  }
}

// Gloo rejects null pointers even for empty buffers.
void* NonNull(const void* p) {
  static char dummy[8];
  return p ? const_cast<void*>(p) : dummy;
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

constexpr auto kSecondaryFailureDelay = std::chrono::seconds(1);
constexpr size_t kSmallAllReduceBytes = 256 << 10;
// Bytes a member receives in a one-round all-reduce: (p - 1) buffers.
constexpr size_t kOneRoundAllReduceBytes = 256 << 10;
constexpr uint64_t kP2PSlotBase = 0x7e55e1ull << 32;

// Every member sends its whole buffer to every other member and reduces
// the p buffers in group-rank order, so all members compute the same bits.
// One round of messages where BCUBE takes 2 log2(p): for small all-reduces
// (tensor-parallel activations, scalars) latency is the whole cost.
void AllReduceInOneRound(gloo::Context& context, int rank, std::chrono::milliseconds timeout, void* buf,
                         int64_t count, size_t element_size, const ReduceFn& reduce) {
  const int p = context.size;
  const size_t bytes = static_cast<size_t>(count) * element_size;
  const uint64_t slot = context.nextSlot();
  std::vector<char> all(bytes * static_cast<size_t>(p));
  char* own = all.data() + bytes * static_cast<size_t>(rank);
  std::memcpy(own, buf, bytes);
  auto send = context.createUnboundBuffer(own, bytes);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs(static_cast<size_t>(p));
  for (int peer = 0; peer < p; ++peer) {
    if (peer == rank) continue;
    recvs[peer] = context.createUnboundBuffer(all.data() + bytes * static_cast<size_t>(peer), bytes);
    recvs[peer]->recv(peer, slot);
    send->send(peer, slot);
  }
  for (int peer = 0; peer < p; ++peer) {
    if (peer == rank) continue;
    TESSEL_CHECK_CODE(recvs[peer]->waitRecv(timeout), StatusCode::kUnavailable) << "the transfer was aborted";
    TESSEL_CHECK_CODE(send->waitSend(timeout), StatusCode::kUnavailable) << "the transfer was aborted";
  }
  std::memcpy(buf, all.data(), bytes);
  for (int r = 1; r < p; ++r)
    reduce(buf, buf, all.data() + bytes * static_cast<size_t>(r), static_cast<size_t>(count));
}

}  // namespace

std::shared_ptr<gloo::transport::Device> CreateGlooTcpDevice(const std::string& hostname) {
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TESSEL_THROW(StatusCode::kUnavailable)
        << "cannot create a Gloo TCP device on host address '" << hostname << "': " << e.what()
        << " (set --comm_hostname to an address of this machine that peers can reach)";
  }
}

GlooCommunicator::GlooCommunicator(gloo::rendezvous::Store& store, const std::string& store_prefix,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::vector<int> world_ranks, int rank, std::chrono::milliseconds timeout)
    : world_ranks_(std::move(world_ranks)), rank_(rank), timeout_(timeout) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size());
  context->setTimeout(timeout_);
  GroupStore group_store(store_prefix, store, timeout_);
  context_ = context;
  Guard("connect", 0, [&] {
    context->connectFullMesh(group_store, device);
    // Gloo's connect can fail on a peer that finished connecting and closed
    // the group (or exited) before this side saw the connection complete.
    // The barrier makes creation complete on every member before any member
    // returns, so a group may be closed as soon as it is made.
    gloo::BarrierOptions opts(context);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

GlooCommunicator::~GlooCommunicator() { StopAsync(); }

void GlooCommunicator::Close() {
  StopAsync();
  context_.reset();
}

template <typename Fn>
void GlooCommunicator::Guard(const std::string& op, int64_t bytes, Fn&& fn, int p2p_peer) {
  const std::string what_op = p2p_peer < 0 ? op : op + " with group rank " + std::to_string(p2p_peer);
  TESSEL_CHECK_CODE(context_ != nullptr, StatusCode::kUnavailable)
      << what_op << " on " << Describe() << ": the group was closed (the world has shut down)";
  FlightRecorder& recorder = FlightRecorder::Get();
  uint64_t token = 0;
  CommTrace& trace = CommTrace::Get();
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(seq_mu_);
    seq = p2p_peer < 0 ? ++seq_ : ++p2p_seq_[p2p_peer];
  }
  if (p2p_peer < 0) {
    token = recorder.Begin(op, world_ranks_, seq, bytes);
    if (trace.enabled() && op != "connect") trace.Record(op.c_str(), world_ranks_, bytes);
  } else {
    token = recorder.Begin(op, {world_ranks_[rank_], world_ranks_[p2p_peer]}, seq, bytes);
    // Posting is bookkeeping; the transfer is traced when it is waited for.
    if (trace.enabled() && op.rfind("post_", 0) != 0)
      trace.Record(op.c_str(), {world_ranks_[rank_], world_ranks_[p2p_peer]}, bytes);
  }
  try {
    fn();
    recorder.End(token, true);
  } catch (const Error& e) {
    recorder.End(token, false);
    TESSEL_THROW(e.code()) << what_op << " on " << Describe() << " failed at group rank " << rank_
                           << " (world rank " << world_ranks_[rank_] << "): " << e.what();
  } catch (const std::exception& e) {
    recorder.End(token, false);
    std::string what = e.what();
    bool timed_out = what.find("imed out") != std::string::npos;
    // The flight recorder: what this rank ran last, so the diverging rank
    // (a different op or sequence number on the same group) can be found.
    LOG(ERROR) << what_op << (timed_out ? " timed out" : " failed") << " on " << Describe() << "; "
               << recorder.Dump();
    if (!timed_out) {
      // A closed connection is usually the echo of another rank's failure
      // (it timed out or crashed and closed its pairs). Let that rank exit
      // first, so the launcher names the root cause rather than this echo.
      std::this_thread::sleep_for(kSecondaryFailureDelay);
    }
    TESSEL_THROW(timed_out ? StatusCode::kTimeout : StatusCode::kUnavailable)
        << what_op << (timed_out ? " timed out after " : " failed (timeout ") << timeout_.count() / 1000.0
        << (timed_out ? " s" : " s)") << " on " << Describe() << " at group rank " << rank_ << " (world rank "
        << world_ranks_[rank_] << "): "
        << (timed_out ? "a peer died or never reached this collective"
                      : "the connection to a peer was lost (see that rank's error)")
        << " [gloo: " << what << "]";
  }
}

void GlooCommunicator::DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (IsHalf(dtype) && op == ReduceOp::kSum) {
    std::vector<float> wide = Widen(buf, count, dtype);
    DoAllReduce(wide.data(), count, DType::kFloat32, op);
    Narrow(wide.data(), count, buf, dtype);
    return;
  }
  Guard("all_reduce", count * static_cast<int64_t>(ElementSize(dtype)), [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setTimeout(timeout_);
    VisitWidth(dtype, [&](auto zero) {
      using W = decltype(zero);
      opts.setOutput(static_cast<W*>(buf), static_cast<size_t>(count));
    });
    opts.setReduceFunction(GetReduce(dtype, op));
    const size_t bytes = static_cast<size_t>(count) * ElementSize(dtype);
    if (bytes * static_cast<size_t>(size() - 1) <= kOneRoundAllReduceBytes) {
      AllReduceInOneRound(*context_, rank_, timeout_, buf, count, ElementSize(dtype), GetReduce(dtype, op));
      return;
    }
    // Small messages are latency-bound: BCUBE takes log2(p) steps where the
    // ring takes 2(p-1). Large ones are bandwidth-bound: the ring is optimal.
    if (bytes <= kSmallAllReduceBytes) opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
    gloo::allreduce(opts);
  });
}

void GlooCommunicator::DoAllGatherV(const void* in, void* out, const std::vector<int64_t>& counts,
                                    DType dtype) {
  CheckCounts("all_gather", counts);
  if (Sum(counts) == 0) return;
  Guard("all_gather", Sum(counts) * static_cast<int64_t>(ElementSize(dtype)), [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setTimeout(timeout_);
    std::vector<size_t> elements(counts.begin(), counts.end());
    VisitWidth(dtype, [&](auto zero) {
      using W = decltype(zero);
      opts.setInput(static_cast<W*>(NonNull(in)), elements[rank_]);
      opts.setOutput(static_cast<W*>(NonNull(out)), elements);
    });
    gloo::allgatherv(opts);
  });
}

void GlooCommunicator::DoAllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                   const std::vector<int64_t>& recv_counts, DType dtype) {
  CheckCounts("all_to_all (send counts)", send_counts);
  CheckCounts("all_to_all (receive counts)", recv_counts);
  Guard("all_to_all", Sum(send_counts) * static_cast<int64_t>(ElementSize(dtype)), [&] {
    gloo::AlltoallvOptions opts(context_);
    opts.setTimeout(timeout_);
    VisitWidth(dtype, [&](auto zero) {
      using W = decltype(zero);
      opts.setInput(static_cast<W*>(NonNull(in)), send_counts);
      opts.setOutput(static_cast<W*>(NonNull(out)), recv_counts);
    });
    gloo::alltoallv(opts);
  });
}

void GlooCommunicator::DoReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts,
                                        DType dtype, ReduceOp op) {
  CheckCounts("reduce_scatter", counts);
  // Each member sends block r to member r (an all-to-all moving T(p-1)/p
  // bytes per rank, the same as a ring) and reduces the p blocks it gets.
  const int64_t mine = counts[rank_];
  const size_t esize = ElementSize(dtype);
  std::vector<char> blocks(static_cast<size_t>(mine) * size() * esize);
  std::vector<int64_t> recv_counts(size(), mine);
  DoAllToAllV(in, counts, blocks.data(), recv_counts, dtype);
  if (mine == 0) return;
  const size_t block_bytes = static_cast<size_t>(mine) * esize;
  if (IsHalf(dtype) && op == ReduceOp::kSum) {
    std::vector<float> sum(static_cast<size_t>(mine), 0.f);
    for (int r = 0; r < size(); ++r) {
      std::vector<float> block = Widen(blocks.data() + r * block_bytes, mine, dtype);
      for (int64_t i = 0; i < mine; ++i) sum[i] += block[i];
    }
    Narrow(sum.data(), mine, out, dtype);
    return;
  }
  std::memcpy(out, blocks.data(), block_bytes);
  ReduceFn reduce = GetReduce(dtype, op);
  for (int r = 1; r < size(); ++r)
    reduce(out, out, blocks.data() + r * block_bytes, static_cast<size_t>(mine));
}

void GlooCommunicator::DoBroadcast(void* buf, int64_t count, DType dtype, int root) {
  CheckPeer("broadcast", root);
  if (count == 0) return;
  Guard("broadcast", count * static_cast<int64_t>(ElementSize(dtype)), [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setTimeout(timeout_);
    opts.setRoot(root);
    VisitWidth(dtype, [&](auto zero) {
      using W = decltype(zero);
      opts.setOutput(static_cast<W*>(buf), static_cast<size_t>(count));
    });
    gloo::broadcast(opts);
  });
}

// A posted send or receive on a Gloo unbound buffer.
class GlooWork final : public Work {
 public:
  GlooWork(GlooCommunicator* comm, std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send,
           int peer, int64_t bytes)
      : comm_(comm), buf_(std::move(buf)), is_send_(is_send), peer_(peer), bytes_(bytes) {}
  ~GlooWork() override {
    if (buf_ && !done_) {
      try {
        Wait();
      } catch (const std::exception& e) {
        LOG(ERROR) << e.what();  // destructors must not throw
      }
    }
  }
  void Wait() override {
    if (!buf_ || done_) return;
    done_ = true;
    comm_->Guard(
        is_send_ ? "send" : "recv", bytes_,
        [&] {
          bool ok = is_send_ ? buf_->waitSend(comm_->timeout_) : buf_->waitRecv(comm_->timeout_);
          TESSEL_CHECK_CODE(ok, StatusCode::kUnavailable) << "the transfer was aborted";
        },
        peer_);
  }

 private:
  GlooCommunicator* comm_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;  // null for empty transfers
  bool is_send_;
  int peer_;
  int64_t bytes_;
  bool done_ = false;
};

std::unique_ptr<Work> GlooCommunicator::DoISend(const void* buf, int64_t count, DType dtype, int dst,
                                                uint32_t tag) {
  CheckPeer("send", dst);
  std::unique_ptr<gloo::transport::UnboundBuffer> ubuf;
  if (count > 0) {
    Guard(
        "post_send", 0,
        [&] {
          ubuf = context_->createUnboundBuffer(const_cast<void*>(buf), count * ElementSize(dtype));
          ubuf->send(dst, kP2PSlotBase | tag);
        },
        dst);
  }
  return std::make_unique<GlooWork>(this, std::move(ubuf), true, dst,
                                    count * static_cast<int64_t>(ElementSize(dtype)));
}

std::unique_ptr<Work> GlooCommunicator::DoIRecv(void* buf, int64_t count, DType dtype, int src,
                                                uint32_t tag) {
  CheckPeer("recv", src);
  std::unique_ptr<gloo::transport::UnboundBuffer> ubuf;
  if (count > 0) {
    Guard(
        "post_recv", 0,
        [&] {
          ubuf = context_->createUnboundBuffer(buf, count * ElementSize(dtype));
          ubuf->recv(src, kP2PSlotBase | tag);
        },
        src);
  }
  return std::make_unique<GlooWork>(this, std::move(ubuf), false, src,
                                    count * static_cast<int64_t>(ElementSize(dtype)));
}

void GlooCommunicator::DoBarrier() {
  Guard("barrier", 0, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

}  // namespace tessel::comm
