// kiln._kiln: the engine, its build and load, and the errors. kiln/__init__.py wraps it into the
// documented API (kiln.build, kiln.load, Engine, InferenceSession, ...).
#include <fmt/format.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "kiln/tools.h"

namespace kiln::py {
namespace {

PyObject* g_error = nullptr;
PyObject* g_value_error = nullptr;
PyObject* g_type_error = nullptr;

// kiln's messages are one line; names read from files may carry control characters.
std::string one_line(std::string s) {
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n' || c == '\r' || c == '\t')
      c = ' ';
    else if (u < 0x20 || u == 0x7f)
      c = '?';
  }
  return s;
}

// The shape of a tensor as declared: an int per static dimension, the symbol (or None) per
// dynamic one, as ONNX Runtime's NodeArg.shape.
nb::list declared_shape(const TensorInfo& t) {
  nb::list out;
  for (size_t i = 0; i < t.dims.size(); ++i) {
    if (t.dims[i] >= 0)
      out.append(t.dims[i]);
    else if (i < t.dim_names.size() && !t.dim_names[i].empty())
      out.append(nb::str(t.dim_names[i].c_str()));
    else
      out.append(nb::none());
  }
  return out;
}

// `device` >= 0: the CUDA device the engine's weights and contexts go to (a cuda engine; a cpu
// engine ignores it). Each load is an engine of its own, so one file loaded once per device
// serves from each.
PyEngine load(const std::string& path, int device) {
  PyEngine e;
  {
    nb::gil_scoped_release release;
    DeviceGuard on(device);  // what a load asks of the GPU, on that GPU (a no-op for cpu builds)
    e.engine = unwrap(Engine::load(path));  // the weights go to the device at the first context
  }
  if (device >= 0 && e.engine->backend() == "cuda") {
    if (device >= cuda_device_count())
      raise(ErrorKind::kValue, fmt::format("CUDA device {} does not exist (this process sees {})",
                                           device, cuda_device_count()));
    e.device = device;
  }
  return e;
}

struct BuildArgs {
  std::string path, backend, calib_algo, calib_cache, timing_cache;
  bool fp16 = false, int8 = false, tf32 = true;
  int opt_level = 2;
  ShapeMap shapes, min_shapes, opt_shapes, max_shapes;
  std::map<std::string, std::string> calib, layer_precisions;
  std::vector<std::string> input_io_formats, output_io_formats;
  size_t calib_batches = 0;
  double accuracy_budget = 0;
};

PyEngine build(const BuildArgs& a, nb::handle progress) {
  if (a.opt_level < 0 || a.opt_level > 2)
    raise(ErrorKind::kValue, fmt::format("opt_level must be 0, 1 or 2, not {}", a.opt_level));
  BuildConfig c;
  c.backend = a.backend;
  c.fp16 = a.fp16;
  c.int8 = a.int8;
  c.tf32 = a.tf32;
  c.opt_level = a.opt_level;
  c.shapes = a.shapes;
  c.min_shapes = a.min_shapes;
  c.opt_shapes = a.opt_shapes;
  c.max_shapes = a.max_shapes;
  c.calib_data = a.calib;
  c.calib_algo = a.calib_algo;
  c.calib_cache = a.calib_cache;
  c.calib_batches = a.calib_batches;
  c.accuracy_budget = a.accuracy_budget;
  c.timing_cache = a.timing_cache;
  c.layer_precisions = a.layer_precisions;
  c.input_io_formats = a.input_io_formats;
  c.output_io_formats = a.output_io_formats;
  // The callback runs on this thread while the build holds no GIL; the first exception it
  // raises is raised again once the build is done.
  std::exception_ptr callback_error;
  if (progress.is_valid() && !progress.is_none()) {
    c.progress = [progress, &callback_error](const std::string& line) {
      nb::gil_scoped_acquire acquire;
      if (callback_error) return;
      try {
        progress(line);
      } catch (...) {
        callback_error = std::current_exception();
      }
    };
  }
  Expected<std::unique_ptr<Engine>> e = Status::Error("not built");
  {
    nb::gil_scoped_release release;
    e = Engine::build_from_onnx(a.path, c);
  }
  if (callback_error) std::rethrow_exception(callback_error);
  return PyEngine{unwrap(std::move(e))};
}

}  // namespace

