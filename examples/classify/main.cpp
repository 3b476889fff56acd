// classify: an image and a kiln engine in, the top-5 classes out.
//
//   classify ENGINE IMAGE [--labels FILE] [--resize R] [--mean M,M,M] [--std S,S,S] [--top K]
//
// Any engine of an image classifier with one input [N,3,H,W] (or [N,1,H,W]) of fixed H and W:
// FP32, FP16 or INT8, for the cpu or the cuda backend. The image is decoded and preprocessed
// here (ImageNet style: shorter side to R, center crop to HxW, scale to [0,1], normalize by
// mean and std, NCHW), run with ExecutionContext::execute, and the output turned into
// probabilities with a softmax (unless it already is a distribution).
// Errors: one line on stderr and exit status 1.
#include <stb_image.h>
#include <stb_image_resize.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <kiln/engine.h>

namespace {

struct Options {
  std::string engine, image, labels;
  int resize = 0;  // shorter side before the crop; 0: 8/7 of the input's height (256 for 224)
  std::vector<float> mean{0.485f, 0.456f, 0.406f}, std{0.229f, 0.224f, 0.225f};  // ImageNet's
  int top = 5;
  bool help = false;
};

const char* const kUsage =
    "usage: classify ENGINE IMAGE [--labels FILE] [--resize R] [--mean M,M,M] [--std S,S,S] "
    "[--top K]\n"
    "  --labels FILE   one class name a line, as many as the model has classes\n"
    "  --resize R      shorter side before the center crop (default: 8/7 of the input's "
    "height, 256 for 224)\n"
    "  --mean, --std   per-channel normalization of values in [0,1] (default: ImageNet's)\n"
    "  --top K         how many classes to print (default 5)\n";

kiln::Expected<int> parse_int(const std::string& flag, const std::string& s) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v <= 0)
    return KILN_ERROR("{} '{}': expected a positive whole number", flag, s);
  return v;
}

kiln::Expected<std::vector<float>> parse_floats(const std::string& flag, const std::string& s) {
  std::vector<float> out;
  const char* p = s.data();
  const char* end = s.data() + s.size();
  while (p < end) {
    float v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || (next != end && *next != ','))
      return KILN_ERROR("{} '{}': expected numbers separated by commas", flag, s);
    out.push_back(v);
    p = next + (next != end);
  }
  if (out.empty()) return KILN_ERROR("{}: no values", flag);
  return out;
}

kiln::Expected<Options> parse_args(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    }
    if (a.rfind("--", 0) != 0) {
      positional.push_back(a);
      continue;
    }
    if (i + 1 >= argc) return KILN_ERROR("{} needs a value", a);
    const std::string v = argv[++i];
    if (a == "--labels") {
      o.labels = v;
    } else if (a == "--resize") {
      KILN_ASSIGN_OR_RETURN(o.resize, parse_int(a, v));
    } else if (a == "--top") {
      KILN_ASSIGN_OR_RETURN(o.top, parse_int(a, v));
    } else if (a == "--mean") {
      KILN_ASSIGN_OR_RETURN(o.mean, parse_floats(a, v));
    } else if (a == "--std") {
      KILN_ASSIGN_OR_RETURN(o.std, parse_floats(a, v));
    } else {
      return KILN_ERROR("unknown option {} (--help lists them)", a);
    }
  }
  if (positional.size() != 2)
    return KILN_ERROR("expected ENGINE and IMAGE, got {} arguments (--help)", positional.size());
  o.engine = positional[0];
  o.image = positional[1];
  return o;
}

