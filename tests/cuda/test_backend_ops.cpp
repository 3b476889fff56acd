// test-backend-ops: every GPU tactic, op by op, against the CPU reference backend (float64).
// One test per (family, case, tactic, mode); a tactic that does not apply to a case skips with
// its reason, and without a GPU every test skips and says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <functional>
#include <random>

#include "backend_ops.h"
#include "backends/backend_info.h"
#include "backends/cpu/cpu_executor.h"
#include "core/npy.h"
#include "backends/cuda/layer.h"
#include "kiln/engine.h"
#include "ops/op.h"
#include "quant/int8.h"

namespace kiln::gpu::test {

CaseInput in(std::vector<int64_t> shape, DataType t, double lo, double hi) {
  CaseInput c;
  c.shape = std::move(shape);
  c.dtype = t;
  c.lo = lo;
  c.hi = hi;
  return c;
}
CaseInput konst(Tensor value) {
  CaseInput c;
  c.dtype = value.dtype();
  c.shape = value.shape();
  c.constant = true;
  c.value = std::move(value);
  return c;
}
CaseInput ints(std::vector<int64_t> values) {
  return konst(Tensor::from<int64_t>({static_cast<int64_t>(values.size())}, values));
}
CaseInput absent() {
  CaseInput c;
  c.absent = true;
  return c;
}
Attribute ints_attr(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }
Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}
OpCase make_case(std::string name, std::string op, Attributes a, std::vector<CaseInput> ins,
                 std::vector<std::string> modes, std::string domain) {
  OpCase c;
  c.name = std::move(name);
  c.op_type = std::move(op);
  c.domain = std::move(domain);
  c.attrs = std::move(a);
  c.inputs = std::move(ins);
  c.modes = std::move(modes);
  return c;
}

CaseInput fixed(std::vector<int64_t> shape, std::vector<double> values, DataType t) {
  CaseInput c = konst(Tensor::from<double>(std::move(shape), values).cast(t));
  c.constant = false;
  return c;
}

CaseInput konst_random(std::vector<int64_t> shape, double scale) {
  CaseInput c = in(std::move(shape), DataType::kFloat32, -scale, scale);
  c.constant = true;  // filled with fresh random values per run (no fixed value)
  return c;
}

namespace {

Tensor random_tensor(const CaseInput& c, std::mt19937_64& rng) {
  Tensor f(DataType::kFloat64, c.shape);
  std::uniform_real_distribution<double> u(c.lo, c.hi);
  for (int64_t i = 0; i < f.numel(); ++i) {
    double v = u(rng);
    if (c.dtype == DataType::kBool) v = (rng() & 1) ? 1 : 0;
    else if (!dtype_is_float(c.dtype)) v = std::round(v);
    else if (c.step > 0) v = std::round(v / c.step) * c.step;
    f.data<double>()[i] = v;
  }
  return f.cast(c.dtype);
}

// The relative L2 error of `got` against `ref`, and whether NaN/Inf positions agree.
std::string compare(const Tensor& got, const Tensor& ref, double tol) {
  if (got.shape() != ref.shape())
    return "shape " + got.desc() + " vs reference " + ref.desc();
  if (got.dtype() != ref.dtype()) return "type " + got.desc() + " vs reference " + ref.desc();
  if (dtype_is_low_bit(ref.dtype())) {  // float8/int4 bit patterns (NaN codes included)
    const auto* g = static_cast<const uint8_t*>(got.raw());
    const auto* r = static_cast<const uint8_t*>(ref.raw());
    for (int64_t i = 0; i < ref.numel(); ++i)
      if (g[i] != r[i]) return fmt::format("element {}: 0x{:02x} vs reference 0x{:02x}", i, g[i], r[i]);
    return "";
  }
  if (!dtype_is_float(ref.dtype())) {
    for (int64_t i = 0; i < ref.numel(); ++i)
      if (got.at_int(i) != ref.at_int(i))
        return fmt::format("element {}: {} vs reference {}", i, got.at_int(i), ref.at_int(i));
    return "";
  }
  double num = 0, den = 0, maxd = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = got.at_double(i), b = ref.at_double(i);
    if (std::isnan(b) || std::isinf(b)) {
      if (!(std::isnan(b) ? std::isnan(a) : a == b))
        return fmt::format("element {}: {} vs reference {}", i, a, b);
      continue;
    }
    if (!std::isfinite(a)) return fmt::format("element {}: {} vs reference {}", i, a, b);
    num += (a - b) * (a - b);
    den += b * b;
    maxd = std::max(maxd, std::fabs(a - b));
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (rel > tol) return fmt::format("relative L2 {:.3g} > {:.3g} (max abs diff {:.3g})", rel, tol, maxd);
  return "";
}

// An output stored as int8 codes of scale `sy`: every element within one code of the reference;
// the fraction that is off by one goes to `*off_by_one`.
std::string compare_codes(const Tensor& got, const Tensor& ref, float sy, double* off_by_one) {
  if (got.shape() != ref.shape()) return "shape " + got.desc() + " vs reference " + ref.desc();
  int64_t off = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double d = std::fabs(got.at_double(i) - ref.at_double(i)) / sy;
    if (d > 1.001 || std::isnan(d))
      return fmt::format("element {}: {} vs reference {} ({:.3g} codes apart)", i,
                         got.at_double(i), ref.at_double(i), d);
    if (d > 0.001) ++off;
  }
  *off_by_one = ref.numel() ? static_cast<double>(off) / ref.numel() : 0;
  return "";
}

