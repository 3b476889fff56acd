// batch_csv: samples from a CSV file through a kiln engine in batches of N, predictions to CSV.
//
//   batch_csv ENGINE INPUT.csv OUTPUT.csv [--batch N]
//
// The engine has one input whose first dimension is a dynamic batch (built with
// --min-shapes/--max-shapes); each CSV row is one sample, as many numbers as one sample of the
// input holds (a header row of names is skipped). On the cuda backend the batches run on the
// device path: set_input_shape for each batch's size, set_tensor_address with device buffers
// allocated here, and enqueue on a CUDA stream this program owns, with the copies between host
// and device on the same stream. On the cpu backend execute() reads the batch in place from the
// host buffer. Prints the throughput and the number of host<->device copies; writes
// row,prediction,score and every output value of each sample to OUTPUT.csv.
// Errors: one line on stderr and exit status 1.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <kiln/engine.h>

#ifdef KILN_WITH_CUDA  // kiln::kiln defines it when kiln was built with its CUDA backend
#include <cuda_runtime_api.h>
#endif

namespace {

struct Samples {
  std::vector<float> values;  // row-major: rows x per_row
  size_t rows = 0;
};

bool parse_float(std::string_view s, float& v) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

// Rows of `per_row` numbers separated by commas; a first row with no number in it is a header.
kiln::Expected<Samples> read_csv(const std::string& path, size_t per_row, const std::string& what) {
  std::ifstream f(path);
  if (!f) return KILN_ERROR("{}: cannot open the CSV file", path);
  Samples s;
  std::string line;
  std::vector<std::string_view> fields;
  for (size_t line_no = 1; std::getline(f, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    fields.clear();
    for (size_t start = 0;;) {
      const size_t comma = line.find(',', start);
      fields.emplace_back(line.data() + start,
                          (comma == std::string::npos ? line.size() : comma) - start);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (line_no == 1 && std::none_of(fields.begin(), fields.end(), [](std::string_view x) {
          float v;
          return parse_float(x, v);
        }))
      continue;  // the header
    if (fields.size() != per_row)
      return KILN_ERROR("{} line {}: {} values, but {} takes {} a sample", path, line_no,
                        fields.size(), what, per_row);
    for (size_t c = 0; c < fields.size(); ++c) {
      float v = 0;
      if (!parse_float(fields[c], v))
        return KILN_ERROR("{} line {}, column {}: '{}' is not a number", path, line_no, c + 1,
                          fields[c]);
      s.values.push_back(v);
    }
    ++s.rows;
  }
  if (s.rows == 0) return KILN_ERROR("{}: no samples", path);
  return s;
}

// One batch's outputs on the host, as the engine gives them: shape and raw bytes per output.
struct HostOutputs {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const void*> data;
};

struct Stats {
  size_t h2d = 0, d2h = 0;             // copies between host and device
  size_t h2d_bytes = 0, d2h_bytes = 0;
};

// Runs one batch of `n` samples (`x`: n x per-sample values, already in the input's type) and
// hands its outputs to `take`. Two implementations: the device path (cuda) and execute() (cpu).
class Runner {
 public:
  virtual ~Runner() = default;
  virtual kiln::Status run(const void* x, int64_t n,
                           const std::function<kiln::Status(const HostOutputs&)>& take) = 0;
  Stats stats;
};

std::vector<int64_t> with_batch(std::vector<int64_t> dims, int64_t n) {
  dims[0] = n;
  return dims;
}

size_t bytes_of(kiln::DataType t, const std::vector<int64_t>& shape) {
  size_t n = kiln::dtype_size(t);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// cpu backend: execute() on a tensor that views the batch in the caller's buffer (no copy).
class HostRunner final : public Runner {
 public:
  HostRunner(const kiln::Engine& e, std::unique_ptr<kiln::ExecutionContext> ctx)
      : e_(e), ctx_(std::move(ctx)) {}
  kiln::Status run(const void* x, int64_t n,
                   const std::function<kiln::Status(const HostOutputs&)>& take) override {
    const kiln::TensorInfo& in = e_.inputs()[0];
    kiln::Tensor batch = kiln::Tensor::view(in.dtype, with_batch(in.dims, n), x, nullptr);
    KILN_ASSIGN_OR_RETURN(std::vector<kiln::Tensor> outs, ctx_->execute({{in.name, batch}}));
    HostOutputs h;
    for (const kiln::Tensor& t : outs) {
      h.shapes.push_back(t.shape());
      h.data.push_back(t.raw());
    }
    return take(h);
  }

 private:
  const kiln::Engine& e_;
  std::unique_ptr<kiln::ExecutionContext> ctx_;
};

#ifdef KILN_WITH_CUDA
#define CUDA_TRY(call)                                                              \
  do {                                                                              \
    if (cudaError_t e_ = (call); e_ != cudaSuccess)                                 \
      return KILN_ERROR("{} failed: {}", #call, cudaGetErrorString(e_));            \
  } while (0)

// cuda backend: the device path, TensorRT style. Device buffers for the largest batch and
// pinned host buffers are allocated once; each batch is one copy in, enqueue, one copy out per
// output, all on this program's own stream, and one synchronize.
class DeviceRunner final : public Runner {
 public:
  DeviceRunner(const kiln::Engine& e, std::unique_ptr<kiln::ExecutionContext> ctx)
      : e_(e), ctx_(std::move(ctx)) {}
  ~DeviceRunner() override {
    for (void* p : device_) cudaFree(p);
    for (void* p : pinned_) cudaFreeHost(p);
    if (stream_) cudaStreamDestroy(stream_);
  }

  kiln::Status init(int64_t max_batch) {
    CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const kiln::TensorInfo& in = e_.inputs()[0];
    // The output sizes at the largest batch size the buffers must hold.
    KILN_RETURN_IF_ERROR(ctx_->set_input_shape(in.name, with_batch(in.dims, max_batch)));
    KILN_RETURN_IF_ERROR(alloc(bytes_of(in.dtype, with_batch(in.dims, max_batch))));
    for (const kiln::TensorInfo& out : e_.outputs()) {
      KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ctx_->tensor_shape(out.name));
      KILN_RETURN_IF_ERROR(alloc(bytes_of(out.dtype, shape)));
    }
    return kiln::Status::Ok();
  }

  kiln::Status run(const void* x, int64_t n,
                   const std::function<kiln::Status(const HostOutputs&)>& take) override {
    const kiln::TensorInfo& in = e_.inputs()[0];
    const std::vector<int64_t> in_shape = with_batch(in.dims, n);
    KILN_RETURN_IF_ERROR(ctx_->set_input_shape(in.name, in_shape));
    KILN_RETURN_IF_ERROR(ctx_->set_tensor_address(in.name, device_[0]));
    const size_t in_bytes = bytes_of(in.dtype, in_shape);
    std::copy_n(static_cast<const char*>(x), in_bytes, static_cast<char*>(pinned_[0]));
    CUDA_TRY(cudaMemcpyAsync(device_[0], pinned_[0], in_bytes, cudaMemcpyHostToDevice, stream_));
    ++stats.h2d;
    stats.h2d_bytes += in_bytes;
    HostOutputs h;
    for (size_t i = 0; i < e_.outputs().size(); ++i) {
      const kiln::TensorInfo& out = e_.outputs()[i];
      KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ctx_->tensor_shape(out.name));
      KILN_RETURN_IF_ERROR(ctx_->set_tensor_address(out.name, device_[i + 1]));
      h.shapes.push_back(shape);
      h.data.push_back(pinned_[i + 1]);
    }
    KILN_RETURN_IF_ERROR(ctx_->enqueue(stream_));
    for (size_t i = 0; i < e_.outputs().size(); ++i) {
      const size_t bytes = bytes_of(e_.outputs()[i].dtype, h.shapes[i]);
      CUDA_TRY(cudaMemcpyAsync(pinned_[i + 1], device_[i + 1], bytes, cudaMemcpyDeviceToHost,
                               stream_));
      ++stats.d2h;
      stats.d2h_bytes += bytes;
    }
    CUDA_TRY(cudaStreamSynchronize(stream_));
    return take(h);
  }

 private:
  kiln::Status alloc(size_t bytes) {
    void* d = nullptr;
    void* p = nullptr;
    CUDA_TRY(cudaMalloc(&d, std::max<size_t>(bytes, 1)));
    device_.push_back(d);
    CUDA_TRY(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
    pinned_.push_back(p);
    return kiln::Status::Ok();
  }

  const kiln::Engine& e_;
  std::unique_ptr<kiln::ExecutionContext> ctx_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> device_, pinned_;  // [0]: the input, [1 + i]: output i
};
#endif

kiln::Status run(int argc, char** argv) {
  std::vector<std::string> positional;
  int64_t batch = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fmt::print("usage: batch_csv ENGINE INPUT.csv OUTPUT.csv [--batch N]  (default N: 8)\n");
      return kiln::Status::Ok();
    }
    if (a == "--batch" && i + 1 < argc) {
      const std::string v = argv[++i];
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), batch);
      if (ec != std::errc() || end != v.data() + v.size() || batch <= 0)
        return KILN_ERROR("--batch '{}': expected a positive whole number", v);
    } else if (a.rfind("--", 0) == 0) {
      return KILN_ERROR("unknown option {} (--help)", a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 3)
    return KILN_ERROR("expected ENGINE INPUT.csv OUTPUT.csv, got {} arguments (--help)",
                      positional.size());
  const std::string &engine_path = positional[0], &csv_in = positional[1], &csv_out = positional[2];

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<kiln::Engine> engine, kiln::Engine::load(engine_path));
  if (engine->inputs().size() != 1)
    return KILN_ERROR("{}: batch_csv feeds one input, this engine has {}", engine_path,
                      engine->inputs().size());
  const kiln::TensorInfo& in = engine->inputs()[0];
  if (in.dims.empty() || in.dims[0] != -1 ||
      std::any_of(in.dims.begin() + 1, in.dims.end(), [](int64_t d) { return d <= 0; }))
    return KILN_ERROR("{}: input {} needs a dynamic batch dimension first and fixed sizes "
                      "after it (kiln build --min-shapes/--max-shapes)", engine_path, in.str());
  if (in.dtype != kiln::DataType::kFloat32 && in.dtype != kiln::DataType::kFloat16)
    return KILN_ERROR("{}: input {} is not float32 or float16", engine_path, in.str());
  size_t per_row = 1;
  for (size_t i = 1; i < in.dims.size(); ++i) per_row *= static_cast<size_t>(in.dims[i]);

  KILN_ASSIGN_OR_RETURN(Samples samples, read_csv(csv_in, per_row, "input " + in.str()));
  batch = std::min<int64_t>(batch, static_cast<int64_t>(samples.rows));
  // The samples in the input's element type.
  std::vector<uint16_t> halves;
  const void* x = samples.values.data();
  if (in.dtype == kiln::DataType::kFloat16) {
    halves.resize(samples.values.size());
    std::transform(samples.values.begin(), samples.values.end(), halves.begin(),
                   kiln::float_to_half);
    x = halves.data();
  }
  const size_t sample_bytes = per_row * kiln::dtype_size(in.dtype);

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<kiln::ExecutionContext> ctx, engine->create_context());
  std::unique_ptr<Runner> runner;
  std::string how;
#ifdef KILN_WITH_CUDA
  if (engine->backend() == "cuda") {
    auto device = std::make_unique<DeviceRunner>(*engine, std::move(ctx));
    KILN_RETURN_IF_ERROR(device->init(batch));
    runner = std::move(device);
    how = "set_input_shape + set_tensor_address + enqueue on this program's CUDA stream";
  }
#endif
  if (!runner) {
    if (engine->backend() != "cpu")
      return KILN_ERROR("{}: a {} engine needs kiln built with CUDA", engine_path,
                        engine->backend());
    runner = std::make_unique<HostRunner>(*engine, std::move(ctx));
    how = "execute() on the host buffers";
  }

