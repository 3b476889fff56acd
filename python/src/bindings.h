// Shared pieces of kiln's Python extension (kiln._kiln): errors, element types, and the engine
// and context wrappers. kiln's errors are values (Status/Expected); they become Python
// exceptions here and nowhere else.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "kiln/engine.h"
#include "kiln/status.h"

namespace kiln::py {

namespace nb = nanobind;

// Which Python exception a failure raises: KilnError (a RuntimeError), KilnValueError (also a
// ValueError: a value the caller passed is wrong) or KilnTypeError (also a TypeError: an
// argument of the wrong kind or element type).
enum class ErrorKind { kRuntime, kValue, kType };

class Error : public std::exception {
 public:
  Error(ErrorKind kind, std::string message);
  const char* what() const noexcept override { return message_.c_str(); }
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

[[noreturn]] void raise(ErrorKind kind, const std::string& message);
inline void check(const Status& st, ErrorKind kind = ErrorKind::kRuntime) {
  if (!st.ok()) raise(kind, st.message());
}
template <typename T>
T unwrap(Expected<T>&& e, ErrorKind kind = ErrorKind::kRuntime) {
  if (!e.ok()) raise(kind, e.status().message());
  return std::move(e).value();
}

// Creates KilnError and its subclasses in `m` and translates Error into them.
void register_errors(nb::module_& m);

// kiln element type <-> DLPack's; nullopt for types the other side cannot hold.
std::optional<nb::dlpack::dtype> to_dlpack(DataType t);
std::optional<DataType> from_dlpack(nb::dlpack::dtype d);
// NumPy's name of a DLPack type ("float32", "bool", "uint8"), for messages.
std::string dlpack_name(nb::dlpack::dtype d);

// An engine shared by the Python objects that use it (contexts keep it alive). `device`: the
// CUDA device its weights and contexts live on (kiln.load(path, device=N)); -1 for whichever
// device is current when its first context is made (the CUDA runtime's default, device 0).
struct PyEngine {
  std::shared_ptr<Engine> engine;
  int device = -1;
};

// Makes CUDA device `device` current on this thread for a scope and restores the one before; a
// no-op for -1 and in builds without CUDA. The C++ API works on the current device (as the CUDA
// runtime and TensorRT do): an engine's weights go to the device current at its first context,
// a context's stream and memory to the one current at its creation, so the extension sets the
// engine's device around every call that reaches the GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// CUDA devices this process sees (0 without CUDA or a driver).
int cuda_device_count();

void bind_context(nb::module_& m);

}  // namespace kiln::py
