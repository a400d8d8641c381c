// cpu_adam_bench: the offload CPU optimizer's throughput against the host's
// memory bandwidth, measured in the same run. Prints one JSON object per
// line:
//
//   {"bench":"bandwidth","threads":16,"elements":134217728,"read_GBps":..,
//    "copy_GBps":..,"triad_GBps":..}
//   {"bench":"cpu_adam","optimizer":"adamw","simd":"avx512","threads":16,
//    "schedule":"static","pin":0,"huge_pages":1,"nt_out":1,
//    "prefetch_bytes":0,"params":200000000,"steps":5,"best_s":0.0301,
//    "mean_s":0.0305,"params_per_s":6.64e9,"adam_GBps":186.0,
//    "triad_GBps":180.2,"fraction_of_triad":1.03,"best_triad_GBps":180.2,
//    "fraction_of_best_triad":1.03,"step_traffic_GBps":190.1,
//    "step_traffic_mean_s":0.0298,"fraction_of_step_traffic":0.98}
//
// After each thread count's cpu_adam line, one "cpu_adam_formats" line per
// optimizer-state format (issue 28): f32 moments, bf16 moments (nearest and
// stochastic), 8-bit block-wise moments, the exact 16+16 master with f32
// moments and with 8-bit ones, each with the bytes a parameter's step moves
// and the bound the same thread count's triad puts on it:
//
//   {"bench":"cpu_adam_formats","format":"8bit","moments":"8bit",
//    "master":"f32","threads":16,"bytes_per_param":16.06,
//    "params_per_s":..,"GBps":..,"triad_GBps":..,"bound_params_per_s":..,
//    "fraction_of_bound":..,...}
//
// With --chunk_elements=N the cpu_adam line also times the same step made
// of N-element ranges, as the engine's offloaded update runs it: one
// StepRange call per range ("per_chunk_best_s", "per_chunk_mean_s": each
// call a parallel loop ending in a partial wave), and the ranges as one
// stream of tiles (StepRanges: "stream_best_s", "stream_mean_s"), and that
// stream again with speculation's backup taken tile by tile before each
// tile's update (master, m and v: 12 bytes a parameter copied to a separate
// buffer, as offload/host_update.cc's BackUp does), once with std::memcpy
// ("backup_memcpy_best_s") and once with core/streaming_copy.h's
// non-temporal copy ("backup_streaming_best_s", what the engine uses).
//
// The bandwidth lines (one per thread count) come first; triad_GBps is the
// triad at the same thread count, best_triad_GBps the best of all of them.
//
// The step is AdamW with weight decay over f32 master weights and moments,
// bf16 gradients and the fused bf16 write of the updated weights: 28 bytes
// of traffic per parameter (read p, m, v f32 and g bf16; write p, m, v f32
// and the bf16 copy). The bounds run with the same thread count, thread
// split, pinning and page advice as the step, over f32 arrays far larger
// than the caches, first-touched by the threads that use them:
//   read:  sum of a[i] (4 bytes per element),
//   copy:  a[i] = b[i], non-temporal stores (8 bytes),
//   triad: a[i] = b[i] + s * c[i], non-temporal stores (12 bytes),
// so the bytes counted are all the traffic each causes; and
//   step traffic: the Adam step's own streams and schedule with an add in
//     place of its arithmetic (MeasureStepTraffic, 28 bytes),
// whose GB/s is the bound that matters: fraction_of_step_traffic near 1
// means the step runs at what this host's memory gives its access pattern.
// Adam's 28 bytes are the bytes it asks for; with plain stores of the bf16 copy
// (--nt_out=0) it costs up to 2 more per parameter in write-allocate reads.
// GB/s is 1e9 bytes per second; times are the best and the mean of `steps`
// timed steps after one untimed warm-up step.
//
// Flags: --params=200000000 --threads=1,2,4,... (default: powers of two up
// to the hardware threads, and the hardware threads) --steps=5
// --triad_mib=512 (MiB per bandwidth array) --tile_kib=64
// --simd=avx512|avx2|scalar (default: the best this CPU has), and the
// CpuExecutionOptions under test: --schedule=static|dynamic --pin=0|1
// --huge_pages=0|1 --nt_out=0|1 --prefetch_bytes=N (defaults: the
// optimizer's defaults); --chunk_elements=N (default 0: no chunked timing).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/streaming_copy.h"
#include "core/thread_pool.h"
#include "offload/cpu_optimizer.h"

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
  int64_t tile_kib = ze::offload::CpuExecutionOptions().tile_bytes / 1024;
  std::string simd;
  int64_t chunk_elements = 0;
  ze::offload::CpuExecutionOptions execution;
};

