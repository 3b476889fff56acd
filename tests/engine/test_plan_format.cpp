// Engine file format: round trips, and refusal of every kind of damaged or forged file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "engine/plan_format.h"

namespace kiln {
namespace {

using namespace plan_internal;

uint32_t fresh_seed() {
  const uint32_t s = std::random_device{}();
  std::printf("seed %u\n", s);
  return s;
}

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

Tensor random_tensor(DataType dt, std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t(dt, std::move(shape));
  uint8_t* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  if (dt == DataType::kBool)
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] &= 1;
  return t;
}

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kUInt8,  DataType::kInt8,
                              DataType::kUInt16,  DataType::kInt16,  DataType::kInt32,
                              DataType::kInt64,   DataType::kBool,   DataType::kFloat16,
                              DataType::kFloat64, DataType::kUInt32, DataType::kUInt64,
                              DataType::kBFloat16};

// A graph using every feature the format stores.
std::unique_ptr<Graph> make_rich_graph(std::mt19937& rng) {
  auto g = std::make_unique<Graph>();
  g->name = "rich graph \xe2\x9c\x93";
  g->opset = 17;
  Value* x = g->add_value(
      "x", TensorType(DataType::kFloat32, {Dim::sym("N"), 3, Dim::sym("H"), Dim(), Dim(0)}));
  Value* y = g->add_value("y", TensorType::unknown_rank(DataType::kInt64));
  g->add_input(x);
  g->add_input(y);
  const std::vector<std::vector<int64_t>> shapes = {{0},          {1}, {3},       {5, 7}, {1000},
                                                    {17, 3, 2},   {},  {2, 0, 3}, {64},   {4, 4, 4},
                                                    {1, 1, 1, 1}, {9}, {33}};
  std::vector<Value*> consts;
  for (size_t i = 0; i < std::size(kAllTypes); ++i) {
    const DataType dt = kAllTypes[i];
    consts.push_back(g->add_constant(fmt::format("c_{}", dtype_name(dt)),
                                     random_tensor(dt, shapes[i % shapes.size()], rng)));
  }
  Value* sizes = g->add_constant("sizes", Tensor::from<int64_t>({4}, {1, 3, 8, 8}));
  Node* resize = g->add_node("Resize", "resize", {x, nullptr, nullptr, sizes}, {"r"});
  resize->outputs()[0]->type = TensorType(DataType::kFloat16, {Dim::sym("N"), 8, Dim(), 5});
  Node* clip = g->add_node("Clip", "clip", {resize->output(0), nullptr, nullptr}, {"cl"});
  Node* ln =
      g->add_node("LayerNormalization", "ln", {clip->output(0), consts[0]}, {"ln_y", "", "ln_inv"});
  Node* fused = g->add_node("ConvBiasAct", "fused", {ln->output(0), consts[1], y}, {"out"}, "kiln");
  fused->origin = "fuse_conv_bias_act";
  fused->onnx_nodes = {"Conv_0", "Relu_1", ""};
  Attributes& a = fused->attrs;
  a.set("f", Attribute::Float(1.5f));
  a.set("f_nan", Attribute::Float(std::bit_cast<float>(0x7fc00123u)));
  a.set("f_negzero", Attribute::Float(-0.0f));
  a.set("i", Attribute::Int(std::numeric_limits<int64_t>::min()));
  a.set("s", Attribute::String(std::string("a\0b\xff", 4)));
  a.set("s_empty", Attribute::String(""));
  a.set("t", Attribute::TensorValue(random_tensor(DataType::kFloat16, {2, 3}, rng)));
  Attribute shared;
  shared.kind = Attribute::Kind::kTensor;
  shared.t = consts[4]->constant;  // the same tensor as a value's constant: stored once
  a.set("t_shared", shared);
  Attribute null_t;
  null_t.kind = Attribute::Kind::kTensor;
  a.set("t_null", null_t);
  a.set("fs", Attribute::Floats({1.f, -2.5f, INFINITY}));
  a.set("is", Attribute::Ints({-1, 0, 1LL << 40}));
  a.set("is_empty", Attribute::Ints({}));
  a.set("ss", Attribute::Strings({"x", "", "long string with spaces"}));
  Node* unnamed = g->add_node("Identity", "tmp", {fused->output(0)}, {"id"});
  unnamed->name = "";
  g->add_value("dead", TensorType(DataType::kUndefined, {}));
  g->add_output(unnamed->output(0));
  g->add_output(ln->output(2));
  return g;
}

