// AffineGrid on the GPU (src/ops/sampling.cpp is the spec): a thread per output point computes
// its normalized coordinates (ops/sampling_math.h's affine_base, the reference's own arithmetic)
// and writes theta times (x, y, (z,) 1), in float (double for float64 tensors). The size is read
// on the host (configure); theta stays on the device. Gated until its test-backend-ops cases
// (sampling.affine_grid_*) have run on a GPU.
#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "ops/sampling_math.h"
#include "tactics.h"

namespace kiln::gpu {

std::span<const TacticDef> affine_grid_tactics();

namespace {

using namespace sampling;

struct AgParams {
  int r = 2;                // spatial rank: 2 or 3
  int64_t len[3] = {};      // W, H, (D): innermost first
  int64_t points = 0;       // per batch entry
  bool align = false;
};

template <typename T, typename C>
__global__ void affine_grid_kernel(const T* __restrict__ theta, T* __restrict__ y, int64_t n,
                                   AgParams p) {
  KILN_GRID_STRIDE(e, n) {  // e = b * points + point
    const int64_t b = e / p.points;
    int64_t rest = e % p.points;
    C c[4] = {C(0), C(0), C(0), C(1)};
    for (int k = 0; k < p.r; ++k) {
      c[k] = affine_base<C>(rest % p.len[k], p.len[k], p.align);
      rest /= p.len[k];
    }
    c[p.r] = C(1);
    const T* th = theta + b * p.r * (p.r + 1);
    for (int i = 0; i < p.r; ++i) {
      C v = C(0);
      for (int j = 0; j <= p.r; ++j) v += static_cast<C>(th[i * (p.r + 1) + j]) * c[j];
      y[e * p.r + i] = static_cast<T>(v);
    }
  }
}

class AffineGridLayer final : public Layer {
 public:
  explicit AffineGridLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    if (!in[1].host) return KILN_ERROR("{}: size is not known on the host", node_->label());
    const std::vector<int64_t> size = in[1].host->to_int64_vector();
    p_.r = static_cast<int>(in[0].rank() == 3 ? in[0].shape[1] : 0);
    if ((p_.r != 2 && p_.r != 3) || in[0].shape[2] != p_.r + 1 ||
        static_cast<int>(size.size()) != p_.r + 2 || size[0] != in[0].shape[0])
      return KILN_ERROR("{}: theta {} and size {} do not fit", node_->label(),
                        shape_str(in[0].shape), shape_str(size));
    p_.points = 1;
    for (int k = 0; k < p_.r; ++k) {
      p_.len[k] = size[static_cast<size_t>(p_.r + 1 - k)];
      if (p_.len[k] < 0)
        return KILN_ERROR("{}: size {} has a negative dim", node_->label(), shape_str(size));
      p_.points *= p_.len[k];
    }
    p_.align = node_->attrs.get_int("align_corners", 0) == 1;
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = in[0].shape[0] * p_.points;
    if (n == 0) return Status::Ok();
    dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      affine_grid_kernel<T, C><<<grid_for(n), kBlock, 0, rc.stream>>>(
          static_cast<const T*>(in[0].data), static_cast<T*>(out[0].data), n, p_);
    });
    KILN_CUDA_LAUNCH_CHECK("affine_grid kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  AgParams p_;
};

bool supports_affine_grid(const LayerDesc& d, std::string* why) {
  const DataType t = d.in[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kBFloat16 &&
      t != DataType::kFloat64)
    return *why = "theta must be a float tensor", false;
  if (d.out[0].dtype != t) return *why = "the grid must be stored in theta's type", false;
  if (d.in[0].layout != Layout::kLinear || d.out[0].layout != Layout::kLinear)
    return *why = "row-major tensors only", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_affine_grid(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new AffineGridLayer(d.node));
}

}  // namespace

std::span<const TacticDef> affine_grid_tactics() {
  static const TacticDef t[] = {
      // size (input 1) is read on the host.
      {"", "AffineGrid", "sampling.affine_grid", kF32 | kF16 | kF64, 0b10, supports_affine_grid,
       create_affine_grid},
  };
  return t;
}

}  // namespace kiln::gpu
