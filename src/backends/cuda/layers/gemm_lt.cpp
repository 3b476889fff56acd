// kiln.FusedGemm and MatMul by a constant 2-D weight through cuBLASLt, with the epilogue fused
// into the GEMM: the bias, ReLU or tanh-GELU (cuBLASLt's BIAS, RELU_BIAS, GELU_BIAS), and the
// residual as C with beta = 1: Y = act(A W + bias + R). The rows of A (every leading dim) are
// the GEMM's M, so a transformer's [B, S, K] activations need no reshape.
//
// Row-major Y [M, N] = A [M, K] W [K, N] is, in cuBLASLt's column-major terms, D [N, M] =
// W' [N, K] A' [K, M] with W' and A' the same memory (W [N, K] for Gemm's transB: op T). The
// bias runs along D's rows (N). Variants are ranks in cuBLASLt's heuristic list ("h0".."h7"),
// taken at each shape of a profile: the tuner times them at the opt shape. An FP16 product that
// is a float32 graph output (a language model's logits) can write float32 itself (kF32Out).
// N that is not a multiple of 16 bytes (GPT-2's tied LM head: 50257 logits a row) leaves
// cuBLASLt's fast kernels out (5x slower on an H100, whatever the strides), so such a GEMM by a
// constant weight runs at N padded: the layer keeps its own copy of W as [N', K] (op T), rows N..
// N' zero, made once on the GPU; the product lands in the workspace as [M, N'], and a copy packs
// its first N columns into the output (widening float16 to float32 for kF32Out). Without a bias
// or residual (those have N elements), and where the padded product fits the workspace limit.
// From 1024 rows (batch 32 of GPT-2 at sequence 128: 823 MB of float32 logits) an FP16 product
// runs as row groups instead: rows r = j, j + G, ... (G = 4 for float32 rows of odd N, 8 for
// float16) start at the same offset modulo 16 bytes, so each group is one cuBLASLt product with
// 16-byte rows (ld G N) written in place from its row's first 16-byte boundary over a multiple
// of 8 columns, and gemm_edge_columns (gemm.cu) computes the few columns left at each end. W (the
// same [N', K] copy) is read G times; the padded product's write, read and copy are saved.
#include <cublasLt.h>

#include <algorithm>

#include "device_util_host.h"
#include "layers/gemm_common.h"
#include "layers/movement_copy.h"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {
namespace {

constexpr int kRanks =
    8;  // small-M problems (batch 1) often take a split-K algorithm far down the list
constexpr size_t kMaxWorkspace = size_t(32) << 20;

// Which epilogue the layer's activation needs; false when cuBLASLt has none (erf GELU, ...).
bool lt_epilogue(const Node& n, bool bias, cublasLtEpilogue_t* e) {
  const std::string act = n.attrs.get_string("activation", "");
  if (act.empty())
    *e = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  else if (act == "Relu")
    *e = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  else if (act == "Gelu" && n.attrs.get_string("act_approximate", "none") == "tanh")
    *e = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  else
    return false;
  return true;
}

bool is_gemm_base(const Node& n) {
  return n.op_type == "FusedGemm" && n.attrs.get_string("base", "") == "Gemm";
}

bool lt_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  const DataType t = d.in.empty() ? DataType::kUndefined : d.in[0].dtype;
  const bool f16 = t == DataType::kFloat16 && d.precision == Precision::kFP16;
  const bool f32 = t == DataType::kFloat32 &&
                   (d.precision == Precision::kTF32 || d.precision == Precision::kFP32);
  if (!f16 && !f32) return *why = "float16 (FP16) or float32 (TF32, FP32) only", false;
  const Tensor* w = d.in_const(1);
  if (!w || w->rank() != 2) return *why = "the weight is not a constant 2-D matrix", false;
  if (d.in_type(0).rank() < 2) return *why = "A must have rank >= 2", false;
  for (size_t i = 1; i < d.in.size(); ++i)
    if (d.in[i].present() && d.in[i].dtype != t) return *why = "inputs differ in type", false;
  // A float32 output of float16 inputs (kF32Out): D in float32, without a bias or residual
  // (those share D's type in cuBLASLt).
  if (!d.out.empty() && d.out[0].dtype != t &&
      (!f16 || d.out[0].dtype != DataType::kFloat32 || n.input(2) || n.input(3)))
    return *why = "a float32 output only for a float16 product without bias or residual", false;
  if (n.op_type == "FusedGemm") {
    const std::string base = n.attrs.get_string("base", "");
    if (base != "MatMul" && base != "Gemm") return *why = "unknown base", false;
    if (base == "Gemm" &&
        (n.attrs.get_int("transA", 0) != 0 || n.attrs.get_float("alpha", 1.f) != 1.f ||
         (n.input(2) && n.attrs.get_float("beta", 1.f) != 1.f) || d.in_type(0).rank() != 2))
      return *why = "Gemm with transA, alpha or beta", false;
    const bool tb = base == "Gemm" && n.attrs.get_int("transB", 0) != 0;
    const int64_t N = w->dim(tb ? 0 : 1);
    if (const Tensor* c = d.in_const(2); n.input(2) && (!c || c->numel() != N))
      return *why = "C is not a constant bias of N values", false;
    cublasLtEpilogue_t e;
    if (!lt_epilogue(n, n.input(2) != nullptr, &e))
      return *why = "no cuBLASLt epilogue for activation " + n.attrs.get_string("activation", ""),
             false;
  }
  return true;
}

