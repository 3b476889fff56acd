#include "inputs.h"

#include "cli.h"
#include "core/npy.h"
#include "onnx/tensor_proto.h"

namespace kiln::cli {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Expected<std::vector<float>> parse_floats(const std::string& spec, const char* flag) {
  std::vector<float> out;
  size_t start = 0;
  while (start < spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    size_t used = 0;
    float v = 0;
    try {
      v = std::stof(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      return KILN_ERROR("{} '{}': '{}' is not a number (give e.g. 0.485,0.456,0.406)", flag, spec,
                        item);
    out.push_back(v);
  }
  return out;
}

// "256" (shorter side) or "224x224" (exact height x width).
Status parse_resize(const std::string& spec, ImagePreprocess& p) {
  if (spec.empty()) return Status::Ok();
  auto number = [&](const std::string& s) -> Expected<int> {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(s) == 0)
      return KILN_ERROR("--resize '{}' must be R (shorter side) or HxW, positive whole numbers",
                        spec);
    return std::stoi(s);
  };
  const size_t x = spec.find('x');
  if (x == std::string::npos) {
    KILN_ASSIGN_OR_RETURN(p.resize_short, number(spec));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(p.crop_h, number(spec.substr(0, x)));
  KILN_ASSIGN_OR_RETURN(p.crop_w, number(spec.substr(x + 1)));
  p.resize_short = 0;
  return Status::Ok();
}

}  // namespace

void add_input_flags(CLI::App* cmd, InputFlags& f) {
  cmd->add_option("--input", f.inputs,
                  "NAME=FILE: .npy, ONNX .pb, or an image (.jpg/.png/...); repeat per input. "
                  "Inputs not given get seeded random data");
  add_image_flags(cmd, f);
}

void add_image_flags(CLI::App* cmd, InputFlags& f) {
  cmd->add_option(
      "--resize", f.resize,
      "Images: R = shorter side to R then center crop to the input's HxW (torchvision's "
      "Resize(R)+CenterCrop); HxW = exactly HxW. Default: exactly the input's HxW");
  cmd->add_option("--mean", f.mean,
                  "Images: per-channel mean of values in [0,1], e.g. 0.485,0.456,0.406");
  cmd->add_option("--std", f.std, "Images: per-channel std, e.g. 0.229,0.224,0.225");
  // Not --layout: that build flag already names the engine's internal layout (auto/linear/nhwc).
  cmd->add_option("--image-layout", f.layout, "Images: NCHW (default) or NHWC")
      ->check(CLI::IsMember({"NCHW", "NHWC", "nchw", "nhwc"}));
}

Expected<BuildConfig::CalibImages> calib_image_options(const InputFlags& f) {
  BuildConfig::CalibImages o;
  o.nhwc = f.layout == "NHWC" || f.layout == "nhwc";
  KILN_ASSIGN_OR_RETURN(o.mean, parse_floats(f.mean, "--mean"));
  KILN_ASSIGN_OR_RETURN(o.std, parse_floats(f.std, "--std"));
  ImagePreprocess p;
  KILN_RETURN_IF_ERROR(parse_resize(f.resize, p));
  o.resize_short = p.resize_short;
  o.resize_h = p.crop_h;
  o.resize_w = p.crop_w;
  return o;
}

Expected<ImagePreprocess> image_options(const InputFlags& f, const TensorInfo& info) {
  ImagePreprocess p;
  p.nhwc = f.layout == "NHWC" || f.layout == "nhwc";
  KILN_ASSIGN_OR_RETURN(p.mean, parse_floats(f.mean, "--mean"));
  KILN_ASSIGN_OR_RETURN(p.std, parse_floats(f.std, "--std"));
  KILN_RETURN_IF_ERROR(parse_resize(f.resize, p));
  return image_preprocess_for(info.dims, std::move(p),
                              fmt::format("input '{}' ({})", info.name, info.str()));
}

Expected<Tensor> random_input(const TensorInfo& info, const ShapeMap& shapes, std::mt19937& rng) {
  std::vector<int64_t> shape;
  if (auto it = shapes.find(info.name); it != shapes.end()) {
    shape = it->second;
  } else {
    for (int64_t d : info.dims) shape.push_back(d >= 0 ? d : 1);  // dynamic dims default to 1
  }
  Tensor t(info.dtype == DataType::kUndefined ? DataType::kFloat32 : info.dtype, shape);
  if (!dtype_is_supported(t.dtype()))
    return KILN_ERROR("input '{}': cannot make random data of type {}", info.name,
                      dtype_name(t.dtype()));
  Tensor f(DataType::kFloat32, shape);
  std::uniform_real_distribution<float> uf(-1.f, 1.f);
  std::uniform_int_distribution<int> ui(0, 9);
  const bool is_float = dtype_is_float(t.dtype());
  for (int64_t i = 0; i < f.numel(); ++i)
    f.data<float>()[i] =
        is_float ? uf(rng) : static_cast<float>(ui(rng) % (t.dtype() == DataType::kBool ? 2 : 10));
  return f.cast(t.dtype());
}

Expected<std::map<std::string, Tensor>> load_inputs(const std::vector<TensorInfo>& model_inputs,
                                                    const InputFlags& f, const ShapeMap& shapes,
                                                    std::mt19937& rng, bool images_elsewhere) {
  std::map<std::string, Tensor> out;
  bool any_image = false;
  for (const std::string& spec : f.inputs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      return KILN_ERROR("--input '{}' must look like NAME=FILE", spec);
    const std::string name = spec.substr(0, eq), path = spec.substr(eq + 1);
    const TensorInfo* info = nullptr;
    for (const auto& i : model_inputs)
      if (i.name == name) info = &i;
    if (!info) return KILN_ERROR("--input: the model has no input named '{}'", name);
    if (out.count(name)) return KILN_ERROR("--input: '{}' given twice", name);
    Tensor t;
    if (ends_with(path, ".npy")) {
      KILN_ASSIGN_OR_RETURN(t, read_npy(path));
    } else if (ends_with(path, ".pb")) {
      KILN_ASSIGN_OR_RETURN(t, read_tensor_pb_file(path));
    } else if (is_image_path(path)) {
      any_image = true;
      KILN_ASSIGN_OR_RETURN(ImagePreprocess p, image_options(f, *info));
      KILN_ASSIGN_OR_RETURN(t, load_image(path, p));
      if (info->dtype != DataType::kFloat32 && dtype_is_float(info->dtype)) t = t.cast(info->dtype);
    } else {
      return KILN_ERROR(
          "{}: input files must be .npy, ONNX TensorProto .pb, or an image "
          "(.jpg, .png, .bmp, ...)",
          path);
    }
    // NumPy has no bfloat16: such inputs come as uint16 bit patterns.
    if (info->dtype == DataType::kBFloat16 && t.dtype() == DataType::kUInt16)
      t = Tensor::view(DataType::kBFloat16, t.shape(), t.raw(), std::make_shared<Tensor>(t));
    out[name] = std::move(t);
  }
  if (!any_image && !images_elsewhere &&
      (!f.resize.empty() || !f.mean.empty() || !f.std.empty() ||
       (f.layout != "NCHW" && f.layout != "nchw")))
    return Status::Error(
        "--resize, --mean, --std and --image-layout apply to image inputs "
        "(--input NAME=photo.jpg); no image was given");
  for (const auto& info : model_inputs) {
    if (out.count(info.name)) continue;
    KILN_ASSIGN_OR_RETURN(Tensor t, random_input(info, shapes, rng));
    out[info.name] = std::move(t);
  }
  return out;
}

}  // namespace kiln::cli
