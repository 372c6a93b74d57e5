#include <glog/logging.h>

#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "ops/cpu/broadcast.h"
#include "ops/cpu/gemm.h"
#include "ops/cuda/cublas_api.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"

namespace tessel::cuda {
namespace {

// cuBLAS's recommendation for Hopper; smaller GPUs use what they need of it.
constexpr size_t kWorkspaceBytes = 32u << 20;

void CheckCublas(cublasStatus_t status, const char* what) {
  TESSEL_CHECK_CODE(status == CUBLAS_STATUS_SUCCESS, StatusCode::kInternal)
      << what << " failed: " << Cublas().status_string(status) << " (cuBLAS status "
      << static_cast<int>(status) << ")";
}

bool AllowTf32() {
  static const bool allow = [] {
    const char* v = std::getenv("TESSEL_CUDA_ALLOW_TF32");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return allow;
}

// A cuBLAS handle is not safe to use from two threads at once, and its
// stream is state: the mutex covers binding the stream and the call. The
// cuBLASLt handle (the products with an epilogue) takes its stream and
// workspace with each call.
struct Handle {
  std::mutex mu;
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
  bool bound = false;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
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
    CheckCublas(Cublas().create(&made->handle), "cublasCreate");
    Check(cudaMalloc(&made->workspace, kWorkspaceBytes), "cudaMalloc of the cuBLAS workspace");
    CheckCublas(Cublas().lt_create(&made->lt), "cublasLtCreate");
    Check(cudaMalloc(&made->lt_workspace, kWorkspaceBytes), "cudaMalloc of the cuBLASLt workspace");
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
    CheckCublas(Cublas().set_stream(h.handle, stream), "cublasSetStream");
    // Setting the stream drops the workspace back to cuBLAS's own pool.
    CheckCublas(Cublas().set_workspace(h.handle, h.workspace, kWorkspaceBytes), "cublasSetWorkspace");
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
    CheckCublas(Cublas().gemm_ex(h.handle, op_b, op_a, in, im, ik, &alpha, b, type, ildb, a, type, ilda, &beta, c,
                             type, ildc, compute, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx");
  } else {
    CheckCublas(Cublas().gemm_strided_batched_ex(h.handle, op_b, op_a, in, im, ik, &alpha, b, type, ildb, stride_b,
                                           a, type, ilda, stride_a, &beta, c, type, ildc, stride_c,
                                           AsInt(batch, "batch count"), compute, CUBLAS_GEMM_DEFAULT),
                "cublasGemmStridedBatchedEx");
  }
}

// cuBLASLt, for the products with an epilogue (linear's bias and GELU, the
// bias gradient beside the weight gradient): the device's Handle; the
// algorithm for each problem is asked of the heuristics once and kept.

// The descriptors of one call, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  LtCall() = default;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  ~LtCall() {
    if (d) Cublas().lt_matrix_layout_destroy(d);
    if (b) Cublas().lt_matrix_layout_destroy(b);
    if (a) Cublas().lt_matrix_layout_destroy(a);
    if (desc) Cublas().lt_matmul_desc_destroy(desc);
  }
};

template <typename T>
void SetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t what, const T& value) {
  CheckCublas(Cublas().lt_matmul_desc_set_attribute(desc, what, &value, sizeof(value)),
              "cublasLtMatmulDescSetAttribute");
}

// The largest power of two (up to 256) dividing p's address. The heuristics
// assume 256 unless told (they do not see the matrices' pointers), so each
// problem is asked with its pointers' alignment.
uint32_t Alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 1;
  while (a < 256 && v % (2 * a) == 0) a *= 2;
  return a;
}

