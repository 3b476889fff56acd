#include "serve/batcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <system_error>

#include "serve/device.h"

namespace kiln::serve {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t micros(Clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

// The shapes of a request's inputs past the first dimension, as bytes: requests with equal keys
// can be joined along the first dimension.
std::string join_key(const InferRequest& req) {
  std::string key;
  for (const InputTensor& t : req.inputs) {
    const uint64_t rank = t.shape.size();
    key.append(reinterpret_cast<const char*>(&rank), sizeof rank);
    if (t.shape.size() > 1)
      key.append(reinterpret_cast<const char*>(t.shape.data() + 1),
                 (t.shape.size() - 1) * sizeof(int64_t));
  }
  return key;
}

bool within(const void* p, const Tensor& t) {
  const auto* b = static_cast<const uint8_t*>(t.raw());
  const auto* q = static_cast<const uint8_t*>(p);
  return b && q >= b && q < b + t.nbytes();
}

}  // namespace

// The copies of a joined batch, on up to kCopyThreads threads where they are large (ResNet-50's
// batch of 64 at FP32 is 38 MB: about 4 ms on one core, which the GPU would wait for).
void copy_rows(const std::vector<RowCopy>& copies) {
  constexpr size_t kCopyThreads = 4, kPerThread = size_t{4} << 20;
  size_t total = 0;
  for (const RowCopy& c : copies) total += c.bytes;
  const size_t parts = std::min(kCopyThreads, std::max<size_t>(total / kPerThread, 1));
  auto run = [&](size_t part) {  // part's share of the bytes, cut at any byte
    const size_t lo = total * part / parts, hi = total * (part + 1) / parts;
    size_t at = 0;
    for (const RowCopy& c : copies) {
      const size_t b = std::max(lo, at), e = std::min(hi, at + c.bytes);
      if (b < e)
        std::memcpy(c.dst + (b - at), static_cast<const uint8_t*>(c.src) + (b - at), e - b);
      at += c.bytes;
    }
  };
  std::vector<std::thread> helpers;
  for (size_t part = 1; part < parts; ++part) {
    try {
      helpers.emplace_back(run, part);
    } catch (const std::system_error&) {  // no thread to be had: this one copies that part too
      run(part);
    }
  }
  run(0);
  for (std::thread& t : helpers) t.join();
}

struct Batcher::Slot {
  int device = -1;
  std::string label;
  std::unique_ptr<ExecutionContext> ctx;
  // Per input: a buffer of at least max_batch rows whose first rows each inference uses, so a
  // joined batch costs one copy per request and no allocation (remade when the shapes past the
  // first dimension change: another sequence length, say).
  struct Buffer {
    std::shared_ptr<void> mem;  // host_buffer(): page-locked where the engine runs on a GPU
    DataType dtype = DataType::kUndefined;
    std::vector<int64_t> cap;   // the shape it holds at most
  };
  std::vector<Buffer> buffers;
  bool pinned = false;  // the engine runs on a GPU
};

Batcher::Batcher(ServedModel& model, BatcherOptions options)
    : model_(model), opts_(std::move(options)), max_batch_(model.max_batch()) {
  if (opts_.priority_levels > 0 &&
      (opts_.default_priority <= 0 || opts_.default_priority > opts_.priority_levels))
    opts_.default_priority = (opts_.priority_levels + 1) / 2;
}

Expected<std::unique_ptr<Batcher>> Batcher::create(ServedModel& model, BatcherOptions options) {
  auto b = std::unique_ptr<Batcher>(new Batcher(model, std::move(options)));
  std::sort(b->opts_.preferred.begin(), b->opts_.preferred.end());
  for (int& p : b->opts_.preferred) p = std::min(p, b->max_batch_);
  if (b->max_batch_ <= 1) b->opts_.pad_sizes.clear();
  bool gpu = false;
  for (DeviceEngine& de : model.engines()) gpu = gpu || de.engine->backend() == "cuda";
  if (b->opts_.contexts <= 0) b->opts_.contexts = gpu ? 4 : 2;
  const int per = b->opts_.contexts;
  // Contexts interleaved by device, so that with few requests every device gets work.
  for (int i = 0; i < per; ++i) {
    for (DeviceEngine& de : model.engines()) {
      if (!use_device(de.device))
        return KILN_ERROR("model {}: cannot use CUDA device {}", model.name(), de.device);
      auto slot = std::make_unique<Slot>();
      slot->device = de.device;
      slot->label = de.label;
      slot->pinned = de.engine->backend() == "cuda";
      auto ctx = de.engine->create_context();
      if (!ctx.ok())
        return KILN_ERROR("model {}: execution context {} on {}: {}", model.name(), i, de.label,
                          ctx.status().message());
      slot->ctx = std::move(ctx).value();
      slot->buffers.resize(model.inputs().size());
      if (b->opts_.warm)
        KILN_RETURN_IF_ERROR(b->warm(*slot).with_context(
            fmt::format("model {}: warming context {} on {}", model.name(), i, de.label)));
      b->slots_.push_back(std::move(slot));
    }
  }
  for (DeviceEngine& de : model.engines()) b->devices_.push_back(de.label);
  for (auto& s : b->slots_) b->threads_.emplace_back([p = b.get(), s = s.get()] { p->work(*s); });
  return b;
}

Batcher::~Batcher() { drain(); }

Status Batcher::warm(Slot& slot) {
  // At the largest batch first: the largest arena and staging buffers are allocated once, so
  // later batches keep their addresses (and their CUDA graphs); then each padded size three
  // times (run layer by layer, captured, replayed).
  std::vector<int> sizes = {max_batch_};
  int repeat = 1;
  if (!opts_.pad_sizes.empty()) {
    sizes = opts_.pad_sizes;
    std::sort(sizes.rbegin(), sizes.rend());
    repeat = 3;
  }
  for (int b : sizes) {
    std::map<std::string, Tensor> feeds;
    for (const InputSpec& s : model_.inputs()) {
      std::vector<int64_t> shape = s.dims;
      for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] >= 0) continue;
        if (s.opt.empty()) return Status::Ok();  // no profile to take a size from: not warmed
        shape[i] = s.opt[i];
      }
      if (max_batch_ > 1 && !shape.empty()) shape[0] = b;
      feeds.emplace(s.name, Tensor(s.dtype, shape));
    }
    for (int r = 0; r < repeat; ++r) KILN_RETURN_IF_ERROR(slot.ctx->execute(feeds).status());
  }
  return Status::Ok();
}

