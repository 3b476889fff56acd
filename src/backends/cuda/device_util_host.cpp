#include "device_util_host.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/dispatch.h"
#include "core/half_range.h"
#include "tactics/cublas_open.h"

namespace kiln::gpu {

namespace {

// A float32 or float64 tensor stored as float16 for an FP16 layer, through
// saturate_to_half_range (core/half_range.h).
Tensor store_as_half(const Tensor& t) {
  auto past_range = [&](auto tag) {
    using T = decltype(tag);
    const T* p = t.data<T>();
    return std::any_of(p, p + t.numel(),
                       [](T v) { return std::isfinite(v) && std::abs(v) > T(kFloat16Max); });
  };
  const bool f32 = t.dtype() == DataType::kFloat32;
  if (!(f32 ? past_range(float{}) : past_range(double{}))) return t.cast(DataType::kFloat16);
  Tensor c = t.cast(DataType::kFloat64);  // only a tensor that holds such values is copied
  double* p = c.data<double>();
  for (int64_t i = 0; i < c.numel(); ++i) p[i] = saturate_to_half_range(p[i]);
  return c.cast(DataType::kFloat16);
}

}  // namespace

Expected<Tensor> to_device_format(const Tensor& t, const TensorFormat& f) {
  const bool narrowing = f.dtype == DataType::kFloat16 &&
                         (t.dtype() == DataType::kFloat32 || t.dtype() == DataType::kFloat64);
  Tensor c = t.dtype() == f.dtype ? t : narrowing ? store_as_half(t) : t.cast(f.dtype);
  if (f.layout != Layout::kNHWC || c.rank() != 4) return c;
  const auto& s = c.shape();
  const int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  const size_t es = dtype_size(c.dtype());
  Tensor out(c.dtype(), s);  // logical shape kept; bytes in N,H,W,C order
  const auto* src = static_cast<const uint8_t*>(c.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          std::memcpy(dst + (((n * H + h) * W + w) * C + ch) * es,
                      src + (((n * C + ch) * H + h) * W + w) * es, es);
  return out;
}

Expected<Tensor> from_device_format(const Tensor& t, const TensorFormat& f, DataType to) {
  Tensor c = t;
  if (f.layout == Layout::kNHWC && c.rank() == 4) {
    const auto& s = c.shape();
    const int64_t N = s[0], C = s[1], H = s[2], W = s[3];
    const size_t es = dtype_size(c.dtype());
    Tensor out(c.dtype(), s);
    const auto* src = static_cast<const uint8_t*>(c.raw());
    auto* dst = static_cast<uint8_t*>(out.raw());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t ch = 0; ch < C; ++ch)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w)
            std::memcpy(dst + (((n * C + ch) * H + h) * W + w) * es,
                        src + (((n * H + h) * W + w) * C + ch) * es, es);
    c = std::move(out);
  }
  return c.dtype() == to ? c : c.cast(to);
}

Expected<Tensor> copy_to_host(const DeviceTensor& t, DataType to, cudaStream_t s) {
  Tensor raw(t.dtype, t.shape);
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  if (raw.nbytes() && t.data)
    KILN_CUDA_CHECK(cudaMemcpy(raw.raw(), t.data, raw.nbytes(), cudaMemcpyDeviceToHost));
  return from_device_format(raw, TensorFormat{t.dtype, t.layout}, to);
}

Expected<std::unique_ptr<LibraryHandles>> LibraryHandles::create(cudaStream_t stream) {
  std::unique_ptr<LibraryHandles> h(new LibraryHandles());
  if (cudnnCreate(&h->cudnn_) != CUDNN_STATUS_SUCCESS)
    return KILN_ERROR("cudnnCreate failed (is cuDNN 9 installed and the GPU usable?)");
  if (cudnnSetStream(h->cudnn_, stream) != CUDNN_STATUS_SUCCESS)
    return KILN_ERROR("cudnnSetStream failed");
  if (cublasCreate(&h->cublas_) != CUBLAS_STATUS_SUCCESS) {
    const std::string why = cublas_open_error();
    return KILN_ERROR("cublasCreate failed{}", why.empty() ? "" : ": " + why);
  }
  if (cublasSetStream(h->cublas_, stream) != CUBLAS_STATUS_SUCCESS)
    return KILN_ERROR("cublasSetStream failed");
  if (cublasLtCreate(&h->cublaslt_) != CUBLAS_STATUS_SUCCESS) {
    const std::string why = cublas_open_error();
    return KILN_ERROR("cublasLtCreate failed{}", why.empty() ? "" : ": " + why);
  }
  return h;
}

LibraryHandles::~LibraryHandles() {
  if (cublaslt_) cublasLtDestroy(cublaslt_);
  if (cublas_) cublasDestroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
}

void LibraryHandles::bind(RunContext& rc) const {
  rc.cudnn = cudnn_;
  rc.cublas = cublas_;
  rc.cublaslt = cublaslt_;
}

std::string device_signature() {
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
    return "unknown-gpu";
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  return fmt::format("{} sm_{}{} cudart {} cudnn {} cublasLt {}", p.name, p.major, p.minor, rt,
                     cudnnGetVersion(), cublasLtGetVersion());
}

bool pdl_available() {
  const char* env = std::getenv("KILN_PDL");
  if (env && std::string_view(env) == "0") return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

DeviceMemory::~DeviceMemory() {
  if (ptr_) cudaFree(ptr_);
}

Status DeviceMemory::reserve(size_t bytes, const std::string& what) {
  if (bytes <= bytes_) return Status::Ok();
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
    cudaGetLastError();
    ptr_ = nullptr;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return KILN_ERROR("out of GPU memory: {} needs {:.1f} MiB, {:.1f} MiB of {:.1f} MiB are free",
                      what, bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
  }
  bytes_ = bytes;
  return Status::Ok();
}

int sm_count() {
  constexpr int kDevices = 64;
  static std::array<std::atomic<int>, kDevices> known{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  if (dev < kDevices)
    if (const int n = known[dev].load(std::memory_order_relaxed); n > 0) return n;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  if (dev < kDevices) known[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace kiln::gpu
