// cpu_adam_bench: the offload CPU optimizer's throughput against the host's
// memory bandwidth, measured in the same run. Prints one JSON object per
// line:
//
//   {"bench":"triad","threads":16,"elements":134217728,"GBps":180.2}
//   {"bench":"cpu_adam","optimizer":"adamw","simd":"avx512","threads":16,
//    "params":200000000,"steps":5,"best_s":0.0301,"mean_s":0.0305,
//    "params_per_s":6.64e9,"adam_GBps":186.0,"triad_GBps":180.2,
//    "fraction_of_triad":1.03,"best_triad_GBps":180.2,
//    "fraction_of_best_triad":1.03}
//
// The triad lines (one per thread count) come first; triad_GBps is the
// triad at the same thread count, best_triad_GBps the best of all of them.
//
// The step is AdamW with weight decay over f32 master weights and moments,
// bf16 gradients and the fused bf16 write of the updated weights: 28 bytes
// of traffic per parameter (read p, m, v f32 and g bf16; write p, m, v f32
// and the bf16 copy). The bound is a multi-threaded STREAM triad
// a[i] = b[i] + s * c[i] over f32 arrays far larger than the caches (12
// bytes per element), run with the same thread count, with non-temporal
// stores so that its 12 bytes are all the traffic it causes. Adam's 28 bytes
// are the bytes it asks for; its plain stores of the bf16 copy cost up to 2
// more per parameter in write-allocate reads, so fraction_of_triad slightly
// understates how close Adam runs to the memory bound. GB/s is 1e9
// bytes per second; times are the best and the mean of `steps` timed steps
// after one untimed warm-up step.
//
// Flags: --params=200000000 --threads=1,2,4,... (default: powers of two up
// to the hardware threads, and the hardware threads) --steps=5
// --triad_mib=512 (MiB per triad array) --tile_kib=64
// --simd=avx512|avx2|scalar (default: the best this CPU has)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/status.h"
#include "offload/cpu_optimizer.h"
#include "offload/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Flags {
  int64_t params = 200000000;
  std::vector<int> threads;
  int steps = 5;
  int64_t triad_mib = 512;
  int64_t tile_kib = 64;
  std::string simd;
};

// Runs fn(begin, end) over [0, count) cut into one contiguous chunk per
// thread, each starting on a 64-byte boundary of an f32 array, so each
// thread touches the same pages every time (first touch places them on its
// NUMA node).
template <class Fn>
void ForChunks(ze::offload::ThreadPool& pool, int64_t count, const Fn& fn) {
  const int64_t chunks = pool.num_threads();
  auto boundary = [&](int64_t chunk) {
    return chunk == chunks ? count : count * chunk / chunks / 16 * 16;
  };
  pool.ParallelFor(
      chunks, [&](int64_t chunk) { fn(boundary(chunk), boundary(chunk + 1)); });
}

struct FreeDeleter {
  void operator()(void* data) const { std::free(data); }
};

template <class T>
std::unique_ptr<T[], FreeDeleter> AlignedArray(int64_t count) {
  void* data = std::aligned_alloc(64, (count * sizeof(T) + 63) / 64 * 64);
  if (data == nullptr) {
    std::fprintf(stderr, "cpu_adam_bench: out of memory for %lld elements\n",
                 static_cast<long long>(count));
    std::exit(1);
  }
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(data));
}

// Best-of-5 triad bandwidth with `threads` threads over arrays of `count`.
// AVX2 with non-temporal stores: the written array is not read first (no
// write-allocate), so the 12 bytes counted per element are the bytes that
// actually cross the memory bus.
double TriadGBps(int threads, int64_t count) {
  ze::offload::ThreadPool pool(threads);
  auto a = AlignedArray<float>(count);
  auto b = AlignedArray<float>(count);
  auto c = AlignedArray<float>(count);
  ForChunks(pool, count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
  });
  const float scalar = 3.0f;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const Clock::time_point start = Clock::now();
    ForChunks(pool, count, [&](int64_t begin, int64_t end) {
      const __m256 s = _mm256_set1_ps(scalar);
      int64_t i = begin;
      for (; i + 8 <= end; i += 8) {
        _mm256_stream_ps(
            a.get() + i,
            _mm256_add_ps(_mm256_load_ps(b.get() + i),
                          _mm256_mul_ps(s, _mm256_load_ps(c.get() + i))));
      }
      for (; i < end; ++i) a[i] = b[i] + scalar * c[i];
      _mm_sfence();
    });
    best = std::min(best, Seconds(start));
  }
  // Keep the result observable so the loop is not optimised away.
  if (a[count / 2] != 7.0f) std::fprintf(stderr, "triad check failed\n");
  return 12.0 * count / best / 1e9;
}

