// kiln.Relayout: a region of layout ops (Transpose, the Reshape family, Slice, Concat, Pad,
// Expand) as one gather. Each thread takes one output element, or 16 bytes of them along the
// last axis where every step keeps that axis whole, and walks the region backwards from its
// result: each step maps the coordinates in its output to those in its input (a Concat picks
// the part that holds them, a Pad may answer its value), until they land in one of the layer's
// inputs, which is read once. The spec is the CPU's, which runs the ops (src/ops/fused_relayout.cpp).
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kernels/device_util.cuh"
#include "kernels/fast_div.cuh"
#include "ops/fused.h"
#include "ops/relayout_types.h"
#include "tactics.h"

namespace kiln::gpu {

namespace movement_detail {  // defined in movement.cu
bool movable_type(DataType t);
std::vector<int64_t> storage_strides(const DeviceTensor& t);
uint64_t value_bits(const Tensor& v, DataType t);
}  // namespace movement_detail

namespace {

using namespace movement_detail;

constexpr int kMaxSteps = 12, kMaxRank = 8, kMaxInputs = 8, kMaxParts = 8;

enum Kind : int32_t { kTranspose, kReshape, kSlice, kConcat, kPad, kExpand };

struct Step {
  int32_t kind = kReshape, in_rank = 0, out_rank = 0, nparts = 1, axis = 0;
  // Where the data comes from (per part for a Concat): >= 0 layer input, < 0 step -1 - next.
  int32_t next[kMaxParts] = {};
  int32_t perm[kMaxRank] = {};                 // Transpose: input axis perm[i] is output axis i
  int64_t in_dims[kMaxRank] = {}, out_dims[kMaxRank] = {};
  FastDiv in_div[kMaxRank];                    // Reshape: in_dims as divisors
  int64_t start[kMaxRank] = {}, step[kMaxRank] = {};  // Slice: in = start + out * step;
                                               // Pad: in = out - start, outside: the value
  int64_t offs[kMaxParts + 1] = {};            // Concat: the parts' first indices along axis
  uint64_t pad_bits = 0;                       // Pad: its value's storage bits
};

// Everything a launch needs, by value (about 7 KB of kernel parameters: sm_70 and later with
// CUDA 12.1+ take up to 32 KB; the kernel reads it as __grid_constant__).
struct Program {
  int32_t nsteps = 0, out_rank = 0;
  Step steps[kMaxSteps];
  const void* in[kMaxInputs] = {};
  int64_t in_strides[kMaxInputs][kMaxRank] = {};
  int64_t out_dims[kMaxRank] = {};  // row-major: the tactic takes no other output layout
  FastDiv out_div[kMaxRank];
};

template <bool Small>
__device__ __forceinline__ int64_t divmod(int64_t& n, const FastDiv& f, int64_t d) {
  if constexpr (Small) {
    const uint32_t q = f.div(static_cast<uint32_t>(n));
    const int64_t r = n - static_cast<int64_t>(q) * d;
    n = q;
    return r;
  } else {
    const int64_t r = n % d;
    n /= d;
    return r;
  }
}

// Coordinate arrays stay in registers only if every index into them is known at compile time:
// the loops below run over all kMaxRank axes, unrolled, with the rank as a guard, and a
// permutation or a Concat axis picks its coordinate by comparison (a dynamic index would put
// the arrays in local memory, several times slower than the copy itself).
template <typename I>
__device__ __forceinline__ I pick(const I (&c)[kMaxRank], int k) {
  I v = 0;
#pragma unroll
  for (int i = 0; i < kMaxRank; ++i) v += static_cast<I>(i == k) * c[i];
  return v;
}

// Maps output coordinates c back to an input element: returns its input and sets *off to its
// element offset, or returns -1 with *bits the padding value it lands on. I: int32 coordinates
// where every tensor of the walk has fewer than 2^31 elements (Small), else int64.
template <bool Small>
__device__ __forceinline__ int walk(const Program& p, int64_t (&c64)[kMaxRank], int64_t* off,
                                     uint64_t* bits) {
  using I = std::conditional_t<Small, int32_t, int64_t>;
  I c[kMaxRank];
#pragma unroll
  for (int i = 0; i < kMaxRank; ++i) c[i] = static_cast<I>(c64[i]);
  int s = p.nsteps - 1;
  for (int guard = 0; guard < kMaxSteps; ++guard) {
    const Step& st = p.steps[s];
    int next = st.next[0];
    switch (st.kind) {
      case kTranspose: {
        I t[kMaxRank];
#pragma unroll
        for (int j = 0; j < kMaxRank; ++j) {
          t[j] = 0;
#pragma unroll
          for (int i = 0; i < kMaxRank; ++i) t[j] += static_cast<I>(i < st.out_rank && st.perm[i] == j) * c[i];
        }
#pragma unroll
        for (int i = 0; i < kMaxRank; ++i) c[i] = t[i];
        break;
      }
      case kReshape: {
        I lin = 0;
#pragma unroll
        for (int i = 0; i < kMaxRank; ++i)
          if (i < st.out_rank) lin = lin * static_cast<I>(st.out_dims[i]) + c[i];
#pragma unroll
        for (int i = kMaxRank - 1; i >= 0; --i) {
          if (i >= st.in_rank) continue;
          if constexpr (Small) {
            const I q = static_cast<I>(st.in_div[i].div(static_cast<uint32_t>(lin)));
            c[i] = lin - q * static_cast<I>(st.in_dims[i]);
            lin = q;
          } else {
            c[i] = lin % st.in_dims[i];
            lin /= st.in_dims[i];
          }
        }
        break;
      }
      case kSlice:
#pragma unroll
        for (int i = 0; i < kMaxRank; ++i)
          if (i < st.in_rank) c[i] = static_cast<I>(st.start[i] + c[i] * st.step[i]);
        break;
      case kPad: {
        bool outside = false;
#pragma unroll
        for (int i = 0; i < kMaxRank; ++i) {
          if (i >= st.in_rank) continue;
          c[i] -= static_cast<I>(st.start[i]);
          outside |= c[i] < 0 || c[i] >= st.in_dims[i];
        }
        if (outside) {
          *bits = st.pad_bits;
          return -1;
        }
        break;
      }
      case kExpand: {
        const int shift = st.out_rank - st.in_rank;
        I t[kMaxRank];
#pragma unroll
        for (int i = 0; i < kMaxRank; ++i) t[i] = i < st.in_rank && st.in_dims[i] != 1 ? pick(c, i + shift) : 0;
#pragma unroll
        for (int i = 0; i < kMaxRank; ++i) c[i] = t[i];
        break;
      }
      case kConcat: {
        const I a = pick(c, st.axis);
        int k = 0;
        while (k + 1 < st.nparts && a >= st.offs[k + 1]) ++k;
        const I shift = static_cast<I>(st.offs[k]);
#pragma unroll
        for (int i = 0; i < kMaxRank; ++i) c[i] -= static_cast<I>(i == st.axis) * shift;
        next = st.next[k];
        break;
      }
    }
    if (next >= 0) {
      int64_t o = 0;
#pragma unroll
      for (int i = 0; i < kMaxRank; ++i)
        if (i < st.in_rank) o += static_cast<int64_t>(c[i]) * p.in_strides[next][i];
      *off = o;
      return next;
    }
    s = -1 - next;
  }
  return -2;  // unreachable for a program configure() built
}

// U: what one thread moves (one element, or 16 bytes of E-byte elements along the last axis).
template <typename U, int E, bool Small>
__global__ void relayout_kernel(const __grid_constant__ Program p, U* __restrict__ y,
                                int64_t units) {
  constexpr int kPer = static_cast<int>(sizeof(U)) / E;
  KILN_GRID_STRIDE(u, units) {
    int64_t c[kMaxRank] = {};
    int64_t e = u * kPer;
#pragma unroll
    for (int k = kMaxRank - 1; k >= 0; --k)
      if (k < p.out_rank) c[k] = divmod<Small>(e, p.out_div[k], p.out_dims[k]);
    int64_t off = 0;
    uint64_t bits = 0;
    const int from = walk<Small>(p, c, &off, &bits);
    U v;
    if (from >= 0) {
      v = static_cast<const U*>(p.in[from])[off / kPer];
    } else {
      unsigned char b[sizeof(U)];
      for (int i = 0; i < kPer; ++i) memcpy(b + i * E, &bits, E);
      memcpy(&v, b, sizeof(U));
    }
    y[u] = v;
  }
}

std::vector<int64_t> ints_of(const Tensor* t) { return t ? t->to_int64_vector() : std::vector<int64_t>{}; }

class RelayoutLayer : public Layer {
 public:
  explicit RelayoutLayer(const LayerDesc& d) : node_(d.node) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    std::vector<TensorType> types;
    for (size_t i = 0; i < in.size(); ++i) {
      std::vector<Dim> dims(in[i].shape.begin(), in[i].shape.end());
      types.emplace_back(n.input(i)->type.dtype, std::move(dims));
    }
    if (!types_) {  // prepared once: a loop body configures the layer at every new shape
      KILN_ASSIGN_OR_RETURN(types_, RelayoutTypes::prepare(n, in.size()));
    }
    KILN_ASSIGN_OR_RETURN(std::vector<TensorType> st, types_->infer(types));
    const auto ops = n.attrs.get_strings("ops");
    const auto arity = n.attrs.get_ints("arity");
    const auto operands = n.attrs.get_ints("operands");
    if (ops.size() > static_cast<size_t>(kMaxSteps) || in.size() > static_cast<size_t>(kMaxInputs))
      return KILN_ERROR("{}: {} steps over {} inputs (at most {} over {})", n.label(), ops.size(),
                        in.size(), kMaxSteps, kMaxInputs);
    auto dims_of = [&](int64_t o) -> std::vector<int64_t> {
      if (o >= 0) return in[static_cast<size_t>(o)].shape;
      std::vector<int64_t> d;
      for (const Dim& x : *st[static_cast<size_t>(-2 - o)].dims) d.push_back(x.value);
      return d;
    };
    auto rank_ok = [](size_t r) { return r <= static_cast<size_t>(kMaxRank); };
    Program& p = prog_;
    p = Program{};
    p.nsteps = static_cast<int32_t>(ops.size());
    vector_ok_ = true;
    size_t k = 0;
    for (size_t s = 0; s < ops.size(); ++s) {
      Step& x = p.steps[s];
      const int64_t* opd = &operands[k];
      k += static_cast<size_t>(arity[s]);
      const std::vector<int64_t> idims = dims_of(opd[0]);
      std::vector<int64_t> odims;
      for (const Dim& d : *st[s].dims) odims.push_back(d.value);
      if (!rank_ok(idims.size()) || !rank_ok(odims.size()))
        return KILN_ERROR("{}: step {} has a rank over {}", n.label(), s, kMaxRank);
      x.in_rank = static_cast<int32_t>(idims.size());
      x.out_rank = static_cast<int32_t>(odims.size());
      for (size_t i = 0; i < idims.size(); ++i) {
        x.in_dims[i] = idims[i];
        x.in_div[i] = FastDiv(idims[i]);
        x.step[i] = 1;
      }
      for (size_t i = 0; i < odims.size(); ++i) x.out_dims[i] = odims[i];
      auto code = [](int64_t o) { return static_cast<int32_t>(o >= 0 ? o : -1 - (-2 - o)); };
      x.next[0] = code(opd[0]);
      auto konst = [&](int j) -> const Tensor* {
        const Attribute* a = n.attrs.find(fmt::format("s{}_c{}", s, j));
        return j < arity[s] && a ? a->t.get() : nullptr;
      };
      const bool last_kept = !idims.empty() && !odims.empty() && idims.back() == odims.back();
      const std::string& op = ops[s];
      const int64_t r = x.in_rank;
      if (op == "Transpose") {
        x.kind = kTranspose;
        std::vector<int64_t> perm = n.attrs.get_ints(fmt::format("s{}_perm", s));
        if (perm.empty())
          for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
        for (size_t i = 0; i < perm.size() && i < static_cast<size_t>(kMaxRank); ++i)
          x.perm[i] = static_cast<int32_t>(perm[i] < 0 ? perm[i] + r : perm[i]);
        vector_ok_ &= r > 0 && x.perm[r - 1] == r - 1;
      } else if (op == "Slice") {
        x.kind = kSlice;
        const auto starts = ints_of(konst(1)), ends = ints_of(konst(2));
        auto axes = ints_of(konst(3));
        auto steps = ints_of(konst(4));
        if (axes.empty())
          for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
        if (steps.empty()) steps.assign(starts.size(), 1);
        if (starts.size() != axes.size() || steps.size() != axes.size() || ends.size() != axes.size())
          return KILN_ERROR("{}: step {} (Slice) has parameters of different lengths", n.label(), s);
        for (size_t i = 0; i < axes.size(); ++i) {
          const int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
          if (a < 0 || a >= r || steps[i] == 0)
            return KILN_ERROR("{}: step {} (Slice) has a bad axis or step", n.label(), s);
          const int64_t d = idims[static_cast<size_t>(a)];
          int64_t b = starts[i] < 0 ? starts[i] + d : starts[i];
          b = steps[i] > 0 ? std::clamp<int64_t>(b, 0, d) : std::clamp<int64_t>(b, 0, d - 1);
          x.start[a] = b;
          x.step[a] = steps[i];
        }
        vector_ok_ &= last_kept && x.start[r - 1] == 0 && x.step[r - 1] == 1;
      } else if (op == "Pad") {
        x.kind = kPad;
        const auto pads = ints_of(konst(1));
        if (pads.size() != static_cast<size_t>(2 * r))
          return KILN_ERROR("{}: step {} (Pad) has {} pads for rank {}", n.label(), s,
                            pads.size(), r);
        for (int64_t i = 0; i < r; ++i) x.start[i] = pads[static_cast<size_t>(i)];
        if (const Tensor* v = konst(2); v && v->numel() > 0)
          x.pad_bits = value_bits(*v, out[0].dtype);
        vector_ok_ &= r > 0 && pads[static_cast<size_t>(r - 1)] == 0 && pads.back() == 0;
      } else if (op == "Expand") {
        x.kind = kExpand;
        vector_ok_ &= last_kept;
      } else if (op == "Concat") {
        x.kind = kConcat;
        x.nparts = static_cast<int32_t>(arity[s]);
        if (x.nparts > kMaxParts)
          return KILN_ERROR("{}: step {} concatenates {} parts (at most {})", n.label(), s,
                            x.nparts, kMaxParts);
        const int64_t axis = n.attrs.get_int(fmt::format("s{}_axis", s), 0);
        x.axis = static_cast<int32_t>(axis < 0 ? axis + r : axis);
        if (x.axis < 0 || x.axis >= r)
          return KILN_ERROR("{}: step {} (Concat) axis {} for rank {}", n.label(), s, axis, r);
        for (int j = 0; j < x.nparts; ++j) {
          x.next[j] = code(opd[j]);
          x.offs[j + 1] = x.offs[j] + dims_of(opd[j])[static_cast<size_t>(x.axis)];
        }
        vector_ok_ &= x.axis != r - 1;
      } else {  // Reshape, Squeeze, Unsqueeze, Flatten: the same elements in row-major order
        x.kind = kReshape;
        vector_ok_ &= last_kept;
      }
    }
    for (size_t i = 0; i < in.size(); ++i) {
      const auto s = storage_strides(in[i]);
      for (size_t j = 0; j < s.size() && j < static_cast<size_t>(kMaxRank); ++j)
        p.in_strides[i][j] = s[j];
      vector_ok_ &= in[i].layout == Layout::kLinear;
    }
    const DeviceTensor& y = out[0];
    if (!rank_ok(y.shape.size())) return KILN_ERROR("{}: output rank over {}", n.label(), kMaxRank);
    p.out_rank = static_cast<int32_t>(y.shape.size());
    if (y.layout != Layout::kLinear) return KILN_ERROR("{}: the output is not row-major", n.label());
    for (size_t k2 = 0; k2 < y.shape.size(); ++k2) {
      p.out_dims[k2] = y.shape[k2];
      p.out_div[k2] = FastDiv(p.out_dims[k2]);
    }
    esize_ = static_cast<int>(dtype_size(y.dtype));
    numel_ = y.numel();
    vector_ok_ &= y.layout == Layout::kLinear && y.rank() > 0 &&
                  y.shape.back() % (16 / esize_) == 0;
    // 32-bit index arithmetic where every tensor the walk passes through (an Expand may make an
    // intermediate bigger than the inputs and the output) has fewer than 2^31 elements.
    int64_t biggest = numel_;
    for (const DeviceTensor& t : in) biggest = std::max(biggest, t.numel());
    for (const TensorType& t : st) {
      int64_t e = 1;
      for (const Dim& d : *t.dims) e *= d.value;
      biggest = std::max(biggest, e);
    }
    small_ = biggest < (int64_t{1} << 31);
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (numel_ == 0) return Status::Ok();
    bool aligned = reinterpret_cast<uintptr_t>(out[0].data) % 16 == 0;
    for (size_t i = 0; i < in.size(); ++i) {
      prog_.in[i] = in[i].data;
      aligned &= reinterpret_cast<uintptr_t>(in[i].data) % 16 == 0;
    }
    const bool vec = vector_ok_ && aligned;
    const int64_t units = vec ? numel_ * esize_ / 16 : numel_;
    const unsigned grid = grid_for(units);
    auto launch = [&](auto unit, auto e) {
      using U = decltype(unit);
      constexpr int E = decltype(e)::value;
      if (small_)
        relayout_kernel<U, E, true><<<grid, kBlock, 0, rc.stream>>>(prog_, static_cast<U*>(out[0].data), units);
      else
        relayout_kernel<U, E, false><<<grid, kBlock, 0, rc.stream>>>(prog_, static_cast<U*>(out[0].data), units);
    };
    switch (esize_) {
      case 1: vec ? launch(uint4{}, std::integral_constant<int, 1>{}) : launch(uint8_t{}, std::integral_constant<int, 1>{}); break;
      case 2: vec ? launch(uint4{}, std::integral_constant<int, 2>{}) : launch(uint16_t{}, std::integral_constant<int, 2>{}); break;
      case 4: vec ? launch(uint4{}, std::integral_constant<int, 4>{}) : launch(uint32_t{}, std::integral_constant<int, 4>{}); break;
      case 8: vec ? launch(uint4{}, std::integral_constant<int, 8>{}) : launch(uint64_t{}, std::integral_constant<int, 8>{}); break;
      default: return KILN_ERROR("{}: elements of {} bytes", node_->label(), esize_);
    }
    KILN_CUDA_LAUNCH_CHECK("relayout kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  std::unique_ptr<RelayoutTypes> types_;  // the steps' types, inferred per configure
  Program prog_;
  bool vector_ok_ = false, small_ = true;
  int esize_ = 0;
  int64_t numel_ = 0;
};

bool relayout_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  for (const TensorFormat& f : d.in)
    if (!f.present() || !movable_type(f.dtype))
      return *why = "an input is absent or of a type it cannot move", false;
  if (d.out.empty() || !movable_type(d.out[0].dtype)) return *why = "output type", false;
  const auto ops = n.attrs.get_strings("ops");
  const auto arity = n.attrs.get_ints("arity");
  if (ops.size() > static_cast<size_t>(kMaxSteps) || d.in.size() > static_cast<size_t>(kMaxInputs))
    return *why = fmt::format("{} steps over {} inputs (at most {} over {})", ops.size(),
                              d.in.size(), kMaxSteps, kMaxInputs),
           false;
  for (size_t s = 0; s < ops.size() && s < arity.size(); ++s) {
    if (ops[s] == "Concat" && arity[s] > kMaxParts)
      return *why = fmt::format("a Concat of {} parts (at most {})", arity[s], kMaxParts), false;
    if (ops[s] == "Pad" && (n.attrs.get_string(fmt::format("s{}_mode", s), "constant") != "constant" ||
                            n.attrs.has(fmt::format("s{}_c3", s))))
      return *why = "a Pad other than constant padding of every axis", false;
  }
  for (size_t i = 0; i < d.in.size(); ++i)
    if (d.in_type(i).rank() > kMaxRank) return *why = "an input's rank is over 8", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_relayout(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new RelayoutLayer(d));
}

// Row-major only: a region's index maps are over logical coordinates, and with the last axis
// contiguous in its inputs and output each thread moves 16 bytes (an NHWC-stored 4-D tensor
// would make every element a walk of its own; Swin's [B, H, W, C] tensors were so stored).
const TacticDef kTactics[] = {
    {"kiln", "Relayout", "relayout.gather", kF32 | kF16 | kF64, 0, relayout_supports,
     create_relayout},
};

}  // namespace

std::span<const TacticDef> relayout_tactics() { return kTactics; }

}  // namespace kiln::gpu
