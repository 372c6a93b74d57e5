// A thread that lives as long as its owner and runs one job at a time: the
// actor runtime's communication stream and its completion queues run on
// these, so a step creates no thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace tessel::runtime {

class Worker {
 public:
  Worker();
  ~Worker();  // waits for the job in progress, then ends the thread
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs `job` on the worker's thread; the previous job must have been
  // waited for. The job must not throw (it reports failures itself).
  void Start(std::function<void()> job);
  // Returns once the job started last has returned.
  void Wait();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable changed_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace tessel::runtime
