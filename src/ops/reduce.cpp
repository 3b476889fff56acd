// Placeholder family table; filled in by the op family's implementation.
#include "ops/op.h"

namespace kiln {

std::span<const OpDef> reduce_ops() { return {}; }

}  // namespace kiln
