// The few CUDA runtime calls the server needs, compiled to nothing without CUDA.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace kiln::serve {

// GPUs visible to this process (0 without CUDA or a GPU).
int visible_gpus();
// Makes `device` current for this thread (-1: leaves it); false when CUDA refuses.
bool use_device(int device);
// How threads wait for the GPUs ("block", "spin"): each device context's scheduling flag, set
// before any context exists. "" when set (or nothing to set), else why not.
std::string set_gpu_wait(bool spin);

// `bytes` of host memory for inputs gathered on their way to a GPU: page-locked where `pinned`
// and CUDA gives it (cudaHostAlloc, portable across devices: the copy to the device then runs at
// the bus's speed without a staging copy), else ordinary memory. 64-byte aligned; freed with
// the last shared_ptr.
std::shared_ptr<void> host_buffer(size_t bytes, bool pinned);

}  // namespace kiln::serve
