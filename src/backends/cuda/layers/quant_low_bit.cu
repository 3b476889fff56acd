// Reduction family (Q/DQ): QuantizeLinear to float8 / int4 / uint4 and DequantizeLinear from
// them, as src/ops/quant.cpp's low-bit paths compute them:
//   quantize:   q = round_to(precision, float(x) / float(scale)) (always in float, whatever x
//               is); float8: from_float(float(q + zp), saturate); int4/uint4: round half to
//               even, add zp, clamp to [-8, 7] / [0, 15] (NaN -> zp)
//   dequantize: (float(x) - float(zp)) * float(scale) in float32, then the output type
// The element conversions are core/low_bit.h's, shared with the CPU, so the bits agree.
#include <cmath>
#include <cstdint>

#include "core/low_bit.h"
#include "quant_common.cuh"

namespace kiln::gpu {

namespace {

// A low-bit zero point (x's type for DequantizeLinear, y's for QuantizeLinear) as a double;
// 0 when absent.
struct LowBitZp {
  const uint8_t* p = nullptr;
  DataType t = DataType::kUndefined;
  __device__ double get(int64_t i) const {
    return p ? static_cast<double>(low_bit::to_float(t, p[i])) : 0.0;
  }
};

__device__ __forceinline__ float round_prec(int prec, float f) {
  if (prec == 1) return __half2float(__float2half_rn(f));
  if (prec == 2) return __bfloat162float(__float2bfloat16_rn(f));
  return f;
}

template <typename X>
__global__ void quantize_low_bit_kernel(const X* __restrict__ x, uint8_t* __restrict__ y,
                                        int64_t n, ParamPtr scale, LowBitZp zp, QuantGeom g,
                                        int prec, DataType out, bool saturate) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t p = g.param(i);
    const float xf = static_cast<float>(static_cast<double>(load(x, i)));
    const float sf = static_cast<float>(scale.get<double>(p));
    double q = round_prec(prec, __fdiv_rn(xf, sf));
    const double z = zp.get(p);
    if (low_bit::is_float8(out)) {
      y[i] = low_bit::from_float(out, static_cast<float>(q + z), saturate);
      continue;
    }
    if (isnan(q)) q = 0;
    const double lo = out == DataType::kInt4 ? -8 : 0, hi = out == DataType::kInt4 ? 7 : 15;
    const double r = fmin(fmax(rint(q) + z, lo), hi);
    y[i] = static_cast<uint8_t>(static_cast<int8_t>(r));
  }
}

__global__ void dequantize_low_bit_kernel(const uint8_t* __restrict__ x, DataType xt, void* y,
                                          DataType yt, int64_t n, ParamPtr scale, LowBitZp zp,
                                          QuantGeom g) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t p = g.param(i);
    const float d = __fsub_rn(low_bit::to_float(xt, x[i]), static_cast<float>(zp.get(p)));
    const float v = __fmul_rn(d, static_cast<float>(scale.get<double>(p)));
    switch (yt) {
      case DataType::kFloat16: store(static_cast<__half*>(y), i, v); break;
      case DataType::kBFloat16: store(static_cast<__nv_bfloat16*>(y), i, v); break;
      case DataType::kFloat64: static_cast<double*>(y)[i] = v; break;
      default: static_cast<float*>(y)[i] = v; break;
    }
  }
}

class QuantLowBitLayer final : public Layer {
 public:
  explicit QuantLowBitLayer(const LayerDesc& d)
      : node_(d.node),
        quantize_(d.node->op_type == "QuantizeLinear"),
        saturate_(d.node->attrs.get_int("saturate", 1) != 0) {
    // The quotient's rounding follows the scale's logical type unless `precision` says.
    const int64_t p = d.node->attrs.get_int("precision", 0);
    const DataType t = p != 0 ? static_cast<DataType>(p) : d.in_type(1).dtype;
    prec_ = t == DataType::kFloat16 ? 1 : t == DataType::kBFloat16 ? 2 : 0;
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const bool has_zp = in.size() > 2 && in[2].present();
    KILN_ASSIGN_OR_RETURN(g_, quant_geom(in[0].shape, in[1], has_zp ? &in[2] : nullptr, *node_));
    const DataType low = quantize_ ? out[0].dtype : in[0].dtype;
    if (has_zp && in[2].dtype != low)
      return KILN_ERROR("{}: zero point type {} differs from {}", node_->label(),
                        dtype_name(in[2].dtype), dtype_name(low));
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = in[0].numel();
    if (n == 0) return Status::Ok();
    const ParamPtr scale{in[1].data, in[1].dtype};
    LowBitZp zp;
    if (in.size() > 2 && in[2].present()) zp = {static_cast<const uint8_t*>(in[2].data), in[2].dtype};
    bool ok = true;
    if (quantize_) {
      ok = dispatch_dtype(in[0].dtype, [&](auto xt) {
        using X = decltype(xt);
        if constexpr (is_float_v<X> || std::is_same_v<X, int32_t>)
          quantize_low_bit_kernel<X><<<grid_for(n), kBlock, 0, rc.stream>>>(
              static_cast<const X*>(in[0].data), static_cast<uint8_t*>(out[0].data), n, scale,
              zp, g_, prec_, out[0].dtype, saturate_);
      });
    } else {
      dequantize_low_bit_kernel<<<grid_for(n), kBlock, 0, rc.stream>>>(
          static_cast<const uint8_t*>(in[0].data), in[0].dtype, out[0].data, out[0].dtype, n,
          scale, zp, g_);
    }
    if (!ok)
      return KILN_ERROR("{}: unsupported types {} -> {}", node_->label(), dtype_name(in[0].dtype),
                        dtype_name(out[0].dtype));
    KILN_CUDA_LAUNCH_CHECK(quantize_ ? "low-bit quantize kernel" : "low-bit dequantize kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool quantize_, saturate_;
  int prec_ = 0;
  QuantGeom g_;
};

}  // namespace

bool quant_low_bit_supports(const LayerDesc& d, std::string* why) {
  const bool quantize = d.node->op_type == "QuantizeLinear";
  const DataType x = d.in[0].dtype, y = d.out[0].dtype;
  if (quantize) {
    if (!low_bit::is_low_bit(y)) return *why = "not a float8/int4 target", false;
    if (!dtype_is_float(x) && x != DataType::kInt32)
      return *why = "x must be float or int32", false;
  } else {
    if (!low_bit::is_low_bit(x)) return *why = "not a float8/int4 input", false;
    if (!dtype_is_float(y)) return *why = "output must be float", false;
  }
  if (d.in.size() < 2 || !dtype_is_float(d.in[1].dtype))
    return *why = "the scale must be float", false;
  // float32 stored as float16 would round x, the scale or the result once more than the
  // reference does: such nodes run at float32 precision instead.
  bool f32 = d.out_type(0).dtype == DataType::kFloat32;
  for (size_t i = 0; i < 2; ++i) f32 = f32 || d.in_type(i).dtype == DataType::kFloat32;
  if (d.precision == Precision::kFP16 && f32)
    return *why = "float32 tensors are kept at float32 precision", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_quant_low_bit(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new QuantLowBitLayer(d));
}

}  // namespace kiln::gpu