struct Timing {
  double best_s = 0.0;
  double mean_s = 0.0;
};

// Best and mean of `steps` timed calls of `step` after one untimed call.
template <class Fn>
absl::StatusOr<Timing> TimeSteps(int steps, const Fn& step) {
  double best = 1e30, total = 0;
  for (int i = 0; i <= steps; ++i) {
    const Clock::time_point start = Clock::now();
    ZE_RETURN_IF_ERROR(step());
    const double seconds = Seconds(start);
    if (i == 0) continue;  // warm-up
    best = std::min(best, seconds);
    total += seconds;
  }
  return Timing{best, total / steps};
}

// Runs fn(begin, end) over [0, count) cut into one contiguous piece per
// thread, piece k always on thread k and starting on a 4 KiB boundary of an
// f32 array (as CpuOptimizer's static split), so each thread touches the
// same pages every time and first touch places them on its NUMA node.
template <class Fn>
void ForPieces(ze::ThreadPool& pool, int64_t count, const Fn& fn) {
  const int64_t pieces = pool.num_threads();
  auto boundary = [&](int64_t piece) {
    return piece == pieces ? count : count * piece / pieces / 1024 * 1024;
  };
  pool.RunOnEachThread(
      [&](int piece) { fn(boundary(piece), boundary(piece + 1)); });
}

struct FreeDeleter {
  void operator()(void* data) const { std::free(data); }
};

// 2 MiB aligned and advised for transparent huge pages when `huge_pages`,
// else 64-byte aligned; not touched.
template <class T>
std::unique_ptr<T[], FreeDeleter> AlignedArray(int64_t count, bool huge_pages) {
  const size_t alignment = huge_pages ? size_t{2} << 20 : 64;
  const size_t bytes =
      (count * sizeof(T) + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, bytes);
  if (data == nullptr) {
    std::fprintf(stderr, "cpu_adam_bench: out of memory for %lld elements\n",
                 static_cast<long long>(count));
    std::exit(1);
  }
  if (huge_pages) madvise(data, bytes, MADV_HUGEPAGE);
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(data));
}

struct Bandwidth {
  double read_gbps = 0.0;
  double copy_gbps = 0.0;
  double triad_gbps = 0.0;
};

