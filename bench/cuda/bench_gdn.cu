// The Gated DeltaNet delta rule (backend/cuda/gdn/gdn.h cuda::gdn_rule) at
// the Qwen3.5-27B linear-attention shape (Hk 16, Hv 48, Dk = Dv = 128, one
// layer): prefill of 1 x 1024, 1 x 8192 and 4 x 2048 tokens in the
// recurrent form (every row: GdnRuleOptions::recurrent_only, the kernel
// prefill ran before the chunked one) against the chunked form (gdn_rule's
// own choice, split from gdn_chunk_plan, then every other split the plan
// considers, to check its choice), and a batch-64 decode step for
// the recurrent kernel's state bandwidth. Each prefill continues a sequence
// at position 64, so both forms read and write the state once.
// Prints one line per case: median time per call (CUDA events, 3 warm-ups,
// median of 5 batches), tokens per second, the state bytes read + written
// per second beside the device copy bandwidth, and the chunked speed-up.
//   bench_gdn [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/copy_bandwidth.h"
#include "backend/cuda/gdn/gdn.h"
#include "backend/cuda/ops/ops.h"
#include "bench_util.h"

using namespace fp8kv;

namespace {

// Uniform values in [lo, hi) from a hash of the index.
__global__ void fill_kernel(float* p, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    x *= 3266489917u;
    x ^= x >> 16;
    p[i] = lo + (hi - lo) * static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
  }
}
void fill(cuda::DeviceBuffer& b, uint32_t seed, float lo, float hi) {
  fill_kernel<<<1024, 256>>>(b.as<float>(), b.bytes() / 4, seed, lo, hi);
  FP8KV_CU(cudaGetLastError());
}

struct Case {
  int seqs, rows;  // sequences x rows each
};

}  // namespace

