// kiln._kiln.Context: an execution context. The host path (execute: NumPy arrays in and out) and
// the device path (TensorRT's shape: input shapes and device addresses, then enqueue on a
// stream) both release the GIL while kiln works; a context runs one call at a time.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <map>

#include "bindings.h"

#ifdef KILN_WITH_CUDA
#include <cuda.h>  // the driver API's types only: its functions are looked up through the runtime
#include <cuda_runtime_api.h>
#endif

namespace kiln::py {
namespace {

using Array = nb::ndarray<nb::ro>;

#ifdef KILN_WITH_CUDA
Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  return KILN_ERROR("{}: {}", what, cudaGetErrorString(e));
}
#endif

// TensorRT's IOutputAllocator in Python (an engine whose output sizes the data decides): an
// object with reallocate_output(name, memory, size, alignment) -> device address and
// notify_shape(name, shape), as TensorRT's Python API names them. Called from inside an inference
// (which runs without the GIL) with the GIL taken; what it raises fails the inference, and the
// message is kept for the error (`failure`).
class PyOutputAllocator final : public OutputAllocator {
 public:
  explicit PyOutputAllocator(nb::object obj) : obj_(std::move(obj)) {}
  void* reallocate_output(const std::string& name, void* current, size_t bytes) override {
    nb::gil_scoped_acquire gil;
    try {
      nb::object r = obj_.attr("reallocate_output")(name, reinterpret_cast<uintptr_t>(current),
                                                    bytes, size_t{256});
      return reinterpret_cast<void*>(nb::cast<uintptr_t>(r));
    } catch (nb::python_error& e) {
      keep(name, "reallocate_output", python_message(e));
    } catch (const std::exception& e) {
      keep(name, "reallocate_output", e.what());
    }
    return nullptr;
  }
  void notify_shape(const std::string& name, const std::vector<int64_t>& dims) override {
    nb::gil_scoped_acquire gil;
    try {
      obj_.attr("notify_shape")(name, nb::cast(dims));  // a list of ints
    } catch (nb::python_error& e) {
      keep(name, "notify_shape", python_message(e));
    } catch (const std::exception& e) {
      keep(name, "notify_shape", e.what());
    }
  }
  std::string failure;  // the first exception of the last inference, on one line

 private:
  void keep(const std::string& name, const char* what, const std::string& message) {
    if (!failure.empty()) return;
    std::string m = message.substr(0, message.find('\n'));
    failure = fmt::format("output '{}': the allocator's {} raised {}", name, what, m);
  }
  // "MemoryError: pool exhausted" (what() would begin with the traceback).
  static std::string python_message(nb::python_error& e) {
    try {
      return nb::cast<std::string>(e.type().attr("__name__")) + ": " +
             nb::cast<std::string>(nb::str(e.value()));
    } catch (...) {
      return "an exception";
    }
  }
  nb::object obj_;
};

struct PyContext {
  std::shared_ptr<Engine> engine;
  std::unique_ptr<ExecutionContext> ctx;
  std::mutex mu;
  // set_output_allocator's, per output (the Python objects held while set).
  std::map<std::string, std::unique_ptr<PyOutputAllocator>> allocators;
  int device = -1;  // the engine's (PyEngine::device): made current around every call
#ifdef KILN_WITH_CUDA
  cudaStream_t stream = nullptr;  // for runs given no stream, created at the first
  ~PyContext() {
    DeviceGuard on(device);
    ctx.reset();
    if (stream) cudaStreamDestroy(stream);
  }
  // Enqueues on `s`, or on this context's own stream and waits for it when `s` is null.
  Status enqueue(cudaStream_t s) {
    if (s) return ctx->enqueue(s);
    if (!stream)
      KILN_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                       "cudaStreamCreate"));
    KILN_RETURN_IF_ERROR(ctx->enqueue(stream));
    return cuda_status(cudaStreamSynchronize(stream), "the inference");
  }
#else
  Status enqueue(CUstream_st* s) { return ctx->enqueue(s); }
#endif
};

const TensorInfo& input_info(const Engine& e, const std::string& name) {
  for (const TensorInfo& t : e.inputs())
    if (t.name == name) return t;
  std::vector<std::string> names;
  for (const TensorInfo& t : e.inputs()) names.push_back(t.name);
  raise(ErrorKind::kValue, fmt::format("the engine has no input named '{}' (its inputs: {})", name,
                                       fmt::join(names, ", ")));
}

template <typename A>
std::vector<int64_t> shape_of(const A& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
  return s;
}