// ImageNet-style preprocessing, torchvision's Resize(R) + CenterCrop((h, w)) + ToTensor() +
// Normalize(mean, std), into `c` x h x w floats (NCHW for a batch of one). The same stb calls
// as `kiln run --input IMAGE --resize R --mean ... --std ...`, so both make the same tensor.
kiln::Expected<std::vector<float>> preprocess(const Options& o, int c, int h, int w,
                                              std::string& what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(o.image, ec))
    return KILN_ERROR("{}: cannot open image (no such file)", o.image);
  int iw = 0, ih = 0, n = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> pixels(
      stbi_load(o.image.c_str(), &iw, &ih, &n, c), stbi_image_free);  // converted to c channels
  if (!pixels)
    return KILN_ERROR("{}: not an image stb_image can read ({})", o.image, stbi_failure_reason());
  for (const auto* v : {&o.mean, &o.std})
    if (v->size() != 1 && static_cast<int>(v->size()) != c)
      return KILN_ERROR("--{} needs 1 or {} values, got {} (the defaults are ImageNet's, for "
                        "RGB)", v == &o.mean ? "mean" : "std", c, v->size());
  // Shorter side to R, the longer one scaled and truncated as torchvision does.
  const int r = o.resize > 0 ? o.resize : (h * 256 + 112) / 224;
  const int sh = ih <= iw ? r : static_cast<int>(int64_t{r} * ih / iw);
  const int sw = ih <= iw ? static_cast<int>(int64_t{r} * iw / ih) : r;
  if (h > sh || w > sw)
    return KILN_ERROR("{}: the {}x{} crop is larger than the image resized to {}x{} (raise "
                      "--resize)", o.image, w, h, sw, sh);
  std::vector<float> src(pixels.get(), pixels.get() + static_cast<size_t>(iw) * ih * c);
  std::vector<float> scaled = src;
  if (sh != ih || sw != iw) {
    // A triangle filter that widens when shrinking: PIL's antialiased bilinear resize.
    scaled.resize(static_cast<size_t>(sh) * sw * c);
    if (!stbir_resize_float_generic(src.data(), iw, ih, 0, scaled.data(), sw, sh, 0, c,
                                    STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP,
                                    STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, nullptr))
      return KILN_ERROR("{}: resizing {}x{} to {}x{} failed", o.image, iw, ih, sw, sh);
  }
  // CenterCrop's offsets: round((size - crop) / 2), half to even like Python's round.
  const int top = static_cast<int>(std::nearbyint((sh - h) / 2.0));
  const int left = static_cast<int>(std::nearbyint((sw - w) / 2.0));
  std::vector<float> chw(static_cast<size_t>(c) * h * w);
  for (int ch = 0; ch < c; ++ch) {
    const float mean = o.mean[o.mean.size() == 1 ? 0 : ch];
    const float inv_std = 1.f / o.std[o.std.size() == 1 ? 0 : ch];
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const float v = scaled[(static_cast<size_t>(y + top) * sw + x + left) * c + ch];
        chw[(static_cast<size_t>(ch) * h + y) * w + x] = (v / 255.f - mean) * inv_std;
      }
  }
  what = fmt::format("{}x{} {} -> shorter side {} ({}x{}) -> center crop {}x{}", iw, ih,
                     c == 3 ? "RGB" : "gray", r, sw, sh, w, h);
  return chw;
}

kiln::Expected<std::vector<std::string>> read_labels(const std::string& path, size_t classes) {
  std::ifstream f(path);
  if (!f) return KILN_ERROR("{}: cannot open the labels file", path);
  std::vector<std::string> labels;
  for (std::string line; std::getline(f, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels.push_back(line);
  }
  while (!labels.empty() && labels.back().empty()) labels.pop_back();
  if (labels.size() != classes)
    return KILN_ERROR("{}: {} labels, but the model's output has {} classes (one label a line)",
                      path, labels.size(), classes);
  return labels;
}

// The output as doubles, from the float types an engine's output may have.
kiln::Expected<std::vector<double>> to_doubles(const kiln::Tensor& t, const std::string& name) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  switch (t.dtype()) {
    case kiln::DataType::kFloat32:
    case kiln::DataType::kFloat16:
    case kiln::DataType::kFloat64:
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.at_double(static_cast<int64_t>(i));
      return v;
    default:
      return KILN_ERROR("output '{}' is {}: classify reads float scores", name, t.desc());
  }
}

