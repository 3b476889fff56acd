// Gemm and MatMul: inference and CPU reference kernels, plus the shared float GEMM (gemm.h).
#include "ops/gemm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "ops/conv_util.h"
#include "ops/op.h"

namespace kiln {

// --- the shared float GEMM ----------------------------------------------------------------------

template <typename T>
void gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          const T* B, T beta, T* C) {
  if (M <= 0 || N <= 0) return;
  const int64_t MN = M * N;
  // Accumulate op(A)*op(B) into acc, then combine with alpha/beta.
  const bool direct = alpha == T(1) && beta == T(0);
  std::vector<T> acc_buf;
  T* acc = C;
  if (direct) {
    std::fill(C, C + MN, T(0));
  } else {
    acc_buf.assign(static_cast<size_t>(MN), T(0));
    acc = acc_buf.data();
  }
  std::vector<T> bt;
  if (transB && K > 0) {  // B is N x K: make it K x N so that the inner loop is contiguous
    bt.resize(static_cast<size_t>(K * N));
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) bt[k * N + j] = B[j * K + k];
    B = bt.data();
  }
  constexpr int64_t kKB = 256, kJB = 512;  // a kKB x kJB block of B stays in cache
  for (int64_t k0 = 0; k0 < K; k0 += kKB) {
    const int64_t k1 = std::min(K, k0 + kKB);
    for (int64_t j0 = 0; j0 < N; j0 += kJB) {
      const int64_t jn = std::min(N, j0 + kJB) - j0;
      auto a_at = [&](int64_t i, int64_t k) { return transA ? A[k * M + i] : A[i * K + k]; };
      int64_t i = 0;
      for (; i + 4 <= M; i += 4) {  // four rows of C share each load of B
        T* __restrict c0 = acc + i * N + j0;
        T* __restrict c1 = c0 + N;
        T* __restrict c2 = c1 + N;
        T* __restrict c3 = c2 + N;
        for (int64_t k = k0; k < k1; ++k) {
          const T a0 = a_at(i, k), a1 = a_at(i + 1, k), a2 = a_at(i + 2, k), a3 = a_at(i + 3, k);
          const T* __restrict b = B + k * N + j0;
          for (int64_t j = 0; j < jn; ++j) {
            const T bj = b[j];
            c0[j] += a0 * bj;
            c1[j] += a1 * bj;
            c2[j] += a2 * bj;
            c3[j] += a3 * bj;
          }
        }
      }
      for (; i < M; ++i) {
        T* __restrict c = acc + i * N + j0;
        for (int64_t k = k0; k < k1; ++k) {
          const T a = a_at(i, k);
          const T* __restrict b = B + k * N + j0;
          for (int64_t j = 0; j < jn; ++j) c[j] += a * b[j];
        }
      }
    }
  }
  if (direct) return;
  for (int64_t i = 0; i < MN; ++i)
    C[i] = beta == T(0) ? alpha * acc[i] : alpha * acc[i] + beta * C[i];
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                          const float*, float, float*);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                           const double*, double, double*);

namespace {

// --- integer matrix products (wrap around modulo 2^bits, like the hardware) ---------------------

template <typename T>
uint64_t as_u64(T v) {
  return static_cast<uint64_t>(static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(v));
}

// C(MxN) = op(A) * op(B) with integer wrap-around; C values as uint64 (to be truncated to T).
template <typename T>
void int_matmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const T* A,
                const T* B, std::vector<uint64_t>& acc) {
  acc.assign(static_cast<size_t>(M * N), 0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const uint64_t a = as_u64(transA ? A[k * M + i] : A[i * K + k]);
      for (int64_t j = 0; j < N; ++j)
        acc[i * N + j] += a * as_u64(transB ? B[j * K + k] : B[k * N + j]);
    }
}

