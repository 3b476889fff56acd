#include <gtest/gtest.h>

#include <set>

#include "ops/op.h"

namespace kiln {
namespace {

TEST(Registry, EveryOpIsDefinedOnceWithInferenceAndKernel) {
  EXPECT_TRUE(duplicate_op_definitions().empty())
      << "defined twice: " << fmt::format("{}", fmt::join(duplicate_op_definitions(), ", "));
  for (const OpDef* d : all_ops()) {
    EXPECT_NE(d->infer, nullptr) << d->op_type;
    EXPECT_NE(d->cpu, nullptr) << d->op_type;
  }
}

TEST(Registry, CoversTheCoreOpSet) {
  const char* core[] = {
      "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Relu", "LeakyRelu", "Sigmoid", "Tanh",
      "Erf", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Clip",
      "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "PRelu", "Not", "IsNaN", "IsInf", "Add",
      "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Mod", "Equal", "Greater",
      "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Xor", "Where", "Conv",
      "ConvTranspose", "BatchNormalization", "InstanceNormalization", "LayerNormalization",
      "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Gemm", "MatMul", "Softmax",
      "LogSoftmax", "Hardmax", "Dropout", "Resize", "Pad", "DepthToSpace", "SpaceToDepth",
      "Reshape", "Shape", "Size", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat",
      "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Cast",
      "CastLike", "Constant", "ConstantOfShape", "Identity", "Range", "Trilu", "CumSum", "TopK",
      "ArgMax", "ArgMin", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
      "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
      "QuantizeLinear", "DequantizeLinear"};
  for (const char* op : core) EXPECT_NE(find_op("", op), nullptr) << op;
  EXPECT_EQ(find_op("", "NoSuchOp"), nullptr);
  EXPECT_EQ(find_op("ai.onnx", "Relu"), find_op("", "Relu"));
}

}  // namespace
}  // namespace kiln
