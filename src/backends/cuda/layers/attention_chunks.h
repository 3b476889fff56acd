// How kiln.Attention's batched-GEMM layer (layers/gemm_attention.cu) splits its problem so that
// the scores fit the engine's workspace limit (--mem-pool-size workspace:N). Host code only, so
// that the plan is tested without a GPU (tests/cuda/test_attention_chunks.cpp).
//
// The scores [batch..., Sq, Sk] of one attention are the workspace's whole content: float32 for
// float32 and 16-bit inputs (and the 16-bit probabilities beside them), float64 for float64. At
// long sequences they outgrow any limit (SD 1.5's UNet: 2 x 8 heads of 4096 x 4096 float32
// scores, 1 GiB), so the layer runs the same GEMM -> softmax -> GEMM over chunks of the batch,
// and where one head's scores alone are too large, over chunks of its query rows. Each chunk is
// a smaller attention of the same form: a slice of every operand along one axis of the broadcast
// batch shape (or the query rows), with every later axis whole, is contiguous in memory, so its
// GEMMs and mask broadcast are planned as the whole problem's are, from its shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::gpu {

// The shapes of one attention problem (the whole, or a chunk): Q [.., Sq, D], Kt [.., D, Sk],
// V [.., Sk, Dv], the additive mask (where `masked`; of any rank, a scalar too) and Y [.., Sq,
// Dv], with numpy-broadcast batch dims as kiln.Attention takes them (ops/fused.h).
struct AttentionShapes {
  std::vector<int64_t> q, k, v, mask, y;
  bool masked = false;
};

// Workspace bytes of `cells` score cells: the scores of `score_size` bytes each, and where the
// probabilities are stored apart (16-bit inputs) `prob_size` bytes each; each part 256-aligned.
size_t attention_workspace(int64_t cells, size_t score_size, size_t prob_size);

// "1064 MiB", "12.5 KiB", "300 bytes": workspace sizes in messages (test limits are small).
std::string bytes_str(size_t bytes);

// The chunks of an attention: `count()` pieces, piece i at the element offsets at(i) into Q, Kt,
// V, the mask and Y, of the shapes `full` (or `tail`, the last piece of each run along the axis
// when it is shorter).
struct AttentionChunks {
  struct Offsets {
    int64_t q = 0, k = 0, v = 0, mask = 0, y = 0;
    bool tail = false;
  };
  // The axis of the broadcast batch shape split into pieces of `step` entries; == batch.size():
  // the query rows, `step` rows a piece (each (batch, head) on its own).
  size_t axis = 0;
  int64_t step = 0;
  int64_t last = 0;       // entries (rows) of the last piece along the axis (<= step)
  int64_t outer = 1;      // pieces repeat for each index of the batch dims before `axis`
  int64_t per_outer = 1;  // pieces along `axis`
  AttentionShapes full, tail;
  int64_t full_cells = 0, tail_cells = 0;  // score cells of a piece
  size_t workspace = 0;                    // bytes the largest piece needs
  std::vector<int64_t> batch;              // the broadcast batch shape (Y's batch dims)
  // Per operand (Q, Kt, V, mask, Y): element strides over the batch dims (0 where the operand
  // broadcasts), then the stride of one query row (0 for Kt and V, and a mask of one row).
  std::vector<int64_t> strides[5];

  int64_t count() const { return outer * per_outer; }
  bool chunked() const { return count() > 1; }
  Offsets at(int64_t i) const;
};

// Plans the chunks of the attention `s` (shapes already checked to chain and broadcast; Y's
// batch is the broadcast of all the others') for a workspace of at most `limit` bytes: the whole
// problem as one piece of its own shapes where it fits, else as few, even pieces as fit, along
// the outermost batch axis that allows it, else along the query rows. An error (naming `label`
// and the sizes) where even one query row's scores do not fit.
Expected<AttentionChunks> plan_attention_chunks(const AttentionShapes& s, size_t score_size,
                                                size_t prob_size, size_t limit,
                                                const std::string& label);

}  // namespace kiln::gpu