absl::Status Run(const Flags& flags) {
  using ze::offload::CpuOptimizer;
  ze::offload::OptimizerOptions options;
  options.type = ze::offload::OptimizerType::kAdamW;
  options.weight_decay = 0.1;
  ze::offload::CpuExecutionOptions execution;
  execution.tile_bytes = flags.tile_kib * 1024;
  if (!flags.simd.empty()) {
    if (flags.simd == "avx512") {
      execution.simd_path = ze::offload::SimdPath::kAvx512;
    } else if (flags.simd == "avx2") {
      execution.simd_path = ze::offload::SimdPath::kAvx2;
    } else if (flags.simd == "scalar") {
      execution.simd_path = ze::offload::SimdPath::kScalar;
    } else {
      return absl::InvalidArgumentError(
          "--simd must be avx512, avx2 or scalar, got " + flags.simd);
    }
  }
  const int64_t n = flags.params;
  const int64_t triad_count = flags.triad_mib * 1024 * 1024 / 4;

  // Every triad first, so each Adam line can also be set against the best
  // bandwidth any thread count reached (at few threads, a core's limit on
  // outstanding misses caps the 3-stream triad below what Adam's 5 streams
  // get, so the same-thread triad alone is not a bound there).
  std::vector<double> triads;
  double best_triad = 0.0;
  for (int threads : flags.threads) {
    triads.push_back(TriadGBps(threads, triad_count));
    best_triad = std::max(best_triad, triads.back());
    std::printf(
        "{\"bench\":\"triad\",\"threads\":%d,\"elements\":%lld,"
        "\"GBps\":%.1f}\n",
        threads, static_cast<long long>(triad_count), triads.back());
    std::fflush(stdout);
  }

  for (size_t run = 0; run < flags.threads.size(); ++run) {
    const int threads = flags.threads[run];
    const double triad = triads[run];
    execution.num_threads = threads;
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<CpuOptimizer> optimizer,
                        CpuOptimizer::Create(options, n, execution));
    ze::offload::ThreadPool pool(threads);
    auto master = AlignedArray<float>(n);
    auto grads = AlignedArray<uint16_t>(n);
    auto out = AlignedArray<uint16_t>(n);
    ForChunks(pool, n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        master[i] = 0.01f * static_cast<float>(i % 1000 - 500);
        grads[i] = ze::FloatToBf16Bits(1e-3f * static_cast<float>(i % 77 - 38));
        out[i] = 0;
      }
    });
    ze::offload::StepArgs args;
    args.lr = 1e-4;
    double best = 1e30, total = 0;
    for (int step = 0; step <= flags.steps; ++step) {
      const Clock::time_point start = Clock::now();
      ZE_RETURN_IF_ERROR(optimizer->Step(master.get(), grads.get(),
                                         ze::DType::kBF16, args, out.get(),
                                         ze::DType::kBF16));
      const double seconds = Seconds(start);
      if (step == 0) continue;  // warm-up
      best = std::min(best, seconds);
      total += seconds;
    }
    const double params_per_s = n / best;
    const double adam_gbps = 28.0 * n / best / 1e9;
    std::printf(
        "{\"bench\":\"cpu_adam\",\"optimizer\":\"adamw\",\"simd\":\"%s\","
        "\"threads\":%d,\"params\":%lld,\"steps\":%d,\"best_s\":%.5f,"
        "\"mean_s\":%.5f,\"params_per_s\":%.4g,\"adam_GBps\":%.1f,"
        "\"triad_GBps\":%.1f,\"fraction_of_triad\":%.3f,"
        "\"best_triad_GBps\":%.1f,\"fraction_of_best_triad\":%.3f}\n",
        ze::offload::SimdPathName(optimizer->simd_path()), threads,
        static_cast<long long>(n), flags.steps, best, total / flags.steps,
        params_per_s, adam_gbps, triad, adam_gbps / triad, best_triad,
        adam_gbps / best_triad);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const std::string& name) -> const char* {
      const std::string prefix = "--" + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("params")) {
      flags.params = static_cast<int64_t>(std::strtod(v, nullptr));
    } else if (const char* v = value("threads")) {
      for (const char* p = v; *p != '\0';) {
        char* end = nullptr;
        flags.threads.push_back(static_cast<int>(std::strtol(p, &end, 10)));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p != '\0') break;
      }
    } else if (const char* v = value("steps")) {
      flags.steps = std::atoi(v);
    } else if (const char* v = value("triad_mib")) {
      flags.triad_mib = std::atoll(v);
    } else if (const char* v = value("tile_kib")) {
      flags.tile_kib = std::atoll(v);
    } else if (const char* v = value("simd")) {
      flags.simd = v;
    } else {
      std::fprintf(stderr, "unknown flag %s (see the header of %s)\n",
                   arg.c_str(), __FILE__);
      return 2;
    }
  }
  if (flags.threads.empty()) {
    const int hardware =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (int t = 1; t < hardware; t *= 2) flags.threads.push_back(t);
    flags.threads.push_back(hardware);
  }
  for (int threads : flags.threads) {
    if (threads < 1) {
      std::fprintf(stderr, "--threads: every count must be >= 1\n");
      return 2;
    }
  }
  if (flags.params < 1 || flags.steps < 1 || flags.triad_mib < 1) {
    std::fprintf(stderr, "--params, --steps and --triad_mib must be >= 1\n");
    return 2;
  }
  const absl::Status status = Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "cpu_adam_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
