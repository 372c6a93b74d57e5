// cuBLAS and cuBLASLt, opened on first use rather than linked: loading
// them maps and touches about 150 MB (cuBLASLt's kernels' tables), which
// every tessel process would pay at start — tessel-plan, the CPU trainer,
// each test — though only a product on a GPU needs them. The first call of
// Cublas() opens libcublasLt and libcublas of the toolkit tessel was built
// with (by soname, then from libcudart's folder) and resolves the calls
// tessel makes; later calls return the same table.
//
//   const CublasApi& blas = Cublas();
//   blas.create(&handle);
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace tessel::cuda {

// (The headers overload these two for an older compute-type argument; the
// library exports the cublasComputeType_t forms.)
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                                        int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                                        cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                                      int, int, const void*, const void*, cudaDataType, int,
                                                      long long int, const void*, cudaDataType, int, long long int,
                                                      const void*, void*, cudaDataType, int, long long int, int,
                                                      cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&::cublasCreate) create;
  decltype(&::cublasSetStream) set_stream;
  decltype(&::cublasSetWorkspace) set_workspace;
  CublasGemmEx gemm_ex;
  CublasGemmStridedBatchedEx gemm_strided_batched_ex;
  decltype(&::cublasGetStatusString) status_string;
  decltype(&::cublasLtCreate) lt_create;
  decltype(&::cublasLtMatmul) lt_matmul;
  decltype(&::cublasLtMatmulDescCreate) lt_matmul_desc_create;
  decltype(&::cublasLtMatmulDescDestroy) lt_matmul_desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) lt_matmul_desc_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) lt_matrix_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) lt_matrix_layout_destroy;
  decltype(&::cublasLtMatmulPreferenceCreate) lt_matmul_preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) lt_matmul_preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) lt_matmul_preference_set_attribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) lt_matmul_algo_get_heuristic;
};

// Opens the libraries once (thread-safe). Throws kUnavailable naming each
// library tried and why it did not open, or the call it lacks.
const CublasApi& Cublas();

}  // namespace tessel::cuda
