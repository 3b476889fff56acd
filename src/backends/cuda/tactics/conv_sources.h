// Factories for the library paths; make_conv_tactic_sources() lists those compiled in.
#pragma once

#include <memory>

#include "conv_tactic.h"

namespace kiln::cuda {

std::unique_ptr<ConvTacticSource> make_cudnn_graph_source();
std::unique_ptr<ConvTacticSource> make_cudnn_legacy_source();
std::unique_ptr<ConvTacticSource> make_cublaslt_source();
#if KILN_HAVE_CUTLASS
std::unique_ptr<ConvTacticSource> make_cutlass_sm90_source();
#endif

}  // namespace kiln::cuda
