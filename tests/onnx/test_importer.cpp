#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "onnx/importer.h"
#include "onnx/onnx.pb.h"
#include "onnx/tensor_proto.h"
#include "ops/op.h"

namespace kiln {
namespace {

onnx::ModelProto make_model(int opset) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(opset);
  m.mutable_graph()->set_name("g");
  return m;
}

void add_io(onnx::ValueInfoProto* vi, const std::string& name, int elem,
            const std::vector<std::string>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* shape = tt->mutable_shape();
  for (const auto& d : dims) {
    auto* dim = shape->add_dim();
    if (!d.empty() && std::isdigit(static_cast<unsigned char>(d[0]))) dim->set_dim_value(std::stoll(d));
    else dim->set_dim_param(d);
  }
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out, const std::string& name = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (auto& i : in) n->add_input(i);
  for (auto& o : out) n->add_output(o);
  return n;
}

Expected<std::unique_ptr<Graph>> import(const onnx::ModelProto& m, const std::string& dir = ".") {
  std::string bytes;
  m.SerializeToString(&bytes);
  return import_onnx_bytes(bytes, dir, "test.onnx");
}

TEST(Importer, SymbolicDimsPropagate) {
  auto m = make_model(17);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"N", "3"});
  add_node(g, "Relu", {"x"}, {"y"}, "relu");
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"N", "3"});
  auto r = import(m);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Value* y = (*r)->outputs()[0];
  EXPECT_EQ(y->type.str(), "float32[N,3]");
  EXPECT_EQ((*r)->nodes()[0]->onnx_nodes, std::vector<std::string>{"relu"});
}

TEST(Importer, DimParamMadeOfDigitsStaysSymbolic) {
  // torch 2.6's dynamo exporter names a dynamic dim after its example size ("16"): a name, not
  // the size 16, which the symbol algebra would read it as.
  auto m = make_model(17);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"N", "3"});
  g->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_param("16");
  add_node(g, "Relu", {"x"}, {"y"}, "relu");
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"N", "3"});
  auto r = import(m);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Value* x = (*r)->inputs()[0];
  EXPECT_FALSE((*x->type.dims)[0].is_static());
  EXPECT_EQ(x->type.str(), "float32[dim16,3]");
}

// An int64 initializer of the given dims (none: a scalar).
void add_ints(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> v,
              std::vector<int64_t> dims) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : dims) t->add_dims(d);
  for (int64_t x : v) t->add_int64_data(x);
}

// SplitToSequence(x [2, 5], split) read by SequenceAt at positions 0 and -1 (or 1).
std::vector<std::string> sequence_parts(const std::vector<int64_t>& split, bool scalar,
                                        int64_t keepdims, std::vector<std::string>* shapes) {
  auto m = make_model(17);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2", "5"});
  std::vector<std::string> ins = {"x"};
  if (!split.empty()) {
    add_ints(g, "split", split,
             scalar ? std::vector<int64_t>{} : std::vector<int64_t>{int64_t(split.size())});
    ins.push_back("split");
  }
  auto* s = add_node(g, "SplitToSequence", ins, {"seq"}, "s");
  auto* ax = s->add_attribute();
  ax->set_name("axis"), ax->set_type(onnx::AttributeProto::INT), ax->set_i(1);
  auto* kd = s->add_attribute();
  kd->set_name("keepdims"), kd->set_type(onnx::AttributeProto::INT), kd->set_i(keepdims);
  add_ints(g, "p0", {0}, {});
  add_ints(g, "p1", {scalar || split.empty() ? 1 : -1}, {});
  add_node(g, "SequenceAt", {"seq", "p0"}, {"a"}, "at0");
  add_node(g, "SequenceAt", {"seq", "p1"}, {"b"}, "at1");
  add_io(g->add_output(), "a", onnx::TensorProto::FLOAT, {});
  add_io(g->add_output(), "b", onnx::TensorProto::FLOAT, {});
  auto r = import(m);
  EXPECT_TRUE(r.ok()) << r.status().message();
  std::vector<std::string> ops;
  if (!r.ok()) return ops;
  for (const Node* n : (*r)->nodes()) ops.push_back(n->op_type);
  for (const Value* o : (*r)->outputs()) shapes->push_back(o->type.str());
  return ops;
}

