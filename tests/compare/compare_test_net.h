// A small CNN built in code for the per-layer comparison tests (CPU here, GPU in tests/cuda):
// x [N,4,12,12] -> conv1+relu -> conv2+relu -> conv3+relu -> GlobalAveragePool -> Flatten
// -> Gemm -> y [N,10]. `corrupt` names a conv ("conv1", "conv2", "conv3") whose weights get
// noise of half their own scale: the engine built from that graph is wrong from that layer on.
#pragma once

#include <random>
#include <string>

#include "ir/graph.h"
#include "ops/op.h"

namespace kiln::testnet {

inline Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

inline std::unique_ptr<Graph> small_cnn(const std::string& corrupt = "") {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 4, 12, 12}));
  g->add_input(x);
  Value* h = x;
  const int64_t chans[] = {4, 16, 16, 16};
  for (int i = 1; i <= 3; ++i) {
    const std::string name = "conv" + std::to_string(i);
    Tensor w = random_tensor({chans[i], chans[i - 1], 3, 3}, 10 + i, 0.4f);
    if (name == corrupt) {
      Tensor noise = random_tensor(w.shape(), 99, 0.2f);
      for (int64_t k = 0; k < w.numel(); ++k) w.data<float>()[k] += noise.data<float>()[k];
    }
    Value* wv = g->add_constant(name + "_w", w);
    Value* bv = g->add_constant(name + "_b", random_tensor({chans[i]}, 20 + i, 0.1f));
    Node* c = g->add_node("Conv", name, {h, wv, bv}, {name + "_out"});
    c->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
    h = g->add_node("Relu", "relu" + std::to_string(i), {c->output(0)},
                    {"relu" + std::to_string(i) + "_out"})
            ->output(0);
  }
  h = g->add_node("GlobalAveragePool", "gap", {h}, {"gap_out"})->output(0);
  h = g->add_node("Flatten", "flatten", {h}, {"flat"})->output(0);
  Value* fw = g->add_constant("fc_w", random_tensor({10, 16}, 30, 0.5f));
  Value* fb = g->add_constant("fc_b", random_tensor({10}, 31, 0.1f));
  Node* fc = g->add_node("Gemm", "fc", {h, fw, fb}, {"y"});
  fc->attrs.set("transB", Attribute::Int(1));
  g->add_output(fc->output(0));
  (void)infer_shapes(*g);
  return g;
}

}  // namespace kiln::testnet