EngineMetadata make_meta() {
  EngineMetadata m;
  m.kiln_version = "9.8.7-test";
  m.backend = "cuda";
  m.target = "cuda sm_90 cuda13.0 cudnn9.14";
  m.build_options = {{"precision", "fp16"},
                     {"opt_level", 3},
                     {"profiles", {{{"x", {{"min", {1, 3}}, {"max", {8, 3}}}}}}}};
  return m;
}

void expect_tensor_eq(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_TRUE(aligned64(b.raw())) << b.desc();
  if (a.nbytes()) {
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << a.desc();
  }
}

std::string vname(const Value* v) { return v ? v->name : "<absent>"; }

void expect_attr_eq(const Attribute& a, const Attribute& b) {
  ASSERT_EQ(a.kind, b.kind);
  switch (a.kind) {
    case Attribute::Kind::kFloat:
      EXPECT_EQ(std::bit_cast<uint32_t>(a.f), std::bit_cast<uint32_t>(b.f));
      break;
    case Attribute::Kind::kInt:
      EXPECT_EQ(a.i, b.i);
      break;
    case Attribute::Kind::kString:
      EXPECT_EQ(a.s, b.s);
      break;
    case Attribute::Kind::kTensor:
      ASSERT_EQ(a.t == nullptr, b.t == nullptr);
      if (a.t) expect_tensor_eq(*a.t, *b.t);
      break;
    case Attribute::Kind::kFloats:
      ASSERT_EQ(a.floats.size(), b.floats.size());
      for (size_t i = 0; i < a.floats.size(); ++i)
        EXPECT_EQ(std::bit_cast<uint32_t>(a.floats[i]), std::bit_cast<uint32_t>(b.floats[i]));
      break;
    case Attribute::Kind::kInts:
      EXPECT_EQ(a.ints, b.ints);
      break;
    case Attribute::Kind::kStrings:
      EXPECT_EQ(a.strings, b.strings);
      break;
  }
}

// Everything the format stores, plus the derived producer/use links.
void expect_graph_eq(const Graph& a, const Graph& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.opset, b.opset);
  const auto av = a.values(), bv = b.values();
  ASSERT_EQ(av.size(), bv.size());
  for (size_t i = 0; i < av.size(); ++i) {
    SCOPED_TRACE(av[i]->name);
    EXPECT_EQ(av[i]->name, bv[i]->name);
    EXPECT_EQ(b.find_value(bv[i]->name), bv[i]);
    EXPECT_EQ(av[i]->type.dtype, bv[i]->type.dtype);
    EXPECT_EQ(av[i]->type.dims, bv[i]->type.dims);
    ASSERT_EQ(av[i]->is_constant(), bv[i]->is_constant());
    if (av[i]->constant) expect_tensor_eq(*av[i]->constant, *bv[i]->constant);
    ASSERT_EQ(av[i]->producer == nullptr, bv[i]->producer == nullptr);
    if (av[i]->producer) {
      EXPECT_EQ(av[i]->producer->index, bv[i]->producer->index);
      EXPECT_EQ(av[i]->producer_index, bv[i]->producer_index);
    }
    EXPECT_EQ(av[i]->uses().size(), bv[i]->uses().size());
  }
  auto names = [](const std::vector<Value*>& vs) {
    std::vector<std::string> r;
    for (const Value* v : vs) r.push_back(vname(v));
    return r;
  };
  EXPECT_EQ(names(a.inputs()), names(b.inputs()));
  EXPECT_EQ(names(a.outputs()), names(b.outputs()));
  ASSERT_EQ(a.nodes().size(), b.nodes().size());
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    const Node& x = *a.nodes()[i];
    const Node& y = *b.nodes()[i];
    SCOPED_TRACE(x.label());
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.op_type, y.op_type);
    EXPECT_EQ(x.domain, y.domain);
    EXPECT_EQ(x.origin, y.origin);
    EXPECT_EQ(x.onnx_nodes, y.onnx_nodes);
    EXPECT_EQ(y.index, static_cast<int>(i));
    EXPECT_EQ(names(x.inputs()), names(y.inputs()));
    EXPECT_EQ(names(x.outputs()), names(y.outputs()));
    for (size_t k = 0; k < y.num_outputs(); ++k)
      if (y.output(k)) {
        EXPECT_EQ(y.output(k)->producer, &y);
      }
    ASSERT_EQ(x.attrs.all().size(), y.attrs.all().size());
    for (const auto& [name, attr] : x.attrs.all()) {
      SCOPED_TRACE(name);
      ASSERT_NE(y.attrs.find(name), nullptr);
      expect_attr_eq(attr, *y.attrs.find(name));
    }
  }
}

