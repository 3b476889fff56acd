// (family under construction: its tactics are being written)
#include "tactics.h"

namespace kiln::gpu {

std::span<const TacticDef> gemm_tactics() { return {}; }

}  // namespace kiln::gpu
