// Triton's CUDA shared memory extension (shm.h): a region is a device allocation of the
// client's process, opened here from its CUDA IPC handle. Inputs are copied from it when the
// request is decoded (the context's own buffers are what the batch runs from), outputs into it
// when the answer is encoded; each copy on the region's device, the calling thread's device put
// back after. A build without CUDA, or a machine without a device, refuses the registration
// with a 400 that says so.
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "serve/shm.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln::serve {

struct ShmRegistry::CudaMapping {
  void* base = nullptr;
  int device = -1;
#ifdef KILN_WITH_CUDA
  ~CudaMapping() {
    if (!base) return;
    int was = -1;
    cudaGetDevice(&was);
    if (cudaSetDevice(device) == cudaSuccess) cudaIpcCloseMemHandle(base);
    if (was >= 0) cudaSetDevice(was);
    cudaGetLastError();
  }
#endif
};

namespace {

constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

#ifdef KILN_WITH_CUDA
// Runs `f` with `device` current, the thread's device put back after.
template <typename F>
cudaError_t on_device(int device, F&& f) {
  int was = -1;
  cudaGetDevice(&was);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = f();
  if (was >= 0 && was != device) cudaSetDevice(was);
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}
#endif

// The span [offset, offset + byte_size) of a request within its region; 400 when beyond it.
Check within_region(const std::string& what, const RegionStatus& r, const ShmRef& ref) {
  if (ref.offset > r.byte_size || ref.byte_size > r.byte_size - ref.offset)
    return api_error(400,
                     "{}: shared_memory_offset {} + shared_memory_byte_size {} is beyond "
                     "CUDA shared memory region '{}' of {} bytes",
                     what, ref.offset, ref.byte_size, r.name, r.byte_size);
  return std::nullopt;
}

}  // namespace

Check ShmRegistry::register_cuda_region(const std::string& name, const std::string& raw_handle,
                                        int64_t device_id, uint64_t byte_size) {
  if (name.empty() || name.find('\0') != std::string::npos || name.size() > 200)
    return api_error(400,
                     "shared memory region name '{}' is not a non-empty string of at most 200 "
                     "characters (without NUL)",
                     name.substr(0, 40));
  if (raw_handle.size() != kIpcHandleBytes)
    return api_error(400,
                     "CUDA shared memory region '{}': raw_handle holds {} bytes; a CUDA IPC "
                     "handle (cudaIpcGetMemHandle) holds {}",
                     name, raw_handle.size(), kIpcHandleBytes);
  if (device_id < 0)
    return api_error(400, "CUDA shared memory region '{}': device_id {} is not a device", name,
                     device_id);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (regions_.count(name))
      return api_error(409, "shared memory region '{}' is already registered (unregister it first)",
                       name);
  }
#ifdef KILN_WITH_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    devices = 0;
  }
  if (device_id >= devices)
    return api_error(400,
                     "CUDA shared memory region '{}': device_id {}, but this server sees {} CUDA "
                     "device{}",
                     name, device_id, devices, devices == 1 ? "" : "s");
  auto m = std::make_shared<CudaMapping>();
  m->device = static_cast<int>(device_id);
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, raw_handle.data(), kIpcHandleBytes);
  const cudaError_t e = on_device(m->device, [&] {
    return cudaIpcOpenMemHandle(&m->base, handle, cudaIpcMemLazyEnablePeerAccess);
  });
  if (e != cudaSuccess) {
    m->base = nullptr;
    return api_error(400,
                     "CUDA shared memory region '{}': cannot open its IPC handle on device {}: "
                     "{} (the handle must come from cudaIpcGetMemHandle in another process)",
                     name, device_id, cudaGetErrorString(e));
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (regions_.count(name))
    return api_error(409, "shared memory region '{}' is already registered (unregister it first)",
                     name);
  RegionStatus st;
  st.name = name;
  st.byte_size = byte_size;
  st.device_id = m->device;
  regions_[name] = Region{std::move(st), nullptr, std::move(m)};
  return std::nullopt;
#else
  (void)byte_size;
  return api_error(400,
                   "CUDA shared memory region '{}': this kiln serve was built without CUDA "
                   "(use system shared memory)",
                   name);
#endif
}

Check ShmRegistry::cuda_input(const std::string& what, const Region& r, const ShmRef& ref,
                              size_t need, InputTensor& t) const {
  KILN_SERVE_CHECK(within_region(what, r.status, ref));
#ifdef KILN_WITH_CUDA
  auto host = std::make_shared<std::vector<uint8_t>>(need);
  const auto* src = static_cast<const uint8_t*>(r.cuda->base) + ref.offset;
  const cudaError_t e = on_device(r.cuda->device, [&] {
    return need ? cudaMemcpy(host->data(), src, need, cudaMemcpyDeviceToHost) : cudaSuccess;
  });
  if (e != cudaSuccess)
    return api_error(400, "{}: cannot read CUDA shared memory region '{}': {}", what, ref.region,
                     cudaGetErrorString(e));
  t.data = host->data();
  t.bytes = need;
  t.owner = host;
  return std::nullopt;
#else
  (void)need;
  (void)t;
  return api_error(400, "{}: this kiln serve was built without CUDA", what);
#endif
}

Check ShmRegistry::cuda_write(const std::string& what, const Region& r, const ShmRef& ref,
                              const void* data, size_t bytes) const {
  KILN_SERVE_CHECK(within_region(what, r.status, ref));
#ifdef KILN_WITH_CUDA
  if (!bytes) return std::nullopt;
  auto* dst = static_cast<uint8_t*>(r.cuda->base) + ref.offset;
  const cudaError_t e = on_device(
      r.cuda->device, [&] { return cudaMemcpy(dst, data, bytes, cudaMemcpyHostToDevice); });
  if (e != cudaSuccess)
    return api_error(400, "{}: cannot write CUDA shared memory region '{}': {}", what, ref.region,
                     cudaGetErrorString(e));
  return std::nullopt;
#else
  (void)data;
  (void)bytes;
  return api_error(400, "{}: this kiln serve was built without CUDA", what);
#endif
}

}  // namespace kiln::serve