std::vector<uint8_t> serialize(const Graph& g, const EngineMetadata& m) {
  auto bytes = serialize_plan(g, m);
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

Expected<LoadedPlan> load(std::vector<uint8_t> bytes) {
  return deserialize_plan(std::make_shared<const std::vector<uint8_t>>(std::move(bytes)), "E.kiln");
}

// A refusal: an error, one line, naming the file.
void expect_refused(const Expected<LoadedPlan>& r, const std::string& what) {
  ASSERT_FALSE(r.ok()) << what;
  const std::string m = r.status().message();
  EXPECT_EQ(m.rfind("E.kiln: ", 0), 0u) << what << ": " << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": " << m;
}

std::vector<uint8_t> small_image() {
  Graph g;
  g.name = "small";
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 4}));
  g.add_input(x);
  Value* w = g.add_constant("w", Tensor::from<float>({4}, {1, 2, 3, 4}));
  Node* n = g.add_node("Mul", "mul", {x, w}, {"y"});
  n->attrs.set("k", Attribute::Int(3));
  g.add_output(n->output(0));
  EngineMetadata m;
  m.backend = "cpu";
  m.target = "cpu-x86_64";
  return serialize(g, m);
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln_plan_XXXXXX").string();
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST(PlanChecksum, Xxh64MatchesReferenceImplementation) {
  // Vectors from libxxhash 0.8.1 over bytes (i*31+7)&0xff.
  struct Case {
    size_t n;
    uint64_t seed0, seed12345;
  };
  const Case cases[] = {{0, 0xef46db3751d8e999, 0x95584af7701f808d},
                        {1, 0xa96c7f0ce858bbb7, 0x496fc29a1e753bd7},
                        {3, 0x56e6957632a487f9, 0x94ff877cd86385be},
                        {4, 0xc60d15b1e3ff8f04, 0x1034b01f61e3b2e6},
                        {7, 0xafbefc3d6c6f9a8e, 0xd06aa9dbe7add6d1},
                        {8, 0x3da5c7aa269683e0, 0x23befc2f0d90da1a},
                        {9, 0x4b17a9ba9e215c09, 0x9117b0959c2277a2},
                        {31, 0x4a74f3a1a39ad4a1, 0xbff21e6871cdf167},
                        {32, 0x8d57d6a4671cc43d, 0x7bdfe9fbcc771266},
                        {33, 0x62c9fd21ed857664, 0x5a23927b0946b212},
                        {63, 0x5c320a0d2707057f, 0x60148113d74960d3},
                        {64, 0x7bbabbc45729d17e, 0xeeff42e996f0f7d5},
                        {100, 0xefa0ad2d3e70c151, 0x4f2e446ab943e539},
                        {1000, 0x99594f4828043d35, 0xcbd42ae414e71a03}};
  std::vector<uint8_t> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>((i * 31 + 7) & 0xff);
  for (const Case& c : cases) {
    EXPECT_EQ(xxh64(buf.data(), c.n, 0), c.seed0) << c.n;
    EXPECT_EQ(xxh64(buf.data(), c.n, 12345), c.seed12345) << c.n;
  }
  EXPECT_EQ(xxh64("abc", 3), 0x44bc2cf5ad770999u);
}

TEST(PlanFormat, RoundTripsEverythingInMemory) {
  std::mt19937 rng(fresh_seed());
  auto g = make_rich_graph(rng);
  const EngineMetadata meta = make_meta();
  auto loaded = load(serialize(*g, meta));
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  expect_graph_eq(*g, *loaded->graph);
  EXPECT_EQ(loaded->meta.kiln_version, "9.8.7-test");
  EXPECT_EQ(loaded->meta.backend, meta.backend);
  EXPECT_EQ(loaded->meta.target, meta.target);
  EXPECT_EQ(loaded->meta.build_options, meta.build_options);
  // The constant shared by a value and an attribute is stored, and loaded, once.
  const Node* fused = loaded->graph->find_node("fused");
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->attrs.find("t_shared")->t, loaded->graph->find_value("c_int16")->constant);
}

