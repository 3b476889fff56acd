// kiln.Reformat: the explicit conversion the lowering places where a tensor's producer and a
// consumer want different formats (float32 <-> float16, linear <-> NHWC, and for INT8 layers a
// float value <-> its int8 codes with the value's scale). Logically Identity.
#include <algorithm>

#include "kernels/device_util.cuh"
#include "kernels/int8.cuh"
#include "tactics.h"

namespace kiln::gpu {
namespace {

// What a reformat does to each element besides moving it: convert the storage type, or
// quantize a float value to its int8 code / dequantize a code (docs/quantization.md).
enum class Codes : int { kNone, kQuantize, kDequantize };

template <Codes M, typename In, typename Out>
__device__ __forceinline__ void convert(const In* x, int64_t xi, Out* y, int64_t yi, float scale) {
  // quantize_code's codes by a multiply (the division made the float16 -> int8 reformat of
  // ResNet-50's stage 1 output compute-bound: 0.50 ms at 36% of DRAM bandwidth and 91% of SM
  // throughput under Nsight Compute). 1 / scale is loop-invariant: computed once per thread.
  if constexpr (M == Codes::kQuantize)
    y[yi] = quantize_code_inv(static_cast<float>(load(x, xi)), scale, 1.f / scale);
  else if constexpr (M == Codes::kDequantize) store(y, yi, dequantize_code(x[xi], scale));
  else store(y, yi, load(x, xi));
}

template <Codes M, typename In, typename Out>
__global__ void reformat_kernel(const In* x, Out* y, int64_t n, StridedIndex in_ix, float scale) {
  KILN_GRID_STRIDE(i, n) { convert<M>(x, in_ix.offset(i), y, i, scale); }
}

// Same element order on both sides (a type conversion, quantize or dequantize only): V
// consecutive elements per thread through one aligned vector load and store (16 bytes on the
// wider side), no index math. The strided kernel's rank-4 index cost 17x the memory time on
// ResNet-50's float16 -> int8 reformats (1.77 ms for [256,256,56,56]).
template <typename In, typename Out>
constexpr int kVec = std::max<int>(1, 16 / std::max(sizeof(In), sizeof(Out)));
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <Codes M, typename In, typename Out, int V = kVec<In, Out>>
__global__ void reformat_flat(const Pack<In, V>* __restrict__ x, Pack<Out, V>* __restrict__ y,
                              int64_t packs, float scale) {
  KILN_GRID_STRIDE(i, packs) {
    const Pack<In, V> a = x[i];
    Pack<Out, V> b;
#pragma unroll
    for (int k = 0; k < V; ++k) convert<M>(a.v, k, b.v, k, scale);
    y[i] = b;
  }
}

// Linear [N,C,HW] <-> NHWC [N,HW,C] with few channels (a CNN's input image, C = 3): one thread
// per pixel; reads of each channel plane and writes of the pixel's C values are coalesced
// across the warp, and the index math is one 32-bit division (the general kernel's rank-4
// strided index cost 4x the memory time on ResNet-50's input).
template <Codes M, typename In, typename Out, bool ToNHWC>
__global__ void reformat_pixels(const In* __restrict__ x, Out* __restrict__ y, int pixels,
                                int hw, int C, float scale) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += gridDim.x * blockDim.x) {
    const int n = i / hw, p = i - n * hw;
    const int64_t plane = static_cast<int64_t>(n) * C * hw + p;  // linear: x[n, c, p]
    const int64_t pix = static_cast<int64_t>(i) * C;              // NHWC: x[n, p, c]
    for (int c = 0; c < C; ++c) {
      if constexpr (ToNHWC) convert<M>(x, plane + static_cast<int64_t>(c) * hw, y, pix + c, scale);
      else convert<M>(x, pix + c, y, plane + static_cast<int64_t>(c) * hw, scale);
    }
  }
}
constexpr int64_t kPixelReformatMaxC = 16;

