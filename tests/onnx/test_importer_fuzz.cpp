// Inputs found by tests/fuzz/fuzz_onnx_import (tests/fuzz/README.md): each must come back as an
// error that names the problem, not a crash, a sanitizer report or an unbounded allocation.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "onnx/importer.h"
#include "onnx/onnx.pb.h"

namespace kiln {
namespace {

onnx::ModelProto model_with_graph() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(17);
  m.mutable_graph()->set_name("g");
  return m;
}

Status import_status(const onnx::ModelProto& m) {
  std::string bytes;
  m.SerializeToString(&bytes);
  return import_onnx_bytes(bytes, "/nonexistent", "fuzz.onnx").status();
}

// A tensor whose shape claims 2^40 floats and which holds none: the count is checked before the
// tensor is allocated (it was allocated first: 4 TB, std::bad_alloc across the API).
TEST(ImporterFuzz, HugeShapeWithoutDataIsRefusedBeforeAllocating) {
  for (int elem : {onnx::TensorProto::FLOAT, onnx::TensorProto::INT64, onnx::TensorProto::UINT8,
                   onnx::TensorProto::FLOAT16, onnx::TensorProto::UINT32}) {
    auto m = model_with_graph();
    auto* init = m.mutable_graph()->add_initializer();
    init->set_name("w");
    init->set_data_type(elem);
    init->add_dims(int64_t{1} << 20);
    init->add_dims(int64_t{1} << 20);
    const Status st = import_status(m);
    ASSERT_FALSE(st.ok()) << elem;
    EXPECT_NE(st.message().find("initializer 'w': holds 0 values but its shape"), std::string::npos)
        << st.message();
  }
}

TEST(ImporterFuzz, HugeConstantNodeWithoutDataIsRefused) {
  auto m = model_with_graph();
  auto* n = m.mutable_graph()->add_node();
  n->set_op_type("Constant");
  n->add_output("c");
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::DOUBLE);
  a->mutable_t()->add_dims(int64_t{1} << 40);
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("holds 0 values"), std::string::npos) << st.message();
}

void add_input(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims) {
  auto* vi = g->add_input();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape();  // rank 0 when dims is empty
  for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

void add_int64_constant(onnx::GraphProto* g, const std::string& out, std::vector<int64_t> values) {
  auto* n = g->add_node();
  n->set_op_type("Constant");
  n->add_output(out);
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  a->mutable_t()->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) a->mutable_t()->add_int64_data(v);
}

onnx::NodeProto* add_op(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                        const std::string& out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  for (auto& i : in) n->add_input(i);
  n->add_output(out);
  return n;
}

// The fuzzer's input: Reshape of a [1,2] tensor to [1,1,6701356245527298049,2] (then Tile): the
// element count of the target overflowed int64 in static_product (UBSan). Now the product is
// checked and no tensor may exceed 2^48 elements.
TEST(ImporterFuzz, ReshapeToAHugeShapeIsRefused) {
  auto m = model_with_graph();
  m.mutable_opset_import(0)->set_version(6);
  auto* g = m.mutable_graph();
  add_input(g, "x", {1, 2});
  add_int64_constant(g, "shape", {1, 1, 6701356245527298049, 2});
  add_op(g, "Reshape", {"x", "shape"}, "r");
  add_int64_constant(g, "reps", {1, 2, 3, 4});
  add_op(g, "Tile", {"r", "reps"}, "y");
  g->add_output()->set_name("y");
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("node 'Reshape_1' (Reshape, #0): output 'r' has type "
                              "float32[1,1,6701356245527298049,2], more than 2^48 elements"),
            std::string::npos) << st.message();
}

