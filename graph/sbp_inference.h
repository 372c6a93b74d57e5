// SBP signature inference for an op on global inputs: N-D candidates are
// products of the op's 1-D signatures (plus all-B) over the mesh axes. One
// that needs no input converted (matching the producers) always wins, the
// cheapest of those by output shard bytes; otherwise each is costed as the
// boxing planner's estimate for its inputs plus the bytes of output shards
// it writes (split compute beats replicated), ties to fewer conversions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/op_def.h"
#include "sbp/placement.h"

namespace tessel {

struct NdSignature {
  std::vector<NdSbp> inputs;
  std::vector<NdSbp> outputs;
  double boxing_seconds = 0;  // estimated cost of boxing the inputs
  std::string ToString() const;
};

// Cached per (op, its layout attributes, input layouts) in a cache of at
// most kSignatureCacheCapacity entries (least recently used evicted).
// Throws naming the op, the inputs' layouts and what was tried if nothing
// fits.
constexpr size_t kSignatureCacheCapacity = 4096;
// The same inference on specs (for compiler passes) and on global tensors
// (eager dispatch); both share one cache, so a graph and eager mode agree.
std::shared_ptr<const NdSignature> InferNdSignature(const OpDef& op, const Attrs& attrs,
                                                    const std::vector<GlobalTensorSpec>& inputs,
                                                    const Placement& placement);
std::shared_ptr<const NdSignature> InferNdSignature(const OpDef& op, const Attrs& attrs,
                                                    const std::vector<Tensor>& inputs,
                                                    const Placement& placement);
// Signatures cached now (for tests and reports).
size_t SignatureCacheSize();

}  // namespace tessel
