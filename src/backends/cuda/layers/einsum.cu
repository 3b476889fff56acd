// Gemm family: Einsum, generically. The loop structure is the CPU kernel's (ops/einsum.h
// plan_einsum): one thread per output element walks the summed-over variables in the same
// row-major order, so the products add up in the same order. Floats accumulate in double
// (explicitly rounded operations: no fused multiply-add), integers in wrapping 64 bits, and the
// sum is rounded once to the output type, as the reference does.
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/device_util.cuh"
#include "ops/einsum.h"
#include "tactics.h"

namespace kiln::gpu {

namespace {

constexpr int kMaxIn = 6, kMaxVars = 16;

struct EinsumGeom {
  int num_in = 0, num_out = 0, num_red = 0;
  const void* in[kMaxIn] = {};
  int64_t out_dims[kMaxVars] = {};             // output dims, row-major
  int64_t out_strides[kMaxIn][kMaxVars] = {};  // each input's stride per output dim
  int64_t red_dims[kMaxVars] = {};             // summed-over variables, in variable order
  int64_t red_strides[kMaxIn][kMaxVars] = {};
  int64_t red_total = 1;
};

template <typename T, typename A>
__device__ __forceinline__ A load_acc(const void* p, int64_t i) {
  return static_cast<A>(load(static_cast<const T*>(p), i));
}

template <typename T>
__global__ void einsum_kernel(T* y, int64_t n, const __grid_constant__ EinsumGeom g) {
  constexpr bool kFloat = is_float_v<T>;
  using A = std::conditional_t<kFloat, double, uint64_t>;
  KILN_GRID_STRIDE(o, n) {
    int64_t base[kMaxIn] = {};
    int64_t rem = o;
    for (int d = g.num_out - 1; d >= 0; --d) {
      const int64_t c = rem % g.out_dims[d];
      rem /= g.out_dims[d];
      for (int k = 0; k < g.num_in; ++k) base[k] += c * g.out_strides[k][d];
    }
    A acc = 0;
    for (int64_t r = 0; r < g.red_total; ++r) {
      int64_t off[kMaxIn];
      for (int k = 0; k < g.num_in; ++k) off[k] = base[k];
      int64_t q = r;
      for (int d = g.num_red - 1; d >= 0; --d) {
        const int64_t c = q % g.red_dims[d];
        q /= g.red_dims[d];
        for (int k = 0; k < g.num_in; ++k) off[k] += c * g.red_strides[k][d];
      }
      A prod = 1;
      for (int k = 0; k < g.num_in; ++k) {
        if constexpr (kFloat) {
          prod = __dmul_rn(prod, load_acc<T, double>(g.in[k], off[k]));
        } else {
          prod *= static_cast<uint64_t>(static_cast<int64_t>(static_cast<const T*>(g.in[k])[off[k]]));
        }
      }
      if constexpr (kFloat) acc = __dadd_rn(acc, prod);
      else acc += prod;
    }
    if constexpr (kFloat) store(y, o, acc);
    else y[o] = static_cast<T>(static_cast<int64_t>(acc));
  }
}

class EinsumLayer final : public Layer {
 public:
  explicit EinsumLayer(const LayerDesc& d) : node_(d.node) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    std::vector<std::vector<int64_t>> shapes;
    for (const DeviceTensor& t : in) shapes.push_back(t.shape);
    KILN_ASSIGN_OR_RETURN(EinsumPlan P, plan_einsum(n, shapes));
    if (P.out_shape != out[0].shape)
      return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(out[0].shape),
                        shape_str(P.out_shape));
    if (P.sizes.size() > static_cast<size_t>(kMaxVars))
      return KILN_ERROR("{}: {} einsum loop variables, at most {} run on the GPU", n.label(),
                        P.sizes.size(), kMaxVars);
    EinsumGeom g;
    g.num_in = static_cast<int>(in.size());
    std::vector<bool> is_out(P.sizes.size(), false);
    for (size_t d = 0; d < P.out_vars.size(); ++d) {
      const size_t v = P.out_vars[d];
      is_out[v] = true;
      g.out_dims[d] = P.sizes[v];
      for (size_t k = 0; k < in.size(); ++k) g.out_strides[k][d] = P.in_strides[k][v];
    }
    g.num_out = static_cast<int>(P.out_vars.size());
    for (size_t v = 0; v < P.sizes.size(); ++v) {
      if (is_out[v]) continue;
      g.red_dims[g.num_red] = P.sizes[v];
      for (size_t k = 0; k < in.size(); ++k) g.red_strides[k][g.num_red] = P.in_strides[k][v];
      g.red_total *= P.sizes[v];
      ++g.num_red;
    }
    g_ = g;
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = out[0].numel();
    if (n == 0) return Status::Ok();
    EinsumGeom g = g_;
    for (size_t k = 0; k < in.size(); ++k) g.in[k] = in[k].data;
    const bool ok = dispatch_dtype(out[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>)
        einsum_kernel<T><<<grid_for(n), kBlock, 0, rc.stream>>>(static_cast<T*>(out[0].data), n,
                                                                 g);
    });
    if (!ok || out[0].dtype == DataType::kBool)
      return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(out[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("einsum kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  EinsumGeom g_;
};

}  // namespace

bool einsum_supports(const LayerDesc& d, std::string* why) {
  if (d.in.empty() || d.in.size() > static_cast<size_t>(kMaxIn))
    return *why = fmt::format("1 to {} inputs run on the GPU", kMaxIn), false;
  const DataType t = d.out[0].dtype;
  if (!dtype_is_float(t) && !dtype_is_integer(t))
    return *why = "unsupported type " + std::string(dtype_name(t)), false;
  for (const TensorFormat& f : d.in)
    if (f.dtype != t || f.layout != Layout::kLinear)
      return *why = "inputs must be linear and of the output's type", false;
  if (d.out[0].layout != Layout::kLinear) return *why = "linear layout only", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_einsum(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new EinsumLayer(d));
}

}  // namespace kiln::gpu
