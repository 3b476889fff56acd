// Triton's system shared memory extension: a client on the server's machine registers a POSIX
// shared memory object once (name -> key, offset, byte size); requests then name a region,
// offset and size for their inputs, read in place, and for their outputs, written into it.
// Triton's endpoints, parameters and status codes (its docs/protocol/extension_shared_memory.md).
//
// Limits, as Triton's: the server maps whatever /dev/shm object a client names and can read and
// write it, so the extension is for clients on the server's machine that its user trusts. The
// object's size is checked at each use: a client that shrinks it while registered gets a 400,
// not a server killed by SIGBUS (one shrunk between that check and the read still could).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/types.h"

namespace kiln::serve {

// Triton's CUDA shared memory extension too: a client registers a device allocation of its own
// process by its CUDA IPC handle (cudaIpcGetMemHandle's 64 bytes) and device; the server opens
// it (cudaIpcOpenMemHandle) and copies a request's inputs from it and its outputs into it
// (shm_cuda.cpp). Region names are one namespace over both kinds, as Triton's.
struct RegionStatus {
  std::string name, key;  // key: system regions only
  uint64_t offset = 0, byte_size = 0;
  int device_id = -1;  // CUDA regions: the device holding it
};

class ShmRegistry {
 public:
  // Registers region `name`: `byte_size` bytes at `offset` of object `key` ('/name' or 'name'
  // in /dev/shm). 409 when the name is taken, 400 for a key or span that does not fit.
  Check register_region(const std::string& name, const std::string& key, uint64_t offset,
                        uint64_t byte_size);
  // Registers CUDA region `name`: `byte_size` bytes of the allocation whose IPC handle is
  // `raw_handle`, on `device_id`. 409 when the name is taken; 400 for a handle that is not one
  // or does not open (a build or machine without CUDA says so).
  Check register_cuda_region(const std::string& name, const std::string& raw_handle,
                             int64_t device_id, uint64_t byte_size);
  // Drops region `name` of the kind (system, or CUDA with `cuda`), or every region of the kind
  // when it is empty (a name not registered is no error, as Triton's). A request still reading
  // a region keeps its mapping until it is done.
  void unregister(const std::string& name, bool cuda = false);
  // The status of `name` (404 when no region of the kind has it), or of every region of the kind.
  Result<std::vector<RegionStatus>> status(const std::string& name, bool cuda = false) const;

  // An input's bytes: `ref` checked to lie within its region and to be `need` bytes; `what`
  // names the tensor in messages ("input 'x'"). The tensor's data, kept alive by its owner.
  Check input(const std::string& what, const ShmRef& ref, size_t need, const std::string& shape,
              std::string_view datatype, InputTensor& t) const;
  // Before the inference: the output's region exists, is writable and the span is within it.
  Check check_output(const std::string& what, const ShmRef& ref) const;
  // Copies `bytes` of an output into its span; 400 when the span is too small.
  Check write_output(const std::string& what, const ShmRef& ref, const void* data, size_t bytes,
                     const std::string& shape, std::string_view datatype) const;

 private:
  struct Mapping;      // an open, mapped object (unmapped with its last user)
  struct CudaMapping;  // an opened IPC handle (closed with its last user)
  struct Region {
    RegionStatus status;
    std::shared_ptr<Mapping> map;       // system regions
    std::shared_ptr<CudaMapping> cuda;  // CUDA regions
  };
  // A registered region of either kind, by name; 400 naming it when there is none.
  Result<Region> find(const std::string& name) const;
  // The span's checks of a CUDA region, and the copies (shm_cuda.cpp).
  Check cuda_input(const std::string& what, const Region& r, const ShmRef& ref, size_t need,
                   InputTensor& t) const;
  Check cuda_write(const std::string& what, const Region& r, const ShmRef& ref, const void* data,
                   size_t bytes) const;
  // The region and the address of the span's first byte; 400 when out of range.
  Result<std::pair<Region, uint8_t*>> span(const std::string& what, const ShmRef& ref) const;

  mutable std::mutex mu_;
  std::map<std::string, Region> regions_;
};

}  // namespace kiln::serve