// Best-of-5 read, copy and triad bandwidth with `threads` threads over
// arrays of `count` f32. AVX2 loads, non-temporal stores: the written
// array is not read first (no write-allocate).
Bandwidth MeasureBandwidth(int threads, int64_t count,
                           const ze::offload::CpuExecutionOptions& execution) {
  ze::ThreadPool pool(threads, execution.pin_threads);
  auto a = AlignedArray<float>(count, execution.huge_pages);
  auto b = AlignedArray<float>(count, execution.huge_pages);
  auto c = AlignedArray<float>(count, execution.huge_pages);
  ForPieces(pool, count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
  });
  auto best_of_5 = [&](const auto& body) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const Clock::time_point start = Clock::now();
      ForPieces(pool, count, body);
      best = std::min(best, Seconds(start));
    }
    return best;
  };
  std::mutex sum_mutex;
  double sum = 0.0;  // of every read pass: 5 * count
  const double read_s = best_of_5([&](int64_t begin, int64_t end) {
    __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      sum0 = _mm256_add_ps(sum0, _mm256_load_ps(b.get() + i));
      sum1 = _mm256_add_ps(sum1, _mm256_load_ps(b.get() + i + 8));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(sum0, sum1));
    double total = 0;
    for (float lane : lanes) total += lane;
    for (; i < end; ++i) total += b[i];
    std::lock_guard<std::mutex> lock(sum_mutex);
    sum += total;
  });
  const double copy_s = best_of_5([&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      _mm256_stream_ps(a.get() + i, _mm256_load_ps(c.get() + i));
    }
    for (; i < end; ++i) a[i] = c[i];
    _mm_sfence();
  });
  const float scalar = 3.0f;
  const double triad_s = best_of_5([&](int64_t begin, int64_t end) {
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
  // Keep the results observable so no loop is optimised away.
  if (a[count / 2] != 7.0f || sum != 5.0 * count) {
    std::fprintf(stderr, "bandwidth check failed\n");
  }
  Bandwidth result;
  result.read_gbps = 4.0 * count / read_s / 1e9;
  result.copy_gbps = 8.0 * count / copy_s / 1e9;
  result.triad_gbps = 12.0 * count / triad_s / 1e9;
  return result;
}

// The step's memory traffic with almost none of its arithmetic: the same
// streams as the AVX-512 Adam kernel (read p, m, v f32 and g bf16; write p,
// m, v in place and a bf16 copy, streamed past the caches as --nt_out=1
// does), each element only added to, over the same tiles handed out the
// same way (dynamic: ThreadPool::ParallelFor, in tile order; static: one
// contiguous piece per thread). Its bytes per second are what this host's
// memory gives Adam's access pattern, so adam_GBps / step_traffic_GBps is
// how much of the loop's time is arithmetic the memory does not hide.
__attribute__((target("avx512f"))) void TrafficTile(float* p, const uint16_t* g,
                                                    float* m, float* v,
                                                    uint16_t* out,
                                                    int64_t count) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512 gradient = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i))),
        16));
    const __m512 new_p = _mm512_add_ps(_mm512_loadu_ps(p + i), gradient);
    _mm512_storeu_ps(p + i, new_p);
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), gradient));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), gradient));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtepi32_epi16(
                            _mm512_srli_epi32(_mm512_castps_si512(new_p), 16)));
  }
  for (; i < count; ++i) {
    const float gradient = ze::Bf16BitsToFloat(g[i]);
    p[i] += gradient;
    m[i] += gradient;
    v[i] += gradient;
    out[i] = ze::FloatToBf16Bits(p[i]);
  }
  _mm_sfence();
}

// Best and mean seconds of `steps` TrafficTile passes over `count` elements
// (after one untimed pass), on `threads` threads with `execution`'s pinning,
// page advice, schedule and tile size. 0 when the CPU lacks AVX-512.
absl::StatusOr<Timing> MeasureStepTraffic(
    int threads, int64_t count, int steps,
    const ze::offload::CpuExecutionOptions& execution) {
  if (!__builtin_cpu_supports("avx512f")) return Timing{};
  ze::ThreadPool pool(threads, execution.pin_threads);
  auto p = AlignedArray<float>(count, execution.huge_pages);
  auto g = AlignedArray<uint16_t>(count, execution.huge_pages);
  auto m = AlignedArray<float>(count, execution.huge_pages);
  auto v = AlignedArray<float>(count, execution.huge_pages);
  auto out = AlignedArray<uint16_t>(count, execution.huge_pages);
  // Tiles are multiples of 64 elements, so every tile's bf16 copy starts on
  // a 32-byte boundary (the streamed store's alignment).
  const int64_t tile =
      std::max<int64_t>(64, execution.tile_bytes / 4 / 64 * 64);
  const int64_t tiles = (count + tile - 1) / tile;
  auto pass = [&](bool fill) {
    auto run_range = [&](int64_t begin, int64_t end) {
      if (fill) {
        for (int64_t i = begin; i < end; ++i) {
          p[i] = m[i] = v[i] = 0.0f;
          g[i] = ze::FloatToBf16Bits(1e-3f);
        }
        return;
      }
      TrafficTile(p.get() + begin, g.get() + begin, m.get() + begin,
                  v.get() + begin, out.get() + begin, end - begin);
    };
    if (execution.schedule == ze::offload::CpuSchedule::kStaticSplit) {
      // Piece boundaries on 1024 elements keep the 32-byte alignment too.
      ForPieces(pool, count, run_range);
    } else {
      pool.ParallelFor(tiles, [&](int64_t t) {
        run_range(t * tile, std::min(count, (t + 1) * tile));
      });
    }
  };
  pass(/*fill=*/true);
  ZE_ASSIGN_OR_RETURN(const Timing timing, TimeSteps(steps, [&] {
                        pass(/*fill=*/false);
                        return absl::OkStatus();
                      }));
  // Every pass added g once: the loops ran (and were not optimised away).
  const float expected = static_cast<float>(steps + 1) *
                         ze::Bf16BitsToFloat(ze::FloatToBf16Bits(1e-3f));
  if (std::abs(v[count / 2] - expected) > 1e-3f * expected) {
    std::fprintf(stderr, "step traffic check failed: %g, expected %g\n",
                 v[count / 2], expected);
  }
  return timing;
}