// alpha/beta scaling of an integer: computed in double, NaN -> 0, saturated to T's range (a plain
// cast of an out-of-range double would be undefined behaviour).
template <typename T>
T scale_int(double f, T v) {
  const double d = f * static_cast<double>(v);
  if (std::isnan(d)) return T(0);
  if (d <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (d >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(d);
}

bool is_16bit_float(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

Status check_numeric(const Node& n, DataType t, const char* what) {
  if (t == DataType::kBool || !dtype_is_supported(t) || t == DataType::kString)
    return KILN_ERROR("{}: unsupported {} type {}", n.label(), what, dtype_name(t));
  return Status::Ok();
}

}  // namespace

Expected<std::vector<Dim>> matmul_out_dims(const Node& n, std::vector<Dim> ad,
                                           std::vector<Dim> bd) {
  const bool a1 = ad.size() == 1, b1 = bd.size() == 1;
  if (a1) ad.insert(ad.begin(), Dim(1));
  if (b1) bd.push_back(Dim(1));
  const Dim& ka = ad[ad.size() - 1];
  const Dim& kb = bd[bd.size() - 2];
  if (ka.is_static() && kb.is_static() && ka.value != kb.value)
    return KILN_ERROR("{}: inner dimensions differ ({} vs {})", n.label(), ka.value, kb.value);
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out,
                        broadcast_dims({std::vector<Dim>(ad.begin(), ad.end() - 2),
                                        std::vector<Dim>(bd.begin(), bd.end() - 2)},
                                       n));
  if (!a1) out.push_back(ad[ad.size() - 2]);
  if (!b1) out.push_back(bd.back());
  return out;
}

namespace {

// --- MatMul -------------------------------------------------------------------------------------

Status infer_matmul(InferContext& ctx) {
  const TensorType& a = ctx.input_type(0);
  const TensorType& b = ctx.input_type(1);
  if (a.has_rank() && b.has_rank() && a.dtype != DataType::kUndefined &&
      b.dtype != DataType::kUndefined && a.dtype != b.dtype)
    return KILN_ERROR("{}: input types differ ({} vs {})", ctx.node().label(),
                      dtype_name(a.dtype), dtype_name(b.dtype));
  if (!a.has_rank() || !b.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(a.dtype));
    return Status::Ok();
  }
  if (a.rank() < 1 || b.rank() < 1)
    return KILN_ERROR("{}: MatMul inputs must have rank >= 1 (got {} and {})",
                      ctx.node().label(), a.rank(), b.rank());
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, matmul_out_dims(ctx.node(), *a.dims, *b.dims));
  ctx.set_output(0, TensorType(a.dtype, std::move(out)));
  return Status::Ok();
}

template <typename T>
void matmul_typed(const Tensor& a, const Tensor& b, Tensor& y, const std::vector<int64_t>& batch,
                  const std::vector<int64_t>& a_batch, const std::vector<int64_t>& b_batch,
                  int64_t M, int64_t N, int64_t K) {
  const auto sa = broadcast_strides(a_batch, batch);
  const auto sb = broadcast_strides(b_batch, batch);
  const int64_t nb = shape_product(batch);
  const T* A = a.data<T>();
  const T* B = b.data<T>();
  T* Y = y.data<T>();
  std::vector<uint64_t> iacc;
  for (int64_t bi = 0; bi < nb; ++bi) {
    int64_t oa = 0, ob = 0;
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1, r = bi; d >= 0; --d) {
      const int64_t id = r % batch[d];
      r /= batch[d];
      oa += id * sa[d];
      ob += id * sb[d];
    }
    const T* Ap = A + oa * M * K;
    const T* Bp = B + ob * K * N;
    T* Yp = Y + bi * M * N;
    if constexpr (std::is_floating_point_v<T>) {
      gemm<T>(false, false, M, N, K, T(1), Ap, Bp, T(0), Yp);
    } else {
      int_matmul<T>(false, false, M, N, K, Ap, Bp, iacc);
      for (int64_t i = 0; i < M * N; ++i) Yp[i] = static_cast<T>(iacc[i]);
    }
  }
}

