// The server core on the cpu backend: the model repository's layouts, request checking, and the
// dynamic batcher (joining, preferred sizes, padding, the queue limit, drain).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <condition_variable>
#include <mutex>

#include "serve/batcher.h"
#include "serve/device.h"
#include "serve/server.h"
#include "serve_test_util.h"

namespace kiln::serve {
namespace {

std::string repo() {
  static const std::string dir = testing::make_repository();
  return dir;
}

InferRequest request(const std::string& model, std::vector<float> values, int64_t rows) {
  auto t = std::make_shared<Tensor>(Tensor::from<float>({rows, 4}, values));
  InferRequest r;
  r.model = model;
  r.inputs.push_back(
      {"x", DataType::kFloat32, {rows, 4}, static_cast<const uint8_t*>(t->raw()), t->nbytes(), t});
  return r;
}

// Collects the answers of submitted requests.
struct Answers {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result<Outputs>> got;
  Done done() {
    return [this](InferRequest&, Result<Outputs> out) {
      std::lock_guard<std::mutex> lk(mu);
      got.push_back(std::move(out));
      cv.notify_all();
    };
  }
  bool wait(size_t n, int seconds = 20) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return got.size() >= n; });
  }
};

std::unique_ptr<ServedModel> load_twice() {
  auto m = ServedModel::load("twice", "1", repo() + "/twice.kiln", {}, 0);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

TEST(ServeRepository, FindsEveryLayout) {
  auto found = find_models(repo());
  ASSERT_TRUE(found.ok()) << found.status().message();
  std::vector<std::string> names;
  for (const RepositoryEntry& e : *found) names.push_back(e.name + "@" + e.version);
  EXPECT_EQ(names, (std::vector<std::string>{"fixed@1", "twice@1", "versioned@1", "versioned@3"}));
  EXPECT_FALSE(find_models(repo() + "/no_such_folder").ok());
}

TEST(ServeRepository, CoreFindsVersionsAndSaysWhatIsUnknown) {
  CoreOptions o;
  o.repository = repo();
  o.batcher.warm = false;
  auto core = Core::load(o, [](const std::string&) {});
  ASSERT_TRUE(core.ok()) << core.status().message();
  EXPECT_EQ((*core)->versions("versioned"), (std::vector<std::string>{"1", "3"}));
  auto latest = (*core)->find("versioned", "");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ((*latest)->model->version(), "3");
  auto missing = (*core)->find("nosuch", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().status, 404);
  EXPECT_EQ(missing.error().message, "unknown model 'nosuch'");
  EXPECT_EQ((*core)->find("versioned", "2").error().status, 404);
  // An unknown model through infer: answered at once, with the 404.
  Answers a;
  (*core)->infer(request("nosuch", std::vector<float>(4, 1.f), 1), a.done());
  ASSERT_TRUE(a.wait(1));
  EXPECT_EQ(a.got[0].error().status, 404);
  // A good one through infer, then counted on /metrics.
  Answers b;
  (*core)->infer(request("twice", std::vector<float>(8, 1.f), 2), b.done());
  ASSERT_TRUE(b.wait(1));
  ASSERT_TRUE(b.got[0].ok()) << b.got[0].error().message;
  const std::string text = (*core)->metrics_text();
  for (const char* line :
       {"kiln_requests_total{model=\"twice\",version=\"1\"} 1",
        "kiln_samples_total{model=\"twice\",version=\"1\"} 2",
        "kiln_batch_inferences_total{model=\"twice\",version=\"1\",batch=\"2\"} 1",
        "kiln_device_inferences_total{model=\"twice\",version=\"1\",device=\"cpu\"} 1",
        "# TYPE kiln_queue_duration_us_total counter"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
}

TEST(ServeModel, ChecksRequestsAgainstTheEngine) {
  auto m = load_twice();
  EXPECT_EQ(m->max_batch(), 8);
  auto expect_error = [&](InferRequest r, const std::string& message) {
    auto b = m->check_request(r);
    ASSERT_FALSE(b.ok()) << message;
    EXPECT_EQ(b.error().status, 400);
    EXPECT_EQ(b.error().message, message);
  };
  InferRequest wrong_name = request("twice", std::vector<float>(4), 1);
  wrong_name.inputs[0].name = "image";
  expect_error(wrong_name, "unknown input 'image' (the model's inputs: x)");
  InferRequest wrong_type = request("twice", std::vector<float>(4), 1);
  wrong_type.inputs[0].dtype = DataType::kFloat64;
  expect_error(wrong_type, "input 'x': datatype FP64, the model takes FP32");
  InferRequest wrong_shape = request("twice", std::vector<float>(4), 1);
  wrong_shape.inputs[0].shape = {1, 5};
  expect_error(wrong_shape, "input 'x': shape [1, 5], the model takes [-1, 4]");
  expect_error(request("twice", std::vector<float>(36), 9),
               "input 'x': shape [9, 4] is outside the model's range (min [1, 4], max [8, 4])");
  InferRequest none;
  expect_error(none, "input 'x' is missing");
  InferRequest ok = request("twice", std::vector<float>(12), 3);
  auto b = m->check_request(ok);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, 3);
  ok.outputs.push_back({"logits", std::nullopt, std::nullopt});
  auto bad_out = m->check_outputs(ok);
  ASSERT_TRUE(bad_out.has_value());
  EXPECT_EQ(bad_out->message, "unknown output 'logits' (the model's outputs: y)");
}

// A joined batch's copies, split over threads by bytes (cut inside a request's copy too): every
// byte where it belongs, none written past, small batches and empty copies included.
TEST(ServeBatcher, RowCopiesLandWhereTheyBelongOnAnyNumberOfThreads) {
  for (const size_t each : {size_t{3}, size_t{1} << 20, (size_t{5} << 20) + 7}) {
    std::vector<std::vector<uint8_t>> src;
    for (int i = 0; i < 7; ++i) {
      src.emplace_back(i == 3 ? 0 : each + static_cast<size_t>(i));
      for (size_t k = 0; k < src.back().size(); ++k)
        src.back()[k] = static_cast<uint8_t>(k * 31 + static_cast<size_t>(i) * 7 + 1);
    }
    size_t total = 0;
    for (const auto& v : src) total += v.size();
    std::vector<uint8_t> dst(total + 64, 0xEE);
    std::vector<RowCopy> copies;
    size_t at = 0;
    for (const auto& v : src) {
      copies.push_back({dst.data() + at, v.data(), v.size()});
      at += v.size();
    }
    copy_rows(copies);
    at = 0;
    for (const auto& v : src) {
      if (!v.empty())
        ASSERT_EQ(std::memcmp(dst.data() + at, v.data(), v.size()), 0) << each << " at " << at;
      at += v.size();
    }
    for (size_t k = total; k < dst.size(); ++k) ASSERT_EQ(dst[k], 0xEE) << each;
  }
}

TEST(ServeBatcher, JoinsConcurrentRequestsAndSplitsTheOutputs) {
  auto m = load_twice();
  BatcherOptions o;
  o.contexts = 1;
  o.max_delay_ms = 300;      // all six arrive well within it
  o.delay_when_idle = true;  // the first waits for the others too
  auto b = Batcher::create(*m, o);
  ASSERT_TRUE(b.ok()) << b.status().message();
  std::vector<Answers> answers(6);
  for (int i = 0; i < 6; ++i) {
    InferRequest r = request("twice", std::vector<float>(4, static_cast<float>(i)), 1);
    ASSERT_TRUE(m->check_request(r).ok());
    (*b)->submit(std::move(r), 1, answers[i].done());
  }
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(answers[i].wait(1));
    ASSERT_TRUE(answers[i].got[0].ok()) << answers[i].got[0].error().message;
    const Tensor& y = (*answers[i].got[0])[0];
    EXPECT_EQ(y.shape(), (std::vector<int64_t>{1, 4}));
    EXPECT_EQ(y.data<float>()[3], 2.f * i);
  }
  ModelStats& st = (*b)->stats();
  EXPECT_EQ(st.requests, 6u);
  EXPECT_EQ(st.inferences, 1u);
  EXPECT_EQ(st.batched_requests, 6u);
  EXPECT_EQ(st.largest_batch, 6u);
}

TEST(ServeBatcher, PreferredSizeIsHandedOverWithoutWaiting) {
  auto m = load_twice();
  BatcherOptions o;
  o.contexts = 1;
  o.max_delay_ms = 10000;  // far longer than the test waits
  o.delay_when_idle = true;
  o.preferred = {4};
  auto b = Batcher::create(*m, o);
  ASSERT_TRUE(b.ok());
  Answers a;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    InferRequest r = request("twice", std::vector<float>(8, 1.f), 2);
    ASSERT_TRUE(m->check_request(r).ok());
    (*b)->submit(std::move(r), 2, a.done());
  }
  ASSERT_TRUE(a.wait(2, 5));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ((*b)->stats().inferences, 1u);
  std::lock_guard<std::mutex> lk((*b)->stats().mu);
  EXPECT_EQ((*b)->stats().per_batch[4], 1u);
}

