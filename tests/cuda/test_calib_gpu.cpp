// Calibration on the GPU (quant::engine_activation_source) against calibration on the CPU
// reference: the same data through the same fused graph must give the same scales.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "../compare/compare_test_net.h"
#include "backends/backend_info.h"
#include "core/npy.h"
#include "kiln/engine.h"
#include "passes/pipeline.h"
#include "quant/calibrator.h"
#include "quant/int8.h"

namespace kiln {
namespace {

class MemoryCalibData final : public quant::CalibData {
 public:
  explicit MemoryCalibData(size_t n) {
    for (size_t i = 0; i < n; ++i)
      feeds_.push_back({{"x", testnet::random_tensor({3, 4, 12, 12}, 1000 + i, 1.f)}});
  }
  size_t size() const override { return feeds_.size(); }
  Expected<std::vector<quant::Feed>> batch(size_t i) const override {
    return std::vector<quant::Feed>{feeds_[i]};
  }

 private:
  std::vector<quant::Feed> feeds_;
};

TEST(CalibrationGpu, ScalesMatchTheCpuReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto g = testnet::small_cnn();
  OptimizeOptions opt;
  opt.backend = "cuda";
  ASSERT_TRUE(optimize_graph(*g, opt).ok());
  std::vector<std::string> names;
  for (const Value* v : quant::calibration_tensors(*g)) names.push_back(v->name);
  ASSERT_GE(names.size(), 3u);
  const MemoryCalibData data(4);
  for (auto algo : {quant::CalibAlgo::kMinMax, quant::CalibAlgo::kEntropy}) {
    const quant::CalibOptions o{algo, 99.99, nullptr, {}};
    auto cpu = quant::cpu_activation_source(*g);
    auto gpu = quant::engine_activation_source(*g, names);
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    auto want = quant::calibrate(**cpu, names, data, 0, data.size(), o);
    auto got = quant::calibrate(**gpu, names, data, 0, data.size(), o);
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), want->size()) << quant::calib_algo_name(algo);
    // Min/max sees float32 sums in another order (1e-5); entropy may move a threshold by a bin
    // of 2048 where a value sits on a bin edge.
    const double tol = algo == quant::CalibAlgo::kMinMax ? 1e-4 : 2e-2;
    for (const auto& [name, s] : *want) {
      ASSERT_TRUE(got->count(name)) << name;
      EXPECT_NEAR(got->at(name), s, tol * s) << quant::calib_algo_name(algo) << " " << name;
    }
  }
}

// One calibration cache serves a model's INT8 builds whatever float precision surrounds the INT8
// layers: the cache is keyed by the model optimized at FP32, where calibration runs.
TEST(CalibrationGpu, OneCacheServesFp32Fp16AndBestBuilds) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln_calib_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "data");
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(write_npy((dir / "data" / (std::to_string(i) + ".npy")).string(),
                          testnet::random_tensor({3, 4, 12, 12}, 1000 + i, 1.f))
                    .ok());
  const std::string cache = (dir / "c.cache").string();
  auto build = [&](bool fp16, bool with_data, const std::string& pin) -> Expected<std::string> {
    BuildConfig c;
    c.backend = "cuda";
    c.int8 = true;
    c.fp16 = fp16;
    c.shapes["x"] = {3, 4, 12, 12};
    c.calib_cache = cache;
    if (with_data) c.calib_data[""] = (dir / "data").string();
    if (!pin.empty()) c.layer_precisions[pin] = "fp32";
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::build_from_graph(testnet::small_cnn(), c, "cnn"));
    const auto o = nlohmann::json::parse(e->build_options_json());
    return o["int8"].value("scales", "");
  };
  auto first = build(false, true, "");  // --int8: calibrates, writes the cache
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->rfind("calibrated", 0), 0u) << *first;
  for (const auto& [fp16, pin] : std::vector<std::pair<bool, std::string>>{{true, ""}, {true, "conv2"}, {false, "conv1"}}) {
    auto again = build(fp16, false, pin);  // --int8 --fp16 (--best), pins: the cache alone
    ASSERT_TRUE(again.ok()) << "fp16 " << fp16 << " pin '" << pin << "': " << again.status().message();
    EXPECT_EQ(*again, "cache " + cache);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
