// The CUDA engine end to end on a small convolution network built in code: several contexts on
// several threads agree with one; CUDA-graph replay agrees with plain runs; the device path
// (set_input_shape / set_tensor_address / enqueue) agrees with execute(); save + load keeps
// the plan; bad shapes are refused with one clear message. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/backend_info.h"
#include "engine/profile.h"
#include "kiln/engine.h"
#include "ops/op.h"

namespace kiln {
namespace {

bool have_gpu() { return cuda_device_count() > 0; }

Tensor random(std::vector<int64_t> shape, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// x [N,8,10,10] -> FusedConv 3x3 relu (16) -> FusedConv 1x1 (8) + x residual relu -> y
std::unique_ptr<Graph> small_net() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 8, 10, 10}));
  g->add_input(x);
  Value* w1 = g->add_constant("w1", random({16, 8, 3, 3}, 1, 0.3f));
  Value* b1 = g->add_constant("b1", random({16}, 2, 0.1f));
  Value* w2 = g->add_constant("w2", random({8, 16, 1, 1}, 3, 0.3f));
  Value* b2 = g->add_constant("b2", random({8}, 4, 0.1f));
  Node* c1 = g->add_node("FusedConv", "c1", {x, w1, b1}, {"h"}, "kiln");
  c1->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
  c1->attrs.set("activation", Attribute::String("Relu"));
  Node* c2 = g->add_node("FusedConv", "c2", {c1->output(0), w2, b2, x}, {"y"}, "kiln");
  c2->attrs.set("activation", Attribute::String("Relu"));
  g->add_output(c2->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

std::unique_ptr<Engine> build(bool fp16) {
  BuildConfig c;
  c.backend = "cuda";
  c.fp16 = fp16;
  c.min_shapes = {{"x", {1, 8, 10, 10}}};
  c.opt_shapes = {{"x", {4, 8, 10, 10}}};
  c.max_shapes = {{"x", {8, 8, 10, 10}}};
  auto e = Engine::build_from_graph(small_net(), c, "small_net");
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += (a.at_double(i) - b.at_double(i)) * (a.at_double(i) - b.at_double(i));
    den += b.at_double(i) * b.at_double(i);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(CudaEngine, ContextsOnThreadsAgree) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = build(false);
  ASSERT_TRUE(e);
  auto cpu_cfg = BuildConfig{};
  cpu_cfg.backend = "cpu";
  auto cpu = Engine::build_from_graph(small_net(), cpu_cfg, "small_net");
  ASSERT_TRUE(cpu.ok());
  constexpr int kThreads = 4;
  std::vector<Tensor> inputs, results(kThreads), refs(kThreads);
  for (int t = 0; t < kThreads; ++t) inputs.push_back(random({1 + t, 8, 10, 10}, 100 + t));
  for (int t = 0; t < kThreads; ++t) {
    auto ctx = (*cpu)->create_context();
    refs[t] = (*(*ctx)->execute({{"x", inputs[t]}}))[0];
  }
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      auto ctx = e->create_context();
      if (!ctx.ok()) { errors[t] = ctx.status().message(); return; }
      for (int rep = 0; rep < 20; ++rep) {
        auto r = (*ctx)->execute({{"x", inputs[t]}});
        if (!r.ok()) { errors[t] = r.status().message(); return; }
        results[t] = (*r)[0];
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(errors[t].empty()) << errors[t];
    EXPECT_LT(rel_l2(results[t], refs[t]), 1e-3) << "thread " << t;
  }
}

TEST(CudaEngine, DevicePathAndCudaGraphAgreeWithExecute) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  for (bool fp16 : {false, true}) {
    auto e = build(fp16);
    ASSERT_TRUE(e);
    auto ctx = e->create_context();
    ASSERT_TRUE(ctx.ok()) << ctx.status().message();
    const Tensor x = random({3, 8, 10, 10}, 7);
    auto ref = (*ctx)->execute({{"x", x}});
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    void *dx = nullptr, *dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, x.nbytes()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, (*ref)[0].nbytes()), cudaSuccess);
    cudaMemcpy(dx, x.raw(), x.nbytes(), cudaMemcpyHostToDevice);
    cudaStream_t s;
    cudaStreamCreate(&s);
    ASSERT_TRUE((*ctx)->set_input_shape("x", {3, 8, 10, 10}).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("x", dx).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("y", dy).ok());
    auto shape = (*ctx)->tensor_shape("y");
    ASSERT_TRUE(shape.ok());
    EXPECT_EQ(*shape, (std::vector<int64_t>{3, 8, 10, 10}));
    for (bool graph : {false, true, true}) {  // the second graph run replays the captured graph
      ASSERT_TRUE((*ctx)->set_use_cuda_graph(graph).ok());
      cudaMemset(dy, 0xff, (*ref)[0].nbytes());  // poison: NaN where nothing writes
      Status st = (*ctx)->enqueue(s);
      ASSERT_TRUE(st.ok()) << st.message();
      cudaStreamSynchronize(s);
      Tensor y(DataType::kFloat32, (*ref)[0].shape());
      cudaMemcpy(y.raw(), dy, y.nbytes(), cudaMemcpyDeviceToHost);
      EXPECT_LT(rel_l2(y, (*ref)[0]), 1e-6) << "graph " << graph << " fp16 " << fp16;
    }
    cudaStreamDestroy(s);
    cudaFree(dx);
    cudaFree(dy);
  }
}

