// Recurrent family (layers/rnn.cu): <op>.cudnn, cuDNN's RNN (cudnnRNNForward, cuDNN 9's API)
// for what cuDNN's cells compute: the default activations (an RNN's Tanh or Relu), no clip, no
// peepholes or input_forget, GRU with linear_before_reset 1, and no sequence_lens (cuDNN takes
// the lengths on the host when the descriptors are made; kiln's are a run-time input).
//
// cuDNN keeps its weights in its own space: each run copies W, R and B into it, gate by gate
// (cuDNN's orders: LSTM i, f, c, o where ONNX has i, o, f, c; GRU r, z, h where ONNX has z, r,
// h), so a non-constant W works too. cuDNN's Y is [S, B, D, H] (layout 0) where ONNX's is
// [S, D, B, H], and its states are [D, B, H] where layout 1's are [B, D, H]: a bidirectional
// layer of batch > 1 goes through the workspace and a transposing copy for those.
#include <cudnn.h>

#include <climits>
#include <memory>
#include <string>

#include "kernels/device_util.cuh"
#include "layers/conv_common.h"  // cudnn_check
#include "ops/rnn.h"
#include "tactics.h"

namespace kiln::gpu {

bool rnn_common_supports(const LayerDesc& d, std::string* why);  // rnn.cu

namespace {

// out[a, j, i, c] = in[a, i, j, c] for in of shape [A, n1, n2, C].
template <typename T>
__global__ void swap_middle_kernel(const T* in, T* out, int64_t A, int64_t n1, int64_t n2,
                                   int64_t C) {
  KILN_GRID_STRIDE(o, A * n1 * n2 * C) {
    const int64_t c = o % C, i = (o / C) % n1, j = (o / (C * n1)) % n2, a = o / (C * n1 * n2);
    out[o] = in[((a * n1 + i) * n2 + j) * C + c];
  }
}

__global__ void fill_lengths_kernel(int32_t* lens, int64_t n, int32_t value) {
  KILN_GRID_STRIDE(i, n) lens[i] = value;
}

Status swap_middle(const void* in, void* out, DataType t, int64_t A, int64_t n1, int64_t n2,
                   int64_t C, cudaStream_t s) {
  const int64_t n = A * n1 * n2 * C;
  if (n == 0) return Status::Ok();
  if (t == DataType::kFloat16)
    swap_middle_kernel<<<grid_for(n), kBlock, 0, s>>>(static_cast<const __half*>(in),
                                                      static_cast<__half*>(out), A, n1, n2, C);
  else
    swap_middle_kernel<<<grid_for(n), kBlock, 0, s>>>(static_cast<const float*>(in),
                                                      static_cast<float*>(out), A, n1, n2, C);
  KILN_CUDA_LAUNCH_CHECK("rnn transpose");
  return Status::Ok();
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

class RnnCudnnLayer final : public Layer {
 public:
  RnnCudnnLayer(const LayerDesc& d, RnnSpec spec)
      : node_(d.node), precision_(d.precision), spec_(spec) {}
  ~RnnCudnnLayer() override {
    if (rnn_) cudnnDestroyRNNDescriptor(rnn_);
    if (x_) cudnnDestroyRNNDataDescriptor(x_);
    if (y_) cudnnDestroyRNNDataDescriptor(y_);
    if (h_) cudnnDestroyTensorDescriptor(h_);
    if (m_) cudnnDestroyTensorDescriptor(m_);
    if (b_) cudnnDestroyTensorDescriptor(b_);
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override;
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override;

 private:
  // Copies W, R and B into cuDNN's weight space, gate by gate.
  Status fill_weights(const RunContext& rc, std::span<const DeviceTensor> in, void* space);

  const Node* node_;
  Precision precision_;
  RnnSpec spec_;
  cudnnRNNDescriptor_t rnn_ = nullptr;
  cudnnRNNDataDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnTensorDescriptor_t h_ = nullptr, m_ = nullptr, b_ = nullptr;
  DataType t_ = DataType::kUndefined;
  RnnShape z_;
  size_t weight_bytes_ = 0, temp_bytes_ = 0;
  bool swap_y_ = false, swap_states_ = false;
};

Expected<size_t> RnnCudnnLayer::configure(const RunContext& rc, std::span<const DeviceTensor> in,
                                          std::span<const DeviceTensor> out) {
  const Node& n = *node_;
  std::vector<const std::vector<int64_t>*> shapes;
  for (const DeviceTensor& t : in) shapes.push_back(t.present() ? &t.shape : nullptr);
  KILN_ASSIGN_OR_RETURN(z_, rnn_shape(n, spec_, shapes));
  t_ = in[0].dtype;
  const int64_t S = z_.seq, B = z_.batch, I = z_.input, H = z_.hidden, D = spec_.num_dirs;
  for (int64_t v : {S, B, I, H, D * H})
    if (v > INT_MAX) return KILN_ERROR("{}: a size of {} is beyond cuDNN's", n.label(), v);
  for (size_t o = 0; o < out.size() && o < 3; ++o) {
    const std::vector<int64_t> want =
        o == 0 ? rnn_y_shape<int64_t>(spec_, S, B, H) : rnn_state_shape<int64_t>(spec_, B, H);
    if (out[o].present() && out[o].shape != want)
      return KILN_ERROR("{}: output {} has shape {}, expected {}", n.label(), o,
                        shape_str(out[o].shape), shape_str(want));
  }
  if (S == 0 || B == 0) return size_t{256};
  if (!rnn_) {
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateRNNDescriptor(&rnn_), "cudnnCreateRNNDescriptor"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateRNNDataDescriptor(&x_), "cudnnCreateRNNData"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateRNNDataDescriptor(&y_), "cudnnCreateRNNData"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateTensorDescriptor(&h_), "cudnnCreateTensor"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateTensorDescriptor(&m_), "cudnnCreateTensor"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateTensorDescriptor(&b_), "cudnnCreateTensor"));
  }
  const cudnnDataType_t dt = t_ == DataType::kFloat16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  // Strict FP32 keeps cuDNN off the tensor cores, TF32 lets it round to TF32, FP16 uses them.
  const cudnnMathType_t math = precision_ == Precision::kFP32   ? CUDNN_FMA_MATH
                               : precision_ == Precision::kTF32 ? CUDNN_DEFAULT_MATH
                                                                : CUDNN_TENSOR_OP_MATH;
  cudnnRNNMode_t mode = CUDNN_LSTM;
  if (spec_.cell == RnnCell::kGru) mode = CUDNN_GRU;
  if (spec_.cell == RnnCell::kRnn)
    mode = spec_.acts[0].kind == RnnAct::kRelu ? CUDNN_RNN_RELU : CUDNN_RNN_TANH;
  KILN_RETURN_IF_ERROR(cudnn_check(
      cudnnSetRNNDescriptor_v8(rnn_, CUDNN_RNN_ALGO_STANDARD, mode, CUDNN_RNN_DOUBLE_BIAS,
                               D == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
                               CUDNN_LINEAR_INPUT, dt, CUDNN_DATA_FLOAT, math, static_cast<int>(I),
                               static_cast<int>(H), static_cast<int>(H), 1, nullptr,
                               CUDNN_RNN_PADDED_IO_ENABLED),
      "cudnnSetRNNDescriptor_v8"));
  const std::vector<int> lens(static_cast<size_t>(B), static_cast<int>(S));
  const cudnnRNNDataLayout_t layout = spec_.batch_first ? CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
                                                        : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED;
  KILN_RETURN_IF_ERROR(cudnn_check(
      cudnnSetRNNDataDescriptor(x_, dt, layout, static_cast<int>(S), static_cast<int>(B),
                                static_cast<int>(I), lens.data(), nullptr),
      "cudnnSetRNNDataDescriptor(x)"));
  KILN_RETURN_IF_ERROR(cudnn_check(
      cudnnSetRNNDataDescriptor(y_, dt, layout, static_cast<int>(S), static_cast<int>(B),
                                static_cast<int>(D * H), lens.data(), nullptr),
      "cudnnSetRNNDataDescriptor(y)"));
  const int hd[3] = {static_cast<int>(D), static_cast<int>(B), static_cast<int>(H)};
  const int hs[3] = {static_cast<int>(B * H), static_cast<int>(H), 1};
  KILN_RETURN_IF_ERROR(
      cudnn_check(cudnnSetTensorNdDescriptor(h_, dt, 3, hd, hs), "cudnnSetTensorNdDescriptor"));
  KILN_RETURN_IF_ERROR(cudnn_check(cudnnGetRNNWeightSpaceSize(rc.cudnn, rnn_, &weight_bytes_),
                                   "cudnnGetRNNWeightSpaceSize"));
  size_t reserve = 0;
  KILN_RETURN_IF_ERROR(
      cudnn_check(cudnnGetRNNTempSpaceSizes(rc.cudnn, rnn_, CUDNN_FWD_MODE_INFERENCE, x_,
                                            &temp_bytes_, &reserve),
                  "cudnnGetRNNTempSpaceSizes"));
  swap_y_ = !spec_.batch_first && D == 2 && B > 1;
  swap_states_ = spec_.batch_first && D == 2 && B > 1;
  const size_t es = dtype_size(t_), state = static_cast<size_t>(D * B * H) * es;
  size_t need = align256(weight_bytes_) + align256(temp_bytes_) +
                align256(static_cast<size_t>(B) * sizeof(int32_t)) +
                align256(static_cast<size_t>(S * B * D * H) * es) + 4 * align256(state);
  if (need > rc.workspace_limit)
    return KILN_ERROR("{}: cuDNN's RNN needs {} MiB of workspace, the limit is {}", n.label(),
                      need >> 20, rc.workspace_limit >> 20);
  return need;
}

Status RnnCudnnLayer::fill_weights(const RunContext& rc, std::span<const DeviceTensor> in,
                                   void* space) {
  const Node& n = *node_;
  const int64_t I = z_.input, H = z_.hidden, G = spec_.gates();
  const size_t es = dtype_size(t_);
  // cuDNN's gate k is ONNX's gate order[k].
  static const int kLstm[] = {0, 2, 3, 1}, kGru[] = {1, 0, 2}, kRnn[] = {0};
  const int* order = spec_.cell == RnnCell::kLstm  ? kLstm
                     : spec_.cell == RnnCell::kGru ? kGru
                                                   : kRnn;
  const auto* W = static_cast<const uint8_t*>(in[1].data);
  const auto* R = static_cast<const uint8_t*>(in[2].data);
  const auto* Bp =
      in.size() > 3 && in[3].present() ? static_cast<const uint8_t*>(in[3].data) : nullptr;
  KILN_CUDA_CHECK(cudaMemsetAsync(space, 0, weight_bytes_, rc.stream));  // no B: zero biases
  for (int d = 0; d < spec_.num_dirs; ++d)
    for (int k = 0; k < G; ++k) {
      const int64_t g = order[k];
      for (int rec = 0; rec < 2; ++rec) {
        void *m = nullptr, *b = nullptr;
        KILN_RETURN_IF_ERROR(
            cudnn_check(cudnnGetRNNWeightParams(rc.cudnn, rnn_, d, weight_bytes_, space,
                                                k + rec * G, m_, &m, b_, &b),
                        "cudnnGetRNNWeightParams"));
        const int64_t cols = rec ? H : I;
        cudnnDataType_t mt;
        int nd = 0, dims[8] = {}, strides[8] = {};
        KILN_RETURN_IF_ERROR(cudnn_check(cudnnGetTensorNdDescriptor(m_, 8, &mt, &nd, dims, strides),
                                         "cudnnGetTensorNdDescriptor"));
        int64_t count = 1;
        for (int i = 0; i < nd; ++i) count *= dims[i];
        if (!m || !b || count != H * cols)
          return KILN_ERROR("{}: cuDNN's weight space does not hold a {}x{} matrix for gate {}",
                            n.label(), H, cols, k);
        const uint8_t* src = (rec ? R : W) + static_cast<size_t>((d * G + g) * H * cols) * es;
        KILN_CUDA_CHECK(cudaMemcpyAsync(m, src, static_cast<size_t>(H * cols) * es,
                                        cudaMemcpyDeviceToDevice, rc.stream));
        if (Bp) {
          const uint8_t* bsrc = Bp + static_cast<size_t>(d * 2 * G * H + rec * G * H + g * H) * es;
          KILN_CUDA_CHECK(cudaMemcpyAsync(b, bsrc, static_cast<size_t>(H) * es,
                                          cudaMemcpyDeviceToDevice, rc.stream));
        }
      }
    }
  return Status::Ok();
}

Status RnnCudnnLayer::run(const RunContext& rc, std::span<const DeviceTensor> in,
                          std::span<const DeviceTensor> out) {
  const int64_t S = z_.seq, B = z_.batch, H = z_.hidden, D = spec_.num_dirs;
  const size_t es = dtype_size(t_), state = static_cast<size_t>(D * B * H) * es;
  auto opt_in = [&](size_t i) { return in.size() > i && in[i].present() ? in[i].data : nullptr; };
  auto opt_out = [&](size_t i) {
    return out.size() > i && out[i].present() ? out[i].data : nullptr;
  };
  const bool lstm = spec_.cell == RnnCell::kLstm;
  void *yh = opt_out(1), *yc = lstm ? opt_out(2) : nullptr;
  if (S == 0 || B == 0) {  // no step: zero states, as for a sequence of length 0
    for (void* p : {yh, yc})
      if (p) KILN_CUDA_CHECK(cudaMemsetAsync(p, 0, state, rc.stream));
    return Status::Ok();
  }
  cudaStream_t bound = nullptr;
  KILN_RETURN_IF_ERROR(cudnn_check(cudnnGetStream(rc.cudnn, &bound), "cudnnGetStream"));
  if (bound != rc.stream)
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnSetStream(rc.cudnn, rc.stream), "cudnnSetStream"));
  uint8_t* ws = static_cast<uint8_t*>(rc.workspace);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    uint8_t* q = ws + off;
    off += align256(bytes);
    return q;
  };
  void* weights = take(weight_bytes_);
  void* temp = take(temp_bytes_);
  auto* lens = reinterpret_cast<int32_t*>(take(static_cast<size_t>(B) * sizeof(int32_t)));
  void* y_tmp = take(static_cast<size_t>(S * B * D * H) * es);
  void *hx_t = take(state), *cx_t = take(state), *hy_t = take(state), *cy_t = take(state);
  KILN_RETURN_IF_ERROR(fill_weights(rc, in, weights));
  fill_lengths_kernel<<<grid_for(B), kBlock, 0, rc.stream>>>(lens, B, static_cast<int32_t>(S));
  KILN_CUDA_LAUNCH_CHECK("rnn lengths");
  const void *hx = opt_in(5), *cx = lstm ? opt_in(6) : nullptr;
  if (swap_states_ && hx) {  // [B, D, H] -> cuDNN's [D, B, H]
    KILN_RETURN_IF_ERROR(swap_middle(hx, hx_t, t_, 1, B, D, H, rc.stream));
    hx = hx_t;
  }
  if (swap_states_ && cx) {
    KILN_RETURN_IF_ERROR(swap_middle(cx, cx_t, t_, 1, B, D, H, rc.stream));
    cx = cx_t;
  }
  void* y = opt_out(0);
  void* y_cudnn = !y || swap_y_ ? y_tmp : y;
  void* hy = yh && swap_states_ ? hy_t : yh;
  void* cy = yc && swap_states_ ? cy_t : yc;
  KILN_RETURN_IF_ERROR(
      cudnn_check(cudnnRNNForward(rc.cudnn, rnn_, CUDNN_FWD_MODE_INFERENCE, lens, x_, in[0].data,
                                  y_, y_cudnn, h_, hx, hy, h_, cx, cy, weight_bytes_, weights,
                                  temp_bytes_, temp, 0, nullptr),
                  "cudnnRNNForward"));
  if (y && swap_y_)  // [S, B, D, H] -> [S, D, B, H]
    KILN_RETURN_IF_ERROR(swap_middle(y_cudnn, y, t_, S, B, D, H, rc.stream));
  if (swap_states_) {  // [D, B, H] -> [B, D, H]
    if (yh) KILN_RETURN_IF_ERROR(swap_middle(hy, yh, t_, 1, D, B, H, rc.stream));
    if (yc) KILN_RETURN_IF_ERROR(swap_middle(cy, yc, t_, 1, D, B, H, rc.stream));
  }
  return Status::Ok();
}

}  // namespace

