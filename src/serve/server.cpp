#include "serve/server.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace kiln::serve {

Expected<std::unique_ptr<Core>> Core::load(const CoreOptions& options,
                                           const std::function<void(const std::string&)>& log) {
  KILN_ASSIGN_OR_RETURN(std::vector<RepositoryEntry> found, find_models(options.repository));
  if (found.empty())
    return KILN_ERROR("no engines (NAME.kiln, NAME/model.kiln or NAME/VERSION/model.kiln) in '{}'",
                      options.repository);
  auto core = std::unique_ptr<Core>(new Core());
  std::vector<std::string> errors;
  for (const RepositoryEntry& e : found) {
    auto m = ServedModel::load(e.name, e.version, e.path, options.devices, options.max_batch_cap);
    if (!m.ok()) {
      errors.push_back(fmt::format("model {}: {}", e.name, m.status().message()));
      continue;
    }
    BatcherOptions bo = options.batcher;
    if (options.pad) {
      auto sizes = parse_pad_sizes(options.pad_batches, (*m)->max_batch());
      if (!sizes.ok()) return sizes.status();
      bo.pad_sizes = *sizes;
    }
    auto b = Batcher::create(**m, bo);
    if (!b.ok()) {
      errors.push_back(b.status().message());
      continue;
    }
    ServedModel& sm = **m;
    log(fmt::format("model {} version {}: {} on {}, {} contexts each, batches up to {}{}", e.name,
                    e.version, e.path, fmt::join((*b)->devices(), ", "), (*b)->contexts(),
                    sm.max_batch(),
                    (*b)->pad_sizes().empty()
                        ? std::string()
                        : fmt::format(", padded to [{}]", fmt::join((*b)->pad_sizes(), ", "))));
    core->models_[e.name][std::stol(e.version)] =
        ModelEntry{std::move(m).value(), std::move(b).value()};
  }
  // The models that did not load are named once: in the error when none did (one line, as the
  // CLI's errors are), else as warnings beside the ones that did.
  if (core->models_.empty())
    return KILN_ERROR("no model could be loaded ({})", fmt::join(errors, "; "));
  for (const std::string& e : errors) log("kiln serve: warning: not serving " + e);
  return core;
}

Core::~Core() { drain(); }

Result<ModelEntry*> Core::find(const std::string& name, const std::string& version) {
  auto it = models_.find(name);
  if (it == models_.end() || it->second.empty()) return api_error(404, "unknown model '{}'", name);
  if (version.empty()) return &it->second.rbegin()->second;
  const bool digits = !version.empty() && version.size() < 10 &&
                      std::all_of(version.begin(), version.end(), ::isdigit);
  auto v = digits ? it->second.find(std::stol(version)) : it->second.end();
  if (v == it->second.end()) return api_error(404, "model '{}' has no version '{}'", name, version);
  return &v->second;
}

std::vector<std::string> Core::versions(const std::string& name) const {
  std::vector<std::string> out;
  auto it = models_.find(name);
  if (it != models_.end())
    for (const auto& [v, e] : it->second) out.push_back(std::to_string(v));
  return out;
}

void Core::infer(InferRequest req, Done done) {
  if (draining_) {
    done(req, api_error(503, "the server is shutting down"));
    return;
  }
  auto entry = find(req.model, req.version);
  if (!entry.ok()) {
    done(req, entry.error());
    return;
  }
  ModelEntry& e = **entry;
  auto batch = e.model->check_request(req);
  if (!batch.ok()) {
    done(req, batch.error());
    return;
  }
  if (Check c = e.model->check_outputs(req)) {
    done(req, std::move(*c));
    return;
  }
  for (const OutputRequest& o : req.outputs) {
    if (!o.shm) continue;
    if (Check c = shm_.check_output(fmt::format("output '{}'", o.name), *o.shm)) {
      done(req, std::move(*c));
      return;
    }
  }
  e.batcher->submit(std::move(req), *batch, std::move(done));
}

void Core::drain() {
  draining_ = true;
  for (auto& [name, versions] : models_)
    for (auto& [v, e] : versions)
      if (e.batcher) e.batcher->drain();
}

void Core::count_response(const char* protocol, int status) {
  std::lock_guard<std::mutex> lk(counts_mu_);
  responses_[{protocol, status}]++;
}

