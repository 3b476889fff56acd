// kiln perf's load loop against kiln serve's core and front ends in this process (localhost,
// free ports, the cpu engines of tests/serve/serve_test_util.h): HTTP and gRPC, with and without
// system shared memory; the server's counters agree with the client's, nothing is left
// registered or in /dev/shm, and a refused request or an unknown model stops the run.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "../serve/serve_test_util.h"
#include "perf/load.h"
#include "perf/report.h"
#include "serve/http_server.h"
#include "serve/server.h"
#ifdef KILN_SERVE_GRPC
#include "serve/grpc_server.h"
#endif

namespace kiln::perf {
namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

size_t perf_objects_in_dev_shm() {
  size_t n = 0;
  const std::string mine = "kiln_perf_" + std::to_string(::getpid()) + "_";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    n += e.path().filename().string().rfind(mine, 0) == 0;
  return n;
}

class PerfLoad : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    serve::CoreOptions co;
    co.repository = serve::testing::make_repository();
    co.batcher.warm = false;
    co.batcher.max_delay_ms = 1;
    auto core = serve::Core::load(co, [](const std::string&) {});
    ASSERT_TRUE(core.ok()) << core.status().message();
    core_ = std::move(core).value().release();
    http_ = new serve::HttpServer(*core_, {"127.0.0.1", 0, 1 << 20, 2, false});
    ASSERT_TRUE(http_->bind().ok());
    thread_ = new std::thread([] { http_->serve(); });
#ifdef KILN_SERVE_GRPC
    grpc_port_ = free_port();
    grpc_ = new serve::GrpcServer(*core_, {"127.0.0.1", grpc_port_, 1 << 20, false});
    ASSERT_TRUE(grpc_->start().ok());
#endif
  }
  static void TearDownTestSuite() {
#ifdef KILN_SERVE_GRPC
    grpc_->stop();
    delete grpc_;
#endif
    http_->stop();
    thread_->join();
    delete thread_;
    delete http_;
    delete core_;
  }

  static PerfOptions options(Protocol protocol, bool shm) {
    PerfOptions o;
    o.model = "twice";
    o.protocol = protocol;
    o.url = {"127.0.0.1", protocol == Protocol::kGrpc ? grpc_port_ : http_->port()};
    o.metrics_url = {"127.0.0.1", http_->port()};
    o.shm = shm;
    o.levels = {1, 3};
    o.measurement_ms = 150;
    o.max_requests = 60;
    o.output_shm_size = 64;
    return o;
  }

  // Runs `o` and checks what every run must hold; returns the result.
  static RunResult run(const PerfOptions& o) {
    std::vector<std::string> warnings;
    size_t reported = 0;
    auto r = run_perf(
        o, [&](const LevelResult&) { ++reported; },
        [&](const std::string& w) { warnings.push_back(w); });
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return {};
    EXPECT_TRUE(warnings.empty()) << warnings[0];
    EXPECT_EQ(reported, o.levels.size());
    EXPECT_EQ(r->levels.size(), o.levels.size());
    for (const LevelResult& l : r->levels) {
      EXPECT_GT(l.requests, 0u);
      EXPECT_EQ(l.errors, 0u) << (l.error_messages.empty() ? "" : l.error_messages.begin()->first);
      EXPECT_LE(l.requests, o.max_requests);
      EXPECT_LE(l.latency.p50_us, l.latency.p90_us);
      EXPECT_LE(l.latency.p90_us, l.latency.p99_us);
      EXPECT_TRUE(l.has_server);
      // Every request sent was taken by the server and run in some batch of the sizes counted.
      EXPECT_EQ(l.server.requests, static_cast<double>(l.requests));
      EXPECT_EQ(l.server.samples, static_cast<double>(l.requests * o.batch));
      double inferences = 0, samples = 0;
      for (const auto& [size, n] : l.server.batches) inferences += n, samples += size * n;
      EXPECT_EQ(inferences, l.server.inferences);
      EXPECT_EQ(samples, l.server.samples + l.server.padded_samples);
      EXPECT_GT(l.server.compute_us, 0);
      EXPECT_DOUBLE_EQ(server_split(l.server).avg_batch, l.server.samples / l.server.inferences);
      EXPECT_GE(server_split(l.server).avg_batch, o.batch);
    }
    auto status = core_->shm().status("");
    EXPECT_TRUE(status.ok() && status->empty()) << "a region is left registered";
    EXPECT_EQ(perf_objects_in_dev_shm(), 0u);
    return std::move(r).value();
  }

  static serve::Core* core_;
  static serve::HttpServer* http_;
  static std::thread* thread_;