Status matmul_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* a = ctx.input(0);
  const Tensor* b = ctx.input(1);
  if (!a || !b) return KILN_ERROR("{}: MatMul needs two inputs", n.label());
  if (a->dtype() != b->dtype())
    return KILN_ERROR("{}: input types differ ({} vs {})", n.label(), dtype_name(a->dtype()),
                      dtype_name(b->dtype()));
  KILN_RETURN_IF_ERROR(check_numeric(n, a->dtype(), "input"));
  if (a->rank() < 1 || b->rank() < 1)
    return KILN_ERROR("{}: MatMul inputs must have rank >= 1 (got {} and {})", n.label(),
                      a->rank(), b->rank());
  std::vector<int64_t> as = a->shape(), bs = b->shape();
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  if (bs[bs.size() - 2] != K)
    return KILN_ERROR("{}: inner dimensions differ: {} x {}", n.label(), shape_str(a->shape()),
                      shape_str(b->shape()));
  const std::vector<int64_t> a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> batch, broadcast_shapes({a_batch, b_batch}, n));
  std::vector<int64_t> out = batch;
  if (!a1) out.push_back(M);
  if (!b1) out.push_back(N);
  const DataType dt = a->dtype();
  if (is_16bit_float(dt)) {
    const Tensor af = a->cast(DataType::kFloat32), bf = b->cast(DataType::kFloat32);
    Tensor y(DataType::kFloat32, out);
    matmul_typed<float>(af, bf, y, batch, a_batch, b_batch, M, N, K);
    ctx.set_output(0, y.cast(dt));
    return Status::Ok();
  }
  Tensor y(dt, out);
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, Half> &&
                  !std::is_same_v<T, BFloat16>)
      matmul_typed<T>(*a, *b, y, batch, a_batch, b_batch, M, N, K);
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// --- Gemm ---------------------------------------------------------------------------------------

Status upgrade_gemm(ImportContext& ctx) {
  // Before Gemm-11, C is required.
  if (ctx.opset() < 11 && !ctx.node().input(2))
    return KILN_ERROR("{}: input C is required before opset 11 (model opset {})",
                      ctx.node().label(), ctx.opset());
  // Gemm-1/6 `broadcast`: kiln always broadcasts C unidirectionally (a superset of broadcast=0).
  ctx.node().attrs.erase("broadcast");
  return Status::Ok();
}

// Checks that C's shape broadcasts unidirectionally to [M, N].
Status check_gemm_c(const Node& n, const std::vector<int64_t>& c, int64_t M, int64_t N) {
  if (c.size() > 2)
    return KILN_ERROR("{}: C has rank {} (at most 2)", n.label(), c.size());
  const int64_t want[2] = {M, N};
  for (size_t k = 0; k < c.size(); ++k) {
    const int64_t w = want[2 - c.size() + k];
    if (c[k] >= 0 && w >= 0 && c[k] != 1 && c[k] != w)
      return KILN_ERROR("{}: C of shape {} cannot be broadcast to [{},{}]", n.label(),
                        shape_str(c), M, N);
  }
  return Status::Ok();
}

Status infer_gemm(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& a = ctx.input_type(0);
  const TensorType& b = ctx.input_type(1);
  if ((a.has_rank() && a.rank() != 2) || (b.has_rank() && b.rank() != 2))
    return KILN_ERROR("{}: Gemm inputs must be 2-D (got ranks {} and {})", n.label(), a.rank(),
                      b.rank());
  if (!a.has_rank() || !b.has_rank()) {
    const bool ta = n.attrs.get_int("transA", 0) != 0, tb = n.attrs.get_int("transB", 0) != 0;
    ctx.set_output(0, TensorType(a.dtype != DataType::kUndefined ? a.dtype : b.dtype,
                                 {a.has_rank() ? (*a.dims)[ta ? 1 : 0] : Dim(),
                                  b.has_rank() ? (*b.dims)[tb ? 0 : 1] : Dim()}));
    return Status::Ok();
  }
  const bool ta = n.attrs.get_int("transA", 0) != 0, tb = n.attrs.get_int("transB", 0) != 0;
  const Dim M = (*a.dims)[ta ? 1 : 0], Ka = (*a.dims)[ta ? 0 : 1];
  const Dim Kb = (*b.dims)[tb ? 1 : 0], N = (*b.dims)[tb ? 0 : 1];
  if (Ka.is_static() && Kb.is_static() && Ka.value != Kb.value)
    return KILN_ERROR("{}: inner dimensions differ ({} vs {})", n.label(), Ka.value, Kb.value);
  if (ctx.has_input(2) && ctx.input_type(2).has_rank()) {
    std::vector<int64_t> cs;
    for (const Dim& d : *ctx.input_type(2).dims) cs.push_back(d.value);
    KILN_RETURN_IF_ERROR(check_gemm_c(n, cs, M.value, N.value));
  }
  ctx.set_output(0, TensorType(a.dtype, {M, N}));
  return Status::Ok();
}

