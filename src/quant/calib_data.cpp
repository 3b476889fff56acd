// Calibration data from folders of .npy files or of images (layout rules: calib_io.h).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/image.h"
#include "core/npy.h"
#include "quant/calib_io.h"

namespace kiln::quant {
namespace {

namespace fs = std::filesystem;

struct InputFiles {
  const Value* input;
  std::string dir;
  std::vector<std::string> files;
  bool images = false;  // image files (one sample each), not .npy
};

// The folder's .npy files, or else its images (also in subfolders: one per class, as image
// classification datasets are laid out), in path order.
Expected<InputFiles> list_files(const std::string& dir, const Value* input) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return KILN_ERROR("calibration data for input '{}': '{}' is not a readable directory",
                      input->name, dir);
  InputFiles out{input, dir, {}, false};
  std::vector<std::string> images;
  fs::recursive_directory_iterator it(dir, ec), end;  // symlinked subfolders: not followed (no cycles)
  if (ec) return KILN_ERROR("calibration data '{}': cannot read: {}", dir, ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) return KILN_ERROR("calibration data '{}': cannot read: {}", dir, ec.message());
    if (!it->is_regular_file(ec)) continue;
    const std::string path = it->path().string();
    if (it->path().extension() == ".npy" && it.depth() == 0) out.files.push_back(path);
    else if (is_image_path(path)) images.push_back(path);
  }
  if (!out.files.empty() && !images.empty())
    return KILN_ERROR("calibration data '{}' holds both .npy files and images: use one kind",
                      dir);
  if (out.files.empty()) {
    out.files = std::move(images);
    out.images = true;
  }
  if (out.files.empty())
    return KILN_ERROR("calibration data for input '{}': no .npy files or images in '{}'",
                      input->name, dir);
  std::sort(out.files.begin(), out.files.end());
  return out;
}

// Rows [start, start + n) of t's leading dimension, as a new tensor.
Tensor rows(const Tensor& t, int64_t start, int64_t n) {
  std::vector<int64_t> shape = t.shape();
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(shape[0]);
  shape[0] = n;
  Tensor out(t.dtype(), shape);
  std::memcpy(out.raw(), static_cast<const uint8_t*>(t.raw()) + row_bytes * start, out.nbytes());
  return out;
}

class NpyCalibData final : public CalibData {
 public:
  NpyCalibData(std::vector<InputFiles> inputs, size_t n) : inputs_(std::move(inputs)), n_(n) {}
  size_t size() const override { return n_; }

  Expected<std::vector<Feed>> batch(size_t i) const override {
    std::vector<Feed> feeds;
    for (const InputFiles& in : inputs_) {
      const std::string& path = in.files[i];
      KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(path));
      KILN_ASSIGN_OR_RETURN(std::vector<Tensor> parts, fit(*in.input, t, path));
      if (feeds.empty()) feeds.resize(parts.size());
      if (parts.size() != feeds.size())
        return KILN_ERROR(
            "calibration batch {}: '{}' holds {} runs of input '{}' but the other "
            "inputs' files hold {}",
            i, path, parts.size(), in.input->name, feeds.size());
      for (size_t k = 0; k < parts.size(); ++k) feeds[k][in.input->name] = std::move(parts[k]);
    }
    return feeds;
  }

 private:
  // Checks t against the input's declared type; cuts it to the input's fixed batch size.
  static Expected<std::vector<Tensor>> fit(const Value& in, Tensor t, const std::string& path) {
    const TensorType& ty = in.type;
    if (t.dtype() != ty.dtype)
      return KILN_ERROR("calibration file '{}': input '{}' is {} but the file holds {}", path,
                        in.name, dtype_name(ty.dtype), t.desc());
    if (!ty.dims) return std::vector<Tensor>{t};
    const auto& dims = *ty.dims;
    if (t.rank() + 1 == static_cast<int64_t>(dims.size())) {  // one sample: add the batch dim
      std::vector<int64_t> s = t.shape();
      s.insert(s.begin(), 1);
      KILN_ASSIGN_OR_RETURN(t, t.reshaped(s));
    }
    bool ok = t.rank() == static_cast<int64_t>(dims.size()) && t.rank() > 0;
    for (size_t d = 1; ok && d < dims.size(); ++d)
      ok = !dims[d].is_static() || dims[d].value == t.shape()[d];
    if (ok && dims[0].is_static() && dims[0].value > 0 && t.shape()[0] % dims[0].value != 0)
      ok = false;
    if (!ok && t.rank() == static_cast<int64_t>(dims.size()) && dims[0].is_static())
      return KILN_ERROR(
          "calibration file '{}': shape {} does not fit input '{}' of shape {} (files must hold "
          "{} samples or a multiple; or calibrate a build at the files' batch with --calib-cache "
          "and give that cache here: scales do not depend on the batch)",
          path, shape_str(t.shape()), in.name, ty.str(), dims[0].value);
    if (!ok)
      return KILN_ERROR("calibration file '{}': shape {} does not fit input '{}' of shape {}", path,
                        shape_str(t.shape()), in.name, ty.str());
    if (!dims[0].is_static() || dims[0].value == t.shape()[0] || dims[0].value == 0)
      return std::vector<Tensor>{t};
    std::vector<Tensor> parts;
    for (int64_t s = 0; s < t.shape()[0]; s += dims[0].value)
      parts.push_back(rows(t, s, dims[0].value));
    return parts;
  }

  std::vector<InputFiles> inputs_;
  size_t n_;
};

