// micro_batch: one micro-batch of a batch, for gradient accumulation
// (graph/passes/gradient_accumulation.cc splits a step's inputs with it).
//
// The batch (dimension 0) is read as `blocks` equal blocks of rows, and
// micro-batch `index` of `count` takes the index-th of `count` equal chunks
// of every block, in block order. The count micro-batches together hold
// every row once. The pass sets `blocks` to the number of shards the batch
// is split into (the data-parallel ranks), so each rank's micro-batch is the
// index-th chunk of its own rows and no data moves between ranks — the way
// OneFlow splits a data-parallel batch — while the op still means one
// thing for every layout (a local run gives the same rows).
//
// Not differentiable: it slices a step's data inputs.
#include "core/error.h"
#include "ops/cpu/tensor_ops.h"
#include "ops/defs/def_util.h"
#include "sbp/slice.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/tensor_ops.h"
#endif

namespace tessel {
namespace {

struct MicroBatchAttrs {
  int64_t index, count, blocks;
};

MicroBatchAttrs Read(const Attrs& a) {
  return {a.Get<int64_t>("index"), a.Get<int64_t>("count"), a.Get<int64_t>("blocks")};
}

}  // namespace

void RegisterMicroBatchOps() {
  OpDef def;
  def.name = "micro_batch";
  def.grad_unsupported =
      "it cuts a step's data inputs into micro-batches; inputs that need a gradient are not data";
  def.inputs = {"batch"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const auto [index, count, blocks] = Read(a);
    const Shape& shape = in[0].shape;
    TESSEL_CHECK(shape.ndim() >= 1) << "micro_batch: the batch must have a dimension 0, got a scalar";
    TESSEL_CHECK(count >= 1 && 0 <= index && index < count && blocks >= 1)
        << "micro_batch: index " << index << " of " << count << " micro-batches in " << blocks
        << " blocks; expected 0 <= index < count and count, blocks >= 1";
    TESSEL_CHECK(shape[0] % (blocks * count) == 0)
        << "micro_batch: a batch of " << shape[0] << " rows in " << blocks << " block(s) cannot be cut into "
        << count << " micro-batches; the rows must be a multiple of " << blocks * count;
    std::vector<int64_t> dims = shape.dims();
    dims[0] /= count;
    return std::vector<TensorSpec>{{Shape(dims), in[0].dtype}};
  };
  // Row selection: splits on any dimension and partial sums pass through
  // (a split of dimension 0 only where the shards hold whole blocks,
  // check_layout).
  def.sbp = defs::SplitAnyDimOrPartial;
  // The index changes per micro-batch; the layouts do not.
  def.layout_attrs = std::vector<std::string>{"count", "blocks"};
  // Each rank's input rows must be whole blocks whose chunks are exactly
  // its output rows.
  def.check_layout = [](const Attrs& a, const std::vector<TensorSpec>& in, const std::vector<NdSbp>& in_sbp,
                        const std::vector<NdSbp>& out_sbp, const Placement& placement) {
    const auto [index, count, blocks] = Read(a);
    const Shape& shape = in[0].shape;
    std::vector<int64_t> out_dims = shape.dims();
    out_dims[0] /= count;
    const Shape out_shape(out_dims);
    const int64_t block_rows = shape[0] / blocks;
    for (int i = 0; i < placement.size(); ++i) {
      const std::vector<int64_t> coord = placement.Coord(i);
      const Box ib = SliceOf(shape, in_sbp[0], placement.hierarchy(), coord);
      const Box ob = SliceOf(out_shape, out_sbp[0], placement.hierarchy(), coord);
      if (ib[0].begin % block_rows != 0 || ib[0].end % block_rows != 0) return false;
      if (ob[0].begin * count != ib[0].begin || ob[0].end * count != ib[0].end) return false;
    }
    return true;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const auto [index, count, blocks] = Read(ctx.attrs);
    const Tensor& x = ctx.inputs[0];
    const int64_t block_rows = ctx.logical_inputs[0].shape[0] / blocks, chunk = block_rows / count;
    const int64_t local_blocks = x.shape()[0] / block_rows;
    std::vector<Tensor> chunks;
    for (int64_t b = 0; b < local_blocks; ++b) {
      const int64_t begin = b * block_rows + index * chunk;
      chunks.push_back(cpu::Slice(x, 0, begin, begin + chunk));
    }
    return std::vector<Tensor>{chunks.size() == 1 ? chunks[0] : cpu::Concat(chunks, 0)};
  };
#ifdef TESSEL_HAS_CUDA
  // One strided copy of every block's chunk.
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const auto [index, count, blocks] = Read(ctx.attrs);
    const int64_t block_rows = ctx.logical_inputs[0].shape[0] / blocks;
    return std::vector<Tensor>{cuda::MicroBatch(ctx.inputs[0], block_rows, index, count)};
  };
#endif
  RegisterOp(std::move(def));
}

}  // namespace tessel