int main(int argc, char** argv) {
  const char* json = bench::json_flag(argc, argv);
  if (bench::no_device("bench_gdn")) return 0;
  const cuda::GdnDims d{16, 48, 128, 128, 4};
  const int64_t C = d.conv_dim(), VD = d.value_dim(), Hv = d.num_v_heads;
  const Case cases[] = {{64, 1}, {1, 1024}, {1, 8192}, {4, 2048}};
  int max_T = 0, max_S = 0;
  for (const Case& c : cases) {
    max_T = std::max(max_T, c.seqs * c.rows);
    max_S = std::max(max_S, c.seqs);
  }
  const double copy = cuda::d2d_copy_bytes_per_s();
  const size_t state_bytes = static_cast<size_t>(Hv) * d.k_head_dim * d.v_head_dim * 4;  // one sequence
  cuda::DeviceBuffer qkv(static_cast<size_t>(max_T) * C * 4), a(static_cast<size_t>(max_T) * Hv * 4),
      b(static_cast<size_t>(max_T) * Hv * 4), A_log(Hv * 4), dt(Hv * 4), pool(max_S * state_bytes),
      out(static_cast<size_t>(max_T) * VD * 4), scratch(cuda::gdn_rule_scratch_bytes(d, max_T));
  fill(qkv, 1, -1.0f, 1.0f);  // conv outputs (q and k are normalized in the kernels)
  fill(a, 2, -2.0f, 2.0f);
  fill(b, 3, -2.0f, 2.0f);
  fill(A_log, 4, -3.0f, 1.0f);
  fill(dt, 5, -0.5f, 0.5f);
  fill(pool, 6, -0.3f, 0.3f);
  int dev = 0, sms = 0, max_smem = 0;
  FP8KV_CU(cudaGetDevice(&dev));
  FP8KV_CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  FP8KV_CU(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const bench::Timing tm(cudaStreamDefault);
  cudaStream_t st = tm.st;
  std::printf("Qwen3.5-27B delta rule (Hk 16, Hv 48, Dk = Dv = 128), one layer; copy bandwidth %.0f GB/s\n",
              copy / 1e9);
  std::printf("%-10s %5s %6s %-9s %5s %11s %12s %9s %7s\n", "case", "seqs", "rows", "form", "split", "us", "tok/s",
              "state GB/s", "/copy");
  bench::JsonReport report(json);
  report.head("{\"copy_gbps\": %.1f, \"cases\": [\n", copy / 1e9);
  for (const Case& c : cases) {
    const int T = c.seqs * c.rows;
    std::vector<int32_t> qs(c.seqs + 1), ctx(c.seqs), slots(c.seqs);
    for (int s = 0; s < c.seqs; ++s) {
      qs[s + 1] = qs[s] + c.rows;
      ctx[s] = 64 + c.rows;  // a continuing sequence: the state is read and written
      slots[s] = s;
    }
    cuda::DeviceBuffer dqs(qs.size() * 4), dctx(ctx.size() * 4), dsl(slots.size() * 4);
    FP8KV_CU(cudaMemcpy(dqs.get(), qs.data(), qs.size() * 4, cudaMemcpyHostToDevice));
    FP8KV_CU(cudaMemcpy(dctx.get(), ctx.data(), ctx.size() * 4, cudaMemcpyHostToDevice));
    FP8KV_CU(cudaMemcpy(dsl.get(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    const cuda::GdnSeqs seqs{c.seqs, dqs.as<int32_t>(), dctx.as<int32_t>(), dsl.as<int32_t>(), c.rows,
                             c.rows == 1 ? c.seqs : 0, T};
    const cuda::GdnChunkPlan plan = cuda::gdn_chunk_plan(d, c.seqs, sms, static_cast<size_t>(max_smem));
    // Runs: the recurrent form (split 0), the planned split, the other splits.
    std::vector<int> runs = {0};
    if (c.rows > 1 && plan.ok()) {  // decode: the recurrent kernel only
      runs.push_back(plan.split);
      for (const int sp : {1, 2, 4, 8})
        if (sp != plan.split && d.v_head_dim / sp >= 32 &&
            cuda::gdn_chunk_plan_at(d, sp, static_cast<size_t>(max_smem)).ok())
          runs.push_back(sp);
    }
    double rec_us = 0;
    for (size_t ri = 0; ri < runs.size(); ++ri) {
      const bool chunked = runs[ri] > 0;
      cuda::GdnRuleOptions o;
      o.recurrent_only = !chunked;
      o.chunk_split = runs[ri];
      auto run = [&] {
        cuda::gdn_rule(d, seqs, qkv.as<float>(), a.as<float>(), b.as<float>(), A_log.as<float>(), dt.as<float>(),
                       pool.get(), /*state_bf16=*/false, out.as<float>(), scratch.get(), scratch.bytes(), st, o);
      };
      const int reps = T >= 8192 ? 2 : T >= 1024 ? 5 : 50;
      const double us = bench::median_call_us(st, tm.e0, tm.e1, reps, run);
      const double gbps = 2.0 * state_bytes * c.seqs / (us * 1e-6) / 1e9;
      const char* name = c.rows == 1 ? "decode" : "prefill";
      const int split = runs[ri];
      const char* planned = ri == 1 ? ", planned" : "";
      std::printf("%-10s %5d %6d %-9s %5d %11.1f %12.0f %9.1f %7.3f", name, c.seqs, c.rows,
                  chunked ? "chunked" : "recurrent", split, us, T / (us * 1e-6), gbps, gbps * 1e9 / copy);
      if (chunked)
        std::printf("  %.2fx the recurrent form%s\n", rec_us / us, planned);
      else
        std::printf("\n");
      if (!chunked) rec_us = us;
      report.add("{\"case\": \"%s\", \"seqs\": %d, \"rows\": %d, \"form\": \"%s\", \"split\": %d, "
                 "\"planned\": %s, \"us\": %.2f, \"tok_per_s\": %.0f, \"state_gbps\": %.2f}",
                 name, c.seqs, c.rows, chunked ? "chunked" : "recurrent", split, ri == 1 ? "true" : "false", us,
                 T / (us * 1e-6), gbps);
    }
  }
  return 0;
}
