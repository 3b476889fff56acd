// Placeholder family table; filled in by the op family's implementation.
#include "ops/op.h"

namespace kiln {

std::span<const OpDef> quant_ops() { return {}; }

}  // namespace kiln
