// Recurrent family: LSTM, GRU and RNN (ops/rnn.h has the equations and the attributes, shared
// with the CPU reference). Every tactic first multiplies the input projection X W^T of all time
// steps and both directions as one cuBLAS GEMM into a float32 workspace (X and W in the
// layer's storage type, float accumulation); what differs is the recurrence (cuDNN's tactic
// does both itself):
//
//   <op>.cublas      per step, H R^T for both directions as one strided-batched cuBLAS GEMM and
//                    one gate kernel (GRU with linear_before_reset 0: two of each, as (r * H)
//                    Rh^T needs r first). Any size; S steps cost 2 to 4 launches each.
//   <op>.persistent  one kernel for all steps: a block per direction and NB batch entries
//                    (variants nb1, nb2, nb4) keeps H, C and the gate products in shared memory,
//                    and R too where it fits (else it streams R's rows from L2 every step); a
//                    warp per R row, each lane holding a 16-byte slice of H in registers.
//                    Hidden sizes up to 1024.
//   <op>.cudnn       cuDNN's RNN (rnn_cudnn.cu) where its cells compute the ONNX layer: default
//                    activations, no clip, peepholes or sequence_lens, GRU linear_before_reset 1.
//
// Gates, states and the cell math are float in every precision (FP16 stores X, W, R, B, the
// states given and the outputs as float16; the per-step GEMM of <op>.cublas reads H rounded to
// float16, the persistent kernel reads it as float). Sequence lengths are clamped to [0, S] (the
// CPU reference refuses others; the GPU cannot report a value it reads at run time). Where the
// projection of the whole batch does not fit the workspace limit, the batch runs in groups.
#include <cublas_v2.h>

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>

#include "device_util_host.h"
#include "kernels/device_util.cuh"
#include "layers/gemm_common.h"
#include "layers/rnn_kernels.cuh"
#include "ops/rnn.h"
#include "tactics.h"