  // Predictions: per sample, every output's values; the first output's arg max is the class.
  std::vector<std::vector<double>> values(samples.rows);
  std::vector<int64_t> per_sample(engine->outputs().size());  // values a sample, per output
  size_t row = 0;
  auto take = [&](const HostOutputs& h) -> kiln::Status {
    const int64_t n = h.shapes[0].empty() ? 0 : h.shapes[0][0];
    for (size_t o = 0; o < h.shapes.size(); ++o) {
      const kiln::Tensor t = kiln::Tensor::view(engine->outputs()[o].dtype, h.shapes[o],
                                                h.data[o], nullptr);
      if (t.rank() == 0 || t.dim(0) != n)
        return KILN_ERROR("output '{}' {} has no leading batch dimension of {}",
                          engine->outputs()[o].name, t.desc(), n);
      const int64_t per = t.numel() / n;
      per_sample[o] = per;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < per; ++j) values[row + i].push_back(t.at_double(i * per + j));
    }
    row += static_cast<size_t>(n);
    return kiln::Status::Ok();
  };
  size_t batches = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t start = 0; start < samples.rows; start += static_cast<size_t>(batch), ++batches) {
    const int64_t n = std::min<int64_t>(batch, static_cast<int64_t>(samples.rows - start));
    KILN_RETURN_IF_ERROR(runner->run(static_cast<const char*>(x) + start * sample_bytes, n, take)
                             .with_context(fmt::format("batch {} (rows {}..{})", batches + 1,
                                                       start + 1, start + n)));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::ofstream f(csv_out);
  if (!f) return KILN_ERROR("{}: cannot write the predictions", csv_out);
  std::string header = "row,prediction,score";
  for (size_t o = 0; o < per_sample.size(); ++o)
    for (int64_t j = 0; j < per_sample[o]; ++j)
      header += fmt::format(",{}_{}", engine->outputs()[o].name, j);
  f << header << "\n";
  for (size_t r = 0; r < values.size(); ++r) {
    const auto& v = values[r];
    const auto best = std::max_element(v.begin(), v.begin() + per_sample[0]) - v.begin();
    f << fmt::format("{},{},{}", r, best, static_cast<float>(v[best]));
    for (double d : v) f << fmt::format(",{}", static_cast<float>(d));
    f << "\n";
  }
  if (!f.flush()) return KILN_ERROR("{}: writing the predictions failed", csv_out);

  const Stats& s = runner->stats;
  fmt::print("engine     {}: {} backend, {} -> {}\n", engine_path, engine->backend(), in.str(),
             engine->outputs()[0].str());
  fmt::print("samples    {} rows of {} values from {}\n", samples.rows, per_row, csv_in);
  fmt::print("batches    {} of up to {} ({})\n", batches, batch, how);
  fmt::print("throughput {:.1f} samples/s ({:.3f} ms for all batches, {:.3f} ms a batch)\n",
             static_cast<double>(samples.rows) / seconds, seconds * 1e3,
             seconds * 1e3 / static_cast<double>(batches));
  fmt::print("transfers  {} host->device ({} bytes), {} device->host ({} bytes)\n", s.h2d,
             s.h2d_bytes, s.d2h, s.d2h_bytes);
  fmt::print("wrote      {} predictions to {}\n", values.size(), csv_out);
  return kiln::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  const kiln::Status st = run(argc, argv);
  if (!st.ok()) {
    std::cerr << "batch_csv: error: " << st.message() << "\n";
    return 1;
  }
  return 0;
}