template <typename T>
void gemm_typed(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                const Tensor& a, const Tensor& b, const Tensor* c, Tensor& y) {
  T* Y = y.data<T>();
  if (c) {  // broadcast C into Y
    const auto cs = broadcast_strides(c->shape(), {M, N});
    const T* C = c->data<T>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) Y[i * N + j] = C[i * cs[0] + j * cs[1]];
  }
  if constexpr (std::is_floating_point_v<T>) {
    gemm<T>(ta, tb, M, N, K, static_cast<T>(alpha), a.data<T>(), b.data<T>(),
            c ? static_cast<T>(beta) : T(0), Y);
  } else {
    std::vector<uint64_t> acc;
    int_matmul<T>(ta, tb, M, N, K, a.data<T>(), b.data<T>(), acc);
    for (int64_t i = 0; i < M * N; ++i) {
      const T p = static_cast<T>(acc[i]);
      const T s = alpha == 1.f ? p : scale_int<T>(alpha, p);
      if (!c) {
        Y[i] = s;
      } else {
        const T cb = beta == 1.f ? Y[i] : scale_int<T>(beta, Y[i]);
        Y[i] = static_cast<T>(as_u64(s) + as_u64(cb));
      }
    }
  }
}

Status gemm_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* a = ctx.input(0);
  const Tensor* b = ctx.input(1);
  const Tensor* c = ctx.input(2);
  if (!a || !b) return KILN_ERROR("{}: Gemm needs inputs A and B", n.label());
  const DataType dt = a->dtype();
  KILN_RETURN_IF_ERROR(check_numeric(n, dt, "input"));
  if (b->dtype() != dt || (c && c->dtype() != dt))
    return KILN_ERROR("{}: input types differ", n.label());
  if (a->rank() != 2 || b->rank() != 2)
    return KILN_ERROR("{}: Gemm inputs must be 2-D (got {} and {})", n.label(),
                      shape_str(a->shape()), shape_str(b->shape()));
  const bool ta = n.attrs.get_int("transA", 0) != 0, tb = n.attrs.get_int("transB", 0) != 0;
  const float alpha = n.attrs.get_float("alpha", 1.f), beta = n.attrs.get_float("beta", 1.f);
  const int64_t M = a->dim(ta ? 1 : 0), K = a->dim(ta ? 0 : 1);
  const int64_t Kb = b->dim(tb ? 1 : 0), N = b->dim(tb ? 0 : 1);
  if (K != Kb)
    return KILN_ERROR("{}: inner dimensions differ: A {} (transA={}) vs B {} (transB={})",
                      n.label(), shape_str(a->shape()), ta, shape_str(b->shape()), tb);
  if (c) KILN_RETURN_IF_ERROR(check_gemm_c(n, c->shape(), M, N));
  if (is_16bit_float(dt)) {
    const Tensor af = a->cast(DataType::kFloat32), bf = b->cast(DataType::kFloat32);
    Tensor cf = c ? c->cast(DataType::kFloat32) : Tensor();
    Tensor y(DataType::kFloat32, {M, N});
    gemm_typed<float>(ta, tb, M, N, K, alpha, beta, af, bf, c ? &cf : nullptr, y);
    ctx.set_output(0, y.cast(dt));
    return Status::Ok();
  }
  Tensor y(dt, {M, N});
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, Half> &&
                  !std::is_same_v<T, BFloat16>)
      gemm_typed<T>(ta, tb, M, N, K, alpha, beta, *a, *b, c, y);
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const OpDef kGemmOps[] = {
    {"", "Gemm", infer_gemm, gemm_cpu, upgrade_gemm},
    {"", "MatMul", infer_matmul, matmul_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> gemm_ops() { return kGemmOps; }

}  // namespace kiln
