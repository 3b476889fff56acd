// Calibrators (threshold choice), the calibration cache, and explicit Q/DQ mapping.
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/image.h"
#include "core/npy.h"
#include "passes/pass_test_util.h"
#include "quant/calib_io.h"
#include "quant/calibrator.h"
#include "quant/int8.h"
#include "quant/int8_build.h"

namespace kiln {
namespace {

using test::G;
using test::rand_t;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + std::to_string(getpid()))).string();
}

// A Gaussian bulk with a few far outliers: entropy clips the outliers, minmax cannot.
std::vector<double> gaussian_with_outliers(double* width) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<double> d(0, 1);
  std::vector<double> xs;
  for (int i = 0; i < 200000; ++i) xs.push_back(std::fabs(d(rng)));
  xs.push_back(40.0);
  xs.push_back(39.0);
  const double amax = 40.0;
  *width = amax / quant::kHistogramBins;
  std::vector<double> h(quant::kHistogramBins, 0.0);
  for (double x : xs) h[std::min<size_t>(static_cast<size_t>(x / *width), h.size() - 1)] += 1;
  return h;
}

TEST(Calibration, EntropyClipsOutliersButKeepsTheBulk) {
  double w = 0;
  const auto h = gaussian_with_outliers(&w);
  const double t = quant::entropy_threshold(h, w);
  EXPECT_LT(t, 10.0);  // far below the outliers at 40
  EXPECT_GT(t, 2.5);   // but keeps most of |N(0,1)|
}

TEST(Calibration, EntropyKeepsAUniformRange) {
  std::vector<double> h(quant::kHistogramBins, 100.0);
  const double t = quant::entropy_threshold(h, 1.0 / quant::kHistogramBins);
  EXPECT_GT(t, 0.9);  // no reason to clip data spread evenly up to its max
}

// A normalized Fashion-MNIST-like input: 60% background at -0.8, the rest spread up to 2.0.
// Entropy clips such a tensor near the background's magnitude (the clipped foreground lands in
// one bin, which KL cannot see); the network's input is therefore taken at its full range
// (CalibOptions::full_range), while the same values inside the network keep entropy's threshold.
TEST(Calibration, TheNetworksInputIsNeverClipped) {
  G b;
  Value* x = b.in("x", {4, 1, 28, 28});
  Value* copy = b.op("Mul", {x, b.cf(1.f)});
  b.out(b.op("Relu", {copy}));
  class Data final : public quant::CalibData {
   public:
    Data() {
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> fg(-0.8f, 2.0f), u(0.f, 1.f);
      for (int i = 0; i < 4; ++i) {
        Tensor t(DataType::kFloat32, {4, 1, 28, 28});
        for (int64_t k = 0; k < t.numel(); ++k) t.data<float>()[k] = u(rng) < 0.6f ? -0.8f : fg(rng);
        t.data<float>()[0] = 2.0f;  // the range's top, in every batch
        feeds_.push_back({{"x", std::move(t)}});
      }
    }
    size_t size() const override { return feeds_.size(); }
    Expected<std::vector<quant::Feed>> batch(size_t i) const override {
      return std::vector<quant::Feed>{feeds_[i]};
    }

   private:
    std::vector<quant::Feed> feeds_;
  } data;
  auto src = quant::cpu_activation_source(b.g);
  ASSERT_TRUE(src.ok()) << src.status().message();
  quant::CalibOptions o{quant::CalibAlgo::kEntropy, 99.99, nullptr, {"x"}};
  auto scales = quant::calibrate(**src, {"x", copy->name}, data, 0, data.size(), o);
  ASSERT_TRUE(scales.ok()) << scales.status().message();
  EXPECT_FLOAT_EQ(scales->at("x"), 2.0f / 127);            // full range
  EXPECT_LT(scales->at(copy->name), 0.8f * 2.0f / 127);     // entropy clips the same values
  // What kiln build does: the graph's inputs are full-range.
  o.full_range.clear();
  auto clipped = quant::calibrate(**src, {"x"}, data, 0, data.size(), o);
  ASSERT_TRUE(clipped.ok());
  EXPECT_LT(clipped->at("x"), scales->at("x"));
}