Error::Error(ErrorKind kind, std::string message)
    : kind_(kind), message_(one_line(std::move(message))) {}

void raise(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

void register_errors(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("kiln.KilnError",
                                      "An error reported by kiln, with kiln's one-line message.",
                                      PyExc_RuntimeError, nullptr);
  nb::object value_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_value_error = PyErr_NewExceptionWithDoc(
      "kiln.KilnValueError", "A value passed to kiln is wrong (a shape, a name, an option).",
      value_bases.ptr(), nullptr);
  nb::object type_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_TypeError));
  g_type_error = PyErr_NewExceptionWithDoc(
      "kiln.KilnTypeError",
      "An argument of the wrong kind or element type (kiln never converts arrays silently).",
      type_bases.ptr(), nullptr);
  m.attr("KilnError") = nb::handle(g_error);
  m.attr("KilnValueError") = nb::handle(g_value_error);
  m.attr("KilnTypeError") = nb::handle(g_type_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = e.kind() == ErrorKind::kValue  ? g_value_error
                       : e.kind() == ErrorKind::kType ? g_type_error
                                                      : g_error;
      PyErr_SetString(type, e.what());
    }
  });
}

std::optional<nb::dlpack::dtype> to_dlpack(DataType t) {
  using C = nb::dlpack::dtype_code;
  auto d = [](C code, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (t) {
    case DataType::kFloat32:
      return d(C::Float, 32);
    case DataType::kFloat16:
      return d(C::Float, 16);
    case DataType::kFloat64:
      return d(C::Float, 64);
    case DataType::kBFloat16:
      return d(C::Bfloat, 16);
    case DataType::kInt8:
      return d(C::Int, 8);
    case DataType::kInt16:
      return d(C::Int, 16);
    case DataType::kInt32:
      return d(C::Int, 32);
    case DataType::kInt64:
      return d(C::Int, 64);
    case DataType::kUInt8:
      return d(C::UInt, 8);
    case DataType::kUInt16:
      return d(C::UInt, 16);
    case DataType::kUInt32:
      return d(C::UInt, 32);
    case DataType::kUInt64:
      return d(C::UInt, 64);
    case DataType::kBool:
      return d(C::Bool, 8);
    default:
      return std::nullopt;
  }
}

std::optional<DataType> from_dlpack(nb::dlpack::dtype d) {
  for (DataType t :
       {DataType::kFloat32, DataType::kFloat16, DataType::kFloat64, DataType::kBFloat16,
        DataType::kInt8, DataType::kInt16, DataType::kInt32, DataType::kInt64, DataType::kUInt8,
        DataType::kUInt16, DataType::kUInt32, DataType::kUInt64, DataType::kBool})
    if (to_dlpack(t) == d) return t;
  return std::nullopt;
}

std::string dlpack_name(nb::dlpack::dtype d) {
  if (auto t = from_dlpack(d)) return std::string(dtype_name(*t));
  return fmt::format("an element type kiln does not take (DLPack code {}, {} bits, {} lanes)",
                     static_cast<int>(d.code), static_cast<int>(d.bits), static_cast<int>(d.lanes));
}

}  // namespace kiln::py

using namespace kiln;
using namespace kiln::py;