// Linear [N,C,HW] <-> NHWC [N,HW,C] with more channels: per image an [A, B] -> [B, A] transpose
// (to NHWC A = C and B = HW, back A = HW and B = C) in 32x32 tiles through shared memory, read
// along B (contiguous in x) and written along A (contiguous in y), converted on the write. The
// strided kernel read or wrote a channel's elements H*W apart: a [8, 576, 56, 56] float16
// tensor to NHWC took 0.13 ms, 6x its memory time.
constexpr int kTile = 32;
template <Codes M, typename In, typename Out>
__global__ void reformat_tiled(const In* __restrict__ x, Out* __restrict__ y, int64_t images,
                               int64_t A, int64_t B, float scale) {
  __shared__ In tile[kTile][kTile + 1];
  const int64_t ta = (A + kTile - 1) / kTile, tb = (B + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < images * ta * tb; t += gridDim.x) {
    const int64_t n = t / (ta * tb), rem = t % (ta * tb);
    const int64_t a0 = rem / tb * kTile, b0 = rem % tb * kTile;
    const In* xs = x + n * A * B;
    Out* ys = y + n * A * B;
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      const int64_t a = a0 + j, b = b0 + threadIdx.x;
      if (a < A && b < B) tile[j][threadIdx.x] = xs[a * B + b];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      const int64_t b = b0 + j, a = a0 + threadIdx.x;
      if (a < A && b < B) convert<M>(&tile[threadIdx.x][0], j, ys, b * A + a, scale);
    }
    __syncthreads();
  }
}

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

// Launches the pixel kernel for small channel counts, else the general strided one.
template <Codes M, typename In, typename Out>
void launch_reformat(const DeviceTensor& x, const DeviceTensor& y, float scale, cudaStream_t s) {
  const int64_t n = y.numel();
  const In* xp = static_cast<const In*>(x.data);
  Out* yp = static_cast<Out*>(y.data);
  const bool same_order = x.layout == y.layout || x.rank() != 4;
  const bool pixels = x.rank() == 4 && !same_order && x.shape[1] <= kPixelReformatMaxC &&
                      n < (int64_t(1) << 31);
  auto aligned = [](const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  constexpr int V = kVec<In, Out>;
  if (same_order && n % V == 0 && aligned(xp, alignof(Pack<In, V>)) &&
      aligned(yp, alignof(Pack<Out, V>))) {
    const int64_t packs = n / V;
    reformat_flat<M, In, Out><<<grid_for(packs), kBlock, 0, s>>>(
        reinterpret_cast<const Pack<In, V>*>(xp), reinterpret_cast<Pack<Out, V>*>(yp), packs,
        scale);
  } else if (pixels) {
    const int C = static_cast<int>(x.shape[1]), hw = static_cast<int>(x.shape[2] * x.shape[3]);
    const int count = static_cast<int>(n / C);
    if (y.layout == Layout::kNHWC)
      reformat_pixels<M, In, Out, true>
          <<<grid_for(count), kBlock, 0, s>>>(xp, yp, count, hw, C, scale);
    else
      reformat_pixels<M, In, Out, false>
          <<<grid_for(count), kBlock, 0, s>>>(xp, yp, count, hw, C, scale);
  } else if (x.rank() == 4 && !same_order) {
    const int64_t C = x.shape[1], hw = x.shape[2] * x.shape[3], images = x.shape[0];
    const bool to_nhwc = y.layout == Layout::kNHWC;
    const int64_t A = to_nhwc ? C : hw, B = to_nhwc ? hw : C;
    const int64_t tiles = images * ((A + kTile - 1) / kTile) * ((B + kTile - 1) / kTile);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, 65535 * 8));
    reformat_tiled<M, In, Out><<<grid, dim3(kTile, 8), 0, s>>>(xp, yp, images, A, B, scale);
  } else {
    reformat_kernel<M, In, Out><<<grid_for(n), kBlock, 0, s>>>(xp, yp, n, storage_map(x, y), scale);
  }
}

