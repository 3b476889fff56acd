// Check helpers: every library call's status becomes a Status naming the call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "conv_tactic.h"

namespace kiln::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline Status cudnn_status(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  std::string m = std::string(what) + ": " + cudnnGetErrorString(s);
  if (last[0]) m += std::string(" (") + last + ")";
  return Status::Error(m);
}

inline Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Error(std::string(what) + ": cublasStatus " + std::to_string(int(s)) + " " +
                       cublasLtGetStatusString(s));
}

// A host-to-device copy that has landed when it returns. cudaMemcpy from pageable host memory
// may return once the bytes are staged, before their DMA completes (CUDA's "API synchronization
// behavior"); kiln's streams are non-blocking, so a kernel launched next on one does not wait for
// that copy on the legacy stream and could read the old bytes. For weights, scales and tables
// uploaded when a layer is made or configured (never while a CUDA graph is captured).
inline Status upload(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes == 0) return Status::Ok();
  Status s = cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what);
  if (!s.ok()) return s;
  return cuda_status(cudaStreamSynchronize(cudaStreamLegacy), what);
}

}  // namespace kiln::cuda

#define KILN_TRY(expr) KILN_RETURN_IF_ERROR(expr)
#define KILN_CUDA(call) KILN_TRY(::kiln::cuda::cuda_status((call), #call))
#define KILN_CUDNN(call) KILN_TRY(::kiln::cuda::cudnn_status((call), #call))
#define KILN_CUBLAS(call) KILN_TRY(::kiln::cuda::cublas_status((call), #call))
