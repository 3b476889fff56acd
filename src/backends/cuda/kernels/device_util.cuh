// Shared device-side helpers for kiln's own kernels: element types, type dispatch, strided index
// arithmetic and launch shapes. Included by the .cu files in layers/ only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kiln/status.h"
#include "kiln/types.h"

namespace kiln::gpu {

// --- element types ------------------------------------------------------------------------------
// The device type of each DataType: __half and __nv_bfloat16 for the 16-bit floats.
// Arithmetic on 16-bit floats happens in float: use Compute<T>, load(), store().
template <typename T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<__half> { using type = float; };
template <> struct ComputeOf<__nv_bfloat16> { using type = float; };
template <typename T> using Compute = typename ComputeOf<T>::type;

template <typename T>
__device__ __forceinline__ Compute<T> load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(p[i]);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(p[i]);
  else return p[i];
}
template <typename T, typename V>
__device__ __forceinline__ void store(T* p, int64_t i, V v) {
  if constexpr (std::is_same_v<T, __half>) p[i] = __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) p[i] = __float2bfloat16_rn(static_cast<float>(v));
  else p[i] = static_cast<T>(v);
}
// 16 bytes of T, loaded or stored as one vector (the address 16-byte aligned).
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};
// float16 -inf in both halves (a max-pool's padding).
__device__ __forceinline__ __half2 half2_neg_inf() {
  const __half h = __ushort_as_half(0xFC00u);
  return __halves2half2(h, h);
}

template <typename T> constexpr bool is_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// Calls f(T{}) with T the device type of `t`. Returns false for a type it does not know.
template <typename F>
bool dispatch_dtype(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat32: f(float{}); return true;
    case DataType::kFloat64: f(double{}); return true;
    case DataType::kFloat16: f(__half{}); return true;
    case DataType::kBFloat16: f(__nv_bfloat16{}); return true;
    case DataType::kInt8: f(int8_t{}); return true;
    case DataType::kUInt8: f(uint8_t{}); return true;
    case DataType::kInt16: f(int16_t{}); return true;
    case DataType::kUInt16: f(uint16_t{}); return true;
    case DataType::kInt32: f(int32_t{}); return true;
    case DataType::kUInt32: f(uint32_t{}); return true;
    case DataType::kInt64: f(int64_t{}); return true;
    case DataType::kUInt64: f(uint64_t{}); return true;
    case DataType::kBool: f(bool{}); return true;
    default: return false;
  }
}
// Only the float types (float32, float16, bfloat16, float64).
template <typename F>
bool dispatch_float(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat32: f(float{}); return true;
    case DataType::kFloat64: f(double{}); return true;
    case DataType::kFloat16: f(__half{}); return true;
    case DataType::kBFloat16: f(__nv_bfloat16{}); return true;
    default: return false;
  }
}
// By element size only (data movement does not care what the bits mean).
template <typename F>
bool dispatch_bytes(size_t size, F&& f) {
  switch (size) {
    case 1: f(uint8_t{}); return true;
    case 2: f(uint16_t{}); return true;
    case 4: f(uint32_t{}); return true;
    case 8: f(uint64_t{}); return true;
    default: return false;
  }
}

// Calls f(U{}) with U an unsigned type (or uint4) of `unit` bytes.
template <typename F>
void dispatch_unit(size_t unit, F&& f) {
  switch (unit) {
    case 16: f(uint4{}); break;
    case 8: f(uint2{}); break;
    case 4: f(uint32_t{}); break;
    case 2: f(uint16_t{}); break;
    default: f(uint8_t{}); break;
  }
}

// A float parameter tensor (scale, bias, mean, var, ...) read on the device at its own storage
// type, whatever the layer's activations are stored in.
struct ParamPtr {
  const void* p = nullptr;
  DataType t = DataType::kUndefined;
  template <typename A>
  __device__ A get(int64_t i) const {
    switch (t) {
      case DataType::kFloat16:
        return static_cast<A>(__half2float(static_cast<const __half*>(p)[i]));
      case DataType::kBFloat16:
        return static_cast<A>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
      case DataType::kFloat64: return static_cast<A>(static_cast<const double*>(p)[i]);
      default: return static_cast<A>(static_cast<const float*>(p)[i]);
    }
  }
};

// --- strided indexing ----------------------------------------------------------------------------
// Up to kMaxDims dimensions, passed to kernels by value. `offset(i)` maps the linear index of an
// element of the iteration space (row-major over `dims`) to sum(coord[d] * stride[d]).
constexpr int kMaxDims = 8;
struct StridedIndex {
  int rank = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  __host__ __device__ int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t c = i % dims[d];
      i /= dims[d];
      off += c * strides[d];
    }
    return off;
  }
};
// Host side: strides of a tensor of `in_shape` broadcast to `out_shape` (0 on broadcast axes),
// for the element order of `out_shape`. Both shapes are right-aligned (numpy rules).
StridedIndex broadcast_index(const std::vector<int64_t>& in_shape,
                             const std::vector<int64_t>& out_shape);
// Row-major element strides of a shape.
std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape);
// Merges adjacent dimensions that are contiguous in every operand, so that most broadcasts run
// as 1-3 dimensional loops. `strides[k]` are operand k's strides over `dims` (modified in place).
void coalesce_dims(std::vector<int64_t>& dims, std::vector<std::vector<int64_t>>& strides);

// --- launch shapes -------------------------------------------------------------------------------
constexpr int kBlock = 256;
// A grid for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_for(int64_t n, int block = kBlock) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}
#define KILN_GRID_STRIDE(i, n)                                              \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

}  // namespace kiln::gpu
