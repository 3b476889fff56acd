// kiln perf's flag values: ranges, URLs and the localhost rule, --shape, and the request plan
// made from a model's metadata (the batch dim, dynamic dims, input data).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "perf/model_io.h"
#include "perf/options.h"

namespace kiln::perf {
namespace {

std::vector<double> range(const std::string& text, bool integral = true) {
  auto r = parse_range(text, "--concurrency-range", integral);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().message();
  return r.ok() ? *r : std::vector<double>{};
}

std::string range_error(const std::string& text, bool integral = true) {
  auto r = parse_range(text, "--concurrency-range", integral);
  EXPECT_FALSE(r.ok()) << text;
  return r.ok() ? "" : r.status().message();
}

TEST(PerfOptions, Ranges) {
  EXPECT_EQ(range("4"), (std::vector<double>{4}));
  EXPECT_EQ(range("1:4"), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(range("1:10:3"), (std::vector<double>{1, 4, 7, 10}));
  EXPECT_EQ(range("2:10:4"), (std::vector<double>{2, 6, 10}));
  EXPECT_EQ(range("1:64:x2"), (std::vector<double>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(range("1:100:x4"), (std::vector<double>{1, 4, 16, 64}));
  EXPECT_EQ(range("0.5:2:0.5", false), (std::vector<double>{0.5, 1, 1.5, 2}));
  EXPECT_EQ(range("100:1600:x4", false), (std::vector<double>{100, 400, 1600}));
  EXPECT_NE(range_error("4:1").find("below the start"), std::string::npos);
  EXPECT_NE(range_error("0").find("positive"), std::string::npos);
  EXPECT_NE(range_error("0", false).find("positive"), std::string::npos);
  EXPECT_NE(range_error("a").find("'a' is not a number"), std::string::npos);
  EXPECT_NE(range_error("1:2:3:4").find("three parts"), std::string::npos);
  EXPECT_NE(range_error("1:2:0").find("positive"), std::string::npos);
  EXPECT_NE(range_error("1:8:x1").find("over 1"), std::string::npos);
  EXPECT_NE(range_error("1.5").find("whole number"), std::string::npos);
  EXPECT_NE(range_error("1:2000").find("over 1024"), std::string::npos);
  EXPECT_NE(range_error("1:").find("not a number"), std::string::npos);
  EXPECT_NE(range_error("1:1e6:0.001", false).find("levels"), std::string::npos);
}

TEST(PerfOptions, Endpoints) {
  auto e = parse_endpoint("localhost", 8081, "-u");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "localhost");
  EXPECT_EQ(e->port, 8081);
  e = parse_endpoint("http://127.0.0.1:9000/metrics", 8080, "--metrics-url");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->text(), "127.0.0.1:9000");
  e = parse_endpoint("grpc://[::1]:8001", 8080, "-u");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->text(), "[::1]:8001");
  for (const char* bad : {"", "::1", "host:", "host:0", "host:70000", "host:8o", "https://h:1",
                          "[::1", "[::1]x", "a b:1"}) {
    auto r = parse_endpoint(bad, 8080, "-u");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().message().rfind("-u ", 0), 0u) << r.status().message();
    }
  }
}

TEST(PerfOptions, OnlyLoopbackIsLocal) {
  for (const char* h : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "ip6-localhost"})
    EXPECT_TRUE(is_loopback(h)) << h;
  for (const char* h : {"128.0.0.1", "10.0.0.1", "0.0.0.0", "example.com", "127.0.0.256", "127.0.0",
                        "localhost.example.com", "127.0.0.1.nip.io", "::2", ""})
    EXPECT_FALSE(is_loopback(h)) << h;
}

