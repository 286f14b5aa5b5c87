// The prefill plan table (backend/cuda/attention/prefill_plan.h), host only:
// exactly one row per (head_dim, cache dtype) case that paged_prefill
// accepts, the wgmma kernel only where it is built (head_dim 128), and a
// reason on every row.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/attention/prefill_plan.h"

namespace fp8kv::cudatest {
namespace {

TEST(CudaPrefillPlan, OneRowPerCase) {
  for (int D : {64, 128, 256})
    for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2}) {
      int rows = 0;
      for (const cuda::PrefillPlanRow& r : cuda::kPrefillPlan) rows += r.head_dim == D && r.dtype == dt;
      EXPECT_EQ(rows, 1) << "head_dim " << D << " " << kv_dtype_name(dt);
      const cuda::PrefillPlanRow& r = cuda::prefill_plan(D, dt);
      EXPECT_EQ(r.head_dim, D);
      EXPECT_EQ(r.dtype, dt);
      EXPECT_TRUE(r.why != nullptr && std::string(r.why).size() > 10) << "head_dim " << D << ": no reason given";
      if (r.path == cuda::PrefillPath::wgmma_ws) {
        EXPECT_EQ(D, 128) << "the wgmma kernel is head_dim 128 only";
      }
    }
  EXPECT_EQ(std::size(cuda::kPrefillPlan), 9u);
}

TEST(CudaPrefillPlan, HeadDim128RunsWgmma) {
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2})
    EXPECT_EQ(cuda::prefill_plan(128, dt).path, cuda::PrefillPath::wgmma_ws) << kv_dtype_name(dt);
}

TEST(CudaPrefillPlan, UnknownCaseThrows) {
  EXPECT_THROW(cuda::prefill_plan(96, KvDtype::bf16), std::invalid_argument);
}

}  // namespace
}  // namespace fp8kv::cudatest
