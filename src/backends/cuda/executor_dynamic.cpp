// CudaContext's dynamic path (cuda_context.h): an engine whose shapes the data decides runs its
// graph as one dynamic region (dynamic.h), through execute() (inputs and outputs on the host) or
// enqueue() (device addresses in, outputs into the memory their OutputAllocators give).
#include <cublas_v2.h>
#include <cudnn.h>

#include "cuda_context.h"

namespace kiln::gpu {

Status CudaContext::init_dynamic() {
  dyn_rt_.rc = &rc_;
  dyn_rt_.workspace = &workspace_;
  std::shared_ptr<CudaEngineState> e = e_;
  dyn_rt_.engine_weight = [e](const Value* v, const TensorFormat& f) -> void* {
    return static_cast<uint8_t*>(e->weights()) + e->weight_offset(v, f);
  };
  KILN_ASSIGN_OR_RETURN(dyn_graph_, DynamicGraph::create(g_, e_->plan(), /*engine_weights=*/true));
  input_shapes_.resize(g_.inputs().size());
  input_set_.assign(g_.inputs().size(), false);
  in_addr_.assign(g_.inputs().size(), nullptr);
  out_addr_.assign(g_.outputs().size(), nullptr);
  out_alloc_.assign(g_.outputs().size(), nullptr);
  out_given_.assign(g_.outputs().size(), nullptr);
  return Status::Ok();
}

// One run of the dynamic region on stream `s`. The pool hands blocks out again in stream order:
// a run on another stream than the last one's waits for that stream first.
Expected<std::vector<DynValue>> CudaContext::run_dynamic(cudaStream_t s, std::vector<DynValue> ins,
                                                         std::vector<LayerTiming>* timings) {
  if (dyn_stream_ && dyn_stream_ != s) KILN_CUDA_CHECK(cudaStreamSynchronize(dyn_stream_));
  dyn_stream_ = s;
  // The last run's uploads: a copy from pageable memory has read its source once it returned.
  dyn_rt_.staged.clear();
  if (bound_stream_ != s) {
    cudnnSetStream(rc_.cudnn, s);
    cublasSetStream(rc_.cublas, s);
    bound_stream_ = s;
  }
  rc_.stream = s;
  dyn_rt_.dims_used = 0;  // a run that failed may have left sizes unread
  dyn_rt_.times = timings;
  dyn_rt_.graphs = use_graph_ && debug_.empty();
  auto ran = dyn_graph_->run(dyn_rt_, std::move(ins));
  dyn_rt_.times = nullptr;
  if (!ran.ok()) cudaStreamSynchronize(s);  // what was queued may still read the staged copies
  return ran;
}

// The device path of an engine with a dynamic region: inputs read where the caller put them (and
// copied to the host where a layer reads them there), outputs copied into the memory their
// allocators give once their sizes are known.
Status CudaContext::enqueue_dynamic(cudaStream_t stream, std::vector<LayerTiming>* timings) {
  // The default streams cannot hold the prefix's capture: the context's own stream runs the
  // region, fenced by an event each way on the caller's default stream (which keeps its order),
  // and without a stream the call waits for it.
  const bool fenced = stream == cudaStreamLegacy || stream == cudaStreamPerThread;
  const cudaStream_t s = stream && !fenced ? stream : stream_;
  if (fenced) {
    for (cudaEvent_t& ev : fence_)
      if (!ev) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(fence_[0], stream));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_, fence_[0], 0));
  }
  std::vector<DynValue> ins;
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    const Value* v = g_.inputs()[i];
    if (!input_set_[i]) return KILN_ERROR("input '{}': shape not set", v->name);
    DynValue d;
    d.t.dtype = v->type.dtype;
    d.t.shape = input_shapes_[i];
    d.t.data = in_addr_[i];
    const size_t bytes = d.t.nbytes();
    if (!d.t.data && bytes) return KILN_ERROR("input '{}': no device address set", v->name);
    if (host_in_[i]) {
      Tensor h(d.t.dtype, d.t.shape);
      KILN_CUDA_CHECK(cudaStreamSynchronize(s));
      if (bytes) KILN_CUDA_CHECK(cudaMemcpy(h.raw(), d.t.data, bytes, cudaMemcpyDefault));
      d.host = std::make_shared<const Tensor>(std::move(h));
    }
    ins.push_back(std::move(d));
  }
  for (size_t j = 0; j < g_.outputs().size(); ++j)
    if (!out_alloc_[j])
      return KILN_ERROR("output '{}': its size depends on the data: give it an output allocator "
                        "(set_output_allocator), or run execute()", g_.outputs()[j]->name);
  KILN_ASSIGN_OR_RETURN(std::vector<DynValue> outs, run_dynamic(s, std::move(ins), timings));
  dyn_out_shapes_.clear();
  for (size_t j = 0; j < outs.size(); ++j) {
    const Value* v = g_.outputs()[j];
    DynValue& o = outs[j];
    const DataType dt = v->type.dtype;
    const size_t bytes = Tensor::view(dt, o.t.shape, nullptr, nullptr).nbytes();
    void* dst = out_alloc_[j]->reallocate_output(v->name, out_given_[j], bytes);
    if (!dst && bytes)
      return KILN_ERROR("output '{}': its allocator gave no memory for {} bytes", v->name, bytes);
    out_given_[j] = dst;
    if (bytes && o.t.data && o.t.dtype == dt && o.t.layout == Layout::kLinear) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, o.t.data, bytes, cudaMemcpyDeviceToDevice, s));
    } else if (bytes) {  // computed on the host, or stored in another format
      KILN_ASSIGN_OR_RETURN(auto h, dyn_rt_.read_back(o, dt));
      Tensor t = h->dtype() == dt ? *h : h->cast(dt);
      KILN_RETURN_IF_ERROR(dyn_rt_.upload(dst, std::move(t)));
    }
    out_alloc_[j]->notify_shape(v->name, o.t.shape);
    dyn_out_shapes_.push_back(o.t.shape);
  }
  if (fenced) {
    KILN_CUDA_CHECK(cudaEventRecord(fence_[1], stream_));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, fence_[1], 0));
  }
  if (!stream) KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  return Status::Ok();
}