// With CUDA graphs, a context keeps a graph per set of addresses (as a caller that allocates its
// outputs afresh each call alternates between a few) and per shape; each replay writes where
// that call asked, for that call's input, on the context's stream or the legacy default stream.
TEST(CudaEngine, CudaGraphsFollowAddressesAndShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = build(true);
  ASSERT_TRUE(e);
  auto ctx = e->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  const Tensor xa = random({3, 8, 10, 10}, 11), xb = random({5, 8, 10, 10}, 12);
  auto ra = (*ctx)->execute({{"x", xa}});
  auto rb = (*ctx)->execute({{"x", xb}});
  ASSERT_TRUE(ra.ok() && rb.ok());
  const size_t out_bytes = (*rb)[0].nbytes();
  std::vector<void*> in(2), out(6);
  for (void*& p : in) ASSERT_EQ(cudaMalloc(&p, xb.nbytes()), cudaSuccess);
  for (void*& p : out) ASSERT_EQ(cudaMalloc(&p, out_bytes), cudaSuccess);
  cudaMemcpy(in[0], xa.raw(), xa.nbytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(in[1], xb.raw(), xb.nbytes(), cudaMemcpyHostToDevice);
  ASSERT_TRUE((*ctx)->set_use_cuda_graph(true).ok());
  // (input, output): outputs alternating, more of them than graphs kept, and a second shape
  const std::pair<int, int> calls[] = {{0, 0}, {0, 1}, {0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4},
                                       {0, 5}, {0, 0}, {1, 1}, {0, 2}, {1, 1}, {0, 2}, {0, 0}};
  int step = 0;
  for (auto [i, o] : calls) {
    const Tensor& ref = (*(i == 0 ? ra : rb))[0];
    ASSERT_TRUE((*ctx)->set_input_shape("x", ref.shape()).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("x", in[i]).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("y", out[o]).ok());
    cudaMemset(out[o], 0xff, out_bytes);  // poison: NaN where nothing writes
    // the context's own stream, or the legacy default stream (PyTorch's default), which kiln
    // fences with events around its own stream
    Status st = (*ctx)->enqueue(step % 2 ? cudaStreamLegacy : nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor y(DataType::kFloat32, ref.shape());
    cudaMemcpy(y.raw(), out[o], y.nbytes(), cudaMemcpyDeviceToHost);
    EXPECT_LT(rel_l2(y, ref), 1e-6) << "call " << step << ": input " << i << ", output " << o;
    ++step;
  }
  for (void* p : in) cudaFree(p);
  for (void* p : out) cudaFree(p);
}

// Sets an environment variable for a scope (a context reads KILN_GRAPH_SHAPES when it is made).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

// CUDA graphs are on by default and captured only for addresses that repeat a recent call's: a
// caller whose outputs are new at every call runs layer by layer (no capture per call), one that
// comes back to an address set gets a graph, and set_use_cuda_graph(false) never captures. With
// KILN_GRAPH_SHAPES=1 (kiln 0.2's rule) shapes that alternate call by call capture nothing. Every
// call writes where it was asked, for its own input.
TEST(CudaEngine, DefaultGraphsCaptureRepeatedAddressesOnly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = build(true);
  ASSERT_TRUE(e);
  ScopedEnv one_shape("KILN_GRAPH_SHAPES", "1");
  auto ctx = e->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  const Tensor xa = random({3, 8, 10, 10}, 21), xb = random({3, 8, 10, 10}, 22);
  auto ra = (*ctx)->execute({{"x", xa}});
  auto rb = (*ctx)->execute({{"x", xb}});
  ASSERT_TRUE(ra.ok() && rb.ok());
  // execute() stages through the context's own buffers: the second call repeated the first's
  EXPECT_EQ((*ctx)->cuda_graph_count(), 1u);
  const size_t out_bytes = (*ra)[0].nbytes();
  std::vector<void*> in(2), out(8);
  for (void*& p : in) ASSERT_EQ(cudaMalloc(&p, xa.nbytes()), cudaSuccess);
  for (void*& p : out) ASSERT_EQ(cudaMalloc(&p, out_bytes), cudaSuccess);
  cudaMemcpy(in[0], xa.raw(), xa.nbytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(in[1], xb.raw(), xb.nbytes(), cudaMemcpyHostToDevice);
  auto call = [&](int i, int o) {
    ASSERT_TRUE((*ctx)->set_input_shape("x", xa.shape()).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("x", in[i]).ok());
    ASSERT_TRUE((*ctx)->set_tensor_address("y", out[o]).ok());
    cudaMemset(out[o], 0xff, out_bytes);  // poison: NaN where nothing writes
    Status st = (*ctx)->enqueue(nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor y(DataType::kFloat32, xa.shape());
    cudaMemcpy(y.raw(), out[o], y.nbytes(), cudaMemcpyDeviceToHost);
    EXPECT_LT(rel_l2(y, (*(i == 0 ? ra : rb))[0]), 1e-6) << "input " << i << ", output " << o;
  };
  for (int o = 0; o < 6; ++o) call(o % 2, o);  // new outputs every call: no capture
  EXPECT_EQ((*ctx)->cuda_graph_count(), 1u);
  call(0, 6), call(1, 7), call(0, 6), call(1, 7), call(1, 6);  // two repeat, one more is new
  EXPECT_EQ((*ctx)->cuda_graph_count(), 3u);
  call(0, 6), call(1, 7), call(1, 6);  // two replays; the third repeats now and is captured
  EXPECT_EQ((*ctx)->cuda_graph_count(), 4u);
  // shapes that alternate call by call: the layers are configured again for each, so the graphs
  // are stale and each call runs layer by layer (no capture per call)
  const Tensor xc = random({5, 8, 10, 10}, 23);
  auto rc = (*ctx)->execute({{"x", xc}});
  ASSERT_TRUE(rc.ok());
  const size_t held = (*ctx)->cuda_graph_count();  // 0 if the arena grew for batch 5: graphs go
  for (int k = 0; k < 3; ++k) {
    call(0, 6);
    auto again = (*ctx)->execute({{"x", xc}});
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(rel_l2((*again)[0], (*rc)[0]), 0.0);
  }
  EXPECT_EQ((*ctx)->cuda_graph_count(), held);
  ASSERT_TRUE((*ctx)->set_use_cuda_graph(false).ok());
  for (int k = 0; k < 3; ++k) call(0, 0), call(1, 1);
  EXPECT_EQ((*ctx)->cuda_graph_count(), held);
  for (void* p : in) cudaFree(p);
  for (void* p : out) cudaFree(p);
}

// By default a context keeps the graphs of several shapes (KILN_GRAPH_SHAPES, 8): calls whose
// batch alternates between sizes, as a server's batches do, replay each size's graph once its
// addresses repeat, and every replay computes its own input's answer. Past the limit the least
// recently replayed shape's graphs go, and the answers stay right.
TEST(CudaEngine, GraphsOfSeveralShapesAreKept) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = build(true);
  ASSERT_TRUE(e);
  for (const char* limit : {"", "2"}) {
    ScopedEnv env("KILN_GRAPH_SHAPES", limit);
    auto ctx = e->create_context();
    ASSERT_TRUE(ctx.ok()) << ctx.status().message();
    const int64_t batches[] = {8, 3, 5, 1};
    std::vector<Tensor> xs, refs;
    for (int64_t b : batches) {
      xs.push_back(random({b, 8, 10, 10}, 40 + b));
      ASSERT_TRUE((*ctx)->set_use_cuda_graph(false).ok());
      auto r = (*ctx)->execute({{"x", xs.back()}});
      ASSERT_TRUE(r.ok()) << r.status().message();
      refs.push_back((*r)[0]);
    }
    ASSERT_TRUE((*ctx)->set_use_cuda_graph(true).ok());
    // one input and one output buffer per shape, as a server's staging buffers are
    std::vector<void*> in(4), out(4);
    for (size_t k = 0; k < 4; ++k) {
      ASSERT_EQ(cudaMalloc(&in[k], xs[k].nbytes()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&out[k], refs[k].nbytes()), cudaSuccess);
      cudaMemcpy(in[k], xs[k].raw(), xs[k].nbytes(), cudaMemcpyHostToDevice);
    }
    const size_t shapes = limit[0] ? 2 : 4;  // how many of the four may hold graphs
    for (int round = 0; round < 5; ++round) {
      for (size_t k = 0; k < shapes; ++k) {
        ASSERT_TRUE((*ctx)->set_input_shape("x", xs[k].shape()).ok());
        ASSERT_TRUE((*ctx)->set_tensor_address("x", in[k]).ok());
        ASSERT_TRUE((*ctx)->set_tensor_address("y", out[k]).ok());
        cudaMemset(out[k], 0xff, refs[k].nbytes());  // poison: NaN where nothing writes
        Status st = (*ctx)->enqueue(round % 2 ? cudaStreamLegacy : nullptr);
        ASSERT_TRUE(st.ok()) << st.message();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        Tensor y(DataType::kFloat32, refs[k].shape());
        cudaMemcpy(y.raw(), out[k], y.nbytes(), cudaMemcpyDeviceToHost);
        EXPECT_LT(rel_l2(y, refs[k]), 1e-6) << "limit '" << limit << "', round " << round
                                            << ", batch " << batches[k];
      }
      // rounds 0 and 1 run each shape layer by layer and then capture it; later rounds replay
      if (round >= 1) {
        EXPECT_EQ((*ctx)->cuda_graph_count(), shapes) << "limit '" << limit << "'";
      }
    }
    if (limit[0]) {
      // a third shape: its capture drops the least recently replayed shape's graphs, and every
      // answer stays right (the limit-2 context alternates three shapes)
      for (int round = 0; round < 4; ++round)
        for (size_t k = 0; k < 3; ++k) {
          ASSERT_TRUE((*ctx)->set_input_shape("x", xs[k].shape()).ok());
          ASSERT_TRUE((*ctx)->set_tensor_address("x", in[k]).ok());
          ASSERT_TRUE((*ctx)->set_tensor_address("y", out[k]).ok());
          cudaMemset(out[k], 0xff, refs[k].nbytes());
          ASSERT_TRUE((*ctx)->enqueue(nullptr).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          Tensor y(DataType::kFloat32, refs[k].shape());
          cudaMemcpy(y.raw(), out[k], y.nbytes(), cudaMemcpyDeviceToHost);
          EXPECT_LT(rel_l2(y, refs[k]), 1e-6) << "three shapes, round " << round << ", batch "
                                              << batches[k];
          EXPECT_LE((*ctx)->cuda_graph_count(), 2u);
        }
    }
    for (void* p : in) cudaFree(p);
    for (void* p : out) cudaFree(p);
  }
}

// A dynamic engine is tuned at its opt shapes and at its minimum batch (plan "points"); a layer
// whose tactic differs at the second point runs it for shapes nearer that point, as a Layer of
// its own. Here every layer gets an alternate (its own tactic again: a tactic timed at other
// formats could not stand in) so that both sets of layers run, shapes alternating, with and
// without CUDA graphs, and each inference agrees with the CPU.
TEST(CudaEngine, TuningPointAlternatesRunAndAgree) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = build(true);
  ASSERT_TRUE(e);
  nlohmann::json plan = nlohmann::json::parse(e->backend_plan_json());
  ASSERT_TRUE(plan.contains("points"));
  EXPECT_EQ(plan["points"], nlohmann::json::parse("[[[4,8,10,10]],[[1,8,10,10]]]"));
  int given = 0;
  for (auto& r : plan["layers"]) {
    if (r["tactic"] == "host") continue;
    r["alternates"] = {{{"point", 1}, {"tactic", r["tactic"]}, {"variant", r["variant"]},
                        {"time_ms", -1}}};
    ++given;
  }
  ASSERT_GT(given, 0);
  BuildConfig pc;
  pc.min_shapes = {{"x", {1, 8, 10, 10}}};
  pc.opt_shapes = {{"x", {4, 8, 10, 10}}};
  pc.max_shapes = {{"x", {8, 8, 10, 10}}};
  auto profile = Profile::from_config(e->graph(), pc);
  ASSERT_TRUE(profile.ok()) << profile.status().message();
  auto state = gpu::load_cuda_engine(e->graph(), plan, *profile);
  ASSERT_TRUE(state.ok()) << state.status().message();
  auto ctx = (*state)->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  BuildConfig cc;
  cc.backend = "cpu";
  auto cpu = Engine::build_from_graph(small_net(), cc, "small_net");
  ASSERT_TRUE(cpu.ok());
  auto cctx = (*cpu)->create_context();
  ASSERT_TRUE(cctx.ok());
  int step = 0;
  for (bool graphs : {false, true}) {
    ASSERT_TRUE((*ctx)->set_use_cuda_graph(graphs).ok());
    for (int64_t n : {1, 4, 1, 2, 8, 1}) {
      const Tensor x = random({n, 8, 10, 10}, 40 + step);
      auto got = (*ctx)->execute({{"x", x}});
      auto ref = (*cctx)->execute({{"x", x}});
      ASSERT_TRUE(got.ok()) << got.status().message();
      ASSERT_TRUE(ref.ok());
      EXPECT_LT(rel_l2((*got)[0], (*ref)[0]), 1e-2) << "batch " << n << ", graphs " << graphs;
      ++step;
    }
  }
}

// Programmatic dependent launch (kernels/pdl.cuh) lets a layer's kernel start while the one
// before it finishes; each such kernel waits for its predecessor before touching memory. A
// chain of residual LayerNorms in FP16 (each reading the last one's output, the arena reusing
// buffers) must give the same bits with it (the default on sm_90) as without it (KILN_PDL=0),
// layer by layer and replayed as a CUDA graph: a kernel that read or wrote before its wait
// would race its predecessor and differ.
TEST(CudaEngine, ProgrammaticLaunchChainMatchesPlainLaunch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  constexpr int64_t kRows = 8192, kCols = 768;
  constexpr int kLayers = 24;
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {kRows, kCols}));
  g->add_input(x);
  Value* h = x;
  for (int i = 0; i < kLayers; ++i) {
    Node* add = g->add_node("Add", fmt::format("add{}", i), {h, x}, {fmt::format("s{}", i)});
    Value* gamma = g->add_constant(fmt::format("gamma{}", i), random({kCols}, 200 + i, 2.f));
    Value* beta = g->add_constant(fmt::format("beta{}", i), random({kCols}, 300 + i, 1.f));
    Node* ln = g->add_node("LayerNormalization", fmt::format("ln{}", i),
                           {add->output(0), gamma, beta}, {fmt::format("h{}", i)});
    ln->attrs.set("axis", Attribute::Int(-1));
    h = ln->output(0);
  }
  g->add_output(h);
  ASSERT_TRUE(infer_shapes(*g).ok());
  BuildConfig c;
  c.backend = "cuda";
  c.fp16 = true;
  auto e = Engine::build_from_graph(std::move(g), c, "ln_chain");
  ASSERT_TRUE(e.ok()) << e.status().message();
  const Tensor in = random({kRows, kCols}, 11);
  std::vector<Tensor> outs;
  for (const char* pdl : {"1", "0"}) {
    setenv("KILN_PDL", pdl, 1);
    auto ctx = (*e)->create_context();
    unsetenv("KILN_PDL");
    ASSERT_TRUE(ctx.ok()) << ctx.status().message();
    for (int rep = 0; rep < 4; ++rep) {  // the first run layer by layer, then graph replays
      auto r = (*ctx)->execute({{"x", in}});
      ASSERT_TRUE(r.ok()) << r.status().message();
      outs.push_back((*r)[0]);
    }
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    ASSERT_EQ(outs[i].nbytes(), outs[0].nbytes());
    EXPECT_EQ(std::memcmp(outs[i].raw(), outs[0].raw(), outs[0].nbytes()), 0)
        << "run " << i % 4 << (i < 4 ? " with" : " without") << " programmatic launch";
  }
}

// x [N, 8, 16] -> MatMul by a constant [16, 37] -> Flatten -> y [N, 296]. With FP16 inputs and
// outputs (--input-io-formats / --output-io-formats fp16) an FP16 engine launches one kernel, the
// GEMM: the build's Casts are stored alike on both sides and the GEMM writes straight into the
// caller's output buffer through the Flatten and the Cast (plan.h, written_through_outputs). Its
// output agrees with the float32-output engine's, layer by layer and as graph replays. N = 37
// makes rows that are not 16-byte multiples: matmul.cublaslt multiplies at N padded and packs the
// rows into the output (copy_padded_rows, float16 to float16 here, float16 to float32 there).
TEST(CudaEngine, Fp16OutputsAreWrittenByTheLastKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto net = [] {
    auto g = std::make_unique<Graph>();
    Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 8, 16}));
    g->add_input(x);
    Value* w = g->add_constant("w", random({16, 37}, 21, 0.5f));
    Node* mm = g->add_node("MatMul", "mm", {x, w}, {"p"});
    Node* fl = g->add_node("Flatten", "flat", {mm->output(0)}, {"y"});
    fl->attrs.set("axis", Attribute::Int(1));
    g->add_output(fl->output(0));
    EXPECT_TRUE(infer_shapes(*g).ok());
    return g;
  };
  auto build_net = [&](bool fp16_io) {
    BuildConfig c;
    c.backend = "cuda";
    c.fp16 = true;
    c.shapes = {{"x", {4, 8, 16}}};
    if (fp16_io) c.input_io_formats = c.output_io_formats = {"fp16"};
    return Engine::build_from_graph(net(), c, "mm_flatten");
  };
  auto half_io = build_net(true);
  auto float_io = build_net(false);
  ASSERT_TRUE(half_io.ok()) << half_io.status().message();
  ASSERT_TRUE(float_io.ok()) << float_io.status().message();
  EXPECT_EQ((*half_io)->outputs()[0].name, "y");
  EXPECT_EQ((*half_io)->outputs()[0].dtype, DataType::kFloat16);
  const auto plan = nlohmann::json::parse((*half_io)->backend_plan_json());
  EXPECT_EQ(plan["kernel_layers"].get<int>(), 1) << plan.dump(1);

  Tensor x32 = random({4, 8, 16}, 22);  // float16 values, as float32 for the reference
  Tensor x16(DataType::kFloat16, {4, 8, 16});
  for (int64_t i = 0; i < x32.numel(); ++i) {
    x16.data<uint16_t>()[i] = float_to_half(x32.data<float>()[i]);
    x32.data<float>()[i] = half_to_float(x16.data<uint16_t>()[i]);
  }
  auto ref_ctx = (*float_io)->create_context();
  ASSERT_TRUE(ref_ctx.ok()) << ref_ctx.status().message();
  auto ref = (*ref_ctx)->execute({{"x", x32}});
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  auto ctx = (*half_io)->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  for (int rep = 0; rep < 3; ++rep) {  // the first run layer by layer, then graph replays
    auto r = (*ctx)->execute({{"x", x16}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ((*r)[0].dtype(), DataType::kFloat16);
    ASSERT_EQ((*r)[0].numel(), (*ref)[0].numel());
    Tensor wide(DataType::kFloat32, {4, 296});
    for (int64_t i = 0; i < wide.numel(); ++i)
      wide.data<float>()[i] = half_to_float((*r)[0].data<uint16_t>()[i]);
    EXPECT_LT(rel_l2(wide, (*ref)[0]), 1e-3) << "run " << rep;
  }
}

// ConvNeXt's block: a depthwise convolution (NHWC), permute to channels-last, LayerNorm over
// the channels, a Linear, permute back, a residual (here the convolution's output, stored NHWC
// as a block's input is). In an FP16 engine both permutes relabel
// the NHWC memory (movement.transpose_relabel) and no Reformat or Transpose kernel runs
// between the convolution and the LayerNorm; the result matches the CPU reference.
TEST(CudaEngine, ChannelsLastPermutesRelabelNhwcMemory) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto net = [] {
    auto g = std::make_unique<Graph>();
    Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 16, 9, 11}));
    g->add_input(x);
    Node* dw = g->add_node("Conv", "dw", {x, g->add_constant("wd", random({16, 1, 7, 7}, 31, 0.2f)),
                                         g->add_constant("bd", random({16}, 32, 0.1f))}, {"d"});
    dw->attrs.set("group", Attribute::Int(16));
    dw->attrs.set("pads", Attribute::Ints({3, 3, 3, 3}));
    Node* t1 = g->add_node("Transpose", "to_last", {dw->output(0)}, {"dl"});
    t1->attrs.set("perm", Attribute::Ints({0, 2, 3, 1}));
    Node* ln = g->add_node("LayerNormalization", "ln",
                           {t1->output(0), g->add_constant("g", random({16}, 33, 1.f)),
                            g->add_constant("b", random({16}, 34, 0.1f))}, {"n"});
    ln->attrs.set("axis", Attribute::Int(-1));
    Node* mm = g->add_node("MatMul", "fc", {ln->output(0), g->add_constant("wf", random({16, 16}, 35, 0.3f))},
                           {"f"});
    Node* t2 = g->add_node("Transpose", "to_first", {mm->output(0)}, {"fc_first"});
    t2->attrs.set("perm", Attribute::Ints({0, 3, 1, 2}));
    Node* add = g->add_node("Add", "res", {t2->output(0), dw->output(0)}, {"y"});
    g->add_output(add->output(0));
    EXPECT_TRUE(infer_shapes(*g).ok());
    return g;
  };
  BuildConfig c;
  c.backend = "cuda";
  c.fp16 = true;
  // NHWC layers throughout (a block's input is NHWC in a network; here it is the graph input,
  // where for so small a tensor a row-major convolution may time faster).
  c.layout = "nhwc";
  c.shapes = {{"x", {3, 16, 9, 11}}};
  auto e = Engine::build_from_graph(net(), c, "convnext_block");
  ASSERT_TRUE(e.ok()) << e.status().message();
  const auto plan = nlohmann::json::parse((*e)->backend_plan_json());
  int relabels = 0, transposes = 0;
  for (const auto& l : plan["layers"]) {
    const std::string t = l.value("tactic", "");
    relabels += t == "movement.transpose_relabel";
    transposes += t == "movement.transpose";
  }
  EXPECT_EQ(relabels, 2) << plan.dump(1);
  EXPECT_EQ(transposes, 0) << plan.dump(1);
  BuildConfig cc;
  cc.backend = "cpu";
  cc.shapes = c.shapes;
  auto cpu = Engine::build_from_graph(net(), cc, "convnext_block");
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  const Tensor x = random({3, 16, 9, 11}, 36);
  auto cctx = (*cpu)->create_context();
  auto gctx = (*e)->create_context();
  ASSERT_TRUE(cctx.ok() && gctx.ok());
  auto want = (*cctx)->execute({{"x", x}});
  ASSERT_TRUE(want.ok()) << want.status().message();
  for (int rep = 0; rep < 3; ++rep) {  // layer by layer, then graph replays
    auto got = (*gctx)->execute({{"x", x}});
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_LT(rel_l2((*got)[0], (*want)[0]), 1e-2) << "run " << rep;
  }
}