const char* ScheduleName(ze::offload::CpuSchedule schedule) {
  return schedule == ze::offload::CpuSchedule::kStaticSplit ? "static"
                                                            : "dynamic";
}

// One optimizer-state format of the "formats" lines: how the moments are
// stored, whether the master is the exact 16+16 split (bf16 weights + 16-bit
// remainders), and the bytes a parameter's step moves (read and write of
// master and moments, read of the bf16 gradient, write of the bf16 weights;
// the split master's weights are its high half, read and written).
struct StateFormat {
  const char* name;
  ze::offload::MomentFormat moments;
  bool stochastic;
  bool split_master;
  double bytes;
};

constexpr double k8BitSteps = 2.0 * 2 * 4 / ze::offload::kMomentBlock;
const StateFormat kStateFormats[] = {
    {"f32", ze::offload::MomentFormat::kF32, false, false, 28.0},
    {"bf16", ze::offload::MomentFormat::kBf16, false, false, 20.0},
    {"bf16_stochastic", ze::offload::MomentFormat::kBf16, true, false, 20.0},
    {"8bit", ze::offload::MomentFormat::kBlockwise8, false, false,
     16.0 + k8BitSteps},
    {"master16", ze::offload::MomentFormat::kF32, false, true, 26.0},
    {"master16_8bit", ze::offload::MomentFormat::kBlockwise8, false, true,
     14.0 + k8BitSteps},
};

