#include "core/comm/comm_trace.h"

#include <map>
#include <sstream>
#include <utility>

#include "core/comm/flight_recorder.h"

namespace tessel::comm {

CommTrace& CommTrace::Get() {
  static CommTrace* trace = new CommTrace();  // never destroyed: communicators record until exit
  return *trace;
}

void CommTrace::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.clear();
  enabled_.store(true, std::memory_order_relaxed);
}

void CommTrace::Record(const char* op, const std::vector<int>& group, int64_t bytes) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  calls_.push_back({op, group, bytes});
}

std::vector<CommCall> CommTrace::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(calls_, {});
}

std::string CommTrace::Summarize(const std::vector<CommCall>& calls) {
  // (op, group) -> (calls, bytes), printed in first-seen order.
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> rows;
  std::map<std::string, size_t> index;
  int64_t total_bytes = 0;
  for (const CommCall& c : calls) {
    std::string key = c.op + " [" + FormatRanks(c.group) + "]";
    auto [it, fresh] = index.emplace(key, rows.size());
    if (fresh) rows.push_back({key, {0, 0}});
    rows[it->second].second.first += 1;
    rows[it->second].second.second += c.bytes;
    total_bytes += c.bytes;
  }
  std::ostringstream os;
  for (const auto& [key, cb] : rows) os << "  " << key << " x" << cb.first << " " << cb.second << " B\n";
  os << "  total: " << calls.size() << " calls, " << total_bytes << " B\n";
  return os.str();
}

}  // namespace tessel::comm