// The host path of an engine with a dynamic region: inputs staged on the device (and kept on the
// host where a layer reads them there), one dynamic run, outputs copied back at their shapes.
Expected<std::vector<Tensor>> CudaContext::execute_dynamic(const std::map<std::string, Tensor>& inputs,
                                                           std::vector<LayerTiming>* timings) {
  KILN_ASSIGN_OR_RETURN(std::vector<const Tensor*> given, checked_inputs(inputs));
  std::vector<DynValue> ins;
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    const Value* v = g_.inputs()[i];
    const Tensor& x = *given[i];
    DynValue d;
    d.t.dtype = v->type.dtype;
    d.t.shape = x.shape();
    KILN_ASSIGN_OR_RETURN(d.block, dyn_rt_.pool.get(x.nbytes(), "input '" + v->name + "'"));
    d.t.data = d.block.get();
    if (x.nbytes())
      KILN_CUDA_CHECK(cudaMemcpyAsync(d.t.data, x.raw(), x.nbytes(), cudaMemcpyHostToDevice, stream_));
    if (host_in_[i]) d.host = std::make_shared<const Tensor>(x);
    set_shape(i, x.shape());
    ins.push_back(std::move(d));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<DynValue> outs, run_dynamic(stream_, std::move(ins), timings));
  std::vector<Tensor> result;
  dyn_out_shapes_.clear();
  for (size_t j = 0; j < outs.size(); ++j) {
    const DataType dt = g_.outputs()[j]->type.dtype;
    KILN_ASSIGN_OR_RETURN(auto t, dyn_rt_.read_back(outs[j], dt));
    Tensor out = t->dtype() == dt ? *t : t->cast(dt);
    dyn_out_shapes_.push_back(out.shape());
    result.push_back(std::move(out));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  dyn_rt_.staged.clear();
  return result;
}

}  // namespace kiln::gpu
