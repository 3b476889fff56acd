// INT8 on the CUDA backend end to end (docs/quantization.md): a small CNN calibrated and built
// with --int8 for the cuda backend runs its convolutions and its FC in INT8 tactics (the plan
// says precision int8) and agrees with the CPU backend's INT8 engine (the reference arithmetic)
// to within int8 rounding; the engine survives save/load (the reformats keep their scales); a
// layer no INT8 tactic takes (a 3-channel stem) falls back to float. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../compare/compare_test_net.h"
#include "backends/backend_info.h"
#include "core/npy.h"
#include "kiln/engine.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

bool have_gpu() { return cuda_device_count() > 0; }

// Four calibration batches of x [2,4,12,12] in a fresh folder.
std::string calibration_dir() {
  const fs::path dir = fs::temp_directory_path() / "kiln_int8_engine_calib";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(write_npy((dir / (std::to_string(i) + ".npy")).string(),
                          testnet::random_tensor({2, 4, 12, 12}, 100 + i, 1.f))
                    .ok());
  return dir.string();
}

std::unique_ptr<Engine> build(std::unique_ptr<Graph> g, const std::string& backend, bool fp16,
                              bool tune, const std::string& calib) {
  BuildConfig c;
  c.backend = backend;
  c.int8 = true;
  c.fp16 = fp16;
  c.tune = tune;
  c.calib_data = {{"", calib}};
  // The cuda build calibrates on the GPU, the cpu build on the CPU: minmax keeps their scales
  // equal to the last bit or two (entropy's threshold could move by a histogram bin).
  c.calib_algo = "minmax";
  c.shapes = {{"x", {2, 4, 12, 12}}};
  auto e = Engine::build_from_graph(std::move(g), c, "net");
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

Tensor run(const Engine& e, const Tensor& x) {
  auto ctx = e.create_context();
  EXPECT_TRUE(ctx.ok()) << ctx.status().message();
  if (!ctx.ok()) return Tensor();
  auto out = (*ctx)->execute({{"x", x}});
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? (*out)[0] : Tensor();
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = a.at_double(i) - b.at_double(i);
    num += d * d;
    den += b.at_double(i) * b.at_double(i);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Tactic name -> precision of each GPU layer of the engine's plan, and the count of INT8 layers.
int int8_layers(const Engine& e, std::string* listing) {
  const auto plan = nlohmann::json::parse(e.backend_plan_json());
  int n = 0;
  for (size_t k = 0; k < plan["layers"].size(); ++k) {
    const auto& r = plan["layers"][k];
    if (r.value("tactic", "") == "host") continue;
    *listing += e.graph().nodes()[k]->name + ":" + r.value("tactic", "") + "/" +
                r.value("precision", "") + " ";
    if (r.value("precision", "") == "int8") ++n;
  }
  return n;
}

TEST(CudaInt8Engine, MatchesTheCpuInt8Engine) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  const std::string calib = calibration_dir();
  auto cpu = build(testnet::small_cnn(), "cpu", false, false, calib);
  ASSERT_TRUE(cpu);
  const Tensor x = testnet::random_tensor({2, 4, 12, 12}, 7, 1.f);
  const Tensor ref = run(*cpu, x);
  for (bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16 ? "--fp16" : "tf32");
    // Untuned: every layer an INT8 tactic takes runs in INT8 (three convs and the FC).
    auto gpu = build(testnet::small_cnn(), "cuda", fp16, /*tune=*/false, calib);
    ASSERT_TRUE(gpu);
    std::string listing;
    EXPECT_EQ(int8_layers(*gpu, &listing), 4) << listing;
    const Tensor got = run(*gpu, x);
    // Same arithmetic: only the float layer between (GAP: another summation order, float16
    // storage with --fp16) may move a code of the FC's input by one.
    const double err = rel_l2(got, ref);
    std::cout << "[ int8     ] cuda vs cpu INT8 engine, relative L2 " << err << " (" << listing
              << ")\n";
    EXPECT_LT(err, fp16 ? 1e-2 : 2e-3);
    // Saved and loaded: the plan's int8 formats and the reformats' scales come back.
    const std::string path = (fs::temp_directory_path() / "kiln_int8_engine.kiln").string();
    ASSERT_TRUE(gpu->save(path).ok());
    auto loaded = Engine::load(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    const Tensor again = run(**loaded, x);
    EXPECT_EQ(rel_l2(again, got), 0.0);
  }
  // Tuned: INT8 where it is faster, float elsewhere; the result stays an INT8-accurate one.
  auto tuned = build(testnet::small_cnn(), "cuda", true, /*tune=*/true, calib);
  ASSERT_TRUE(tuned);
  std::string listing;
  const int n = int8_layers(*tuned, &listing);
  std::cout << "[ int8     ] tuned: " << n << " INT8 layers (" << listing << ")\n";
  EXPECT_LT(rel_l2(run(*tuned, x), ref), 5e-2);
}

TEST(CudaInt8Engine, ThreeChannelStemFallsBackToFloat) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, 3, 12, 12}));
  g->add_input(x);
  Value* w = g->add_constant("w", testnet::random_tensor({8, 3, 3, 3}, 5, 0.5f));
  Node* c = g->add_node("Conv", "stem", {x, w}, {"y"});
  c->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
  g->add_output(c->output(0));
  ASSERT_TRUE(infer_shapes(*g).ok());
  const fs::path dir = fs::temp_directory_path() / "kiln_int8_stem_calib";
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_TRUE(
      write_npy((dir / "0.npy").string(), testnet::random_tensor({2, 3, 12, 12}, 1, 1.f)).ok());
  BuildConfig cfg;
  cfg.backend = "cuda";
  cfg.int8 = true;
  cfg.tune = false;
  cfg.calib_data = {{"", dir.string()}};
  auto e = Engine::build_from_graph(std::move(g), cfg, "stem");
  ASSERT_TRUE(e.ok()) << e.status().message();
  std::string listing;
  EXPECT_EQ(int8_layers(**e, &listing), 0) << listing;
  EXPECT_NE(listing.find("stem:"), std::string::npos) << listing;
  EXPECT_EQ(listing.find("conv_int8"), std::string::npos) << listing;
}

}  // namespace
}  // namespace kiln