TEST(Importer, SplitToSequenceReadAtConstantPositionsIsSlices) {
  std::vector<std::string> shapes;
  EXPECT_EQ(sequence_parts({2, 3}, false, 1, &shapes),
            (std::vector<std::string>{"Slice", "Slice"}));
  EXPECT_EQ(shapes, (std::vector<std::string>{"float32[2,2]", "float32[2,3]"}));
  shapes.clear();  // chunks of 3: the last one shorter
  EXPECT_EQ(sequence_parts({3}, true, 1, &shapes), (std::vector<std::string>{"Slice", "Slice"}));
  EXPECT_EQ(shapes, (std::vector<std::string>{"float32[2,3]", "float32[2,2]"}));
  shapes.clear();  // unbind: parts of 1, squeezed
  auto ops = sequence_parts({}, false, 0, &shapes);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Squeeze"), 2);
  EXPECT_EQ(shapes, (std::vector<std::string>{"float32[2]", "float32[2]"}));
}

// A model-local function (torch 2.5's onnxscript helpers): each call becomes the body, its values
// renamed per call, an attribute of the body that refers to the call's taking the call's value.
TEST(Importer, LocalFunctionsAreInlined) {
  auto m = make_model(18);
  auto* f = m.add_functions();
  f->set_domain("pkg.test");
  f->set_name("scaled_relu");
  f->add_input("a");
  f->add_output("r");
  f->add_attribute("alpha");
  auto* body = f->add_node();
  body->set_op_type("LeakyRelu");
  body->add_input("a");
  body->add_output("t");
  auto* ref = body->add_attribute();
  ref->set_name("alpha"), ref->set_type(onnx::AttributeProto::FLOAT), ref->set_ref_attr_name("alpha");
  auto* neg = f->add_node();
  neg->set_op_type("Neg");
  neg->add_input("t");
  neg->add_output("r");
  auto* os = f->add_opset_import();
  os->set_domain(""), os->set_version(18);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"N", "3"});
  for (const char* call : {"c1", "c2"}) {
    auto* n = add_node(g, "scaled_relu", {call == std::string("c1") ? "x" : "y1"},
                       {call == std::string("c1") ? "y1" : "y2"}, call);
    n->set_domain("pkg.test");
    auto* a = n->add_attribute();
    a->set_name("alpha"), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(0.25f);
  }
  add_io(g->add_output(), "y2", onnx::TensorProto::FLOAT, {"N", "3"});
  auto r = import(m);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::vector<std::string> ops;
  for (const Node* n : (*r)->nodes()) ops.push_back(n->op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"LeakyRelu", "Neg", "LeakyRelu", "Neg"}));
  EXPECT_FLOAT_EQ((*r)->nodes()[2]->attrs.get_float("alpha", 0.f), 0.25f);
  EXPECT_EQ((*r)->outputs()[0]->type.str(), "float32[N,3]");
}

TEST(Importer, UnsortedNodesAreOrdered) {
  auto m = make_model(17);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2"});
  add_node(g, "Neg", {"t"}, {"y"}, "second");
  add_node(g, "Abs", {"x"}, {"t"}, "first");
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2"});
  auto r = import(m);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->nodes()[0]->name, "first");
}

TEST(Importer, RefusesAllUnsupportedOpsInOneMessage) {
  auto m = make_model(17);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2"});
  add_node(g, "Frobnicate", {"x"}, {"a"}, "f1");
  add_node(g, "Frobnicate", {"a"}, {"b"}, "f2");
  add_node(g, "Loop2", {"b"}, {"y"}, "l");
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2"});
  auto r = import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Frobnicate (nodes f1, f2)"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("Loop2 (node l)"), std::string::npos);
}

TEST(Importer, ConstantNodesBecomeConstants) {
  auto m = make_model(13);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2", "3"});
  auto* c = add_node(g, "Constant", {}, {"shape"}, "c");
  auto* a = c->add_attribute();
  a->set_name("value_ints");
  a->set_type(onnx::AttributeProto::INTS);
  a->add_ints(3);
  a->add_ints(2);
  add_node(g, "Reshape", {"x", "shape"}, {"y"}, "r");
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  auto r = import(m);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->nodes().size(), 1u);
  EXPECT_TRUE((*r)->nodes()[0]->input(1)->is_constant());
  EXPECT_EQ((*r)->outputs()[0]->type.str(), "float32[3,2]");
}

TEST(Importer, InitializerListedAsInputIsAConstant) {
  auto m = make_model(9);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2"});
  add_io(g->add_input(), "w", onnx::TensorProto::FLOAT, {"2"});
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(2);
  w->add_float_data(1.5f);
  w->add_float_data(-2.f);
  add_node(g, "Add", {"x", "w"}, {"y"});
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2"});
  auto r = import(m);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->inputs().size(), 1u);
  EXPECT_FLOAT_EQ((*r)->find_value("w")->constant->data<float>()[1], -2.f);
}

