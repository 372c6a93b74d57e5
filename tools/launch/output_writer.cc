#include "tools/launch/output_writer.h"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>

namespace tessel::launch {

OutputWriter::OutputWriter() {
  out_.fd = STDOUT_FILENO;
  err_.fd = STDERR_FILENO;
  struct stat out_stat {
  }, err_stat{};
  one_file_ = ::fstat(STDOUT_FILENO, &out_stat) == 0 && ::fstat(STDERR_FILENO, &err_stat) == 0 &&
              out_stat.st_dev == err_stat.st_dev && out_stat.st_ino == err_stat.st_ino;
  for (Stream* s : {&out_, &err_}) {
    s->progress = std::chrono::steady_clock::now();
    s->thread = std::thread([this, s] { Run(*s); });
  }
}

OutputWriter::~OutputWriter() {
  Flush(1.0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (Stream* s : {&out_, &err_}) {
    bool blocked;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocked = s->writing;
    }
    // A thread still in write() to a reader that never reads is left to the
    // process's exit rather than waited for.
    if (blocked) {
      s->thread.detach();
    } else {
      s->thread.join();
    }
  }
}

OutputWriter::Stream& OutputWriter::StreamOf(int fd) {
  return fd == STDOUT_FILENO || one_file_ ? out_ : err_;
}

bool OutputWriter::QueueNote(std::string note) {
  Stream& s = StreamOf(STDERR_FILENO);
  if (s.closed) return false;
  s.queued += note.size();
  s.queue.push_back({STDERR_FILENO, std::move(note)});
  return true;
}

bool OutputWriter::Stalled(const Stream& s) const {
  return !s.queue.empty() &&
         std::chrono::steady_clock::now() - s.progress > std::chrono::duration<double>(kStallSeconds);
}

bool OutputWriter::Full(int fd) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Stream& s = StreamOf(fd);
  return !s.closed && s.queued >= kMaxQueuedBytes && !Stalled(s);
}

void OutputWriter::Write(int fd, std::string text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Stream& s = StreamOf(fd);
    if (s.closed) return;
    if (s.queued + text.size() > kMaxQueuedBytes && Stalled(s)) {
      if (s.dropped == 0 && !one_file_ && &s == &out_) {  // said once a stall, where it can be read
        QueueNote("tessel-launch: standard output has taken nothing for " +
                  std::to_string(static_cast<int>(kStallSeconds)) +
                  " s; the ranks' output is dropped until it reads again\n");
      }
      s.dropped += static_cast<int64_t>(text.size());
      s.dropped_all += static_cast<int64_t>(text.size());
    } else {
      if (s.queue.empty()) s.progress = std::chrono::steady_clock::now();  // a stall counts from here
      s.queued += text.size();
      s.queue.push_back({fd, std::move(text)});
    }
  }
  wake_.notify_all();
}

bool OutputWriter::WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {  // a non-blocking descriptor shared with another process
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, 100);
      continue;
    }
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void OutputWriter::Run(Stream& s) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || !s.queue.empty() || (s.dropped > 0 && !s.closed); });
    if (s.queue.empty() && s.dropped > 0 && !s.closed) {
      // The reader caught up: say what it missed, on stderr.
      const std::string note = "tessel-launch: " + std::to_string(s.dropped) + " bytes of the ranks' " +
                               (s.fd == STDOUT_FILENO ? "standard output" : "standard error") +
                               " were dropped: its reader did not keep up\n";
      s.dropped = 0;
      if (!QueueNote(note)) {
        s.queue.push_back({s.fd, note});
        s.queued += note.size();
      }
      wake_.notify_all();
      continue;
    }
    if (s.queue.empty()) {
      if (stop_) return;
      continue;
    }
    Piece piece = std::move(s.queue.front());
    s.queue.pop_front();
    s.writing = true;
    lock.unlock();
    const bool ok = WriteAll(piece.fd, piece.text);
    lock.lock();
    s.writing = false;
    s.queued -= piece.text.size();
    s.progress = std::chrono::steady_clock::now();
    if (!ok && !s.closed) {
      // EPIPE (`tessel-launch ... | head`): the rest of this stream is
      // dropped and the job goes on.
      s.closed = true;
      for (const Piece& p : s.queue) s.dropped_all += static_cast<int64_t>(p.text.size());
      s.queue.clear();
      s.queued = 0;
      if (&s == &out_ && !one_file_ &&
          QueueNote("tessel-launch: standard output was closed by its reader; the ranks' output is dropped "
                    "from now on\n")) {
        wake_.notify_all();
      }
    }
    idle_.notify_all();
  }
}

void OutputWriter::Flush(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto done = [&] {
    for (Stream* s : {&out_, &err_}) {
      if (s->closed) continue;
      if (!s->queue.empty() || s->writing || s->dropped > 0) return false;
    }
    return true;
  };
  // A reader that keeps taking output gets all of it; one that takes
  // nothing for `seconds` loses the rest.
  while (!done()) {
    auto last = out_.progress;
    if (err_.progress > last) last = err_.progress;
    if (std::chrono::steady_clock::now() - last > std::chrono::duration<double>(seconds)) break;
    idle_.wait_for(lock, std::chrono::milliseconds(100));
  }
  if (done()) return;
  for (Stream* s : {&out_, &err_}) {
    for (const Piece& p : s->queue) s->dropped_all += static_cast<int64_t>(p.text.size());
    s->queue.clear();
    s->queued = 0;
    s->dropped = 0;
  }
}

int64_t OutputWriter::dropped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_.dropped_all + err_.dropped_all;
}

OutputWriter& Output() {
  static OutputWriter* writer = new OutputWriter();  // outlives every static that might print
  return *writer;
}

void Say(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string text(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(text.data(), text.size() + 1, format, args);
  va_end(args);
  Output().Write(STDERR_FILENO, std::move(text));
}

}  // namespace tessel::launch
