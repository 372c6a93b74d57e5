#include "core/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "core/comm/tcp_store.h"
#include "core/error.h"

namespace tessel::comm {

namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kBool:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

void CheckCuda(cudaError_t err, const std::string& what) {
  TESSEL_CHECK_CODE(err == cudaSuccess, StatusCode::kInternal)
      << what << ": " << cudaGetErrorString(err) << " (CUDA error " << static_cast<int>(err) << ")";
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

bool AllEqual(const std::vector<int64_t>& counts) {
  for (int64_t c : counts)
    if (c != counts[0]) return false;
  return true;
}

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // the compute stream's point a collective starts after
  void* barrier_buf = nullptr;
  std::mutex mu;  // one enqueue at a time: NCCL calls on one communicator are not thread-safe
  bool aborted = false;
};

// A posted send or receive: waits on its event with the group's deadline.
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* comm, std::string op, void* event)
      : comm_(comm), op_(std::move(op)), event_(event) {}
  ~NcclWork() override {
    if (event_ == nullptr) return;
    try {
      Wait();
    } catch (const std::exception&) {
      // A destructor must not throw; the error was the peer's to report.
    }
  }
  void Wait() override {
    if (event_ == nullptr) return;
    void* e = event_;
    event_ = nullptr;
    comm_->WaitEvent(op_.c_str(), e);
  }

 private:
  NcclCommunicator* comm_;
  std::string op_;
  void* event_;
};

// NCCL calls on a non-blocking communicator may return ncclInProgress; they
// are done once the communicator's asynchronous error leaves that state.
#define TESSEL_NCCL(call, what)                                                                          \
  do {                                                                                                   \
    ncclResult_t r_ = (call);                                                                            \
    TESSEL_CHECK_CODE(r_ == ncclSuccess || r_ == ncclInProgress, StatusCode::kInternal)                  \
        << what << " on " << Describe() << " at group rank " << rank_ << ": " << ncclGetErrorString(r_); \
  } while (0)

