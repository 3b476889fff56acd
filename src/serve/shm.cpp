#include "serve/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kiln::serve {

struct ShmRegistry::Mapping {
  int fd = -1;
  uint8_t* base = nullptr;
  size_t size = 0;
  bool writable = true;
  ~Mapping() {
    if (base) munmap(base, size);
    if (fd >= 0) close(fd);
  }
};

namespace {

constexpr size_t kMaxName = 200;

Result<std::string> object_path(const std::string& key) {
  std::string name = key;
  while (!name.empty() && name.front() == '/') name.erase(0, 1);
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
      name.find('\0') != std::string::npos)
    return api_error(400,
                     "shared memory key '{}' is not the name of a POSIX shared memory "
                     "object ('/name' or 'name')",
                     key);
  return "/dev/shm/" + name;
}

}  // namespace

Check ShmRegistry::register_region(const std::string& name, const std::string& key, uint64_t offset,
                                   uint64_t byte_size) {
  if (name.empty() || name.find('\0') != std::string::npos)
    return api_error(400,
                     "shared memory region name '{}' is not a non-empty string (without "
                     "NUL)",
                     name);
  if (name.size() > kMaxName)
    return api_error(400, "shared memory region name '{}...' is over {} characters",
                     name.substr(0, 40), kMaxName);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (regions_.count(name))
      return api_error(409,
                       "shared memory region '{}' is already registered (unregister it "
                       "first)",
                       name);
  }
  auto path = object_path(key);
  if (!path.ok()) return path.error();
  auto m = std::make_shared<Mapping>();
  // As shm_open(3) opens it: never through a symbolic link (one in /dev/shm could otherwise aim
  // the server's output writes at any file its user may write).
  m->fd = open(path->c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (m->fd < 0 && (errno == EACCES || errno == EROFS)) {
    m->writable = false;
    m->fd = open(path->c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  }
  if (m->fd < 0) {
    if (errno == ENOENT)
      return api_error(400, "shared memory key '{}': no such object ({})", key, *path);
    return api_error(400, "cannot open shared memory object '{}' ({}): {}", key, *path,
                     std::strerror(errno));
  }
  struct stat st {};
  if (fstat(m->fd, &st) != 0 || !S_ISREG(st.st_mode))
    return api_error(400, "shared memory key '{}' ({}) is not a shared memory object", key, *path);
  if (st.st_size == 0) return api_error(400, "shared memory object '{}' ({}) is empty", key, *path);
  m->size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, m->size, m->writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED,
                 m->fd, 0);
  if (p == MAP_FAILED)
    return api_error(400, "cannot map shared memory object '{}' ({}): {}", key, *path,
                     std::strerror(errno));
  m->base = static_cast<uint8_t*>(p);
  if (offset > m->size || byte_size > m->size - offset)
    return api_error(400,
                     "shared memory region '{}': offset {} + byte_size {} is beyond object "
                     "'{}' of {} bytes",
                     name, offset, byte_size, key, m->size);
  std::lock_guard<std::mutex> lk(mu_);
  if (regions_.count(name))
    return api_error(409, "shared memory region '{}' is already registered (unregister it first)",
                     name);
  regions_[name] = Region{{name, key, offset, byte_size}, std::move(m)};
  return std::nullopt;
}

void ShmRegistry::unregister(const std::string& name, bool cuda) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    if ((name.empty() || it->first == name) && (it->second.cuda != nullptr) == cuda)
      it = regions_.erase(it);
    else
      ++it;
  }
}

Result<std::vector<RegionStatus>> ShmRegistry::status(const std::string& name, bool cuda) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<RegionStatus> out;
  for (const auto& [n, r] : regions_)
    if ((name.empty() || n == name) && (r.cuda != nullptr) == cuda) out.push_back(r.status);
  if (!name.empty() && out.empty())
    return api_error(404, "no {}shared memory region '{}' is registered", cuda ? "CUDA " : "",
                     name);
  return out;
}

Result<ShmRegistry::Region> ShmRegistry::find(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end())
    return api_error(400,
                     "unknown shared memory region '{}' (register it first: "
                     "register_system_shared_memory or register_cuda_shared_memory)",
                     name);
  return it->second;
}

