#include "core/comm/communicator.h"

#include <sstream>

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
