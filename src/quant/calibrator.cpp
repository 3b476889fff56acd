// Calibrators: statistics over the FP32 network's tensors and the choice of each scale.
#include "quant/calibrator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include "backends/cpu/cpu_executor.h"

namespace kiln::quant {

Expected<CalibAlgo> parse_calib_algo(const std::string& name) {
  if (name == "entropy") return CalibAlgo::kEntropy;
  if (name == "minmax") return CalibAlgo::kMinMax;
  if (name == "percentile") return CalibAlgo::kPercentile;
  return KILN_ERROR("--calib-algo '{}': choose entropy, minmax or percentile", name);
}

const char* calib_algo_name(CalibAlgo a) {
  switch (a) {
    case CalibAlgo::kEntropy:
      return "entropy";
    case CalibAlgo::kMinMax:
      return "minmax";
    case CalibAlgo::kPercentile:
      return "percentile";
  }
  return "?";
}

// TensorRT's EntropyCalibration2 as NVIDIA's pytorch-quantization implements it: bin 0 (the
// spike of exact zeros after a ReLU) is replaced by bin 1; for every candidate threshold of i
// bins (128 <= i <= all), P is the first i bins with the outliers beyond added to the last,
// and Q groups the same i bins into 128 levels (bin k in level floor(128 k / i)), each level's
// count spread evenly over its non-zero bins. The threshold is the upper edge of bin i - 1 for
// the i with the smallest KL(P || Q).
double entropy_threshold(const std::vector<double>& in, double bin_width) {
  const size_t nbins = in.size();
  if (nbins <= static_cast<size_t>(kQuantizedBins)) return static_cast<double>(nbins) * bin_width;
  std::vector<double> hist = in;
  hist[0] = hist[1];
  std::vector<double> suffix(nbins + 1, 0.0);
  for (size_t k = nbins; k-- > 0;) suffix[k] = suffix[k + 1] + hist[k];
  std::vector<double> level_sum(kQuantizedBins), level_nonzero(kQuantizedBins);
  double best_kl = std::numeric_limits<double>::infinity();
  size_t best = nbins;
  for (size_t i = kQuantizedBins; i <= nbins; ++i) {
    std::fill(level_sum.begin(), level_sum.end(), 0.0);
    std::fill(level_nonzero.begin(), level_nonzero.end(), 0.0);
    auto level = [&](size_t k) { return k * kQuantizedBins / i; };
    for (size_t k = 0; k < i; ++k)
      if (hist[k] != 0) level_sum[level(k)] += hist[k], level_nonzero[level(k)] += 1;
    const double p_total = suffix[0];  // P keeps every count (outliers in its last bin)
    const double q_total = suffix[0] - suffix[i];
    if (q_total <= 0) continue;
    double kl = 0;
    for (size_t k = 0; k < i; ++k) {
      const double p = (k + 1 == i ? hist[k] + suffix[i] : hist[k]) / p_total;
      if (p == 0) continue;
      const double q = hist[k] != 0 ? level_sum[level(k)] / level_nonzero[level(k)] / q_total : 0.0;
      if (q == 0) {
        kl = std::numeric_limits<double>::infinity();
        break;
      }
      kl += p * std::log(p / q);
    }
    if (kl < best_kl) best_kl = kl, best = i;
  }
  return static_cast<double>(best) * bin_width;
}

double percentile_threshold(const std::vector<double>& hist, double bin_width, double percentile) {
  double total = 0;
  for (double h : hist) total += h;
  const double target = total * percentile / 100.0;
  double cum = 0;
  for (size_t k = 0; k < hist.size(); ++k) {
    cum += hist[k];
    if (cum >= target) return static_cast<double>(k + 1) * bin_width;
  }
  return static_cast<double>(hist.size()) * bin_width;
}

namespace {

class CpuActivationSource final : public ActivationSource {
 public:
  CpuActivationSource(const Graph& g, std::unique_ptr<CpuExecutor> ex)
      : g_(g), ex_(std::move(ex)) {}
  Status run(const Feed& feed, const Visitor& visit) override {
    std::vector<Tensor> ins;
    for (const Value* v : g_.inputs()) {
      auto it = feed.find(v->name);
      if (it == feed.end())
        return KILN_ERROR("calibration data has no tensor for input '{}'", v->name);
      ins.push_back(it->second);
      visit(v->name, it->second);
    }
    const CpuExecutor::Observer observe = [&](const Value& v, const Tensor& t) {
      visit(v.name, t);
    };
    return ex_->run(ins, nullptr, nullptr, &observe).status();
  }

