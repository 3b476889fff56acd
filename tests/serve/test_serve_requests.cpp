// Bad requests of every kind get a 4xx and a one-line message, never a crash: the REST front end
// end to end on localhost (a Boost.Beast client), and the REST and gRPC decoders directly.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve/http_server.h"
#include "serve/rest.h"
#include "serve/server.h"
#include "serve_test_util.h"
#ifdef KILN_SERVE_GRPC
#include "serve/grpc_codec.h"
#endif

namespace kiln::serve {
namespace {

using json = nlohmann::json;

class ServeHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    CoreOptions o;
    o.repository = testing::make_repository();
    o.batcher.warm = false;
    o.batcher.max_delay_ms = 1;
    auto core = Core::load(o, [](const std::string&) {});
    ASSERT_TRUE(core.ok()) << core.status().message();
    core_ = std::move(core).value().release();
    http_ = new HttpServer(*core_, {"127.0.0.1", 0, kLimit, 2, false});
    ASSERT_TRUE(http_->bind().ok());
    thread_ = new std::thread([] { http_->serve(); });
  }
  static void TearDownTestSuite() {
    http_->stop();
    thread_->join();
    delete thread_;
    delete http_;
    delete core_;
  }
  // (status, the error message or the body) of a POST on a connection of its own.
  static std::pair<int, std::string> post(const std::string& path, const std::string& body) {
    namespace beast = boost::beast;
    namespace http = beast::http;
    boost::asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    beast::error_code ec;
    stream.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                                  static_cast<unsigned short>(http_->port())),
                   ec);
    if (ec) return {0, ec.message()};
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req, ec);
    if (ec) return {0, ec.message()};
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res, ec);
    if (ec) return {0, ec.message()};
    const int status = static_cast<int>(res.result_int());
    if (status >= 400) {
      auto j = json::parse(res.body(), nullptr, false);
      EXPECT_TRUE(j.is_object() && j["error"].is_string()) << res.body();
      return {status, j.is_object() ? j.value("error", "") : res.body()};
    }
    return {status, res.body()};
  }
  static std::string body(const std::string& name, const std::string& datatype,
                          const std::vector<int64_t>& shape, size_t values) {
    return json{{"inputs",
                 {{{"name", name},
                   {"datatype", datatype},
                   {"shape", shape},
                   {"data", std::vector<float>(values, 0.5f)}}}}}
        .dump();
  }
  static constexpr size_t kLimit = 4096;
  static inline Core* core_ = nullptr;
  static inline HttpServer* http_ = nullptr;
  static inline std::thread* thread_ = nullptr;
};

TEST_F(ServeHttp, GoodRequestIsAnswered) {
  auto [status, text] = post("/v2/models/twice/infer", body("x", "FP32", {2, 4}, 8));
  ASSERT_EQ(status, 200) << text;
  auto j = json::parse(text);
  EXPECT_EQ(j["outputs"][0]["name"], "y");
  EXPECT_EQ(j["outputs"][0]["data"][0], 1.0);
  EXPECT_EQ(j["outputs"][0]["shape"], (std::vector<int64_t>{2, 4}));
}

