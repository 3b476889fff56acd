// mha.flash's kernels (layers/attention_flash.cuh) for the head sizes whose tiles have padded
// rows: D = 48, 80, 96, 160, 192 and 256 (a head of d columns runs at padded_head(d): Stable
// Diffusion's 40, 80 and 160, and any other multiple of 8 up to 256). A translation unit of
// their own, compiled beside attention_mha.cu's.
#include "layers/attention_flash.cuh"

namespace kiln::gpu::flash {
namespace {

template <int D>
FlashKernel pick_d(int warps, DataType mask, int read) {
  return warps == 4 ? flash_kernel<D, 4, 1, false>(mask, read)
                    : flash_kernel<D, 1, 1, false>(mask, read);
}

}  // namespace

FlashKernel pick_flash_wide(int dp, int warps, DataType mask, int read) {
  switch (dp) {
    case 48: return pick_d<48>(warps, mask, read);
    case 80: return pick_d<80>(warps, mask, read);
    case 96: return pick_d<96>(warps, mask, read);
    case 160: return pick_d<160>(warps, mask, read);
    case 192: return pick_d<192>(warps, mask, read);
    case 256: return pick_d<256>(warps, mask, read);
    default: return nullptr;
  }
}

FlashKernel flash_split_wide(int dp, DataType mask) {
  static_assert(flash_split_smem(kMaxSplitHead) <= 227 * 1024, "the split kernel's tiles fit");
  switch (dp) {
    case 48: return flash_split_kernel<48, false>(mask);
    case 80: return flash_split_kernel<80, false>(mask);
    case 96: return flash_split_kernel<96, false>(mask);
    case 160: return flash_split_kernel<160, false>(mask);
    case 192: return flash_split_kernel<192, false>(mask);
    default: return nullptr;
  }
}

}  // namespace kiln::gpu::flash
