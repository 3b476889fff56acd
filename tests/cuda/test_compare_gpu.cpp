// kiln compare --per-layer on the GPU (the acceptance test of issue 9): a CUDA engine built from
// a graph whose one conv's weights were perturbed is compared layer by layer with the float64
// CPU reference of the right graph, and the first jump must be that conv's layer. Also: debug
// tensors of a correct FP16/NHWC engine come back in logical layout and agree with the
// reference within FP16 error at every layer. Skips without a GPU.
#include <gtest/gtest.h>

#include "../compare/compare_test_net.h"
#include "backends/backend_info.h"
#include "compare/compare.h"
#include "kiln/engine.h"

namespace kiln {
namespace {

bool have_gpu() { return cuda_device_count() > 0; }

std::unique_ptr<Engine> build(std::unique_ptr<Graph> g, bool fp16, bool tf32) {
  BuildConfig c;
  c.backend = "cuda";
  c.fp16 = fp16;
  c.tf32 = tf32;
  c.min_shapes = {{"x", {1, 4, 12, 12}}};
  c.opt_shapes = {{"x", {2, 4, 12, 12}}};
  c.max_shapes = {{"x", {4, 4, 12, 12}}};
  auto e = Engine::build_from_graph(std::move(g), c, "net");
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

Expected<PerLayerReport> per_layer(const Engine& e) {
  KILN_ASSIGN_OR_RETURN(auto ref, Reference::from_graph(testnet::small_cnn()));
  const auto names = common_tensors(e.graph(), ref->graph());
  Tensor x = testnet::random_tensor({2, 4, 12, 12}, 7, 1.f);
  std::map<std::string, Tensor> ref_kept;
  KILN_RETURN_IF_ERROR(ref->run({{"x", x}}, names, &ref_kept).status());
  KILN_ASSIGN_OR_RETURN(auto ctx, e.create_context());
  KILN_RETURN_IF_ERROR(ctx->set_debug_tensors(names));
  KILN_RETURN_IF_ERROR(ctx->execute({{"x", x}}).status());
  if (ctx->debug_tensors().size() != names.size())
    return KILN_ERROR("{} debug tensors asked, {} came back", names.size(), ctx->debug_tensors().size());
  return localise_error(e.graph(), ctx->debug_tensors(), ref_kept, default_jump_floor(e));
}

TEST(CudaComparePerLayer, NamesTheCorruptedLayer) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  for (bool fp16 : {false, true})
    for (const std::string bad : {"conv1", "conv2", "conv3"}) {
      auto e = build(testnet::small_cnn(bad), fp16, /*tf32=*/true);
      ASSERT_TRUE(e);
      auto rep = per_layer(*e);
      ASSERT_TRUE(rep.ok()) << rep.status().message();
      ASSERT_GE(rep->first_jump, 0) << bad << (fp16 ? " fp16" : " tf32");
      const LayerError& j = rep->layers[rep->first_jump];
      EXPECT_EQ(j.layer, bad) << (fp16 ? "fp16" : "tf32") << ": tensor " << j.tensor
                              << " rel_l2 " << j.m.rel_l2;
    }
}

TEST(CudaComparePerLayer, CorrectEngineHasNoJumpAndLogicalLayout) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  for (bool fp16 : {false, true}) {
    auto e = build(testnet::small_cnn(), fp16, /*tf32=*/false);  // strict FP32 or FP16
    ASSERT_TRUE(e);
    auto rep = per_layer(*e);
    ASSERT_TRUE(rep.ok()) << rep.status().message();
    EXPECT_EQ(rep->first_jump, -1);
    EXPECT_GE(rep->layers.size(), 4u);
    // FP16 storage (NHWC for the convs) converted back: FP16-sized errors, not garbage.
    for (const auto& l : rep->layers) EXPECT_LT(l.m.rel_l2, fp16 ? 1e-2 : 1e-4) << l.tensor;
  }
}

}  // namespace
}  // namespace kiln