NcclCommunicator::NcclCommunicator(TcpStore& store, const std::string& store_prefix,
                                   std::vector<int> world_ranks, int rank, int device_index,
                                   std::chrono::milliseconds timeout)
    : state_(std::make_unique<State>()),
      world_ranks_(std::move(world_ranks)),
      rank_(rank),
      device_index_(device_index),
      timeout_(timeout) {
  CheckCuda(cudaSetDevice(device_index_), "cudaSetDevice(" + std::to_string(device_index_) + ")");
  const std::string key = store_prefix + "/nccl_unique_id";
  ncclUniqueId id;
  if (rank_ == 0) {
    TESSEL_NCCL(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    store.wait({key}, timeout_);
    std::vector<char> bytes = store.get(key);
    TESSEL_CHECK_CODE(bytes.size() == sizeof(id.internal), StatusCode::kInternal)
        << "NCCL unique id of " << Describe() << " in the store has " << bytes.size() << " bytes; expected "
        << sizeof(id.internal);
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  TESSEL_NCCL(ncclCommInitRankConfig(&state_->comm, size(), id, rank_, &config), "ncclCommInitRankConfig");
  CheckCuda(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  CheckCuda(cudaEventCreateWithFlags(&state_->ready, cudaEventDisableTiming), "cudaEventCreate");
  CheckCuda(cudaMalloc(&state_->barrier_buf, sizeof(float)), "cudaMalloc (barrier)");
  // Initialisation completes asynchronously; a member that never comes is
  // an error at the deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(state_->comm, &async);
    if (async == ncclSuccess) break;
    TESSEL_CHECK_CODE(async == ncclInProgress, StatusCode::kUnavailable)
        << "NCCL init of " << Describe() << " at group rank " << rank_
        << " failed: " << ncclGetErrorString(async)
        << (async == ncclInvalidUsage ? " (two ranks of a group on one GPU? NCCL needs a GPU per rank)" : "");
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(state_->comm);
      state_->comm = nullptr;
      TESSEL_THROW(StatusCode::kTimeout) << "NCCL init of " << Describe() << " at group rank " << rank_
                                         << " timed out after " << timeout_.count() / 1000.0 << " s";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

NcclCommunicator::~NcclCommunicator() {
  StopAsync();
  Close();
  if (state_->ready) cudaEventDestroy(state_->ready);
  if (state_->stream) cudaStreamDestroy(state_->stream);
  if (state_->barrier_buf) cudaFree(state_->barrier_buf);
}

void NcclCommunicator::Close() {
  StopAsync();
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->comm == nullptr) return;
  // Abort rather than finalise: finalising waits for peers, which may be gone.
  ncclCommAbort(state_->comm);
  state_->comm = nullptr;
}

void* NcclCommunicator::Enqueue(const char* op, const std::function<void()>& enqueue) {
  std::lock_guard<std::mutex> lock(state_->mu);
  TESSEL_CHECK_CODE(state_->comm != nullptr, StatusCode::kUnavailable)
      << op << " on " << Describe() << ": the group was closed" << (state_->aborted ? " after an error" : "");
  CheckCuda(cudaSetDevice(device_index_), "cudaSetDevice");
  // The buffers were written by kernels on the compute stream (the legacy
  // default stream): the group's stream starts after them.
  CheckCuda(cudaEventRecord(state_->ready, nullptr), "cudaEventRecord");
  CheckCuda(cudaStreamWaitEvent(state_->stream, state_->ready, 0), "cudaStreamWaitEvent");
  TESSEL_NCCL(ncclGroupStart(), "ncclGroupStart");
  enqueue();
  TESSEL_NCCL(ncclGroupEnd(), std::string(op) + " (ncclGroupEnd)");
  // A non-blocking communicator may still be enqueuing: the stream holds
  // the work only once its state leaves ncclInProgress.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (ncclResult_t async = ncclInProgress; async == ncclInProgress;) {
    ncclCommGetAsyncError(state_->comm, &async);
    TESSEL_CHECK_CODE(async == ncclSuccess || async == ncclInProgress, StatusCode::kUnavailable)
        << op << " on " << Describe() << " failed at group rank " << rank_ << ": "
        << ncclGetErrorString(async);
    TESSEL_CHECK_CODE(std::chrono::steady_clock::now() < deadline, StatusCode::kTimeout)
        << op << " on " << Describe() << " could not be enqueued within " << timeout_.count() / 1000.0
        << " s";
    if (async == ncclInProgress) std::this_thread::yield();
  }
  cudaEvent_t done = nullptr;
  CheckCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  CheckCuda(cudaEventRecord(done, state_->stream), "cudaEventRecord");
  return done;
}

void NcclCommunicator::WaitEvent(const char* op, void* event) {
  cudaEvent_t done = static_cast<cudaEvent_t>(event);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      cudaEventDestroy(done);
      CheckCuda(q, std::string(op) + " on " + Describe());
    }
    ncclResult_t async = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->comm != nullptr) ncclCommGetAsyncError(state_->comm, &async);
    }
    const bool late = std::chrono::steady_clock::now() > deadline;
    if ((async != ncclSuccess && async != ncclInProgress) || late) {
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        if (state_->comm != nullptr) ncclCommAbort(state_->comm);
        state_->comm = nullptr;
        state_->aborted = true;
      }
      cudaEventDestroy(done);
      if (late) {
        TESSEL_THROW(StatusCode::kTimeout)
            << op << " on " << Describe() << " timed out after " << timeout_.count() / 1000.0
            << " s at group rank " << rank_ << " (world rank " << world_ranks_[rank_] << ")";
      }
      TESSEL_THROW(StatusCode::kUnavailable) << op << " on " << Describe() << " failed at group rank "
                                             << rank_ << ": " << ncclGetErrorString(async);
    }
    std::this_thread::yield();
  }
  cudaEventDestroy(done);
}

void NcclCommunicator::Run(const char* op, const std::function<void()>& enqueue) {
  WaitEvent(op, Enqueue(op, enqueue));
}

void NcclCommunicator::DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  Run("all_reduce", [&] {
    TESSEL_NCCL(ncclAllReduce(buf, buf, count, NcclType(dtype), NcclOp(op), state_->comm, state_->stream),
                "ncclAllReduce");
  });
}

