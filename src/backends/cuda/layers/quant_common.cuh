// QuantizeLinear / DequantizeLinear helpers shared by reduce_misc.cu (integer targets) and
// quant_low_bit.cu (float8 and int4/uint4): which scale/zero-point element each element of x
// uses, and integer zero points read on the device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

// An integer zero point (any integer storage type), or 0 when absent.
struct ZeroPoint {
  const void* p = nullptr;
  DataType t = DataType::kUndefined;
  __device__ int64_t get(int64_t i) const {
    switch (t) {
      case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
      case DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
      case DataType::kInt16: return static_cast<const int16_t*>(p)[i];
      case DataType::kUInt16: return static_cast<const uint16_t*>(p)[i];
      case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
      case DataType::kUInt32: return static_cast<const uint32_t*>(p)[i];
      case DataType::kInt64: return static_cast<const int64_t*>(p)[i];
      case DataType::kUInt64: return static_cast<int64_t>(static_cast<const uint64_t*>(p)[i]);
      default: return 0;
    }
  }
};

// Which scale/zero-point element an element of x uses: per tensor, per `axis`, or per block
// of `block` along `axis` (the scale then has x's shape with that axis ceil(D / block)).
struct QuantGeom {
  int mode = 0;  // 0 per tensor, 1 per axis, 2 blocked
  int64_t D = 1, inner = 1, block = 1, nb = 1;
  __device__ int64_t param(int64_t i) const {
    if (mode == 0) return 0;
    const int64_t j = (i / inner) % D;
    if (mode == 1) return j;
    return ((i / (inner * D)) * nb + j / block) * inner + i % inner;
  }
};

inline Expected<QuantGeom> quant_geom(const std::vector<int64_t>& xs, const DeviceTensor& scale,
                               const DeviceTensor* zp, const Node& n) {
  if (zp && zp->shape != scale.shape && !(zp->numel() == 1 && scale.numel() == 1))
    return KILN_ERROR("{}: zero point shape {} differs from scale shape {}", n.label(),
                      shape_str(zp->shape), shape_str(scale.shape));
  QuantGeom q;
  if (scale.numel() == 1 && scale.rank() <= 1) return q;
  const int64_t rank = static_cast<int64_t>(xs.size());
  const int64_t block = n.attrs.get_int("block_size", 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 1), rank, n));
  q.D = xs[axis];
  for (int64_t d = axis + 1; d < rank; ++d) q.inner *= xs[d];
  if (block <= 0) {
    if (block < 0 || scale.rank() != 1 || scale.shape[0] != q.D)
      return KILN_ERROR("{}: per-axis scale must be 1-D of length {}, got {}", n.label(), q.D,
                        shape_str(scale.shape));
    q.mode = 1;
    return q;
  }
  std::vector<int64_t> want = xs;
  want[axis] = (q.D + block - 1) / block;
  if (scale.shape != want)
    return KILN_ERROR("{}: blocked scale shape {} should be {}", n.label(), shape_str(scale.shape),
                      shape_str(want));
  q.mode = 2;
  q.block = block;
  q.nb = want[axis];
  return q;
}

// quant_low_bit.cu: float8 and int4/uint4 targets (QuantizeLinear) and inputs (DequantizeLinear).
bool quant_low_bit_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_quant_low_bit(const LayerDesc& d);

}  // namespace kiln::gpu
