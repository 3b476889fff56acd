// Numeric type facts shared by op families that are not otherwise related (Cast, quantization).
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln {

// The name of an ONNX TensorProto element type in the float8 / 4-bit / 2-bit range (17..26), so
// that refusals of those kiln cannot hold, so that refusals can name it; empty for any other number.
inline std::string_view onnx_low_bit_type_name(int64_t t) {
  switch (t) {
    case 17:
      return "float8e4m3fn";
    case 18:
      return "float8e4m3fnuz";
    case 19:
      return "float8e5m2";
    case 20:
      return "float8e5m2fnuz";
    case 21:
      return "uint4";
    case 22:
      return "int4";
    case 23:
      return "float4e2m1";
    case 24:
      return "float8e8m0";
    case 25:
      return "uint2";
    case 26:
      return "int2";
    default:
      return "";
  }
}

}  // namespace kiln