TEST(ServeBatcher, PadsToTheNextSizeAndDropsThePadding) {
  auto m = load_twice();
  BatcherOptions o;
  o.contexts = 1;
  o.max_delay_ms = 200;
  o.delay_when_idle = true;
  auto sizes = parse_pad_sizes("4", m->max_batch());
  ASSERT_TRUE(sizes.ok());
  EXPECT_EQ(*sizes, (std::vector<int>{4, 8}));
  o.pad_sizes = *sizes;
  auto b = Batcher::create(*m, o);
  ASSERT_TRUE(b.ok());
  Answers a;
  for (int i = 0; i < 3; ++i) {
    InferRequest r = request("twice", std::vector<float>(4, 3.f), 1);
    ASSERT_TRUE(m->check_request(r).ok());
    (*b)->submit(std::move(r), 1, a.done());
  }
  ASSERT_TRUE(a.wait(3));
  for (auto& g : a.got) {
    ASSERT_TRUE(g.ok());
    EXPECT_EQ((*g)[0].shape(), (std::vector<int64_t>{1, 4}));
    EXPECT_EQ((*g)[0].data<float>()[0], 6.f);
  }
  EXPECT_EQ((*b)->stats().padded_samples, 1u);
  EXPECT_EQ((*b)->stats().inferences, 1u);
  EXPECT_FALSE(parse_pad_sizes("a,b", 8).ok());
  EXPECT_FALSE(parse_pad_sizes("0", 8).ok());
  EXPECT_EQ(pad_target(5, {1, 2, 4, 8}), 8);
  EXPECT_EQ(pad_target(9, {1, 2, 4, 8}), 9);
}