kiln::Status run(int argc, char** argv) {
  KILN_ASSIGN_OR_RETURN(Options o, parse_args(argc, argv));
  if (o.help) {
    fmt::print("{}", kUsage);
    return kiln::Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<kiln::Engine> engine, kiln::Engine::load(o.engine));
  if (engine->inputs().size() != 1 || engine->outputs().empty())
    return KILN_ERROR("{}: classify needs an engine with one image input, this one has {} "
                      "inputs", o.engine, engine->inputs().size());
  const kiln::TensorInfo& in = engine->inputs()[0];
  const kiln::TensorInfo& out = engine->outputs()[0];
  const std::vector<int64_t>& d = in.dims;
  if (d.size() != 4 || (d[1] != 3 && d[1] != 1) || d[2] <= 0 || d[3] <= 0 ||
      (in.dtype != kiln::DataType::kFloat32 && in.dtype != kiln::DataType::kFloat16))
    return KILN_ERROR("{}: input {} is not an NCHW float image of fixed size ([N,3,H,W] or "
                      "[N,1,H,W])", o.engine, in.str());
  const int c = static_cast<int>(d[1]), h = static_cast<int>(d[2]), w = static_cast<int>(d[3]);

  std::string what;
  KILN_ASSIGN_OR_RETURN(std::vector<float> chw, preprocess(o, c, h, w, what));
  // The input tensor in the engine's input type (float16 inputs take converted values).
  kiln::Tensor x(in.dtype, {1, c, h, w});
  for (size_t i = 0; i < chw.size(); ++i) {
    if (in.dtype == kiln::DataType::kFloat32) x.data<float>()[i] = chw[i];
    else x.data<uint16_t>()[i] = kiln::float_to_half(chw[i]);
  }

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<kiln::ExecutionContext> ctx, engine->create_context());
  const auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(std::vector<kiln::Tensor> outputs, ctx->execute({{in.name, x}}));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  KILN_ASSIGN_OR_RETURN(std::vector<double> p, to_doubles(outputs[0], out.name));

  // Softmax, unless the model ends in one already (every value in [0, 1], summing to 1).
  const bool is_distribution =
      std::all_of(p.begin(), p.end(), [](double v) { return v >= 0 && v <= 1; }) &&
      std::abs(std::accumulate(p.begin(), p.end(), 0.0) - 1) < 1e-3;
  if (!is_distribution) {
    const double top = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - top));
    for (double& v : p) v /= sum;
  }
  std::vector<std::string> labels;
  if (!o.labels.empty()) {
    KILN_ASSIGN_OR_RETURN(labels, read_labels(o.labels, p.size()));
  }
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = std::min<size_t>(o.top, p.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(k), order.end(),
                    [&](size_t a, size_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });

  fmt::print("engine    {}: {} backend, kiln {}, {} -> {}\n", o.engine, engine->backend(),
             engine->kiln_version(), in.str(), out.str());
  fmt::print("image     {}: {}\n", o.image, what);
  fmt::print("inference {:.3f} ms (execute on the {} backend)\n", ms, engine->backend());
  fmt::print("top-{} of {} classes ({}):\n", k, p.size(),
             is_distribution ? "the output is already a distribution" : "softmax of the output");
  fmt::print("  rank  class  probability  label\n");
  for (size_t i = 0; i < k; ++i)
    fmt::print("  {:4}  {:5}  {:11.6f}  {}\n", i + 1, order[i], p[order[i]],
               labels.empty() ? fmt::format("class {}", order[i]) : labels[order[i]]);
  return kiln::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  const kiln::Status st = run(argc, argv);
  if (!st.ok()) {
    std::cerr << "classify: error: " << st.message() << "\n";
    return 1;
  }
  return 0;
}
