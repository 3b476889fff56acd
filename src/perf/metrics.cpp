#include "perf/metrics.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace kiln::perf {
namespace {

// Parses `{a="x",b="y"}` at `pos` (just after the name); false when malformed.
bool parse_labels(const std::string& line, size_t& pos, std::map<std::string, std::string>& out) {
  ++pos;  // '{'
  while (pos < line.size() && line[pos] != '}') {
    const size_t eq = line.find('=', pos);
    if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
    std::string key = line.substr(pos, eq - pos), value;
    pos = eq + 2;
    while (pos < line.size() && line[pos] != '"') {
      if (line[pos] == '\\' && pos + 1 < line.size()) {
        ++pos;
        value += line[pos] == 'n' ? '\n' : line[pos];
      } else {
        value += line[pos];
      }
      ++pos;
    }
    if (pos >= line.size()) return false;
    ++pos;  // closing '"'
    out[key] = value;
    if (pos < line.size() && line[pos] == ',') ++pos;
  }
  if (pos >= line.size()) return false;
  ++pos;  // '}'
  return true;
}

}  // namespace

Expected<std::vector<MetricSample>> parse_prometheus(const std::string& text) {
  std::vector<MetricSample> out;
  size_t start = 0, line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    MetricSample s;
    size_t pos = 0;
    while (pos < line.size() && line[pos] != '{' && line[pos] != ' ') ++pos;
    s.name = line.substr(0, pos);
    const auto bad = [&] {
      return KILN_ERROR("/metrics line {} is not a Prometheus sample: '{}'", line_no,
                        line.substr(0, 120));
    };
    if (s.name.empty()) return bad();
    if (pos < line.size() && line[pos] == '{' && !parse_labels(line, pos, s.labels)) return bad();
    while (pos < line.size() && line[pos] == ' ') ++pos;
    const std::string value = line.substr(pos, line.find(' ', pos) - pos);
    char* stop = nullptr;
    errno = 0;
    s.value = std::strtod(value.c_str(), &stop);
    if (value.empty() || *stop != '\0') return bad();
    out.push_back(std::move(s));
  }
  return out;
}

ServerCounters model_counters(const std::vector<MetricSample>& samples, const std::string& model,
                              const std::string& version) {
  static const std::map<std::string, double ServerCounters::*> kFields = {
      {"kiln_requests_total", &ServerCounters::requests},
      {"kiln_inferences_total", &ServerCounters::inferences},
      {"kiln_samples_total", &ServerCounters::samples},
      {"kiln_padded_samples_total", &ServerCounters::padded_samples},
      {"kiln_failed_requests_total", &ServerCounters::failed},
      {"kiln_rejected_requests_total", &ServerCounters::rejected},
      {"kiln_queue_duration_us_total", &ServerCounters::queue_us},
      {"kiln_compute_duration_us_total", &ServerCounters::compute_us},
      {"kiln_request_duration_us_total", &ServerCounters::request_us},
  };
  ServerCounters c;
  for (const MetricSample& s : samples) {
    auto m = s.labels.find("model");
    if (m == s.labels.end() || m->second != model) continue;
    if (!version.empty()) {
      auto v = s.labels.find("version");
      if (v == s.labels.end() || v->second != version) continue;
    }
    if (auto f = kFields.find(s.name); f != kFields.end()) {
      c.*(f->second) += s.value;
      c.found = true;
    } else if (s.name == "kiln_batch_inferences_total") {
      auto b = s.labels.find("batch");
      if (b == s.labels.end()) continue;
      char* stop = nullptr;
      const long long size = std::strtoll(b->second.c_str(), &stop, 10);
      if (*stop == '\0' && size > 0) c.batches[size] += s.value;
    }
  }
  return c;
}

ServerCounters delta(const ServerCounters& after, const ServerCounters& before) {
  ServerCounters d;
  d.found = after.found;
  d.requests = after.requests - before.requests;
  d.inferences = after.inferences - before.inferences;
  d.samples = after.samples - before.samples;
  d.padded_samples = after.padded_samples - before.padded_samples;
  d.failed = after.failed - before.failed;
  d.rejected = after.rejected - before.rejected;
  d.queue_us = after.queue_us - before.queue_us;
  d.compute_us = after.compute_us - before.compute_us;
  d.request_us = after.request_us - before.request_us;
  for (const auto& [size, n] : after.batches) {
    auto b = before.batches.find(size);
    const double diff = n - (b == before.batches.end() ? 0 : b->second);
    if (diff > 0) d.batches[size] = diff;
  }
  return d;
}

}  // namespace kiln::perf