// Calibration data as one stream of samples per input, cut into batches of `batch` samples
// (the rest unused): files that do not hold whole batches of a fixed-batch engine (the input's
// files in name order), or images (one sample each).
class StreamCalibData final : public CalibData {
 public:
  struct Stream {
    const Value* input;
    std::vector<std::string> files;
    std::vector<int64_t> first;        // index of each file's first sample; first.back() = total
    std::vector<int64_t> sample;       // one sample's shape (without the batch dimension)
    std::function<Expected<Tensor>(const std::string&)> load;  // a file's samples, [n, sample...]
  };
  StreamCalibData(std::vector<Stream> streams, int64_t batch, size_t n)
      : streams_(std::move(streams)), batch_(batch), n_(n) {}
  size_t size() const override { return n_; }

  Expected<std::vector<Feed>> batch(size_t i) const override {
    Feed feed;
    for (const Stream& s : streams_) {
      std::vector<int64_t> shape = {batch_};
      shape.insert(shape.end(), s.sample.begin(), s.sample.end());
      Tensor out(s.input->type.dtype, shape);
      const size_t row_bytes = out.nbytes() / static_cast<size_t>(batch_);
      int64_t at = static_cast<int64_t>(i) * batch_;
      for (int64_t filled = 0; filled < batch_;) {
        const size_t f = static_cast<size_t>(
            std::upper_bound(s.first.begin(), s.first.end(), at) - s.first.begin() - 1);
        KILN_ASSIGN_OR_RETURN(const Tensor* t, file(s, f));
        if (t->nbytes() != row_bytes * static_cast<size_t>(s.first[f + 1] - s.first[f]))
          return KILN_ERROR("calibration file '{}': {} does not give {} samples of {}", s.files[f],
                            t->desc(), s.first[f + 1] - s.first[f], shape_str(s.sample));
        const int64_t from = at - s.first[f];
        const int64_t n = std::min(batch_ - filled, s.first[f + 1] - at);
        std::memcpy(static_cast<uint8_t*>(out.raw()) + row_bytes * filled,
                    static_cast<const uint8_t*>(t->raw()) + row_bytes * from, row_bytes * n);
        filled += n;
        at += n;
      }
      feed[s.input->name] = std::move(out);
    }
    return std::vector<Feed>{std::move(feed)};
  }

 private:
  // File f of stream s, read once while consecutive batches use it.
  Expected<const Tensor*> file(const Stream& s, size_t f) const {
    auto& [path, t] = cached_[s.input];
    if (path != s.files[f]) {
      KILN_ASSIGN_OR_RETURN(t, s.load(s.files[f]));
      path = s.files[f];
    }
    return &t;
  }

  std::vector<Stream> streams_;
  int64_t batch_;
  size_t n_;
  mutable std::map<const Value*, std::pair<std::string, Tensor>> cached_;
};