TEST(ServeBatcher, FullQueueIs429AndDrainAnswersTheQueued) {
  auto m = load_twice();
  BatcherOptions o;
  o.contexts = 1;
  o.max_delay_ms = 60000;  // nothing runs before the drain
  o.delay_when_idle = true;
  o.max_queue = 2;
  auto b = Batcher::create(*m, o);
  ASSERT_TRUE(b.ok());
  Answers queued, refused;
  for (int i = 0; i < 3; ++i) {
    InferRequest r = request("twice", std::vector<float>(4, 1.f), 1);
    ASSERT_TRUE(m->check_request(r).ok());
    (*b)->submit(std::move(r), 1, i < 2 ? queued.done() : refused.done());
  }
  ASSERT_TRUE(refused.wait(1, 5));
  ASSERT_FALSE(refused.got[0].ok());
  EXPECT_EQ(refused.got[0].error().status, 429);
  EXPECT_NE(refused.got[0].error().message.find("--max-queue"), std::string::npos);
  (*b)->drain();  // runs the two queued without waiting out the delay
  ASSERT_TRUE(queued.wait(2, 5));
  for (auto& g : queued.got) EXPECT_TRUE(g.ok());
  Answers late;
  (*b)->submit(request("twice", std::vector<float>(4, 1.f), 1), 1, late.done());
  ASSERT_TRUE(late.wait(1, 5));
  EXPECT_EQ(late.got[0].error().status, 503);
}

