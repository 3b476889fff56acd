// Elementwise family: Cast / CastLike from or to the low-bit types (float8 e4m3fn, e4m3fnuz,
// e5m2, e5m2fnuz; int4/uint4), one element per byte as kiln's Tensor stores them. The CPU
// reference (ops/elementwise_misc.cpp cast_low_bit, core/tensor.cpp) takes every value through
// double: a float8 target rounds float(v) to nearest even (`saturate`, default 1, clamps
// out-of-range values and infinities), a 4-bit target wraps the saturated int64, and a low-bit
// source converts with `convert` (float -> integer saturates, NaN -> 0). The conversions are
// core/low_bit.h's, the very code the CPU runs, so the bits agree.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "core/low_bit.h"
#include "kernels/device_util.cuh"
#include "tactics.h"

namespace kiln::gpu::ew {

namespace {

// Element i of a tensor of type `dt` (low-bit types included) as a double, like at_double().
__device__ double load_double(const void* p, DataType dt, int64_t i) {
  if (low_bit::is_low_bit(dt)) return low_bit::to_float(dt, static_cast<const uint8_t*>(p)[i]);
  switch (dt) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case DataType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DataType::kInt16: return static_cast<const int16_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kUInt16: return static_cast<const uint16_t*>(p)[i];
    case DataType::kUInt32: return static_cast<const uint32_t*>(p)[i];
    case DataType::kUInt64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DataType::kBool: return static_cast<const bool*>(p)[i] ? 1.0 : 0.0;
    default: return 0.0;
  }
}

// core/dispatch.h's convert<To>(double): NaN -> 0 and saturation for integers.
template <typename To>
__device__ To convert_double(double d) {
  if constexpr (std::is_same_v<To, bool>) {
    return d != 0.0;
  } else if constexpr (std::is_integral_v<To>) {
    if (d != d) return To{0};
    if (d <= static_cast<double>(std::numeric_limits<To>::lowest()))
      return std::numeric_limits<To>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<To>::max()))
      return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(d));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(d));
  } else {
    return static_cast<To>(d);
  }
}

// Any source -> a low-bit target.
__global__ void to_low_bit_kernel(const void* x, DataType from, uint8_t* y, DataType to,
                                  bool saturate, int64_t n) {
  KILN_GRID_STRIDE(i, n) {
    const double v = load_double(x, from, i);
    y[i] = low_bit::is_float8(to) ? low_bit::from_float(to, static_cast<float>(v), saturate)
                                  : low_bit::wrap4(to, convert_double<int64_t>(v));
  }
}

// A low-bit source -> any other target.
template <typename To>
__global__ void from_low_bit_kernel(const uint8_t* x, DataType from, To* y, int64_t n) {
  KILN_GRID_STRIDE(i, n) { y[i] = convert_double<To>(low_bit::to_float(from, x[i])); }
}

bool known(DataType t) { return low_bit::is_low_bit(t) || dispatch_dtype(t, [](auto) {}); }

bool low_bit_cast_supports(const LayerDesc& d, std::string* why) {
  if (d.in.empty() || d.out.empty()) return *why = "needs an input and an output", false;
  const DataType from = d.in[0].dtype, to = d.out[0].dtype;
  if (!low_bit::is_low_bit(from) && !low_bit::is_low_bit(to))
    return *why = "neither side is float8/int4 (ew.cast runs it)", false;
  if (!known(from) || !known(to))
    return *why = fmt::format("no kernel for {} -> {}", dtype_name(from), dtype_name(to)), false;
  // A float32 stored as float16 would be rounded once more than the reference rounds it.
  const bool f32 = d.in_type(0).dtype == DataType::kFloat32 ||
                   d.out_type(0).dtype == DataType::kFloat32;
  if (d.precision == Precision::kFP16 && f32)
    return *why = "float8/int4 casts keep float32 at float32 precision", false;
  return true;
}

class LowBitCastLayer final : public Layer {
 public:
  explicit LowBitCastLayer(const LayerDesc& d)
      : node_(d.node), saturate_(d.node->attrs.get_int("saturate", 1) != 0) {}

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const DeviceTensor &x = in[0], &y = out[0];
    const int64_t n = y.numel();
    if (n == 0) return Status::Ok();
    if (low_bit::is_low_bit(y.dtype)) {
      to_low_bit_kernel<<<grid_for(n), kBlock, 0, rc.stream>>>(
          x.data, x.dtype, static_cast<uint8_t*>(y.data), y.dtype, saturate_, n);
    } else {
      const bool ok = dispatch_dtype(y.dtype, [&](auto tag) {
        using To = decltype(tag);
        from_low_bit_kernel<To><<<grid_for(n), kBlock, 0, rc.stream>>>(
            static_cast<const uint8_t*>(x.data), x.dtype, static_cast<To*>(y.data), n);
      });
      if (!ok)
        return KILN_ERROR("{}: unsupported cast {} -> {}", node_->label(), dtype_name(x.dtype),
                          dtype_name(y.dtype));
    }
    KILN_CUDA_LAUNCH_CHECK("low-bit cast kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool saturate_;
};

}  // namespace

bool cast_low_bit_supports(const LayerDesc& d, std::string* why) {
  return low_bit_cast_supports(d, why);
}

Expected<std::unique_ptr<Layer>> create_cast_low_bit(const LayerDesc& d) {
  std::string why;
  if (!low_bit_cast_supports(d, &why)) return KILN_ERROR("{}: {}", d.node->label(), why);
  return std::unique_ptr<Layer>(new LowBitCastLayer(d));
}

}  // namespace kiln::gpu::ew
