#include "compare/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

namespace kiln {
namespace fs = std::filesystem;
namespace {

// The whole file, gunzipped when it is gzip-compressed (zlib reads plain files unchanged).
Expected<std::vector<unsigned char>> read_maybe_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return KILN_ERROR("{}: cannot open", path);
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.insert(out.end(), buf, buf + n);
  int errnum = 0;
  const char* msg = gzerror(f, &errnum);
  const std::string why = n < 0 ? (msg ? msg : "read error") : "";
  gzclose(f);
  if (n < 0) return KILN_ERROR("{}: cannot read: {}", path, why);
  return out;
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

// An IDX file of unsigned bytes (type 0x08) with `rank` dimensions: the dims and the data.
Expected<std::pair<std::vector<uint32_t>, std::vector<unsigned char>>> read_idx(
    const std::string& path, int rank) {
  KILN_ASSIGN_OR_RETURN(std::vector<unsigned char> b, read_maybe_gz(path));
  const size_t head = 4 + 4 * static_cast<size_t>(rank);
  if (b.size() < head || b[0] != 0 || b[1] != 0 || b[2] != 0x08 || b[3] != rank)
    return KILN_ERROR("{}: not an IDX file of {}-D unsigned bytes (bad header)", path, rank);
  std::vector<uint32_t> dims;
  size_t count = 1;
  for (int i = 0; i < rank; ++i) {
    dims.push_back(be32(&b[4 + 4 * i]));
    if (dims.back() == 0 || dims.back() > (1u << 24))
      return KILN_ERROR("{}: IDX dimension {} is {}", path, i, dims.back());
    count *= dims.back();
  }
  if (b.size() - head != count)
    return KILN_ERROR("{}: IDX header says {} bytes of data but the file has {}", path, count,
                      b.size() - head);
  b.erase(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(head));
  return std::make_pair(dims, std::move(b));
}

std::string find_in(const fs::path& dir, const std::vector<std::string>& names) {
  for (const auto& n : names)
    for (const char* ext : {"", ".gz"})
      if (fs::is_regular_file(dir / (n + ext))) return (dir / (n + ext)).string();
  return "";
}

}  // namespace

Expected<Dataset> Dataset::open(const std::string& path) {
  Dataset d;
  std::error_code ec;
  std::string images, labels;
  if (fs::is_regular_file(path, ec)) {
    images = path;
    labels = path;
    const size_t at = labels.find("images-idx3");
    if (at == std::string::npos)
      return KILN_ERROR("--dataset {}: a file must be an IDX images file (*images-idx3-ubyte[.gz])",
                        path);
    labels.replace(at, 11, "labels-idx1");
  } else if (fs::is_directory(path, ec)) {
    images = find_in(path, {"t10k-images-idx3-ubyte", "train-images-idx3-ubyte"});
    labels =
        images.empty()
            ? ""
            : find_in(path, {images.find("t10k") != std::string::npos ? "t10k-labels-idx1-ubyte"
                                                                      : "train-labels-idx1-ubyte"});
  } else {
    return KILN_ERROR("--dataset {}: no such file or folder", path);
  }
  if (!images.empty()) {
    if (labels.empty() || !fs::is_regular_file(labels, ec))
      return KILN_ERROR("--dataset {}: found {} but not its labels file", path, images);
    KILN_ASSIGN_OR_RETURN(auto im, read_idx(images, 3));
    KILN_ASSIGN_OR_RETURN(auto lb, read_idx(labels, 1));
    if (im.first[0] != lb.first[0])
      return KILN_ERROR("--dataset {}: {} images but {} labels", path, im.first[0], lb.first[0]);
    d.rows_ = static_cast<int>(im.first[1]);
    d.cols_ = static_cast<int>(im.first[2]);
    d.pixels_ = std::move(im.second);
    d.labels_.assign(lb.second.begin(), lb.second.end());
    d.description_ = fmt::format("{} ({} IDX images {}x{})", images, d.size(), d.rows_, d.cols_);
    return d;
  }
  // An image folder: one subfolder per class.
  std::vector<fs::path> classes;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_directory()) classes.push_back(e.path());
  std::sort(classes.begin(), classes.end());
  for (size_t c = 0; c < classes.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(classes[c], ec))
      if (e.is_regular_file() && is_image_path(e.path().string()))
        files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      d.files_.push_back(std::move(f));
      d.labels_.push_back(static_cast<int>(c));
    }
  }
  if (d.files_.empty())
    return KILN_ERROR(
        "--dataset {}: no IDX files (t10k-images-idx3-ubyte[.gz]) and no image "
        "subfolders (one per class)",
        path);
  d.description_ = fmt::format("{} ({} images in {} classes)", path, d.size(), classes.size());
  return d;
}

Expected<Tensor> Dataset::sample(size_t i, const ImagePreprocess& p) const {
  if (i >= size()) return KILN_ERROR("dataset sample {} out of range", i);
  if (!files_.empty()) return load_image(files_[i], p);
  const size_t n = static_cast<size_t>(rows_) * cols_;
  const unsigned char* src = pixels_.data() + i * n;
  if (p.channels == 1) return preprocess_pixels(src, rows_, cols_, 1, p, description_);
  std::vector<unsigned char> rgb(n * 3);
  for (size_t k = 0; k < n; ++k) rgb[3 * k] = rgb[3 * k + 1] = rgb[3 * k + 2] = src[k];
  return preprocess_pixels(rgb.data(), rows_, cols_, 3, p, description_);
}

Expected<Tensor> stack_batch(const std::vector<Tensor>& samples) {
  if (samples.empty()) return Status::Error("empty batch");
  std::vector<int64_t> shape = samples[0].shape();
  for (const Tensor& s : samples)
    if (s.shape() != shape || s.dtype() != samples[0].dtype())
      return KILN_ERROR("batch: sample {} differs from {}", s.desc(), samples[0].desc());
  shape[0] *= static_cast<int64_t>(samples.size());
  Tensor out(samples[0].dtype(), shape);
  auto* dst = static_cast<unsigned char*>(out.raw());
  for (const Tensor& s : samples) {
    if (s.nbytes()) std::memcpy(dst, s.raw(), s.nbytes());
    dst += s.nbytes();
  }
  return out;
}

}  // namespace kiln
