#include "graph/op_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#ifdef TESSEL_HAS_CUDA
#include "core/cuda/cuda_runtime.h"
#endif

namespace tessel {
namespace {

// TESSEL_PROFILE_OPS=1: time spent per op (kernel and boxing, not
// recording), printed to stderr at exit, slowest first. On a GPU the
// kernels run behind the host, so that is the host's time: dispatch, and
// waits when the launch queue is full. TESSEL_PROFILE_OPS=sync waits for
// the GPU before and after each op, so each op's figure is its GPU time
// plus its dispatch (the step gets slower: for finding where GPU time goes).
// TESSEL_PROFILE_OPS=events records a CUDA event in the GPU's queue before
// and after each op and reads them once the GPU has passed them, so the
// step runs at its speed and each op's figure is the GPU time between its
// events (which includes any wait of the GPU for the host to launch the
// op's kernels: an op of a GPU-bound step has none).
class OpProfile {
 public:
  enum class Mode { kHost, kSync, kEvents };
  static OpProfile* Get() {
    static OpProfile* profile = std::getenv("TESSEL_PROFILE_OPS") ? new OpProfile() : nullptr;
    return profile;
  }
  Mode mode() const { return mode_; }
  void WaitForDevice() const {
#ifdef TESSEL_HAS_CUDA
    if (mode_ == Mode::kSync && cuda::DeviceCount() > 0) cuda::Synchronize();
#endif
  }
  void Add(const std::string& op, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    AddLocked(op, seconds);
  }
#ifdef TESSEL_HAS_CUDA
  // Events mode: the op ran between these two events; spans the GPU has
  // passed are read now, without waiting.
  void AddSpan(const std::string& op, void* start, void* end) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({op, start, end});
    ReadSpans(/*wait=*/false);
  }
#endif

 private:
  OpProfile() {
    const std::string mode = std::getenv("TESSEL_PROFILE_OPS");
    mode_ = mode == "sync" ? Mode::kSync : mode == "events" ? Mode::kEvents : Mode::kHost;
#ifdef TESSEL_HAS_CUDA
    if (mode_ == Mode::kEvents && cuda::DeviceCount() == 0) mode_ = Mode::kHost;  // no GPU: host times
#else
    if (mode_ == Mode::kEvents) mode_ = Mode::kHost;
#endif
    std::atexit([] { Get()->Print(); });
  }
  void AddLocked(const std::string& op, double seconds) {
    auto& [total, calls] = totals_[op];
    total += seconds;
    ++calls;
  }
#ifdef TESSEL_HAS_CUDA
  struct Span {
    std::string op;
    void* start;
    void* end;
  };
  void ReadSpans(bool wait) {
    while (!pending_.empty() && (wait || cuda::EventDone(pending_.front().end))) {
      const Span& s = pending_.front();
      const float ms = cuda::ElapsedMs(s.start, s.end);
      if (ms >= 0) {
        AddLocked(s.op, ms * 1e-3);
      } else {
        ++unread_;
      }
      pending_.pop_front();
    }
  }
#endif
  void Print() {
    std::lock_guard<std::mutex> lock(mu_);
#ifdef TESSEL_HAS_CUDA
    ReadSpans(/*wait=*/true);
#endif
    std::vector<std::pair<double, std::string>> rows;
    double all = 0;
    for (const auto& [op, tc] : totals_) rows.push_back({tc.first, op}), all += tc.first;
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "tessel op profile (%.1f ms in ops%s):\n", all * 1e3,
                 mode_ == Mode::kEvents ? ", GPU time between events; host time for host ops" : "");
    if (unread_ > 0)
      std::fprintf(stderr, "  (%ld spans could not be read at exit)\n", static_cast<long>(unread_));
    for (const auto& [t, op] : rows) {
      std::fprintf(stderr, "  %-22s %9.2f ms %5.1f%%  %6ld calls\n", op.c_str(), t * 1e3, 100 * t / all,
                   static_cast<long>(totals_[op].second));
    }
  }
  Mode mode_ = Mode::kHost;
  std::mutex mu_;
  std::map<std::string, std::pair<double, int64_t>> totals_;
#ifdef TESSEL_HAS_CUDA
  std::deque<Span> pending_;
#endif
  int64_t unread_ = 0;
};

}  // namespace

bool OpProfileEnabled() { return OpProfile::Get() != nullptr; }

std::vector<Tensor> ProfileOp(const std::string& name, const std::vector<Tensor>& inputs,
                              const std::function<std::vector<Tensor>()>& run) {
  OpProfile* profile = OpProfile::Get();
  if (profile == nullptr) return run();
#ifdef TESSEL_HAS_CUDA
  // Events mode times an op on its inputs' GPU; host ops (no GPU input)
  // keep host times.
  int gpu = -1;
  for (const Tensor& t : inputs)
    if (gpu < 0 && t.defined() && !t.is_lazy() && t.device().is_cuda()) gpu = t.device().index();
  if (profile->mode() == OpProfile::Mode::kEvents && gpu >= 0) {
    void* start = cuda::RecordEvent(gpu);
    std::vector<Tensor> outs;
    try {
      outs = run();
    } catch (...) {
      cuda::DropEvent(start);
      throw;
    }
    profile->AddSpan(name, start, cuda::RecordEvent(gpu));
    return outs;
  }
#else
  (void)inputs;
#endif
  profile->WaitForDevice();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor> outs = run();
  profile->WaitForDevice();
  profile->Add(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return outs;
}

}  // namespace tessel