double default_tol(const std::string& mode) {
  if (mode == "fp32" || mode == "int8") return 1e-5;
  if (mode == "tf32" || mode == "nhwc32" || mode == "int8fp16") return 1e-3;
  return 1e-2;
}

void run_case(const OpCase& c, const std::string& tactic, const std::string& mode) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU here (" << why << "): GPU test skipped";
  // A failure prints its seed; KILN_TEST_SEED=that seed replays the same inputs.
  std::random_device rd;
  const char* fixed_seed = std::getenv("KILN_TEST_SEED");
  char* end = nullptr;
  const uint64_t seed = fixed_seed ? std::strtoull(fixed_seed, &end, 10)
                                   : (static_cast<uint64_t>(rd()) << 32) ^ rd();
  ASSERT_TRUE(!fixed_seed || (end != fixed_seed && *end == '\0'))
      << "KILN_TEST_SEED is not a decimal seed: '" << fixed_seed << "'";
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(fmt::format("seed {}", seed));
  auto g = std::make_unique<Graph>();
  std::vector<Value*> ins;
  std::vector<Tensor> feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const CaseInput& ci = c.inputs[i];
    if (ci.absent) {
      ins.push_back(nullptr);
      continue;
    }
    Tensor t = ci.value ? *ci.value : random_tensor(ci, rng);
    const std::string name = "in" + std::to_string(i);
    if (ci.constant) {
      ins.push_back(g->add_constant(name, std::move(t)));
    } else {
      std::vector<Dim> dims(ci.shape.begin(), ci.shape.end());
      Value* v = g->add_value(name, TensorType(ci.dtype, dims));
      g->add_input(v);
      ins.push_back(v);
      feeds.push_back(std::move(t));
    }
  }
  std::vector<std::string> outs;
  for (int o = 0; o < c.num_outputs; ++o) outs.push_back("out" + std::to_string(o));
  Node* n = g->add_node(c.op_type, "node", ins, outs, c.domain);
  n->attrs = c.attrs;
  for (Value* v : n->outputs()) g->add_output(v);
  for (const auto& [slot, scales] : c.in_scales) {
    ins[static_cast<size_t>(slot)]->quant_scales = scales;
    if (scales.size() > 1) ins[static_cast<size_t>(slot)]->quant_axis = quant::weight_channel_axis(*n);
  }
  if (!c.out_scale.empty()) n->output(0)->quant_scales = c.out_scale;
  ASSERT_TRUE(infer_shapes(*g).ok()) << infer_shapes(*g).message();
  // The reference: the CPU backend in float64.
  auto cpu = CpuExecutor::create(*g, /*float64=*/true);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  auto ref = (*cpu)->run(feeds);
  ASSERT_TRUE(ref.ok()) << "cpu reference: " << ref.status().message();

  BuildConfig cfg;
  cfg.backend = "cuda";
  cfg.opt_level = 0;
  cfg.tune = false;
  cfg.force_tactic = tactic;
  cfg.tf32 = mode != "fp32";
  cfg.fp16 = mode == "fp16" || mode == "nhwc16" || mode == "int8fp16";
  cfg.layout = mode == "nhwc16" || mode == "nhwc32" ? "nhwc" : c.int8() ? "auto" : "linear";
  cfg.workspace_limit = c.workspace_limit;
  auto engine = Engine::build_from_graph(g->clone(), cfg, c.name);
  if (!engine.ok() && engine.status().message().find("cannot run on the GPU") != std::string::npos)
    GTEST_SKIP() << "not applicable: " << engine.status().message();
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  // Was the tactic under test really chosen for the node?
  const std::string plan = (*engine)->backend_plan_json();
  const size_t slash = tactic.find('/');  // NAME/VARIANT: that variant of the tactic
  if (plan.find("\"" + tactic.substr(0, slash) + "\"") == std::string::npos ||
      (slash != std::string::npos &&
       plan.find("\"variant\":\"" + tactic.substr(slash + 1) + "\"") == std::string::npos))
    GTEST_SKIP() << "not applicable: another tactic was chosen (" << plan.substr(0, 200) << ")";
  auto ctx = (*engine)->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  std::map<std::string, Tensor> named;
  for (size_t i = 0; i < feeds.size(); ++i) named[g->inputs()[i]->name] = feeds[i];
  auto got = (*ctx)->execute(named);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), ref->size());
  const double tol = c.tolerance > 0 ? c.tolerance : default_tol(mode);
  for (size_t o = 0; o < ref->size(); ++o) {
    double off = 0;
    const bool codes = o == 0 && !c.out_scale.empty();
    const std::string err = codes ? compare_codes((*got)[o], (*ref)[o], c.out_scale[0], &off)
                                  : compare((*got)[o], (*ref)[o], tol);
    EXPECT_TRUE(err.empty()) << "output " << o << ": " << err;
    // KILN_TEST_DUMP=DIR keeps a failing case's inputs, reference and result as .npy files.
    const char* dump = std::getenv("KILN_TEST_DUMP");
    if (!err.empty() && dump) {
      std::string flat = tactic;  // NAME/VARIANT: one file name
      std::replace(flat.begin(), flat.end(), '/', '_');
      const std::string base = fmt::format("{}/{}_{}_{}_", dump, c.name, flat, mode);
      for (size_t i = 0; i < feeds.size(); ++i)
        (void)write_npy(base + g->inputs()[i]->name + ".npy", feeds[i]);
      for (const Value* v : ins)
        if (v && v->is_constant()) (void)write_npy(base + v->name + ".npy", *v->constant);
      (void)write_npy(base + "ref" + std::to_string(o) + ".npy", (*ref)[o]);
      (void)write_npy(base + "got" + std::to_string(o) + ".npy", (*got)[o]);
    }
    if (codes) {
      std::cout << fmt::format("[ int8     ] {} {} {}: {:.4g}% of {} codes off by one\n", c.name,
                               tactic, mode, 100 * off, (*ref)[o].numel());
      // Tactics that do the reference's arithmetic in its order: a code may move only where an
      // activation function differs in its last bit. Reassociated ones (the libraries, kiln's
      // persistent pointwise and 3x3 kernels: kReassociated) fold 1/sy into the channel scale
      // and fuse multiply-adds: a few more move. int8fp16 rounds float residuals to float16 first
      // (~1%).
      const TacticDef* def = find_tactic(tactic.substr(0, slash));
      const bool own = def && !(def->caps & kReassociated);
      if (mode == "int8") {
        EXPECT_LE(off, own ? 1e-3 : 5e-3) << "more codes off by one than rounding explains";
      }
    }
  }
  // Run again on the same context: the result must not change (no state, no races).
  auto again = (*ctx)->execute(named);
  ASSERT_TRUE(again.ok()) << again.status().message();
  for (size_t o = 0; o < ref->size(); ++o)
    EXPECT_TRUE(compare((*again)[o], (*got)[o], 0.0).empty()) << "second run differs, output " << o;
}