// Copies a strided host array into a new contiguous tensor.
Tensor gather_strided(const Array& a, DataType t, const std::vector<int64_t>& shape) {
  Tensor out(t, shape);
  const size_t es = dtype_size(t), n = static_cast<size_t>(out.numel());
  const auto* src = static_cast<const uint8_t*>(a.data());
  auto* dst = static_cast<uint8_t*>(out.raw());
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * a.stride(d);
    std::memcpy(dst + k * es, src + off * static_cast<int64_t>(es), es);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// A host array as a kiln tensor of the input's declared type: the array's memory when it is
// C-contiguous, else a contiguous copy. Another element type is refused, never converted.
Tensor host_tensor(const TensorInfo& info, const Array& a) {
  if (a.device_type() != nb::device::cpu::value)
    raise(ErrorKind::kType,
          fmt::format("input '{}': execute() takes host arrays; this one is on a device (use "
                      "run(), which takes device tensors)",
                      info.name));
  const std::optional<DataType> got = from_dlpack(a.dtype());
  if (!got || *got != info.dtype)
    raise(ErrorKind::kType,
          fmt::format("input '{}': the engine takes {}, not {} (kiln does not convert arrays; "
                      "convert it first, e.g. x.astype('{}'))",
                      info.name, dtype_name(info.dtype), dlpack_name(a.dtype()),
                      dtype_name(info.dtype)));
  const std::vector<int64_t> shape = shape_of(a);
  int64_t expect = 1;
  bool contiguous = true;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && a.stride(d) != expect) contiguous = false;
    expect *= shape[d];
  }
  if (contiguous) return Tensor::view(info.dtype, shape, a.data(), nullptr);
  return gather_strided(a, info.dtype, shape);
}

// A kiln output as a NumPy array owning its buffer (no copy).
nb::object to_numpy(const std::string& name, Tensor t) {
  const std::optional<nb::dlpack::dtype> dt = to_dlpack(t.dtype());
  if (!dt || t.dtype() == DataType::kBFloat16)
    raise(ErrorKind::kType, fmt::format("output '{}' is {}, which NumPy has no type for", name,
                                        dtype_name(t.dtype())));
  t.raw();  // a view of memory kiln does not own (an input, the engine file) becomes a copy
  auto* held = new Tensor(std::move(t));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(held->shape().begin(), held->shape().end());
  return nb::cast(
      nb::ndarray<nb::numpy>(held->raw(), shape.size(), shape.data(), owner, nullptr, *dt));
}

nb::list execute(PyContext& c, const std::vector<std::pair<std::string, Array>>& feeds) {
  std::map<std::string, Tensor> inputs;
  for (const auto& [name, a] : feeds) {
    const TensorInfo& info = input_info(*c.engine, name);
    if (inputs.count(name)) raise(ErrorKind::kValue, fmt::format("input '{}' given twice", name));
    inputs[name] = host_tensor(info, a);
  }
  for (const TensorInfo& t : c.engine->inputs())
    if (!inputs.count(t.name))
      raise(ErrorKind::kValue, fmt::format("input '{}' was not given", t.name));
  Expected<std::vector<Tensor>> out = Status::Error("not run");
  {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(c.mu);
    DeviceGuard on(c.device);
    out = c.ctx->execute(inputs);
  }
  std::vector<Tensor> tensors = unwrap(std::move(out));
  nb::list result;
  for (size_t i = 0; i < tensors.size(); ++i)
    result.append(to_numpy(c.engine->outputs()[i].name, std::move(tensors[i])));
  return result;
}

void* device_pointer(uintptr_t address, const std::string& name) {
  void* p = reinterpret_cast<void*>(address);
#ifdef KILN_WITH_CUDA
  if (!p) return p;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess ||
      (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
    cudaGetLastError();
    raise(ErrorKind::kValue,
          fmt::format("tensor '{}': address {:#x} is not CUDA device memory", name, address));
  }
#endif
  return p;
}

