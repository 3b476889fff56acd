// Data-dependent layers (layers/data_dependent.cu, layers/nms.cu), run in the executor's dynamic
// region: NonZero of every storage type and rank, sparse, dense and empty; NonMaxSuppression
// over batches and classes, both box encodings, with and without a score threshold, limits that
// bind and that do not, ties and boxes in both corner orders. Inputs are larger than the 1024
// values below which these ops run on the host. Coordinates and scores are multiples of 1/8 and
// 1/256, which float16 stores exactly, so the FP16 engine selects what the reference selects.
#include "backend_ops.h"

namespace kiln::gpu::test {
namespace {

using Modes = std::vector<std::string>;
const Modes kF = {"fp32", "fp16"};

OpCase make(std::string name, std::string op, Attributes a, std::vector<CaseInput> ins,
            Modes modes) {
  OpCase c;
  c.name = std::move(name);
  c.op_type = std::move(op);
  c.attrs = std::move(a);
  c.inputs = std::move(ins);
  c.modes = std::move(modes);
  return c;
}

// Random values of which about `zeros` of every 4 are 0 (integers in [-z, 3 - z]).
CaseInput sparse(std::vector<int64_t> shape, DataType t, int zeros) {
  CaseInput c = in(std::move(shape), t, -zeros, 3 - zeros);
  c.step = 1;  // floats: whole numbers, so zeros are exact
  return c;
}

std::vector<OpCase> nonzero_cases() {
  std::vector<OpCase> v;
  v.push_back(make("NonZero_f32_2d", "NonZero", {}, {sparse({37, 61}, DataType::kFloat32, 2)}, kF));
  v.push_back(make("NonZero_f32_4d", "NonZero", {}, {sparse({2, 3, 17, 29}, DataType::kFloat32, 3)}, kF));
  v.push_back(make("NonZero_dense_1d", "NonZero", {}, {sparse({5000}, DataType::kFloat32, 0)}, kF));
  v.push_back(make("NonZero_none", "NonZero", {}, {in({40, 40}, DataType::kFloat32, 0, 0)}, kF));
  v.push_back(make("NonZero_bool", "NonZero", {}, {in({3, 1000}, DataType::kBool)}, {"fp32"}));
  v.push_back(make("NonZero_i64", "NonZero", {}, {sparse({7, 11, 13}, DataType::kInt64, 2)}, {"fp32"}));
  v.push_back(make("NonZero_i32_long", "NonZero", {}, {sparse({70001}, DataType::kInt32, 3)}, {"fp32"}));
  return v;
}

CaseInput boxes(int64_t b, int64_t n) {
  CaseInput c = in({b, n, 4}, DataType::kFloat32, 0, 32);
  c.step = 0.125;
  return c;
}
CaseInput scores(int64_t b, int64_t c, int64_t n) {
  CaseInput s = in({b, c, n}, DataType::kFloat32, 0, 1);
  s.step = 1.0 / 256;  // ties happen: equal scores keep index order
  return s;
}

OpCase nms(std::string name, int64_t b, int64_t c, int64_t n, int64_t max_out, float iou,
           std::optional<float> score, int64_t center = 0) {
  std::vector<CaseInput> ins = {boxes(b, n), scores(b, c, n), konst(Tensor::from<int64_t>({1}, {max_out})),
                                konst(Tensor::from<float>({1}, {iou}))};
  if (score) ins.push_back(konst(Tensor::from<float>({1}, {*score})));
  return make("NMS_" + std::move(name), "NonMaxSuppression",
              attrs({{"center_point_box", Attribute::Int(center)}}), std::move(ins), kF);
}

std::vector<OpCase> nms_cases() {
  std::vector<OpCase> v;
  v.push_back(nms("one_class", 1, 1, 300, 1000, 0.5f, std::nullopt));
  v.push_back(nms("classes_limit", 1, 5, 300, 7, 0.3f, 0.25f));
  v.push_back(nms("batches", 3, 4, 130, 50, 0.5f, 0.5f));
  v.push_back(nms("center", 2, 3, 257, 20, 0.45f, 0.1f, 1));
  v.push_back(nms("many_boxes", 1, 1, 5000, 300, 0.5f, 0.05f));
  v.push_back(nms("iou_zero", 1, 2, 600, 100, 0.0f, std::nullopt));
  v.push_back(nms("none_selected", 1, 2, 600, 0, 0.5f, std::nullopt));
  return v;
}

}  // namespace

std::vector<OpCase> dynamic_cases() {
  std::vector<OpCase> v = nonzero_cases();
  for (OpCase& c : nms_cases()) v.push_back(std::move(c));
  return v;
}

}  // namespace kiln::gpu::test
