#include "backend_ops.h"

namespace kiln::gpu::test {

std::vector<OpCase> reduce_cases() { return {}; }

}  // namespace kiln::gpu::test