// Sets the input shapes and device addresses (pointers from tensors kiln.Context.run checked)
// and returns the output shapes they give.
nb::list set_inputs(PyContext& c, const std::vector<std::string>& names,
                    const std::vector<uintptr_t>& addresses,
                    const std::vector<std::vector<int64_t>>& shapes) {
  if (names.size() != addresses.size() || names.size() != shapes.size())
    raise(ErrorKind::kValue, "names, addresses and shapes differ in length");
  std::vector<std::vector<int64_t>> out_shapes;
  {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(c.mu);
    DeviceGuard on(c.device);
    for (size_t i = 0; i < names.size(); ++i) {
      check(c.ctx->set_input_shape(names[i], shapes[i]), ErrorKind::kValue);
      check(c.ctx->set_tensor_address(names[i], reinterpret_cast<void*>(addresses[i])));
    }
    for (const TensorInfo& t : c.engine->outputs())
      out_shapes.push_back(unwrap(c.ctx->tensor_shape(t.name), ErrorKind::kValue));
  }
  nb::list result;
  for (auto& s : out_shapes) result.append(nb::cast(s));
  return result;
}

// Sets the output addresses and enqueues on `stream` (0: the context's own stream, waited for).
void enqueue_outputs(PyContext& c, const std::vector<uintptr_t>& addresses, uintptr_t stream) {
  if (addresses.size() != c.engine->outputs().size())
    raise(ErrorKind::kValue, "one address per output is needed");
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(c.mu);
  DeviceGuard on(c.device);
  for (size_t i = 0; i < addresses.size(); ++i)
    check(c.ctx->set_tensor_address(c.engine->outputs()[i].name,
                                    reinterpret_cast<void*>(addresses[i])));
  check(c.enqueue(reinterpret_cast<CUstream_st*>(stream)));
}

// `s` with what a Python allocator raised during that enqueue (its message says more than "gave
// no memory"); the allocators' failures are cleared.
Status with_allocator_failure(PyContext& c, Status s, PyOutputAllocator* also = nullptr) {
  std::string f;
  auto take = [&](PyOutputAllocator* a) {
    if (!a || a->failure.empty()) return;
    if (f.empty()) f = a->failure;
    a->failure.clear();
  };
  for (auto& [name, a] : c.allocators) take(a.get());
  take(also);
  if (f.empty()) return s;
  return Status::Error(s.ok() ? f : s.message() + " (" + f + ")");
}

// kiln.Context.run on an engine whose output sizes the data decides: inputs at device addresses,
// every output's memory from `allocator` (run()'s own, from PyTorch's allocator), then the
// allocators set_output_allocator gave are put back. Enqueued on `stream` (0: the context's own,
// waited for). Returns the outputs' shapes.
nb::list run_dynamic(PyContext& c, const std::vector<std::string>& names,
                     const std::vector<uintptr_t>& addresses,
                     const std::vector<std::vector<int64_t>>& shapes, uintptr_t stream,
                     nb::object allocator) {
  if (names.size() != addresses.size() || names.size() != shapes.size())
    raise(ErrorKind::kValue, "names, addresses and shapes differ in length");
  PyOutputAllocator a(std::move(allocator));
  std::vector<std::vector<int64_t>> out_shapes;
  Status st;
  {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(c.mu);
    DeviceGuard on(c.device);
    struct PutBack {  // also when a check below raises: the context must not keep &a
      PyContext& c;
      ~PutBack() {
        for (const TensorInfo& t : c.engine->outputs()) {
          auto it = c.allocators.find(t.name);
          (void)c.ctx->set_output_allocator(t.name, it != c.allocators.end() ? it->second.get()
                                                                             : nullptr);
        }
      }
    } put_back{c};
    for (size_t i = 0; i < names.size(); ++i) {
      check(c.ctx->set_input_shape(names[i], shapes[i]), ErrorKind::kValue);
      check(c.ctx->set_tensor_address(names[i], reinterpret_cast<void*>(addresses[i])));
    }
    for (const TensorInfo& t : c.engine->outputs())
      check(c.ctx->set_output_allocator(t.name, &a), ErrorKind::kValue);
    st = c.enqueue(reinterpret_cast<CUstream_st*>(stream));
    if (st.ok())
      for (const TensorInfo& t : c.engine->outputs())
        out_shapes.push_back(unwrap(c.ctx->tensor_shape(t.name), ErrorKind::kValue));
  }
  check(with_allocator_failure(c, st, &a));
  nb::list result;
  for (auto& s : out_shapes) result.append(nb::cast(s));
  return result;
}

