// Every distinct convolution of ResNet-50 (torchvision v1.5: the stride sits on the 3x3 conv of
// each stage's first block), for a 224x224 input. `count` is how often the layer occurs in the
// 53 convolutions of the network; the epilogue is what follows it once BatchNorm is folded.
#pragma once

#include "tactics/conv_tactic.h"

namespace kiln::bench {

struct ResNetConv {
  const char* name;
  int c, hw, k, rs, stride, pad;
  int count;
  cuda::Epilogue epilogue;
};

using cuda::Epilogue;
// clang-format off
inline constexpr ResNetConv kResNet50Convs[] = {
    // name        C    H/W   K    R  str pad count epilogue
    {"conv1",      3,   224,  64,  7, 2, 3, 1, Epilogue::kBiasRelu},
    {"l1.c1",      64,  56,   64,  1, 1, 0, 1, Epilogue::kBiasRelu},     // block 1 reduce
    {"l1.c2",      64,  56,   64,  3, 1, 1, 3, Epilogue::kBiasRelu},
    {"l1.c3",      64,  56,   256, 1, 1, 0, 3, Epilogue::kBiasAddRelu},  // expand + residual
    {"l1.ds",      64,  56,   256, 1, 1, 0, 1, Epilogue::kBias},         // downsample (s1 here)
    {"l1.c1b",     256, 56,   64,  1, 1, 0, 2, Epilogue::kBiasRelu},     // blocks 2-3 reduce
    {"l2.c1",      256, 56,   128, 1, 1, 0, 1, Epilogue::kBiasRelu},
    {"l2.c2s",     128, 56,   128, 3, 2, 1, 1, Epilogue::kBiasRelu},     // strided 3x3
    {"l2.ds",      256, 56,   512, 1, 2, 0, 1, Epilogue::kBias},
    {"l2.c3",      128, 28,   512, 1, 1, 0, 4, Epilogue::kBiasAddRelu},
    {"l2.c1b",     512, 28,   128, 1, 1, 0, 3, Epilogue::kBiasRelu},
    {"l2.c2",      128, 28,   128, 3, 1, 1, 3, Epilogue::kBiasRelu},
    {"l3.c1",      512, 28,   256, 1, 1, 0, 1, Epilogue::kBiasRelu},
    {"l3.c2s",     256, 28,   256, 3, 2, 1, 1, Epilogue::kBiasRelu},
    {"l3.ds",      512, 28,   1024, 1, 2, 0, 1, Epilogue::kBias},
    {"l3.c3",      256, 14,   1024, 1, 1, 0, 6, Epilogue::kBiasAddRelu},
    {"l3.c1b",     1024, 14,  256, 1, 1, 0, 5, Epilogue::kBiasRelu},
    {"l3.c2",      256, 14,   256, 3, 1, 1, 5, Epilogue::kBiasRelu},
    {"l4.c1",      1024, 14,  512, 1, 1, 0, 1, Epilogue::kBiasRelu},
    {"l4.c2s",     512, 14,   512, 3, 2, 1, 1, Epilogue::kBiasRelu},
    {"l4.ds",      1024, 14,  2048, 1, 2, 0, 1, Epilogue::kBias},
    {"l4.c3",      512, 7,    2048, 1, 1, 0, 3, Epilogue::kBiasAddRelu},
    {"l4.c1b",     2048, 7,   512, 1, 1, 0, 2, Epilogue::kBiasRelu},
    {"l4.c2",      512, 7,    512, 3, 1, 1, 2, Epilogue::kBiasRelu},
};
// clang-format on

}  // namespace kiln::bench