// Reshape of a [1,9,4,4] input to [-1, 2^40, 2^40] (found by tests/fuzz/fuzz_build): the product
// of the requested dims overflowed int64 in mul_dims while inferring the -1 (UBSan: signed
// overflow). A product past int64 is no size now, as in static_product, and the output's type is
// refused for its element count.
TEST(ImporterFuzz, ReshapeWhoseShapeProductOverflowsIsRefused) {
  auto m = model_with_graph();
  auto* g = m.mutable_graph();
  add_input(g, "x", {1, 9, 4, 4});
  add_int64_constant(g, "shape", {-1, int64_t(1) << 40, int64_t(1) << 40});
  add_op(g, "Reshape", {"x", "shape"}, "y");
  g->add_output()->set_name("y");
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("(Reshape, #0): output 'y' has type float32[?,1099511627776,"
                              "1099511627776], more than 2^48 elements"),
            std::string::npos) << st.message();
}

// A graph input declared with dims whose product passes 2^48 elements is refused before any op
// computes with them.
TEST(ImporterFuzz, HugeDeclaredInputIsRefused) {
  auto m = model_with_graph();
  auto* g = m.mutable_graph();
  add_input(g, "x", {int64_t{1} << 30, int64_t{1} << 30});
  add_op(g, "Relu", {"x"}, "y");
  g->add_output()->set_name("y");
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("graph input 'x' has type float32[1073741824,1073741824], more "
                              "than 2^48 elements"), std::string::npos) << st.message();
}

// Split of a scalar (the fuzzer's input: test_split_zero_size_splits with its input's shape
// cut to rank 0): split_infer indexed the input's dims at the axis (UBSan: a reference to
// element 0 of an empty vector).
TEST(ImporterFuzz, SplitOfAScalarIsRefused) {
  auto m = model_with_graph();
  auto* g = m.mutable_graph();
  add_input(g, "x", {});
  add_int64_constant(g, "split", {0, 0, 0});
  auto* n = add_op(g, "Split", {"x", "split"}, "a");
  n->add_output("b");
  n->add_output("c");
  g->add_output()->set_name("a");
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("(Split, #0): cannot split a scalar"), std::string::npos)
      << st.message();
}

// ArgMax of a declared scalar: shape inference indexed the axis of an empty shape (UBSan: a
// reference bound to null in arg_infer). The CPU kernel refused it already; inference does now.
TEST(ImporterFuzz, ArgMaxOfAScalarIsRefused) {
  auto m = model_with_graph();
  auto* g = m.mutable_graph();
  add_input(g, "x", {});
  add_op(g, "ArgMax", {"x"}, "y");
  g->add_output()->set_name("y");
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("(ArgMax, #0): input must have rank >= 1"), std::string::npos)
      << st.message();
}

// TopK of a declared scalar along axis 0 (found by tests/fuzz/fuzz_build): topk_infer indexed
// the axis of an empty shape (UBSan: a reference bound to null), because normalize_axis took
// axis 0 of a scalar. A scalar has no axis now, for every op that names one: each of these is
// refused with a message naming the node and the scalar, not indexed.
TEST(ImporterFuzz, AnAxisOfAScalarIsRefused) {
  for (const char* op : {"TopK", "Softmax", "LogSoftmax", "Hardmax", "CumSum", "Concat", "Gather"}) {
    auto m = model_with_graph();
    auto* g = m.mutable_graph();
    add_input(g, "x", {});
    onnx::NodeProto* n = nullptr;
    const std::string o = op;
    if (o == "TopK") {
      add_int64_constant(g, "k", {1});
      n = add_op(g, op, {"x", "k"}, "y");
      n->add_output("i");
    } else if (o == "CumSum") {
      add_int64_constant(g, "axis", {0});
      n = add_op(g, op, {"x", "axis"}, "y");
    } else if (o == "Gather") {
      add_int64_constant(g, "i", {0});
      n = add_op(g, op, {"x", "i"}, "y");
    } else {
      n = add_op(g, op, {"x"}, "y");
    }
    auto* axis = n->add_attribute();
    axis->set_name("axis");
    axis->set_type(onnx::AttributeProto::INT);
    axis->set_i(0);
    g->add_output()->set_name("y");
    const Status st = import_status(m);
    ASSERT_FALSE(st.ok()) << op;
    EXPECT_NE(st.message().find(std::string("(") + op + ", #"), std::string::npos) << st.message();
  }
}