// The stream of an image folder: the preprocessing `kiln run` gives an image input of this
// shape (channels 1 or 3, the input's height and width unless `o` resizes exactly), cast to the
// input's float type.
Expected<StreamCalibData::Stream> image_stream(const InputFiles& in,
                                               const BuildConfig::CalibImages& opts) {
  const TensorType& ty = in.input->type;
  if (!dtype_is_float(ty.dtype))
    return KILN_ERROR("calibration images for input '{}': the input is {}, not a float tensor",
                      in.input->name, dtype_name(ty.dtype));
  if (!ty.dims || ty.dims->size() != 4)
    return KILN_ERROR("calibration images for input '{}' ({}): the input is not 4-D",
                      in.input->name, ty.str());
  std::vector<int64_t> dims;
  for (const Dim& d : *ty.dims) dims.push_back(d.is_static() ? d.value : -1);
  ImagePreprocess o;
  o.nhwc = opts.nhwc;
  o.mean = opts.mean;
  o.std = opts.std;
  o.resize_short = opts.resize_short;
  o.crop_h = opts.resize_h;
  o.crop_w = opts.resize_w;
  const std::string what = fmt::format("calibration images for input '{}' ({})", in.input->name,
                                       ty.str());
  KILN_ASSIGN_OR_RETURN(ImagePreprocess p, image_preprocess_for(dims, std::move(o), what));
  // The samples must have the input's size: it is where they go.
  const int64_t h = dims[opts.nhwc ? 1 : 2], w = dims[opts.nhwc ? 2 : 3];
  if (p.crop_h <= 0 || p.crop_w <= 0)
    return KILN_ERROR("{}: its height and width are not fixed: give --shapes or --resize HxW",
                      what);
  if ((h > 0 && h != p.crop_h) || (w > 0 && w != p.crop_w))
    return KILN_ERROR("{}: --resize {}x{} does not give its height and width", what, p.crop_h,
                      p.crop_w);
  const int64_t c = p.channels;
  StreamCalibData::Stream s;
  s.input = in.input;
  s.files = in.files;
  for (size_t i = 0; i <= in.files.size(); ++i) s.first.push_back(static_cast<int64_t>(i));
  s.sample = opts.nhwc ? std::vector<int64_t>{p.crop_h, p.crop_w, c}
                    : std::vector<int64_t>{c, p.crop_h, p.crop_w};
  const DataType t = ty.dtype;
  s.load = [p, t](const std::string& path) -> Expected<Tensor> {
    KILN_ASSIGN_OR_RETURN(Tensor x, load_image(path, p));
    return t == DataType::kFloat32 ? x : x.cast(t);
  };
  return s;
}

// Whether the files (headers only) hold whole batches of every input's fixed batch size. When
// not, and every input's batch is fixed at one B with files that fit otherwise, the stream
// form applies; `*streams` gets the inputs' sample counts per file.
Expected<bool> needs_stream(const std::vector<InputFiles>& inputs,
                            std::vector<StreamCalibData::Stream>* streams,
                            std::vector<std::vector<NpyInfo>>* headers, int64_t* batch) {
  bool whole = true, all_fixed = true;
  *batch = 0;
  for (const InputFiles& in : inputs) {
    const TensorType& ty = in.input->type;
    const bool fixed = ty.dims && !ty.dims->empty() && (*ty.dims)[0].is_static() &&
                       (*ty.dims)[0].value > 0 && ty.static_shape().has_value();
    if (!fixed || (*batch && (*ty.dims)[0].value != *batch)) all_fixed = false;
    if (fixed && !*batch) *batch = (*ty.dims)[0].value;
    StreamCalibData::Stream s;
    s.input = in.input;
    s.files = in.files;
    s.first = {0};
    if (ty.dims)
      for (size_t d = 1; d < ty.dims->size(); ++d) s.sample.push_back((*ty.dims)[d].value);
    s.load = [](const std::string& path) { return read_npy(path); };
    headers->emplace_back();
    for (const std::string& f : in.files) {
      KILN_ASSIGN_OR_RETURN(NpyInfo info, read_npy_info(f));
      headers->back().push_back(info);
      const int64_t rank = static_cast<int64_t>(ty.dims ? ty.dims->size() : 0);
      const int64_t rows = static_cast<int64_t>(info.shape.size()) + 1 == rank ? 1
                           : info.shape.empty()                               ? 0
                                                                              : info.shape[0];
      if (fixed && rows % (*ty.dims)[0].value != 0) whole = false;
      s.first.push_back(s.first.back() + rows);
    }
    streams->push_back(std::move(s));
  }
  return !whole && all_fixed;
}

// The streams as batches of `batch` samples (every input the same number of samples; at least
// one batch), at most `max_batches` (0: all).
Expected<std::unique_ptr<CalibData>> stream_data(std::vector<StreamCalibData::Stream> streams,
                                                 int64_t batch, size_t max_batches) {
  const int64_t total = streams[0].first.back();
  for (const auto& s : streams)
    if (s.first.back() != total)
      return KILN_ERROR("calibration data: input '{}' has {} samples but '{}' has {}",
                        streams[0].input->name, total, s.input->name, s.first.back());
  if (total < batch)
    return KILN_ERROR(
        "calibration data holds {} samples of input '{}', fewer than one batch of the engine's {} "
        "(give at least {}, or calibrate a smaller-batch build with --calib-cache and give that "
        "cache here)",
        total, streams[0].input->name, batch, batch);
  size_t n = static_cast<size_t>(total / batch);
  if (max_batches > 0) n = std::min(n, max_batches);
  return std::unique_ptr<CalibData>(new StreamCalibData(std::move(streams), batch, n));
}

}  // namespace