TEST(PlanFormat, RoundTripsThroughAFileZeroCopy) {
  std::mt19937 rng(fresh_seed());
  auto g = make_rich_graph(rng);
  TempDir dir;
  const std::string path = dir.file("model.kiln");
  ASSERT_TRUE(write_plan_file(path, *g, make_meta()).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto loaded = read_plan_file(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  expect_graph_eq(*g, *loaded->graph);
  // Views into one buffer: the data pointers are as far apart as the file offsets (64-aligned).
  auto a = loaded->graph->find_value("c_int8")->constant;
  auto b = loaded->graph->find_value("c_int16")->constant;
  const auto gap = static_cast<const uint8_t*>(b->raw()) - static_cast<const uint8_t*>(a->raw());
  EXPECT_GT(gap, 0);
  EXPECT_LT(gap, 4096);
  EXPECT_EQ(gap % 64, 0);
  // A constant keeps the loaded buffer alive after the graph is gone (ASan checks this).
  std::vector<uint8_t> expect(static_cast<const uint8_t*>(b->raw()),
                              static_cast<const uint8_t*>(b->raw()) + b->nbytes());
  loaded = Status::Error("dropped");
  EXPECT_EQ(std::memcmp(b->raw(), expect.data(), expect.size()), 0);
}

TEST(PlanFormat, CopiesUnalignedBytesIntoAlignedMemory) {
  const std::vector<uint8_t> image = small_image();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> keep;
  bool tested = false;
  for (int i = 0; i < 64 && !tested; ++i) {
    keep.push_back(std::make_shared<std::vector<uint8_t>>(image));
    if (aligned64(keep.back()->data())) continue;
    auto loaded = deserialize_plan(keep.back(), "E.kiln");
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    const Tensor& w = *loaded->graph->find_value("w")->constant;
    EXPECT_TRUE(aligned64(w.raw()));
    EXPECT_EQ(w.to_int64_vector(), (std::vector<int64_t>{1, 2, 3, 4}));
    tested = true;
  }
  if (!tested) GTEST_SKIP() << "this allocator returned only 64-byte aligned vectors";
}

TEST(PlanFormat, StampsTheKilnVersionWhenLeftEmpty) {
  Graph g;
  g.add_output(g.add_constant("c", Tensor::scalar<float>(2.f)));
  auto loaded = load(serialize(g, EngineMetadata{}));
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->meta.kiln_version, KILN_VERSION_STRING);
  EXPECT_TRUE(loaded->meta.build_options.is_null());
  EXPECT_EQ(loaded->graph->find_value("c")->constant->at_double(0), 2.0);
}

TEST(PlanFormat, WriterRefusesGraphsTheReaderWouldRefuse) {
  {
    Graph g;
    g.name = "dup";
    g.add_value("a");
    g.add_value("b")->name = "a";
    auto r = serialize_plan(g, {});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("two values are named 'a'"), std::string::npos);
  }
  {
    Graph g;
    g.add_constant("s", Tensor(DataType::kString, {2}));
    EXPECT_FALSE(serialize_plan(g, {}).ok());
  }
  {
    Graph g;
    g.add_value("v", TensorType(DataType::kFloat32, {Dim(-5)}));
    EXPECT_FALSE(serialize_plan(g, {}).ok());
  }
  {
    Graph g, other;
    Value* foreign = other.add_value("foreign");
    g.add_node("Relu", "r", {foreign}, {"y"});
    auto r = serialize_plan(g, {});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("does not own"), std::string::npos);
  }
  {
    Graph g;
    Node* n = g.add_node("Relu", "r", {}, {"y"});
    n->output(0)->producer_index = 3;
    EXPECT_FALSE(serialize_plan(g, {}).ok());
  }
}

TEST(PlanFormat, ReportsFileErrors) {
  TempDir dir;
  auto r = read_plan_file(dir.file("missing.kiln"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing.kiln: cannot open"), std::string::npos);
  std::ofstream(dir.file("empty.kiln")).close();
  r = read_plan_file(dir.file("empty.kiln"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), dir.file("empty.kiln") + ": empty file");
  r = read_plan_file(dir.file(""));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos);
  EXPECT_FALSE(write_plan_file(dir.file("no/such/dir.kiln"), Graph(), {}).ok());
}

TEST(PlanCorruption, RefusesEmptyAndForeignFiles) {
  auto r = load({});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "E.kiln: empty file");
  EXPECT_FALSE(deserialize_plan(nullptr, "E.kiln").ok());
  std::vector<uint8_t> image = small_image();
  image[3] = 'X';
  r = load(image);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "E.kiln: not a kiln engine (bad magic)");
  r = load({'P', 'K', 3, 4});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "E.kiln: not a kiln engine (bad magic)");
}

