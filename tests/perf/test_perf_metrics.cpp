// kiln perf's reading of kiln serve's /metrics (Prometheus text) and its reports: a level's
// counters, their difference, the queue/compute split and the CSV and JSON written from them.
#include <gtest/gtest.h>

#include "perf/metrics.h"
#include "perf/report.h"

namespace kiln::perf {
namespace {

// What kiln serve's Core::metrics_text() writes, for two models (and two versions of one).
const char* kText = R"(# HELP kiln_requests_total Inference requests taken
# TYPE kiln_requests_total counter
kiln_requests_total{model="mlp",version="1"} 10
kiln_requests_total{model="mlp",version="2"} 5
kiln_requests_total{model="other",version="1"} 99
kiln_inferences_total{model="mlp",version="1"} 4
kiln_inferences_total{model="mlp",version="2"} 5
kiln_samples_total{model="mlp",version="1"} 10
kiln_queue_duration_us_total{model="mlp",version="1"} 1000
kiln_compute_duration_us_total{model="mlp",version="1"} 400
kiln_request_duration_us_total{model="mlp",version="1"} 3000
kiln_batch_inferences_total{model="mlp",version="1",batch="1"} 1
kiln_batch_inferences_total{model="mlp",version="1",batch="3"} 3
kiln_batch_inferences_total{model="mlp",version="2",batch="1"} 5
kiln_responses_total{protocol="http",status="200"} 114
kiln_odd{model="a \"quoted\" name",version="1"} 1.5e3
)";

TEST(PerfMetrics, ParsesPrometheusText) {
  auto s = parse_prometheus(kText);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 14u);
  EXPECT_EQ((*s)[0].name, "kiln_requests_total");
  EXPECT_EQ((*s)[0].labels.at("model"), "mlp");
  EXPECT_EQ((*s)[0].value, 10);
  EXPECT_EQ(s->back().labels.at("model"), "a \"quoted\" name");
  EXPECT_EQ(s->back().value, 1500);
  auto plain = parse_prometheus("up 1\r\n\n# comment\nx{} 2\n");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->size(), 2u);
  for (const char* bad :
       {"x{model=\"a\" 1\n", "x{model=a} 1\n", "x 1 2 three\nx\n", "x abc\n", "{a=\"b\"} 1\n"}) {
    auto r = parse_prometheus(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("/metrics line"), std::string::npos);
    }
  }
}

TEST(PerfMetrics, CountersOfOneModel) {
  auto s = parse_prometheus(kText);
  ASSERT_TRUE(s.ok());
  const ServerCounters all = model_counters(*s, "mlp", "");
  EXPECT_TRUE(all.found);
  EXPECT_EQ(all.requests, 15);
  EXPECT_EQ(all.inferences, 9);
  EXPECT_EQ(all.batches.at(1), 6);
  EXPECT_EQ(all.batches.at(3), 3);
  const ServerCounters v1 = model_counters(*s, "mlp", "1");
  EXPECT_EQ(v1.requests, 10);
  EXPECT_EQ(v1.batches.at(1), 1);
  EXPECT_EQ(v1.queue_us, 1000);
  EXPECT_FALSE(model_counters(*s, "nope", "").found);
  EXPECT_FALSE(model_counters(*s, "mlp", "7").found);

  ServerCounters before = v1;
  before.requests = 4;
  before.inferences = 2;
  before.samples = 4;
  before.queue_us = 400;
  before.compute_us = 100;
  before.request_us = 1200;
  before.batches = {{1, 1}, {3, 1}};
  const ServerCounters d = delta(v1, before);
  EXPECT_EQ(d.requests, 6);
  EXPECT_EQ(d.inferences, 2);
  EXPECT_EQ(d.batches.count(1), 0u);  // no inference of batch 1 in between
  EXPECT_EQ(d.batches.at(3), 2);
  const ServerSplit split = server_split(d);
  EXPECT_DOUBLE_EQ(split.queue_us, 100);    // 600 us over 6 requests
  EXPECT_DOUBLE_EQ(split.compute_us, 150);  // 300 us over 2 inferences
  EXPECT_DOUBLE_EQ(split.request_us, 300);
  EXPECT_DOUBLE_EQ(split.avg_batch, 3);
  EXPECT_DOUBLE_EQ(server_split(ServerCounters{}).avg_batch, 0);  // nothing ran: no division
}

TEST(PerfReport, CsvJsonAndTable) {
  PerfOptions o;
  o.model = "mlp";
  o.batch = 2;
  RunResult run;
  LevelResult r;
  r.level = 4;
  r.requests = 100;
  r.errors = 1;
  r.duration_s = 0.5;
  r.latency.p50_us = 10;
  r.latency.p99_us = 30;
  r.error_messages["HTTP 400: bad"] = 1;
  r.has_server = true;
  r.server.requests = 100;
  r.server.inferences = 50;
  r.server.samples = 200;
  r.server.queue_us = 2000;
  r.server.compute_us = 500;
  r.server.batches = {{4, 50}};
  run.levels.push_back(r);
  EXPECT_DOUBLE_EQ(throughput(o, r), 400);  // 100 requests of 2 samples in 0.5 s
  const std::string csv = to_csv(o, run);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "Concurrency,Inferences/Second,Requests,Errors,Server Queue,Server Compute Infer,"
            "Server Request,Avg Batch,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency");
  EXPECT_NE(csv.find("\n4,400.00,100,1,20.0,10.0,0.0,4.000,10.0,0.0,0.0,30.0,0.0\n"),
            std::string::npos)
      << csv;
  const nlohmann::json j = to_json(o, run);
  EXPECT_EQ(j["mode"], "concurrency");
  EXPECT_TRUE(j["results"][0]["concurrency"].is_number_integer());
  EXPECT_EQ(j["results"][0]["concurrency"], 4);
  EXPECT_EQ(j["results"][0]["server"]["batch_inferences"]["4"], 50);
  EXPECT_EQ(j["results"][0]["error_messages"][0]["message"], "HTTP 400: bad");
  const std::string row = table_row(o, r);
  EXPECT_NE(row.find("4.00  4x50"), std::string::npos) << row;
  o.mode = LoadMode::kRequestRate;
  r.has_server = false;
  run.levels[0] = r;
  EXPECT_EQ(to_csv(o, run).rfind("Request Rate,", 0), 0u);
  EXPECT_TRUE(to_json(o, run)["results"][0]["server"].is_null());
  EXPECT_NE(table_header(o).find("rate/s"), std::string::npos);
}

}  // namespace
}  // namespace kiln::perf