TEST(PerfOptions, ShapeSpecs) {
  auto s = parse_shape_specs({"x:1,2", "ns:name:3"});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->at("x"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(s->at("ns:name"), (std::vector<int64_t>{3}));
  for (auto bad : std::vector<std::vector<std::string>>{
           {"x"}, {":4"}, {"x:0"}, {"x:a"}, {"x:1,,2"}, {"x:-1"}, {"x:1", "x:2"}})
    EXPECT_FALSE(parse_shape_specs(bad).ok()) << bad[0];
}

TEST(PerfModelIo, ResolveShape) {
  const std::map<std::string, std::vector<int64_t>> none;
  auto s = resolve_shape({"x", "FP32", {-1, 64}}, 4, none);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<int64_t>{4, 64}));
  s = resolve_shape({"x", "FP32", {-1, -1}}, 2, {{"x", {8}}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<int64_t>{2, 8}));
  s = resolve_shape({"x", "FP32", {-1, 3, 224, 224}}, 1, {{"x", {3, 224, 224}}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  // No dynamic leading dim: no batching, --shape gives every dim.
  s = resolve_shape({"x", "FP32", {1, -1}}, 1, {{"x", {1, 5}}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*s, (std::vector<int64_t>{1, 5}));
  s = resolve_shape({"x", "FP32", {}}, 1, none);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->empty());

  auto err = [](const Expected<std::vector<int64_t>>& r) {
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(err(resolve_shape({"x", "FP32", {-1, -1}}, 1, none)).find("--shape x:"),
            std::string::npos);
  EXPECT_NE(err(resolve_shape({"x", "FP32", {1, 4}}, 2, none)).find("-b 1"), std::string::npos);
  EXPECT_NE(err(resolve_shape({"x", "FP32", {-1, 4}}, 1, {{"x", {5}}})).find("has 4 there"),
            std::string::npos);
  EXPECT_NE(err(resolve_shape({"x", "FP32", {-1, -1}}, 1, {{"x", {5, 5}}})).find("2 dims given"),
            std::string::npos);
}

ModelMeta two_inputs() {
  return {"m",
          {{"a", "FP32", {-1, 4}}, {"ids", "INT64", {-1, -1}}},
          {{"y", "FP16", {-1, 10}}, {"boxes", "FP32", {-1, -1, 4}}}};
}

TEST(PerfModelIo, PlanMakesTheInputs) {
  auto p = make_plan(two_inputs(), "", 3, {{"ids", {7}}}, "random", 4096, 1);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->inputs.size(), 2u);
  EXPECT_EQ(p->inputs[0].tensor.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(p->inputs[0].data.size(), 3u * 4 * 4);
  EXPECT_EQ(p->inputs[1].data.size(), 3u * 7 * 8);
  // Random floats in [-1, 1), integers in [0, 64); not all zero.
  const auto* f = reinterpret_cast<const float*>(p->inputs[0].data.data());
  const auto* ids = reinterpret_cast<const int64_t*>(p->inputs[1].data.data());
  bool nonzero = false;
  for (int i = 0; i < 12; ++i) {
    EXPECT_TRUE(f[i] >= -1 && f[i] < 1);
    nonzero = nonzero || f[i] != 0;
  }
  for (int i = 0; i < 21; ++i) EXPECT_TRUE(ids[i] >= 0 && ids[i] < 64);
  EXPECT_TRUE(nonzero);
  // The same seed, the same data; outputs sized by the metadata where it can.
  auto again = make_plan(two_inputs(), "", 3, {{"ids", {7}}}, "random", 4096, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->inputs[0].data, p->inputs[0].data);
  ASSERT_EQ(p->outputs.size(), 2u);
  EXPECT_TRUE(p->outputs[0].known);
  EXPECT_EQ(p->outputs[0].bytes, 4096u);  // 3 x 10 FP16 = 60 bytes, under the reserve
  EXPECT_FALSE(p->outputs[1].known);
  EXPECT_EQ(p->outputs[1].bytes, 4096u);
  auto big = make_plan(two_inputs(), "", 3, {{"ids", {7}}}, "zero", 16, 1);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->outputs[0].bytes, 60u);
  EXPECT_EQ(big->inputs[0].data, std::string(48, '\0'));
}

TEST(PerfModelIo, PlanReadsAFolderOfRawFiles) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("kiln_perf_data_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  const std::string a(2 * 4 * 4, '\x01'), ids(2 * 3 * 8, '\x02');
  std::ofstream(dir / "a", std::ios::binary) << a;
  std::ofstream(dir / "ids", std::ios::binary) << ids;
  auto p = make_plan(two_inputs(), "", 2, {{"ids", {3}}}, dir.string(), 1, 0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->inputs[0].data, a);
  EXPECT_EQ(p->inputs[1].data, ids);
  auto wrong = make_plan(two_inputs(), "", 1, {{"ids", {3}}}, dir.string(), 1, 0);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("holds 32 bytes"), std::string::npos)
      << wrong.status().message();
  std::filesystem::remove_all(dir);
}

