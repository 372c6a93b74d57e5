#include "core/comm/communicator.h"

#include <glog/logging.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace tessel::comm {

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

std::string Communicator::Describe() const {
  std::ostringstream os;
  os << backend() << " group [";
  for (size_t i = 0; i < world_ranks().size(); ++i) os << (i ? ", " : "") << world_ranks()[i];
  os << "]";
  return os.str();
}

namespace {
// The state an asynchronous collective's Work and the group's thread share.
struct AsyncState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

class AsyncWork final : public Work {
 public:
  explicit AsyncWork(std::shared_ptr<AsyncState> state) : state_(std::move(state)) {}
  ~AsyncWork() override {
    try {
      Wait();
    } catch (const std::exception& e) {
      LOG(ERROR) << e.what();  // destructors must not throw
    }
  }
  void Wait() override {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
    if (state_->error && !rethrown_) {
      rethrown_ = true;
      std::rethrow_exception(state_->error);
    }
  }

 private:
  std::shared_ptr<AsyncState> state_;
  bool rethrown_ = false;
};
}  // namespace

// The group's communication stream: one thread running queued collectives
// in order.
struct Communicator::AsyncQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  bool busy = false;
  bool stopping = false;
  std::thread thread;

  void Loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stopping || !tasks.empty(); });
      if (tasks.empty()) return;  // stopping, and everything queued has run
      std::function<void()> task = std::move(tasks.front());
      tasks.pop_front();
      busy = true;
      lock.unlock();
      task();  // never throws: errors go to the task's Work
      lock.lock();
      busy = false;
      cv.notify_all();
    }
  }
};

Communicator::Communicator() = default;

Communicator::~Communicator() { StopAsync(); }

void Communicator::StopAsync() {
  std::lock_guard<std::mutex> guard(async_mu_);
  if (!async_) return;
  {
    std::lock_guard<std::mutex> lock(async_->mu);
    async_->stopping = true;
  }
  async_->cv.notify_all();
  if (async_->thread.joinable()) async_->thread.join();
  async_.reset();
}

void Communicator::WaitQueued() {
  AsyncQueue* queue = nullptr;
  {
    std::lock_guard<std::mutex> guard(async_mu_);
    queue = async_.get();
  }
  if (queue == nullptr || std::this_thread::get_id() == queue->thread.get_id()) return;
  std::unique_lock<std::mutex> lock(queue->mu);
  queue->cv.wait(lock, [&] { return queue->tasks.empty() && !queue->busy; });
}

std::unique_ptr<Work> Communicator::Enqueue(const char* op, std::function<void()> run) {
  auto state = std::make_shared<AsyncState>();
  std::lock_guard<std::mutex> guard(async_mu_);
  if (!async_) {
    async_ = std::make_unique<AsyncQueue>();
    async_->thread = std::thread([queue = async_.get()] { queue->Loop(); });
  }
  {
    std::lock_guard<std::mutex> lock(async_->mu);
    TESSEL_CHECK_CODE(!async_->stopping, StatusCode::kUnavailable)
        << op << " on " << Describe() << ": the group is closing";
    async_->tasks.push_back([state, run = std::move(run)] {
      std::exception_ptr error;
      try {
        run();
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(state->mu);
      state->error = error;
      state->done = true;
      state->cv.notify_all();
    });
  }
  async_->cv.notify_all();
  return std::make_unique<AsyncWork>(state);
}

size_t Communicator::QueuedCollectives() const {
  std::lock_guard<std::mutex> guard(async_mu_);
  if (!async_) return 0;
  std::lock_guard<std::mutex> lock(async_->mu);
  return async_->tasks.size() + (async_->busy ? 1 : 0);
}

void Communicator::AllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  WaitQueued();
  DoAllReduce(buf, count, dtype, op);
}

void Communicator::AllGatherV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) {
  WaitQueued();
  DoAllGatherV(in, out, counts, dtype);
}

void Communicator::ReduceScatterV(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                                  ReduceOp op) {
  WaitQueued();
  DoReduceScatterV(in, out, counts, dtype, op);
}