// Column-major D [m x n] = op(A) op(B) (+ C, when `c` is given: laid out as
// D) with `epilogue`, reading or writing `bias` (length m) and `aux` (a
// [m x n] matrix, leading dimension ldd) as the epilogue asks. False when
// cuBLASLt has no algorithm for it; the caller then takes the unfused path.
bool LtGemm(int device, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            const void* a, int64_t lda, const void* b, int64_t ldb, void* d, int64_t ldd,
            cublasLtEpilogue_t epilogue, void* bias, void* aux, const void* c = nullptr) {
  Handle& h = HandleFor(device);
  const cudaDataType_t type = CudaType(dtype);
  const cublasComputeType_t compute =
      dtype == DType::kFloat32 && AllowTf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtCall call;
  CheckCublas(Cublas().lt_matmul_desc_create(&call.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                          op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  SetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  SetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (bias != nullptr) SetAttribute(call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux != nullptr) {
    SetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    SetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ldd);
  }
  // Stored shapes: op(A) is m x k, op(B) is k x n.
  CheckCublas(Cublas().lt_matrix_layout_create(&call.a, type, trans_a ? k : m, trans_a ? m : k, lda),
              "cublasLtMatrixLayoutCreate");
  CheckCublas(Cublas().lt_matrix_layout_create(&call.b, type, trans_b ? n : k, trans_b ? k : n, ldb),
              "cublasLtMatrixLayoutCreate");
  CheckCublas(Cublas().lt_matrix_layout_create(&call.d, type, m, n, ldd), "cublasLtMatrixLayoutCreate");

  const uint32_t align_a = Alignment(a), align_b = Alignment(b), align_c = Alignment(c ? c : d),
                 align_d = Alignment(d);
  using Key = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                         bool, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
  const Key key{device,
                static_cast<int>(dtype),
                trans_a,
                trans_b,
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                static_cast<int>(epilogue),
                c != nullptr,
                align_a,
                align_b,
                align_c,
                align_d,
                bias ? Alignment(bias) : 0u,
                aux ? Alignment(aux) : 0u};
  static std::mutex mu;
  static auto* algos = new std::map<Key, std::optional<cublasLtMatmulAlgo_t>>();
  std::optional<cublasLtMatmulAlgo_t> algo;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = algos->find(key);
    if (it == algos->end()) {
      cublasLtMatmulPreference_t pref = nullptr;
      CheckCublas(Cublas().lt_matmul_preference_create(&pref), "cublasLtMatmulPreferenceCreate");
      const uint64_t bytes = kWorkspaceBytes;
      Cublas().lt_matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                           sizeof(bytes));
      for (auto [what, align] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                                 std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                                 std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                                 std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}})
        Cublas().lt_matmul_preference_set_attribute(pref, what, &align, sizeof(align));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t status = Cublas().lt_matmul_algo_get_heuristic(h.lt, call.desc, call.a, call.b, call.d,
                                                                   call.d, pref, 1, &result, &found);
      Cublas().lt_matmul_preference_destroy(pref);
      if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
        algo = result.algo;
      } else {
        // Once per problem (the answer is kept): the unfused kernels take it.
        LOG(INFO) << "cuBLASLt has no algorithm for epilogue " << static_cast<int>(epilogue) << " on "
                  << dtype << " [" << m << " x " << k << "] x [" << k << " x " << n << "] ("
                  << Cublas().status_string(status) << ", " << found << " found); using separate kernels";
      }
      it = algos->emplace(key, algo).first;
    }
    algo = it->second;
  }
  if (!algo) return false;
  const float alpha = 1.0f, beta = c ? 1.0f : 0.0f;
  CheckCublas(Cublas().lt_matmul(h.lt, call.desc, &alpha, a, call.a, b, call.b, &beta, c ? c : d, call.d, d,
                             call.d, &*algo, h.lt_workspace, kWorkspaceBytes, CurrentStream()),
              "cublasLtMatmul");
  return true;
}

// The rows of a [..., k] tensor: the product of its leading dims (k may be 0).
int64_t LeadingRows(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.ndim(); ++d) rows *= t.shape()[d];
  return rows;
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