TEST(PerfModelIo, PlanRepeatsOneSampleAndReadsPerfAnalyzersJson) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kiln_perf_json_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // One sample of "a" (4 floats) is repeated over a batch of 3.
  std::ofstream(dir / "a", std::ios::binary) << std::string(16, '\x03');
  std::ofstream(dir / "ids", std::ios::binary) << std::string(3 * 2 * 8, '\x04');
  auto p = make_plan(two_inputs(), "", 3, {{"ids", {2}}}, dir.string(), 1, 0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->inputs[0].data, std::string(48, '\x03'));
  // perf_analyzer's JSON: a flat list, or content with the dims past the batch.
  const auto file = dir / "data.json";
  std::ofstream(file)
      << R"({"data": [{"a": [1, 2, 3, 4], "ids": {"content": [[5, 6, 7]], "shape": [3]}},
                                      {"a": [9, 9, 9, 9]}]})";
  p = make_plan(two_inputs(), "", 2, {}, file.string(), 1, 0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->inputs[1].tensor.shape, (std::vector<int64_t>{2, 3}));
  const auto* a = reinterpret_cast<const float*>(p->inputs[0].data.data());
  EXPECT_EQ(std::vector<float>(a, a + 8), (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
  const auto* ids = reinterpret_cast<const int64_t*>(p->inputs[1].data.data());
  EXPECT_EQ(std::vector<int64_t>(ids, ids + 6), (std::vector<int64_t>{5, 6, 7, 5, 6, 7}));
  // --shape wins over the file's shape, and then the data does not fit.
  auto wrong = make_plan(two_inputs(), "", 2, {{"ids", {4}}}, file.string(), 1, 0);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("input 'ids'"), std::string::npos)
      << wrong.status().message();
  std::ofstream(file) << R"({"data": [{"a": [1, 2, 3, 4]}]})";
  wrong = make_plan(two_inputs(), "", 1, {{"ids", {2}}}, file.string(), 1, 0);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("no data for input 'ids'"), std::string::npos);
  std::ofstream(file) << "{\"inputs\": 1}";
  wrong = make_plan(two_inputs(), "", 1, {{"ids", {2}}}, file.string(), 1, 0);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("perf_analyzer's form"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(PerfModelIo, PlanRefusals) {
  auto msg = [](const Expected<RequestPlan>& p) {
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_NE(msg(make_plan(two_inputs(), "", 1, {}, "random", 1, 0)).find("--shape ids:"),
            std::string::npos);
  EXPECT_NE(msg(make_plan(two_inputs(), "", 1, {{"ids", {2}}, {"nope", {1}}}, "random", 1, 0))
                .find("no such input (its inputs: a, ids)"),
            std::string::npos);
  EXPECT_NE(
      msg(make_plan({"s", {{"t", "BYTES", {-1}}}, {}}, "", 1, {}, "random", 1, 0)).find("BYTES"),
      std::string::npos);
  EXPECT_NE(msg(make_plan({"s", {}, {}}, "", 1, {}, "random", 1, 0)).find("no inputs"),
            std::string::npos);
  EXPECT_NE(msg(make_plan({"s", {{"t", "FP32", {-1}}}, {}}, "", 1, {}, "/no/such/folder", 1, 0))
                .find("--input-data"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::perf
