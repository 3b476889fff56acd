// Post-training calibration (docs/quantization.md): run the FP32 network over calibration
// batches, collect per-tensor statistics, and choose each tensor's INT8 scale.
//
//   minmax      amax = max |x| over all batches
//   percentile  amax = the P-th percentile of |x| (default 99.99), from a 2048-bin histogram
//   entropy     TensorRT's EntropyCalibration2: the clipping threshold whose 128-level
//               quantization keeps the histogram of |x| closest in KL divergence
//
// scale = amax / 127. Histograms need the range first, so percentile and entropy read the data
// twice (pass 1: amax, pass 2: histograms over [0, amax]), as TensorRT does.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln::quant {

enum class CalibAlgo { kEntropy, kMinMax, kPercentile };
Expected<CalibAlgo> parse_calib_algo(const std::string& name);
const char* calib_algo_name(CalibAlgo a);

inline constexpr int kHistogramBins = 2048;
inline constexpr int kQuantizedBins = 128;  // levels of |x| in symmetric int8

// Threshold (an amax) from a histogram of |x| with bins of `bin_width` starting at 0.
double entropy_threshold(const std::vector<double>& hist, double bin_width);
double percentile_threshold(const std::vector<double>& hist, double bin_width, double percentile);

// One calibration run's inputs, by graph input name.
using Feed = std::map<std::string, Tensor>;
using Visitor = std::function<void(const std::string& name, const Tensor& t)>;

// Runs the FP32 network and shows its intermediate tensors: the CPU executor, or a strict-FP32
// cuda engine of the graph whose context keeps them as debug tensors (on the GPU).
class ActivationSource {
 public:
  virtual ~ActivationSource() = default;
  // Runs one feed; calls `visit` for the graph inputs and every node output.
  virtual Status run(const Feed& feed, const Visitor& visit) = 0;
};
// `g` must outlive the source.
Expected<std::unique_ptr<ActivationSource>> cpu_activation_source(const Graph& g);
// On the GPU (the cuda backend): visits the graph inputs and those of `tensors` that nodes
// compute. The engine is built on the first run (and again if the input shapes change).
Expected<std::unique_ptr<ActivationSource>> engine_activation_source(
    const Graph& g, const std::vector<std::string>& tensors);

// Calibration data: batch i yields one or more feeds (a file of N samples for an input whose
// batch dimension is fixed at B is cut into N / B feeds).
class CalibData {
 public:
  virtual ~CalibData() = default;
  virtual size_t size() const = 0;
  virtual Expected<std::vector<Feed>> batch(size_t i) const = 0;
};

struct CalibOptions {
  CalibAlgo algo = CalibAlgo::kEntropy;
  double percentile = 99.99;
  std::function<void(const std::string&)> progress;  // one line per step (may be empty)
  // Tensors taken at their full range (amax = max |x|) whatever the algorithm: the network's
  // inputs, also where the network only moves or scales them (quant::input_like_values). An
  // input is data the user prepared (a normalized image is bounded and often bimodal:
  // background at one value, foreground spread above it); clipping it destroys information,
  // and entropy's KL measure cannot see that clipping when the clipped mass is large (it lands
  // in one bin). On Fashion-MNIST entropy clipped the input at 0.81 of 2.02 and the CPU INT8
  // reference lost 5.7 points of top-1; at full range, 0.1 (docs/perf.md). A Keras model
  // normalizes its image itself (Rescaling: Mul, Add) and tf2onnx moves it to NCHW before the
  // first convolution: clipped there the same way, its INT8 reference lost 0.5 and 1.3 points
  // in two trainings, relative L2 0.24 against 0.03 at full range (docs/keras.md).
  std::set<std::string> full_range;
};

// Scales (name -> amax / 127) of `tensors` from running `data` through `source`. Batches
// [first, last) of `data` are used.
Expected<std::map<std::string, float>> calibrate(ActivationSource& source,
                                                 const std::vector<std::string>& tensors,
                                                 const CalibData& data, size_t first, size_t last,
                                                 const CalibOptions& options);

}  // namespace kiln::quant