// kiln.Context.run's repeat call: the input shapes are those the context already holds (the
// previous call's, checked then), so only the addresses are set before enqueueing on `stream`.
void run_addresses(PyContext& c, const std::vector<std::string>& names,
                   const std::vector<uintptr_t>& in, const std::vector<uintptr_t>& out,
                   uintptr_t stream) {
  if (names.size() != in.size() || out.size() != c.engine->outputs().size())
    raise(ErrorKind::kValue, "one address per input name and per output is needed");
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(c.mu);
  DeviceGuard on(c.device);
  for (size_t i = 0; i < in.size(); ++i)
    check(c.ctx->set_tensor_address(names[i], reinterpret_cast<void*>(in[i])));
  for (size_t i = 0; i < out.size(); ++i)
    check(c.ctx->set_tensor_address(c.engine->outputs()[i].name, reinterpret_cast<void*>(out[i])));
  check(c.enqueue(reinterpret_cast<CUstream_st*>(stream)));
}

// An uninitialised device array for a run's output when the inputs are not PyTorch tensors
// (which get PyTorch's own): any DLPack consumer takes it without a copy. Returned with its
// address, as (array, address): reading the address back through DLPack would hand out the
// array's capsule, which a consumer can take only once.
nb::tuple device_empty(const std::vector<int64_t>& shape, const std::string& dtype) {
  const std::optional<DataType> t = dtype_from_name(dtype);
  const std::optional<nb::dlpack::dtype> dt = t ? to_dlpack(*t) : std::nullopt;
  if (!dt) raise(ErrorKind::kType, fmt::format("device_empty: unknown element type '{}'", dtype));
#ifdef KILN_WITH_CUDA
  size_t bytes = dtype_size(*t);
  for (int64_t d : shape) {
    if (d < 0) raise(ErrorKind::kValue, "device_empty: negative dimension");
    bytes *= static_cast<size_t>(d);
  }
  void* p = nullptr;
  check(cuda_status(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc"));
  int device = 0;
  cudaGetDevice(&device);
  nb::capsule owner(p, [](void* q) noexcept { cudaFree(q); });
  std::vector<size_t> dims(shape.begin(), shape.end());
  return nb::make_tuple(nb::ndarray<>(p, dims.size(), dims.data(), owner, nullptr, *dt,
                                      nb::device::cuda::value, device),
                        reinterpret_cast<uintptr_t>(p));
#else
  raise(ErrorKind::kRuntime, "device arrays need kiln built with CUDA");
#endif
}

// The address, shape, element type and device of any DLPack tensor (kiln.Context.run checks them
// before its device path takes the address).
nb::tuple dlpack_info(nb::ndarray<> a) {
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect) contiguous = false;
    expect *= a.shape(d);
  }
  const std::optional<DataType> t = from_dlpack(a.dtype());
  return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), shape_of(a),
                        t ? std::string(dtype_name(*t)) : dlpack_name(a.dtype()), a.device_type(),
                        a.device_id(), contiguous);
}

}  // namespace

#ifdef KILN_WITH_CUDA
DeviceGuard::DeviceGuard(int device) {
  if (device < 0) return;
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (current == device) return;
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return;  // the call that follows reports the failure in its own words
  }
  previous_ = current;
}
DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}
int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
#endif

// How a host thread waits for the GPU (cudaStreamSynchronize, a blocking copy): the scheduling
// flag of each device's primary context. The CUDA default, auto, spins while the process has
// fewer active contexts than the machine has cores, so every thread waiting for an inference
// holds a core; "block" waits on a synchronization primitive (cudaDeviceScheduleBlockingSync,
// trtexec's default), "yield" spins but yields, "spin" always spins (trtexec's --useSpinWait).
namespace {
struct WaitMode {
  const char* name;
  unsigned flag;
};
#ifdef KILN_WITH_CUDA
constexpr WaitMode kWaitModes[] = {{"auto", CU_CTX_SCHED_AUTO},
                                   {"spin", CU_CTX_SCHED_SPIN},
                                   {"yield", CU_CTX_SCHED_YIELD},
                                   {"block", CU_CTX_SCHED_BLOCKING_SYNC}};
#else
constexpr WaitMode kWaitModes[] = {{"auto", 0}, {"spin", 1}, {"yield", 2}, {"block", 4}};
#endif

const WaitMode* wait_mode(const std::string& name) {
  for (const WaitMode& m : kWaitModes)
    if (name == m.name) return &m;
  return nullptr;
}

#ifdef KILN_WITH_CUDA
// The driver functions this needs, looked up through the runtime (the extension links the
// runtime only; a machine without a driver never gets here: it sees no device).
struct Driver {
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*get_state)(CUdevice, unsigned*, int*) = nullptr;
  CUresult (*set_flags)(CUdevice, unsigned) = nullptr;
};

