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

std::unique_ptr<ConvTacticSource> make_cudnn_graph_source();
std::unique_ptr<ConvTacticSource> make_cudnn_legacy_source();
std::unique_ptr<ConvTacticSource> make_cublaslt_source();
#if KILN_HAVE_CUTLASS
std::unique_ptr<ConvTacticSource> make_cutlass_sm90_source();
#endif

}  // namespace kiln::cuda