// A Keras model as tf2onnx converts it normalizes its NHWC image inside the network (Rescaling:
// Mul, Add) and moves it to NCHW (a Reshape for one channel, else a Transpose) before the first
// convolution: those values are the input too and get its full range; anything that mixes in
// another value or is not affine does not.
TEST(Calibration, InputLikeValuesFollowMovesAndAffineMaps) {
  G b;
  Value* x = b.in("x", {4, 28, 28, 1});
  Value* scaled = b.op("Mul", {x, b.cf(2.8f)});
  Value* shifted = b.op("Add", {b.cf(-0.8f), scaled});  // the constant first: still affine
  Value* nchw = b.op("Reshape", {shifted, b.c(test::ints({4, 1, 28, 28}))});
  Value* halved = b.op("Div", {nchw, b.cf(2.f)});
  Value* moved =
      b.op("Transpose", {halved}, test::attrs({{"perm", Attribute::Ints({0, 1, 3, 2})}}));
  Value* relu = b.op("Relu", {nchw});
  Value* inverse = b.op("Div", {b.cf(1.f), nchw});
  Value* square = b.op("Mul", {nchw, nchw});
  Value* sum = b.op("Add", {nchw, relu});
  for (Value* v : {moved, inverse, square, sum}) b.out(v);
  const std::set<std::string> like = quant::input_like_values(b.g);
  for (const Value* v : {x, scaled, shifted, nchw, halved, moved})
    EXPECT_TRUE(like.count(v->name)) << v->name;
  for (const Value* v : {relu, inverse, square, sum}) EXPECT_FALSE(like.count(v->name)) << v->name;

  // After the optimizer the Mul and Add are one kiln.ElementwiseChain: still the input.
  auto opt = test::optimize_checked(b.g, {"fuse_elementwise"});
  const Value* fused = opt->find_value(shifted->name);
  ASSERT_TRUE(fused && fused->producer);
  EXPECT_EQ(fused->producer->op_type, "ElementwiseChain");
  const std::set<std::string> like_opt = quant::input_like_values(*opt);
  EXPECT_TRUE(like_opt.count(shifted->name));
  EXPECT_TRUE(like_opt.count(moved->name));
  EXPECT_FALSE(like_opt.count(sum->name));  // Relu -> Add(nchw, .): a chain too, not affine
  // A chain that multiplies the input by itself is not.
  G c;
  Value* y = c.in("y", {4, 8});
  c.out(c.op("Add", {c.op("Mul", {y, y}), c.cf(1.f)}));
  auto opt2 = test::optimize_checked(c.g, {"fuse_elementwise"});
  ASSERT_EQ(test::count(*opt2, "ElementwiseChain"), 1);
  EXPECT_EQ(quant::input_like_values(*opt2), std::set<std::string>{"y"});
}

TEST(Calibration, PercentileFindsTheBin) {
  std::vector<double> h(100, 0.0);
  h[9] = 9999;  // 99.99% of the mass in bin 9
  h[99] = 1;
  EXPECT_DOUBLE_EQ(quant::percentile_threshold(h, 0.5, 99.99), 5.0);
  EXPECT_DOUBLE_EQ(quant::percentile_threshold(h, 0.5, 100), 50.0);
}