size_t Batcher::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.size();
}

void Batcher::submit(InferRequest req, int batch, Done done) {
  auto job = std::make_unique<Job>();
  job->batch = batch;
  job->key = max_batch_ > 1 ? join_key(req) : std::string();
  job->req = std::move(req);
  job->arrival = Clock::now();
  job->done = std::move(done);
  if (opts_.priority_levels > 0) {
    const uint64_t p = job->req.priority;
    if (p > static_cast<uint64_t>(opts_.priority_levels)) {
      job->done(job->req, api_error(400,
                                    "model {}: priority {} is not a level of this server's 1 to "
                                    "{} (kiln serve --priority-levels; 0 is the default level)",
                                    model_.name(), p, opts_.priority_levels));
      return;
    }
    job->level = p ? p : static_cast<uint64_t>(opts_.default_priority);
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) {
    lk.unlock();
    job->done(job->req, api_error(503, "model {}: the server is shutting down", model_.name()));
    return;
  }
  if (queue_.size() >= opts_.max_queue) {
    lk.unlock();
    stats_.rejected++;
    job->done(job->req,
              api_error(429,
                        "model {}: {} requests are queued, this server's limit (kiln serve "
                        "--max-queue); try again later",
                        model_.name(), opts_.max_queue));
    return;
  }
  stats_.requests++;
  // Behind every job of its level or a higher one (a lower number): in arrival order within
  // a level.
  auto at = queue_.end();
  while (at != queue_.begin() && (*std::prev(at))->level > job->level) --at;
  queue_.insert(at, std::move(job));
  lk.unlock();
  cv_.notify_one();
}

void Batcher::answer_dropped(std::vector<JobPtr>& dropped) {
  for (JobPtr& j : dropped) {
    if (!j->timed_out) {
      stats_.cancelled++;
      j->done(j->req, api_error(499, "model {}: the client went away before the request ran",
                                model_.name()));
    } else {
      stats_.timed_out++;
      j->done(j->req,
              api_error(408, "model {}: the request's timeout passed while it waited in the queue",
                        model_.name()));
    }
  }
  dropped.clear();
}