// Tile of a [10753,1,1,2] tensor by [576460752303423489,0,3,4]: dim x repeats overflowed int64
// in tile_infer (UBSan). Checked now, as are the other products of a dim and a number from the
// model in shape inference (Conv's and ConvTranspose's group, DepthToSpace's block, Attention's
// heads x head size).
TEST(ImporterFuzz, TileOverflowingInt64IsRefused) {
  auto m = model_with_graph();
  m.mutable_opset_import(0)->set_version(6);
  auto* g = m.mutable_graph();
  add_input(g, "x", {10753, 2});
  add_int64_constant(g, "shape", {10753, 1, 1, 2});
  add_op(g, "Reshape", {"x", "shape"}, "r");
  add_int64_constant(g, "reps", {576460752303423489, 0, 3, 4});
  add_op(g, "Tile", {"r", "reps"}, "y");
  g->add_output()->set_name("y");
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("(Tile, #1): dim 0 (10753) repeated 576460752303423489 times "
                              "overflows int64"), std::string::npos) << st.message();
}

// Conv with a group so large that W's channels x group overflows int64.
TEST(ImporterFuzz, ConvGroupOverflowingInt64IsRefused) {
  auto m = model_with_graph();
  auto* g = m.mutable_graph();
  add_input(g, "x", {1, 4, 8, 8});
  add_input(g, "w", {4, 2, 3, 3});
  auto* n = add_op(g, "Conv", {"x", "w"}, "y");
  auto* a = n->add_attribute();
  a->set_name("group");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(int64_t{1} << 62);
  g->add_output()->set_name("y");
  const Status st = import_status(m);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

// Squeeze of a scalar by an axes input that is a graph input of length 1 (the fuzzer's input):
// the output's rank, 0 - 1, made a std::vector of -1 elements (std::length_error, an abort in the
// fuzzer). Unsqueeze and Reshape read a rank from an input's declared length the same way.
TEST(ImporterFuzz, RankFromAnInputsDeclaredLengthIsBounded) {
  struct Case {
    const char* op;
    std::vector<int64_t> x, len;
    const char* what;
  };
  for (const Case& c : {Case{"Squeeze", {}, {1}, "squeezing"},
                        Case{"Unsqueeze", {2}, {int64_t{1} << 40}, "inserting"},
                        Case{"Reshape", {2}, {int64_t{1} << 40}, "the shape's length"}}) {
    auto m = model_with_graph();
    auto* g = m.mutable_graph();
    add_input(g, "x", c.x);
    add_input(g, "a", c.len);
    g->mutable_input(1)->mutable_type()->mutable_tensor_type()->set_elem_type(
        onnx::TensorProto::INT64);
    add_op(g, c.op, {"x", "a"}, "y");
    g->add_output()->set_name("y");
    const Status st = import_status(m);
    ASSERT_FALSE(st.ok()) << c.op;
    EXPECT_NE(st.message().find(c.what), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("(0 to 1024)"), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  }
}

// Found by fuzz_build: SplitToSequence read by a SequenceAt that has no output. The lowering of
// SplitToSequence into Slices read the reader's output 0 unchecked (protobuf aborts); such a
// reader is now left alone, and the importer refuses the graph with a message.
TEST(ImporterFuzz, SequenceAtWithoutAnOutputIsRefused) {
  auto m = model_with_graph();
  auto* g = m.mutable_graph();
  add_input(g, "x", {3, 4});
  add_int64_constant(g, "pos", {1});
  add_op(g, "SplitToSequence", {"x"}, "seq");
  auto* at = add_op(g, "SequenceAt", {"seq", "pos"}, "y");
  at->clear_output();
  g->add_output()->set_name("x");
  const Status st = import_status(m);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kiln
