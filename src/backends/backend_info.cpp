#include "backends/backend_info.h"

#include <sys/utsname.h>

#include <fmt/format.h>

#include "kiln/engine.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime_api.h>
#else
#include "backends/backend.h"
#endif

namespace kiln {

int cuda_device_count(std::string* why) {
#ifdef KILN_WITH_CUDA
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = fmt::format("no CUDA GPU is available ({})", cudaGetErrorString(err));
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA GPU is available";
  return n;
#else
  if (why) *why = "this kiln was built without CUDA GPU support (KILN_CUDA=OFF)";
  return 0;
#endif
}

bool cuda_backend_built() {
#ifdef KILN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string default_backend() {
  return cuda_backend_built() && cuda_device_count() > 0 ? "cuda" : "cpu";
}

std::string backend_unavailable_reason(const std::string& backend) {
  if (backend == "cpu") return "";
  if (backend == "cuda") {
    std::string why;
    if (cuda_device_count(&why) == 0) return "--backend cuda: " + why;
    return "";
  }
  return fmt::format("unknown backend '{}'", backend);
}

std::string current_target(const std::string& backend) {
  if (backend == "cpu") {
    struct utsname u;
    return std::string("cpu-") + (uname(&u) == 0 ? u.machine : "unknown");
  }
#ifdef KILN_WITH_CUDA
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess) {
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    return fmt::format("cuda-sm_{}{}-cudart{}", p.major, p.minor, rt);
  }
#endif
  return "cuda-unknown";
}

#ifndef KILN_WITH_CUDA
// A build without CUDA never reaches these (backend_unavailable_reason refuses cuda first).
namespace gpu {
Expected<nlohmann::json> build_cuda_plan(Graph&, const BuildConfig&, const Profile&) {
  return Status::Error("this kiln was built without CUDA GPU support (KILN_CUDA=OFF)");
}
Expected<std::shared_ptr<BackendEngine>> load_cuda_engine(const Graph&, const nlohmann::json&,
                                                          const Profile&) {
  return Status::Error("this kiln was built without CUDA GPU support (KILN_CUDA=OFF)");
}
}  // namespace gpu
#endif

}  // namespace kiln