// Calls f(T{}) for the float storage types an INT8 layer's neighbours use.
template <typename F>
bool dispatch_f32_f16(DataType t, F&& f) {
  if (t == DataType::kFloat32) return f(float{}), true;
  if (t == DataType::kFloat16) return f(__half{}), true;
  return false;
}

class ReformatLayer final : public Layer {
 public:
  // codes: the value is float and one side stores it as int8 codes of `scale`.
  ReformatLayer(bool codes, float scale) : codes_(codes), scale_(scale) {}

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
    bool ok = false;
    if (codes_ && y.dtype == DataType::kInt8 && x.dtype != DataType::kInt8) {
      ok = dispatch_f32_f16(x.dtype, [&](auto in_t) {
        launch_reformat<Codes::kQuantize, decltype(in_t), int8_t>(x, y, scale_, rc.stream);
      });
    } else if (codes_ && x.dtype == DataType::kInt8 && y.dtype != DataType::kInt8) {
      ok = dispatch_f32_f16(y.dtype, [&](auto out_t) {
        launch_reformat<Codes::kDequantize, int8_t, decltype(out_t)>(x, y, scale_, rc.stream);
      });
    } else {
      dispatch_dtype(x.dtype, [&](auto in_t) {
        ok = dispatch_dtype(y.dtype, [&](auto out_t) {
          launch_reformat<Codes::kNone, decltype(in_t), decltype(out_t)>(x, y, 1.f, rc.stream);
        });
      });
    }
    if (!ok)
      return KILN_ERROR("reformat from {} to {} is not supported", dtype_name(x.dtype),
                        dtype_name(y.dtype));
    KILN_CUDA_LAUNCH_CHECK("reformat kernel");
    return Status::Ok();
  }

 private:
  bool codes_;
  float scale_;
};

Expected<std::unique_ptr<Layer>> create_reformat(const LayerDesc& d) {
  const Value* v = d.node->input(0);
  const bool float_value = v && dtype_is_float(v->type.dtype);
  const bool codes =
      float_value && (d.in[0].dtype == DataType::kInt8 || d.out[0].dtype == DataType::kInt8);
  if (codes && !v->has_quant_scale())
    return KILN_ERROR("{}: '{}' is stored as int8 but has no INT8 scale", d.node->label(), v->name);
  return std::unique_ptr<Layer>(new ReformatLayer(codes, codes ? v->quant_scales[0] : 1.f));
}

// A change of layout alone of a tensor whose two layouts hold the same bytes
// (layouts_share_bytes): the executor relabels its input's memory (alias, kLayoutSwap); where
// it cannot (a graph output), run() copies.
class RelabelLayer final : public Layer {
 public:
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].data != in[0].data && out[0].nbytes() > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(out[0].data, in[0].data, out[0].nbytes(),
                                      cudaMemcpyDeviceToDevice, rc.stream));
    return Status::Ok();
  }
};

bool relabel_supports(const LayerDesc& d, std::string* why) {
  if (d.in.empty() || d.out.empty() || d.in[0].dtype != d.out[0].dtype)
    return *why = "a change of layout only", false;
  if (!layouts_share_bytes(d.in_type(0)))
    return *why = "the two layouts of this tensor differ in memory", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_relabel(const LayerDesc&) {
  return std::unique_ptr<Layer>(new RelabelLayer());
}

const TacticDef kReformatTactics[] = {
    {"kiln", "Reformat", "reformat", kF32 | kF16 | kF64 | kNHWC | kI8, 0, nullptr, create_reformat},
    {"kiln", "Reformat", "reformat.relabel", kF32 | kF16 | kF64 | kNHWC | kI8 | kLayoutSwap, 0,
     relabel_supports, create_relabel, nullptr, /*alias_input=*/0},
};

}  // namespace

std::span<const TacticDef> reformat_tactics() { return kReformatTactics; }

}  // namespace kiln::gpu
