// Elementwise family: RotaryEmbedding (opset 23), as src/ops/rotary.cpp computes it. One thread
// per output element finds its pair (x[k], x[k + R/2]) or, interleaved, (x[2k], x[2k+1]) and
// the cache row of its (batch, position):
//   x1' = cos * x1 - sin * x2,   x2' = sin * x1 + cos * x2
// Features past R pass through, and so do heads outside [kiln_head_begin, kiln_head_end) (one
// rotary over the Q and K heads of a packed projection). float16 rows of whole 16-byte halves take rotary_half8_kernel.
// Arithmetic is in double, rounded to the storage type after each
// product and sum, as the reference rounds to the input type (so float16/bfloat16 agree with it
// bit for bit). A position id outside the caches gives NaN (the reference refuses it; a kernel
// cannot return an error).
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu::ew {

namespace {

struct RotaryGeom {
  int64_t B = 0, S = 0, H = 0, D = 0, half = 0, max_pos = 0;
  int64_t hb = 0, he = 0;    // the rotated heads [hb, he); the others are copied
  bool packed = false;       // X is [B, S, H*D] (else [B, H, S, D])
  bool interleaved = false;
  bool pos_batch1 = false;   // position_ids (or, without them, the caches) have batch 1
  bool cache_3d = false;     // caches indexed by (b, s) without position_ids
};

template <typename T>
__device__ __forceinline__ double rnd(double v) {
  if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(__float2half_rn(static_cast<float>(v)));
  else return __bfloat162float(__float2bfloat16_rn(static_cast<float>(v)));
}

template <typename T>
__global__ void rotary_kernel(const T* __restrict__ x, const T* __restrict__ cosc,
                              const T* __restrict__ sinc, const int64_t* __restrict__ pos, T* y,
                              int64_t n, RotaryGeom g) {
  const int64_t R = 2 * g.half;
  KILN_GRID_STRIDE(i, n) {
    const int64_t d = i % g.D;
    int64_t b, s, h, rest = i / g.D;
    if (g.packed) {
      h = rest % g.H;
      rest /= g.H;  // (b * S + s)
      s = rest % g.S, b = rest / g.S;
    } else {
      h = (rest / g.S) % g.H;
      s = rest % g.S, b = rest / (g.S * g.H);
    }
    if (d >= R || h < g.hb || h >= g.he) {
      y[i] = x[i];
      continue;
    }
    int64_t row;
    if (pos) {
      row = pos[(g.pos_batch1 ? 0 : b) * g.S + s];
      if (row < 0 || row >= g.max_pos) {
        store(y, i, __int_as_float(0x7fc00000));
        continue;
      }
    } else {
      row = (g.pos_batch1 ? 0 : b) * g.S + s;
    }
    const int64_t base = i - d;
    const int64_t k = g.interleaved ? d / 2 : d % g.half;
    const bool first = g.interleaved ? d % 2 == 0 : d < g.half;
    const int64_t i1 = base + (g.interleaved ? 2 * k : k);
    const int64_t i2 = base + (g.interleaved ? 2 * k + 1 : k + g.half);
    const double c = static_cast<double>(load(cosc, row * g.half + k));
    const double sn = static_cast<double>(load(sinc, row * g.half + k));
    const double x1 = static_cast<double>(load(x, i1)), x2 = static_cast<double>(load(x, i2));
    const double v = first ? rnd<T>(rnd<T>(c * x1) - rnd<T>(sn * x2))
                           : rnd<T>(rnd<T>(sn * x1) + rnd<T>(c * x2));
    store(y, i, v);
  }
}

// float16 rows whose rotated halves are whole 16-byte chunks (not interleaved, R = D, R/2 a
// multiple of 8): one thread per chunk pair, x[k..k+8) and x[k+R/2..k+R/2+8) with their cos and
// sin, 16 bytes a load. The same roundings as rotary_kernel: a product of two float16 values is
// exact in float, and float's correctly rounded sum is the double sum rounded to float, so the
// results agree bit for bit.
template <bool kPos>
__global__ void rotary_half8_kernel(const __half* __restrict__ x, const __half* __restrict__ cosc,
                                    const __half* __restrict__ sinc,
                                    const int64_t* __restrict__ pos, __half* __restrict__ y,
                                    int64_t n, RotaryGeom g) {
  const int64_t chunks = g.half / 8;
  KILN_GRID_STRIDE(i, n) {
    const int64_t r = i / chunks, k = (i - r * chunks) * 8;  // head row, first pair
    int64_t b, s, head;
    if (g.packed) {
      const int64_t t = r / g.H;  // b * S + s
      head = r - t * g.H;
      s = t % g.S, b = t / g.S;
    } else {
      head = (r / g.S) % g.H;
      s = r % g.S, b = r / (g.S * g.H);
    }
    const int64_t i1 = r * g.D + k, i2 = i1 + g.half;
    if (head < g.hb || head >= g.he) {  // a head outside the range: copied
      *reinterpret_cast<uint4*>(y + i1) = *reinterpret_cast<const uint4*>(x + i1);
      *reinterpret_cast<uint4*>(y + i2) = *reinterpret_cast<const uint4*>(x + i2);
      continue;
    }
    int64_t row = (g.pos_batch1 ? 0 : b) * g.S + s;
    if constexpr (kPos) {
      row = pos[row];
      if (row < 0 || row >= g.max_pos) {
        const __half nan = __float2half(__int_as_float(0x7fc00000));
        const __half2 nn = __halves2half2(nan, nan);
        const uint4 v = {*reinterpret_cast<const unsigned*>(&nn),
                         *reinterpret_cast<const unsigned*>(&nn),
                         *reinterpret_cast<const unsigned*>(&nn),
                         *reinterpret_cast<const unsigned*>(&nn)};
        *reinterpret_cast<uint4*>(y + i1) = v;
        *reinterpret_cast<uint4*>(y + i2) = v;
        continue;
      }
    }
    const uint4 a = *reinterpret_cast<const uint4*>(x + i1);
    const uint4 bb = *reinterpret_cast<const uint4*>(x + i2);
    const uint4 c = *reinterpret_cast<const uint4*>(cosc + row * g.half + k);
    const uint4 sn = *reinterpret_cast<const uint4*>(sinc + row * g.half + k);
    const __half* x1 = reinterpret_cast<const __half*>(&a);
    const __half* x2 = reinterpret_cast<const __half*>(&bb);
    const __half* cc = reinterpret_cast<const __half*>(&c);
    const __half* ss = reinterpret_cast<const __half*>(&sn);
    uint4 o1, o2;
    __half* y1 = reinterpret_cast<__half*>(&o1);
    __half* y2 = reinterpret_cast<__half*>(&o2);
    auto h = [](float v) { return __half2float(__float2half_rn(v)); };
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float u = __half2float(x1[j]), w = __half2float(x2[j]);
      const float cj = __half2float(cc[j]), sj = __half2float(ss[j]);
      y1[j] = __float2half_rn(h(cj * u) - h(sj * w));
      y2[j] = __float2half_rn(h(sj * u) + h(cj * w));
    }
    *reinterpret_cast<uint4*>(y + i1) = o1;
    *reinterpret_cast<uint4*>(y + i2) = o2;
  }
}

class RotaryLayer final : public Layer {
 public:
  explicit RotaryLayer(const LayerDesc& d) : node_(d.node) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    const Node& n = *node_;
    const DeviceTensor &x = in[0], &cosc = in[1], &sinc = in[2];
    const bool has_pos = in.size() > 3 && in[3].present();
    if (x.rank() != 3 && x.rank() != 4)
      return KILN_ERROR("{}: X must be 3-D or 4-D, got {}", n.label(), shape_str(x.shape));
    RotaryGeom g;
    g.packed = x.rank() == 3;
    g.B = x.shape[0];
    g.S = g.packed ? x.shape[1] : x.shape[2];
    g.H = g.packed ? n.attrs.get_int("num_heads", 0) : x.shape[1];
    if (g.H <= 0 || (g.packed && x.shape[2] % g.H != 0))
      return KILN_ERROR("{}: num_heads {} must divide X's hidden size {}", n.label(), g.H,
                        x.shape.back());
    g.D = g.packed ? x.shape[2] / g.H : x.shape[3];
    int64_t R = n.attrs.get_int("rotary_embedding_dim", 0);
    if (R == 0) R = g.D;
    if (R < 0 || R > g.D || R % 2 != 0)
      return KILN_ERROR("{}: rotary_embedding_dim {} must be even and at most the head size {}",
                        n.label(), R, g.D);
    g.half = R / 2;
    if (cosc.shape != sinc.shape || cosc.rank() < 1 || cosc.shape.back() != g.half)
      return KILN_ERROR("{}: cos_cache {} and sin_cache {} must end in rotary_embedding_dim/2 = {}",
                        n.label(), shape_str(cosc.shape), shape_str(sinc.shape), g.half);
    g.interleaved = n.attrs.get_int("interleaved", 0) != 0;
    g.hb = n.attrs.get_int("kiln_head_begin", 0);
    g.he = n.attrs.get_int("kiln_head_end", g.H);
    if (g.hb < 0 || g.he < g.hb || g.he > g.H)
      return KILN_ERROR("{}: head range [{}, {}) is not within the {} heads", n.label(), g.hb,
                        g.he, g.H);
    if (has_pos) {
      const DeviceTensor& p = in[3];
      if (p.rank() != 2 || (p.shape[0] != g.B && p.shape[0] != 1) || p.shape[1] != g.S ||
          cosc.rank() != 2)
        return KILN_ERROR("{}: position_ids {} needs caches [max_pos, {}] and shape [{},{}]",
                          n.label(), shape_str(p.shape), g.half, g.B, g.S);
      if (p.dtype != DataType::kInt64)
        return KILN_ERROR("{}: position_ids must be int64", n.label());
      g.pos_batch1 = p.shape[0] == 1;
      g.max_pos = cosc.shape[0];
    } else {
      const bool ok = (cosc.rank() == 2 && cosc.shape[0] == g.S) ||
                      (cosc.rank() == 3 && (cosc.shape[0] == g.B || cosc.shape[0] == 1) &&
                       cosc.shape[1] == g.S);
      if (!ok)
        return KILN_ERROR(
            "{}: without position_ids the caches must be [{},{},{}] or [{},{}], got {}",
            n.label(), g.B, g.S, g.half, g.S, g.half, shape_str(cosc.shape));
      g.pos_batch1 = cosc.rank() == 2 || cosc.shape[0] == 1;
    }
    g_ = g;
    half8_ = x.dtype == DataType::kFloat16 && !g.interleaved && 2 * g.half == g.D &&
             g.half % 8 == 0;
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = out[0].numel();
    if (n == 0) return Status::Ok();
    const int64_t* pos =
        in.size() > 3 && in[3].present() ? static_cast<const int64_t*>(in[3].data) : nullptr;
    bool aligned = true;
    for (const void* p : {in[0].data, in[1].data, in[2].data, out[0].data})
      aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
    if (half8_ && aligned) {
      const int64_t items = n / g_.D * (g_.half / 8);
      const auto* xh = static_cast<const __half*>(in[0].data);
      const auto* ch = static_cast<const __half*>(in[1].data);
      const auto* sh = static_cast<const __half*>(in[2].data);
      auto* yh = static_cast<__half*>(out[0].data);
      if (pos)
        rotary_half8_kernel<true><<<grid_for(items), kBlock, 0, rc.stream>>>(xh, ch, sh, pos, yh,
                                                                              items, g_);
      else
        rotary_half8_kernel<false><<<grid_for(items), kBlock, 0, rc.stream>>>(xh, ch, sh, pos, yh,
                                                                               items, g_);
      KILN_CUDA_LAUNCH_CHECK("rotary kernel");
      return Status::Ok();
    }
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>)
        rotary_kernel<T><<<grid_for(n), kBlock, 0, rc.stream>>>(
            static_cast<const T*>(in[0].data), static_cast<const T*>(in[1].data),
            static_cast<const T*>(in[2].data), pos, static_cast<T*>(out[0].data), n, g_);
    });
    if (!ok || in[0].dtype == DataType::kFloat64)
      return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("rotary kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  RotaryGeom g_;
  bool half8_ = false;  // rotary_half8_kernel where the operands are 16-byte aligned
};

}  // namespace

bool rotary_supports(const LayerDesc& d, std::string* why) {
  if (d.in.size() < 3) return *why = "X, cos_cache and sin_cache are required", false;
  const DataType t = d.in[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kBFloat16)
    return *why = "X must be float32, float16 or bfloat16", false;
  if (d.in[1].dtype != t || d.in[2].dtype != t)
    return *why = "the caches must be stored in X's type", false;
  if (d.in.size() > 3 && d.in[3].dtype != DataType::kUndefined &&
      d.in[3].dtype != DataType::kInt64)
    return *why = "position_ids must be int64", false;
  if (d.in[0].layout != Layout::kLinear || d.out[0].layout != Layout::kLinear)
    return *why = "linear layout only", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_rotary(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new RotaryLayer(d));
}

}  // namespace kiln::gpu::ew
