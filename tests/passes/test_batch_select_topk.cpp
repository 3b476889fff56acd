// batch_select_topk: per-class select and top-k chains (torchvision's SSD postprocessing, an
// unrolled loop over the classes) become one masked top-k over all classes, checked against the
// graph before on the CPU (boxes, scores and labels, shapes and values); the forms the exporters
// write (GatherND or Gather selections, K by ReduceMin over a Concat or by Min, the classes on
// either axis); and chains that differ or whose results are read elsewhere stay as they are.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

struct Form {
  bool gather_nd = true;  // GatherND with [n, 1] indices, or Gather with [n]
  bool reduce_min = true;  // K = ReduceMin(Concat(kmax, n)), or Min(n, kmax)
  int64_t class_axis = 1;  // the scores are [N, C] (1) or [C, N] (0)
};

struct Built {
  std::vector<Value*> values, boxes, labels;
};

// One chain per class in `classes`: the class's scores above `threshold`, their top min(n, kmax)
// and the boxes at them, a label of the class for each.
Built chains(G& b, Value* scores, Value* boxes, const std::vector<int64_t>& classes,
             const std::vector<int64_t>& kmax, float threshold, const Form& f) {
  Built out;
  for (size_t i = 0; i < classes.size(); ++i) {
    Value* s = b.op("Gather", {scores, b.c(Tensor::scalar<int64_t>(classes[i]))},
                    attrs({{"axis", Attribute::Int(f.class_axis)}}));
    Value* nz = b.op("NonZero", {b.op("Greater", {s, b.cf(threshold)})});
    Value *x, *bx, *n;
    if (f.gather_nd) {
      Value* idx = b.op("Transpose", {nz}, attrs({{"perm", Attribute::Ints({1, 0})}}));
      x = b.op("GatherND", {s, idx});
      bx = b.op("GatherND", {boxes, idx});
      n = b.op("Gather", {b.op("Shape", {x}), b.c(Tensor::scalar<int64_t>(0))});
    } else {
      Value* idx = b.op("Squeeze", {nz, b.c(ints({0}))});
      x = b.op("Gather", {s, idx});
      bx = b.op("Gather", {boxes, idx});
      n = b.op("Gather", {b.op("Shape", {idx}), b.c(Tensor::scalar<int64_t>(0))});
    }
    Value* k;
    if (f.reduce_min) {
      Value* both = b.op("Concat", {b.c(ints({kmax[i]})), b.op("Unsqueeze", {n, b.c(ints({0}))})},
                         attrs({{"axis", Attribute::Int(0)}}));
      k = b.op("Reshape", {b.op("ReduceMin", {both}, attrs({{"keepdims", Attribute::Int(0)}})),
                           b.c(ints({1}))});
    } else {
      k = b.op("Unsqueeze", {b.op("Min", {n, b.c(Tensor::scalar<int64_t>(kmax[i]))}), b.c(ints({0}))});
    }
    Node* topk = b.node("TopK", {x, k}, {}, 2);
    out.values.push_back(topk->output(0));
    out.boxes.push_back(b.op("Gather", {bx, topk->output(1)}));
    out.labels.push_back(b.op("ConstantOfShape", {b.op("Shape", {topk->output(0)})},
                              attrs({{"value", Attribute::TensorValue(ints({classes[i] + 10}))}})));
  }
  return out;
}

void concat_outputs(G& b, const Built& c) {
  for (const auto* parts : {&c.boxes, &c.values, &c.labels})
    b.out(b.op("Concat", *parts, attrs({{"axis", Attribute::Int(0)}})));
}