std::vector<Batcher::JobPtr> Batcher::take(Clock::time_point now, Clock::time_point* wake,
                                           std::vector<JobPtr>* dropped) {
  std::vector<JobPtr> out;
  auto next_deadline = Clock::time_point::max();  // of the jobs that stay
  for (auto it = queue_.begin(); it != queue_.end();) {
    const InferRequest& r = (*it)->req;
    // (A gRPC call past its deadline is cancelled too: the deadline is asked first.)
    (*it)->timed_out = r.deadline && *r.deadline <= now;
    if ((*it)->timed_out || (r.cancelled && r.cancelled())) {
      dropped->push_back(std::move(*it));
      it = queue_.erase(it);
      continue;
    }
    if (r.deadline) next_deadline = std::min(next_deadline, *r.deadline);
    ++it;
  }
  if (queue_.empty()) return out;
  const Job& head = *queue_.front();
  // A request that cannot be joined (no batching, a batch as large as the limit, or empty)
  // runs alone.
  if (max_batch_ <= 1 || head.batch <= 0 || head.batch >= max_batch_) {
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
    return out;
  }
  std::vector<std::list<JobPtr>::iterator> picked;
  std::vector<int> sums;
  int total = 0, scanned = 0;
  for (auto it = queue_.begin(); it != queue_.end() && total < max_batch_ && scanned < 4096;
       ++it, ++scanned) {
    const Job& j = **it;
    if (j.key != head.key || j.batch <= 0 || total + j.batch > max_batch_) continue;
    total += j.batch;
    picked.push_back(it);
    sums.push_back(total);
  }
  const bool full =
      total >= max_batch_ || (!opts_.preferred.empty() && total >= opts_.preferred.back());
  const auto deadline =
      head.arrival + std::chrono::microseconds(static_cast<int64_t>(opts_.max_delay_ms * 1000));
  const bool idle = running_ == 0 && !opts_.delay_when_idle;
  if (!full && now < deadline && !closed_ && !idle) {
    *wake = std::min(deadline, next_deadline);
    return out;
  }
  // Cut at the largest preferred size the requests add up to exactly, when one does.
  size_t n = picked.size();
  if (!opts_.preferred.empty() && total < max_batch_) {
    for (size_t k = sums.size(); k-- > 0;) {
      if (std::binary_search(opts_.preferred.begin(), opts_.preferred.end(), sums[k])) {
        n = k + 1;
        break;
      }
    }
  }
  for (size_t k = 0; k < n; ++k) {
    out.push_back(std::move(*picked[k]));
    queue_.erase(picked[k]);
  }
  return out;
}

void Batcher::work(Slot& slot) {
  use_device(slot.device);
  for (;;) {
    std::vector<JobPtr> jobs, dropped;
    {
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        if (queue_.empty()) {
          if (closed_) return;
          cv_.wait(lk);
          continue;
        }
        auto wake = Clock::time_point::max();
        jobs = take(Clock::now(), &wake, &dropped);
        if (!jobs.empty() || !dropped.empty()) break;
        cv_.wait_until(lk, wake);
      }
      const bool more = !queue_.empty();
      if (!jobs.empty()) ++running_;
      lk.unlock();
      if (more) cv_.notify_one();  // another free context may take what is left
    }
    answer_dropped(dropped);
    if (jobs.empty()) continue;
    run(slot, jobs);
    {
      std::lock_guard<std::mutex> lk(mu_);
      --running_;
    }
  }
}