TEST(PlanCorruption, RefusesOtherFormatVersions) {
  std::vector<uint8_t> image = small_image();
  store_u32(image.data() + kOffVersion, 7);
  auto r = load(image);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "E.kiln: engine format version 7 is not supported by this kiln (supports 4); rebuild "
            "the engine with `kiln build`");
  reseal(image);  // refused even with a valid checksum
  EXPECT_FALSE(load(image).ok());
}

TEST(PlanCorruption, RefusesEveryTruncation) {
  std::mt19937 rng(fresh_seed());
  for (const std::vector<uint8_t>& image :
       {small_image(), serialize(*make_rich_graph(rng), make_meta())}) {
    for (size_t len = 1; len < image.size(); ++len) {
      auto r = load(std::vector<uint8_t>(image.begin(), image.begin() + len));
      expect_refused(r, fmt::format("length {}", len));
      if (!r.ok()) {
        EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << len;
      }
    }
    auto r = load(std::vector<uint8_t>(image.begin(), image.end() - 1));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(),
              fmt::format("E.kiln: truncated: header says {} bytes, file has {}", image.size(),
                          image.size() - 1));
    std::vector<uint8_t> longer = image;
    longer.push_back(0);
    expect_refused(load(longer), "trailing byte");
  }
}

TEST(PlanCorruption, RefusesEverySingleByteChange) {
  const std::vector<uint8_t> image = small_image();
  ASSERT_TRUE(load(image).ok());
  for (size_t i = 0; i < image.size(); ++i)
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::vector<uint8_t> bad = image;
      bad[i] ^= flip;
      expect_refused(load(bad), fmt::format("byte {} ^ {:#x}", i, flip));
    }
  std::vector<uint8_t> bad = image;
  bad[image.size() / 2] ^= 0x10;
  EXPECT_EQ(load(bad).status().message(), "E.kiln: checksum mismatch (file corrupted)");
}

// Forged files (valid checksum) exercise the bounds checks behind the checksum.
TEST(PlanForged, RefusesBadSectionTables) {
  const std::vector<uint8_t> image = small_image();
  const uint64_t huge[] = {image.size(), image.size() - 1, 1ull << 63, ~0ull, ~0ull - 63, 79};
  for (size_t field = kOffMeta; field < kOffReserved; field += 8)
    for (uint64_t v : huge) {
      std::vector<uint8_t> bad = image;
      store_u64(bad.data() + field, v);
      reseal(bad);
      expect_refused(load(bad), fmt::format("header field {} = {}", field, v));
    }
  std::vector<uint8_t> bad = image;
  store_u64(bad.data() + kOffWeights, load_u64(bad.data() + kOffWeights) - 8);
  store_u64(bad.data() + kOffWeights + 8, load_u64(bad.data() + kOffWeights + 8) + 8);
  reseal(bad);
  auto r = load(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a multiple of 64"), std::string::npos);
  bad = image;
  bad[kOffReserved + 3] = 1;
  reseal(bad);
  expect_refused(load(bad), "reserved bytes");
}

// Overwrites every position of the metadata and graph sections with extreme values: each forged
// file is refused or decodes to a consistent graph, never crashes or allocates without bound.
TEST(PlanForged, SurvivesExtremeValuesAtEveryPosition) {
  std::mt19937 rng(fresh_seed());
  for (const std::vector<uint8_t>& image :
       {small_image(), serialize(*make_rich_graph(rng), make_meta())}) {
    const size_t begin = kHeaderSize, end = load_u64(image.data() + kOffWeights);
    for (size_t i = begin; i + 4 <= end; ++i)
      for (uint32_t v : {0xffffffffu, 0xfffffffeu, 0x7fffffffu, 0x80000000u, 0x10000u, 0u, 1u}) {
        std::vector<uint8_t> bad = image;
        store_u32(bad.data() + i, v);
        reseal(bad);
        auto r = load(bad);
        if (r.ok()) {
          for (const Node* n : r->graph->nodes())
            for (const Value* in : n->inputs()) EXPECT_TRUE(!in || r->graph->find_value(in->name));
        } else {
          expect_refused(r, fmt::format("u32 {:#x} at {}", v, i));
        }
      }
  }
}

TEST(PlanForged, SurvivesRandomMutations) {
  std::mt19937 rng(fresh_seed());
  const std::vector<uint8_t> image = serialize(*make_rich_graph(rng), make_meta());
  const size_t end = load_u64(image.data() + kOffWeights);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bad = image;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) bad[kHeaderSize + rng() % (end - kHeaderSize)] = rng();
    reseal(bad);
    auto r = load(bad);
    if (!r.ok()) expect_refused(r, fmt::format("mutation {}", iter));
  }
}

