// Out of GPU memory at build time: shapes whose activations cannot fit fail in seconds with one
// line naming what the build needs and what the GPU has; on a GPU another process has nearly
// filled, the error says out of memory (never "every candidate tactic failed"). A layer that
// cannot fit the workspace limit (--mem-pool-size workspace:N) at the profile's shapes fails the
// build, even when it has one candidate and nothing is timed, never the engine's first run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "../compare/compare_test_net.h"
#include "backends/backend_info.h"
#include "kiln/engine.h"
#include "ops/op.h"

namespace kiln {
namespace {

// x [N,3,224,224] -> Conv 7x7/2 to 64 channels -> Relu: ResNet's stem.
std::unique_ptr<Graph> stem() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("input", TensorType(DataType::kFloat32, {Dim::sym("N"), 3, 224, 224}));
  g->add_input(x);
  Value* w = g->add_constant("w", testnet::random_tensor({64, 3, 7, 7}, 7, 0.1f));
  Node* conv = g->add_node("Conv", "conv", {x, w}, {"c"});
  conv->attrs.set("strides", Attribute::Ints({2, 2}));
  conv->attrs.set("pads", Attribute::Ints({3, 3, 3, 3}));
  conv->attrs.set("kernel_shape", Attribute::Ints({7, 7}));
  Node* relu = g->add_node("Relu", "relu", {conv->output(0)}, {"y"});
  g->add_output(relu->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

Status build_stem(int64_t batch, bool fp16) {
  BuildConfig c;
  c.backend = "cuda";
  c.fp16 = fp16;
  c.shapes["input"] = {batch, 3, 224, 224};
  return Engine::build_from_graph(stem(), c, "stem").status();
}

TEST(MemoryGpu, ShapesThatCannotFitFailInSeconds) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  for (bool fp16 : {false, true}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = build_stem(60000, fp16);  // the input alone is 33.6 GiB in FP32
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("out of GPU memory: building at input:60000x3x224x224 needs at least"),
              std::string::npos) << s.message();
    EXPECT_NE(s.message().find("GiB free of"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    EXPECT_LT(secs, 10.0) << "fp16 " << fp16;
  }
  EXPECT_TRUE(build_stem(8, true).ok());
}

TEST(MemoryGpu, NearlyFullGpuSaysOutOfMemory) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  ASSERT_TRUE(build_stem(1, true).ok());  // the CUDA context and libraries, before filling
  // Fill the GPU, as another process would, leaving 64 MiB.
  std::vector<void*> held;
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  for (size_t chunk = size_t(1) << 30; chunk >= (size_t(16) << 20);) {
    ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    if (free_b < (size_t(64) << 20) + chunk) {
      chunk /= 2;
      continue;
    }
    void* p = nullptr;
    if (cudaMalloc(&p, chunk) != cudaSuccess) {
      cudaGetLastError();
      chunk /= 2;
      continue;
    }
    held.push_back(p);
  }
  // Batch 64: 1.2 GiB of FP16 activations for the stem alone.
  const Status s = build_stem(64, true);
  for (void* p : held) cudaFree(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("out of GPU memory"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("every candidate tactic failed"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  EXPECT_TRUE(build_stem(64, true).ok());  // with the memory back, the same build succeeds
}

// kiln.Attention over `keys` keys: Q [1, 2, 4, 8], Kt [1, 2, 8, keys], V [1, 2, keys, 8].
Expected<std::unique_ptr<Engine>> build_attention(int64_t keys, size_t workspace_limit) {
  auto g = std::make_unique<Graph>();
  std::vector<Value*> ins;
  for (auto [name, shape] : {std::pair<const char*, std::vector<int64_t>>{"q", {1, 2, 4, 8}},
                             {"kt", {1, 2, 8, keys}},
                             {"v", {1, 2, keys, 8}}}) {
    ins.push_back(g->add_value(
        name, TensorType(DataType::kFloat32, std::vector<Dim>(shape.begin(), shape.end()))));
    g->add_input(ins.back());
  }
  Node* n = g->add_node("Attention", "attn", ins, {"y"}, "kiln");
  n->attrs.set("scale", Attribute::Float(0.35f));
  g->add_output(n->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  BuildConfig c;
  c.backend = "cuda";
  c.tf32 = false;
  c.workspace_limit = workspace_limit;
  return Engine::build_from_graph(std::move(g), c, "attention");
}

TEST(MemoryGpu, WorkspaceLimitIsCheckedAtBuild) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  // One query row's scores over 4096 keys are 16 KiB of float32: no chunk fits 8 KiB, and the
  // layer's only tactic, untimed, must still fail the build.
  auto refused = build_attention(4096, 8 << 10);
  ASSERT_FALSE(refused.ok());
  const std::string m = refused.status().message();
  EXPECT_NE(m.find("node 'attn' (Attention"), std::string::npos) << m;
  EXPECT_NE(m.find("attention.cublas"), std::string::npos) << m;
  EXPECT_NE(m.find("one query row's scores over 4096 keys need 16.0 KiB of workspace, over the "
                   "limit of 8.0 KiB"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  // 64 KiB holds 4 rows at a time: the layer runs in chunks.
  auto chunked = build_attention(4096, 64 << 10);
  ASSERT_TRUE(chunked.ok()) << chunked.status().message();
  auto ctx = (*chunked)->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  std::map<std::string, Tensor> feeds;
  feeds["q"] = Tensor(DataType::kFloat32, {1, 2, 4, 8});
  feeds["kt"] = Tensor(DataType::kFloat32, {1, 2, 8, 4096});
  feeds["v"] = Tensor(DataType::kFloat32, {1, 2, 4096, 8});
  for (auto& [name, t] : feeds)
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = 0.001f * static_cast<float>(i % 97);
  auto y = (*ctx)->execute(feeds);
  ASSERT_TRUE(y.ok()) << y.status().message();
}

}  // namespace
}  // namespace kiln