TEST(CalibCache, RoundTripAndMismatchesAreNamed) {
  const std::string path = temp_path("kiln_cache_test");
  quant::CalibCache c{"entropy", "0.2.0", 0x1234abcdULL, {{"a tensor", 0.125f}, {"b", 3.0e-5f}}};
  ASSERT_TRUE(quant::write_calib_cache(path, c).ok());
  auto r = quant::read_calib_cache(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->scales, c.scales);
  EXPECT_EQ(r->fingerprint, c.fingerprint);
  EXPECT_TRUE(quant::check_calib_cache(*r, path, 0x1234abcd, "", {"a tensor", "b"}).ok());
  auto msg = [&](uint64_t fp, std::string algo, std::vector<std::string> need) {
    return quant::check_calib_cache(*r, path, fp, algo, need).message();
  };
  EXPECT_NE(msg(1, "", {}).find("fingerprint differs"), std::string::npos);
  EXPECT_NE(
      msg(0x1234abcd, "minmax", {}).find("algorithm differs (cache: entropy, requested: minmax)"),
      std::string::npos);
  EXPECT_NE(msg(0x1234abcd, "", {"c"}).find("tensor 'c' missing"), std::string::npos);
  std::ofstream(path) << "kiln-calibration-cache 1\nalgorithm entropy\nfingerprint 12\nx -1\n";
  auto bad = quant::read_calib_cache(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 4"), std::string::npos) << bad.status().message();
  std::remove(path.c_str());
}

TEST(CalibCache, FingerprintSeesWeightsNotShapes) {
  G a;
  Value* x = a.in("x", {1, 4});
  Tensor w = rand_t({4, 3});
  a.out(a.op("MatMul", {x, a.c(w)}));
  const uint64_t f = quant::graph_fingerprint(a.g);
  x->type = TensorType(DataType::kFloat32, {8, 4});  // another batch size: same cache
  EXPECT_EQ(quant::graph_fingerprint(a.g), f);
  G b;
  Tensor w2 = w.clone();
  w2.data<float>()[5] += 1e-3f;
  b.out(b.op("MatMul", {b.in("x", {1, 4}), b.c(w2)}));
  EXPECT_NE(quant::graph_fingerprint(b.g), f);
}

// x -> Q -> DQ -> Conv(DQ(int8 W, per-channel)) with an int32 bias DQ.
// Files that do not hold whole batches of the engine's fixed batch are one stream of samples,
// cut into batches of that size across files (TensorRT's calibration batch is the engine's too).
TEST(CalibData, FilesOfOtherBatchSizesAreOneStreamOfSamples) {
  const std::string dir = temp_path("calib_stream");
  std::filesystem::create_directories(dir);
  float next = 0;
  auto rows = [&](std::vector<int64_t> shape) {  // consecutive sample numbers
    Tensor t(DataType::kFloat32, shape);
    const int64_t per = t.numel() / (shape.size() == 2 ? shape[0] : 1);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = next + static_cast<float>(i / per);
    next += static_cast<float>(t.numel() / per);
    return t;
  };
  ASSERT_TRUE(write_npy(dir + "/a.npy", rows({3, 2})).ok());
  ASSERT_TRUE(write_npy(dir + "/b.npy", rows({2})).ok());  // one sample
  ASSERT_TRUE(write_npy(dir + "/c.npy", rows({5, 2})).ok());
  G b;
  Value* x = b.g.add_value("x", TensorType(DataType::kFloat32, {4, 2}));
  b.g.add_input(x);
  auto data = quant::open_npy_calib_data({{"", dir}}, b.g, 0);
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ((*data)->size(), 2u);  // 9 samples: two batches of 4, one sample unused
  for (size_t i = 0; i < 2; ++i) {
    auto feeds = (*data)->batch(i);
    ASSERT_TRUE(feeds.ok()) << feeds.status().message();
    ASSERT_EQ(feeds->size(), 1u);
    const Tensor& t = (*feeds)[0].at("x");
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{4, 2}));
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 2; ++c)
        EXPECT_EQ(t.data<float>()[r * 2 + c], static_cast<float>(4 * i + r)) << i << " " << r;
  }
  auto limited = quant::open_npy_calib_data({{"", dir}}, b.g, 1);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ((*limited)->size(), 1u);
  // Fewer samples than one batch: the error says how many and what to do.
  G big;
  Value* y = big.g.add_value("x", TensorType(DataType::kFloat32, {16, 2}));
  big.g.add_input(y);
  auto few = quant::open_npy_calib_data({{"", dir}}, big.g, 0);
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("holds 9 samples"), std::string::npos) << few.status().message();
  // A file whose sample shape differs is named.
  ASSERT_TRUE(write_npy(dir + "/d.npy", Tensor(DataType::kFloat32, {3, 5})).ok());
  auto bad = quant::open_npy_calib_data({{"", dir}}, b.g, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("d.npy"), std::string::npos) << bad.status().message();
  std::filesystem::remove_all(dir);
}