TEST(Importer, ExternalDataIsReadAndBoundsChecked) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kiln_ext_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const float vals[4] = {1, 2, 3, 4};
  {
    std::ofstream f(dir / "weights.bin", std::ios::binary);
    const char pad[16] = {};
    f.write(pad, 16);
    f.write(reinterpret_cast<const char*>(vals), sizeof(vals));
  }
  auto m = make_model(17);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"4"});
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto kv = [&](const std::string& k, const std::string& v) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  kv("location", "weights.bin");
  kv("offset", "16");
  kv("length", "16");
  add_node(g, "Mul", {"x", "w"}, {"y"});
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"4"});
  auto r = import(m, dir.string());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ((*r)->find_value("w")->constant->data<float>()[3], 4.f);

  w->mutable_external_data(1)->set_value("24");  // runs past the end of the file
  auto bad = import(m, dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("outside"), std::string::npos) << bad.status().message();
  w->mutable_external_data(0)->set_value("../etc/passwd");
  bad = import(m, dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("relative path"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TensorProto, TypedFieldsAndRawData) {
  onnx::TensorProto p;
  p.set_data_type(onnx::TensorProto::FLOAT16);
  p.add_dims(2);
  p.add_int32_data(0x3c00);  // 1.0
  p.add_int32_data(0xc000);  // -2.0
  auto t = tensor_from_proto(p, ".", "t");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_FLOAT_EQ(t->at_double(1), -2.0);

  onnx::TensorProto q;
  q.set_data_type(onnx::TensorProto::INT64);
  q.add_dims(3);
  q.set_raw_data(std::string(16, '\0'));  // 16 bytes for 3 int64: wrong size
  auto bad = tensor_from_proto(q, ".", "q");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("raw data has 16 bytes"), std::string::npos);

  onnx::TensorProto s;
  s.set_data_type(onnx::TensorProto::STRING);
  EXPECT_FALSE(tensor_from_proto(s, ".", "s").ok());
}

TEST(Importer, MalformedBytesAreRefused) {
  EXPECT_FALSE(import_onnx_bytes("", ".", "e.onnx").ok());
  EXPECT_FALSE(import_onnx_bytes(std::string(100, '\xff'), ".", "g.onnx").ok());
  EXPECT_FALSE(import_onnx_file("/nonexistent/model.onnx").ok());
}

// A model at an opset newer than kiln knows imports with a warning, since most ops do not
// change from one opset to the next.
TEST(Importer, OpsetNewerThanKnownImportsWithWarning) {
  auto m = make_model(kMaxOnnxOpset + 2);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2"});
  add_node(g, "Relu", {"x"}, {"y"}, "relu");
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2"});
  auto r = import(m);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ((*r)->warnings.size(), 1u);
  EXPECT_NE((*r)->warnings[0].find("newer than the newest kiln knows"), std::string::npos);
  EXPECT_EQ((*r)->opset, kMaxOnnxOpset + 2);
}

// Opsets between the old limit (21) and the newest known import without a warning.
TEST(Importer, CurrentOpsetsImport) {
  for (int opset : {22, 23, 25, kMaxOnnxOpset}) {
    auto m = make_model(opset);
    auto* g = m.mutable_graph();
    add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2", "3"});
    add_node(g, "Transpose", {"x"}, {"y"}, "t");
    add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"3", "2"});
    auto r = import(m);
    ASSERT_TRUE(r.ok()) << opset << ": " << r.status().message();
    EXPECT_TRUE((*r)->warnings.empty());
  }
}

TEST(Importer, OpOlderThanItsFirstVersionIsRefusedByName) {
  auto m = make_model(13);
  auto* g = m.mutable_graph();
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2"});
  add_node(g, "Gelu", {"x"}, {"y"}, "gelu");
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2"});
  auto r = import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("node 'gelu' (Gelu, #0): Gelu does not exist at opset 13"),
            std::string::npos)
      << r.status().message();
}

TEST(Importer, OpVersionsComeFromTheHistory) {
  EXPECT_EQ(onnx_op_version("Range", 26), 11);
  EXPECT_EQ(onnx_op_version("Range", 27), 27);
  EXPECT_EQ(onnx_op_version("TopK", 23), 11);
  EXPECT_EQ(onnx_op_version("TopK", 40), 24);  // past the newest known: the newest known
  EXPECT_EQ(onnx_op_version("Gelu", 19), 0);
  // Every ai.onnx op kiln runs has a history (scripts/gen_op_versions.py writes it).
  for (const OpDef* d : all_ops()) {
    if (d->domain.empty()) {
      EXPECT_FALSE(onnx_op_history(d->op_type).empty()) << d->op_type;
    }
  }
}

}  // namespace
}  // namespace kiln
