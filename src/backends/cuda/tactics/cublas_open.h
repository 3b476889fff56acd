// cuBLAS and cuBLASLt are opened at their first call (cublas_open.cpp), not when kiln loads.
#pragma once

#include <string>

namespace kiln::gpu {

// Why cuBLASLt or cuBLAS could not be opened (dlopen's message); empty when both were, or when
// neither has been called yet.
std::string cublas_open_error();

}  // namespace kiln::gpu