TEST(BatchSelectTopK, PerClassChainsBecomeOneMaskedTopK) {
  for (const Form f : {Form{}, Form{false, false, 1}, Form{true, false, 0}, Form{false, true, 0}}) {
    for (int64_t kmax : {5, 100}) {  // fewer than a class selects, and more than there are
      G b;
      const std::vector<int64_t> cls = {1, 2, 4, 5, 3};
      Value* scores = b.in("scores", f.class_axis == 1 ? std::vector<int64_t>{40, 6}
                                                       : std::vector<int64_t>{6, 40});
      Value* boxes = b.in("boxes", {40, 4});
      concat_outputs(b, chains(b, scores, boxes, cls, std::vector<int64_t>(cls.size(), kmax), 0.1f, f));
      auto opt = optimize_checked(b.g, {"batch_select_topk", "eliminate_dead_code"});
      EXPECT_EQ(count(*opt, "TopK"), 1) << "gather_nd " << f.gather_nd << " axis " << f.class_axis;
      EXPECT_EQ(count(*opt, "NonZero"), 1);
      EXPECT_EQ(count(*opt, "Concat"), 0);
      // And the whole pipeline after it (the mask and Where may fuse): the same outputs.
      auto full = b.g.clone();
      OptimizeOptions o;
      o.opt_level = 2;
      ASSERT_TRUE(optimize_graph(*full, o).ok());
      expect_same_outputs(b.g, *full, 1e-9);
    }
  }
}

TEST(BatchSelectTopK, NothingSelectedGivesEmptyOutputs) {
  G b;
  Value* scores = b.in("scores", {40, 6});
  Value* boxes = b.in("boxes", {40, 4});
  concat_outputs(b, chains(b, scores, boxes, {1, 2, 3}, {5, 5, 5}, 2.f, Form{}));
  auto opt = optimize_checked(b.g, {"batch_select_topk", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "TopK"), 1);
  const auto outs = run_cpu(*opt, random_inputs(b.g));
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(outs[0].shape(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(outs[1].shape(), (std::vector<int64_t>{0}));
}

TEST(BatchSelectTopK, ChainsThatDifferOrAreReadElsewhereStay) {
  {  // different K per class
    G b;
    concat_outputs(b, chains(b, b.in("scores", {40, 6}), b.in("boxes", {40, 4}), {1, 2},
                             {5, 6}, 0.1f, Form{}));
    bool changed = true;
    auto notes = pass_notes(b.g, "batch_select_topk", passes::batch_select_topk, &changed);
    EXPECT_FALSE(changed);
    EXPECT_TRUE(has_note(notes, "the chains differ")) << dump_notes(notes);
  }
  {  // one chain's boxes also a graph output
    G b;
    Built c = chains(b, b.in("scores", {40, 6}), b.in("boxes", {40, 4}), {1, 2}, {5, 5}, 0.1f, Form{});
    concat_outputs(b, c);
    b.out(c.boxes[1]);
    bool changed = true;
    auto notes = pass_notes(b.g, "batch_select_topk", passes::batch_select_topk, &changed);
    EXPECT_FALSE(changed);
    EXPECT_TRUE(has_note(notes, "not concatenated in the same order")) << dump_notes(notes);
  }
  {  // K not bounded by the selection's length
    G b;
    Value* scores = b.in("scores", {40, 6});
    std::vector<Value*> vals;
    for (int64_t c : {1, 2}) {
      Value* s = b.op("Gather", {scores, b.c(Tensor::scalar<int64_t>(c))}, attrs({{"axis", Attribute::Int(1)}}));
      Value* idx = b.op("Transpose", {b.op("NonZero", {b.op("Greater", {s, b.cf(-2.f)})})},
                        attrs({{"perm", Attribute::Ints({1, 0})}}));
      vals.push_back(b.node("TopK", {b.op("GatherND", {s, idx}), b.c(ints({3}))}, {}, 2)->output(0));
    }
    b.out(b.op("Concat", vals, attrs({{"axis", Attribute::Int(0)}})));
    bool changed = true;
    auto notes = pass_notes(b.g, "batch_select_topk", passes::batch_select_topk, &changed);
    EXPECT_FALSE(changed);
    EXPECT_TRUE(has_note(notes, "K is not min")) << dump_notes(notes);
  }
}

}  // namespace
}  // namespace kiln::test
