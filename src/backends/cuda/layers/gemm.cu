// Gemm, MatMul and kiln.FusedGemm through cuBLAS (float types), with kiln's own tiled kernel for
// integer products (wrapping modulo 2^64 and truncated, as src/ops/gemm.cpp does) and a small
// epilogue kernel for C / bias and the fused activation. kiln.Attention is gemm_attention.cu.
//
// Row-major ONNX data and column-major cuBLAS: Y = op(A) op(B) is computed as
// Y^T = op(B)^T op(A)^T, i.e. cuBLAS sees B first, with m = N and n = M.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <limits>

#include "kernels/activation.cuh"
#include "kernels/device_util.cuh"
#include "layers/gemm_common.h"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

Status cublas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return KILN_ERROR("{} failed: {} ({})", what, cublasGetStatusName(s), cublasGetStatusString(s));
}

BatchedGemm plan_batched_gemm(const std::vector<int64_t>& a_batch,
                              const std::vector<int64_t>& b_batch,
                              const std::vector<int64_t>& batch, int64_t M, int64_t N, int64_t K,
                              bool ta, bool tb) {
  BatchedGemm g;
  g.ta = ta;
  g.tb = tb;
  g.M = M;
  g.N = N;
  g.K = K;
  if (batch.empty()) return g;
  const StridedIndex ia = broadcast_index(a_batch, batch), ib = broadcast_index(b_batch, batch);
  std::vector<int64_t> dims = batch;
  std::vector<std::vector<int64_t>> st(3);
  const auto ys = row_major_strides(batch);
  for (size_t d = 0; d < batch.size(); ++d) {
    st[0].push_back(ia.strides[d] * M * K);
    st[1].push_back(ib.strides[d] * K * N);
    st[2].push_back(ys[d] * M * N);
  }
  coalesce_dims(dims, st);
  const size_t r = dims.size();
  g.count = dims[r - 1];
  g.sa = st[0][r - 1];
  g.sb = st[1][r - 1];
  g.sy = st[2][r - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < r; ++d) outer *= dims[d];
  g.oa.assign(outer, 0);
  g.ob.assign(outer, 0);
  g.oy.assign(outer, 0);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o;
    for (int64_t d = static_cast<int64_t>(r) - 2; d >= 0; --d) {
      const int64_t c = rem % dims[d];
      rem /= dims[d];
      g.oa[o] += c * st[0][d];
      g.ob[o] += c * st[1][d];
      g.oy[o] += c * st[2][d];
    }
  }
  // B shared by the whole strided batch and A's rows contiguous across it: one tall GEMM.
  if (g.count > 1 && g.sb == 0 && !ta && g.sa == M * K && g.sy == M * N) {
    g.M = M * g.count;
    g.count = 1;
    g.sa = g.sy = 0;
  }
  return g;
}

Status check_gemm_dims(const BatchedGemm& g, const Node& n) {
  for (int64_t v : {g.M, g.N, g.K, g.count})
    if (v > INT_MAX)
      return KILN_ERROR("{}: a matrix dimension of {} is beyond cuBLAS's 32-bit sizes", n.label(), v);
  return Status::Ok();
}