#ifdef KILN_SERVE_GRPC
  static serve::GrpcServer* grpc_;
#endif
  static int grpc_port_;
};
serve::Core* PerfLoad::core_ = nullptr;
serve::HttpServer* PerfLoad::http_ = nullptr;
std::thread* PerfLoad::thread_ = nullptr;
#ifdef KILN_SERVE_GRPC
serve::GrpcServer* PerfLoad::grpc_ = nullptr;
#endif
int PerfLoad::grpc_port_ = 0;

TEST_F(PerfLoad, Http) { run(options(Protocol::kHttp, false)); }

TEST_F(PerfLoad, HttpSharedMemoryBatch2) {
  PerfOptions o = options(Protocol::kHttp, true);
  o.batch = 2;
  const RunResult r = run(o);
  ASSERT_EQ(r.plan.inputs.size(), 1u);
  EXPECT_EQ(r.plan.inputs[0].tensor.shape, (std::vector<int64_t>{2, 4}));
}

TEST_F(PerfLoad, RequestRate) {
  PerfOptions o = options(Protocol::kHttp, false);
  o.mode = LoadMode::kRequestRate;
  o.levels = {200};
  o.max_threads = 2;
  const RunResult r = run(o);
  ASSERT_EQ(r.levels.size(), 1u);
  EXPECT_LE(r.levels[0].requests, 31u);  // 200/s for 150 ms
}

#ifdef KILN_SERVE_GRPC
TEST_F(PerfLoad, Grpc) { run(options(Protocol::kGrpc, false)); }
TEST_F(PerfLoad, GrpcSharedMemory) { run(options(Protocol::kGrpc, true)); }
#endif

TEST_F(PerfLoad, TheServersMetricsParse) {
  auto samples = parse_prometheus(core_->metrics_text());
  ASSERT_TRUE(samples.ok()) << samples.status().message();
  EXPECT_TRUE(model_counters(*samples, "twice", "").found);
  EXPECT_TRUE(model_counters(*samples, "versioned", "3").found);
}

TEST_F(PerfLoad, RefusedRequestsAndUnknownModelsStopTheRun) {
  auto message = [](const PerfOptions& o) {
    auto r = run_perf(
        o, [](const LevelResult&) {}, [](const std::string&) {});
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  PerfOptions o = options(Protocol::kHttp, true);
  o.batch = 9;  // the profile's maximum is 8
  EXPECT_NE(message(o).find("the first request failed: HTTP 400"), std::string::npos);
  o.model = "nosuch";
  EXPECT_NE(message(o).find("model 'nosuch': HTTP 404"), std::string::npos);
  o = options(Protocol::kHttp, false);
  o.model = "fixed";  // batch 1 only: no dynamic leading dim
  o.batch = 2;
  EXPECT_NE(message(o).find("takes -b 1 only"), std::string::npos);
  o.url.port = free_port();  // nothing listens there
  EXPECT_NE(message(o).find("is the server up"), std::string::npos);
  auto status = core_->shm().status("");
  EXPECT_TRUE(status.ok() && status->empty());
  EXPECT_EQ(perf_objects_in_dev_shm(), 0u);
}

}  // namespace
}  // namespace kiln::perf