// Rebuilds `image` around another metadata section, laid out as the writer does.
std::vector<uint8_t> with_meta(const std::vector<uint8_t>& image,
                               const std::vector<uint8_t>& meta) {
  const uint8_t* p = image.data();
  const uint64_t g_off = load_u64(p + kOffGraph), g_size = load_u64(p + kOffGraph + 8);
  const uint64_t w_off = load_u64(p + kOffWeights), w_size = load_u64(p + kOffWeights + 8);
  // Sized first, then copied into (GCC 12 misjudges vector::insert here: -Warray-bounds).
  const uint64_t new_g = kHeaderSize + meta.size();
  const uint64_t new_w = (new_g + g_size + 63) / 64 * 64;
  std::vector<uint8_t> out(new_w + w_size + kTrailerSize);
  std::copy(p, p + kHeaderSize, out.begin());
  std::copy(meta.begin(), meta.end(), out.begin() + kHeaderSize);
  std::copy(p + g_off, p + g_off + g_size, out.begin() + static_cast<int64_t>(new_g));
  std::copy(p + w_off, p + w_off + w_size, out.begin() + static_cast<int64_t>(new_w));
  store_u64(out.data() + kOffFileSize, out.size());
  store_u64(out.data() + kOffMeta + 8, meta.size());
  store_u64(out.data() + kOffGraph, new_g);
  store_u64(out.data() + kOffWeights, new_w);
  reseal(out);
  return out;
}

std::vector<uint8_t> meta_bytes(const std::string& options, bool trailing = false) {
  std::vector<uint8_t> m;
  ByteWriter w(m);
  for (const char* s : {"0.2.0", "cpu", "cpu-x86_64"}) w.str(s);
  w.str(options);
  w.str("{}");  // backend plan
  if (trailing) w.u8(0);
  return m;
}

TEST(PlanForged, ChecksMetadata) {
  const std::vector<uint8_t> image = small_image();
  auto r = load(with_meta(image, meta_bytes(R"({"precision": "int8"})")));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->meta.build_options["precision"], "int8");
  EXPECT_EQ(load(with_meta(image, meta_bytes("{not json"))).status().message(),
            "E.kiln: metadata section: build options are not valid JSON");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(load(with_meta(image, meta_bytes(deep))).status().message(),
            "E.kiln: metadata section: build options nest deeper than 64 levels");
  EXPECT_TRUE(load(with_meta(image, meta_bytes(std::string(60, '[') + std::string(60, ']')))).ok());
  expect_refused(load(with_meta(image, meta_bytes("{}", true))), "trailing");
  std::vector<uint8_t> long_string = meta_bytes("{}");
  store_u32(long_string.data(), 0xfffffff0);
  expect_refused(load(with_meta(image, long_string)), "long string");
  // The writer refuses options the reader would refuse.
  EngineMetadata m;
  for (int i = 0; i < 70; ++i)
    m.build_options = nlohmann::json::array({std::move(m.build_options)});
  EXPECT_FALSE(serialize_plan(Graph(), m).ok());
}

// Graph sections written by hand, one defect each.
struct Section {
  std::vector<uint8_t> bytes;
  ByteWriter w() { return ByteWriter(bytes); }
  Section() {
    w().str("g");
    w().i64(21);
  }
};

Status decode(const Section& s, size_t weights_size = 256) {
  auto weights = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(std::aligned_alloc(64, 256)),
                                          [](uint8_t* p) { std::free(p); });
  return decode_graph(s.bytes.data(), s.bytes.size(), weights.get(), weights_size, weights)
      .status();
}

void expect_error(const Status& s, const std::string& part) {
  ASSERT_FALSE(s.ok()) << "expected: " << part;
  EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
}

// One float32 tensor record followed by no values, inputs, outputs or nodes.
Section with_tensor(uint32_t dtype, std::vector<int64_t> dims, uint64_t offset, uint64_t nbytes) {
  Section s;
  s.w().u32(1);
  s.w().u32(dtype);
  s.w().u32(static_cast<uint32_t>(dims.size()));
  for (int64_t d : dims) s.w().i64(d);
  s.w().u64(offset);
  s.w().u64(nbytes);
  for (int i = 0; i < 4; ++i) s.w().u32(0);
  return s;
}

