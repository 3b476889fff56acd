// The fused activation of a FusedGemm as the CUTLASS GEMMs' epilogue names it (gemm_cutlass.cpp,
// gemm_int8_cutlass.cpp): none, erf or tanh GELU, Swish (x * sigmoid(alpha x): SiLU, CLIP's
// quick GELU); false for any other.
#pragma once

#include <string>

#include "ir/graph.h"
#include "tactics/cutlass_gemm_f16.h"

namespace kiln::gpu {

inline bool cutlass_gemm_act(const Node& n, cuda::F16GemmAct* act) {
  const std::string a = n.attrs.get_string("activation", "");
  if (a.empty())
    *act = cuda::F16GemmAct::kNone;
  else if (a == "Gelu")
    *act = n.attrs.get_string("act_approximate", "none") == "tanh" ? cuda::F16GemmAct::kGeluTanh
                                                                   : cuda::F16GemmAct::kGelu;
  else if (a == "Swish")
    *act = cuda::F16GemmAct::kSwish;
  else
    return false;
  return true;
}

}  // namespace kiln::gpu