namespace kiln::gpu {

// Types and layouts every recurrent tactic needs (the cuDNN one too: rnn_cudnn.cu).
bool rnn_common_supports(const LayerDesc& d, std::string* why) {
  auto spec = read_rnn_spec(*d.node);
  if (!spec.ok()) return *why = spec.status().message(), false;
  if (d.in.size() < 3 || !d.in[1].present() || !d.in[2].present())
    return *why = "X, W and R are required", false;
  const DataType t = d.in[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16)
    return *why = "float32 or float16 storage only", false;
  for (size_t i = 0; i < d.in.size(); ++i) {
    const TensorFormat& f = d.in[i];
    if (!f.present()) continue;
    if (f.layout != Layout::kLinear) return *why = "linear layouts only", false;
    if (i == 4) {
      if (f.dtype != DataType::kInt32 && f.dtype != DataType::kInt64)
        return *why = "sequence_lens must be int32 or int64", false;
    } else if (f.dtype != t) {
      return *why = "every float input in X's storage type", false;
    }
  }
  for (const TensorFormat& f : d.out)
    if (f.present() && (f.dtype != t || f.layout != Layout::kLinear))
      return *why = "outputs in X's storage type, linear", false;
  return true;
}

// rnn_cudnn.cu
bool rnn_cudnn_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_rnn_cudnn(const LayerDesc& d);

namespace {

using namespace rnn;

// --- the layer ---------------------------------------------------------------------------------

enum class Recurrence { kCublas, kPersistent };

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

class RnnLayer final : public Layer {
 public:
  RnnLayer(const LayerDesc& d, Recurrence kind, RnnSpec spec)
      : node_(d.node), precision_(d.precision), kind_(kind), spec_(spec) {
    if (kind == Recurrence::kPersistent && d.variant.size() > 2 && d.variant.rfind("nb", 0) == 0)
      persist_nb_ = std::atoi(d.variant.c_str() + 2);
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override;
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override;

 private:
  template <typename T>
  Status run_typed(const RunContext& rc, std::span<const DeviceTensor> in,
                   std::span<const DeviceTensor> out);
  // Workspace of one batch group of nb entries: the projection, then the recurrence's buffers.
  size_t group_bytes(int64_t nb) const;

  const Node* node_;
  Precision precision_;
  Recurrence kind_;
  RnnSpec spec_;
  int persist_nb_ = 1;
  DataType t_ = DataType::kUndefined;
  RnnShape z_;
  int64_t nb_ = 0;  // entries per group
  int64_t hp_ = 0;  // persistent: R's padded row length
  int kpl_ = 0;
  PersistSmem sm_;
};

size_t RnnLayer::group_bytes(int64_t nb) const {
  const int64_t D = spec_.num_dirs, G = spec_.gates(), H = z_.hidden, S = z_.seq;
  const size_t es = dtype_size(t_);
  size_t b = align256(static_cast<size_t>(S * nb * D * G * H) * sizeof(float));
  if (kind_ == Recurrence::kPersistent)
    return b + align256(static_cast<size_t>(D * G * H * hp_) * es);  // R packed
  const size_t state = static_cast<size_t>(D * nb * H);
  b += align256(static_cast<size_t>(D * nb * G * H) * sizeof(float));  // hr
  b += 2 * align256(state * sizeof(float));                            // h, c
  b += 2 * align256(state * es);                                       // ht, rh
  b += align256(state * sizeof(float));                                // hh (GRU)
  return b;
}

Expected<size_t> RnnLayer::configure(const RunContext& rc, std::span<const DeviceTensor> in,
                                     std::span<const DeviceTensor> out) {
  const Node& n = *node_;
  std::vector<const std::vector<int64_t>*> shapes;
  for (size_t i = 0; i < in.size(); ++i) shapes.push_back(in[i].present() ? &in[i].shape : nullptr);
  KILN_ASSIGN_OR_RETURN(z_, rnn_shape(n, spec_, shapes));
  t_ = in[0].dtype;
  if (t_ != DataType::kFloat32 && t_ != DataType::kFloat16)
    return KILN_ERROR("{}: float32 or float16 storage only, got {}", n.label(), dtype_name(t_));
  const int64_t S = z_.seq, Bn = z_.batch, H = z_.hidden;
  const std::vector<int64_t> want[3] = {rnn_y_shape<int64_t>(spec_, S, Bn, H),
                                        rnn_state_shape<int64_t>(spec_, Bn, H),
                                        rnn_state_shape<int64_t>(spec_, Bn, H)};
  for (size_t o = 0; o < out.size() && o < 3; ++o)
    if (out[o].present() && (out[o].shape != want[o] || out[o].dtype != t_))
      return KILN_ERROR("{}: output {} is {} {}, expected {} {}", n.label(), o,
                        dtype_name(out[o].dtype), shape_str(out[o].shape), dtype_name(t_),
                        shape_str(want[o]));
  if (kind_ == Recurrence::kPersistent) {
    const size_t es = dtype_size(t_);
    const int64_t V = 16 / static_cast<int64_t>(es), G = spec_.gates();
    hp_ = round_up(H, V);
    kpl_ = slices_per_lane(hp_, es);
    if (kpl_ == 0 || !persist_fits(persist_nb_, H, es))
      return KILN_ERROR("{}: no persistent kernel for hidden size {} at {} entries a block",
                        n.label(), H, persist_nb_);
    const bool gru0 = spec_.cell == RnnCell::kGru && !spec_.linear_before_reset;
    const int64_t NB = persist_nb_;
    PersistSmem sm;
    uint32_t off = 0;
    auto take = [&](int64_t bytes) {
      const uint32_t o = off;
      off += static_cast<uint32_t>(round_up(bytes, 16));
      return o;
    };
    sm.h = take(NB * hp_ * 4);
    sm.rh = take(gru0 ? NB * hp_ * 4 : 0);
    sm.g = take(NB * G * H * 4);
    sm.c = take(spec_.cell == RnnCell::kLstm ? NB * H * 4 : 0);
    int dev = 0, optin = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    // 1 KiB for the static `lens` array and the runtime's own use.
    const int64_t r_bytes = G * H * hp_ * static_cast<int64_t>(es);
    sm.resident = off + r_bytes + 1024 <= static_cast<int64_t>(optin);
    if (sm.resident) sm.r = take(r_bytes);
    sm.total = off;
    if (sm.total + 1024 > static_cast<uint32_t>(optin))
      return KILN_ERROR("{}: the persistent kernel needs {} bytes of shared memory, the GPU has {}",
                        n.label(), sm.total, optin);
    sm_ = sm;
    if (sm.total + 1024 > 48 * 1024) {  // with the static `lens`: past the default 48 KiB
      cudaError_t e = cudaSuccess;
      if (t_ == DataType::kFloat16) {
        if (PersistFn<__half> f = persist_kernel<__half>(persist_nb_, kpl_))
          e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(sm.total));
      } else if (PersistFn<float> f = persist_kernel<float>(persist_nb_, kpl_)) {
        e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(sm.total));
      }
      KILN_CUDA_CHECK(e);
    }
  }
  // The whole batch at once where its workspace fits, else groups of entries.
  nb_ = Bn;
  if (Bn > 0 && group_bytes(Bn) > rc.workspace_limit) {
    const size_t one = group_bytes(1);
    if (one > rc.workspace_limit)
      return KILN_ERROR("{}: one sequence of {} steps needs {} MiB of workspace, the limit is {}",
                        n.label(), S, one >> 20, rc.workspace_limit >> 20);
    nb_ = std::max<int64_t>(1, static_cast<int64_t>(rc.workspace_limit / one));
    while (nb_ > 1 && group_bytes(nb_) > rc.workspace_limit) --nb_;
  }
  return Bn > 0 ? group_bytes(nb_) : size_t{0};
}

Status RnnLayer::run(const RunContext& rc, std::span<const DeviceTensor> in,
                     std::span<const DeviceTensor> out) {
  if (t_ == DataType::kFloat16) return run_typed<__half>(rc, in, out);
  return run_typed<float>(rc, in, out);
}

template <typename T>
Status RnnLayer::run_typed(const RunContext& rc, std::span<const DeviceTensor> in,
                           std::span<const DeviceTensor> out) {
  const Node& n = *node_;
  const int64_t S = z_.seq, Bn = z_.batch, I = z_.input, H = z_.hidden;
  const int D = spec_.num_dirs, G = spec_.gates();
  if (Bn == 0) return Status::Ok();
  auto opt_in = [&](size_t i) { return in.size() > i && in[i].present() ? in[i].data : nullptr; };
  auto opt_out = [&](size_t i) {
    return out.size() > i && out[i].present() ? out[i].data : nullptr;
  };
  RnnParams p;
  p.cell = spec_.cell;
  p.D = D, p.G = G, p.S = S, p.B = Bn, p.H = H;
  p.batch_first = spec_.batch_first, p.reverse = spec_.reverse;
  p.has_clip = spec_.has_clip, p.clip = spec_.clip;
  p.input_forget = spec_.input_forget, p.lbr = spec_.linear_before_reset;
  std::copy(std::begin(spec_.acts), std::end(spec_.acts), p.acts);
  p.bias = opt_in(3);
  p.lens = opt_in(4);
  p.lens64 = p.lens && in[4].dtype == DataType::kInt64;
  p.h0 = opt_in(5);
  if (spec_.cell == RnnCell::kLstm) p.c0 = opt_in(6), p.peep = opt_in(7);
  p.y = opt_out(0), p.yh = opt_out(1);
  if (spec_.cell == RnnCell::kLstm) p.yc = opt_out(2);
  const size_t es = sizeof(T);
  const int64_t GH = G * H, N = D * GH;
  uint8_t* ws = static_cast<uint8_t*>(rc.workspace);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    uint8_t* q = ws + off;
    off += align256(bytes);
    return q;
  };
  float* proj = reinterpret_cast<float*>(take(static_cast<size_t>(S * nb_ * N) * sizeof(float)));
  const T* R = static_cast<const T*>(in[2].data);
  const T* Rp = R;  // the persistent kernel's [D, G H, hp] rows
  float *hr = nullptr, *h = nullptr, *c = nullptr, *hh = nullptr;
  T *ht = nullptr, *rh = nullptr;
  const bool gru0 = spec_.cell == RnnCell::kGru && !spec_.linear_before_reset;
  if (kind_ == Recurrence::kPersistent) {
    T* packed = reinterpret_cast<T*>(take(static_cast<size_t>(D * GH * hp_) * es));
    if (hp_ != H || !aligned16(R)) {
      rnn_pack_kernel<T>
          <<<grid_for(D * GH * hp_), kBlock, 0, rc.stream>>>(R, packed, D * GH, H, hp_);
      KILN_CUDA_LAUNCH_CHECK("rnn pack R");
      Rp = packed;
    }
  } else {
    const size_t state = static_cast<size_t>(D * nb_ * H);
    hr = reinterpret_cast<float*>(take(static_cast<size_t>(D * nb_ * GH) * sizeof(float)));
    h = reinterpret_cast<float*>(take(state * sizeof(float)));
    c = reinterpret_cast<float*>(take(state * sizeof(float)));
    ht = reinterpret_cast<T*>(take(state * es));
    rh = reinterpret_cast<T*>(take(state * es));
    hh = reinterpret_cast<float*>(take(state * sizeof(float)));
    if (spec_.cell != RnnCell::kLstm) c = nullptr;
  }
  const DataType t = t_;
  for (int64_t b0 = 0; b0 < Bn; b0 += nb_) {
    const int64_t nb = std::min(nb_, Bn - b0);
    p.b0 = b0, p.nb = nb, p.proj = proj;
    // The projection X W^T (W as [D G H, I]) of this group's rows, in float.
    BatchedGemm g;
    g.tb = true, g.N = N, g.K = I;
    const void* a = static_cast<const uint8_t*>(in[0].data) +
                    static_cast<size_t>((spec_.batch_first ? b0 * S : b0) * I) * es;
    if (spec_.batch_first) {  // rows (b, t): contiguous for the group
      g.M = nb * S;
      p.pt = 1, p.pb = S;
    } else if (nb == Bn) {  // rows (t, b): the whole tensor
      g.M = S * Bn;
      p.pt = Bn, p.pb = 1;
    } else {  // rows (t, b) of the group: one product per time step
      g.M = nb, g.count = S, g.sa = Bn * I, g.sb = 0, g.sy = nb * N;
      p.pt = nb, p.pb = 1;
    }
    KILN_RETURN_IF_ERROR(check_gemm_dims(g, n));
    KILN_RETURN_IF_ERROR(
        run_batched_gemm(rc, g, t, DataType::kFloat32, precision_, 1.0, a, in[1].data, proj));
    if (kind_ == Recurrence::kPersistent) {
      PersistFn<T> f = persist_kernel<T>(persist_nb_, kpl_);
      if (!f) return KILN_ERROR("{}: no persistent kernel for these sizes", n.label());
      const dim3 grid(static_cast<unsigned>((nb + persist_nb_ - 1) / persist_nb_),
                      static_cast<unsigned>(D));
      f<<<grid, kPersistThreads, sm_.total, rc.stream>>>(p, Rp, hp_, sm_);
      KILN_CUDA_LAUNCH_CHECK("rnn persistent kernel");
      continue;
    }
    const int64_t cells = D * nb * H;
    rnn_init_kernel<T><<<grid_for(cells), kBlock, 0, rc.stream>>>(p, h, c, ht);
    KILN_CUDA_LAUNCH_CHECK("rnn init");
    // H R^T for every direction: [D, nb, N1] from ht [D, nb, H] and R's first N1 rows of each
    // direction's [G H, H] block.
    BatchedGemm step;
    step.tb = true, step.M = nb, step.N = gru0 ? 2 * H : GH, step.K = H;
    step.count = D, step.sa = nb * H, step.sb = GH * H, step.sy = nb * step.N;
    BatchedGemm step_h = step;  // GRU's (r * h) Rh^T: rows [2H, 3H)
    step_h.N = H, step_h.sy = nb * H;
    KILN_RETURN_IF_ERROR(check_gemm_dims(step, n));
    const T* Rh = R + 2 * H * H;
    for (int64_t j = 0; j < S; ++j) {
      KILN_RETURN_IF_ERROR(
          run_batched_gemm(rc, step, t, DataType::kFloat32, precision_, 1.0, ht, R, hr));
      if (gru0) {
        rnn_step_kernel<T>
            <<<grid_for(cells), kBlock, 0, rc.stream>>>(p, j, 0, hr, step.N, nullptr, h, c, ht, rh);
        KILN_CUDA_LAUNCH_CHECK("rnn reset gate");
        KILN_RETURN_IF_ERROR(
            run_batched_gemm(rc, step_h, t, DataType::kFloat32, precision_, 1.0, rh, Rh, hh));
      }
      rnn_step_kernel<T><<<grid_for(cells), kBlock, 0, rc.stream>>>(
          p, j, 1, hr, step.N, gru0 ? hh : nullptr, h, c, ht, rh);
      KILN_CUDA_LAUNCH_CHECK("rnn step");
    }
    rnn_final_kernel<T><<<grid_for(cells), kBlock, 0, rc.stream>>>(p, h, c);
    KILN_CUDA_LAUNCH_CHECK("rnn final states");
  }
  return Status::Ok();
}

