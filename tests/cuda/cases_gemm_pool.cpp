#include "backend_ops.h"

namespace kiln::gpu::test {

std::vector<OpCase> gemm_pool_cases() { return {}; }

}  // namespace kiln::gpu::test