void NcclCommunicator::DoAllGatherV(const void* in, void* out, const std::vector<int64_t>& counts,
                                    DType dtype) {
  const size_t es = ElementSize(dtype);
  const std::vector<int64_t> off = Offsets(counts);
  Run("all_gather", [&] {
    if (AllEqual(counts)) {
      TESSEL_NCCL(ncclAllGather(in, out, counts[0], NcclType(dtype), state_->comm, state_->stream),
                  "ncclAllGather");
      return;
    }
    // Uneven blocks: each member broadcasts its own (one NCCL group).
    for (int r = 0; r < size(); ++r) {
      if (counts[r] == 0) continue;
      char* dst = static_cast<char*>(out) + off[r] * es;
      TESSEL_NCCL(ncclBroadcast(r == rank_ ? in : dst, dst, counts[r], NcclType(dtype), r, state_->comm,
                                state_->stream),
                  "ncclBroadcast");
    }
  });
}

void NcclCommunicator::DoReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts,
                                        DType dtype, ReduceOp op) {
  const size_t es = ElementSize(dtype);
  const std::vector<int64_t> off = Offsets(counts);
  Run("reduce_scatter", [&] {
    if (AllEqual(counts)) {
      TESSEL_NCCL(
          ncclReduceScatter(in, out, counts[0], NcclType(dtype), NcclOp(op), state_->comm, state_->stream),
          "ncclReduceScatter");
      return;
    }
    // Uneven blocks: block r is reduced onto member r.
    for (int r = 0; r < size(); ++r) {
      if (counts[r] == 0) continue;
      TESSEL_NCCL(ncclReduce(static_cast<const char*>(in) + off[r] * es, out, counts[r], NcclType(dtype),
                             NcclOp(op), r, state_->comm, state_->stream),
                  "ncclReduce");
    }
  });
}

void NcclCommunicator::DoAllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                   const std::vector<int64_t>& recv_counts, DType dtype) {
  const size_t es = ElementSize(dtype);
  const std::vector<int64_t> soff = Offsets(send_counts), roff = Offsets(recv_counts);
  Run("all_to_all", [&] {
    for (int r = 0; r < size(); ++r) {
      if (send_counts[r] > 0)
        TESSEL_NCCL(ncclSend(static_cast<const char*>(in) + soff[r] * es, send_counts[r], NcclType(dtype), r,
                             state_->comm, state_->stream),
                    "ncclSend");
      if (recv_counts[r] > 0)
        TESSEL_NCCL(ncclRecv(static_cast<char*>(out) + roff[r] * es, recv_counts[r], NcclType(dtype), r,
                             state_->comm, state_->stream),
                    "ncclRecv");
    }
  });
}

void NcclCommunicator::DoBroadcast(void* buf, int64_t count, DType dtype, int root) {
  Run("broadcast", [&] {
    TESSEL_NCCL(ncclBroadcast(buf, buf, count, NcclType(dtype), root, state_->comm, state_->stream),
                "ncclBroadcast");
  });
}

std::unique_ptr<Work> NcclCommunicator::DoISend(const void* buf, int64_t count, DType dtype, int dst,
                                                uint32_t /*tag*/) {
  void* e = Enqueue("send", [&] {
    TESSEL_NCCL(ncclSend(buf, count, NcclType(dtype), dst, state_->comm, state_->stream), "ncclSend");
  });
  return std::make_unique<NcclWork>(this, "send to group rank " + std::to_string(dst), e);
}

std::unique_ptr<Work> NcclCommunicator::DoIRecv(void* buf, int64_t count, DType dtype, int src,
                                                uint32_t /*tag*/) {
  void* e = Enqueue("recv", [&] {
    TESSEL_NCCL(ncclRecv(buf, count, NcclType(dtype), src, state_->comm, state_->stream), "ncclRecv");
  });
  return std::make_unique<NcclWork>(this, "recv from group rank " + std::to_string(src), e);
}

void NcclCommunicator::DoBarrier() { DoAllReduce(state_->barrier_buf, 1, DType::kFloat32, ReduceOp::kSum); }

}  // namespace tessel::comm