TEST(PlanForged, ChecksTensorRecords) {
  EXPECT_TRUE(decode(with_tensor(1, {2, 3}, 64, 24)).ok());
  EXPECT_TRUE(decode(with_tensor(1, {0, 1ll << 62, 1ll << 62}, 0, 0)).ok());
  expect_error(decode(with_tensor(8, {1}, 0, 0)), "invalid element type code 8");
  expect_error(decode(with_tensor(99, {1}, 0, 4)), "invalid element type code 99");
  expect_error(decode(with_tensor(1, {2, -3}, 0, 24)), "negative dim -3");
  expect_error(decode(with_tensor(1, {1ll << 40, 1ll << 40, 0}, 0, 0)), "too many elements");
  expect_error(decode(with_tensor(7, {1ll << 62}, 0, 0)), "does not take 0 bytes");
  expect_error(decode(with_tensor(1, {2, 3}, 0, 25)), "does not take 25 bytes");
  expect_error(decode(with_tensor(1, {2, 3}, 32, 24)), "not a multiple of 64");
  expect_error(decode(with_tensor(1, {64}, 64, 256)), "outside the 256-byte weights section");
  expect_error(decode(with_tensor(1, {1}, ~0ull - 63, 4)), "outside");
  Section s = with_tensor(1, {1}, 0, 4);
  store_u32(s.bytes.data() + 4 + 1 + 8 + 4 + 4, 0x7fffffff);  // rank
  expect_error(decode(s), "tensor rank 2147483647 cannot fit");
}

TEST(PlanForged, ChecksCountsBeforeAllocating) {
  for (const char* what :
       {"tensor count", "value count", "graph input", "graph output", "node count"}) {
    Section s;
    const std::string w = what;
    const int zeros = w == "tensor count"   ? 0
                      : w == "value count"  ? 1
                      : w == "graph input"  ? 2
                      : w == "graph output" ? 3
                                            : 4;
    for (int i = 0; i < zeros; ++i) s.w().u32(0);
    s.w().u32(0xfffffffe);
    expect_error(decode(s), what);
  }
}