TEST(CudaEngine, SaveLoadAndBadShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = build(true);
  ASSERT_TRUE(e);
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_cuda_engine.kiln").string();
  ASSERT_TRUE(e->save(path).ok());
  auto loaded = Engine::load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ((*loaded)->backend_plan_json(), e->backend_plan_json());
  auto ctx = (*loaded)->create_context();
  ASSERT_TRUE(ctx.ok());
  const Tensor x = random({2, 8, 10, 10}, 9);
  auto a = (*ctx)->execute({{"x", x}});
  auto ctx2 = e->create_context();
  auto b = (*ctx2)->execute({{"x", x}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(rel_l2((*a)[0], (*b)[0]), 0.0);
  auto big = (*ctx)->execute({{"x", random({9, 8, 10, 10}, 1)}});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("outside the engine's profile"), std::string::npos)
      << big.status().message();
  auto wrong = (*ctx)->execute({{"x", random({2, 7, 10, 10}, 1)}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_FALSE((*ctx)->set_input_shape("nope", {1}).ok());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Inputs whose values decide shapes (TensorRT's shape tensors): y = ReduceSum(Reshape(x, s), axes)
// with s and axes given as model inputs. Their values are read on the host; each new value plans
// a new instance; execute() and the device path (device or host addresses) agree with the CPU.
std::unique_ptr<Graph> shape_tensor_net() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, 3, 4}));
  Value* s = g->add_value("s", TensorType(DataType::kInt64, {2}));
  Value* axes = g->add_value("axes", TensorType(DataType::kInt64, {1}));
  for (Value* v : {x, s, axes}) g->add_input(v);
  Node* r = g->add_node("Reshape", "reshape", {x, s}, {"r"});
  Node* sum = g->add_node("ReduceSum", "sum", {r->output(0), axes}, {"y"});
  sum->attrs.set("keepdims", Attribute::Int(0));
  g->add_output(sum->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

TEST(CudaEngine, ShapeTensorInputs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  BuildConfig c;
  c.backend = "cuda";
  c.tf32 = false;
  auto e = Engine::build_from_graph(shape_tensor_net(), c, "shape_tensor_net");
  ASSERT_TRUE(e.ok()) << e.status().message();
  BuildConfig cc;
  cc.backend = "cpu";
  auto cpu = Engine::build_from_graph(shape_tensor_net(), cc, "shape_tensor_net");
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  auto ctx = e.value()->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  auto cctx = cpu.value()->create_context();
  ASSERT_TRUE(cctx.ok());
  const Tensor x = random({2, 3, 4}, 9);
  for (auto [shape, axis] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
           {{6, 4}, 0}, {{3, 8}, 1}, {{6, 4}, 1}, {{24, 1}, 0}}) {
    std::map<std::string, Tensor> in = {{"x", x},
                                        {"s", Tensor::from<int64_t>({2}, shape)},
                                        {"axes", Tensor::from<int64_t>({1}, {axis})}};
    auto got = ctx.value()->execute(in);
    ASSERT_TRUE(got.ok()) << got.status().message();
    auto want = cctx.value()->execute(in);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(got.value()[0].shape(), want.value()[0].shape());
    EXPECT_LT(rel_l2(got.value()[0], want.value()[0]), 1e-6);
  }
  // The device path: x in device memory, the shape tensors in device memory too.
  void *dx = nullptr, *ds = nullptr, *da = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.nbytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&da, 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, 64), cudaSuccess);
  const int64_t sv[2] = {4, 6}, av[1] = {1};
  cudaMemcpy(dx, x.raw(), x.nbytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(ds, sv, 16, cudaMemcpyHostToDevice);
  cudaMemcpy(da, av, 8, cudaMemcpyHostToDevice);
  auto& cx = *ctx.value();
  ASSERT_TRUE(cx.set_tensor_address("x", dx).ok());
  ASSERT_TRUE(cx.set_tensor_address("s", ds).ok());
  ASSERT_TRUE(cx.set_tensor_address("axes", da).ok());
  auto ys = cx.tensor_shape("y");
  ASSERT_TRUE(ys.ok()) << ys.status().message();
  EXPECT_EQ(ys.value(), (std::vector<int64_t>{4}));
  ASSERT_TRUE(cx.set_tensor_address("y", dy).ok());
  ASSERT_TRUE(cx.enqueue(nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  float y[4];
  cudaMemcpy(y, dy, sizeof(y), cudaMemcpyDeviceToHost);
  for (int i = 0; i < 4; ++i) {
    double want = 0;
    for (int j = 0; j < 6; ++j) want += x.data<float>()[i * 6 + j];
    EXPECT_NEAR(y[i], want, 1e-5);
  }
  for (void* p : {dx, ds, da, dy}) cudaFree(p);
}

// An engine with a dynamic region (NonZero) profiles each layer too: kiln bench --dump-profile.
TEST(CudaEngine, DynamicRegionProfilesEachLayer) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto g = std::make_unique<Graph>();
  // Large enough to run on the GPU (a handful of values would be computed on the host).
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {64, 256}));
  g->add_input(x);
  Node* relu = g->add_node("Relu", "relu", {x}, {"r"});
  Node* nz = g->add_node("NonZero", "nz", {relu->output(0)}, {"idx"});
  g->add_output(nz->output(0));
  ASSERT_TRUE(infer_shapes(*g).ok());
  BuildConfig c;
  c.backend = "cuda";
  auto e = Engine::build_from_graph(std::move(g), c, "nonzero_net");
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto ctx = e.value()->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  std::vector<LayerTiming> t;
  const Tensor in = random({64, 256}, 3);
  auto got = ctx.value()->execute({{"x", in}}, &t);
  ASSERT_TRUE(got.ok()) << got.status().message();
  int64_t positive = 0;
  for (int64_t i = 0; i < in.numel(); ++i) positive += in.data<float>()[i] > 0;
  EXPECT_EQ(got.value()[0].shape(), (std::vector<int64_t>{2, positive}));
  std::set<std::string> names;
  for (const auto& l : t) {
    names.insert(l.name);
    EXPECT_GE(l.ms, 0.0) << l.name;
    // The host's part of each layer's time is measured, and is a part of it.
    EXPECT_GE(l.host_ms, 0.0) << l.name;
    EXPECT_LE(l.host_ms, l.ms) << l.name;
  }
  EXPECT_TRUE(names.count("relu") && names.count("nz")) << fmt::format("{}", fmt::join(names, ", "));
}

