#include "core/image.h"

#include <stb_image.h>
#include <stb_image_resize.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

namespace kiln {
namespace {

// The scaled size torchvision's Resize(int) gives: the shorter side becomes `s`, the longer
// side int(s * long / short) (truncated, as torchvision does).
std::pair<int, int> short_side_size(int h, int w, int s) {
  if (h <= w) return {s, static_cast<int>(static_cast<int64_t>(s) * w / h)};
  return {static_cast<int>(static_cast<int64_t>(s) * h / w), s};
}

Status check_options(const ImagePreprocess& p, const std::string& what) {
  if (p.channels != 1 && p.channels != 3)
    return KILN_ERROR("{}: images are read as 1 (gray) or 3 (RGB) channels, not {}", what,
                      p.channels);
  if (p.resize_short < 0 || p.crop_h < 0 || p.crop_w < 0 || (p.crop_h > 0) != (p.crop_w > 0))
    return KILN_ERROR("{}: bad resize options (sizes must be positive; give both height and width)",
                      what);
  for (const auto* v : {&p.mean, &p.std}) {
    if (!v->empty() && v->size() != 1 && static_cast<int>(v->size()) != p.channels)
      return KILN_ERROR("{}: --{} needs 1 or {} values, got {}", what,
                        v == &p.mean ? "mean" : "std", p.channels, v->size());
  }
  for (float s : p.std)
    if (!(s != 0.f) || !std::isfinite(s))
      return KILN_ERROR("{}: --std values must be finite and non-zero", what);
  return Status::Ok();
}

}  // namespace

Expected<ImagePreprocess> image_preprocess_for(const std::vector<int64_t>& d, ImagePreprocess p,
                                               const std::string& what) {
  if (d.size() != 4) return KILN_ERROR("{} is not 4-D: it cannot take an image", what);
  const int64_t c = p.nhwc ? d[3] : d[1], h = p.nhwc ? d[1] : d[2], w = p.nhwc ? d[2] : d[3];
  if (c >= 0 && c != 1 && c != 3)
    return KILN_ERROR("{} has {} channels in {} layout: images give 1 or 3", what, c,
                      p.nhwc ? "NHWC" : "NCHW");
  p.channels = c == 1 ? 1 : 3;
  const bool exact = p.resize_short == 0 && p.crop_h > 0 && p.crop_w > 0;
  if (p.resize_short > 0 || (!exact && h > 0 && w > 0)) {
    // Crop (or, without a resize, scale) to the model's size when it is fixed.
    p.crop_h = h > 0 ? static_cast<int>(h) : p.resize_short;
    p.crop_w = w > 0 ? static_cast<int>(w) : p.resize_short;
  }
  return p;
}

bool is_image_path(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const char* e : {".jpg", ".jpeg", ".png", ".bmp", ".tga", ".gif", ".pgm", ".ppm", ".pnm"})
    if (ext == e) return true;
  return false;
}

Expected<Tensor> preprocess_pixels(const unsigned char* pixels, int h, int w, int c,
                                   const ImagePreprocess& p, const std::string& what) {
  KILN_RETURN_IF_ERROR(check_options(p, what));
  if (c != p.channels) return KILN_ERROR("{}: expected {} channels, got {}", what, p.channels, c);
  if (h <= 0 || w <= 0) return KILN_ERROR("{}: empty image", what);
  std::vector<float> src(static_cast<size_t>(h) * w * c);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pixels[i];
  // Scale, then crop from the middle.
  int sh = h, sw = w;
  if (p.resize_short > 0)
    std::tie(sh, sw) = short_side_size(h, w, p.resize_short);
  else if (p.crop_h > 0)
    std::tie(sh, sw) = std::make_pair(p.crop_h, p.crop_w);
  std::vector<float> scaled;
  if (sh != h || sw != w) {
    scaled.resize(static_cast<size_t>(sh) * sw * c);
    const int ok = stbir_resize_float_generic(
        src.data(), w, h, 0, scaled.data(), sw, sh, 0, c, STBIR_ALPHA_CHANNEL_NONE, 0,
        STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, nullptr);
    if (!ok) return KILN_ERROR("{}: resizing {}x{} to {}x{} failed", what, w, h, sw, sh);
  } else {
    scaled = std::move(src);
  }
  const int oh = p.resize_short > 0 && p.crop_h > 0 ? p.crop_h : sh;
  const int ow = p.resize_short > 0 && p.crop_w > 0 ? p.crop_w : sw;
  if (oh > sh || ow > sw)
    return KILN_ERROR("{}: crop {}x{} is larger than the resized image {}x{}", what, ow, oh, sw,
                      sh);
  // torchvision's CenterCrop: int(round((size - crop) / 2)), Python rounding half to even.
  const int top = static_cast<int>(std::nearbyint((sh - oh) / 2.0));
  const int left = static_cast<int>(std::nearbyint((sw - ow) / 2.0));
  Tensor t(DataType::kFloat32,
           p.nhwc ? std::vector<int64_t>{1, oh, ow, c} : std::vector<int64_t>{1, c, oh, ow});
  float* out = t.data<float>();
  for (int ch = 0; ch < c; ++ch) {
    const float mean = p.mean.empty() ? 0.f : p.mean[p.mean.size() == 1 ? 0 : ch];
    const float inv_std = 1.f / (p.std.empty() ? 1.f : p.std[p.std.size() == 1 ? 0 : ch]);
    for (int y = 0; y < oh; ++y)
      for (int x = 0; x < ow; ++x) {
        const float v = scaled[(static_cast<size_t>(y + top) * sw + (x + left)) * c + ch];
        const size_t at = p.nhwc ? (static_cast<size_t>(y) * ow + x) * c + ch
                                 : (static_cast<size_t>(ch) * oh + y) * ow + x;
        out[at] = (v / 255.f - mean) * inv_std;
      }
  }
  return t;
}

Expected<Tensor> load_image(const std::string& path, const ImagePreprocess& p) {
  KILN_RETURN_IF_ERROR(check_options(p, path));
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return KILN_ERROR("{}: cannot open image (no such file)", path);
  int w = 0, h = 0, n = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> pixels(
      stbi_load(path.c_str(), &w, &h, &n, p.channels), stbi_image_free);
  if (!pixels)
    return KILN_ERROR("{}: not a readable image ({})", path,
                      stbi_failure_reason() ? stbi_failure_reason() : "unknown reason");
  return preprocess_pixels(pixels.get(), h, w, p.channels, p, path);
}

}  // namespace kiln
