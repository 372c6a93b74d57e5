// The launcher's output to its own stdout and stderr, written by a thread
// per stream so that the loop watching the ranks never waits on a reader:
// with stdout a pipe nobody reads (a paused pager), a rank that dies is
// still seen at once. Up to kMaxQueuedBytes wait per stream; while that is
// full the launcher stops reading the ranks' output (Full), so a slow reader
// (`| tee log`) slows the ranks as a pipe would and loses nothing. A reader
// that takes nothing for kStallSeconds is stalled: from then until it reads
// again the ranks' output is dropped, counted and reported, so the ranks
// keep running and the launcher's memory stays bounded.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace tessel::launch {

class OutputWriter {
 public:
  static constexpr size_t kMaxQueuedBytes = size_t{8} << 20;
  static constexpr double kStallSeconds = 10;

  OutputWriter();
  ~OutputWriter();  // Flush(1 s); a thread still blocked in write() is left to the process's exit
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  // Queues `text` for `fd` (STDOUT_FILENO or STDERR_FILENO); never blocks.
  // Dropped (and counted) only while the stream is stalled.
  void Write(int fd, std::string text);
  // Whether the ranks' output for `fd` should wait unread: the queue is
  // full and its reader is still taking some (not stalled, not gone).
  bool Full(int fd) const;
  // Waits until everything queued is written, or until the readers take
  // nothing for `seconds`; what is left then is dropped (a reader that
  // never reads must not keep the job from ending).
  void Flush(double seconds);
  // Bytes dropped so far because a stream's reader did not keep up.
  int64_t dropped_bytes() const;

 private:
  // A piece of output and the descriptor it goes to.
  struct Piece {
    int fd;
    std::string text;
  };
  // One per output stream, each with its own thread: a blocked stdout
  // does not hold back the launcher's messages on stderr. When stdout and
  // stderr are one file (a terminal, `2>&1`), everything goes through out_
  // so that a rank's lines keep the order it wrote them in.
  struct Stream {
    int fd = -1;
    std::deque<Piece> queue;
    size_t queued = 0;
    int64_t dropped = 0;                             // not yet reported
    int64_t dropped_all = 0;                         // in all
    bool writing = false;                            // the thread is in write()
    std::chrono::steady_clock::time_point progress;  // the last byte written, or the queue empty
    bool closed = false;                             // the reader went away (EPIPE): everything is dropped
    std::thread thread;
  };
  void Run(Stream& stream);
  // Writes `s` whole; false if the reader went away.
  static bool WriteAll(int fd, const std::string& s);
  Stream& StreamOf(int fd);
  const Stream& StreamOf(int fd) const { return const_cast<OutputWriter*>(this)->StreamOf(fd); }
  bool Stalled(const Stream& s) const;  // with mu_ held
  // Queues a launcher note on stderr (with mu_ held); false if stderr's
  // reader is gone.
  bool QueueNote(std::string note);

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  Stream out_, err_;
  bool one_file_ = false;  // stdout and stderr are the same open file
  bool stop_ = false;
};

// The launcher's one writer (made on first use, never destroyed: Flush it
// before the launcher exits).
OutputWriter& Output();

// A launcher message on stderr, printf-style, through Output().
void Say(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace tessel::launch
