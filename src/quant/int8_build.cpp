// Scales for a build (explicit, from the cache, or by calibration) and the INT8 layer marking.
#include "quant/int8_build.h"

#include <filesystem>

#include "backends/backend_info.h"
#include "quant/calib_io.h"
#include "quant/calibrator.h"
#include "quant/int8.h"

namespace kiln::quant {

size_t heldout_batches(size_t n) { return n < 2 ? 0 : std::max<size_t>(1, n / 5); }

namespace {

std::vector<std::string> names_of(const std::vector<const Value*>& vs) {
  std::vector<std::string> out;
  for (const Value* v : vs) out.push_back(v->name);
  return out;
}

// Scales from a matching cache, or by calibrating on the data (then written to the cache).
Expected<std::map<std::string, float>> activation_scales(const Graph& g, const BuildConfig& c,
                                                         nlohmann::json& info) {
  const std::vector<std::string> needed = names_of(calibration_tensors(g));
  const uint64_t fp = graph_fingerprint(g);
  std::error_code ec;
  if (!c.calib_cache.empty() && std::filesystem::exists(c.calib_cache, ec)) {
    KILN_ASSIGN_OR_RETURN(CalibCache cache, read_calib_cache(c.calib_cache));
    KILN_RETURN_IF_ERROR(check_calib_cache(cache, c.calib_cache, fp, c.calib_algo, needed));
    if (c.progress)
      c.progress(fmt::format("calibration cache {} matches: using its {} scales ({})",
                             c.calib_cache, cache.scales.size(), cache.algorithm));
    info["scales"] = "cache " + c.calib_cache;
    info["algorithm"] = cache.algorithm;
    return cache.scales;
  }
  if (c.calib_data.empty())
    return Status::Error(
        "--int8 needs scales: calibration data (--calib DIR), a matching --calib-cache, or a model "
        "with Q/DQ nodes");
  KILN_ASSIGN_OR_RETURN(CalibAlgo algo,
                        parse_calib_algo(c.calib_algo.empty() ? "entropy" : c.calib_algo));
  if (!(c.calib_percentile > 0 && c.calib_percentile <= 100))
    return KILN_ERROR("percentile {} must be in (0, 100]", c.calib_percentile);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CalibData> data,
                        open_npy_calib_data(c.calib_data, g, c.calib_batches, c.calib_images));
  const size_t n = data->size();
  const size_t used = c.accuracy_budget > 0 ? n - heldout_batches(n) : n;
  // The FP32 network runs where the engine will: on the GPU for a cuda build.
  const bool gpu = (c.backend.empty() ? default_backend() : c.backend) == "cuda";
  std::unique_ptr<ActivationSource> src;
  if (gpu) {
    if (c.progress) c.progress("calibration runs the FP32 network on the GPU");
    KILN_ASSIGN_OR_RETURN(src, engine_activation_source(g, needed));
  } else {
    KILN_ASSIGN_OR_RETURN(src, cpu_activation_source(g));
  }
  CalibOptions o{algo, c.calib_percentile, c.progress, {}};
  o.full_range = input_like_values(g);  // the inputs, also moved or scaled: never clipped
  KILN_ASSIGN_OR_RETURN(auto scales, calibrate(*src, needed, *data, 0, used, o));
  info["scales"] = fmt::format("calibrated on {} batches ({})", used, gpu ? "GPU, FP32" : "CPU");
  info["algorithm"] = calib_algo_name(algo);
  if (!c.calib_cache.empty()) {
    CalibCache cache{calib_algo_name(algo), KILN_VERSION_STRING, fp, scales};
    KILN_RETURN_IF_ERROR(write_calib_cache(c.calib_cache, cache));
    if (c.progress)
      c.progress(
          fmt::format("wrote calibration cache {} ({} tensors)", c.calib_cache, scales.size()));
  }
  return scales;
}

}  // namespace

Expected<nlohmann::json> quantize_for_build(Graph& g, const BuildConfig& c, bool explicit_scales,
                                            const Graph* fp32_graph) {
  nlohmann::json info = nlohmann::json::object();
  if (explicit_scales) {
    if (!c.calib_data.empty() || !c.calib_cache.empty())
      return Status::Error(
          "the model carries its own INT8 scales (Q/DQ nodes): --calib and "
          "--calib-cache do not apply to it");
    info["scales"] = "explicit (Q/DQ nodes)";
  } else {
    KILN_ASSIGN_OR_RETURN(auto scales, activation_scales(fp32_graph ? *fp32_graph : g, c, info));
    apply_activation_scales(g, scales);
  }
  KILN_ASSIGN_OR_RETURN(Int8Summary s, mark_int8_layers(g, c.layer_precisions, explicit_scales));
  info["int8_layers"] = s.int8_layers.size();
  info["float_layers"] = s.float_layers;
  if (c.progress)
    c.progress(fmt::format("INT8: {} layers in INT8, {} conv/gemm layers left in float",
                           s.int8_layers.size(), s.float_layers.size()));
  return info;
}

}  // namespace kiln::quant
