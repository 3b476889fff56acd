// libFuzzer harness: bytes -> ONNX model -> `kiln build --backend cpu` (-O2: every pass of the
// optimizer on the graph) -> an execution context -> one inference, as a user's model travels.
// fuzz_onnx_import stops where the optimizer starts; this one feeds the passes, the CPU
// backend's planning and its kernels graphs no exporter writes. Every step must give a value or a
// Status with a message; a crash, a sanitizer report, a hang or an unbounded allocation is a bug,
// and so is an optimized engine whose outputs differ from those of the graph as imported (-O0:
// a pass that changed what the model computes).
//
// Bounds (a harness's, not kiln's): graphs of at most 64 nodes (subgraphs' counted) whose inputs
// and inferred values all have static shapes of at most 64 Ki elements, and whose Loops have
// constant trip counts, at most 1024 iterations nested ones together (a model may loop for as
// long as it says), are built and run; others stop after the import (fuzz_onnx_import's
// ground). Inputs hold small deterministic values (floats in [-2, 2], integers 0..2, so that
// indices stay in range as often as not).
// tests/fuzz/README.md says how to build and run it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/engine.h"
#include "fuzz_onnx_common.h"

namespace {
constexpr size_t kMaxNodes = 64;
constexpr int64_t kMaxTrips = 1024;

// The nodes of `g` and of its subgraphs, or kMaxNodes + 1 once over the bound or where a Loop's
// trip count is not a constant, or the iterations of nested Loops multiply past kMaxTrips.
size_t bounded_nodes(const kiln::Graph& g, int64_t trips = 1) {
  size_t n = g.nodes().size();
  for (const kiln::Node* node : g.nodes()) {
    int64_t inner = trips;
    if (node->op_type == "Loop") {
      const kiln::Value* m = node->input(0);
      if (!m || !m->is_constant() || m->constant->numel() != 1) return kMaxNodes + 1;
      const int64_t t = std::max<int64_t>(m->constant->at_int(0), 1);
      if (t > kMaxTrips / trips) return kMaxNodes + 1;
      inner = trips * t;
    }
    for (const kiln::Graph* sub : node->attrs.subgraphs()) {
      if (n > kMaxNodes) return kMaxNodes + 1;
      n += bounded_nodes(*sub, inner);
    }
  }
  return n;
}
constexpr int64_t kMaxElements = int64_t(1) << 16;

// The element count of a static type, or -1 where it is not static or over the bound.
int64_t bounded_numel(const kiln::TensorType& t) {
  const auto shape = t.static_shape();
  if (!shape) return -1;
  int64_t n = 1;
  for (int64_t d : *shape) {
    if (d > kMaxElements) return -1;
    n *= d;
    if (n > kMaxElements) return -1;
  }
  return n;
}

kiln::Tensor input_tensor(kiln::DataType dtype, const std::vector<int64_t>& shape) {
  kiln::Tensor t(dtype, shape);
  const int64_t n = t.numel();
  switch (dtype) {
    case kiln::DataType::kFloat32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(i % 9 - 4) * 0.5f;
      break;
    case kiln::DataType::kInt64:
      for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i % 3;
      break;
    case kiln::DataType::kInt32:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
      break;
    case kiln::DataType::kBool:
      for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(i % 2);
      break;
    default:  // other types: zeros (the constructor's)
      break;
  }
  return t;
}

// How far inputs got (KILN_FUZZ_STATS=1 prints them at exit).
struct Reach {
  long imported = 0, bounded = 0, ran = 0;
  ~Reach() {
    if (std::getenv("KILN_FUZZ_STATS"))
      std::fprintf(stdout, "fuzz_build: imported %ld, within bounds %ld, built and ran %ld\n",
                   imported, bounded, ran);
  }
} reach;

void check_message(const kiln::Status& s) {
  if (s.message().empty()) std::abort();  // an error says what is wrong
}

// Builds and runs the model at opt_level; nullopt where a step refused it (with a message).
std::optional<std::vector<kiln::Tensor>> build_and_run(std::unique_ptr<kiln::Graph> g, int opt_level,
                                                      const std::map<std::string, kiln::Tensor>& feeds) {
  kiln::BuildConfig config;
  config.backend = "cpu";
  config.opt_level = opt_level;
  auto engine = kiln::Engine::build_from_graph(std::move(g), config, "fuzz.onnx");
  if (!engine.ok()) return check_message(engine.status()), std::nullopt;
  auto ctx = (*engine)->create_context();
  if (!ctx.ok()) return check_message(ctx.status()), std::nullopt;
  auto out = (*ctx)->execute(feeds);
  if (!out.ok()) return check_message(out.status()), std::nullopt;
  return std::move(*out);
}

// The optimized engine must compute what the graph as imported (-O0) does: the same outputs'
// types and shapes, integers and booleans exactly, float32 elements within 1e-3 of the output's
// largest magnitude where both are finite (the passes reassociate sums). KILN_FUZZ_DIFF=0 leaves
// the comparison out.
void check_same(const std::vector<kiln::Tensor>& opt, const std::vector<kiln::Tensor>& ref) {
  auto fail = [](const char* what, size_t o) {
    std::fprintf(stdout, "fuzz_build: -O2 and -O0 differ at output %zu: %s\n", o, what);
    std::abort();
  };
  if (opt.size() != ref.size()) fail("output count", 0);
  for (size_t o = 0; o < ref.size(); ++o) {
    const kiln::Tensor &a = opt[o], &b = ref[o];
    if (a.dtype() != b.dtype()) fail("type", o);
    if (a.shape() != b.shape()) fail("shape", o);
    const int64_t n = b.numel();
    if (b.dtype() == kiln::DataType::kFloat32) {
      double scale = 1;
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(b.data<float>()[i])) scale = std::max(scale, std::fabs(double(b.data<float>()[i])));
      for (int64_t i = 0; i < n; ++i) {
        const double x = a.data<float>()[i], y = b.data<float>()[i];
        if (std::isfinite(x) && std::isfinite(y) && std::fabs(x - y) > 1e-3 * scale) fail("values", o);
      }
    } else if (kiln::dtype_is_integer(b.dtype()) || b.dtype() == kiln::DataType::kBool) {
      if (std::memcmp(a.raw(), b.raw(), b.nbytes()) != 0) fail("values", o);
    }
  }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::quiet_stderr();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = kiln::fuzz::import_fuzzed(data, size);
  if (!g.ok()) return 0;
  ++reach.imported;
  const kiln::Graph& graph = **g;
  if (bounded_nodes(graph) > kMaxNodes) return 0;
  for (const kiln::Value* v : graph.values())
    if (!v->is_constant() && bounded_numel(v->type) < 0) return 0;
  std::map<std::string, kiln::Tensor> feeds;
  for (const kiln::Value* in : graph.inputs())
    feeds[in->name] = input_tensor(in->type.dtype, *in->type.static_shape());
  ++reach.bounded;
  auto out = build_and_run(std::move(*g), 2, feeds);
  if (!out) return 0;
  ++reach.ran;
  static const bool diff = [] {
    const char* e = std::getenv("KILN_FUZZ_DIFF");
    return !e || std::string(e) != "0";
  }();
  if (!diff) return 0;
  auto g0 = kiln::fuzz::import_fuzzed(data, size);
  if (!g0.ok()) std::abort();  // it imported a moment ago
  auto ref = build_and_run(std::move(*g0), 0, feeds);
  if (ref) check_same(*out, *ref);
  return 0;
}
