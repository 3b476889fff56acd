// The layout walk: the heads a 4-D tensor reads when it is a 3-D tensor's projection split into
// heads through layout ops alone (Reshape, Transpose, Squeeze, Unsqueeze, Gather, Slice, Split,
// Expand, Tile, Concat of copies), replayed as a strided view. Read by fold_attention_heads (Q, K
// and V of an attention) and fuse_rotary (a rotary on heads moves in front of their split).
#pragma once

#include <optional>
#include <vector>

#include "passes/passes.h"

namespace kiln::passes {

struct Heads {
  Value* x = nullptr;  // [B, S, N] or, sequence-first, [S, B, N]; head-major [B, H, S, D]
  int64_t h = 0, d = 0;
  int64_t rep = 1;          // each head repeated rep times (grouped-query attention's K and V)
  int64_t offset = 0;       // of head 0 in x's last axis (a part of a packed projection)
  bool seq_first = false;   // x is [S, B, N]
  bool head_major = false;  // x is [B, H, S, D], split into heads already (a KV cache)
  std::vector<Node*> nodes;
};

// Whether n is one of the layout ops the walk follows.
bool layout_op(const Node* n);

// The heads t4 reads, when t4 (dims in `order`: for Q and V b, h, s, d; for K^T b, h, d, s) is
// x [B, S, N] or [S, B, N] through layout ops alone: head h's element (b, s, d) at
// x[b, s, offset + (h / rep)*D + d] (x's first two axes swapped for sequence-first); or x
// [B, H, S, D] whose heads t4 reads as they are (x[b, h / rep, s, d]: a KV cache, t4 itself or
// its heads repeated). Every x up the chain that works, the farthest first (a chain may start at
// a 2-D product reshaped to 3-D: then the 3-D tensor is x; a part of a packed projection is an
// x, and so is the projection).
std::vector<Heads> walk_heads(Value* t4, const char (&order)[5]);

}  // namespace kiln::passes