bool rnn_cudnn_supports(const LayerDesc& d, std::string* why) {
  if (!rnn_common_supports(d, why)) return false;
  auto spec = read_rnn_spec(*d.node);
  const RnnSpec& s = *spec;
  if (s.has_clip || s.input_forget) return *why = "cuDNN has no clip or input_forget", false;
  if (s.cell == RnnCell::kGru && !s.linear_before_reset)
    return *why = "cuDNN's GRU is linear_before_reset 1", false;
  auto has = [&](size_t i) { return d.in.size() > i && d.in[i].present(); };
  if (has(4)) return *why = "sequence_lens is a run-time input; cuDNN takes it on the host", false;
  if (s.cell == RnnCell::kLstm && has(7)) return *why = "cuDNN has no peepholes", false;
  const RnnAct defaults[3] = {RnnAct::kSigmoid, RnnAct::kTanh, RnnAct::kTanh};
  for (int dir = 0; dir < s.num_dirs; ++dir)
    for (int k = 0; k < s.acts_per_dir(); ++k) {
      const RnnAct a = s.act(dir, k).kind;
      const bool ok = s.cell == RnnCell::kRnn
                          ? a == s.acts[0].kind && (a == RnnAct::kTanh || a == RnnAct::kRelu)
                          : a == defaults[k];
      if (!ok) return *why = "cuDNN's cells have their default activations only", false;
    }
  return true;
}

Expected<std::unique_ptr<Layer>> create_rnn_cudnn(const LayerDesc& d) {
  KILN_ASSIGN_OR_RETURN(RnnSpec spec, read_rnn_spec(*d.node));
  return std::unique_ptr<Layer>(new RnnCudnnLayer(d, spec));
}

}  // namespace kiln::gpu
