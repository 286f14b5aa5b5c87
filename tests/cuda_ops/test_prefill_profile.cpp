// FP8KV_PROFILE's parse (backend/common/profile.h), and the prefill
// profile's event bookkeeping (backend/cuda/prefill_profile.h):
// steps below the row threshold and skipped steps print nothing; a profiled
// step prints its span and one line per op class with the call count and,
// for classes with FLOPs, a TFLOP/s column; nested scopes are timed once by
// the outer one; the total is printed when the profile goes away.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "backend/common/profile.h"
#include "backend/cuda/check.h"
#include "backend/cuda/prefill_profile.h"
#include "cuda_ops_util.h"
#include "io/errors.h"

namespace fp8kv {
namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(CudaOps, ProfileConfigParse) {  // host only: runs without a GPU too
  EXPECT_EQ(parse_profile_config(""), ProfileConfig{});
  EXPECT_EQ(parse_profile_config("0"), ProfileConfig{});
  for (const char* all : {"1", "all"}) {
    const ProfileConfig c = parse_profile_config(all);
    EXPECT_TRUE(c.step && c.prefill && c.startup) << all;
    EXPECT_EQ(c.step_op_step, 20);
    EXPECT_EQ(c.prefill_min_rows, 64);
  }
  const ProfileConfig c = parse_profile_config("step=5,startup");
  EXPECT_TRUE(c.step && c.startup && !c.prefill);
  EXPECT_EQ(c.step_op_step, 5);
  const ProfileConfig p = parse_profile_config("prefill=128,");
  EXPECT_TRUE(p.prefill && !p.step && !p.startup);
  EXPECT_EQ(p.prefill_min_rows, 128);
  for (const char* bad : {"steps", "step=0", "step=x", "prefill=", "startup=1", "2", "step=-3"}) {
    try {
      (void)parse_profile_config(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("FP8KV_PROFILE"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaOps, PrefillProfileCountsOpsPerStep) {
  FP8KV_NEED_GPU();
  cudaStream_t st;
  FP8KV_CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  void* buf = nullptr;
  FP8KV_CU(cudaMalloc(&buf, 1 << 20));
  std::string out;
  {
    cuda::PrefillProfile p(100, /*skip=*/1, /*max_steps=*/2);
    ::testing::internal::CaptureStderr();
    // Step 0: below the threshold. Step 1: skipped. Steps 2, 3: profiled. Step 4: past max_steps.
    for (int T : {50, 200, 300, 400, 500}) {
      p.begin_step(T, 1, 0, st, /*capturing=*/false);
      EXPECT_EQ(p.active(), T == 300 || T == 400) << T;
      for (int i = 0; i < 3; ++i) {
        cuda::PrefillProfile::Scope g(&p, "gemm N=8 K=8", 1e9);
        cuda::PrefillProfile::Scope inner(&p, "inner");  // nested: not a class of its own
        FP8KV_CU(cudaMemsetAsync(buf, 0, 1 << 20, st));
      }
      cuda::PrefillProfile::Scope n(&p, "rmsnorm");
      FP8KV_CU(cudaMemsetAsync(buf, 1, 1 << 20, st));
    }
    p.begin_step(1, 1, 1, st, false);  // flushes step 3 (T = 400); T = 500 was not profiled
  }
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(out, "step T="), 2) << out;
  EXPECT_EQ(count(out, "step T=300 "), 1) << out;
  EXPECT_EQ(count(out, "step T=400 "), 1) << out;
  EXPECT_EQ(count(out, "total"), 1) << out;
  EXPECT_EQ(count(out, "inner"), 0) << out;
  EXPECT_EQ(count(out, "gemm N=8 K=8"), 3) << out;  // two steps + the total
  EXPECT_EQ(count(out, "    3 calls"), 2) << out;  // gemm per step
  EXPECT_EQ(count(out, "    6 calls"), 1) << out;  // gemm in the total
  EXPECT_EQ(count(out, "TFLOP/s"), 3) << out;
  FP8KV_CU(cudaFree(buf));
  FP8KV_CU(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace fp8kv