namespace {

cudaDataType_t cuda_type(DataType t) {
  switch (t) {
    case DataType::kFloat64: return CUDA_R_64F;
    case DataType::kFloat16: return CUDA_R_16F;
    case DataType::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

}  // namespace

Status run_batched_gemm(const RunContext& rc, const BatchedGemm& g, DataType ab, DataType yt,
                        Precision p, double alpha, const void* A, const void* B, void* Y) {
  if (g.M == 0 || g.N == 0 || g.count == 0 || g.oy.empty()) return Status::Ok();
  const size_t es_ab = dtype_size(ab), es_y = dtype_size(yt);
  if (g.K == 0) {  // an empty sum: zeros (all-zero bits in every float type)
    const size_t bytes = g.oy.size() * static_cast<size_t>(g.count * g.M * g.N) * es_y;
    KILN_CUDA_CHECK(cudaMemsetAsync(Y, 0, bytes, rc.stream));
    return Status::Ok();
  }
  cudaStream_t bound = nullptr;
  KILN_RETURN_IF_ERROR(cublas_check(cublasGetStream(rc.cublas, &bound), "cublasGetStream"));
  if (bound != rc.stream)
    KILN_RETURN_IF_ERROR(cublas_check(cublasSetStream(rc.cublas, rc.stream), "cublasSetStream"));
  // The compute type says exactly what may be rounded; the handle's math mode must not add TF32.
  KILN_RETURN_IF_ERROR(
      cublas_check(cublasSetMathMode(rc.cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  const bool dbl = ab == DataType::kFloat64;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (dbl) compute = CUBLAS_COMPUTE_64F;
  else if (ab == DataType::kFloat32 && p == Precision::kTF32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  const float alpha_f = static_cast<float>(alpha), zero_f = 0.f;
  const double zero_d = 0.0;
  const void* pa = dbl ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* pz = dbl ? static_cast<const void*>(&zero_d) : &zero_f;
  const cublasOperation_t opa = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our B
  const cublasOperation_t opb = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(g.N), n = static_cast<int>(g.M), k = static_cast<int>(g.K);
  const int lda = static_cast<int>(g.tb ? g.K : g.N);
  const int ldb = static_cast<int>(g.ta ? g.M : g.K);
  const int ldc = static_cast<int>(g.N);
  const cudaDataType_t tab = cuda_type(ab), ty = cuda_type(yt);
  for (size_t o = 0; o < g.oy.size(); ++o) {
    const void* a = static_cast<const uint8_t*>(B) + g.ob[o] * es_ab;
    const void* b = static_cast<const uint8_t*>(A) + g.oa[o] * es_ab;
    void* c = static_cast<uint8_t*>(Y) + g.oy[o] * es_y;
    if (g.count == 1) {
      KILN_RETURN_IF_ERROR(cublas_check(
          cublasGemmEx(rc.cublas, opa, opb, m, n, k, pa, a, tab, lda, b, tab, ldb, pz, c, ty, ldc,
                       compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx"));
    } else {
      KILN_RETURN_IF_ERROR(cublas_check(
          cublasGemmStridedBatchedEx(rc.cublas, opa, opb, m, n, k, pa, a, tab, lda, g.sb, b, tab,
                                     ldb, g.sa, pz, c, ty, ldc, g.sy, static_cast<int>(g.count),
                                     compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx"));
    }
  }
  return Status::Ok();
}

namespace {

// --- integer products ---------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ uint64_t as_u64(T v) {
  if constexpr (std::is_signed_v<T>) return static_cast<uint64_t>(static_cast<int64_t>(v));
  else return static_cast<uint64_t>(v);
}

struct IntGemmParams {
  int64_t M = 0, N = 0, K = 0;
  int64_t a_rs = 0, a_cs = 0, b_rs = 0, b_cs = 0;  // A(i, k) = A[i*a_rs + k*a_cs], B(k, j) alike
  int64_t batch = 1;
  StridedIndex ba, bb;  // batch entry -> element offset of its A and B (Y: entry * M * N)
};

constexpr int kTile = 16;

// One 16x16 tile of Y per block iteration; products and sums wrap modulo 2^64, then truncate.
template <typename T>
__global__ void int_matmul_kernel(const T* __restrict__ A, const T* __restrict__ B,
                                  T* __restrict__ Y, IntGemmParams p) {
  __shared__ uint64_t As[kTile][kTile + 1], Bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tm = (p.M + kTile - 1) / kTile, tn = (p.N + kTile - 1) / kTile;
  const int64_t tiles = tm * tn * p.batch;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t b = t / (tm * tn), r = t % (tm * tn);
    const int64_t row = (r / tn) * kTile + ty, col = (r % tn) * kTile + tx;
    const T* Ab = A + p.ba.offset(b);
    const T* Bb = B + p.bb.offset(b);
    uint64_t acc = 0;
    for (int64_t k0 = 0; k0 < p.K; k0 += kTile) {
      const int64_t ka = k0 + tx, kb = k0 + ty;
      As[ty][tx] = row < p.M && ka < p.K ? as_u64(Ab[row * p.a_rs + ka * p.a_cs]) : 0;
      Bs[ty][tx] = kb < p.K && col < p.N ? as_u64(Bb[kb * p.b_rs + col * p.b_cs]) : 0;
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTile; ++kk) acc += As[ty][kk] * Bs[kk][tx];
      __syncthreads();
    }
    if (row < p.M && col < p.N) Y[b * p.M * p.N + row * p.N + col] = static_cast<T>(acc);
  }
}

// The reference's alpha/beta scaling of an integer: in double, NaN -> 0, saturated.
template <typename T>
__device__ __forceinline__ T scale_int(double f, T v) {
  const double d = f * static_cast<double>(v);
  if (isnan(d)) return T(0);
  if (d <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (d >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(d);
}

// Integer Gemm: y = alpha * y (+ beta * C broadcast), as gemm_typed in src/ops/gemm.cpp.
template <typename T>
__global__ void int_gemm_epilogue(T* __restrict__ y, int64_t n, const T* __restrict__ c,
                                  StridedIndex cix, float alpha, float beta) {
  KILN_GRID_STRIDE(i, n) {
    const T p = y[i];
    const T s = alpha == 1.f ? p : scale_int<T>(alpha, p);
    if (!c) {
      y[i] = s;
    } else {
      const T cv = c[cix.offset(i)];
      const T cb = beta == 1.f ? cv : scale_int<T>(beta, cv);
      y[i] = static_cast<T>(as_u64(s) + as_u64(cb));
    }
  }
}

// Float: y = act(y + beta * C broadcast + R), computed in float (double for float64).
template <typename T>
__global__ void gemm_epilogue(T* __restrict__ y, int64_t n, const T* __restrict__ c,
                              StridedIndex cix, float beta, const T* __restrict__ r, ActParams act) {
  using A = Compute<T>;
  KILN_GRID_STRIDE(i, n) {
    A v = load(y, i);
    if (c) v += static_cast<A>(beta) * static_cast<A>(load(c, cix.offset(i)));
    if (r) v += static_cast<A>(load(r, i));
    store(y, i, apply_act<A>(v, act));
  }
}

// --- the layer ------------------------------------------------------------------------------------

bool is_int_type(DataType t) {
  return t != DataType::kBool && t != DataType::kString && t != DataType::kUndefined &&
         !dtype_is_float(t);
}

bool base_is_gemm(const Node& n) {
  return n.op_type == "Gemm" || (n.op_type == "FusedGemm" && n.attrs.get_string("base", "") == "Gemm");
}

bool gemm_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  const DataType t = d.in[0].dtype;
  if (d.in.size() < 2 || d.in[1].dtype != t) return *why = "A and B differ in type", false;
  if (n.op_type == "FusedGemm") {
    const std::string base = n.attrs.get_string("base", "");
    if (base != "Gemm" && base != "MatMul") return *why = "unknown base '" + base + "'", false;
    ActParams a;
    if (!read_activation(n.attrs, &a)) return *why = "unknown activation", false;
    // As for cuDNN's convolutions (conv_layers.cpp): the epilogue kernel after cuBLAS is one
    // more pass, no faster than Swish's own layer after the best GEMM.
    if (a.act == Act::kSwish) return *why = "Swish runs in its own layer after cuBLAS", false;
    if (!dtype_is_float(t)) return *why = "float types only", false;
  }
  if (!dtype_is_float(t) && !is_int_type(t))
    return *why = "unsupported type " + std::string(dtype_name(t)), false;
  if (d.in.size() > 2 && d.in[2].dtype != DataType::kUndefined && d.in[2].dtype != t)
    return *why = "C differs in type", false;
  if (d.in.size() > 3 && d.in[3].dtype != DataType::kUndefined && d.in[3].dtype != t)
    return *why = "the residual differs in type", false;
  return true;
}

class GemmLayer final : public Layer {
 public:
  explicit GemmLayer(const LayerDesc& d)
      : node_(d.node), precision_(d.precision), gemm_(base_is_gemm(*d.node)) {
    if (d.node->op_type == "FusedGemm") read_activation(d.node->attrs, &act_);
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& a = in[0];
    const DeviceTensor& b = in[1];
    const DeviceTensor* c = in.size() > 2 && in[2].present() ? &in[2] : nullptr;
    const DeviceTensor& y = out[0];
    if (a.dtype != b.dtype || (c && c->dtype != a.dtype) || y.dtype != a.dtype)
      return KILN_ERROR("{}: input types differ", n.label());
    dtype_ = a.dtype;
    std::vector<int64_t> want, a_batch, b_batch, batch;
    int64_t M, N, K;
    bool ta = false, tb = false;
    alpha_ = 1.f;
    beta_ = 1.f;
    if (gemm_) {
      if (a.rank() != 2 || b.rank() != 2)
        return KILN_ERROR("{}: Gemm inputs must be 2-D (got {} and {})", n.label(),
                          shape_str(a.shape), shape_str(b.shape));
      ta = n.attrs.get_int("transA", 0) != 0;
      tb = n.attrs.get_int("transB", 0) != 0;
      alpha_ = n.attrs.get_float("alpha", 1.f);
      beta_ = n.attrs.get_float("beta", 1.f);
      M = a.shape[ta ? 1 : 0];
      K = a.shape[ta ? 0 : 1];
      N = b.shape[tb ? 0 : 1];
      if (b.shape[tb ? 1 : 0] != K)
        return KILN_ERROR("{}: inner dimensions differ: A {} vs B {}", n.label(),
                          shape_str(a.shape), shape_str(b.shape));
      want = {M, N};
      if (c && c->rank() > 2) return KILN_ERROR("{}: C has rank {} (at most 2)", n.label(), c->rank());
    } else {
      if (a.rank() < 1 || b.rank() < 1)
        return KILN_ERROR("{}: MatMul inputs must have rank >= 1", n.label());
      std::vector<int64_t> as = a.shape, bs = b.shape;
      const bool a1 = as.size() == 1, b1 = bs.size() == 1;
      if (a1) as.insert(as.begin(), 1);
      if (b1) bs.push_back(1);
      M = as[as.size() - 2];
      K = as.back();
      N = bs.back();
      if (bs[bs.size() - 2] != K)
        return KILN_ERROR("{}: inner dimensions differ: {} x {}", n.label(), shape_str(a.shape),
                          shape_str(b.shape));
      a_batch.assign(as.begin(), as.end() - 2);
      b_batch.assign(bs.begin(), bs.end() - 2);
      KILN_ASSIGN_OR_RETURN(batch, broadcast_shapes({a_batch, b_batch}, n));
      if (batch.size() > static_cast<size_t>(kMaxDims))
        return KILN_ERROR("{}: more than {} batch dims", n.label(), kMaxDims);
      want = batch;
      if (!a1) want.push_back(M);
      if (!b1) want.push_back(N);
    }
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} differs from {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    // C (Gemm: times beta) or the bias (FusedGemm on MatMul) broadcast unidirectionally to Y.
    has_c_ = c && beta_ != 0.f;
    if (c) {
      bool ok = c->rank() <= y.rank();
      for (int64_t d = 0; ok && d < c->rank(); ++d) {
        const int64_t cd = c->shape[c->rank() - 1 - d], yd = y.shape[y.rank() - 1 - d];
        ok = cd == 1 || cd == yd;
      }
      if (!ok)
        return KILN_ERROR("{}: C of shape {} cannot be broadcast to {}", n.label(),
                          shape_str(c->shape), shape_str(y.shape));
      const StridedIndex bi = broadcast_index(c->shape, y.shape);
      std::vector<int64_t> dims(bi.dims, bi.dims + bi.rank);
      std::vector<std::vector<int64_t>> st = {std::vector<int64_t>(bi.strides, bi.strides + bi.rank),
                                              row_major_strides(y.shape)};
      coalesce_dims(dims, st);
      cix_ = StridedIndex{};
      cix_.rank = static_cast<int>(dims.size());
      for (size_t d = 0; d < dims.size(); ++d) {
        cix_.dims[d] = dims[d];
        cix_.strides[d] = st[0][d];
      }
    }
    has_r_ = in.size() > 3 && in[3].present();
    if (has_r_ && (in[3].shape != y.shape || !dtype_is_float(dtype_)))
      return KILN_ERROR("{}: the residual {} must have the output's shape {} (float types only)",
                        n.label(), shape_str(in[3].shape), shape_str(y.shape));
    numel_ = y.numel();
    if (dtype_is_float(dtype_)) {
      plan_ = plan_batched_gemm(a_batch, b_batch, batch, M, N, K, ta, tb);
      KILN_RETURN_IF_ERROR(check_gemm_dims(plan_, n));
    } else {
      IntGemmParams p;
      p.M = M;
      p.N = N;
      p.K = K;
      p.a_rs = ta ? 1 : K;
      p.a_cs = ta ? M : 1;
      p.b_rs = tb ? 1 : N;
      p.b_cs = tb ? K : 1;
      p.batch = 1;
      for (int64_t v : batch) p.batch *= v;
      if (!batch.empty()) {
        p.ba = broadcast_index(a_batch, batch);
        p.bb = broadcast_index(b_batch, batch);
        for (int d = 0; d < p.ba.rank; ++d) {
          p.ba.strides[d] *= M * K;
          p.bb.strides[d] *= K * N;
        }
      }
      int_ = p;
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (numel_ == 0) return Status::Ok();
    const DeviceTensor& y = out[0];
    const void* c = has_c_ ? in[2].data : nullptr;
    if (dtype_is_float(dtype_)) {
      KILN_RETURN_IF_ERROR(run_batched_gemm(rc, plan_, dtype_, dtype_, precision_, alpha_,
                                            in[0].data, in[1].data, y.data));
      const void* r = has_r_ ? in[3].data : nullptr;
      if (!c && !r && act_.act == Act::kNone) return Status::Ok();
      dispatch_float(dtype_, [&](auto tag) {
        using T = decltype(tag);
        gemm_epilogue<T><<<grid_for(numel_), kBlock, 0, rc.stream>>>(
            static_cast<T*>(y.data), numel_, static_cast<const T*>(c), cix_, beta_,
            static_cast<const T*>(r), act_);
      });
      KILN_CUDA_LAUNCH_CHECK("gemm epilogue");
      return Status::Ok();
    }
    bool ok = dispatch_dtype(dtype_, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!is_float_v<T> && !std::is_same_v<T, bool>) {
        const int64_t tiles =
            (int_.M + kTile - 1) / kTile * ((int_.N + kTile - 1) / kTile) * int_.batch;
        const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, 65535 * 8));
        int_matmul_kernel<T><<<grid, dim3(kTile, kTile), 0, rc.stream>>>(
            static_cast<const T*>(in[0].data), static_cast<const T*>(in[1].data),
            static_cast<T*>(y.data), int_);
        if (gemm_ && (c || alpha_ != 1.f))
          int_gemm_epilogue<T><<<grid_for(numel_), kBlock, 0, rc.stream>>>(
              static_cast<T*>(y.data), numel_, static_cast<const T*>(c), cix_, alpha_, beta_);
      }
    });
    if (!ok || !is_int_type(dtype_))
      return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(dtype_));
    KILN_CUDA_LAUNCH_CHECK("integer matmul kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  Precision precision_;
  bool gemm_;
  ActParams act_;
  DataType dtype_ = DataType::kUndefined;
  float alpha_ = 1.f, beta_ = 1.f;
  bool has_c_ = false, has_r_ = false;
  StridedIndex cix_;
  int64_t numel_ = 0;
  BatchedGemm plan_;
  IntGemmParams int_;
};

Expected<std::unique_ptr<Layer>> create_gemm(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GemmLayer(d));
}

}  // namespace

// gemm_attention.cu
bool attention_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_attention(const LayerDesc& d);
// einsum.cu
bool einsum_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_einsum(const LayerDesc& d);
// conv_int8.cu: INT8 FusedGemm (int8 = 1) as a 1x1 convolution over the rows of X.
bool int8_conv_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_int8_conv(const LayerDesc& d);  // tensor cores
Expected<std::unique_ptr<Layer>> create_int8_conv_dp4a(const LayerDesc& d);
// attention_onnx.cu
bool attention_onnx_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_attention_onnx(const LayerDesc& d);
// gemm_lt.cpp
bool gemm_lt_supports(const LayerDesc& d, std::string* why);
std::vector<std::string> gemm_lt_variants(const LayerDesc& d);
Expected<std::unique_ptr<Layer>> create_gemm_lt(const LayerDesc& d);
#if KILN_HAVE_CUTLASS
// gemm_cutlass.cpp
bool gemm_cutlass_supports(const LayerDesc& d, std::string* why);
std::vector<std::string> gemm_cutlass_variants(const LayerDesc& d);
Expected<std::unique_ptr<Layer>> create_gemm_cutlass(const LayerDesc& d);
// gemm_int8_cutlass.cpp
bool gemm_int8_cutlass_supports(const LayerDesc& d, std::string* why);
std::vector<std::string> gemm_int8_cutlass_variants(const LayerDesc& d);
Expected<std::unique_ptr<Layer>> create_gemm_int8_cutlass(const LayerDesc& d);
#endif
// attention_mha.cu
bool mha_flash_supports(const LayerDesc& d, std::string* why);
std::vector<std::string> mha_flash_variants(const LayerDesc& d);
Expected<std::unique_ptr<Layer>> create_mha_flash(const LayerDesc& d);
bool mha_unfused_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_mha_unfused(const LayerDesc& d);
#if KILN_HAVE_CUDNN_FRONTEND
// attention_cudnn.cpp
bool mha_cudnn_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_mha_cudnn(const LayerDesc& d);
#endif

namespace {

template <typename S, typename D>
__device__ __forceinline__ D padded_rows_convert(S v) {
  if constexpr (std::is_same_v<S, __half> && std::is_same_v<D, float>)
    return __half2float(v);
  else
    return v;
}

// Each thread writes 16 bytes of a destination row at a time, from the row's first 16-byte
// boundary (rows of odd N start anywhere), reading the source element by element; the few
// columns before that boundary and after the last whole 16 bytes are written one by one.
template <typename S, typename D>
__global__ void padded_rows_kernel(const S* src, int64_t src_ld, D* dst, int64_t rows,
                                   int64_t cols) {
  constexpr int kV = 16 / sizeof(D);
  const int64_t t0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    D* drow = dst + r * cols;
    const S* srow = src + r * src_ld;
    const int64_t head = std::min<int64_t>(
        cols, static_cast<int64_t>((16 - (reinterpret_cast<uintptr_t>(drow) & 15)) & 15) /
                  static_cast<int64_t>(sizeof(D)));
    const int64_t chunks = (cols - head) / kV, tail = head + chunks * kV;
    for (int64_t k = t0; k < chunks; k += step) {
      const int64_t c = head + k * kV;
      alignas(16) D v[kV];
#pragma unroll
      for (int i = 0; i < kV; ++i) v[i] = padded_rows_convert<S, D>(srow[c + i]);
      *reinterpret_cast<uint4*>(drow + c) = *reinterpret_cast<const uint4*>(v);
    }
    for (int64_t k = t0; k < head + (cols - tail); k += step) {
      const int64_t c = k < head ? k : tail + (k - head);
      drow[c] = padded_rows_convert<S, D>(srow[c]);
    }
  }
}

}  // namespace

Status copy_padded_rows(const void* src, DataType st, int64_t src_ld, void* dst, DataType dt,
                        int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return Status::Ok();
  // 256 threads a block, each 16 bytes of a row at a time (4 to 8 columns).
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((cols + 1023) / 1024, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535))),
      block(256);
  if (st == DataType::kFloat16 && dt == DataType::kFloat32)
    padded_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(src), src_ld,
                                                   static_cast<float*>(dst), rows, cols);
  else if (st == DataType::kFloat16 && dt == DataType::kFloat16)
    padded_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(src), src_ld,
                                                   static_cast<__half*>(dst), rows, cols);
  else if (st == DataType::kFloat32 && dt == DataType::kFloat32)
    padded_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const float*>(src), src_ld,
                                                   static_cast<float*>(dst), rows, cols);
  else
    return KILN_ERROR("copy_padded_rows: {} to {} is not a supported copy", dtype_name(st),
                      dtype_name(dt));
  KILN_CUDA_LAUNCH_CHECK("padded rows copy");
  return Status::Ok();
}

namespace {

// A warp per row: each edge column's dot product, K split over the lanes in float16 pairs.
template <typename D>
__global__ void edge_columns_kernel(const __half* a, const __half* wt, int64_t K, D* y,
                                    int64_t M, int64_t N, EdgeColumns e) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= M) return;
  const int lane = threadIdx.x % 32, j = static_cast<int>(r % e.groups);
  const __half* ar = a + r * K;
  auto dot = [&](int64_t col) {
    const __half* wr = wt + col * K;
    float s = 0.f;
    for (int64_t k = 2 * lane; k < K; k += 64) {
      const float2 av = __half22float2(*reinterpret_cast<const __half2*>(ar + k));
      const float2 wv = __half22float2(*reinterpret_cast<const __half2*>(wr + k));
      s = fmaf(av.x, wv.x, fmaf(av.y, wv.y, s));
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
      if constexpr (std::is_same_v<D, float>)
        y[r * N + col] = s;
      else
        y[r * N + col] = __float2half(s);
    }
  };
  for (int64_t c = 0; c < e.first[j]; ++c) dot(c);
  for (int64_t c = e.end[j]; c < N; ++c) dot(c);
}

}  // namespace

