// A vision transformer's patch embedding, a convolution whose kernel is its stride, becomes the
// GEMM it is:
//   Transpose(Reshape(Conv(x, W, b), [N, K, h*w]), [0, 2, 1])
//     =>  FusedGemm[MatMul](Reshape(Transpose(Reshape(x, [N, C, h, p, w, q]), [0, 2, 4, 1, 3, 5]),
//                                   [N, h*w, C*p*q]), W', b)
// with W' = W as [K, C*p*q], transposed at build time. Each patch is one row of the GEMM's A,
// and the result is the [N, patches, K] sequence the exporters build: ViT's 16x16 patches of
// RGB images, 768 values a row, which a convolution library runs as a poorly shaped
// convolution (cuDNN on an H100: 0.28 ms at batch 32 for a 6272 x 768 x 768 product). Small
// patches (Swin's and ConvNeXt's 4x4 stems, 48 values) stay convolutions, which move less
// data. N is copied by the reshapes (0), so a dynamic batch stays dynamic.
#include <algorithm>
#include <cstring>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// A patch of at least this many values makes the GEMM worth its transpose of the image.
constexpr int64_t kMinPatchValues = 256;

struct FoldPatchConv {
  struct Match {
    Node *conv, *reshape, *transpose;
    int64_t C, h, p, w, q, K;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& t) {
    if (!is_op(&t, "Transpose") || transpose_perm(t) != std::vector<int64_t>{0, 2, 1})
      return std::nullopt;
    Node* r = producer_if(t.input(0), "Reshape");
    if (!r || !single_use(ctx.g, r->output(0))) return std::nullopt;
    Node* conv = producer_if(r->input(0), "Conv");
    if (!conv || !single_use(ctx.g, conv->output(0))) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{}: {}", conv->label(), why));
      return std::nullopt;
    };
    const Value* wv = conv->input(1);
    if (!wv || !wv->is_constant() || wv->constant->rank() != 4)
      return reject("the filter is not a 4-D constant");
    const Value* bv = conv->input(2);
    const Tensor& W = *wv->constant;
    const int64_t K = W.dim(0), C = W.dim(1), p = W.dim(2), q = W.dim(3);
    if (bv && (!bv->is_constant() || bv->constant->numel() != K))
      return reject("the bias is not a constant of K values");
    const Attributes& a = conv->attrs;
    const std::string pad = a.get_string("auto_pad", "NOTSET");
    const std::vector<int64_t> pads = a.get_ints("pads", {0, 0, 0, 0});
    if (a.get_int("group", 1) != 1 || a.get_ints("strides", {1, 1}) != std::vector<int64_t>{p, q} ||
        a.get_ints("dilations", {1, 1}) != std::vector<int64_t>{1, 1} ||
        (pad != "NOTSET" && pad != "VALID") ||
        std::any_of(pads.begin(), pads.end(), [](int64_t v) { return v != 0; }))
      return reject("not a convolution whose stride is its kernel (no padding, groups, dilation)");
    if (C * p * q < kMinPatchValues) return reject("patches of fewer than 256 values");
    const TensorType &x = conv->input(0)->type, &y = t.output(0)->type;
    if (x.rank() != 4 || !is_float_type(x.dtype)) return reject("not a 2-D float convolution");
    const Dim &H = (*x.dims)[2], &Wd = (*x.dims)[3];
    if (!(*x.dims)[1].is_static() || (*x.dims)[1].value != C || !H.is_static() ||
        !Wd.is_static() || H.value % p != 0 || Wd.value % q != 0)
      return reject("the image's channels, height and width are not static multiples of the patch");
    const int64_t h = H.value / p, w = Wd.value / q;
    // The Reshape must merge the spatial dims: y is [N, h*w, K].
    if (y.rank() != 3 || !same_dim((*y.dims)[0], (*x.dims)[0]) || !same_dim((*y.dims)[1], Dim(h * w)) ||
        !same_dim((*y.dims)[2], Dim(K)))
      return reject("the reshape does not flatten the patches into [N, K, h*w]");
    Attributes fa;
    fa.set("base", Attribute::String("MatMul"));
    if (!ctx.backend_supports("kiln", "FusedGemm", fa, x.dtype)) return std::nullopt;
    return Match{conv, r, &t, C, h, p, w, q, K, std::move(fa)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const Tensor& W = *m.conv->input(1)->constant;
    const int64_t rows = m.C * m.p * m.q;
    // W' [C*p*q, K]: W' [j, k] = W [k, j] with W read as [K, C*p*q].
    Tensor wt(W.dtype(), {rows, m.K});
    const size_t es = dtype_size(W.dtype());
    const auto* src = static_cast<const uint8_t*>(W.raw());
    auto* dst = static_cast<uint8_t*>(wt.raw());
    for (int64_t k = 0; k < m.K; ++k)
      for (int64_t j = 0; j < rows; ++j)
        std::memcpy(dst + (j * m.K + k) * es, src + (k * rows + j) * es, es);
    const std::string base = m.conv->name;
    Value* wv = g.add_constant(g.unique_name(m.conv->input(1)->name + "_gemm"), std::move(wt));
    auto add = [&](const std::string& op, std::vector<Value*> ins) {
      Node* n = g.insert_node_before(m.conv, op, g.unique_name(base + "_" + op), ins,
                                     {g.unique_name(base + "_" + op + "_out")});
      n->origin = ctx.pass;
      n->onnx_nodes = m.conv->onnx_nodes;
      return n;
    };
    Value* s1 = g.add_constant(g.unique_name(base + "_patches_shape"),
                               Tensor::from<int64_t>({6}, {0, m.C, m.h, m.p, m.w, m.q}));
    Node* split = add("Reshape", {m.conv->input(0), s1});
    Node* gather = add("Transpose", {split->output(0)});
    gather->attrs.set("perm", Attribute::Ints({0, 2, 4, 1, 3, 5}));
    Value* s2 = g.add_constant(g.unique_name(base + "_rows_shape"),
                               Tensor::from<int64_t>({3}, {0, m.h * m.w, rows}));
    Node* flat = add("Reshape", {gather->output(0), s2});
    return replace_with_layer(ctx, {m.conv, m.reshape, m.transpose}, "kiln", "FusedGemm",
                              {flat->output(0), wv, m.conv->input(2)}, m.attrs,
                              m.transpose->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fold_patch_conv(PassContext& ctx) { return apply_pattern<FoldPatchConv>(ctx); }

}  // namespace kiln::passes
