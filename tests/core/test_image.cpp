// Image inputs: images written in the test with stb_image_write (PNG, JPEG), read back through
// load_image with each resize mode, normalization and both layouts; bad files and options give
// one clear error naming the file.
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>

#include <filesystem>
#include <fstream>

#include "core/image.h"

namespace kiln {
namespace {

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kiln_test_image_" + name)).string();
}

// w x h RGB pixels from a function of (x, y, channel).
template <typename F>
std::vector<unsigned char> pixels(int w, int h, F f) {
  std::vector<unsigned char> p(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) p[(static_cast<size_t>(y) * w + x) * 3 + c] = f(x, y, c);
  return p;
}

std::string write_png(const std::string& name, int w, int h, const std::vector<unsigned char>& p) {
  const std::string path = tmp(name);
  EXPECT_TRUE(stbi_write_png(path.c_str(), w, h, 3, p.data(), w * 3));
  return path;
}

TEST(Image, PngExactValuesBothLayouts) {
  auto px = pixels(5, 4, [](int x, int y, int c) {
    return static_cast<unsigned char>(10 * x + 50 * y + 7 * c);
  });
  const std::string path = write_png("exact.png", 5, 4, px);
  ImagePreprocess p;
  p.mean = {0.1f, 0.2f, 0.3f};
  p.std = {0.5f};
  auto t = load_image(path, p);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{1, 3, 4, 5}));
  p.nhwc = true;
  auto u = load_image(path, p);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->shape(), (std::vector<int64_t>{1, 4, 5, 3}));
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 5; ++x) {
        const float want = (px[(y * 5 + x) * 3 + c] / 255.f - p.mean[c]) / 0.5f;
        EXPECT_FLOAT_EQ(t->data<float>()[(c * 4 + y) * 5 + x], want);
        EXPECT_FLOAT_EQ(u->data<float>()[(y * 5 + x) * 3 + c], want);
      }
}

TEST(Image, ShorterSideThenCenterCrop) {
  // 30 x 10: left third red, middle green, right third blue. Shorter side already 10, so the
  // 10x10 center crop is exactly the green square.
  auto px = pixels(
      30, 10, [](int x, int, int c) { return static_cast<unsigned char>(c == x / 10 ? 200 : 0); });
  const std::string path = write_png("thirds.png", 30, 10, px);
  ImagePreprocess p;
  p.resize_short = 10;
  p.crop_h = p.crop_w = 10;
  auto t = load_image(path, p);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->shape(), (std::vector<int64_t>{1, 3, 10, 10}));
  for (int i = 0; i < 100; ++i) {
    EXPECT_FLOAT_EQ(t->data<float>()[i], 0.f);
    EXPECT_FLOAT_EQ(t->data<float>()[100 + i], 200.f / 255.f);
    EXPECT_FLOAT_EQ(t->data<float>()[200 + i], 0.f);
  }
  // Shrinking: 30x10 -> 15x5 keeps the aspect; a 4x4 crop of it; a constant colour stays
  // constant (the filter weights sum to one), a horizontal ramp stays increasing.
  auto ramp = pixels(
      30, 10, [](int x, int, int c) { return static_cast<unsigned char>(c == 0 ? 8 * x : 90); });
  const std::string rpath = write_png("ramp.png", 30, 10, ramp);
  p.resize_short = 5;
  p.crop_h = p.crop_w = 4;
  auto r = load_image(rpath, p);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->shape(), (std::vector<int64_t>{1, 3, 4, 4}));
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) {
      EXPECT_NEAR(r->data<float>()[16 + y * 4 + x], 90.f / 255.f, 1e-5);
      if (x > 0) {
        EXPECT_GT(r->data<float>()[y * 4 + x], r->data<float>()[y * 4 + x - 1]);
      }
    }
  // The crop is centred: of 15 columns it keeps 6..9 (torchvision: round(5.5) = 6), whose
  // middle two average source column 15.5 of the ramp.
  EXPECT_NEAR((r->data<float>()[1] + r->data<float>()[2]) / 2, 8.f * 15.5f / 255.f, 1.5 / 255);
}

TEST(Image, ExactSizeAndJpegAndGray) {
  auto px = pixels(16, 12, [](int x, int y, int c) {
    return static_cast<unsigned char>(60 + 4 * x + 3 * y + 20 * c);
  });
  const std::string path = tmp("smooth.jpg");
  ASSERT_TRUE(stbi_write_jpg(path.c_str(), 16, 12, 3, px.data(), 100));
  ImagePreprocess p;
  auto full = load_image(path, p);
  ASSERT_TRUE(full.ok()) << full.status().message();
  ASSERT_EQ(full->shape(), (std::vector<int64_t>{1, 3, 12, 16}));
  double worst = 0;
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 12 * 16; ++i)
      worst = std::max(worst, std::abs(full->data<float>()[c * 192 + i] * 255.0 - px[i * 3 + c]));
  EXPECT_LT(worst, 6.0);  // JPEG at quality 100 on a smooth ramp
  p.crop_h = 6;
  p.crop_w = 4;  // exact size, aspect not kept
  auto small = load_image(path, p);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->shape(), (std::vector<int64_t>{1, 3, 6, 4}));
  p.channels = 1;
  auto gray = load_image(path, p);
  ASSERT_TRUE(gray.ok());
  EXPECT_EQ(gray->shape(), (std::vector<int64_t>{1, 1, 6, 4}));
}

TEST(Image, BadFilesAndOptionsAreOneClearError) {
  const std::string junk = tmp("junk.png");
  std::ofstream(junk) << "this is not a PNG file at all";
  auto a = load_image(junk, {});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find(junk), std::string::npos);
  EXPECT_NE(a.status().message().find("not a readable image"), std::string::npos);
  auto b = load_image(tmp("missing.png"), {});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("no such file"), std::string::npos);
  const std::string ok = write_png("ok.png", 4, 4, pixels(4, 4, [](int, int, int) { return 9; }));
  ImagePreprocess p;
  p.mean = {0.1f, 0.2f};
  EXPECT_NE(load_image(ok, p).status().message().find("--mean needs 1 or 3 values"),
            std::string::npos);
  p = {};
  p.std = {0.f};
  EXPECT_FALSE(load_image(ok, p).ok());
  p = {};
  p.resize_short = 4;
  p.crop_h = p.crop_w = 8;
  EXPECT_NE(load_image(ok, p).status().message().find("larger than the resized image"),
            std::string::npos);
  for (auto* m : {&a, &b}) EXPECT_EQ(m->status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace kiln