// A folder of images (in class subfolders) is calibration data: one sample per image, read as
// `kiln run` reads an image input of the model's shape, batched as the input's fixed batch.
TEST(CalibData, ImageFoldersAreSamples) {
  const std::string dir = temp_path("calib_images");
  std::filesystem::remove_all(dir);
  std::vector<std::string> paths;
  for (const char* cls : {"cat", "dog"}) {
    std::filesystem::create_directories(dir + "/" + cls);
    for (int i = 0; i < 3; ++i) {
      std::vector<unsigned char> px(8 * 6 * 3);
      for (size_t k = 0; k < px.size(); ++k)
        px[k] = static_cast<unsigned char>((k * 7 + static_cast<size_t>(i) * 40 + cls[0]) % 256);
      const std::string path = dir + "/" + cls + "/" + std::to_string(i) + ".png";
      ASSERT_TRUE(stbi_write_png(path.c_str(), 8, 6, 3, px.data(), 8 * 3));
      paths.push_back(path);
    }
  }
  BuildConfig::CalibImages o;
  o.mean = {0.5f};
  o.std = {0.25f};
  ImagePreprocess p;
  p.crop_h = p.crop_w = 4;
  p.mean = o.mean;
  p.std = o.std;
  G fixed;
  Value* x = fixed.g.add_value("x", TensorType(DataType::kFloat32, {2, 3, 4, 4}));
  fixed.g.add_input(x);
  auto data = quant::open_npy_calib_data({{"", dir}}, fixed.g, 0, o);
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ((*data)->size(), 3u);  // 6 images, batches of 2, in path order
  for (size_t b = 0; b < 3; ++b) {
    auto feeds = (*data)->batch(b);
    ASSERT_TRUE(feeds.ok()) << feeds.status().message();
    const Tensor& t = (*feeds)[0].at("x");
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 4, 4}));
    for (int64_t i = 0; i < 2; ++i) {
      auto want = load_image(paths[2 * b + static_cast<size_t>(i)], p);
      ASSERT_TRUE(want.ok());
      for (int64_t k = 0; k < 48; ++k)
        ASSERT_EQ(t.data<float>()[i * 48 + k], want->data<float>()[k]) << b << " " << i;
    }
  }
  // A dynamic batch: one image per batch.
  G dyn;
  Value* y = dyn.g.add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 3, 4, 4}));
  dyn.g.add_input(y);
  auto one = quant::open_npy_calib_data({{"", dir}}, dyn.g, 0, o);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ((*one)->size(), 6u);
  // Image options with .npy data, and a folder of both kinds, are errors.
  const std::string npy = temp_path("calib_npy_only");
  std::filesystem::create_directories(npy);
  ASSERT_TRUE(write_npy(npy + "/a.npy", Tensor(DataType::kFloat32, {2, 3, 4, 4})).ok());
  auto opts = quant::open_npy_calib_data({{"", npy}}, fixed.g, 0, o);
  ASSERT_FALSE(opts.ok());
  EXPECT_NE(opts.status().message().find("calibration images"), std::string::npos);
  ASSERT_TRUE(write_npy(dir + "/a.npy", Tensor(DataType::kFloat32, {2, 3, 4, 4})).ok());
  auto mixed = quant::open_npy_calib_data({{"", dir}}, fixed.g, 0, o);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("both .npy files and images"), std::string::npos);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(npy);
}