// The "formats" lines: AdamW's step per parameter in each state format at
// `threads` threads, against the memory bound the same thread count's
// triad gives that format's bytes (bound_params_per_s = triad / bytes).
// CpuOptimizer runs the f32-master formats (its threads and tiles); the
// 16+16 master formats run the same kernel (RunStepKernel with master_lo)
// over the optimizer's tiles on an equal pool, as zero::FlatOptimizer's CPU
// path and the tests do.
absl::Status RunStateFormats(const Flags& flags,
                             const ze::offload::CpuExecutionOptions& base,
                             int threads, double triad, double best_triad) {
  using ze::offload::CpuOptimizer;
  const int64_t n = flags.params;
  for (const StateFormat& format : kStateFormats) {
    ze::offload::OptimizerOptions options;
    options.type = ze::offload::OptimizerType::kAdamW;
    options.weight_decay = 0.1;
    options.moments = format.moments;
    options.stochastic_rounding = format.stochastic;
    ze::offload::CpuExecutionOptions execution = base;
    execution.num_threads = threads;
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<CpuOptimizer> optimizer,
                        CpuOptimizer::Create(options, n, execution));
    auto master = AlignedArray<float>(n, execution.huge_pages);
    auto grads = AlignedArray<uint16_t>(n, execution.huge_pages);
    auto out = AlignedArray<uint16_t>(n, execution.huge_pages);
    optimizer->FirstTouch(master.get(), n, sizeof(float));
    optimizer->FirstTouch(grads.get(), n, sizeof(uint16_t));
    optimizer->FirstTouch(out.get(), n, sizeof(uint16_t));
    uint16_t* lo = reinterpret_cast<uint16_t*>(master.get());  // split
    ze::ThreadPool pool(threads, execution.pin_threads);
    pool.ParallelFor(64, [&](int64_t part) {
      for (int64_t i = n * part / 64; i < n * (part + 1) / 64; ++i) {
        const float value = 0.01f * static_cast<float>(i % 1000 - 500);
        if (format.split_master) {
          const ze::Bf16Split split = ze::SplitForBf16(value);
          out[i] = split.hi;
          lo[i] = split.lo;
        } else {
          master[i] = value;
        }
        grads[i] = ze::FloatToBf16Bits(1e-3f * static_cast<float>(i % 77 - 38));
      }
    });
    ze::offload::StepArgs args;
    args.lr = 1e-4;
    const std::vector<CpuOptimizer::RawArray> state =
        optimizer->RawStateArrays();
    const int64_t tile = optimizer->tile_elements();
    ZE_ASSIGN_OR_RETURN(
        const Timing timing, TimeSteps(flags.steps, [&]() -> absl::Status {
          if (!format.split_master) {
            return optimizer->Step(master.get(), grads.get(), ze::DType::kBF16,
                                   args, out.get(), ze::DType::kBF16);
          }
          ZE_ASSIGN_OR_RETURN(const ze::offload::StepCoefficients c,
                              optimizer->Coefficients(args));
          optimizer->AdvanceStep();
          ze::offload::StepBuffers whole;
          whole.state0 = state[0].data;
          whole.state1 = state[1].data;
          if (state.size() > 2) {
            whole.step0 = reinterpret_cast<float*>(state[2].data);
            whole.step1 = reinterpret_cast<float*>(state[3].data);
          }
          whole.moment_format = optimizer->moment_format();
          whole.grads = grads.get();
          whole.grad_dtype = ze::DType::kBF16;
          whole.out = out.get();
          whole.out_dtype = ze::DType::kBF16;
          whole.master_lo = lo;
          whole.count = n;
          pool.ParallelFor((n + tile - 1) / tile, [&](int64_t t) {
            ze::offload::RunStepKernel(
                optimizer->simd_path(), c,
                ze::offload::SliceStepBuffers(whole, t * tile,
                                              std::min(tile, n - t * tile)));
          });
          return absl::OkStatus();
        }));
    const double params_per_s = n / timing.best_s;
    const double gbps = format.bytes * params_per_s / 1e9;
    std::printf(
        "{\"bench\":\"cpu_adam_formats\",\"optimizer\":\"adamw\","
        "\"format\":\"%s\",\"moments\":\"%s\",\"master\":\"%s\","
        "\"simd\":\"%s\",\"threads\":%d,\"params\":%lld,\"steps\":%d,"
        "\"bytes_per_param\":%.4g,\"best_s\":%.5f,\"mean_s\":%.5f,"
        "\"params_per_s\":%.4g,\"GBps\":%.1f,\"triad_GBps\":%.1f,"
        "\"bound_params_per_s\":%.4g,\"fraction_of_bound\":%.3f,"
        "\"best_triad_GBps\":%.1f,\"fraction_of_best_triad\":%.3f}\n",
        format.name, ze::offload::MomentFormatName(optimizer->moment_format()),
        format.split_master ? "16+16" : "f32",
        ze::offload::SimdPathName(optimizer->simd_path()), threads,
        static_cast<long long>(n), flags.steps, format.bytes, timing.best_s,
        timing.mean_s, params_per_s, gbps, triad, triad * 1e9 / format.bytes,
        gbps / triad, best_triad, gbps / best_triad);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status Run(const Flags& flags) {
  using ze::offload::CpuOptimizer;
  ze::offload::OptimizerOptions options;
  options.type = ze::offload::OptimizerType::kAdamW;
  options.weight_decay = 0.1;
  ze::offload::CpuExecutionOptions execution = flags.execution;
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
    const Bandwidth bandwidth =
        MeasureBandwidth(threads, triad_count, execution);
    triads.push_back(bandwidth.triad_gbps);
    best_triad = std::max(best_triad, triads.back());
    std::printf(
        "{\"bench\":\"bandwidth\",\"threads\":%d,\"elements\":%lld,"
        "\"read_GBps\":%.1f,\"copy_GBps\":%.1f,\"triad_GBps\":%.1f}\n",
        threads, static_cast<long long>(triad_count), bandwidth.read_gbps,
        bandwidth.copy_gbps, bandwidth.triad_gbps);
    std::fflush(stdout);
  }

  for (size_t run = 0; run < flags.threads.size(); ++run) {
    const int threads = flags.threads[run];
    const double triad = triads[run];
    execution.num_threads = threads;
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<CpuOptimizer> optimizer,
                        CpuOptimizer::Create(options, n, execution));
    ze::ThreadPool pool(threads);
    auto master = AlignedArray<float>(n, execution.huge_pages);
    auto grads = AlignedArray<uint16_t>(n, execution.huge_pages);
    auto out = AlignedArray<uint16_t>(n, execution.huge_pages);
    // Placed by the optimizer's own threads in its split, then filled.
    optimizer->FirstTouch(master.get(), n, sizeof(float));
    optimizer->FirstTouch(grads.get(), n, sizeof(uint16_t));
    optimizer->FirstTouch(out.get(), n, sizeof(uint16_t));
    pool.ParallelFor(64, [&](int64_t part) {
      for (int64_t i = n * part / 64; i < n * (part + 1) / 64; ++i) {
        master[i] = 0.01f * static_cast<float>(i % 1000 - 500);
        grads[i] = ze::FloatToBf16Bits(1e-3f * static_cast<float>(i % 77 - 38));
      }
    });
    ze::offload::StepArgs args;
    args.lr = 1e-4;
    ZE_ASSIGN_OR_RETURN(const Timing whole, TimeSteps(flags.steps, [&] {
                          return optimizer->Step(master.get(), grads.get(),
                                                 ze::DType::kBF16, args,
                                                 out.get(), ze::DType::kBF16);
                        }));
    const double best = whole.best_s;
    Timing per_chunk, stream, backup_memcpy, backup_streaming;
    const int64_t chunk = flags.chunk_elements;
    if (chunk > 0) {
      ZE_ASSIGN_OR_RETURN(
          per_chunk, TimeSteps(flags.steps, [&] {
            for (int64_t begin = 0; begin < n; begin += chunk) {
              ZE_RETURN_IF_ERROR(optimizer->StepRange(
                  begin, std::min(chunk, n - begin), master.get() + begin,
                  grads.get() + begin, ze::DType::kBF16, args,
                  out.get() + begin, ze::DType::kBF16));
            }
            return absl::OkStatus();
          }));
      // The ranges as one stream of tiles, as the engine's offloaded update
      // runs them; with a backup, speculation's copy of master, m and v is
      // taken tile by tile before each tile's update.
      enum class Backup { kNone, kMemcpy, kStreaming };
      auto backup = AlignedArray<float>(3 * n, execution.huge_pages);
      optimizer->FirstTouch(backup.get(), 3 * n, sizeof(float));
      const auto time_stream = [&](Backup mode) {
        return TimeSteps(flags.steps, [&] {
          int64_t begin = 0;
          return optimizer->StepRanges(
              args,
              [&](ze::offload::RangeToUpdate* range) -> absl::StatusOr<bool> {
                if (begin >= n) return false;
                const int64_t first = begin;
                range->state_offset = begin;
                range->count = std::min(chunk, n - begin);
                range->master_weights = master.get() + begin;
                range->grads = grads.get() + begin;
                range->grad_dtype = ze::DType::kBF16;
                range->out = out.get() + begin;
                range->out_dtype = ze::DType::kBF16;
                if (mode != Backup::kNone) {
                  range->before_update = [&, first, mode](int64_t at,
                                                          int64_t count) {
                    const int64_t i = first + at;
                    const size_t bytes = sizeof(float) * count;
                    const float* sources[3] = {master.get() + i,
                                               optimizer->exp_avg() + i,
                                               optimizer->exp_avg_sq() + i};
                    for (int k = 0; k < 3; ++k) {
                      float* to = backup.get() + k * n + i;
                      if (mode == Backup::kStreaming) {
                        ze::StreamingCopy(to, sources[k], bytes);
                      } else {
                        std::memcpy(to, sources[k], bytes);
                      }
                    }
                  };
                }
                begin += range->count;
                return true;
              },
              [](int64_t) { return absl::OkStatus(); });
        });
      };
      ZE_ASSIGN_OR_RETURN(stream, time_stream(Backup::kNone));
      ZE_ASSIGN_OR_RETURN(backup_memcpy, time_stream(Backup::kMemcpy));
      ZE_ASSIGN_OR_RETURN(backup_streaming, time_stream(Backup::kStreaming));
    }
    const double params_per_s = n / best;
    const double adam_gbps = 28.0 * n / best / 1e9;
    const char* simd = ze::offload::SimdPathName(optimizer->simd_path());
    // Freed before the traffic pass allocates the same amount again.
    optimizer.reset();
    master.reset();
    grads.reset();
    out.reset();
    ZE_ASSIGN_OR_RETURN(const Timing traffic,
                        MeasureStepTraffic(threads, n, flags.steps, execution));
    const double traffic_gbps =
        traffic.best_s > 0 ? 28.0 * n / traffic.best_s / 1e9 : 0.0;
    std::printf(
        "{\"bench\":\"cpu_adam\",\"optimizer\":\"adamw\",\"simd\":\"%s\","
        "\"threads\":%d,\"schedule\":\"%s\",\"pin\":%d,\"huge_pages\":%d,"
        "\"nt_out\":%d,\"prefetch_bytes\":%lld,\"params\":%lld,\"steps\":%d,"
        "\"best_s\":%.5f,"
        "\"mean_s\":%.5f,\"params_per_s\":%.4g,\"adam_GBps\":%.1f,"
        "\"triad_GBps\":%.1f,\"fraction_of_triad\":%.3f,"
        "\"best_triad_GBps\":%.1f,\"fraction_of_best_triad\":%.3f,"
        "\"step_traffic_GBps\":%.1f,\"step_traffic_mean_s\":%.5f,"
        "\"fraction_of_step_traffic\":%.3f,\"chunk_elements\":%lld,"
        "\"per_chunk_best_s\":%.5f,\"per_chunk_mean_s\":%.5f,"
        "\"stream_best_s\":%.5f,\"stream_mean_s\":%.5f,"
        "\"backup_memcpy_best_s\":%.5f,\"backup_streaming_best_s\":%.5f}\n",
        simd, threads, ScheduleName(execution.schedule),
        execution.pin_threads ? 1 : 0, execution.huge_pages ? 1 : 0,
        execution.nontemporal_out ? 1 : 0,
        static_cast<long long>(execution.prefetch_bytes),
        static_cast<long long>(n), flags.steps, best, whole.mean_s,
        params_per_s, adam_gbps, triad, adam_gbps / triad, best_triad,
        adam_gbps / best_triad, traffic_gbps, traffic.mean_s,
        traffic_gbps > 0 ? adam_gbps / traffic_gbps : 0.0,
        static_cast<long long>(chunk), per_chunk.best_s, per_chunk.mean_s,
        stream.best_s, stream.mean_s, backup_memcpy.best_s,
        backup_streaming.best_s);
    std::fflush(stdout);
    ZE_RETURN_IF_ERROR(
        RunStateFormats(flags, execution, threads, triad, best_triad));
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
    } else if (const char* v = value("schedule")) {
      const std::string schedule = v;
      if (schedule != "static" && schedule != "dynamic") {
        std::fprintf(stderr, "--schedule must be static or dynamic\n");
        return 2;
      }
      flags.execution.schedule = schedule == "static"
                                     ? ze::offload::CpuSchedule::kStaticSplit
                                     : ze::offload::CpuSchedule::kDynamicTiles;
    } else if (const char* v = value("pin")) {
      flags.execution.pin_threads = std::atoi(v) != 0;
    } else if (const char* v = value("huge_pages")) {
      flags.execution.huge_pages = std::atoi(v) != 0;
    } else if (const char* v = value("nt_out")) {
      flags.execution.nontemporal_out = std::atoi(v) != 0;
    } else if (const char* v = value("chunk_elements")) {
      flags.chunk_elements = static_cast<int64_t>(std::strtod(v, nullptr));
    } else if (const char* v = value("prefetch_bytes")) {
      flags.execution.prefetch_bytes = std::atoll(v);
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
  if (flags.chunk_elements < 0) {
    std::fprintf(stderr, "--chunk_elements must be >= 0\n");
    return 2;
  }
  const absl::Status status = Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "cpu_adam_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
