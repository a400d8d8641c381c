// moment_bias: how far each compressed moment format's updates drift from
// f32 moments' on one synthetic gradient stream (issue 28: run 69's
// compressed formats ended 0.005-0.04 *below* f32's validation loss; is
// that a bias of the format, or the runs' noise?).
//
// Four offload::CpuOptimizer (AdamW) over the same elements, moments f32,
// bf16 to nearest, bf16 stochastic and 8-bit block-wise, are fed the same
// gradient of every step. Gradients never depend on the weights, so each
// format's moments follow the same stream, and the master weights are
// zeroed before each step, so the step's output is the update itself
// (decoupled decay times 0 is 0): u_c against u_f32, element for element.
//
// The stream has the statistics that make a block-wise code work hard:
// every element a scale 10^U(-decades, 0) (a block spans `decades`
// decades: quiet and busy units, rare and frequent embedding rows), a few
// outliers per block at 30x, a persistent mean of `snr` times the noise
// (the signal Adam follows), a global magnitude that shrinks as 1/(1 +
// t/shrink) (the gradient norm falling in early training), and a fraction
// `sparse_blocks` of the blocks whose elements see a nonzero gradient on
// a step only with probability `sparse_p` (embedding rows absent from a
// batch).
//
// Prints one JSON line per format and window of steps (windows end at
// `report` steps): over the window's steps and elements,
//   update_ratio   sum |u_c| / sum |u_f32|  (> 1: bigger steps than f32)
//   projection     sum u_c u_f32 / sum u_f32^2 (progress along f32's step)
//   rel_error      sqrt(sum (u_c - u_f32)^2 / sum u_f32^2)
//   sqrt_v_ratio   sum sqrt(v_c) / sum sqrt(v_f32)  (< 1: denominator low)
//   m_ratio        sum m_c sign(m_f32) / sum |m_f32|
//   m_abs_ratio    sum |m_c| / sum |m_f32|  (> m_ratio: |m| kept from noise)
//   v_zero         fraction of elements with v_c == 0 but v_f32 > 0
//   update_ratio_by_decade, sqrt_v_ratio_by_decade, m_abs_ratio_by_decade
//                  the same ratios over the elements of each decade of
//                  scale, loudest first (where a block code loses the
//                  quiet ones)
// Flags (--name=value): elements=262144 steps=2000 warmup=100 lr=6e-4
// beta1=0.9 beta2=0.95 eps=1e-8 weight_decay=0.1 decades=4 snr=0.3
// shrink=200 sparse_blocks=0.1 sparse_p=0.1 seed=1
// report=100,500,1000,2000 threads=2 simd=avx512|avx2|scalar (default:
// the best this CPU has). Defaults: bench/convergence's
// AdamW (betas 0.9/0.95, eps 1e-8, lr 6e-4, 100 warm-up steps, linear decay
// to 2000).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "offload/cpu_optimizer.h"

namespace {

using ze::offload::CpuExecutionOptions;
using ze::offload::CpuOptimizer;
using ze::offload::MomentFormat;
using ze::offload::OptimizerOptions;
using ze::offload::StepArgs;

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.find('=') == std::string::npos) {
      std::fprintf(stderr, "moment_bias: expected --name=value, got %s\n",
                   argv[i]);
      std::exit(2);
    }
    const size_t eq = arg.find('=');
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  return flags;
}

double Flag(const std::map<std::string, std::string>& flags,
            const std::string& name, double fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : std::atof(it->second.c_str());
}