TEST(MapQdq, ActivationPairsAndWeightsBecomeScales) {
  G b;
  Value* x = b.in("x", {1, 2, 4, 4});
  Value* s = b.c(Tensor::scalar<float>(0.05f));
  Value* zp = b.c(Tensor::scalar<int8_t>(0));
  Value* xq = b.op("QuantizeLinear", {x, s, zp});
  Value* xd = b.op("DequantizeLinear", {xq, s, zp});
  Tensor wq(DataType::kInt8, {3, 2, 1, 1});
  for (int64_t i = 0; i < wq.numel(); ++i) wq.data<int8_t>()[i] = static_cast<int8_t>(i * 17 - 50);
  Value* ws = b.c(Tensor::from<float>({3}, {0.1f, 0.2f, 0.3f}));
  Value* wd = b.op("DequantizeLinear", {b.c(wq), ws}, test::attrs({{"axis", Attribute::Int(0)}}));
  Tensor bq = Tensor::from<int32_t>({3}, {10, -20, 30});
  Value* bd =
      b.op("DequantizeLinear", {b.c(bq), b.c(Tensor::from<float>({3}, {0.005f, 0.01f, 0.015f}))},
           test::attrs({{"axis", Attribute::Int(0)}}));
  Value* y = b.op("Conv", {xd, wd, bd});
  b.out(y);
  ASSERT_TRUE(infer_shapes(b.g).ok());
  const auto ins = test::random_inputs(b.g);
  const auto before = test::run_cpu(b.g, ins);
  auto mapped = quant::map_qdq(b.g);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  EXPECT_TRUE(mapped->any);
  EXPECT_EQ(mapped->kept, 0u);
  EXPECT_EQ(test::count(b.g, "QuantizeLinear") + test::count(b.g, "DequantizeLinear"), 0);
  ASSERT_EQ(b.g.nodes().size(), 1u);
  const Node* conv = b.g.nodes()[0];
  EXPECT_EQ(conv->input(0), x);
  EXPECT_EQ(x->quant_scales, std::vector<float>{0.05f});
  EXPECT_EQ(conv->input(1)->quant_scales, (std::vector<float>{0.1f, 0.2f, 0.3f}));
  EXPECT_EQ(conv->input(1)->quant_axis, 0);
  EXPECT_TRUE(conv->input(2)->quant_scales.empty());
  // Marked INT8, the layer computes what the Q/DQ graph computed (up to float rounding).
  ASSERT_TRUE(infer_shapes(b.g).ok());
  auto s8 = quant::mark_int8_layers(b.g, {}, true);
  ASSERT_TRUE(s8.ok());
  ASSERT_EQ(s8->int8_layers.size(), 1u);
  const auto after = test::run_cpu(b.g, ins);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_LT(test::rel_l2(after[0], before[0]), 1e-6);
}