TEST_F(ServeHttp, BadRequestsGet4xxWithOneLine) {
  struct Case {
    std::string path, body;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"/v2/models/nosuch/infer", body("x", "FP32", {1, 4}, 4), 404, "unknown model 'nosuch'"},
      {"/v2/models/twice/infer", "{\"inputs\": [", 400, "malformed request: "},
      {"/v2/models/twice/infer", "[]", 400, "malformed request: the body must be a JSON object"},
      {"/v2/models/twice/infer", body("x", "FP64", {1, 4}, 4), 400,
       "input 'x': datatype FP64, the model takes FP32"},
      {"/v2/models/twice/infer", body("x", "FP32", {1, 5}, 5), 400,
       "input 'x': shape [1, 5], the model takes [-1, 4]"},
      {"/v2/models/twice/infer", body("x", "FP32", {1, 4}, 3), 400,
       "input 'x': 3 values in data, shape [1, 4] takes 4"},
      {"/v2/models/twice/infer", body("x", "BYTES", {1, 4}, 4), 400,
       "input 'x': datatype BYTES is not one kiln takes"},
      {"/v2/models/twice/infer", body("image", "FP32", {1, 4}, 4), 400,
       "unknown input 'image' (the model's inputs: x)"},
      {"/v2/models/twice/infer", std::string(kLimit + 10, ' '), 413,
       "is over this server's limit of 4096 bytes"},
      {"/v2/models/twice/infer",
       R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":16}}]})",
       400, "unknown shared memory region 'r'"},
  };
  for (const Case& c : cases) {
    auto [status, message] = post(c.path, c.body);
    EXPECT_EQ(status, c.status) << c.body.substr(0, 100) << ": " << message;
    EXPECT_NE(message.find(c.message), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // and the server goes on serving
  EXPECT_EQ(post("/v2/models/twice/infer", body("x", "FP32", {1, 4}, 4)).first, 200);
}

TEST_F(ServeHttp, SharedMemoryRegionOutOfRangeIs400) {
  const std::string key = "/kiln_serve_test_" + std::to_string(getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  close(fd);
  auto [st, msg] = post("/v2/systemsharedmemory/region/r/register",
                        json{{"key", key}, {"offset", 0}, {"byte_size", 64}}.dump());
  ASSERT_EQ(st, 200) << msg;
  auto [again, taken] = post("/v2/systemsharedmemory/region/r/register",
                             json{{"key", key}, {"offset", 0}, {"byte_size", 64}}.dump());
  EXPECT_EQ(again, 409);
  EXPECT_NE(taken.find("already registered"), std::string::npos);
  auto [beyond, why] = post("/v2/systemsharedmemory/region/s/register",
                            json{{"key", key}, {"offset", 32}, {"byte_size", 64}}.dump());
  EXPECT_EQ(beyond, 400);
  EXPECT_NE(why.find("offset 32 + byte_size 64 is beyond object"), std::string::npos) << why;
  const std::string in =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"parameters":)"
      R"({"shared_memory_region":"r","shared_memory_byte_size":16,"shared_memory_offset":56}}]})";
  auto [s1, m1] = post("/v2/models/twice/infer", in);
  EXPECT_EQ(s1, 400);
  EXPECT_NE(m1.find("shared_memory_offset 56 + shared_memory_byte_size 16 is beyond shared memory "
                    "region 'r' of 64 bytes"),
            std::string::npos)
      << m1;
  // In range: read in place, the output written into the region.
  const std::string ok = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"parameters":)"
                         R"({"shared_memory_region":"r","shared_memory_byte_size":16}}],)"
                         R"("outputs":[{"name":"y","parameters":{"shared_memory_region":"r",)"
                         R"("shared_memory_byte_size":16,"shared_memory_offset":32}}]})";
  auto [s2, m2] = post("/v2/models/twice/infer", ok);
  EXPECT_EQ(s2, 200) << m2;
  post("/v2/systemsharedmemory/unregister", "");
  shm_unlink(key.c_str());
}

TEST(ServeRestDecode, BinaryTensorsAndTheirLimits) {
  ShmRegistry shm;
  const std::string header =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}}]})";
  auto body = std::make_shared<const std::string>(header + std::string(16, '\0'));
  auto r = decode_rest_infer(body, std::to_string(header.size()), shm);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->inputs[0].bytes, 16u);
  auto short_body = std::make_shared<const std::string>(header + std::string(8, '\0'));
  auto s = decode_rest_infer(short_body, std::to_string(header.size()), shm);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "input 'x': binary_data_size 16 is not within the 8 bytes left in the body");
  auto past = decode_rest_infer(body, "100000", shm);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.error().message.find("is not within the body"), std::string::npos);
  auto huge = decode_rest_infer(
      std::make_shared<const std::string>(
          R"({"inputs":[{"name":"x","datatype":"FP32","shape":[4611686018427387904,9,0],"data":[]}]})"),
      std::nullopt, shm);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().message, "input 'x': shape [4611686018427387904, 9, 0] is too large");
  auto range = decode_rest_infer(
      std::make_shared<const std::string>(
          R"({"inputs":[{"name":"x","datatype":"INT8","shape":[1],"data":[300]}]})"),
      std::nullopt, shm);
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.error().message, "input 'x': value 300 is out of range for INT8");
}

// Triton's request parameters priority and timeout (microseconds): set on the request, and a
// value that is not a whole number >= 0 is a 400 naming the parameter.
TEST(ServeRestDecode, PriorityAndTimeoutParameters) {
  ShmRegistry shm;
  auto decode = [&](const std::string& params) {
    return decode_rest_infer(
        std::make_shared<const std::string>(
            R"({"parameters":)" + params +
            R"(,"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]})"),
        std::nullopt, shm);
  };
  const auto before = std::chrono::steady_clock::now();
  auto r = decode(R"({"priority": 2, "timeout": 5000000})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->priority, 2u);
  ASSERT_TRUE(r->deadline.has_value());
  EXPECT_GE(*r->deadline, before + std::chrono::seconds(5));
  EXPECT_LE(*r->deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  auto none = decode("{}");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->priority, 0u);
  EXPECT_FALSE(none->deadline.has_value());
  auto zero = decode(R"({"timeout": 0})");  // Triton's default: no timeout
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(zero->deadline.has_value());
  auto text = decode(R"({"priority": "high"})");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().status, 400);
  EXPECT_EQ(text.error().message, "parameter 'priority' must be a whole number, not 'high'");
  auto negative = decode(R"({"timeout": -1})");
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.error().message, "parameter 'timeout' must be microseconds >= 0, not -1");
}

// A name the client sent with a newline in it stays on the message's one line (escaped): found
// by fuzz_serve_requests, an input named "x\022\004FP64\032\002\000\n(...".
TEST(ServeRestDecode, ClientNamesWithControlCharactersStayOnOneLine) {
  ShmRegistry shm;
  auto r = decode_rest_infer(
      std::make_shared<const std::string>(
          "{\"inputs\":[{\"name\":\"x\\nFP64\",\"datatype\":\"FP65\",\"shape\":[1],\"data\":[1]}]}"),
      std::nullopt, shm);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "input 'x\\nFP64': datatype FP65 is not one kiln takes");
  EXPECT_EQ(ApiError(400, "a\tb\x01").message, "a\\tb\\x01");
}