// small_net, then NonZero of its output: the convolutions are the dynamic region's prefix.
std::unique_ptr<Graph> prefix_net() {
  auto g = small_net();
  Value* y = g->outputs()[0];
  Node* nz = g->add_node("NonZero", "nz", {y}, {"idx"});
  g->add_output(nz->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

// The prefix replays as a CUDA graph per input shape (first run layer by layer, second captured,
// later ones replayed) and gives bit for bit what layer-by-layer runs give, for new data at
// every run and shapes that alternate.
TEST(CudaEngine, DynamicRegionPrefixReplaysAsAGraph) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  BuildConfig c;
  c.backend = "cuda";
  c.tf32 = false;
  c.min_shapes = {{"x", {2, 8, 10, 10}}};
  c.opt_shapes = {{"x", {4, 8, 10, 10}}};
  c.max_shapes = {{"x", {8, 8, 10, 10}}};
  auto e = Engine::build_from_graph(prefix_net(), c, "prefix_net");
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto plain = e.value()->create_context();
  auto graphs = e.value()->create_context();
  ASSERT_TRUE(plain.ok() && graphs.ok());
  ASSERT_TRUE(plain.value()->set_use_cuda_graph(false).ok());
  for (int run = 0; run < 8; ++run) {
    const int64_t n = run % 2 ? 2 : 4;
    std::map<std::string, Tensor> in = {{"x", random({n, 8, 10, 10}, 100 + run)}};
    auto want = plain.value()->execute(in);
    auto got = graphs.value()->execute(in);
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_TRUE(got.ok()) << got.status().message();
    for (size_t o = 0; o < 2; ++o) {
      ASSERT_EQ(got.value()[o].shape(), want.value()[o].shape()) << "run " << run << " output " << o;
      EXPECT_EQ(std::memcmp(got.value()[o].raw(), want.value()[o].raw(), got.value()[o].nbytes()), 0)
          << "run " << run << " output " << o;
    }
  }
  EXPECT_EQ(plain.value()->cuda_graph_count(), 0u);
  EXPECT_EQ(graphs.value()->cuda_graph_count(), 2u);  // one capture per input shape
}

}  // namespace
}  // namespace kiln