// What symmetric int8 cannot express stays as Q/DQ ops: the graph computes what it computed
// (ONNX's QDQ semantics, in float), and the reason names the first node kept.
TEST(MapQdq, UnmappablePatternsStayAsOpsAndNameTheNode) {
  auto build = [](DataType zp_type, int zp_value) {
    auto b = std::make_unique<G>();
    Value* x = b->in("x", {1, 4});
    Tensor zp(zp_type, {});
    if (zp_type == DataType::kUInt8)
      zp.data<uint8_t>()[0] = static_cast<uint8_t>(zp_value);
    else
      zp.data<int8_t>()[0] = static_cast<int8_t>(zp_value);
    Value* s = b->c(Tensor::scalar<float>(0.1f));
    Value* z = b->c(zp);
    Node* q = b->node("QuantizeLinear", {x, s, z});
    q->name = "the_q";
    b->out(b->op("DequantizeLinear", {q->output(0), s, z}));
    EXPECT_TRUE(infer_shapes(b->g).ok());
    return b;
  };
  auto check = [](G& b, const std::string& why) {
    const auto ins = test::random_inputs(b.g);
    const auto before = test::run_cpu(b.g, ins);
    auto r = quant::map_qdq(b.g);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->any);
    EXPECT_EQ(r->kept, 2u);
    EXPECT_NE(r->why.find("node 'the_q'"), std::string::npos) << r->why;
    EXPECT_NE(r->why.find(why), std::string::npos) << r->why;
    EXPECT_EQ(test::count(b.g, "QuantizeLinear") + test::count(b.g, "DequantizeLinear"), 2);
    ASSERT_TRUE(infer_shapes(b.g).ok());
    const auto after = test::run_cpu(b.g, ins);
    ASSERT_EQ(after.size(), 1u);
    EXPECT_EQ(test::rel_l2(after[0], before[0]), 0.0);
  };
  auto u8 = build(DataType::kUInt8, 128);
  check(*u8, "int8 only");
  auto nz = build(DataType::kInt8, 3);
  check(*nz, "zero point 3");
  G lone;  // a DQ of a computed int8 tensor with no Q before it
  Value* xi = lone.g.add_value("xi", TensorType(DataType::kInt8, {4}));
  lone.g.add_input(xi);
  Node* dq = lone.node("DequantizeLinear", {xi, lone.c(Tensor::scalar<float>(0.1f))});
  lone.out(dq->output(0));
  auto r = quant::map_qdq(lone.g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->kept, 1u);
  EXPECT_NE(r->why.find(dq->name), std::string::npos) << r->why;
  // A constant's DQ with a computed scale stays an op.
  G computed;
  Value* cs = computed.in("scale", {});
  Tensor ci(DataType::kInt8, {4});
  for (int64_t i = 0; i < ci.numel(); ++i) ci.data<int8_t>()[i] = static_cast<int8_t>(i - 2);
  computed.out(computed.op("DequantizeLinear", {computed.c(ci), cs}));
  ASSERT_TRUE(infer_shapes(computed.g).ok());
  r = quant::map_qdq(computed.g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->kept, 1u);
  EXPECT_NE(r->why.find("'scale' is not a constant"), std::string::npos) << r->why;
  // An asymmetric uint8 weight folds into the float weight it stands for, without a grid.
  G w;
  Value* x = w.in("x", {2, 3});
  Tensor wq(DataType::kUInt8, {3, 2});
  for (int64_t i = 0; i < wq.numel(); ++i) wq.data<uint8_t>()[i] = static_cast<uint8_t>(100 + 9 * i);
  Tensor wz(DataType::kUInt8, {});
  wz.data<uint8_t>()[0] = 128;
  Value* wd = w.op("DequantizeLinear", {w.c(wq), w.c(Tensor::scalar<float>(0.02f)), w.c(wz)});
  w.out(w.op("MatMul", {x, wd}));
  ASSERT_TRUE(infer_shapes(w.g).ok());
  const auto ins = test::random_inputs(w.g);
  const auto before = test::run_cpu(w.g, ins);
  r = quant::map_qdq(w.g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->kept, 0u);
  ASSERT_EQ(w.g.nodes().size(), 1u);
  EXPECT_TRUE(w.g.nodes()[0]->input(1)->is_constant());
  EXPECT_TRUE(w.g.nodes()[0]->input(1)->quant_scales.empty());
  EXPECT_LT(test::rel_l2(test::run_cpu(w.g, ins)[0], before[0]), 1e-7);
}

// --accuracy-budget's units: a pair made after INT8 marking moves back with both of its layers
// (the names --layer-precisions pins are the float graph's); every other INT8 layer alone.
TEST(AccuracyBudget, APairMovesBackWithBothOfItsLayers) {
  Graph fl, i8;
  Value* x = fl.add_value("x");
  fl.add_node("FusedConv", "expand", {x}, {"e"}, "kiln");
  fl.add_node("FusedConv", "down", {x}, {"d"}, "kiln");
  fl.add_node("FusedConv", "reduce", {x}, {"r"}, "kiln");
  fl.add_node("Relu", "head", {x}, {"h"});
  Value* y = i8.add_value("x");
  Node* pair = i8.add_node("FusedConvPair", "expand", {y}, {"p"}, "kiln");
  pair->onnx_nodes = {"expand", "down", "add", "relu"};
  pair->attrs.set("int8", Attribute::Int(1));
  Node* reduce = i8.add_node("FusedConv", "reduce", {y}, {"r"}, "kiln");
  reduce->onnx_nodes = {"reduce", "reduce_relu"};
  reduce->attrs.set("int8", Attribute::Int(1));
  Node* head = i8.add_node("Relu", "head", {y}, {"h"});
  head->onnx_nodes = {"head"};
  const auto groups = quant::int8_layer_groups(i8, fl);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<std::string>{"expand", "down"}));
  EXPECT_EQ(groups[1], (std::vector<std::string>{"reduce"}));
}

}  // namespace
}  // namespace kiln
