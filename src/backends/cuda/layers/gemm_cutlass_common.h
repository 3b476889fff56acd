// What the FusedGemm layers on CUTLASS's Hopper GEMMs share (gemm_cutlass.cpp,
// gemm_int8_cutlass.cpp): the fused activation as their epilogues name it, and the tile a shape
// runs.
#pragma once

#include <string>

#include "device_util_host.h"
#include "ir/graph.h"
#include "tactics/cutlass_gemm_f16.h"

namespace kiln::gpu {

// None, erf or tanh GELU, Swish (x * sigmoid(alpha x): SiLU, CLIP's quick GELU); false for any
// other.
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

// The tile an M x N product runs: the variant's, but where the cooperative 256 x 128 tile would
// not give every SM a tile (a dynamic engine at batch 1), the ping-pong 128 x 64 one, four times
// as many.
inline std::string cutlass_tile_at(const std::string& tile, int64_t M, int64_t N) {
  const int64_t big_tiles = (M + 255) / 256 * ((N + 127) / 128);
  return tile == "coop256x128" && big_tiles < sm_count() ? "pp128x64" : tile;
}

}  // namespace kiln::gpu
