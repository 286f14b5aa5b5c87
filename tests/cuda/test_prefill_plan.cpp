// The prefill plan table (backend/cuda/attention/prefill_plan.h), host only:
// exactly one row per (head_dim, cache dtype) case that paged_prefill
// accepts, the wgmma kernel only where it is built (head_dim 128 and 256), and a
// reason on every row. And the decode plan's rows per case.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/attention/decode_plan.h"
#include "backend/cuda/attention/prefill_plan.h"

namespace fp8kv::cudatest {
namespace {

const KvDtype kAllDtypes[] = {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2, KvDtype::fp8_e4m3_pth,
                               KvDtype::int8_pth};

TEST(CudaPrefillPlan, OneRowPerCase) {
  for (int D : {64, 128, 256})
    for (KvDtype dt : kAllDtypes) {
      int rows = 0;
      for (const cuda::PrefillPlanRow& r : cuda::kPrefillPlan) rows += r.head_dim == D && r.dtype == dt;
      EXPECT_EQ(rows, 1) << "head_dim " << D << " " << kv_dtype_name(dt);
      const cuda::PrefillPlanRow& r = cuda::prefill_plan(D, dt);
      EXPECT_EQ(r.head_dim, D);
      EXPECT_EQ(r.dtype, dt);
      EXPECT_TRUE(r.why != nullptr && std::string(r.why).size() > 10) << "head_dim " << D << ": no reason given";
      if (r.path == cuda::PrefillPath::wgmma_ws) {
        EXPECT_TRUE(D == 128 || D == 256) << "the wgmma kernel is head_dim 128 and 256 only";
      }
    }
  EXPECT_EQ(std::size(cuda::kPrefillPlan), 15u);
}

TEST(CudaPrefillPlan, HeadDim128And256RunWgmma) {
  for (int D : {128, 256})
    for (KvDtype dt : kAllDtypes)
      EXPECT_EQ(cuda::prefill_plan(D, dt).path, cuda::PrefillPath::wgmma_ws) << D << " " << kv_dtype_name(dt);
  for (KvDtype dt : kAllDtypes) EXPECT_EQ(cuda::prefill_plan(64, dt).path, cuda::PrefillPath::mma) << kv_dtype_name(dt);
}

// The decode plan table (decode_plan.h): one row per case; the per-token-head
// rows run fp8 e4m3's kernels (the same loops plus the scale loads).
TEST(CudaDecodePlan, OneRowPerCasePerTokenHeadAsE4m3) {
  for (int D : {64, 128, 256}) {
    for (KvDtype dt : kAllDtypes) {
      int rows = 0;
      for (const cuda::decode::DecodePlanRow& r : cuda::decode::kDecodePlan) rows += r.head_dim == D && r.dtype == dt;
      EXPECT_EQ(rows, 1) << "head_dim " << D << " " << kv_dtype_name(dt);
    }
    const auto& e4m3 = cuda::decode::kDecodePlan[cuda::decode::decode_plan_row(D, KvDtype::fp8_e4m3)];
    for (KvDtype dt : {KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
      const auto& r = cuda::decode::kDecodePlan[cuda::decode::decode_plan_row(D, dt)];
      EXPECT_TRUE(r.kernel == e4m3.kernel && r.wide == e4m3.wide) << "head_dim " << D << " " << kv_dtype_name(dt);
    }
  }
}

TEST(CudaPrefillPlan, UnknownCaseThrows) {
  EXPECT_THROW(cuda::prefill_plan(96, KvDtype::bf16), std::invalid_argument);
}

}  // namespace
}  // namespace fp8kv::cudatest