class CaseTest : public ::testing::Test {
 public:
  CaseTest(OpCase c, std::string tactic, std::string mode)
      : c_(std::move(c)), tactic_(std::move(tactic)), mode_(std::move(mode)) {}
  void TestBody() override { run_case(c_, tactic_, mode_); }

 private:
  OpCase c_;
  std::string tactic_, mode_;
};

std::string clean(std::string s) {
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

}  // namespace

std::vector<OpCase> gemm_pool_cases();

void register_all() {
  // Every layer's workspace is scribbled over before it runs (both runs of a case): a tactic
  // that keeps state there between runs fails here, not in a model's second inference.
  setenv("KILN_POISON_WORKSPACE", "1", 0);
  const std::pair<const char*, std::function<std::vector<OpCase>()>> families[] = {
      {"elementwise", elementwise_cases}, {"movement", movement_cases},
      {"reduce", reduce_cases},           {"conv", conv_cases},
      {"gemm_pool", gemm_pool_cases},     {"types", types_cases},
      {"attention", attention_cases},     {"int8", int8_cases},
      {"transformer", transformer_cases}, {"rnn", rnn_cases}, {"sampling", sampling_cases},
      {"dynamic", dynamic_cases},
  };
  // Tactics whose variants are different kernels (tile shapes): each variant is a test of its own
  // (forced as NAME/VARIANT); an untuned build would only ever run the first.
  const std::map<std::string, std::vector<std::string>> kernel_variants = {
      {"conv_int8.pipelined", {"n128", "n64"}},
      {"conv_int8.pointwise", {"n128", "n64", "n128m64", "n64m64"}},
      {"conv_int8.pair", {"n128m64", "n64m64"}},
      {"kiln.convpool.s2d.int8", {"b3", "b2"}},
      {"cutlass_sm90.int8", {"0", "1", "2"}},
      {"cutlass_sm90_gemm.int8", {"0", "1", "2"}},
      {"cutlass_sm90_pconv.int8", {"0", "1", "2"}},
      {"fused_gemm.cublaslt", {"h0", "h1"}},
      {"matmul.cublaslt", {"h0", "h1"}},
      {"fused_gemm.cutlass_sm90", {"coop256x128", "pp128x128", "pp128x64", "coop128x192"}},
      {"gemm_int8.cutlass_sm90", {"coop256x128", "pp128x128", "pp128x64"}},
      {"mha.flash", {"", "rows128", "split", "w32"}},
      {"kiln.dwconv",
       {"", "strip4", "strip8", "stream4", "stream8", "tile8", "tile16", "tile8r2", "tile16r2"}},
      {"kiln.dwconv.fused",
       {"", "strip4", "strip8", "stream4", "stream8", "tile8", "tile16", "tile8r2", "tile16r2"}},
      {"kiln.dwconv.mean", {"tile8", "tile16", "tile8r2", "tile16r2"}},
      {"lstm.persistent", {"nb1", "nb2", "nb4"}},
      {"gru.persistent", {"nb1", "nb2", "nb4"}},
      {"rnn.persistent", {"nb1", "nb2", "nb4"}},
  };
  for (const auto& [family, fn] : families) {
    for (const OpCase& c : fn()) {
      for (const TacticDef* t : tactics_for(c.domain, c.op_type)) {
        // INT8 cases: INT8 tactics, and float ones that read int8 codes, only.
        if (c.int8() && !(t->caps & (kI8 | kQuantIn0))) continue;
        std::vector<std::string> forced = {std::string(t->name)};
        if (auto it = kernel_variants.find(forced[0]); it != kernel_variants.end()) {
          forced.clear();
          for (const std::string& v : it->second) forced.push_back(std::string(t->name) + "/" + v);
        }
        for (const std::string& tactic : forced)
          for (const std::string& mode : c.modes) {
            const std::string name = clean(c.name) + "/" + clean(tactic) + "/" + mode;
            ::testing::RegisterTest(family, name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                                    [=]() -> ::testing::Test* { return new CaseTest(c, tactic, mode); });
          }
      }
    }
  }
}

}  // namespace kiln::gpu::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  if (kiln::cuda_device_count(&why) == 0) {
    std::cout << "no CUDA GPU here (" << why << "): the backend-op tests are skipped\n";
    return 0;
  }
  kiln::gpu::test::register_all();
  return RUN_ALL_TESTS();
}
