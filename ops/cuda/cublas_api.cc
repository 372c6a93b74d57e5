#include "ops/cuda/cublas_api.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <filesystem>
#include <string>

#include "core/error.h"

// The exported name of a cuBLAS call: the headers map some names to
// versioned ones (cublasCreate is cublasCreate_v2), so the macro is
// expanded before it is spelled.
#define TESSEL_CUBLAS_SPELL(x) #x
#define TESSEL_CUBLAS_NAME(x) TESSEL_CUBLAS_SPELL(x)

namespace tessel::cuda {
namespace {

// Opens `soname`: as the loader finds it (LD_LIBRARY_PATH, this library's
// run path, the system's), else beside libcudart, which is linked and so
// found. Every attempt's error goes into `tried`.
void* Open(const std::string& soname, std::string* tried) {
  if (void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  tried->append("\n  ").append(dlerror());
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) != 0 && info.dli_fname != nullptr) {
    const std::string beside =
        (std::filesystem::path(info.dli_fname).parent_path() / soname).string();
    if (void* handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    tried->append("\n  ").append(dlerror());
  }
  return nullptr;
}

template <typename F>
void Resolve(void* library, const char* name, const char* soname, F* into) {
  void* symbol = dlsym(library, name);
  TESSEL_CHECK_CODE(symbol != nullptr, StatusCode::kUnavailable)
      << soname << " has no " << name << "; tessel was built against cuBLAS " << CUBLAS_VER_MAJOR << "."
      << CUBLAS_VER_MINOR;
  *into = reinterpret_cast<F>(symbol);
}

CublasApi Load() {
  const std::string lt_name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR),
                    blas_name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string tried;
  void* lt = Open(lt_name, &tried);
  void* blas = lt == nullptr ? nullptr : Open(blas_name, &tried);
  TESSEL_CHECK_CODE(lt != nullptr && blas != nullptr, StatusCode::kUnavailable)
      << "a matrix product on the GPU needs cuBLAS " << CUBLAS_VER_MAJOR << " (" << lt_name << " and "
      << blas_name << "), which did not open:" << tried
      << "\nput the CUDA toolkit's library folder on LD_LIBRARY_PATH";
  CublasApi api{};
#define TESSEL_RESOLVE(library, soname, member, call) \
  Resolve(library, TESSEL_CUBLAS_NAME(call), soname.c_str(), &api.member)
  TESSEL_RESOLVE(blas, blas_name, create, cublasCreate);
  TESSEL_RESOLVE(blas, blas_name, set_stream, cublasSetStream);
  TESSEL_RESOLVE(blas, blas_name, set_workspace, cublasSetWorkspace);
  TESSEL_RESOLVE(blas, blas_name, gemm_ex, cublasGemmEx);
  TESSEL_RESOLVE(blas, blas_name, gemm_strided_batched_ex, cublasGemmStridedBatchedEx);
  TESSEL_RESOLVE(blas, blas_name, status_string, cublasGetStatusString);
  TESSEL_RESOLVE(lt, lt_name, lt_create, cublasLtCreate);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul, cublasLtMatmul);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul_desc_create, cublasLtMatmulDescCreate);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul_desc_destroy, cublasLtMatmulDescDestroy);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul_desc_set_attribute, cublasLtMatmulDescSetAttribute);
  TESSEL_RESOLVE(lt, lt_name, lt_matrix_layout_create, cublasLtMatrixLayoutCreate);
  TESSEL_RESOLVE(lt, lt_name, lt_matrix_layout_destroy, cublasLtMatrixLayoutDestroy);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul_preference_create, cublasLtMatmulPreferenceCreate);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul_preference_destroy, cublasLtMatmulPreferenceDestroy);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul_preference_set_attribute, cublasLtMatmulPreferenceSetAttribute);
  TESSEL_RESOLVE(lt, lt_name, lt_matmul_algo_get_heuristic, cublasLtMatmulAlgoGetHeuristic);
#undef TESSEL_RESOLVE
  return api;  // (the libraries stay open for the process)
}

}  // namespace

const CublasApi& Cublas() {
  // (A failed load throws from the initializer, so the next call tries again.)
  static const CublasApi api = Load();
  return api;
}

}  // namespace tessel::cuda