Expected<Driver> driver() {
  Driver d;
  auto find = [](const char* name, void** fn) -> Status {
#if CUDART_VERSION >= 12050
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &found);
    const bool ok = found == cudaDriverEntryPointSuccess;
#elif CUDART_VERSION >= 12000
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPoint(name, fn, cudaEnableDefault, &found);
    const bool ok = found == cudaDriverEntryPointSuccess;
#else
    const cudaError_t e = cudaGetDriverEntryPoint(name, fn, cudaEnableDefault);
    const bool ok = true;
#endif
    if (e != cudaSuccess || !ok || !*fn) {
      cudaGetLastError();
      return KILN_ERROR("the CUDA driver has no {}", name);
    }
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(find("cuDeviceGet", reinterpret_cast<void**>(&d.device_get)));
  KILN_RETURN_IF_ERROR(find("cuDevicePrimaryCtxGetState", reinterpret_cast<void**>(&d.get_state)));
  KILN_RETURN_IF_ERROR(find("cuDevicePrimaryCtxSetFlags", reinterpret_cast<void**>(&d.set_flags)));
  return d;
}

const char* wait_mode_name(unsigned flags) {
  for (const WaitMode& m : kWaitModes)
    if ((flags & CU_CTX_SCHED_MASK) == m.flag) return m.name;
  return "auto";
}
#endif
}  // namespace

// Sets how this process's threads wait for every GPU it sees; returns how many GPUs that is (0
// without CUDA or a GPU: the cpu backend never waits for a device, so nothing is set). Must run
// before the first engine load or context on a device has created its CUDA context: a device
// whose context exists with another mode is an error naming it (one that already has this mode
// is fine), and no device is changed then.
Expected<int> set_gpu_wait(const std::string& mode) {
  const WaitMode* m = wait_mode(mode);
  if (!m) return KILN_ERROR("unknown GPU wait mode '{}' (one of: block, spin, yield, auto)", mode);
#ifdef KILN_WITH_CUDA
  const int n = cuda_device_count();
  if (n == 0) return 0;
  KILN_ASSIGN_OR_RETURN(Driver d, driver());
  std::vector<std::pair<CUdevice, unsigned>> todo;
  for (int i = 0; i < n; ++i) {
    CUdevice dev{};
    unsigned flags = 0;
    int active = 0;
    if (d.device_get(&dev, i) != CUDA_SUCCESS || d.get_state(dev, &flags, &active) != CUDA_SUCCESS)
      return KILN_ERROR("cannot read the state of CUDA device {}'s context", i);
    if (active && (flags & CU_CTX_SCHED_MASK) != m->flag)
      return KILN_ERROR(
          "GPU wait mode '{}': CUDA device {} already has its context (waiting '{}'); set the "
          "wait mode before this process loads an engine or makes a context",
          mode, i, wait_mode_name(flags));
    todo.emplace_back(dev, (flags & ~static_cast<unsigned>(CU_CTX_SCHED_MASK)) | m->flag);
  }
  for (size_t i = 0; i < todo.size(); ++i)
    if (d.set_flags(todo[i].first, todo[i].second) != CUDA_SUCCESS)
      return KILN_ERROR("cannot set the wait mode of CUDA device {}", i);
  return n;
#else
  return 0;
#endif
}

// The wait mode of device `device`'s context (what set_gpu_wait set, else CUDA's default,
// "auto"); "" without CUDA or without that device.
std::string gpu_wait(int device) {
#ifdef KILN_WITH_CUDA
  if (device < 0 || device >= cuda_device_count()) return "";
  Expected<Driver> d = driver();
  CUdevice dev{};
  unsigned flags = 0;
  int active = 0;
  if (!d.ok() || d->device_get(&dev, device) != CUDA_SUCCESS ||
      d->get_state(dev, &flags, &active) != CUDA_SUCCESS)
    return "";
  return wait_mode_name(flags);
#else
  (void)device;
  return "";
#endif
}

#ifndef KILN_WITH_CUDA
DeviceGuard::DeviceGuard(int) {}
DeviceGuard::~DeviceGuard() {}
int cuda_device_count() { return 0; }
#endif

