// Labelled samples for `kiln compare --dataset`: IDX files (MNIST / Fashion-MNIST, plain or
// gzip-compressed, as Debian's dataset-fashion-mnist ships them) or an image folder with one
// subfolder per class (torchvision's ImageFolder: classes sorted by name give labels 0, 1, ...).
#pragma once

#include <string>
#include <vector>

#include "core/image.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

class Dataset {
 public:
  // `path`: a folder holding t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz] (or
  // train-*), an IDX images file (its labels file named alike with labels-idx1), or an image
  // folder with one subfolder per class.
  static Expected<Dataset> open(const std::string& path);
  size_t size() const { return labels_.size(); }
  int label(size_t i) const { return labels_[i]; }
  const std::string& description() const { return description_; }
  // Sample i as a float32 tensor [1,C,H,W] (or NHWC) through the image preprocessing; IDX
  // images are grayscale, repeated over 3 channels when `p.channels` is 3.
  Expected<Tensor> sample(size_t i, const ImagePreprocess& p) const;

 private:
  std::string description_;
  std::vector<int> labels_;
  // IDX: all images in one buffer; image folder: one file per sample.
  std::vector<unsigned char> pixels_;
  int rows_ = 0, cols_ = 0;
  std::vector<std::string> files_;
};

// Stacks [1,...] tensors into one [N,...] batch.
Expected<Tensor> stack_batch(const std::vector<Tensor>& samples);

}  // namespace kiln
