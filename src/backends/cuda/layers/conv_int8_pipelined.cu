// The pipelined INT8 convolution (tactic conv_int8.pipelined): kiln.FusedConv int8 = 1 as an
// implicit GEMM Y[M][K] = X'[M][R*S*C] * W[K][R*S*C]^T over NHWC pixels, for C and K multiples of
// 64, Y int8 and the residual int8 or absent (an INT8 chain's layers). Built around the bytes,
// since ResNet's INT8 layers are memory-bound or close to it and the libraries' fused INT8
// epilogues read the residual slowly (the fifth session's profile: their expand layers ran at
// 0.8x FP16, their stage-1 3x3 at 0.34x):
//   - each step is one filter tap and 64 input channels: the X rows of the tile's 128 pixels
//     (shifted by the tap; zero-filled outside the image) and the W rows of its N channels arrive
//     by cp.async in 16-byte chunks into two buffers, so the next step loads while the tensor
//     cores multiply this one (mma.sync m16n8k32 s8, fragments as in conv_int8.cu);
//   - the block's residual tile (128 pixels x N channels, int8) is fetched by cp.async at the
//     start, overlapping the whole reduction;
//   - the epilogue (epilogue_value's arithmetic, the CPU reference's codes) reads the residual
//     from shared memory and writes the int8 result in its place, two channels per access, with
//     the channel scales and biases staged in shared memory, the activation compiled in, no
//     conversion instruction and the quantizing division done by a multiply except near a
//     rounding boundary; the tile then leaves in 16-byte coalesced stores.
#include "layers/conv_int8_pw.cuh"

