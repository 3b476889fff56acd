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

inline constexpr const char* kCudaShmUnsupported =
    "kiln serve supports system shared memory, not CUDA shared memory";

struct RegionStatus {
  std::string name, key;
  uint64_t offset = 0, byte_size = 0;
};

class ShmRegistry {
 public:
  // Registers region `name`: `byte_size` bytes at `offset` of object `key` ('/name' or 'name'
  // in /dev/shm). 409 when the name is taken, 400 for a key or span that does not fit.
  Check register_region(const std::string& name, const std::string& key, uint64_t offset,
                        uint64_t byte_size);
  // Drops `name`, or every region when it is empty (a name not registered is no error, as
  // Triton's). A request still reading a region keeps its mapping until it is done.
  void unregister(const std::string& name);
  // The status of `name` (404 when not registered), or of every region.
  Result<std::vector<RegionStatus>> status(const std::string& name) const;

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
  struct Mapping;  // an open, mapped object (unmapped with its last user)
  struct Region {
    RegionStatus status;
    std::shared_ptr<Mapping> map;
  };
  // The region and the address of the span's first byte; 400 when out of range.
  Result<std::pair<Region, uint8_t*>> span(const std::string& what, const ShmRef& ref) const;

  mutable std::mutex mu_;
  std::map<std::string, Region> regions_;
};

}  // namespace kiln::serve
