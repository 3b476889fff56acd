// ReverseSequence on the GPU: each batch entry's first sequence_lens[b] steps in reverse, the rest
// copied (tf2onnx's bidirectional and go_backwards recurrent layers). The spec is the CPU
// reference (src/ops/index_scan.cpp). A length outside [0, steps], which the reference refuses,
// writes that entry as zeros (as an out-of-range index does in movement_index.cu): the kernel
// reads the lengths on the device and never reads outside the input.
#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

namespace movement_detail {  // defined in movement.cu
std::span<const TacticDef> reverse_tactics();
bool movable_type(DataType t);
}  // namespace movement_detail

namespace {

using namespace movement_detail;

// Element e of y: (t, b, i) with i within a step's `inner` elements; time first or batch first.
template <typename T>
__global__ void reverse_sequence_kernel(const T* __restrict__ x, T* __restrict__ y,
                                        const int64_t* __restrict__ lens, int64_t n,
                                        int64_t steps, int64_t batch, int64_t inner,
                                        bool time_first) {
  KILN_GRID_STRIDE(e, n) {
    const int64_t i = e % inner, tb = e / inner;
    const int64_t t = time_first ? tb / batch : tb % steps;
    const int64_t b = time_first ? tb % batch : tb / steps;
    const int64_t len = lens[b];
    if (len < 0 || len > steps) {
      y[e] = T(0);  // all-zero bits
      continue;
    }
    const int64_t s = t < len ? len - 1 - t : t;
    y[e] = x[(time_first ? s * batch + b : b * steps + s) * inner + i];
  }
}

class ReverseSequenceLayer final : public Layer {
 public:
  explicit ReverseSequenceLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    const DeviceTensor& x = in[0];
    time_first_ = node_->attrs.get_int("time_axis", 0) == 0;
    if (x.rank() < 2)
      return KILN_ERROR("{}: ReverseSequence input must have rank >= 2", node_->label());
    steps_ = x.shape[time_first_ ? 0 : 1];
    batch_ = x.shape[time_first_ ? 1 : 0];
    if (in[1].numel() != batch_)
      return KILN_ERROR("{}: sequence_lens has {} values for a batch of {}", node_->label(),
                        in[1].numel(), batch_);
    inner_ = steps_ * batch_ == 0 ? 0 : x.numel() / (steps_ * batch_);
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = in[0].numel();
    if (n == 0) return Status::Ok();
    dispatch_bytes(dtype_size(in[0].dtype), [&](auto tag) {
      using T = decltype(tag);
      reverse_sequence_kernel<T><<<grid_for(n), kBlock, 0, rc.stream>>>(
          static_cast<const T*>(in[0].data), static_cast<T*>(out[0].data),
          static_cast<const int64_t*>(in[1].data), n, steps_, batch_, inner_, time_first_);
    });
    KILN_CUDA_LAUNCH_CHECK("reverse_sequence kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool time_first_ = true;
  int64_t steps_ = 0, batch_ = 0, inner_ = 0;
};

Expected<std::unique_ptr<Layer>> create_reverse_sequence(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new ReverseSequenceLayer(d.node));
}

bool supports_reverse_sequence(const LayerDesc& d, std::string* why) {
  if (!movable_type(d.in[0].dtype))
    return *why = "unsupported type " + std::string(dtype_name(d.in[0].dtype)), false;
  if (d.in[1].dtype != DataType::kInt64) return *why = "sequence_lens must be int64", false;
  return true;
}

}  // namespace

namespace movement_detail {
std::span<const TacticDef> reverse_tactics() {
  static const TacticDef t[] = {
      {"", "ReverseSequence", "movement.reverse_sequence", kF32 | kF16 | kF64, 0,
       supports_reverse_sequence, create_reverse_sequence},
  };
  return t;
}
}  // namespace movement_detail

}  // namespace kiln::gpu
