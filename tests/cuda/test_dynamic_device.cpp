// The device path of an engine whose output sizes the data decides: enqueue() with output
// allocators (TensorRT's IOutputAllocator) gives what execute() gives, asks for memory at the
// real sizes, and refuses an output without an allocator or an allocator without memory.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "backends/backend_info.h"
#include "kiln/engine.h"
#include "ops/op.h"

namespace kiln {
namespace {

bool have_gpu() { return cuda_device_count() > 0; }

Tensor random(std::vector<int64_t> shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// x [N,256] -> Relu -> NonZero -> idx [2, positives]; and y = Relu(x) (sized by the input).
std::unique_ptr<Engine> nonzero_engine() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 256}));
  g->add_input(x);
  Node* relu = g->add_node("Relu", "relu", {x}, {"y"});
  Node* nz = g->add_node("NonZero", "nz", {relu->output(0)}, {"idx"});
  g->add_output(nz->output(0));
  g->add_output(relu->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  BuildConfig c;
  c.backend = "cuda";
  c.tf32 = false;
  c.min_shapes = {{"x", {1, 256}}};
  c.opt_shapes = {{"x", {64, 256}}};
  c.max_shapes = {{"x", {64, 256}}};
  auto e = Engine::build_from_graph(std::move(g), c, "nonzero_net");
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Device buffers per output, grown on demand; records what it was asked.
struct Recorder : OutputAllocator {
  std::map<std::string, std::pair<void*, size_t>> bufs;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, void*> current_seen;
  bool refuse = false;
  ~Recorder() override {
    for (auto& [n, b] : bufs) cudaFree(b.first);
  }
  void* reallocate_output(const std::string& name, void* current, size_t bytes) override {
    current_seen[name] = current;
    if (refuse) return nullptr;
    auto& [p, size] = bufs[name];
    if (p && size >= bytes) return p;
    if (p) cudaFree(p);
    size = std::max<size_t>(bytes, 16);
    if (cudaMalloc(&p, size) != cudaSuccess) p = nullptr;
    return p;
  }
  void notify_shape(const std::string& name, const std::vector<int64_t>& dims) override {
    shapes[name] = dims;
  }
  Tensor read(const std::string& name, DataType t) const {
    Tensor h(t, shapes.at(name));
    cudaMemcpy(h.raw(), bufs.at(name).first, h.nbytes(), cudaMemcpyDeviceToHost);
    return h;
  }
};

TEST(CudaDynamicDevice, EnqueueWithOutputAllocatorsMatchesExecute) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = nonzero_engine();
  ASSERT_TRUE(e);
  auto host = e->create_context();
  auto dev = e->create_context();
  ASSERT_TRUE(host.ok() && dev.ok());
  Recorder rec;
  ASSERT_TRUE(dev.value()->set_output_allocator("idx", &rec).ok());
  ASSERT_TRUE(dev.value()->set_output_allocator("y", &rec).ok());
  void* dx = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, 64 * 256 * sizeof(float)), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* first_idx = nullptr;
  // Batches that shrink and grow: the allocator sees its last buffer again each time.
  for (int64_t n : {4, 64, 2}) {
    const Tensor x = random({n, 256}, 10 + n);
    auto want = host.value()->execute({{"x", x}});
    ASSERT_TRUE(want.ok()) << want.status().message();
    cudaMemcpy(dx, x.raw(), x.nbytes(), cudaMemcpyHostToDevice);
    ASSERT_TRUE(dev.value()->set_input_shape("x", {n, 256}).ok());
    ASSERT_TRUE(dev.value()->set_tensor_address("x", dx).ok());
    const Status st = dev.value()->enqueue(s);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(rec.current_seen["idx"], first_idx) << "batch " << n;
    first_idx = rec.bufs["idx"].first;
    const Tensor idx = rec.read("idx", DataType::kInt64), y = rec.read("y", DataType::kFloat32);
    ASSERT_EQ(idx.shape(), want.value()[0].shape()) << "batch " << n;
    ASSERT_EQ(y.shape(), want.value()[1].shape()) << "batch " << n;
    EXPECT_EQ(std::memcmp(idx.raw(), want.value()[0].raw(), idx.nbytes()), 0) << "batch " << n;
    EXPECT_EQ(std::memcmp(y.raw(), want.value()[1].raw(), y.nbytes()), 0) << "batch " << n;
    auto shape = dev.value()->tensor_shape("idx");
    ASSERT_TRUE(shape.ok()) << shape.status().message();
    EXPECT_EQ(shape.value(), idx.shape());
  }
  cudaStreamDestroy(s);
  cudaFree(dx);
}