std::string Core::metrics_text() {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  struct Field {
    const char* name;
    const char* type;
    const char* help;
    std::atomic<uint64_t> ModelStats::*field;
  };
  static const Field kFields[] = {
      {"kiln_requests_total", "counter", "Inference requests taken", &ModelStats::requests},
      {"kiln_inferences_total", "counter", "Engine inferences run", &ModelStats::inferences},
      {"kiln_batched_requests_total", "counter", "Requests that shared an inference with others",
       &ModelStats::batched_requests},
      {"kiln_largest_batch", "gauge", "Samples in the largest inference so far",
       &ModelStats::largest_batch},
      {"kiln_samples_total", "counter", "Samples the requests brought", &ModelStats::samples},
      {"kiln_padded_samples_total", "counter", "Samples added by --pad-batches",
       &ModelStats::padded_samples},
      {"kiln_failed_requests_total", "counter", "Requests whose inference failed",
       &ModelStats::failures},
      {"kiln_rejected_requests_total", "counter", "Requests refused because the queue was full",
       &ModelStats::rejected},
      {"kiln_timed_out_requests_total", "counter",
       "Requests dropped from the queue when their timeout passed (408)", &ModelStats::timed_out},
      {"kiln_cancelled_requests_total", "counter",
       "Requests dropped from the queue because their client went away (499)",
       &ModelStats::cancelled},
      {"kiln_queue_duration_us_total", "counter",
       "Microseconds requests waited in the queue, summed", &ModelStats::queue_us},
      {"kiln_compute_duration_us_total", "counter",
       "Microseconds of inference (gather, run, split), summed over inferences",
       &ModelStats::compute_us},
      {"kiln_request_duration_us_total", "counter",
       "Microseconds from queueing to outputs, summed over requests", &ModelStats::request_us},
  };
  for (const Field& f : kFields) {
    family(f.name, f.type, f.help);
    for (auto& [name, versions] : models_)
      for (auto& [v, e] : versions)
        out += fmt::format("{}{{model=\"{}\",version=\"{}\"}} {}\n", f.name, name, v,
                           (e.batcher->stats().*(f.field)).load());
  }
  family("kiln_batch_inferences_total", "counter", "Inferences run per batch size (padded)");
  for (auto& [name, versions] : models_)
    for (auto& [v, e] : versions) {
      std::lock_guard<std::mutex> lk(e.batcher->stats().mu);
      for (const auto& [b, n] : e.batcher->stats().per_batch)
        out += fmt::format(
            "kiln_batch_inferences_total{{model=\"{}\",version=\"{}\",batch=\"{}\"}} {}\n", name, v,
            b, n);
    }
  family("kiln_device_inferences_total", "counter", "Inferences run per device");
  family("kiln_device_compute_duration_us_total", "counter",
         "Microseconds of inference per device");
  for (auto& [name, versions] : models_)
    for (auto& [v, e] : versions) {
      ModelStats& st = e.batcher->stats();
      std::lock_guard<std::mutex> lk(st.mu);
      for (const std::string& d : e.batcher->devices()) {
        out += fmt::format(
            "kiln_device_inferences_total{{model=\"{}\",version=\"{}\",device=\"{}\"}} {}\n", name,
            v, d, st.per_device[d]);
        out += fmt::format(
            "kiln_device_compute_duration_us_total{{model=\"{}\",version=\"{}\",device=\"{}\"}} "
            "{}\n",
            name, v, d, st.device_compute_us[d]);
      }
    }
  family("kiln_queue_size", "gauge", "Requests waiting in the queue now");
  for (auto& [name, versions] : models_)
    for (auto& [v, e] : versions)
      out += fmt::format("kiln_queue_size{{model=\"{}\",version=\"{}\"}} {}\n", name, v,
                         e.batcher->queued());
  family("kiln_responses_total", "counter", "Requests answered, by protocol and status");
  std::lock_guard<std::mutex> lk(counts_mu_);
  for (const auto& [key, n] : responses_)
    out += fmt::format("kiln_responses_total{{protocol=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  return out;
}

Expected<std::vector<int>> parse_devices(const std::string& text, int visible) {
  std::vector<int> out;
  if (text.empty() || text == "all") {
    for (int d = 0; d < visible; ++d) out.push_back(d);
    return out;
  }
  const auto items = parse_int_list(text);
  if (!items) return KILN_ERROR("--devices takes GPU indices such as 0,1 or 'all', not '{}'", text);
  std::set<int> seen;
  for (const int d : *items) {
    if (!seen.insert(d).second)
      return KILN_ERROR("--devices: a device is named twice in '{}'", text);
    if (d < 0 || d >= visible)
      return KILN_ERROR("--devices: GPU {} does not exist (this machine shows {}{})", d, visible,
                        visible ? fmt::format(": 0..{}", visible - 1) : "");
    out.push_back(d);
  }
  if (out.empty()) return KILN_ERROR("--devices: no device given");
  return out;
}

}  // namespace kiln::serve