Expected<std::unique_ptr<CalibData>> open_npy_calib_data(
    const std::map<std::string, std::string>& dirs, const Graph& g, size_t max_batches,
    const BuildConfig::CalibImages& images) {
  std::vector<InputFiles> inputs;
  for (const auto& [name, dir] : dirs) {
    const Value* in = nullptr;
    if (name.empty()) {
      if (g.inputs().size() != 1)
        return KILN_ERROR("the model has {} inputs: give calibration data as NAME=DIR for each",
                          g.inputs().size());
      in = g.inputs()[0];
    } else {
      for (const Value* v : g.inputs())
        if (v->name == name) in = v;
      if (!in)
        return KILN_ERROR("calibration data for '{}': the model has no input of that name", name);
    }
    KILN_ASSIGN_OR_RETURN(InputFiles files, list_files(dir, in));
    inputs.push_back(std::move(files));
  }
  for (const Value* v : g.inputs()) {
    const bool given =
        std::any_of(inputs.begin(), inputs.end(), [&](auto& i) { return i.input == v; });
    if (!given) return KILN_ERROR("no calibration data for input '{}' (give NAME=DIR)", v->name);
  }
  size_t n = inputs[0].files.size();
  for (const InputFiles& in : inputs)
    if (in.files.size() != n)
      return KILN_ERROR(
          "calibration data: '{}' has {} .npy files but '{}' has {} (one file per "
          "batch for every input)",
          inputs[0].dir, n, in.dir, in.files.size());
  const bool any_images =
      std::any_of(inputs.begin(), inputs.end(), [](const InputFiles& in) { return in.images; });
  if (images.any() && images.error_if_unused && !any_images)
    return Status::Error(
        "--resize, --mean, --std and --image-layout apply to calibration images; the "
        "calibration folders hold .npy files");
  if (any_images) {
    // Images: one sample each; batches of the inputs' fixed batch size (all the same), else 1.
    std::vector<StreamCalibData::Stream> streams;
    int64_t batch = -1;
    for (const InputFiles& in : inputs) {
      if (!in.images)
        return KILN_ERROR("calibration data: '{}' holds images but '{}' holds .npy files: use "
                          "one kind for every input",
                          std::find_if(inputs.begin(), inputs.end(), [](auto& i) { return i.images; })->dir,
                          in.dir);
      KILN_ASSIGN_OR_RETURN(StreamCalibData::Stream s, image_stream(in, images));
      const Dim& b = (*in.input->type.dims)[0];
      const int64_t this_batch = b.is_static() && b.value > 0 ? b.value : 1;
      if (batch >= 0 && this_batch != batch)
        return Status::Error("calibration images: the inputs' batch sizes differ");
      batch = this_batch;
      streams.push_back(std::move(s));
    }
    return stream_data(std::move(streams), batch, max_batches);
  }
  std::vector<StreamCalibData::Stream> streams;
  std::vector<std::vector<NpyInfo>> headers;  // per input, per file
  int64_t batch = 0;
  KILN_ASSIGN_OR_RETURN(bool stream, needs_stream(inputs, &streams, &headers, &batch));
  if (stream) {
    // Each file is checked against its input (type, non-batch dims) before any is read.
    for (size_t i = 0; i < inputs.size(); ++i)
      for (size_t k = 0; k < inputs[i].files.size(); ++k) {
        const InputFiles& in = inputs[i];
        const std::string& f = in.files[k];
        const NpyInfo& info = headers[i][k];
        const TensorType& ty = in.input->type;
        const size_t rank = ty.dims->size();
        const bool sample = info.shape.size() + 1 == rank;
        bool ok = info.dtype == ty.dtype && (sample || info.shape.size() == rank);
        for (size_t d = 1; ok && d < rank; ++d)
          ok = (*ty.dims)[d].value == info.shape[sample ? d - 1 : d];
        if (!ok)
          return KILN_ERROR("calibration file '{}': {}{} does not fit input '{}' of {}", f,
                            dtype_name(info.dtype), shape_str(info.shape), in.input->name,
                            ty.str());
      }
    return stream_data(std::move(streams), batch, max_batches);
  }
  if (max_batches > 0) n = std::min(n, max_batches);
  return std::unique_ptr<CalibData>(new NpyCalibData(std::move(inputs), n));
}

}  // namespace kiln::quant