// PyTorch's default stream is the legacy one, which cannot hold the prefix's capture: the run,
// captured on its third call at a shape and replayed after, stays in that stream's order.
TEST(CudaDynamicDevice, EnqueueOnTheLegacyDefaultStreamCapturesAndKeepsItsOrder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = nonzero_engine();
  ASSERT_TRUE(e);
  auto host = e->create_context();
  auto dev = e->create_context();
  ASSERT_TRUE(host.ok() && dev.ok());
  Recorder rec;
  ASSERT_TRUE(dev.value()->set_output_allocator("idx", &rec).ok());
  ASSERT_TRUE(dev.value()->set_output_allocator("y", &rec).ok());
  void* dx = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, 64 * 256 * sizeof(float)), cudaSuccess);
  uint64_t seed = 40;
  for (int64_t n : {8, 8, 8, 8, 32, 32, 32, 8}) {
    const Tensor x = random({n, 256}, seed++);
    auto want = host.value()->execute({{"x", x}});
    ASSERT_TRUE(want.ok()) << want.status().message();
    // Written on the legacy stream without a wait: the run must come after it.
    ASSERT_EQ(cudaMemcpyAsync(dx, x.raw(), x.nbytes(), cudaMemcpyHostToDevice, cudaStreamLegacy),
              cudaSuccess);
    ASSERT_TRUE(dev.value()->set_input_shape("x", {n, 256}).ok());
    ASSERT_TRUE(dev.value()->set_tensor_address("x", dx).ok());
    const Status st = dev.value()->enqueue(cudaStreamLegacy);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    const Tensor y = rec.read("y", DataType::kFloat32);
    ASSERT_EQ(y.shape(), want.value()[1].shape()) << "batch " << n;
    EXPECT_EQ(std::memcmp(y.raw(), want.value()[1].raw(), y.nbytes()), 0) << "batch " << n;
  }
  cudaFree(dx);
}

TEST(CudaDynamicDevice, AMissingOrEmptyAllocatorIsAnErrorNamingTheOutput) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here: GPU test skipped";
  auto e = nonzero_engine();
  ASSERT_TRUE(e);
  auto ctx = e->create_context();
  ASSERT_TRUE(ctx.ok());
  ExecutionContext& c = *ctx.value();
  void* dx = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, 4 * 256 * sizeof(float)), cudaSuccess);
  const Tensor x = random({4, 256}, 1);
  cudaMemcpy(dx, x.raw(), x.nbytes(), cudaMemcpyHostToDevice);
  ASSERT_TRUE(c.set_input_shape("x", {4, 256}).ok());
  ASSERT_TRUE(c.set_tensor_address("x", dx).ok());
  Recorder rec;
  ASSERT_TRUE(c.set_output_allocator("y", &rec).ok());
  Status st = c.enqueue(nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("output 'idx'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("set_output_allocator"), std::string::npos) << st.message();
  EXPECT_FALSE(c.set_output_allocator("nope", &rec).ok());
  ASSERT_TRUE(c.set_output_allocator("idx", &rec).ok());
  rec.refuse = true;
  st = c.enqueue(nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gave no memory"), std::string::npos) << st.message();
  rec.refuse = false;  // the context still runs afterwards
  st = c.enqueue(nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  cudaFree(dx);
}

}  // namespace
}  // namespace kiln