void Batcher::run(Slot& slot, std::vector<JobPtr>& jobs) {
  const auto start = Clock::now();
  int total = 0;
  for (const JobPtr& j : jobs) {
    total += std::max(j->batch, 0);
    stats_.queue_us += micros(start - j->arrival);
  }
  const bool batching = max_batch_ > 1;
  const int rows = batching ? pad_target(total, opts_.pad_sizes) : total;
  const auto& specs = model_.inputs();
  std::map<std::string, Tensor> feeds;
  const bool alone = jobs.size() == 1 && rows == total;
  std::vector<RowCopy> copies;
  for (size_t i = 0; i < specs.size(); ++i) {
    const InputTensor& first = jobs[0]->req.inputs[i];
    std::vector<int64_t> shape = first.shape;
    if (batching && !shape.empty()) shape[0] = rows;
    // A request that runs alone runs from its own bytes where they are aligned as a tensor's.
    if (alone && reinterpret_cast<uintptr_t>(first.data) % 64 == 0) {
      feeds.emplace(specs[i].name, Tensor::view(first.dtype, shape, first.data, first.owner));
      continue;
    }
    Slot::Buffer& buf = slot.buffers[i];
    std::vector<int64_t> cap = shape;
    if (batching && !cap.empty()) cap[0] = std::max(rows, max_batch_);
    bool fits = buf.mem && buf.dtype == first.dtype && buf.cap.size() == cap.size();
    for (size_t d = batching ? 1 : 0; fits && d < cap.size(); ++d) fits = buf.cap[d] == cap[d];
    if (fits && batching && !cap.empty()) fits = buf.cap[0] >= rows;
    if (!fits) {
      const size_t bytes = Tensor::view(first.dtype, cap, nullptr, nullptr).nbytes();
      buf = {host_buffer(bytes, slot.pinned), first.dtype, cap};
      std::memset(buf.mem.get(), 0, bytes);  // padding rows start as zeros
    }
    auto* dst = static_cast<uint8_t*>(buf.mem.get());
    for (const JobPtr& j : jobs) {
      const InputTensor& t = j->req.inputs[i];
      if (t.bytes) copies.push_back({dst, t.data, t.bytes});
      dst += t.bytes;
    }
    // Padding rows keep what the buffer held (zeros, or earlier samples): their outputs are
    // dropped.
    feeds.emplace(specs[i].name, Tensor::view(first.dtype, shape, buf.mem.get(), buf.mem));
  }
  copy_rows(copies);
  auto result = slot.ctx->execute(feeds);
  const auto end = Clock::now();
  const uint64_t compute = micros(end - start);
  stats_.compute_us += compute;
  if (!result.ok()) {
    stats_.failures += jobs.size();
    for (JobPtr& j : jobs)
      j->done(j->req, api_error(500, "model {}: the inference failed: {}", model_.name(),
                                result.status().message()));
    return;
  }
  std::vector<Tensor> outs = std::move(result).value();
  // An output that is an input's memory (an Identity) would change under the next batch.
  for (Tensor& o : outs)
    for (const auto& [name, in] : feeds)
      if (within(o.raw(), in)) o = o.clone();
  stats_.inferences++;
  stats_.samples += total;
  stats_.padded_samples += rows - total;
  for (uint64_t seen = stats_.largest_batch;
       static_cast<uint64_t>(total) > seen &&
       !stats_.largest_batch.compare_exchange_weak(seen, total);) {
  }
  if (jobs.size() > 1) stats_.batched_requests += jobs.size();
  {
    std::lock_guard<std::mutex> lk(stats_.mu);
    stats_.per_batch[rows]++;
    stats_.per_device[slot.label]++;
    stats_.device_compute_us[slot.label] += compute;
  }
  if (!batching || (jobs.size() == 1 && rows == total)) {
    stats_.request_us += micros(end - jobs[0]->arrival);
    jobs[0]->done(jobs[0]->req, std::move(outs));
    return;
  }
  for (const Tensor& o : outs) {
    if (o.rank() == 0 || o.dim(0) != rows) {
      for (JobPtr& j : jobs)
        j->done(j->req, api_error(500, "model {}: an output has {} rows for a batch of {}",
                                  model_.name(), o.rank() ? o.dim(0) : 0, rows));
      return;
    }
  }
  auto keep = std::make_shared<std::vector<Tensor>>(std::move(outs));
  int64_t row = 0;
  for (JobPtr& j : jobs) {
    Outputs mine;
    for (const Tensor& o : *keep) {
      std::vector<int64_t> shape = o.shape();
      shape[0] = j->batch;
      const size_t row_bytes = o.nbytes() / static_cast<size_t>(rows);
      mine.push_back(Tensor::view(o.dtype(), shape,
                                  static_cast<const uint8_t*>(o.raw()) + row * row_bytes, keep));
    }
    row += j->batch;
    stats_.request_us += micros(end - j->arrival);
    j->done(j->req, std::move(mine));
  }
}

void Batcher::drain() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

Expected<std::vector<int>> parse_pad_sizes(const std::string& text, int max_batch) {
  std::vector<int> sizes;
  if (text.empty() || text == "pow2") {
    for (int b = 1; b < max_batch; b *= 2) sizes.push_back(b);
  } else {
    const auto items = parse_int_list(text);
    if (!items)
      return KILN_ERROR("--pad-batches takes batch sizes such as 1,2,4,8 or 'pow2', not '{}'",
                        text);
    for (const int v : *items) {
      if (v < 1 || v > (1 << 20))
        return KILN_ERROR("--pad-batches: batch sizes are whole numbers >= 1, not '{}'", text);
      sizes.push_back(v);
    }
    if (sizes.empty()) return KILN_ERROR("--pad-batches: no batch size in '{}'", text);
  }
  std::vector<int> out;
  for (int b : sizes)
    if (b < max_batch) out.push_back(b);
  out.push_back(max_batch);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int pad_target(int total, const std::vector<int>& sizes) {
  for (int b : sizes)
    if (b >= total) return b;
  return total;
}

}  // namespace kiln::serve