Result<std::pair<ShmRegistry::Region, uint8_t*>> ShmRegistry::span(const std::string& what,
                                                                   const ShmRef& ref) const {
  auto found = find(ref.region);
  if (!found.ok()) return found.error();
  Region r = std::move(found).value();
  // A client that shrinks its object after registering it would make the pages past its new
  // end fault (SIGBUS, the whole server): its size is checked at each use.
  struct stat st {};
  const uint64_t registered = r.status.offset + r.status.byte_size;
  if (fstat(r.map->fd, &st) != 0)
    return api_error(400, "{}: shared memory region '{}' cannot be read: {}", what, ref.region,
                     std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) < registered)
    return api_error(400,
                     "{}: shared memory object '{}' of region '{}' is now {} bytes, under "
                     "the {} it was registered with",
                     what, r.status.key, ref.region, st.st_size, registered);
  if (ref.offset > r.status.byte_size || ref.byte_size > r.status.byte_size - ref.offset)
    return api_error(400,
                     "{}: shared_memory_offset {} + shared_memory_byte_size {} is beyond "
                     "shared memory region '{}' of {} bytes",
                     what, ref.offset, ref.byte_size, ref.region, r.status.byte_size);
  uint8_t* at = r.map->base + r.status.offset + ref.offset;
  return std::make_pair(std::move(r), at);
}

Check ShmRegistry::input(const std::string& what, const ShmRef& ref, size_t need,
                         const std::string& shape, std::string_view datatype,
                         InputTensor& t) const {
  auto r = find(ref.region);
  if (!r.ok()) return r.error();
  if (r->cuda) {
    if (ref.byte_size != need)
      return api_error(400, "{}: shared_memory_byte_size {}, shape {} of {} takes {}", what,
                       ref.byte_size, shape, datatype, need);
    return cuda_input(what, *r, ref, need, t);
  }
  auto s = span(what, ref);
  if (!s.ok()) return s.error();
  if (ref.byte_size != need)
    return api_error(400, "{}: shared_memory_byte_size {}, shape {} of {} takes {}", what,
                     ref.byte_size, shape, datatype, need);
  t.data = s->second;
  t.bytes = need;
  t.owner = s->first.map;  // the mapping outlives an unregister while the request runs
  return std::nullopt;
}

Check ShmRegistry::check_output(const std::string& what, const ShmRef& ref) const {
  auto r = find(ref.region);
  if (!r.ok()) return r.error();
  if (r->cuda) return cuda_write(what, *r, ref, nullptr, 0);  // the span's checks only
  auto s = span(what, ref);
  if (!s.ok()) return s.error();
  if (!s->first.map->writable)
    return api_error(400, "{}: shared memory region '{}' is read-only to the server", what,
                     ref.region);
  return std::nullopt;
}

Check ShmRegistry::write_output(const std::string& what, const ShmRef& ref, const void* data,
                                size_t bytes, const std::string& shape,
                                std::string_view datatype) const {
  auto r = find(ref.region);
  if (!r.ok()) return r.error();
  if (r->cuda && bytes > ref.byte_size)
    return api_error(400,
                     "{}: shared_memory_byte_size {} of region '{}' is too small for shape "
                     "{} of {}, which takes {} bytes",
                     what, ref.byte_size, ref.region, shape, datatype, bytes);
  if (r->cuda) return cuda_write(what, *r, ref, data, bytes);
  auto s = span(what, ref);
  if (!s.ok()) return s.error();
  if (bytes > ref.byte_size)
    return api_error(400,
                     "{}: shared_memory_byte_size {} of region '{}' is too small for shape "
                     "{} of {}, which takes {} bytes",
                     what, ref.byte_size, ref.region, shape, datatype, bytes);
  if (!s->first.map->writable)
    return api_error(400, "{}: shared memory region '{}' is read-only to the server", what,
                     ref.region);
  if (bytes) std::memcpy(s->second, data, bytes);
  return std::nullopt;
}

}  // namespace kiln::serve