TEST(PlanForged, ChecksValuesNodesAndAttributes) {
  auto value_section = [](const std::string& name, uint32_t dtype, uint8_t has_dims, int64_t dim,
                          uint32_t constant, std::vector<float> scales = {}, int64_t axis = 0) {
    Section s;
    s.w().u32(0);  // tensors
    s.w().u32(1);
    s.w().str(name);
    s.w().u32(dtype);
    s.w().u8(has_dims);
    if (has_dims == 1) {
      s.w().u32(1);
      s.w().i64(dim);
      s.w().str("N");
    }
    s.w().u32(constant);
    s.w().u32(static_cast<uint32_t>(scales.size()));  // format 3: INT8 scales
    for (float f : scales) s.w().f32(f);
    if (scales.size() > 1) s.w().i64(axis);
    return s;
  };
  auto finish = [](Section s) {
    for (int i = 0; i < 3; ++i) s.w().u32(0);
    return s;
  };
  EXPECT_TRUE(decode(finish(value_section("v", 1, 1, -1, kNoValue))).ok());
  expect_error(decode(finish(value_section("", 1, 0, 0, kNoValue))), "has no name");
  expect_error(decode(finish(value_section("v", 23, 0, 0, kNoValue))), "invalid element type");
  expect_error(decode(finish(value_section("v", 1, 2, 0, kNoValue))), "bad rank flag");
  expect_error(decode(finish(value_section("v", 1, 1, -2, kNoValue))), "bad dim -2");
  expect_error(decode(finish(value_section("v", 1, 0, 0, 0))), "refers to tensor 0 of 0");
  EXPECT_TRUE(decode(finish(value_section("v", 1, 1, -1, kNoValue, {0.5f}))).ok());
  EXPECT_TRUE(decode(finish(value_section("v", 1, 1, -1, kNoValue, {0.5f, 2.f}, 0))).ok());
  expect_error(decode(finish(value_section("v", 1, 1, -1, kNoValue, {0.f}))), "invalid INT8 scale 0");
  expect_error(decode(finish(value_section("v", 1, 1, -1, kNoValue, {NAN}))), "invalid INT8 scale");
  expect_error(decode(finish(value_section("v", 1, 1, -1, kNoValue, {1.f, 2.f}, 1))),
               "quantization axis 1 is not a dimension");
  expect_error(decode(finish(value_section("v", 1, 1, 3, kNoValue, {1.f, 2.f}, 0))),
               "2 INT8 scales along axis 0 of size 3");
  expect_error(decode(finish(value_section("v", 1, 0, 0, kNoValue, {1.f, 2.f}, 0))),
               "per-channel INT8 scales but no known rank");
  Section trailing = finish(value_section("v", 1, 0, 0, kNoValue));
  trailing.w().u8(0);
  expect_error(decode(trailing), "1 unexpected trailing bytes");
  Section dup = value_section("v", 1, 0, 0, kNoValue);
  store_u32(dup.bytes.data() + 4 + 1 + 8 + 4, 2);  // value count
  dup.w().str("v");
  dup.w().u32(1);
  dup.w().u8(0);
  dup.w().u32(kNoValue);
  dup.w().u32(0);
  expect_error(decode(finish(dup)), "two values are named 'v'");

  // One value, one node reading and writing it as given.
  auto node_section = [&](uint32_t in, uint32_t out1, uint32_t out2, uint8_t attr_kind) {
    Section s = value_section("v", 1, 0, 0, kNoValue);
    s.w().u32(1);  // graph inputs
    s.w().u32(0);
    s.w().u32(0);  // graph outputs
    s.w().u32(1);  // nodes
    for (const char* str : {"n", "Relu", "", "import"}) s.w().str(str);
    s.w().u32(0);  // onnx nodes
    s.w().u32(1);
    s.w().u32(in);
    s.w().u32(2);
    s.w().u32(out1);
    s.w().u32(out2);
    s.w().u32(1);
    s.w().str("a");
    s.w().u8(attr_kind);
    if (attr_kind == 1)
      s.w().i64(0);
    else
      s.w().u32(0);  // float 0, or a zero length/count, or tensor 0
    return s;
  };
  EXPECT_TRUE(decode(node_section(0, kNoValue, kNoValue, 5)).ok());
  expect_error(decode(node_section(1, kNoValue, kNoValue, 5)), "node input refers to value 1 of 1");
  expect_error(decode(node_section(0, 7, kNoValue, 5)), "node output refers to value 7 of 1");
  expect_error(decode(node_section(kNoValue, 0, 0, 5)), "output of two nodes");
  expect_error(decode(node_section(0, kNoValue, kNoValue, 8)), "invalid kind code 8");
  // Kind 7, a subgraph: the empty graph that the attribute's zero name length starts reads
  // past the end; subgraphs nested deeper than kMaxSubgraphDepth are refused.
  expect_error(decode(node_section(0, kNoValue, kNoValue, 7)), "truncated");
  Section deep = value_section("v", 1, 0, 0, kNoValue);
  auto empty_lists = [&](Section& s, uint32_t nodes) {
    s.w().u32(0);  // graph inputs
    s.w().u32(0);  // graph outputs
    s.w().u32(nodes);
  };
  auto graph_node = [&](Section& s) {
    for (const char* str : {"n", "If", "", "import"}) s.w().str(str);
    s.w().u32(0);  // onnx nodes
    s.w().u32(0);  // inputs
    s.w().u32(0);  // outputs
    s.w().u32(1);  // attributes
    s.w().str("then_branch");
    s.w().u8(7);
    s.w().str("sub");
    s.w().u32(0);  // the subgraph's values
  };
  empty_lists(deep, 1);
  for (int level = 0; level < kMaxSubgraphDepth + 2; ++level) {
    graph_node(deep);
    empty_lists(deep, 1);
  }
  expect_error(decode(deep), "subgraphs nest deeper than 32 levels");
  expect_error(decode(node_section(0, kNoValue, kNoValue, 3)), "refers to tensor 0 of 0");
  Section big_string = node_section(0, kNoValue, kNoValue, 2);
  store_u32(big_string.bytes.data() + big_string.bytes.size() - 4, 0xfffffff0);
  expect_error(decode(big_string), "string attribute length 4294967280 exceeds");
  Section big_ints = node_section(0, kNoValue, kNoValue, 5);
  store_u32(big_ints.bytes.data() + big_ints.bytes.size() - 4, 0x20000000);
  expect_error(decode(big_ints), "int count 536870912 cannot fit");
}

}  // namespace
}  // namespace kiln