// --- supports ----------------------------------------------------------------------------------

bool cublas_supports(const LayerDesc& d, std::string* why) {
  return rnn_common_supports(d, why);
}

// The hidden size from R's type, where static.
int64_t static_hidden(const LayerDesc& d) {
  const TensorType& r = d.in_type(2);
  return r.rank() == 3 && (*r.dims)[2].is_static() ? (*r.dims)[2].value : -1;
}

bool persistent_supports(const LayerDesc& d, std::string* why) {
  if (!rnn_common_supports(d, why)) return false;
  const int64_t H = static_hidden(d);
  if (H <= 0) return *why = "R's hidden size must be known at build time", false;
  if (!persist_fits(1, H, dtype_size(d.in[0].dtype)))
    return *why = "hidden sizes up to 1024 only", false;
  return true;
}

std::vector<std::string> persistent_variants(const LayerDesc& d) {
  std::vector<std::string> v;
  const int64_t H = static_hidden(d);
  for (int nb : {1, 2, 4})
    if (H > 0 && persist_fits(nb, H, dtype_size(d.in[0].dtype)))
      v.push_back("nb" + std::to_string(nb));
  if (v.empty()) v.push_back("nb1");
  return v;
}

template <Recurrence kKind>
Expected<std::unique_ptr<Layer>> create_rnn(const LayerDesc& d) {
  KILN_ASSIGN_OR_RETURN(RnnSpec spec, read_rnn_spec(*d.node));
  return std::unique_ptr<Layer>(new RnnLayer(d, kKind, spec));
}