void Communicator::AllToAllV(const void* in, const std::vector<int64_t>& send_counts, void* out,
                             const std::vector<int64_t>& recv_counts, DType dtype) {
  WaitQueued();
  DoAllToAllV(in, send_counts, out, recv_counts, dtype);
}

void Communicator::Broadcast(void* buf, int64_t count, DType dtype, int root) {
  WaitQueued();
  DoBroadcast(buf, count, dtype, root);
}

void Communicator::Barrier() {
  WaitQueued();
  DoBarrier();
}

std::unique_ptr<Work> Communicator::ISend(const void* buf, int64_t count, DType dtype, int dst,
                                          uint32_t tag) {
  WaitQueued();
  return DoISend(buf, count, dtype, dst, tag);
}

std::unique_ptr<Work> Communicator::IRecv(void* buf, int64_t count, DType dtype, int src, uint32_t tag) {
  WaitQueued();
  return DoIRecv(buf, count, dtype, src, tag);
}

// Arguments are checked now, on the caller's thread, so a bad call fails
// where it is made; the collective itself runs on the group's thread.
std::unique_ptr<Work> Communicator::IAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  TESSEL_CHECK(count >= 0) << "all_reduce on " << Describe() << ": count " << count << " is negative";
  return Enqueue("all_reduce", [this, buf, count, dtype, op] { DoAllReduce(buf, count, dtype, op); });
}

std::unique_ptr<Work> Communicator::IAllGatherV(const void* in, void* out, const std::vector<int64_t>& counts,
                                                DType dtype) {
  CheckCounts("all_gather", counts);
  return Enqueue("all_gather", [this, in, out, counts, dtype] { DoAllGatherV(in, out, counts, dtype); });
}

std::unique_ptr<Work> Communicator::IReduceScatterV(const void* in, void* out,
                                                    const std::vector<int64_t>& counts, DType dtype,
                                                    ReduceOp op) {
  CheckCounts("reduce_scatter", counts);
  return Enqueue("reduce_scatter",
                 [this, in, out, counts, dtype, op] { DoReduceScatterV(in, out, counts, dtype, op); });
}

std::unique_ptr<Work> Communicator::IBroadcast(void* buf, int64_t count, DType dtype, int root) {
  CheckPeer("broadcast", root);
  return Enqueue("broadcast", [this, buf, count, dtype, root] { DoBroadcast(buf, count, dtype, root); });
}

uint32_t Communicator::NextTag(uint8_t channel, int peer, Direction direction) {
  CheckPeer(direction == Direction::kSend ? "send" : "recv", peer);
  std::lock_guard<std::mutex> lock(tags_mu_);
  uint32_t& seq = next_seq_[{channel, peer, direction == Direction::kSend ? 0 : 1}];
  return MakeTag(channel, seq++);
}

void Communicator::AllGather(const void* in, int64_t count, void* out, DType dtype) {
  AllGatherV(in, out, std::vector<int64_t>(size(), count), dtype);
}

void Communicator::ReduceScatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
  ReduceScatterV(in, out, std::vector<int64_t>(size(), count), dtype, op);
}

void Communicator::AllToAll(const void* in, void* out, int64_t count, DType dtype) {
  std::vector<int64_t> counts(size(), count);
  AllToAllV(in, counts, out, counts, dtype);
}

void Communicator::CheckCounts(const char* op, const std::vector<int64_t>& counts) const {
  TESSEL_CHECK(static_cast<int>(counts.size()) == size())
      << op << " on " << Describe() << " got " << counts.size() << " counts; expected one per member ("
      << size() << ")";
  for (size_t i = 0; i < counts.size(); ++i) {
    TESSEL_CHECK(counts[i] >= 0) << op << " on " << Describe() << ": count " << counts[i] << " for member "
                                 << i << " is negative";
  }
}

void Communicator::CheckPeer(const char* op, int peer) const {
  TESSEL_CHECK(peer >= 0 && peer < size()) << op << " on " << Describe() << ": peer " << peer
                                           << " is not a group rank (expected 0.." << size() - 1 << ")";
}

}  // namespace tessel::comm
