// kiln.Reformat: the explicit conversion the lowering places where a tensor's producer and a
// consumer want different formats (float32 <-> float16, linear <-> NHWC). Logically Identity.
#include "kernels/device_util.cuh"
#include "tactics.h"

namespace kiln::gpu {
namespace {

template <typename In, typename Out>
__global__ void reformat_kernel(const In* x, Out* y, int64_t n, StridedIndex in_ix) {
  KILN_GRID_STRIDE(i, n) { store(y, i, load(x, in_ix.offset(i))); }
}

// Linear [N,C,HW] <-> NHWC [N,HW,C] with few channels (a CNN's input image, C = 3): one thread
// per pixel; reads of each channel plane and writes of the pixel's C values are coalesced
// across the warp, and the index math is one 32-bit division (the general kernel's rank-4
// strided index cost 4x the memory time on ResNet-50's input).
template <typename In, typename Out, bool ToNHWC>
__global__ void reformat_pixels(const In* __restrict__ x, Out* __restrict__ y, int pixels,
                                int hw, int C) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += gridDim.x * blockDim.x) {
    const int n = i / hw, p = i - n * hw;
    const int64_t plane = static_cast<int64_t>(n) * C * hw + p;  // linear: x[n, c, p]
    const int64_t pix = static_cast<int64_t>(i) * C;              // NHWC: x[n, p, c]
    for (int c = 0; c < C; ++c) {
      if constexpr (ToNHWC) store(y, pix + c, load(x, plane + static_cast<int64_t>(c) * hw));
      else store(y, plane + static_cast<int64_t>(c) * hw, load(x, pix + c));
    }
  }
}
constexpr int64_t kPixelReformatMaxC = 16;

// Storage-order dims of a tensor and, for the same dims, the strides of `from`'s storage.
StridedIndex storage_map(const DeviceTensor& from, const DeviceTensor& to) {
  const auto& s = to.shape;
  StridedIndex ix;
  const bool nhwc_to = to.layout == Layout::kNHWC && s.size() == 4;
  const bool nhwc_from = from.layout == Layout::kNHWC && s.size() == 4;
  std::vector<int64_t> logical_strides;  // strides of `from` per logical dim
  if (nhwc_from) {
    const int64_t C = s[1], H = s[2], W = s[3];
    logical_strides = {H * W * C, 1, W * C, C};
  } else {
    logical_strides = row_major_strides(s);
  }
  std::vector<int> order(s.size());
  for (size_t d = 0; d < s.size(); ++d) order[d] = static_cast<int>(d);
  if (nhwc_to) order = {0, 2, 3, 1};
  ix.rank = static_cast<int>(s.size());
  for (size_t d = 0; d < s.size(); ++d) {
    ix.dims[d] = s[order[d]];
    ix.strides[d] = logical_strides[order[d]];
  }
  return ix;
}

class ReformatLayer final : public Layer {
 public:
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const DeviceTensor& x = in[0];
    const DeviceTensor& y = out[0];
    const int64_t n = y.numel();
    if (n == 0) return Status::Ok();
    if (x.dtype == y.dtype && (x.layout == y.layout || x.rank() != 4)) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, y.nbytes(), cudaMemcpyDeviceToDevice, rc.stream));
      return Status::Ok();
    }
    const bool pixels = x.rank() == 4 && x.layout != y.layout && x.shape[1] <= kPixelReformatMaxC &&
                        n < (int64_t(1) << 31);
    const StridedIndex ix = storage_map(x, y);
    bool ok = false;
    dispatch_dtype(x.dtype, [&](auto in_t) {
      using In = decltype(in_t);
      ok = dispatch_dtype(y.dtype, [&](auto out_t) {
        using Out = decltype(out_t);
        const In* xp = static_cast<const In*>(x.data);
        Out* yp = static_cast<Out*>(y.data);
        if (pixels) {
          const int C = static_cast<int>(x.shape[1]), hw = static_cast<int>(x.shape[2] * x.shape[3]);
          const int count = static_cast<int>(n / C);
          if (y.layout == Layout::kNHWC)
            reformat_pixels<In, Out, true><<<grid_for(count), kBlock, 0, rc.stream>>>(xp, yp, count, hw, C);
          else
            reformat_pixels<In, Out, false><<<grid_for(count), kBlock, 0, rc.stream>>>(xp, yp, count, hw, C);
        } else {
          reformat_kernel<In, Out><<<grid_for(n), kBlock, 0, rc.stream>>>(xp, yp, n, ix);
        }
      });
    });
    if (!ok)
      return KILN_ERROR("reformat from {} to {} is not supported", dtype_name(x.dtype),
                        dtype_name(y.dtype));
    KILN_CUDA_LAUNCH_CHECK("reformat kernel");
    return Status::Ok();
  }
};

Expected<std::unique_ptr<Layer>> create_reformat(const LayerDesc&) {
  return std::unique_ptr<Layer>(new ReformatLayer());
}

const TacticDef kReformatTactics[] = {
    {"kiln", "Reformat", "reformat", kF32 | kF16 | kF64 | kNHWC, 0, nullptr, create_reformat},
};

}  // namespace

std::span<const TacticDef> reformat_tactics() { return kReformatTactics; }

}  // namespace kiln::gpu