#ifdef KILN_SERVE_GRPC
// A shape far larger than the contents sent is refused before anything is allocated (found by
// fuzz_serve_requests: a shape of 10^18 bytes with empty contents).
TEST(ServeGrpcDecode, ContentsShorterThanAHugeShapeAllocateNothing) {
  ShmRegistry shm;
  auto msg = std::make_shared<inference::ModelInferRequest>();
  auto* in = msg->add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  for (int64_t d : {int64_t{1} << 30, int64_t{1} << 28}) in->add_shape(d);
  in->mutable_contents()->add_fp32_contents(1.f);
  auto r = decode_grpc_infer(msg, shm);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("1 values in contents.fp32_contents"), std::string::npos)
      << r.error().message;
}

// The response's raw outputs appended to the serialized head, the large ones as slices of their
// own memory: the bytes parse back as the message protobuf would write, in the outputs' order.
TEST(ServeGrpcEncode, RawOutputsFollowTheHeadLargeOnesInPlace) {
  inference::ModelInferResponse head;
  head.set_model_name("m");
  head.add_outputs()->set_name("a");
  std::vector<float> big(70000);  // 280 KB: a slice of its own
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  const Tensor large = Tensor::from<float>({1, 70000}, big);
  const Tensor small = Tensor::from<float>({1, 3}, {1.f, 2.f, 3.f});
  const void* large_bytes = large.raw();
  std::vector<Tensor> raw = {small, Tensor(), large, small};  // an empty one: shared memory's
  grpc::ByteBuffer buf = infer_response_buffer(head, raw);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buf.Dump(&slices).ok());
  bool in_place = false;
  for (const grpc::Slice& sl : slices) in_place = in_place || sl.begin() == large_bytes;
  EXPECT_TRUE(in_place) << "the large output was copied";
  grpc::Slice whole;
  ASSERT_TRUE(buf.DumpToSingleSlice(&whole).ok());
  inference::ModelInferResponse back;
  ASSERT_TRUE(back.ParseFromArray(whole.begin(), static_cast<int>(whole.size())));
  EXPECT_EQ(back.model_name(), "m");
  ASSERT_EQ(back.raw_output_contents_size(), 4);
  const auto as_string = [](const Tensor& t) {
    return std::string(static_cast<const char*>(t.raw()), t.nbytes());
  };
  EXPECT_EQ(back.raw_output_contents(0), as_string(small));
  EXPECT_EQ(back.raw_output_contents(1), "");
  EXPECT_EQ(back.raw_output_contents(2), as_string(large));
  EXPECT_EQ(back.raw_output_contents(3), as_string(small));
  inference::ModelInferResponse want = head;  // protobuf's own encoding of the same message
  for (const Tensor& t : raw) *want.add_raw_output_contents() = t.nbytes() ? as_string(t) : "";
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(whole.begin()), whole.size()),
            want.SerializeAsString());
}

TEST(ServeGrpcDecode, NamesWhatIsWrong) {
  ShmRegistry shm;
  auto msg = std::make_shared<inference::ModelInferRequest>();
  auto* in = msg->add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(4);
  msg->add_raw_input_contents(std::string(12, '\0'));
  auto r = decode_grpc_infer(msg, shm);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "input 'x': 12 bytes of raw_input_contents, shape [1, 4] of FP32 takes 16");
  msg->add_raw_input_contents("x");
  EXPECT_EQ(decode_grpc_infer(msg, shm).error().message,
            "1 inputs and 2 raw_input_contents: with raw contents there must be one per input, "
            "in the inputs' order");
  msg->clear_raw_input_contents();
  in->mutable_contents()->add_fp32_contents(1.f);
  EXPECT_EQ(decode_grpc_infer(msg, shm).error().message,
            "input 'x': 1 values in contents.fp32_contents, shape [1, 4] takes 4");
  in->set_datatype("FP16");
  EXPECT_EQ(decode_grpc_infer(msg, shm).error().message,
            "input 'x': FP16 data must come in raw_input_contents");
  const std::string whole = msg->SerializeAsString();
  const auto* p = reinterpret_cast<const uint8_t*>(whole.data());
  EXPECT_EQ(why_not_a_message(p, whole.size() - 3), "the protobuf message is truncated");
  const std::string group = "\x0b" + whole;
  EXPECT_EQ(why_not_a_message(reinterpret_cast<const uint8_t*>(group.data()), group.size()),
            "protobuf wire type 3 is not one a ModelInferRequest has");
  const std::string varint = "\x08" + std::string(12, '\xff');
  EXPECT_EQ(why_not_a_message(reinterpret_cast<const uint8_t*>(varint.data()), varint.size()),
            "a protobuf varint is over 10 bytes");
}
#endif

}  // namespace
}  // namespace kiln::serve
