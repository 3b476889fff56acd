// Images as input tensors: JPEG/PNG (and the other formats stb_image reads: BMP, TGA, GIF's
// first frame, PNM) decoded by Debian's libstb, resized, normalized and laid out as a float32
// tensor with a leading batch dimension of 1.
#pragma once

#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

struct ImagePreprocess {
  // Resize, following torchvision's classification recipe:
  //   resize_short > 0: scale so the shorter side is `resize_short` (aspect kept), then
  //                     center-crop to crop_h x crop_w (0: no crop), like
  //                     transforms.Resize(256) + transforms.CenterCrop(224);
  //   resize_short == 0 and crop_h, crop_w > 0: scale to exactly crop_h x crop_w (aspect not
  //                     kept), like transforms.Resize((h, w));
  //   all zero: keep the decoded size.
  // Scaling uses a triangle (bilinear) filter that widens when shrinking, as PIL's bilinear
  // resize does (torchvision's antialiased default), so results are close to torchvision's
  // but not bit-identical.
  int resize_short = 0;
  int crop_h = 0, crop_w = 0;
  // Per-channel normalization of values scaled to [0, 1]: (x / 255 - mean[c]) / std[c].
  // Empty mean = 0, empty std = 1; otherwise one value per channel (or one for all).
  std::vector<float> mean, std;
  int channels = 3;   // 3 = RGB, 1 = grayscale (decoded images are converted)
  bool nhwc = false;  // layout of the result: [1,C,H,W] (false) or [1,H,W,C] (true)
};

// `o` (layout, mean/std, resize_short or an exact crop_h x crop_w) completed for an image input
// of shape `dims` (4-D, -1 where dynamic; NCHW, or NHWC with o.nhwc): channels from the shape
// (1 or 3; 3 when dynamic), and the crop (or, without a resize, the scaling) to the input's
// height and width where they are fixed. Errors name `what` (e.g. "input 'x' (float32[...])").
Expected<ImagePreprocess> image_preprocess_for(const std::vector<int64_t>& dims, ImagePreprocess o,
                                               const std::string& what);

// Reads and preprocesses an image file into a float32 tensor [1,C,H,W] (or [1,H,W,C]).
// Errors name the file: unreadable, not an image stb_image can decode, bad options.
Expected<Tensor> load_image(const std::string& path, const ImagePreprocess& p);

// The same from 8-bit interleaved pixels (H x W x channels) already in memory.
Expected<Tensor> preprocess_pixels(const unsigned char* pixels, int h, int w, int channels,
                                   const ImagePreprocess& p, const std::string& what);

// True for file names that look like images kiln can read (by extension).
bool is_image_path(const std::string& path);

}  // namespace kiln