NB_MODULE(_kiln, m) {
  m.doc() = "kiln's C++ core; use the kiln package, which wraps it.";
  register_errors(m);
  m.attr("__version__") = KILN_VERSION_STRING;

  nb::class_<TensorInfo>(m, "TensorInfo", "An engine input or output as declared.")
      .def_ro("name", &TensorInfo::name)
      .def_prop_ro(
          "dtype", [](const TensorInfo& t) { return std::string(dtype_name(t.dtype)); },
          "NumPy's name of the element type: 'float32', 'int64', 'bool', ...")
      .def_prop_ro("shape", &declared_shape,
                   "One entry per dimension: an int, the symbol of a dynamic one ('N'), or None.")
      .def("__str__", &TensorInfo::str)
      .def("__repr__", [](const TensorInfo& t) { return "<kiln.TensorInfo " + t.str() + ">"; });

  nb::class_<PyEngine>(m, "Engine")
      .def_prop_ro("inputs", [](const PyEngine& e) { return e.engine->inputs(); })
      .def_prop_ro("outputs", [](const PyEngine& e) { return e.engine->outputs(); })
      .def_prop_ro("backend", [](const PyEngine& e) { return e.engine->backend(); })
      .def_prop_ro("target", [](const PyEngine& e) { return e.engine->target(); })
      .def_prop_ro("kiln_version", [](const PyEngine& e) { return e.engine->kiln_version(); })
      .def_prop_ro("device", [](const PyEngine& e) { return e.device; })
      .def_prop_ro("build_options_json",
                   [](const PyEngine& e) { return e.engine->build_options_json(); })
      .def(
          "inspect_json",
          [](const PyEngine& e) {
            nb::gil_scoped_release release;
            return inspect_json(*e.engine);
          },
          "What `kiln inspect --json` prints for this engine, as JSON text.")
      .def(
          "save",
          [](const PyEngine& e, const std::string& path) {
            nb::gil_scoped_release release;
            check(e.engine->save(path));
          },
          nb::arg("path"));

  m.def("load", &load, nb::arg("path"), nb::arg("device") = -1);
  m.def(
      "build",
      [](const std::string& path, bool fp16, bool int8, bool tf32, int opt_level,
         const std::string& backend, const ShapeMap& shapes, const ShapeMap& min_shapes,
         const ShapeMap& opt_shapes, const ShapeMap& max_shapes,
         const std::map<std::string, std::string>& calib, const std::string& calib_algo,
         const std::string& calib_cache, size_t calib_batches, double accuracy_budget,
         const std::string& timing_cache,
         const std::map<std::string, std::string>& layer_precisions,
         const std::vector<std::string>& input_io_formats,
         const std::vector<std::string>& output_io_formats, nb::handle progress) {
        BuildArgs a;
        a.path = path;
        a.fp16 = fp16;
        a.int8 = int8;
        a.tf32 = tf32;
        a.opt_level = opt_level;
        a.backend = backend;
        a.shapes = shapes;
        a.min_shapes = min_shapes;
        a.opt_shapes = opt_shapes;
        a.max_shapes = max_shapes;
        a.calib = calib;
        a.calib_algo = calib_algo;
        a.calib_cache = calib_cache;
        a.calib_batches = calib_batches;
        a.accuracy_budget = accuracy_budget;
        a.timing_cache = timing_cache;
        a.layer_precisions = layer_precisions;
        a.input_io_formats = input_io_formats;
        a.output_io_formats = output_io_formats;
        return build(a, progress);
      },
      nb::arg("path"), nb::kw_only(), nb::arg("fp16"), nb::arg("int8"), nb::arg("tf32"),
      nb::arg("opt_level"), nb::arg("backend"), nb::arg("shapes"), nb::arg("min_shapes"),
      nb::arg("opt_shapes"), nb::arg("max_shapes"), nb::arg("calib"), nb::arg("calib_algo"),
      nb::arg("calib_cache"), nb::arg("calib_batches"), nb::arg("accuracy_budget"),
      nb::arg("timing_cache"), nb::arg("layer_precisions"), nb::arg("input_io_formats"),
      nb::arg("output_io_formats"), nb::arg("progress").none());
  m.def("default_backend", &default_backend,
        "'cuda' when the CUDA backend is built and a GPU is usable, else 'cpu'.");
  m.def("backend_unavailable_reason", &backend_unavailable_reason, nb::arg("backend"),
        "Why a backend cannot be used here ('' when it can).");
  bind_context(m);
}