TEST(ServeBatcher, IdleContextsRunARequestAtOnce) {
  auto m = load_twice();
  BatcherOptions o;
  o.contexts = 1;
  o.max_delay_ms = 10000;  // the request must not wait it out
  auto b = Batcher::create(*m, o);
  ASSERT_TRUE(b.ok());
  Answers a;
  const auto t0 = std::chrono::steady_clock::now();
  InferRequest r = request("twice", std::vector<float>(4, 1.f), 1);
  ASSERT_TRUE(m->check_request(r).ok());
  (*b)->submit(std::move(r), 1, a.done());
  ASSERT_TRUE(a.wait(1, 5));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// With priority levels a request of a higher level (a lower number) runs before an older one
// of a lower level; a priority past the levels is a 400.
TEST(ServeBatcher, HigherPriorityRunsFirst) {
  auto m = load_twice();
  BatcherOptions o;
  o.contexts = 1;
  o.max_delay_ms = 300;  // the first request waits for others: the second arrives meanwhile
  o.delay_when_idle = true;
  o.priority_levels = 2;
  auto b = Batcher::create(*m, o);
  ASSERT_TRUE(b.ok());
  std::mutex mu;
  std::vector<float> order;  // each answer's first value, as they come
  Answers a;
  auto note = [&](InferRequest& r, Result<Outputs> out) {
    {
      std::lock_guard<std::mutex> lk(mu);
      order.push_back(out.ok() ? (*out)[0].data<float>()[0] : -1.f);
    }
    a.done()(r, std::move(out));
  };
  InferRequest low = request("twice", std::vector<float>(16, 1.f), 4);
  low.priority = 2;
  ASSERT_TRUE(m->check_request(low).ok());
  (*b)->submit(std::move(low), 4, note);
  // 8 rows: it cannot join the first (the batch limit is 8) and is a full batch of its own.
  InferRequest high = request("twice", std::vector<float>(32, 5.f), 8);
  high.priority = 1;
  ASSERT_TRUE(m->check_request(high).ok());
  (*b)->submit(std::move(high), 8, note);
  ASSERT_TRUE(a.wait(2, 10));
  EXPECT_EQ(order, (std::vector<float>{10.f, 2.f}));
  Answers bad;
  InferRequest past = request("twice", std::vector<float>(4, 1.f), 1);
  past.priority = 3;
  (*b)->submit(std::move(past), 1, bad.done());
  ASSERT_TRUE(bad.wait(1, 5));
  ASSERT_FALSE(bad.got[0].ok());
  EXPECT_EQ(bad.got[0].error().status, 400);
  EXPECT_NE(bad.got[0].error().message.find("priority 3 is not a level"), std::string::npos);
}

// A request whose timeout passes in the queue is answered 408 and not run; one whose client
// went away, 499; both counted; the others run.
TEST(ServeBatcher, TimedOutAndCancelledRequestsAreDropped) {
  auto m = load_twice();
  BatcherOptions o;
  o.contexts = 1;
  o.max_delay_ms = 200;  // every request waits this long for others
  o.delay_when_idle = true;
  auto b = Batcher::create(*m, o);
  ASSERT_TRUE(b.ok());
  Answers late, gone, fine;
  InferRequest r1 = request("twice", std::vector<float>(4, 1.f), 1);
  ASSERT_FALSE(set_scheduling(r1, std::nullopt, 1000).has_value());  // 1 ms: over before 200
  (*b)->submit(std::move(r1), 1, late.done());
  InferRequest r2 = request("twice", std::vector<float>(4, 1.f), 1);
  r2.cancelled = [] { return true; };
  (*b)->submit(std::move(r2), 1, gone.done());
  InferRequest r3 = request("twice", std::vector<float>(4, 3.f), 1);
  ASSERT_FALSE(set_scheduling(r3, std::nullopt, 60 * 1000000).has_value());
  (*b)->submit(std::move(r3), 1, fine.done());
  ASSERT_TRUE(late.wait(1, 5) && gone.wait(1, 5) && fine.wait(1, 5));
  ASSERT_FALSE(late.got[0].ok());
  EXPECT_EQ(late.got[0].error().status, 408);
  EXPECT_NE(late.got[0].error().message.find("timeout passed"), std::string::npos);
  ASSERT_FALSE(gone.got[0].ok());
  EXPECT_EQ(gone.got[0].error().status, 499);
  ASSERT_TRUE(fine.got[0].ok()) << fine.got[0].error().message;
  EXPECT_EQ((*fine.got[0])[0].data<float>()[0], 6.f);
  EXPECT_EQ((*b)->stats().timed_out, 1u);
  EXPECT_EQ((*b)->stats().cancelled, 1u);
  EXPECT_EQ((*b)->stats().samples, 1u);  // only the third ran
  EXPECT_EQ(grpc_code(408), 4);          // DEADLINE_EXCEEDED
  EXPECT_EQ(grpc_code(499), 1);          // CANCELLED
}

TEST(ServeBatcher, UnbatchedModelRunsEachRequestAlone) {
  auto m = ServedModel::load("fixed", "1", repo() + "/fixed/model.kiln", {}, 0);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->max_batch(), 1);
  auto b = Batcher::create(**m, BatcherOptions{});
  ASSERT_TRUE(b.ok());
  Answers a;
  for (int i = 0; i < 3; ++i) {
    InferRequest r = request("fixed", std::vector<float>(4, 1.f), 1);
    ASSERT_TRUE((*m)->check_request(r).ok());
    (*b)->submit(std::move(r), 1, a.done());
  }
  ASSERT_TRUE(a.wait(3));
  EXPECT_EQ((*b)->stats().inferences, 3u);
}

TEST(ServeDevices, ParsesTheList) {
  EXPECT_EQ(*parse_devices("", 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(*parse_devices("all", 0), (std::vector<int>{}));
  EXPECT_EQ(*parse_devices("1,0", 2), (std::vector<int>{1, 0}));
  EXPECT_NE(parse_devices("0,0", 2).status().message().find("twice"), std::string::npos);
  EXPECT_NE(parse_devices("2", 2).status().message().find("does not exist"), std::string::npos);
  EXPECT_NE(parse_devices("gpu0", 2).status().message().find("GPU indices"), std::string::npos);
}

// The batcher's gather buffers: page-locked for a GPU engine where CUDA gives them, else ordinary
// memory; either way 64-byte aligned, writable, and as large as asked.
TEST(ServeDevices, HostBuffersAreAlignedEitherWay) {
  for (bool pinned : {false, true}) {
    std::shared_ptr<void> b = host_buffer(1000, pinned);
    ASSERT_TRUE(b);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % 64, 0u);
    std::memset(b.get(), 0xA5, 1000);
    EXPECT_EQ(static_cast<unsigned char*>(b.get())[999], 0xA5);
  }
}

}  // namespace
}  // namespace kiln::serve