namespace kiln::gpu {
namespace {

constexpr int kPwM = 128;          // pixels per block
constexpr int kPwStep = 64;        // reduction bytes (input channels) per step
constexpr int kPwRowWords = 20;    // 16 words + 4 of padding: conflict-free fragment reads
constexpr int kPwThreads = 256;    // 8 warps: 4 along the pixels x 2 along the channels
constexpr int kPwOutPad = 16;      // bytes of padding per residual/output tile row

template <int N>
constexpr int smem_bytes() {
  return 2 * kPwM * kPwRowWords * 4 + 2 * N * kPwRowWords * 4 + kPwM * (N + kPwOutPad) + N * 8;
}

// N: output channels per block (128, or 64 when K is not a multiple of 128); Act: a PwAct;
// SmallAcc: the reduction has at most 256 products (R * S * C <= 256), so |acc| <= 2^22.
template <int N, int Act, bool SmallAcc>
__global__ void __launch_bounds__(kPwThreads)
    int8_pipelined(const int8_t* __restrict__ x, const int8_t* __restrict__ w,
                   int8_t* __restrict__ y, Int8Geom g, Int8Epilogue e) {
  const int M = g.M, K = g.K, C = g.C4 * 4;
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem);  // [2][kPwM][kPwRowWords]
  uint32_t* ws = xs + 2 * kPwM * kPwRowWords;        // [2][N][kPwRowWords]
  int8_t* zy = reinterpret_cast<int8_t*>(ws + 2 * N * kPwRowWords);  // [kPwM][kZyRow]
  constexpr int kZyRow = N + kPwOutPad;
  float* sb = reinterpret_cast<float*>(zy + kPwM * kZyRow);  // [N][2]: scale, bias
  static_assert(kPwM * kZyRow % 16 == 0, "the scale/bias table must stay 16-byte aligned");
  constexpr int kRowChunks = N / 16;
  constexpr int NI = N / 16;  // 8-channel mma columns per warp (a warp covers N / 2 channels)
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Channel blocks vary fastest: the blocks that share an X tile run together and read it from L2.
  const int m0 = blockIdx.y * kPwM, k0 = blockIdx.x * N;
  const auto* z = static_cast<const int8_t*>(e.z);
  // Read before the epilogue, after the main loop's barriers.
  for (int i = tid; i < N; i += kPwThreads) {
    sb[2 * i] = e.scale[k0 + i];
    sb[2 * i + 1] = e.bias ? e.bias[k0 + i] : 0.f;
  }
  if (z)
    for (int i = tid; i < kPwM * kRowChunks; i += kPwThreads) {
      const int r = i / kRowChunks, c = i % kRowChunks;
      const bool ok = m0 + r < M;
      cp_async16(zy + r * kZyRow + c * 16,
                 z + static_cast<int64_t>(ok ? m0 + r : 0) * K + k0 + c * 16, ok);
    }
  // This thread's X chunks: chunk tid % 4 of tile rows tid / 4 and tid / 4 + 64, whose output
  // pixels (n, p, q) read input row n * H + p * sh - ph + r * dh, column q * sw - pw + s * dw.
  int nh[2], ih0[2], iw0[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int m = m0 + tid / 4 + 64 * j;
    nh[j] = -1;
    ih0[j] = iw0[j] = 0;
    if (m < M) {
      const int q = m % g.Q, p = (m / g.Q) % g.P;
      nh[j] = (m / (g.Q * g.P)) * g.H;
      ih0[j] = p * g.sh - g.ph;
      iw0[j] = q * g.sw - g.pw;
    }
  }
  const int cblocks = C / kPwStep, rsc = g.R * g.S * C;
  auto load_step = [&](int buf, int step) {
    const int rs = step / cblocks, c0 = (step % cblocks) * kPwStep + (tid % 4) * 16;
    const int dh = (rs / g.S) * g.dh, dw = (rs % g.S) * g.dw;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int ih = ih0[j] + dh, iw = iw0[j] + dw;
      const bool ok = nh[j] >= 0 && ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
      const int64_t pixel = ok ? (static_cast<int64_t>(nh[j] + ih) * g.W + iw) : 0;
      cp_async16(xs + (buf * kPwM + tid / 4 + 64 * j) * kPwRowWords + (tid % 4) * 4,
                 x + pixel * C + c0, ok);
    }
    for (int i = tid; i < N * 4; i += kPwThreads) {
      const int r = i / 4;
      cp_async16(ws + (buf * N + r) * kPwRowWords + (i % 4) * 4,
                 w + static_cast<int64_t>(k0 + r) * rsc + rs * C + (step % cblocks) * kPwStep +
                     (i % 4) * 16,
                 true);
    }
  };
  const int steps = g.R * g.S * cblocks;
  load_step(0, 0);
  cp_async_commit();  // the residual tile and step 0
  int32_t acc[2][NI][4] = {};
  const int wm = (warp % 4) * 32, wn = (warp / 4) * (N / 2);
  for (int s = 0; s < steps; ++s) {
    const int cur = s & 1;
    if (s + 1 < steps) {
      // The other buffer was last read in step s - 1, which every warp finished before the
      // barrier that ended it.
      load_step(cur ^ 1, s + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t* xb = xs + cur * kPwM * kPwRowWords;
    const uint32_t* wb = ws + cur * N * kPwRowWords;
#pragma unroll
    for (int o = 0; o < kPwStep / 4; o += 8)  // two k32 steps
      pw_mma_k32<NI>(acc, xb, kPwRowWords, wb, kPwRowWords, o, wm, wn, lane);
    __syncthreads();
  }
  // The residual landed with the last wait. Each pair of adjacent channels of the tile belongs to
  // one thread, which reads its two residual codes and writes its two output codes in their place
  // (16-bit shared accesses, conflict-free with the padded rows). The arithmetic is
  // epilogue_value's, with the per-channel scale and bias from shared memory, and written for the
  // instruction count, since the epilogue, not memory, bounded this kernel's 1x1 layers on the H100
  // (its conversions run at a quarter of the float rate; docs/perf.md): the accumulator and the
  // residual codes become floats without the conversion unit, the activation is resolved at compile
  // time (ReLU folded into the quantizing clamp), and the quantizing division is a multiply that
  // divides only near a rounding boundary (quantize_pair_inv): the same codes.
  pw_epilogue<Act, SmallAcc>(acc, zy, kZyRow, sb, wm, wn, lane, e, z != nullptr);
  __syncthreads();
  for (int i = tid; i < kPwM * kRowChunks; i += kPwThreads) {
    const int r = i / kRowChunks, c = i % kRowChunks;
    if (m0 + r < M)
      *reinterpret_cast<int4*>(y + static_cast<int64_t>(m0 + r) * K + k0 + c * 16) =
          *reinterpret_cast<const int4*>(zy + r * kZyRow + c * 16);
  }
}

template <int N, int Act, bool SmallAcc>
void launch_one(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                const Int8Epilogue& e, cudaStream_t stream) {
  int8_pipelined<N, Act, SmallAcc>
      <<<dim3(g.K / N, (g.M + kPwM - 1) / kPwM), kPwThreads, smem_bytes<N>(), stream>>>(x, w, y, g, e);
}

template <int N>
const char* launch(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                   const Int8Epilogue& e, cudaStream_t stream) {
  const bool small = g.KW * 4 <= 256;  // |acc| <= 2^22: no conversion unit for it
  if (e.act.act == Act::kNone)
    small ? launch_one<N, kPwNone, true>(x, w, y, g, e, stream)
          : launch_one<N, kPwNone, false>(x, w, y, g, e, stream);
  else if (e.act.act == Act::kRelu)
    small ? launch_one<N, kPwRelu, true>(x, w, y, g, e, stream)
          : launch_one<N, kPwRelu, false>(x, w, y, g, e, stream);
  else  // any other activation: apply_act at run time, the accumulator converted by I2F
    launch_one<N, kPwAny, false>(x, w, y, g, e, stream);
  return "";
}

template <int N, int Act, bool SmallAcc>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(int8_pipelined<N, Act, SmallAcc>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<N>());
}

template <int N>
cudaError_t allow_smem_all() {
  for (cudaError_t e : {allow_smem<N, kPwNone, true>(), allow_smem<N, kPwRelu, true>(),
                        allow_smem<N, kPwNone, false>(), allow_smem<N, kPwRelu, false>(),
                        allow_smem<N, kPwAny, false>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace

cudaError_t prepare_int8_pipelined() {
  // Over the default 48 KiB of dynamic shared memory: an opt-in per kernel and device, made at
  // configure time (not while a run may be captured into a CUDA graph).
  const cudaError_t e = allow_smem_all<128>();
  return e != cudaSuccess ? e : allow_smem_all<64>();
}

const char* launch_int8_pipelined(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                                  const Int8Epilogue& e, int tile_n, cudaStream_t stream) {
  if (g.C4 * 4 % kPwStep != 0 || g.K % tile_n != 0 || (tile_n != 64 && tile_n != 128))
    return "C must be a multiple of 64 and K of the tile's channels (64 or 128)";
  if ((static_cast<int64_t>(g.M) + kPwM - 1) / kPwM > 65535) return "too many output pixels";
  if (e.z && e.z_type != DataType::kInt8) return "the residual is not int8";
  if (e.alpha != 1.f) return "Gemm's alpha (convolutions only)";
  if (!aligned16(x) || !aligned16(w) || !aligned16(y) || (e.z && !aligned16(e.z)))
    return "a tensor is not 16-byte aligned";
  return tile_n == 128 ? launch<128>(x, w, y, g, e, stream) : launch<64>(x, w, y, g, e, stream);
}

}  // namespace kiln::gpu
