#include <cublas_v2.h>

#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "ops/cpu/broadcast.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/gemm.h"

namespace tessel::cuda {
namespace {

// cuBLAS's recommendation for Hopper; smaller GPUs use what they need of it.
constexpr size_t kWorkspaceBytes = 32u << 20;

void CheckCublas(cublasStatus_t status, const char* what) {
  TESSEL_CHECK_CODE(status == CUBLAS_STATUS_SUCCESS, StatusCode::kInternal)
      << what << " failed: " << cublasGetStatusString(status) << " (cuBLAS status "
      << static_cast<int>(status) << ")";
}

bool AllowTf32() {
  static const bool allow = [] {
    const char* v = std::getenv("TESSEL_CUDA_ALLOW_TF32");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return allow;
}

// A handle is not safe to use from two threads at once, and its stream is
// state: the mutex covers binding the stream and the call.
struct Handle {
  std::mutex mu;
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
  bool bound = false;
};

// The handle of `device`, which must be current. Handles and workspaces live
// for the process: destroying them at exit could run after the driver has
// shut down.
Handle& HandleFor(int device) {
  static std::mutex mu;
  static auto* handles = new std::map<int, std::unique_ptr<Handle>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Handle>& h = (*handles)[device];
  if (!h) {
    auto made = std::make_unique<Handle>();
    CheckCublas(cublasCreate(&made->handle), "cublasCreate");
    Check(cudaMalloc(&made->workspace, kWorkspaceBytes), "cudaMalloc of the cuBLAS workspace");
    h = std::move(made);
  }
  return *h;
}

cudaDataType_t CudaType(DType dtype) {
  if (dtype == DType::kBFloat16) return CUDA_R_16BF;
  if (dtype == DType::kFloat16) return CUDA_R_16F;
  TESSEL_CHECK(dtype == DType::kFloat32) << "matmul on CUDA supports f32, bf16 and f16; got " << dtype;
  return CUDA_R_32F;
}

int AsInt(int64_t v, const char* what) {
  TESSEL_CHECK(v <= std::numeric_limits<int>::max())
      << "matmul: " << what << " " << v << " is too large for one cuBLAS call";
  return static_cast<int>(v);
}

// Row-major C_i = alpha * op(A_i) * op(B_i) + beta * C_i for i < batch, with
// X_i = X + i * stride_x. cuBLAS is column-major, where a row-major matrix
// reads as its transpose, so it computes C^T = op(B)^T * op(A)^T: B comes
// first and m and n swap.
// A, B and C are all of `dtype`; alpha and beta are float either way.
void GemmBatched(int device, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
                 int64_t stride_b, float beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  Handle& h = HandleFor(device);
  std::lock_guard<std::mutex> lock(h.mu);
  cudaStream_t stream = CurrentStream();
  if (!h.bound || h.stream != stream) {
    CheckCublas(cublasSetStream(h.handle, stream), "cublasSetStream");
    // Setting the stream drops the workspace back to cuBLAS's own pool.
    CheckCublas(cublasSetWorkspace(h.handle, h.workspace, kWorkspaceBytes), "cublasSetWorkspace");
    h.stream = stream;
    h.bound = true;
  }
  // Half-precision products accumulate in f32 (TF32 only concerns f32).
  const cudaDataType_t type = CudaType(dtype);
  const cublasComputeType_t compute =
      dtype == DType::kFloat32 && AllowTf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int im = AsInt(m, "m"), in = AsInt(n, "n"), ik = AsInt(k, "k");
  const int ilda = AsInt(lda, "lda"), ildb = AsInt(ldb, "ldb"), ildc = AsInt(ldc, "ldc");
  if (batch == 1) {
    CheckCublas(cublasGemmEx(h.handle, op_b, op_a, in, im, ik, &alpha, b, type, ildb, a, type, ilda, &beta, c,
                             type, ildc, compute, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx");
  } else {
    CheckCublas(cublasGemmStridedBatchedEx(h.handle, op_b, op_a, in, im, ik, &alpha, b, type, ildb, stride_b,
                                           a, type, ilda, stride_a, &beta, c, type, ildc, stride_c,
                                           AsInt(batch, "batch count"), compute, CUBLAS_GEMM_DEFAULT),
                "cublasGemmStridedBatchedEx");
  }
}

Shape BatchShape(const Shape& s) { return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 2)); }

}  // namespace

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  GemmBatched(device, DType::kFloat32, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc,
              0, 1);
}

Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const DType dtype = a.dtype();
  TESSEL_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16)
      << "matmul on CUDA supports f32, bf16 and f16; got a of " << a.dtype();
  TESSEL_CHECK(b.dtype() == dtype) << "matmul: a is " << a.dtype() << " but b is " << b.dtype()
                                   << "; cast one (fn::cast)";
  TESSEL_CHECK(a.ndim() >= 2 && b.ndim() >= 2)
      << "matmul needs operands of rank >= 2; got shapes " << a.shape() << " and " << b.shape();
  CheckOnDevice("matmul", a.device(), {a, b});
  SetDevice(a.device());
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const int64_t m = trans_a ? sa[-1] : sa[-2], ka = trans_a ? sa[-2] : sa[-1];
  const int64_t kb = trans_b ? sb[-1] : sb[-2], n = trans_b ? sb[-2] : sb[-1];
  TESSEL_CHECK(ka == kb) << "matmul shapes do not fit: " << sa << (trans_a ? "^T" : "") << " x " << sb
                         << (trans_b ? "^T" : "") << " (inner sizes " << ka << " and " << kb << ")";
  const Shape batch_a = BatchShape(sa), batch_b = BatchShape(sb);
  const Shape batch = cpu::BroadcastShapes(batch_a, batch_b);
  std::vector<int64_t> out_dims = batch.dims();
  out_dims.push_back(m);
  out_dims.push_back(n);
  Tensor out = Tensor::Empty(Shape(out_dims), dtype, a.device());
  const int64_t nb = batch.numel();
  if (out.numel() == 0) return out;
  if (ka == 0) {  // an empty sum: cuBLAS need not write C when k is 0
    Zero(out);
    return out;
  }
  const int device = a.device().index();
  // Byte pointers: the batch offsets below are in elements of `dtype`.
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  char* pc = static_cast<char*>(out.raw_data());
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  const int64_t lda = sa[-1], ldb = sb[-1], size_a = m * ka, size_b = ka * n, size_c = m * n;

  // b shared by every batch and a's rows contiguous: the batch folds into
  // m, one GEMM.
  if (batch_b.numel() == 1 && batch_a.numel() == nb && !trans_a) {
    GemmBatched(device, dtype, false, trans_b, nb * m, n, ka, 1.0f, pa, lda, 0, pb, ldb, 0, 0.0f, pc, n, 0,
                1);
    return out;
  }
  // Otherwise batch i of the result reads batch ia[i] of a and ib[i] of b.
  // Find the longest run of trailing batch dims over which both step
  // evenly (the whole batch when they are equal or one side is shared): one
  // strided-batched GEMM per run, a stride of 0 reading a shared operand.
  std::vector<int64_t> ia(nb), ib(nb);
  const cpu::BroadcastIndex index_a(batch_a, batch), index_b(batch_b, batch);
  for (int64_t i = 0; i < nb; ++i) {
    ia[i] = index_a(i);
    ib[i] = index_b(i);
  }
  auto even = [nb](const std::vector<int64_t>& ix, int64_t run, int64_t step) {
    for (int64_t i = 0; i < nb; ++i)
      if (ix[i] != ix[i - i % run] + (i % run) * step) return false;
    return true;
  };
  int64_t run = 1, step_a = 0, step_b = 0;
  int64_t candidate = 1;
  for (int64_t d = batch.ndim() - 1; d >= 0; --d) {
    candidate *= batch[d];
    if (candidate == 0) break;
    const int64_t sa_step = candidate > 1 ? ia[1] - ia[0] : 0, sb_step = candidate > 1 ? ib[1] - ib[0] : 0;
    if (!even(ia, candidate, sa_step) || !even(ib, candidate, sb_step)) break;
    run = candidate;
    step_a = sa_step;
    step_b = sb_step;
  }
  for (int64_t o = 0; o < nb; o += run) {
    GemmBatched(device, dtype, trans_a, trans_b, m, n, ka, 1.0f, pa + ia[o] * size_a * es, lda,
                step_a * size_a, pb + ib[o] * size_b * es, ldb, step_b * size_b, 0.0f, pc + o * size_c * es,
                n, size_c, run);
  }
  return out;
}

}  // namespace tessel::cuda
