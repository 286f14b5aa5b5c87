// Exhaustive check of the per-token-head store's division-free scale
// (src/backend/cuda/attention/store.cu, pth_scale): for every finite float
// amax >= 0 and M = 448 (e4m3) and 127 (int8), the quotient by RN(1 / M)
// corrected twice with the FMA residual, floored at FLT_MIN, equals
// max(amax / M, FLT_MIN) by IEEE division. Host floats here follow the same
// IEEE single rules as the device's __fmul_rn / __fmaf_rn (no flush to zero).
//   g++ -O2 -march=native -ffp-contract=off tools/check_pth_scale_division.cpp -o /tmp/chk_pth && /tmp/chk_pth
// (about 10 s; exit 0 when no amax differs).
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

int main() {
  int failures = 0;
  for (const float M : {448.0f, 127.0f}) {
    volatile float Mv = M;  // an IEEE division at run time, not folded
    const float r = 1.0f / Mv;
    const float kR = M == 448.0f ? 0x1.24924ap-9f : 0x1.020408p-7f;  // the kernel's constant
    if (r != kR) {
      std::printf("M %g: RN(1/M) is %a, the kernel uses %a\n", M, r, kR);
      ++failures;
    }
    uint64_t bad = 0;
    for (uint32_t u = 0; u < 0x7f800000u; ++u) {
      float a;
      std::memcpy(&a, &u, 4);
      const float q0 = a * kR;
      const float q1 = std::fmaf(std::fmaf(-q0, M, a), kR, q0);
      const float s = std::fmax(std::fmaf(std::fmaf(-q1, M, a), kR, q1), FLT_MIN);
      const float ref = std::fmax(a / Mv, FLT_MIN);
      if (s != ref && bad++ < 5) std::printf("M %g amax %a: %a, IEEE %a\n", M, a, s, ref);
    }
    std::printf("M %g: %llu of %u finite amax differ\n", M, static_cast<unsigned long long>(bad), 0x7f800000u);
    failures += bad != 0;
  }
  return failures ? 1 : 0;
}