// xoshiro-style 64-bit generator (splitmix64 steps): reproducible, fast.
struct Rng {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Normal() {
    const double u1 = Uniform() + 1e-300;
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

struct Sums {
  double abs_c = 0, abs_f = 0, dot = 0, sq_f = 0, sq_diff = 0;
  double root_v_c = 0, root_v_f = 0, m_signed = 0, m_abs_c = 0, m_abs_f = 0;
  double v_zero = 0, count = 0;
  std::vector<double> decade_abs_c, decade_abs_f, decade_root_v_c,
      decade_root_v_f, decade_m_c, decade_m_f;
  void Reset(int decades) {
    *this = Sums();
    for (auto* d : {&decade_abs_c, &decade_abs_f, &decade_root_v_c,
                    &decade_root_v_f, &decade_m_c, &decade_m_f}) {
      d->assign(decades, 0.0);
    }
  }
};

void PrintDecades(const char* name, const std::vector<double>& c,
                  const std::vector<double>& f) {
  std::printf(",\"%s\":[", name);
  for (size_t d = 0; d < c.size(); ++d) {
    std::printf("%s%.4f", d ? "," : "", f[d] > 0 ? c[d] / f[d] : 0.0);
  }
  std::printf("]");
}

}  // namespace

int main(int argc, char** argv) {
  const auto flags = ParseFlags(argc, argv);
  const int64_t n = static_cast<int64_t>(Flag(flags, "elements", 262144));
  const int steps = static_cast<int>(Flag(flags, "steps", 2000));
  const int warmup = static_cast<int>(Flag(flags, "warmup", 100));
  const double lr = Flag(flags, "lr", 6e-4);
  const double decades = Flag(flags, "decades", 4);
  const double snr = Flag(flags, "snr", 0.3);
  const double shrink = Flag(flags, "shrink", 200);
  const double sparse_blocks = Flag(flags, "sparse_blocks", 0.1);
  const double sparse_p = Flag(flags, "sparse_p", 0.1);
  std::vector<int> report = {100, 500, 1000, 2000};
  if (flags.count("report")) {
    report.clear();
    const std::string& s = flags.at("report");
    for (size_t pos = 0; pos < s.size();) {
      report.push_back(std::atoi(s.c_str() + pos));
      const size_t comma = s.find(',', pos);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }

  OptimizerOptions base;
  base.type = ze::offload::OptimizerType::kAdamW;
  base.beta1 = Flag(flags, "beta1", 0.9);
  base.beta2 = Flag(flags, "beta2", 0.95);
  base.eps = Flag(flags, "eps", 1e-8);
  base.weight_decay = Flag(flags, "weight_decay", 0.1);
  base.rounding_seed = static_cast<uint64_t>(Flag(flags, "seed", 1));
  CpuExecutionOptions execution;
  execution.num_threads = static_cast<int>(Flag(flags, "threads", 2));
  execution.pin_threads = false;
  execution.huge_pages = false;
  if (flags.count("simd")) {
    const std::string& simd = flags.at("simd");
    execution.simd_path = simd == "scalar" ? ze::offload::SimdPath::kScalar
                          : simd == "avx2" ? ze::offload::SimdPath::kAvx2
                                           : ze::offload::SimdPath::kAvx512;
  }

  struct Format {
    const char* name;
    MomentFormat moments;
    bool stochastic;
  };
  const std::vector<Format> formats = {
      {"f32", MomentFormat::kF32, false},
      {"bf16_rne", MomentFormat::kBf16, false},
      {"bf16_sr", MomentFormat::kBf16, true},
      {"int8", MomentFormat::kBlockwise8, false}};
  std::vector<std::unique_ptr<CpuOptimizer>> optimizers;
  for (const Format& format : formats) {
    OptimizerOptions options = base;
    options.moments = format.moments;
    options.stochastic_rounding = format.stochastic;
    auto created = CpuOptimizer::Create(options, n, execution);
    if (!created.ok()) {
      std::fprintf(stderr, "moment_bias: %s\n",
                   created.status().ToString().c_str());
      return 1;
    }
    optimizers.push_back(std::move(*created));
  }

  // The stream's fixed per-element statistics.
  Rng rng{static_cast<uint64_t>(Flag(flags, "seed", 1)) * 7919};
  const int num_decades = std::max(1, static_cast<int>(std::ceil(decades)));
  std::vector<float> scale(n), mean(n);
  std::vector<int> decade(n);
  std::vector<uint8_t> sparse(n);
  for (int64_t block = 0; block * 256 < n; ++block) {
    const bool is_sparse = rng.Uniform() < sparse_blocks;
    for (int64_t i = block * 256; i < std::min(n, (block + 1) * 256); ++i) {
      const double exponent = -decades * rng.Uniform();
      decade[i] = std::min(num_decades - 1, static_cast<int>(-exponent));
      scale[i] = static_cast<float>(std::pow(10.0, exponent));
      sparse[i] = is_sparse;
    }
    for (int k = 0; k < 2; ++k) {
      const int64_t i = block * 256 + static_cast<int64_t>(rng.Uniform() * 256);
      if (i < n) {
        scale[i] *= 30.0f;
        decade[i] = 0;
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    mean[i] = static_cast<float>(snr * scale[i] * rng.Normal());
  }

  const size_t f = formats.size();
  std::vector<std::vector<float>> master(f, std::vector<float>(n));
  std::vector<std::vector<float>> m(f, std::vector<float>(n));
  std::vector<std::vector<float>> v(f, std::vector<float>(n));
  std::vector<float> grads(n);
  std::vector<Sums> sums(f);
  for (Sums& s : sums) s.Reset(num_decades);
  int window_start = 1;
  size_t next_report = 0;
  for (int t = 1; t <= steps; ++t) {
    const double magnitude = 1.0 / (1.0 + t / shrink);
    for (int64_t i = 0; i < n; ++i) {
      if (sparse[i] && rng.Uniform() >= sparse_p) {
        grads[i] = 0.0f;
        continue;
      }
      grads[i] =
          static_cast<float>(magnitude * (mean[i] + scale[i] * rng.Normal()));
    }
    StepArgs args;
    args.lr = t <= warmup ? lr * t / warmup
                          : lr * std::max(0.0, double(steps - t)) /
                                std::max(1, steps - warmup);
    if (args.lr == 0.0) args.lr = lr * 1e-3;  // the last step: keep it visible
    for (size_t k = 0; k < f; ++k) {
      std::fill(master[k].begin(), master[k].end(), 0.0f);
      const absl::Status status = optimizers[k]->Step(
          master[k].data(), grads.data(), ze::DType::kF32, args);
      if (!status.ok()) {
        std::fprintf(stderr, "moment_bias: %s\n", status.ToString().c_str());
        return 1;
      }
      optimizers[k]->ReadState(0, 0, n, m[k].data());
      optimizers[k]->ReadState(1, 0, n, v[k].data());
    }
    for (size_t k = 1; k < f; ++k) {
      Sums& s = sums[k];
      for (int64_t i = 0; i < n; ++i) {
        const double uc = master[k][i], uf = master[0][i];
        s.abs_c += std::fabs(uc);
        s.abs_f += std::fabs(uf);
        s.dot += uc * uf;
        s.sq_f += uf * uf;
        s.sq_diff += (uc - uf) * (uc - uf);
        s.decade_abs_c[decade[i]] += std::fabs(uc);
        s.decade_abs_f[decade[i]] += std::fabs(uf);
        const double root_c = std::sqrt(static_cast<double>(v[k][i]));
        const double root_f = std::sqrt(static_cast<double>(v[0][i]));
        s.root_v_c += root_c;
        s.root_v_f += root_f;
        s.decade_root_v_c[decade[i]] += root_c;
        s.decade_root_v_f[decade[i]] += root_f;
        const double mf = m[0][i];
        s.decade_m_c[decade[i]] += std::fabs(m[k][i]);
        s.decade_m_f[decade[i]] += std::fabs(mf);
        s.m_signed += mf >= 0 ? m[k][i] : -m[k][i];
        s.m_abs_c += std::fabs(m[k][i]);
        s.m_abs_f += std::fabs(mf);
        s.v_zero += (v[k][i] == 0.0f && v[0][i] > 0.0f);
      }
      s.count += static_cast<double>(n);
    }
    if (next_report < report.size() && t == report[next_report]) {
      for (size_t k = 1; k < f; ++k) {
        const Sums& s = sums[k];
        std::printf(
            "{\"format\":\"%s\",\"steps\":[%d,%d],\"update_ratio\":%.4f,"
            "\"projection\":%.4f,\"rel_error\":%.4f,\"sqrt_v_ratio\":%.4f,"
            "\"m_ratio\":%.4f,\"m_abs_ratio\":%.4f,\"v_zero\":%.5f",
            formats[k].name, window_start, t, s.abs_c / s.abs_f, s.dot / s.sq_f,
            std::sqrt(s.sq_diff / s.sq_f), s.root_v_c / s.root_v_f,
            s.m_signed / s.m_abs_f, s.m_abs_c / s.m_abs_f, s.v_zero / s.count);
        PrintDecades("update_ratio_by_decade", s.decade_abs_c, s.decade_abs_f);
        PrintDecades("sqrt_v_ratio_by_decade", s.decade_root_v_c,
                     s.decade_root_v_f);
        PrintDecades("m_abs_ratio_by_decade", s.decade_m_c, s.decade_m_f);
        std::printf("}\n");
      }
      std::fflush(stdout);
      for (Sums& s : sums) s.Reset(num_decades);
      window_start = t + 1;
      ++next_report;
    }
  }
  return 0;
}
