#include "perf/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kiln::perf {

Expected<std::unique_ptr<ShmRegion>> ShmRegion::create(const std::string& key, size_t size) {
  std::unique_ptr<ShmRegion> r(new ShmRegion());
  r->key_ = key;
  r->fd_ = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (r->fd_ < 0)
    return KILN_ERROR("cannot create shared memory object '{}': {}", key, std::strerror(errno));
  // From here on, `r`'s destructor unlinks the object if a step fails.
  if (ftruncate(r->fd_, static_cast<off_t>(size)) != 0)
    return KILN_ERROR("cannot size shared memory object '{}' to {} bytes: {}", key, size,
                      std::strerror(errno));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED)
    return KILN_ERROR("cannot map shared memory object '{}': {}", key, std::strerror(errno));
  r->base_ = static_cast<uint8_t*>(p);
  r->size_ = size;
  return r;
}

ShmRegion::~ShmRegion() {
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) {
    close(fd_);
    shm_unlink(key_.c_str());
  }
}

}  // namespace kiln::perf
