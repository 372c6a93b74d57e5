// cuBLAS opened on first use (ops/cuda/cublas_api.h): the library a process
// maps only when it first multiplies on a GPU. The toolkit's libraries open
// and every call tessel makes resolves (no device needed to open them), and
// a process that never asked has not mapped them: tessel's binaries do not
// link cuBLAS.
#include "ops/cuda/cublas_api.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "tests/testing/gpu.h"

namespace tessel {
namespace {

bool Mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  return text.find(library) != std::string::npos;
}

TEST(CublasApi, OpensTheToolkitsLibrariesOnFirstUse) {
  // (With a GPU, another test of this process may have multiplied first.)
  if (testing::NoGpu()) {
    EXPECT_FALSE(Mapped("libcublasLt.so")) << "this test binary maps cuBLAS before any product asked for it";
    EXPECT_FALSE(Mapped("libcublas.so")) << "this test binary maps cuBLAS before any product asked for it";
  }
  const cuda::CublasApi& api = cuda::Cublas();
  EXPECT_TRUE(Mapped("libcublasLt.so"));
  EXPECT_TRUE(Mapped("libcublas.so"));
  for (const void* call :
       {reinterpret_cast<const void*>(api.create), reinterpret_cast<const void*>(api.set_stream),
        reinterpret_cast<const void*>(api.set_workspace), reinterpret_cast<const void*>(api.gemm_ex),
        reinterpret_cast<const void*>(api.gemm_strided_batched_ex),
        reinterpret_cast<const void*>(api.status_string), reinterpret_cast<const void*>(api.lt_create),
        reinterpret_cast<const void*>(api.lt_matmul), reinterpret_cast<const void*>(api.lt_matmul_desc_create),
        reinterpret_cast<const void*>(api.lt_matmul_desc_destroy),
        reinterpret_cast<const void*>(api.lt_matmul_desc_set_attribute),
        reinterpret_cast<const void*>(api.lt_matrix_layout_create),
        reinterpret_cast<const void*>(api.lt_matrix_layout_destroy),
        reinterpret_cast<const void*>(api.lt_matmul_preference_create),
        reinterpret_cast<const void*>(api.lt_matmul_preference_destroy),
        reinterpret_cast<const void*>(api.lt_matmul_preference_set_attribute),
        reinterpret_cast<const void*>(api.lt_matmul_algo_get_heuristic)})
    EXPECT_NE(call, nullptr);
  // A call that needs no device: the library's own text for a status.
  EXPECT_EQ(std::string(api.status_string(CUBLAS_STATUS_NOT_INITIALIZED)), "the library was not initialized");
  EXPECT_EQ(&cuda::Cublas(), &api);  // opened once
}

}  // namespace
}  // namespace tessel
