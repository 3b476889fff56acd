#include "bench_report.h"

#include <algorithm>
#include <cmath>

namespace kiln::bench {

using cuda::Precision;

const TacticResult* LayerResult::best() const {
  const TacticResult* b = nullptr;
  for (const auto& t : tactics) {
    if (t.correct && !t.pruned && t.error.empty() && (!b || t.median_us < b->median_us)) b = &t;
  }
  return b;
}

const TacticResult* LayerResult::best_of(const std::string& family) const {
  const TacticResult* b = nullptr;
  for (const auto& t : tactics) {
    if (t.family == family && t.correct && !t.pruned && t.error.empty() &&
        (!b || t.median_us < b->median_us)) {
      b = &t;
    }
  }
  return b;
}

double peak_tflops(Precision p) {
  switch (p) {
    case Precision::kFP16:
      return 989.0;
    case Precision::kTF32:
      return 495.0;
    case Precision::kINT8:
      return 1979.0;
  }
  return 1;
}

double roofline_bytes(const cuda::ConvProblem& p) {
  const double es = double(cuda::element_size(p.precision));
  const auto& sh = p.shape;
  // A strided 1x1 convolution reads only the input pixels it samples (whole C-vectors, so
  // whole DRAM sectors); every other convolution touches all of its input.
  const double x_elems = sh.r == 1 && sh.s == 1 && sh.stride > 1
                             ? double(sh.n) * sh.p() * sh.q() * sh.c
                             : double(sh.x_elems());
  double elems = x_elems + double(sh.w_elems() + sh.y_elems());
  if (p.epilogue == cuda::Epilogue::kBiasAddRelu) elems += double(sh.y_elems());
  return elems * es;
}

double pool_fc_estimate_us(int batch, Precision p) {
  const double es = double(cuda::element_size(p));
  const double n = batch;
  const double maxpool = n * (112.0 * 112 * 64 + 56.0 * 56 * 64) * es;
  const double avgpool = n * (7.0 * 7 * 2048 + 2048) * es;
  const double fc = (2048.0 * 1000 + n * (2048 + 1000)) * es;
  const double bytes_us = (maxpool + avgpool + fc) / 3.0e6;  // 3.0 TB/s = 3e6 B/us
  const double fc_flop_us = 2.0 * n * 2048 * 1000 / (0.5 * peak_tflops(p) * 1e6);
  return bytes_us + fc_flop_us + 3 * 2.5;
}

Report::Report(const std::string& csv_path) {
  if (!csv_path.empty()) {
    csv_ = std::fopen(csv_path.c_str(), "w");
    if (csv_) {
      std::fprintf(csv_,
                   "batch,precision,layer,shape,count,family,tactic,init_ms,median_us,host_us,"
                   "tflops,rel_l2,mismatches,correct,pruned,error,note\n");
    }
  }
}

Report::~Report() {
  if (csv_) std::fclose(csv_);
}

void Report::note(const ResNetConv& l, int batch, Precision p, const std::string& text) {
  std::printf("  [%s b%d %s] %s\n", l.name, batch, cuda::precision_name(p), text.c_str());
}

void Report::add(LayerResult r) { results_.push_back(std::move(r)); }

static std::string csv_escape(std::string s) {
  std::replace(s.begin(), s.end(), ',', ';');
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

void Report::print_last() const {
  if (results_.empty()) return;
  const LayerResult& r = results_.back();
  const double flop = 2.0 * double(r.problem.shape.macs());
  std::printf("%s b%d %s [%s, %s]\n", r.layer->name, r.batch, cuda::precision_name(r.precision),
              r.problem.shape.str().c_str(), cuda::epilogue_name(r.problem.epilogue));
  for (const auto& t : r.tactics) {
    const double tf = t.median_us > 0 ? flop / (t.median_us * 1e6) : 0;
    if (!t.error.empty()) {
      std::printf("    %-58s FAILED (init %.0f ms): %s\n", t.name.c_str(), t.init_ms,
                  t.error.c_str());
    } else if (!t.correct) {
      std::printf("    %-58s WRONG  rel_l2 %.3g nonfinite %lld mismatches %lld maxdiff %lld\n",
                  t.name.c_str(), t.check.rel_l2, (long long)t.check.nonfinite,
                  (long long)t.check.mismatches, (long long)t.check.max_abs_diff);
    } else if (t.pruned) {
      std::printf("    %-58s %9.2f us (3-run screen, over 3x best: not timed further)\n",
                  t.name.c_str(), t.median_us);
    } else {
      std::printf("    %-58s %9.2f us %7.1f TF/s  host %5.1f us  init %6.0f ms  err %.2g\n",
                  t.name.c_str(), t.median_us, tf, t.host_us, t.init_ms, t.check.rel_l2);
    }
    if (!t.note.empty()) std::printf("      note: %s\n", t.note.c_str());
    if (csv_) {
      std::fprintf(csv_, "%d,%s,%s,%s,%d,%s,%s,%.1f,%.3f,%.2f,%.2f,%.3g,%lld,%d,%d,%s,%s\n",
                   r.batch, cuda::precision_name(r.precision), r.layer->name,
                   csv_escape(r.problem.shape.str()).c_str(), r.layer->count, t.family.c_str(),
                   t.name.c_str(), t.init_ms, t.median_us, t.host_us, tf, t.check.rel_l2,
                   (long long)t.check.mismatches, int(t.correct), int(t.pruned),
                   csv_escape(t.error).c_str(), csv_escape(t.note).c_str());
      std::fflush(csv_);
    }
  }
  std::fflush(stdout);
}

const LayerResult* Report::find(const ResNetConv& l, int batch, Precision p) const {
  for (const auto& r : results_) {
    if (r.layer == &l && r.batch == batch && r.precision == p) return &r;
  }
  return nullptr;
}

double Report::network_conv_us(int batch, Precision p, bool fallback, bool best_of_both,
                               int* missing) const {
  double sum = 0;
  *missing = 0;
  for (const auto& l : kResNet50Convs) {
    const LayerResult* r = find(l, batch, p);
    const TacticResult* b = r ? r->best() : nullptr;
    const LayerResult* f = find(l, batch, Precision::kFP16);
    const TacticResult* fb = f ? f->best() : nullptr;
    if ((!b && fallback) || (best_of_both && fb && (!b || fb->median_us < b->median_us))) b = fb;
    if (!b) {
      ++*missing;
      continue;
    }
    sum += l.count * b->median_us;
  }
  return sum;
}

void Report::print_summary(const std::vector<int>& batches,
                           const std::vector<Precision>& precisions) const {
  static const char* kFamilies[] = {"cudnn_graph", "cudnn_legacy", "cublaslt", "cutlass_sm90"};
  for (int batch : batches) {
    for (Precision p : precisions) {
      std::printf("\n== batch %d, %s: best correct tactic per layer (median of runs) ==\n", batch,
                  cuda::precision_name(p));
      std::printf(
          "| layer | shape (HxWxC->K, RxS/stride) | x | best tactic | us | %s | %% peak |"
          " floor us | bound | %% of floor | graph us | legacy us | cublasLt us |"
          " cutlass us |\n",
          p == Precision::kINT8 ? "TOPS" : "TFLOP/s");
      std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
      for (const auto& l : kResNet50Convs) {
        const LayerResult* r = find(l, batch, p);
        if (!r) continue;
        const TacticResult* b = r->best();
        const auto& sh = r->problem.shape;
        char shape[96];
        std::snprintf(shape, sizeof(shape), "%dx%dx%d->%d, %dx%d/%d", sh.h, sh.w, sh.c, sh.k, sh.r,
                      sh.s, sh.stride);
        const double tf = b ? 2.0 * double(sh.macs()) / (b->median_us * 1e6) : 0;
        const double mem_us = roofline_bytes(r->problem) / 3.0e6;
        const double math_us = 2.0 * double(sh.macs()) / (peak_tflops(p) * 1e6);
        const double floor_us = std::max(mem_us, math_us);
        std::printf("| %s | %s | %d | %s | %.2f | %.1f | %.1f | %.2f | %s | %.0f |", l.name, shape,
                    l.count, b ? b->name.c_str() : "(none correct)", b ? b->median_us : 0.0, tf,
                    100.0 * tf / peak_tflops(p), floor_us, mem_us > math_us ? "mem" : "math",
                    b ? 100.0 * floor_us / b->median_us : 0.0);
        for (const char* f : kFamilies) {
          const TacticResult* fb = r->best_of(f);
          if (fb) {
            std::printf(" %.2f |", fb->median_us);
          } else {
            std::printf(" - |");
          }
        }
        std::printf("\n");
      }
    }
  }
  std::printf(
      "\n== network prediction: 53 convs weighted by occurrence + pooling/FC estimate ==\n");
  std::printf(
      "| batch | precision | conv sum us | pool+fc est us | total us | images/s | missing |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int batch : batches) {
    for (Precision p : precisions) {
      const bool int8 = p == Precision::kINT8;
      for (int variant = 0; variant < (int8 ? 2 : 1); ++variant) {
        int missing = 0;
        const double conv = network_conv_us(batch, p, int8, variant == 1, &missing);
        if (conv == 0) continue;
        const double pool = pool_fc_estimate_us(batch, p);
        const double total = conv + pool;
        const char* label = !int8          ? ""
                            : variant == 0 ? " (fp16 where no int8)"
                                           : " or fp16, faster per layer";
        std::printf("| %d | %s%s | %.1f | %.1f | %.1f | %.0f | %d |\n", batch,
                    cuda::precision_name(p), label, conv, pool, total, batch * 1e6 / total,
                    missing);
      }
    }
  }
}

}  // namespace kiln::bench
