#include "runtime/worker.h"

#include <utility>

#include "core/error.h"

namespace tessel::runtime {

Worker::Worker() : thread_([this] { Loop(); }) {}

Worker::~Worker() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return !busy_; });
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Worker::Start(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    TESSEL_CHECK_CODE(!busy_, StatusCode::kInternal) << "a worker was given a job while one was running";
    job_ = std::move(job);
    busy_ = true;
  }
  changed_.notify_all();
}

void Worker::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !busy_; });
}

void Worker::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || (busy_ && job_); });
    if (stop_) return;
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    job();
    job = nullptr;  // what the job captured goes before the owner hears it ended
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace tessel::runtime