void bind_context(nb::module_& m) {
  nb::class_<PyContext>(m, "Context")
      .def("execute", &execute, nb::arg("feeds"),
           "Runs on host arrays (name, array) and returns the outputs as NumPy arrays.")
      .def("_set_inputs", &set_inputs, nb::arg("names"), nb::arg("addresses"), nb::arg("shapes"))
      .def("_enqueue_outputs", &enqueue_outputs, nb::arg("addresses"), nb::arg("stream"))
      .def("_run_addresses", &run_addresses, nb::arg("names"), nb::arg("inputs"),
           nb::arg("outputs"), nb::arg("stream"))
      .def(
          "set_input_shape",
          [](PyContext& c, const std::string& name, const std::vector<int64_t>& dims) {
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(c.mu);
            DeviceGuard on(c.device);
            check(c.ctx->set_input_shape(name, dims), ErrorKind::kValue);
          },
          nb::arg("name"), nb::arg("shape"))
      .def(
          "get_tensor_shape",
          [](PyContext& c, const std::string& name) {
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(c.mu);
            DeviceGuard on(c.device);
            return unwrap(c.ctx->tensor_shape(name), ErrorKind::kValue);
          },
          nb::arg("name"))
      .def(
          "set_tensor_address",
          [](PyContext& c, const std::string& name, uintptr_t address) {
            void* p = device_pointer(address, name);
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(c.mu);
            check(c.ctx->set_tensor_address(name, p), ErrorKind::kValue);
          },
          nb::arg("name"), nb::arg("address"))
      .def(
          "execute_async",
          [](PyContext& c, uintptr_t stream) {
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(c.mu);
            DeviceGuard on(c.device);
            check(with_allocator_failure(c, c.enqueue(reinterpret_cast<CUstream_st*>(stream))));
          },
          nb::arg("stream"))
      .def("_run_dynamic", &run_dynamic, nb::arg("names"), nb::arg("addresses"),
           nb::arg("shapes"), nb::arg("stream"), nb::arg("allocator"))
      .def(
          "set_output_allocator",
          [](PyContext& c, const std::string& name, nb::object allocator) {
            std::unique_ptr<PyOutputAllocator> a;
            if (!allocator.is_none()) {
              if (!nb::hasattr(allocator, "reallocate_output") ||
                  !nb::hasattr(allocator, "notify_shape"))
                raise(ErrorKind::kType,
                      fmt::format("output '{}': an output allocator has reallocate_output(name, "
                                  "memory, size, alignment) and notify_shape(name, shape)",
                                  name));
              a = std::make_unique<PyOutputAllocator>(std::move(allocator));
            }
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(c.mu);
              check(c.ctx->set_output_allocator(name, a.get()), ErrorKind::kValue);
              // Under the lock, as a run on another thread reads the map; the one it replaces
              // goes with `a`, destroyed once the GIL is held again (it holds a Python object).
              std::swap(c.allocators[name], a);
            }
          },
          nb::arg("name"), nb::arg("allocator").none())
      .def(
          "set_use_cuda_graph",
          [](PyContext& c, bool on) {
            std::lock_guard<std::mutex> lock(c.mu);
            check(c.ctx->set_use_cuda_graph(on));
          },
          nb::arg("on"))
      .def("memory_info", [](PyContext& c) {
        std::lock_guard<std::mutex> lock(c.mu);
        const MemoryInfo m = c.ctx->memory_info();
        return nb::make_tuple(m.weights, m.activations, m.workspace);
      });
  m.def(
      "create_context",
      [](const PyEngine& e) {
        auto c = std::make_unique<PyContext>();
        c->engine = e.engine;
        c->device = e.device;
        {
          nb::gil_scoped_release release;
          DeviceGuard on(e.device);
          c->ctx = unwrap(e.engine->create_context());
        }
        return c;
      },
      nb::arg("engine"));
  m.def("device_empty", &device_empty, nb::arg("shape"), nb::arg("dtype"));
  m.def("cuda_device_count", &cuda_device_count,
        "CUDA devices this process sees (0 without CUDA or a driver).");
  m.def("dlpack_info", &dlpack_info, nb::arg("tensor"));
  m.def(
      "set_gpu_wait",
      [](const std::string& mode) {
        if (!wait_mode(mode)) unwrap(set_gpu_wait(mode), ErrorKind::kValue);  // the mode's error
        return unwrap(set_gpu_wait(mode));
      },
      nb::arg("mode"),
      "How this process's threads wait for the GPUs: 'block' (yield the core until the GPU is "
      "done), 'spin', 'yield' or 'auto' (CUDA's default). Before any engine load or context; "
      "returns the number of GPUs set (0 without one: a no-op).");
  m.def("gpu_wait", &gpu_wait, nb::arg("device") = 0,
        "The wait mode of a GPU's context ('' without CUDA or that device).");
}

}  // namespace kiln::py