std::vector<std::string> lt_variants(const LayerDesc&) {
  std::vector<std::string> v;
  for (int r = 0; r < kRanks; ++r) v.push_back(fmt::format("h{}", r));
  return v;
}

struct LtHandles {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  void reset() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (auto l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
    *this = LtHandles{};
  }
};

// One cuBLASLt product of the layer: Y rows (or, with row groups, every G-th row from a_row) of
// `n` columns from `d_col`, W's columns from d_col too.
struct LtPart {
  LtHandles lt;
  cublasLtMatmulHeuristicResult_t algo{};
  int64_t a_row = 0, d_col = 0;
};

class GemmLtLayer final : public Layer {
 public:
  explicit GemmLtLayer(const LayerDesc& d)
      : node_(d.node),
        precision_(d.precision),
        rank_(std::max(0, std::atoi(d.variant.c_str() + (d.variant.empty() ? 0 : 1)))) {}
  ~GemmLtLayer() override { reset(); }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor &a = in[0], &w = in[1], &y = out[0];
    bool tb = is_gemm_base(n) && n.attrs.get_int("transB", 0) != 0;
    K_ = a.shape.back();
    N_ = w.shape[tb ? 0 : 1];
    if (w.shape[tb ? 1 : 0] != K_)
      return KILN_ERROR("{}: A {} and W {} do not chain", n.label(), shape_str(a.shape),
                        shape_str(w.shape));
    M_ = K_ == 0 ? 0 : a.numel() / K_;
    std::vector<int64_t> want(a.shape.begin(), a.shape.end() - 1);
    want.push_back(N_);
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} differs from {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    bias_ = n.op_type == "FusedGemm" && in.size() > 2 && in[2].present();
    residual_ = in.size() > 3 && in[3].present();
    if (residual_ && in[3].shape != y.shape)
      return KILN_ERROR("{}: the residual {} must have the output's shape {}", n.label(),
                        shape_str(in[3].shape), shape_str(y.shape));
    for (int64_t v : {M_, N_, K_})
      if (v > INT32_MAX)
        return KILN_ERROR("{}: a dimension of {} is beyond cuBLASLt's sizes", n.label(), v);
    reset();
    if (M_ == 0 || N_ == 0 || K_ == 0) return size_t{0};
    const bool f16 = a.dtype == DataType::kFloat16;
    const int64_t io_size = f16 ? 2 : 4, pad_to = 16 / io_size;
    const int64_t y_size = y.dtype == DataType::kFloat32 ? 4 : io_size;
    Np_ = N_;
    pad_bytes_ = 0;
    if (N_ % pad_to != 0 && K_ % pad_to == 0 && w.host && !bias_ && !residual_) {
      const int64_t np = (N_ + pad_to - 1) / pad_to * pad_to;
      const size_t bytes = (size_t(M_ * np * io_size) + 255) / 256 * 256;
      // Row groups (f16, many rows): G = 16 / gcd(16, N * y_size) interleaved products whose
      // rows all start 16-byte aligned, each from its own first column; W is read G times, the
      // padded product's write, read and copy are saved.
      if (f16 && M_ >= kRowGroupMinRows)
        edges_ = plan_row_groups(N_, y_size);
      else if (bytes + kMaxWorkspace <= rc.workspace_limit)
        Np_ = np, pad_bytes_ = bytes;
      if (edges_.groups || pad_bytes_) {
        void* before = wt_.get();
        KILN_RETURN_IF_ERROR(
            wt_.reserve(size_t(np * K_ * io_size), n.label() + ": transposed weight"));
        if (wt_.get() != before) wt_ready_ = false;
        // Element (n, k) of the copy is W[k, n] ([K, N]), or W[n, k] with transB ([N, K]).
        KILN_ASSIGN_OR_RETURN(wt_plan_,
                              movement_detail::plan_copy({N_, K_}, tb ? std::vector<int64_t>{K_, 1}
                                                                      : std::vector<int64_t>{1, N_},
                                                         {K_, 1}, 0, 0, size_t(io_size)));
        tb = true;
      }
    }
    const size_t ws_limit = std::min(kMaxWorkspace, rc.workspace_limit - pad_bytes_);
    size_t ws = 0;
    if (const int64_t groups = edges_.groups) {
      for (int64_t j = 0; j < groups && j < M_; ++j) {
        // The product takes row j's columns [c, c + cols), gemm_edge_columns the rest.
        const int64_t c = edges_.first[j], cols = edges_.end[j] - c;
        const int64_t rows = (M_ - j + groups - 1) / groups;
        if (cols == 0) continue;
        LtPart& p = parts_.emplace_back();
        p.a_row = j, p.d_col = c;
        KILN_RETURN_IF_ERROR(make_part(rc, n, &p, f16, y.dtype, true, rows, cols,
                                       groups * K_, groups * N_, ws_limit));
        ws = std::max(ws, p.algo.workspaceSize);
      }
    } else {
      const bool wide = y.dtype == DataType::kFloat32 && !pad_bytes_;
      LtPart& p = parts_.emplace_back();
      KILN_RETURN_IF_ERROR(make_part(rc, n, &p, f16, wide ? DataType::kFloat32 : a.dtype, tb, M_,
                                     Np_, K_, Np_, ws_limit));
      ws = p.algo.workspaceSize;
    }
    return pad_bytes_ + ws;
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (M_ == 0 || N_ == 0) return Status::Ok();
    if (K_ == 0) {  // an empty sum, then the epilogue: not a cuBLASLt problem
      return KILN_ERROR("{}: the reduction is empty (K = 0)", node_->label());
    }
    for (const DeviceTensor* t : {&in[0], &out[0]})
      if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
        return KILN_ERROR("{}: cuBLASLt needs 16-byte aligned tensors", node_->label());
    if (bias_) {
      const void* b = in[2].data;
      KILN_RETURN_IF_ERROR(cublas_check(
          cublasLtMatmulDescSetAttribute(parts_[0].lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b,
                                         sizeof(b)),
          "cublasLtMatmulDescSetAttribute"));
    }
    const size_t esize = in[1].dtype == DataType::kFloat16 ? 2 : 4;
    const size_t ysize = out[0].dtype == DataType::kFloat32 ? 4 : esize;
    const void* w = in[1].data;
    if (pad_bytes_ || edges_.groups) {  // the first run of this context makes W's copy
      if (!wt_ready_) {  // rows past N stay zero
        KILN_CUDA_CHECK(cudaMemsetAsync(wt_.get(), 0, wt_.bytes(), rc.stream));
        KILN_RETURN_IF_ERROR(movement_detail::run_copy(wt_plan_, in[1].data, wt_.get(), rc.stream));
      }
      wt_ready_ = true;
      w = wt_.get();
    }
    const float alpha = 1.f, beta = residual_ ? 1.f : 0.f;
    // With padded rows, D is the start of the workspace and cuBLASLt's scratch follows it.
    void* y = pad_bytes_ ? rc.workspace : out[0].data;
    void* scratch = static_cast<char*>(rc.workspace) + pad_bytes_;
    const size_t scratch_bytes = rc.workspace_bytes - pad_bytes_;
    for (const LtPart& p : parts_) {
      const void* wp = static_cast<const char*>(w) + size_t(p.d_col * K_) * esize;
      const void* ap = static_cast<const char*>(in[0].data) + size_t(p.a_row * K_) * esize;
      void* d = static_cast<char*>(y) + size_t(p.a_row * N_ + p.d_col) * ysize;
      const void* c = residual_ ? in[3].data : d;
      KILN_RETURN_IF_ERROR(cublas_check(
          cublasLtMatmul(rc.cublaslt, p.lt.desc, &alpha, wp, p.lt.a, ap, p.lt.b, &beta, c,
                         p.lt.c, d, p.lt.d, &p.algo.algo, scratch, scratch_bytes, rc.stream),
          "cublasLtMatmul"));
    }
    if (edges_.groups)
      return gemm_edge_columns(in[0].data, w, K_, out[0].data, out[0].dtype, M_, N_, edges_,
                               rc.stream);
    if (!pad_bytes_) return Status::Ok();
    return copy_padded_rows(y, in[0].dtype, Np_, out[0].data, out[0].dtype, M_, N_, rc.stream);
  }

 private:
  // Rows of 4096 tokens and more (batch 32 at sequence 128) take the row groups.
  static constexpr int64_t kRowGroupMinRows = 1024;

  void reset() {
    for (LtPart& p : parts_) p.lt.reset();
    parts_.clear();
    edges_ = EdgeColumns{};
  }

  // The descriptor, layouts and algorithm of one product: D [rows, cols] (row-major, rows ldd
  // apart) = A [rows, K] (rows lda apart) W [K, cols] (or W^T with tb: W as [cols, K]).
  Status make_part(const RunContext& rc, const Node& n, LtPart* p, bool f16, DataType y_type,
                   bool tb, int64_t rows, int64_t cols, int64_t lda, int64_t ldd,
                   size_t ws_limit) {
    LtHandles& lt = p->lt;
    const cudaDataType_t io = f16 ? CUDA_R_16F : CUDA_R_32F;
    const cudaDataType_t yt = y_type == DataType::kFloat32 ? CUDA_R_32F : io;
    const cublasComputeType_t compute =
        f16 || precision_ == Precision::kFP32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
    KILN_RETURN_IF_ERROR(cublas_check(cublasLtMatmulDescCreate(&lt.desc, compute, CUDA_R_32F),
                                      "cublasLtMatmulDescCreate"));
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes) {
      return cublas_check(cublasLtMatmulDescSetAttribute(lt.desc, attr, v, bytes),
                          "cublasLtMatmulDescSetAttribute");
    };
    KILN_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    KILN_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
    if (n.op_type == "FusedGemm" && !lt_epilogue(n, bias_, &ep))
      return KILN_ERROR("{}: no cuBLASLt epilogue for its activation", n.label());
    KILN_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    if (bias_) KILN_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &io, sizeof(io)));
    // Column-major terms: D [cols, rows] = W' [cols, K] A' [K, rows].
    KILN_RETURN_IF_ERROR(cublas_check(
        cublasLtMatrixLayoutCreate(&lt.a, io, tb ? K_ : cols, tb ? cols : K_, tb ? K_ : Np_),
        "layout"));
    KILN_RETURN_IF_ERROR(
        cublas_check(cublasLtMatrixLayoutCreate(&lt.b, io, K_, rows, lda), "layout"));
    KILN_RETURN_IF_ERROR(
        cublas_check(cublasLtMatrixLayoutCreate(&lt.c, yt, cols, rows, ldd), "layout"));
    KILN_RETURN_IF_ERROR(
        cublas_check(cublasLtMatrixLayoutCreate(&lt.d, yt, cols, rows, ldd), "layout"));
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_RETURN_IF_ERROR(
        cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
    const uint32_t align = 16;  // the arena aligns to 256; a caller's input pointer to 16 at least
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_limit,
                                         sizeof(ws_limit));
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    cublasLtMatmulHeuristicResult_t res[kRanks];
    int got = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(rc.cublaslt, lt.desc, lt.a, lt.b,
                                                             lt.c, lt.d, pref, kRanks, res, &got);
    cublasLtMatmulPreferenceDestroy(pref);
    KILN_RETURN_IF_ERROR(cublas_check(hs, "cublasLtMatmulAlgoGetHeuristic"));
    if (got == 0) return KILN_ERROR("{}: cuBLASLt has no algorithm for this GEMM", n.label());
    // The variant's rank in this shape's list (a shorter list: its last entry).
    p->algo = res[std::min(rank_, got - 1)];
    return Status::Ok();
  }

  const Node* node_;
  Precision precision_;
  int rank_;
  int64_t M_ = 0, N_ = 0, K_ = 0;
  int64_t Np_ = 0;        // the GEMM's N: N, or N padded to 16 bytes
  size_t pad_bytes_ = 0;  // the padded product's share of the workspace (0: no padding)
  EdgeColumns edges_;     // row groups (groups 0: none) and the columns each product leaves out
  bool bias_ = false, residual_ = false;
  bool wt_ready_ = false;  // wt_ holds the weight as [N', K]
  DeviceMemory wt_;
  movement_detail::CopyPlan wt_plan_;
  std::vector<LtPart> parts_;
};

}  // namespace

EdgeColumns plan_row_groups(int64_t N, int64_t y_size) {
  EdgeColumns e;
  int64_t g = 1;
  while ((g * N * y_size) % 16 != 0) g *= 2;
  e.groups = static_cast<int>(g);
  const int64_t y_pad = 16 / y_size;
  for (int64_t j = 0; j < g; ++j) {
    // Row j starts at element j N: its first 16-byte boundary is column c.
    const int64_t c = (y_pad - (j * N) % y_pad) % y_pad;
    e.first[j] = std::min(c, N);
    e.end[j] = e.first[j] + std::max<int64_t>(N - c, 0) / 8 * 8;
  }
  return e;
}

bool gemm_lt_supports(const LayerDesc& d, std::string* why) { return lt_supports(d, why); }
std::vector<std::string> gemm_lt_variants(const LayerDesc& d) { return lt_variants(d); }
Expected<std::unique_ptr<Layer>> create_gemm_lt(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GemmLtLayer(d));
}

}  // namespace kiln::gpu