 private:
  const Graph& g_;
  std::unique_ptr<CpuExecutor> ex_;
};

// Runs every feed of batches [first, last), calling visit for the wanted float32 tensors.
Status for_each_tensor(
    ActivationSource& source, const CalibData& data, size_t first, size_t last,
    const std::set<std::string>& wanted, const std::string& what, const CalibOptions& o,
    const std::function<void(const std::string&, const float*, int64_t)>& visit) {
  for (size_t b = first; b < last; ++b) {
    if (o.progress) o.progress(fmt::format("{}: batch {}/{}", what, b - first + 1, last - first));
    KILN_ASSIGN_OR_RETURN(std::vector<Feed> feeds, data.batch(b));
    for (const Feed& f : feeds)
      KILN_RETURN_IF_ERROR(source.run(f, [&](const std::string& name, const Tensor& t) {
        if (!wanted.count(name) || t.dtype() != DataType::kFloat32) return;
        visit(name, t.data<float>(), t.numel());
      }));
  }
  return Status::Ok();
}

}  // namespace

Expected<std::unique_ptr<ActivationSource>> cpu_activation_source(const Graph& g) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> ex, CpuExecutor::create(g));
  return std::unique_ptr<ActivationSource>(new CpuActivationSource(g, std::move(ex)));
}

Expected<std::map<std::string, float>> calibrate(ActivationSource& source,
                                                 const std::vector<std::string>& tensors,
                                                 const CalibData& data, size_t first, size_t last,
                                                 const CalibOptions& o) {
  if (first >= last) return KILN_ERROR("calibration needs at least one batch");
  const std::set<std::string> wanted(tensors.begin(), tensors.end());
  const bool two_pass = o.algo != CalibAlgo::kMinMax;
  const std::string algo = calib_algo_name(o.algo);
  std::unordered_map<std::string, double> amax;
  KILN_RETURN_IF_ERROR(for_each_tensor(
      source, data, first, last, wanted,
      fmt::format("calibrating ({}){}", algo, two_pass ? ", pass 1/2 (ranges)" : ""), o,
      [&](const std::string& name, const float* p, int64_t n) {
        double& a = amax[name];
        for (int64_t i = 0; i < n; ++i)
          if (std::isfinite(p[i])) a = std::max(a, static_cast<double>(std::fabs(p[i])));
      }));
  std::unordered_map<std::string, std::vector<double>> hist;
  if (two_pass)
    KILN_RETURN_IF_ERROR(for_each_tensor(
        source, data, first, last, wanted,
        fmt::format("calibrating ({}), pass 2/2 (histograms)", algo), o,
        [&](const std::string& name, const float* p, int64_t n) {
          auto& h = hist[name];
          h.resize(kHistogramBins, 0.0);
          const double a = amax[name];
          if (a <= 0) return;
          for (int64_t i = 0; i < n; ++i) {
            if (!std::isfinite(p[i])) continue;
            const auto bin = static_cast<int64_t>(std::fabs(p[i]) / a * kHistogramBins);
            h[static_cast<size_t>(std::min<int64_t>(bin, kHistogramBins - 1))] += 1;
          }
        }));
  std::map<std::string, float> scales;
  for (const std::string& name : tensors) {
    auto it = amax.find(name);
    if (it == amax.end()) continue;  // not computed by the network (e.g. only on the host)
    double a = it->second;
    if (two_pass && a > 0 && !o.full_range.count(name)) {
      const double width = a / kHistogramBins;
      a = o.algo == CalibAlgo::kEntropy ? entropy_threshold(hist[name], width)
                                        : percentile_threshold(hist[name], width, o.percentile);
    }
    scales[name] = a > 0 ? static_cast<float>(a / 127.0) : 1.f;
  }
  return scales;
}

}  // namespace kiln::quant
