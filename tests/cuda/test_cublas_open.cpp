// cuBLAS and cuBLASLt opened at their first call (src/backends/cuda/tactics/cublas_open.cpp): the
// forwarders reach the real libraries. No GPU needed. (That loading kiln does not load them is
// checked in test_cuda_host.cpp, a program that links libkiln.)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "tactics/cublas_open.h"

TEST(CublasOpen, ForwardsToTheLibrariesOfTheHeadersMajorVersion) {
  // Version: major * 10000 + minor * 100 + patch, from the library itself (0 if not opened).
  EXPECT_EQ(cublasLtGetVersion() / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR))
      << kiln::gpu::cublas_open_error();
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_EQ(kiln::gpu::cublas_open_error(), "");
  const std::string lt = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* h = dlopen(lt.c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(h, nullptr) << lt << " is not loaded after a call";
  if (h) dlclose(h);
}
