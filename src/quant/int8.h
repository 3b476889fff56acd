// kiln's INT8 representation (docs/quantization.md), shared by the CPU reference, the build
// and (later) the GPU INT8 tactics:
//
//   Value::quant_scales / quant_axis   a tensor's symmetric scale (real = int8 * scale): one per
//                                      tensor for activations, one per output channel for the
//                                      weights of an INT8 layer
//   node attribute  int8 = 1           this layer runs in INT8 (kiln.FusedConv / kiln.FusedGemm,
//                                      kiln.FusedConvPool: a stem whose max-pool follows its
//                                      epilogue, and kiln.FusedConvPair made from two of them):
//                                      X (input 0) is quantized with its value's scale, W
//                                      (input 1, a float constant) per output channel, int32
//                                      accumulation, dequantized by sx * sw[c]; bias, residual
//                                      (quantized on read when its value has a scale) and
//                                      activation in float; the output is requantized when its
//                                      value has a scale, else it stays float. A FusedConvPair's
//                                      second convolution reads X2 (input 3, per-tensor scale)
//                                      and W2 (input 4, per output channel) the same way, and
//                                      its dequantized result (+ B2) is added to the first's in
//                                      float, in place of a residual
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln::quant {

// int8 of v / scale: IEEE float32 division, round half to even, saturate to [-128, 127]; NaN
// gives 0 (as ONNX QuantizeLinear).
int8_t quantize_value(float v, float scale);

// The axis of W that holds the output channels of `n` (Conv/FusedConv/FusedConvPool/FusedConvPair:
// 0, for W2 too; Gemm: transB ? 0 : 1; MatMul: the last), or -1 when `n` is not a conv/gemm-like
// layer.
int64_t weight_channel_axis(const Node& n);

// Symmetric per-channel scales of a float weight: amax over everything but `axis`, / 127 (a
// channel of zeros gets scale 1).
std::vector<float> weight_scales(const Tensor& w, int64_t axis);

// W quantized to int8 per channel along `axis` (scales: one per channel, or one for all).
Tensor quantize_weights(const Tensor& w, const std::vector<float>& scales, int64_t axis);

// Why node `n` cannot run in INT8 ("" when it can): conv/gemm-like with a float32 X carrying a
// per-tensor scale and a constant float32 W (scales, if any, per output channel); for a
// FusedConvPair also X2 (input 3) and W2 (input 4) likewise.
std::string int8_blocker(const Node& n);

// Whether a layer runs in INT8 (attribute int8 = 1).
bool runs_int8(const Node& n);

struct Int8Summary {
  std::vector<std::string> int8_layers;             // names, in graph order
  std::map<std::string, std::string> float_layers;  // capable-looking layers left float: why
};

// Marks the layers that run in INT8: every conv/gemm-like node that can (int8_blocker) and is
// not pinned to fp32/fp16 in `pins` (node name -> precision). Plain Conv/Gemm/MatMul become
// kiln.FusedConv / kiln.FusedGemm; weights without scales get per-channel scales from their
// values, unless `explicit_scales` (a Q/DQ model: only layers whose weights were quantized in
// the model run in INT8). Pairs (FusedConvPair) are formed after this from marked layers; one
// marked again gets W2's scales like W's.
Expected<Int8Summary> mark_int8_layers(Graph& g, const std::map<std::string, std::string>& pins,
                                       bool explicit_scales);

// The precision `pins` (--layer-precisions: node name -> fp32 | fp16 | int8, "*" for every layer
// not named) give layer `name`, or nullptr.
inline const std::string* layer_pin(const std::map<std::string, std::string>& pins,
                                    const std::string& name) {
  auto it = pins.find(name);
  if (it == pins.end()) it = pins.find("*");
  return it == pins.end() ? nullptr : &it->second;
}

// Sets per-tensor scales from `scales` (value name -> scale) on the graph's float activations,
// except graph outputs (a network's outputs stay float). Names the graph lacks are ignored.
void apply_activation_scales(Graph& g, const std::map<std::string, float>& scales);

// The activations calibration measures: non-constant float32 values, graph outputs excluded.
std::vector<const Value*> calibration_tensors(const Graph& g);

// The network's inputs and the values that are one of them moved or scaled: through Reshape,
// Flatten, Squeeze, Unsqueeze, Transpose and Identity, and Add, Sub, Mul and Div by constants
// (also as a kiln.ElementwiseChain of them). Calibration takes these at their full range
// (CalibOptions::full_range). A Keras model normalizes its image inside the network (a
// Rescaling layer: Mul, Add) and tf2onnx turns its NHWC input to NCHW (Transpose, or Reshape
// for one channel), so its first convolution reads such a value, not the input itself.
std::set<std::string> input_like_values(const Graph& g);

}  // namespace kiln::quant