std::vector<Tensor> Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu,
                           const Tensor& residual) {
  const DType dtype = x.dtype();
  CheckOnDevice("linear", x.device(), {x, weight, bias, residual});
  TESSEL_CHECK(weight.dtype() == dtype && bias.dtype() == dtype &&
               (!residual.defined() || residual.dtype() == dtype))
      << "linear: x, weight, bias (and residual) must have one dtype; got " << dtype << ", " << weight.dtype()
      << " and " << bias.dtype();
  const Shape out_shape = cpu::LinearShape("linear", x.shape(), weight.shape(), bias.shape());
  TESSEL_CHECK(!gelu || !residual.defined()) << "linear: an activation and a residual together are not an op";
  SetDevice(x.device());
  const int64_t k = weight.shape()[0], n = weight.shape()[1], rows = LeadingRows(x);
  TESSEL_CHECK(!residual.defined() || residual.shape() == out_shape)
      << "linear: the residual is " << residual.shape() << "; expected the output's " << out_shape;
  // Row-major y [rows, n] = x [rows, k] W [k, n] is column-major
  // y^T [n x rows] = W^T [n x k] x^T [k x rows]: W is A, x is B, and the
  // bias runs down D's rows; a residual is C, laid out as D. The GELU input
  // (aux) must have a leading dimension divisible by 8.
  if (rows > 0 && n > 0 && k > 0 && (!gelu || n % 8 == 0)) {
    Tensor y = Tensor::Empty(out_shape, dtype, x.device());
    Tensor pre = gelu ? Tensor::Empty(out_shape, dtype, x.device()) : Tensor();
    if (LtGemm(x.device().index(), dtype, false, false, n, rows, k, weight.raw_data(), n, x.raw_data(), k,
               y.raw_data(), n, gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS,
               const_cast<void*>(bias.raw_data()), gelu ? pre.raw_data() : nullptr,
               residual.defined() ? residual.raw_data() : nullptr)) {
      if (!gelu) return {y};
      return {y, pre};
    }
  }
  Tensor out = cuda::Binary(BinaryOp::kAdd, Matmul(x, weight), bias);
  if (residual.defined()) out = cuda::Binary(BinaryOp::kAdd, out, residual);
  if (!gelu) return {out};
  return {cuda::Unary(UnaryOp::kGeluTanh, out), out};
}

std::vector<Tensor> LinearWeightGrad(const Tensor& x, const Tensor& dy) {
  const DType dtype = x.dtype();
  CheckOnDevice("linear_weight_grad", x.device(), {x, dy});
  TESSEL_CHECK(dy.dtype() == dtype) << "linear_weight_grad: x is " << dtype << " but dy is " << dy.dtype();
  SetDevice(x.device());
  const int64_t k = x.shape()[-1], n = dy.shape()[-1], rows = LeadingRows(x);
  TESSEL_CHECK(dy.numel() == rows * n)
      << "linear_weight_grad: x " << x.shape() << " and dy " << dy.shape() << " do not have the same rows";
  // Row-major dW [k, n] = x^T [k, rows] dy [rows, n] is column-major
  // dW^T [n x k] = dy^T [n x rows] (x^T)^T: dy is A (its features down
  // D's rows, so the bias gradient reduces A over the GEMM's k, the rows),
  // x is B, transposed.
  if (rows > 0 && n > 0 && k > 0) {
    Tensor dw = Tensor::Empty(Shape({k, n}), dtype, x.device());
    Tensor db = Tensor::Empty(Shape({n}), dtype, x.device());
    if (LtGemm(x.device().index(), dtype, false, true, n, k, rows, dy.raw_data(), n, x.raw_data(), k,
               dw.raw_data(), n, CUBLASLT_EPILOGUE_BGRADA, db.raw_data(), nullptr))
      return {dw, db};
  }
  const Tensor x2 = x.Reshape({rows, k}), dy2 = dy.Reshape({rows, n});
  return {Matmul(x2, dy2, true, false), cuda::SumToShape(dy2, Shape({n}))};
}

}  // namespace tessel::cuda