Status gemm_edge_columns(const void* a, const void* wt, int64_t K, void* y, DataType yt,
                         int64_t M, int64_t N, const EdgeColumns& e, cudaStream_t stream) {
  if (M == 0 || e.groups <= 0) return Status::Ok();
  if (K % 2 != 0) return KILN_ERROR("gemm_edge_columns: K = {} is odd", K);
  const unsigned blocks = static_cast<unsigned>((M + 7) / 8);
  const auto* ah = static_cast<const __half*>(a);
  const auto* wh = static_cast<const __half*>(wt);
  if (yt == DataType::kFloat32)
    edge_columns_kernel<<<blocks, 256, 0, stream>>>(ah, wh, K, static_cast<float*>(y), M, N, e);
  else if (yt == DataType::kFloat16)
    edge_columns_kernel<<<blocks, 256, 0, stream>>>(ah, wh, K, static_cast<__half*>(y), M, N, e);
  else
    return KILN_ERROR("gemm_edge_columns: output type {}", dtype_name(yt));
  KILN_CUDA_LAUNCH_CHECK("edge columns");
  return Status::Ok();
}

namespace {

constexpr uint32_t kGemmCaps = kF32 | kF16 | kF64;

const TacticDef kGemmTactics[] = {
    {"", "Gemm", "gemm.cublas", kGemmCaps, 0, gemm_supports, create_gemm},
    {"", "MatMul", "matmul.cublas", kGemmCaps, 0, gemm_supports, create_gemm},
    {"kiln", "FusedGemm", "fused_gemm.cublas", kGemmCaps, 0, gemm_supports, create_gemm},
    {"kiln", "FusedGemm", "fused_gemm.cublaslt", kF32 | kF16 | kF32Out, 0, gemm_lt_supports,
     create_gemm_lt, gemm_lt_variants},
    {"", "MatMul", "matmul.cublaslt", kF32 | kF16 | kF32Out, 0, gemm_lt_supports, create_gemm_lt,
     gemm_lt_variants},
#if KILN_HAVE_CUTLASS
    {"kiln", "FusedGemm", "fused_gemm.cutlass_sm90", kF16, 0, gemm_cutlass_supports,
     create_gemm_cutlass, gemm_cutlass_variants},
    {"kiln", "FusedGemm", "gemm_int8.cutlass_sm90", kI8 | kF16 | kReassociated, 0,
     gemm_int8_cutlass_supports, create_gemm_int8_cutlass, gemm_int8_cutlass_variants},
#endif
    {"kiln", "FusedGemm", "gemm_int8", kI8 | kF32 | kF16, 0, int8_conv_supports, create_int8_conv},
    {"kiln", "FusedGemm", "gemm_int8.dp4a", kI8 | kF32 | kF16, 0, int8_conv_supports,
     create_int8_conv_dp4a},
    {"kiln", "Attention", "attention.cublas", kGemmCaps, 0, attention_supports, create_attention},
    {"kiln", "MultiHeadAttention", "mha.flash", kF16, 0, mha_flash_supports, create_mha_flash,
     mha_flash_variants},
#if KILN_HAVE_CUDNN_FRONTEND
    {"kiln", "MultiHeadAttention", "mha.cudnn", kF16, 0, mha_cudnn_supports, create_mha_cudnn},
#endif
    {"kiln", "MultiHeadAttention", "mha.unfused", kGemmCaps, 0, mha_unfused_supports,
     create_mha_unfused},
    {"", "Einsum", "einsum.generic", kF32 | kF16 | kF64, 0, einsum_supports, create_einsum},
    {"", "Attention", "attention_onnx.direct", kGemmCaps, 0, attention_onnx_supports,
     create_attention_onnx},
};

}  // namespace

std::span<const TacticDef> gemm_tactics() { return kGemmTactics; }

}  // namespace kiln::gpu
