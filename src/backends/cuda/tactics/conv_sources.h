// Factories for the library paths; make_conv_tactic_sources() lists those compiled in.
#pragma once

#include <memory>

#include "conv_tactic.h"

namespace kiln::cuda {

class DeviceBuffer;

// Every tactic keeps its own device copy of the KRSC weights (prepare_weights): allocate `dst`
// and copy the problem's K*R*S*C elements into it on `stream`.
Status copy_weights_krsc(DeviceBuffer& dst, const ConvProblem& problem, const void* weights,
                         cudaStream_t stream);

// For library paths with only a scalar alpha and no fused epilogue (cuDNN legacy, CUTLASS's
// two scalar-epilogue tiles): the INT8 problems they take are y = int8 sat(rne(alpha * acc)), i.e. the
// per-tensor path or one scale for all channels, no bias/residual/ReLU, int8 output. Returns
// false with the reason otherwise; *alpha = int8_scale or channel_scale[0] / output_scale.
bool int8_scalar_alpha(const ConvProblem& p, float* alpha, std::string* why);

std::unique_ptr<ConvTacticSource> make_cudnn_graph_source();
std::unique_ptr<ConvTacticSource> make_cudnn_legacy_source();
std::unique_ptr<ConvTacticSource> make_cublaslt_source();
#if KILN_HAVE_CUTLASS
std::unique_ptr<ConvTacticSource> make_cutlass_sm90_source();
std::unique_ptr<ConvTacticSource> make_cutlass_sm90_gemm_source();
std::unique_ptr<ConvTacticSource> make_cutlass_sm90_pconv_source();
#endif

}  // namespace kiln::cuda
