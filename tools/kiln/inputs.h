// Input tensors for `kiln run` and `kiln compare`: files given with --input NAME=FILE (.npy,
// ONNX TensorProto .pb, or an image: JPEG/PNG/BMP/...), seeded random data for the rest.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/image.h"
#include "kiln/engine.h"

namespace kiln::cli {

struct InputFlags {
  std::vector<std::string> inputs;  // NAME=FILE
  std::string resize, mean, std, layout = "NCHW";
};
// --input, --resize, --mean, --std, --image-layout.
void add_input_flags(CLI::App* cmd, InputFlags& f);
// Only the image options (--resize, --mean, --std, --image-layout), for commands whose images
// are calibration data (kiln build, kiln bench).
void add_image_flags(CLI::App* cmd, InputFlags& f);
// The image options as the builder's calibration-image preprocessing.
Expected<BuildConfig::CalibImages> calib_image_options(const InputFlags& f);

// The image options for input `info`: channels and crop size from its declared shape.
Expected<ImagePreprocess> image_options(const InputFlags& f, const TensorInfo& info);

// One tensor per --input (checked against the model's input names), then seeded random data
// for the inputs not given (shape from `shapes`, else the declared one with dynamic dims 1).
// `images_elsewhere`: the image options also serve calibration images (kiln run --int8 --calib)
// or a dataset's (kiln compare --dataset), so they are no error without an image input.
Expected<std::map<std::string, Tensor>> load_inputs(const std::vector<TensorInfo>& model_inputs,
                                                    const InputFlags& f, const ShapeMap& shapes,
                                                    std::mt19937& rng, bool images_elsewhere = false);

// A tensor of `info`'s type with uniform random values ([-1, 1]; integers 0..9; bools 0/1).
Expected<Tensor> random_input(const TensorInfo& info, const ShapeMap& shapes, std::mt19937& rng);

}  // namespace kiln::cli