constexpr uint32_t kCaps = kF32 | kF16;

const TacticDef kRnnTactics[] = {
    {"", "LSTM", "lstm.persistent", kCaps, 0, persistent_supports,
     create_rnn<Recurrence::kPersistent>, persistent_variants},
    {"", "LSTM", "lstm.cublas", kCaps, 0, cublas_supports, create_rnn<Recurrence::kCublas>},
    {"", "LSTM", "lstm.cudnn", kCaps, 0, rnn_cudnn_supports, create_rnn_cudnn},
    {"", "GRU", "gru.persistent", kCaps, 0, persistent_supports,
     create_rnn<Recurrence::kPersistent>, persistent_variants},
    {"", "GRU", "gru.cublas", kCaps, 0, cublas_supports, create_rnn<Recurrence::kCublas>},
    {"", "GRU", "gru.cudnn", kCaps, 0, rnn_cudnn_supports, create_rnn_cudnn},
    {"", "RNN", "rnn.persistent", kCaps, 0, persistent_supports,
     create_rnn<Recurrence::kPersistent>, persistent_variants},
    {"", "RNN", "rnn.cublas", kCaps, 0, cublas_supports, create_rnn<Recurrence::kCublas>},
    {"", "RNN", "rnn.cudnn", kCaps, 0, rnn_cudnn_supports, create_rnn_cudnn},
};

}  // namespace

std::span<const TacticDef> rnn_tactics() { return kRnnTactics; }

}  // namespace kiln::gpu
