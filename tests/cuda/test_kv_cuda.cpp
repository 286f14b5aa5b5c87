// CUDA store / decode / prefill vs the CPU reference (backend/cpu/kv_ops).
// Fresh random inputs every run (seed printed; FP8KV_SEED replays one).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <span>
#include <string>
#include <thread>

#include "cuda_test_util.h"

namespace fp8kv::cudatest {
namespace {

const KvDtype kDtypes[] = {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2};
// Per-token-head dtypes: their tests are the *PerTokenHead* ones (the same cases).
const KvDtype kPthDtypes[] = {KvDtype::fp8_e4m3_pth, KvDtype::int8_pth};
using Dtypes = std::span<const KvDtype>;

// ---- store ---------------------------------------------------------------

// n random bytes (a cache's prior contents).
std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// The store of T tokens of k / v (f32, or bf16 bits) into the caches at slots.
cuda::StoreKvArgs store_args(const KvCacheLayout& L, const DevBuf& k_cache, const DevBuf& v_cache, const DevBuf& k,
                             const DevBuf& v, bool bf16_in, const DevBuf& slots, int T) {
  cuda::StoreKvArgs a;
  a.layout = L;
  a.k_cache = k_cache.get(); a.v_cache = v_cache.get();
  a.k = k.get(); a.v = v.get();
  a.input_dtype = bf16_in ? cuda::ActDtype::bf16 : cuda::ActDtype::f32;
  a.slot_mapping = slots.as<int64_t>();
  a.num_tokens = T;
  return a;
}

TEST(CudaStore, BitExactWithCpuIncludingSpecialValues) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng = seeded_rng();
  for (KvDtype dt : kDtypes)
    for (int D : {64, 128, 256})
      for (bool bf16_in : {false, true})
        for (ScaleMode mode : {ScaleMode::unity, ScaleMode::per_tensor, ScaleMode::per_head}) {
          KvCacheLayout L{.num_blocks = 9, .block_size = 16, .num_kv_heads = 3, .head_dim = D, .dtype = dt};
          const int T = 100;
          const int64_t row = static_cast<int64_t>(L.num_kv_heads) * D;
          std::normal_distribution<float> nd(0.0f, 1.0f);
          std::uniform_int_distribution<int> pick(0, 40);
          std::vector<float> k(T * row), v(T * row);
          const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 1e30f, -1e30f, 1e-30f, -1e-30f,
                                    0.0f, -0.0f, 448.0f, 464.0f, 57344.0f, 61440.0f, 1e-3f, 2e-3f};
          for (int64_t i = 0; i < T * row; ++i) {
            const int r = pick(rng);
            k[i] = r < 16 ? specials[r] : nd(rng) * std::ldexp(1.0f, pick(rng) % 24 - 12);
            v[i] = nd(rng) * std::ldexp(1.0f, pick(rng) % 20 - 10);
            if (bf16_in) { k[i] = round_bf16(k[i]); v[i] = round_bf16(v[i]); }
          }
          const std::vector<int64_t> slots = random_slots(rng, L, T);
          std::vector<float> ks{1.0f}, vs{1.0f};
          std::uniform_real_distribution<float> ud(0.01f, 3.0f);
          if (mode == ScaleMode::per_tensor) { ks = {ud(rng)}; vs = {ud(rng)}; }
          if (mode == ScaleMode::per_head) {
            ks.clear(); vs.clear();
            for (int h = 0; h < L.num_kv_heads; ++h) { ks.push_back(ud(rng)); vs.push_back(ud(rng)); }
          }
          std::vector<uint8_t> kc = random_bytes(rng, L.cache_bytes()), vc = random_bytes(rng, L.cache_bytes());
          DevBuf dkc(kc), dvc(vc), dslots(slots), dks(ks), dvs(vs);
          KvClipCounts cpu_clips;
          store_kv_cpu(L, kc.data(), vc.data(), k.data(), v.data(), slots.data(), T,
                       ScaleRef{ks.data(), static_cast<int>(ks.size())}, ScaleRef{vs.data(), static_cast<int>(vs.size())},
                       nullptr, nullptr, &cpu_clips);
          DevBuf dclips(std::vector<unsigned long long>{0, 0});
          DevBuf dk, dv;
          upload_inputs(k, v, bf16_in, dk, dv);
          std::vector<float> zeros_k(L.num_kv_heads, 0.0f);
          DevBuf kmax(zeros_k), vmax(zeros_k);
          cuda::StoreKvArgs a = store_args(L, dkc, dvc, dk, dv, bf16_in, dslots, T);
          a.k_scale = {dks.as<float>(), static_cast<int>(ks.size())};
          a.v_scale = {dvs.as<float>(), static_cast<int>(vs.size())};
          a.k_absmax = kmax.as<float>();
          a.v_absmax = vmax.as<float>();
          a.clips = dclips.as<unsigned long long>();
          cuda::store_kv(a, nullptr);
          const auto gk = dkc.download<uint8_t>(), gv = dvc.download<uint8_t>();
          // The clip counter (docs/robustness.md "KV clipping") counts what the CPU
          // store counts, with the bytes (below) unchanged; bf16 counts nothing.
          const auto gc = dclips.download<unsigned long long>();
          EXPECT_EQ(gc[0], cpu_clips.k) << kv_dtype_name(dt) << " D=" << D << " mode=" << int(mode);
          EXPECT_EQ(gc[1], cpu_clips.v) << kv_dtype_name(dt) << " D=" << D << " mode=" << int(mode);
          if (dt != KvDtype::bf16) {
            EXPECT_GT(cpu_clips.k, 0u);  // the specials include inf and 1e30
          }
          size_t bad = 0, first_bad = 0;
          for (size_t i = 0; i < kc.size(); ++i)
            if (gk[i] != kc[i] || gv[i] != vc[i]) { if (!bad) first_bad = i; ++bad; }
          EXPECT_EQ(bad, 0u) << kv_dtype_name(dt) << " D=" << D << " bf16_in=" << bf16_in << " mode=" << int(mode)
                             << " first mismatch at byte " << first_bad << ": gpu k " << int(gk[first_bad])
                             << " cpu k " << int(kc[first_bad]);
          // Observation: absmax over all tokens (NaN ignored, inf counts).
          const auto gkm = kmax.download<float>(), gvm = vmax.download<float>();
          for (int h = 0; h < L.num_kv_heads; ++h) {
            float ek = 0, ev = 0;
            for (int t = 0; t < T; ++t)
              for (int d = 0; d < D; ++d) {
                const float xk = std::fabs(k[t * row + h * D + d]), xv = std::fabs(v[t * row + h * D + d]);
                if (!std::isnan(xk)) ek = std::max(ek, xk);
                if (!std::isnan(xv)) ev = std::max(ev, xv);
              }
            EXPECT_EQ(gkm[h], ek);
            EXPECT_EQ(gvm[h], ev);
          }
        }
}

// Per-token-head store: cache bytes and scales bitwise the CPU store's for
// rows of zeros, of denormals, with an inf or a NaN, of tiny values (scales
// below 2^-92: the IEEE division path) and of normal values from 2^-60 to
// 2^100; skipped slots; the round trip of every finite row within half a code
// step (int8: s / 2; e4m3: 2^-4 relative, s 2^-10 among its subnormals).
TEST(CudaStore, PerTokenHeadBitExactWithCpuAndRoundTrips) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng = seeded_rng();
  for (KvDtype dt : kPthDtypes)
    for (int D : {64, 128, 256})
      for (bool bf16_in : {false, true}) {
        KvCacheLayout L{.num_blocks = 9, .block_size = 16, .num_kv_heads = 3, .head_dim = D, .dtype = dt};
        const int T = 100, H = L.num_kv_heads;
        const int64_t row = static_cast<int64_t>(H) * D;
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::uniform_int_distribution<int> pick(0, 15), expo(-60, 100), pos(0, D - 1);
        std::vector<float> k(T * row), v(T * row);
        std::vector<int> kind(static_cast<size_t>(T) * H * 2);  // [t][h][k|v]
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < H; ++h)
            for (int st = 0; st < 2; ++st) {
              float* x = (st ? v.data() : k.data()) + t * row + h * D;
              const int r = pick(rng), e = expo(rng);
              kind[(t * H + h) * 2 + st] = r;
              for (int d = 0; d < D; ++d) {
                const float g = nd(rng);
                x[d] = r == 0 ? 0.0f : r == 1 ? g * 1e-40f : r == 2 ? g * 0x1p-110f : g * std::ldexp(1.0f, e);
                if (bf16_in) x[d] = round_bf16(x[d]);
              }
              if (r == 3) x[pos(rng)] = (pos(rng) & 1) ? INFINITY : -INFINITY;
              if (r == 4) x[pos(rng)] = NAN;
            }
        const std::vector<int64_t> slots = random_slots(rng, L, T);
        std::vector<uint8_t> kc = random_bytes(rng, L.cache_bytes()), vc = random_bytes(rng, L.cache_bytes());
        const size_t ns = static_cast<size_t>(L.num_blocks) * L.block_size * H;
        std::vector<float> ksp(ns, NAN), vsp(ns, NAN), one{1.0f};
        DevBuf dkc(kc), dvc(vc), dslots(slots), dksp(ksp), dvsp(vsp), done(one);
        store_kv_cpu(L, kc.data(), vc.data(), k.data(), v.data(), slots.data(), T, ScaleRef{one.data(), 1},
                     ScaleRef{one.data(), 1}, ksp.data(), vsp.data());
        DevBuf dk, dv;
        upload_inputs(k, v, bf16_in, dk, dv);
        cuda::StoreKvArgs a = store_args(L, dkc, dvc, dk, dv, bf16_in, dslots, T);
        a.k_scale_pth = dksp.as<float>();
        a.v_scale_pth = dvsp.as<float>();
        cuda::store_kv(a, nullptr);
        const auto gk = dkc.download<uint8_t>(), gv = dvc.download<uint8_t>();
        const auto gks = dksp.download<float>(), gvs = dvsp.download<float>();
        size_t bad = 0, first_bad = 0;
        for (size_t i = 0; i < kc.size(); ++i)
          if (gk[i] != kc[i] || gv[i] != vc[i]) { if (!bad) first_bad = i; ++bad; }
        EXPECT_EQ(bad, 0u) << kv_dtype_name(dt) << " D=" << D << " bf16_in=" << bf16_in << " first mismatch at byte "
                           << first_bad << ": gpu k " << int(gk[first_bad]) << " cpu k " << int(kc[first_bad]);
        EXPECT_EQ(0, std::memcmp(gks.data(), ksp.data(), ns * 4)) << kv_dtype_name(dt) << " D=" << D << ": K scales";
        EXPECT_EQ(0, std::memcmp(gvs.data(), vsp.data(), ns * 4)) << kv_dtype_name(dt) << " D=" << D << ": V scales";
        // Round trip of the finite rows (CPU bytes = GPU bytes when the above pass).
        for (int t = 0; t < T; ++t) {
          if (slots[t] < 0) continue;
          for (int h = 0; h < H; ++h)
            for (int st = 0; st < 2; ++st) {
              if (kind[(t * H + h) * 2 + st] >= 3) continue;  // inf / NaN rows
              const float sc = (st ? vsp : ksp)[L.scale_offset(slots[t], h)];
              ASSERT_TRUE(sc >= FLT_MIN && std::isfinite(sc)) << "scale " << sc;
              const float* x = (st ? v.data() : k.data()) + t * row + h * D;
              const uint8_t* c = (st ? vc.data() : kc.data()) + L.slot_offset(slots[t], h);
              for (int d = 0; d < D; ++d) {
                const double deq = static_cast<double>(kv_byte_to_f32(c[d], dt)) * sc;
                // int8: half a step, plus the f32 quotient x / s's one rounding
                // (relative 2^-24) that can carry a value across the tie.
                const double tol = dt == KvDtype::int8_pth ? 0.5 * sc + std::fabs(x[d]) * 0x1p-24
                                                           : std::max(std::fabs(x[d]) * 0x1p-4, sc * 0x1p-10);
                ASSERT_LE(std::fabs(deq - x[d]), tol * (1 + 0x1p-20))
                    << kv_dtype_name(dt) << " D=" << D << " t=" << t << " h=" << h << " d=" << d << " x=" << x[d]
                    << " s=" << sc;
              }
            }
        }
      }
}

// ---- decode --------------------------------------------------------------

struct DecodeCase {
  KvDtype dt;
  int D, group, num_kv_heads, block_size, window;
  ScaleMode mode;
  float softcap;
};

std::vector<int> mixed_lengths(std::mt19937_64& rng, int block_size, int window) {
  std::vector<int> c = {1, block_size - 1, block_size, block_size + 1, 5 * block_size + 7};
  std::uniform_int_distribution<int> u(1, 1300);
  c.push_back(u(rng));
  c.push_back(u(rng));
  if (window > 0) { c.push_back(window); c.push_back(window + 1); c.push_back(window + block_size + 3); }
  std::shuffle(c.begin(), c.end(), rng);
  return c;
}

// Returns max |err| / tol over the batch (<= 1 passes).
// out_copy: receives the batched output. graph_replays > 0: the launch is
// also captured into a CUDA graph and replayed that many times, each replay
// bitwise equal to the direct launch.
double run_decode_case(std::mt19937_64& rng, const DecodeCase& c, int split_tokens_override, bool check_single,
                       const std::vector<int>& lengths = {}, std::vector<float>* out_copy = nullptr,
                       int graph_replays = 0) {
  const std::vector<int> ctx = lengths.empty() ? mixed_lengths(rng, c.block_size, c.window) : lengths;
  Scenario s = make_scenario(rng, c.D, c.num_kv_heads, c.block_size, c.dt, c.mode, ctx);
  EXPECT_TRUE(s.store_matches()) << "CUDA store bytes (or per-token-head scales) differ from the CPU store's";
  const int B = s.batch(), H = c.num_kv_heads * c.group, D = c.D;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(B) * H * D);
  for (auto& x : q) x = nd(rng);
  const float sm = 1.0f / std::sqrt(static_cast<float>(D));
  int maxc = 0;
  for (int x : ctx) maxc = std::max(maxc, x);
  DevBuf dq(q), dout(q.size() * sizeof(float));
  dout.fill(0xff);  // NaN poison
  cuda::DecodeArgs a;
  a.kv = s.paged();
  a.batch = B;
  a.num_heads = H;
  a.max_context_len = maxc;
  a.window = c.window;
  a.softmax_scale = sm;
  a.logit_softcap = c.softcap;
  a.q = dq.get();
  a.out = dout.get();
  a.plan = cuda::plan_decode(B, H, c.num_kv_heads, D, maxc, c.window, cuda::device_sm_count(), split_tokens_override,
                             /*ctas_per_sm=*/0, c.dt);
  DevBuf ws(std::max<size_t>(a.plan.workspace_bytes, 4));
  a.workspace = ws.get();
  cuda::paged_decode(a, nullptr);
  const auto out = dout.download<float>();
  if (out_copy) *out_copy = out;
  {
    // FNV-1a of the output bytes, one line per launch: with FP8KV_SEED fixed,
    // these lines compare outputs between builds (bitwise the same kernels'
    // outputs hash the same).
    uint64_t h = 1469598103934665603ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(out.data());
    for (size_t i = 0; i < out.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    // plan= the split size used: a kernel with another occupancy gets other
    // auto plans, which round differently.
    std::printf("decode-hash %s D=%d group=%d hkv=%d bs=%d window=%d split=%d plan=%d B=%d %016llx\n",
                std::string(kv_dtype_name(c.dt)).c_str(), D, c.group, c.num_kv_heads, c.block_size, c.window,
                split_tokens_override, a.plan.split_tokens, B, static_cast<unsigned long long>(h));
  }
  if (graph_replays > 0) {
    cudaStream_t st;
    EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    EXPECT_EQ(cudaSuccess, cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    cuda::paged_decode(a, st);
    EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(st, &g));
    EXPECT_EQ(cudaSuccess, cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < graph_replays; ++i) {
      dout.fill(0xff);
      EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());  // the memset (legacy stream) before the replay
      EXPECT_EQ(cudaSuccess, cudaGraphLaunch(ge, st));
      EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(st));
      const auto o = dout.download<float>();
      EXPECT_EQ(0, std::memcmp(o.data(), out.data(), o.size() * sizeof(float))) << "graph replay " << i << " differs";
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);
  }
  double worst = 0;
  std::vector<float> ref(static_cast<size_t>(H) * D);
  for (int b = 0; b < B; ++b) {
    PagedAttentionArgs ca = s.cpu_args(b);
    ca.window = c.window;
    ca.softmax_scale = sm;
    ca.logit_softcap = c.softcap;
    const int32_t pos = ctx[b] - 1;
    paged_attention_cpu(ca, q.data() + static_cast<size_t>(b) * H * D, &pos, 1, H, ref.data());
    for (int h = 0; h < H; ++h) {
      const double tol = attention_bound(s, b, q.data() + (static_cast<size_t>(b) * H + h) * D, h / c.group, pos,
                                         c.window, sm, c.softcap);
      for (int d = 0; d < D; ++d) {
        const float g = out[(static_cast<size_t>(b) * H + h) * D + d], r = ref[h * D + d];
        if (!std::isfinite(g)) { ADD_FAILURE() << "non-finite output b=" << b << " h=" << h << " d=" << d; return 1e9; }
        const double e = std::fabs(g - r) / tol;
        if (e > 1.0) {
          ADD_FAILURE() << kv_dtype_name(c.dt) << " D=" << D << " group=" << c.group << " bs=" << c.block_size
                        << " window=" << c.window << " ctx=" << ctx[b] << " b=" << b << " h=" << h << " d=" << d
                        << " gpu " << g << " cpu " << r << " tol " << tol;
          return e;
        }
        worst = std::max(worst, e);
      }
    }
  }
  if (check_single) {
    // Each sequence alone, same plan: bitwise equal to its row of the batch.
    for (int b = 0; b < B; ++b) {
      std::vector<float> q1(q.begin() + static_cast<size_t>(b) * H * D, q.begin() + static_cast<size_t>(b + 1) * H * D);
      std::vector<int32_t> bt1(s.block_tables.begin() + b * s.max_blocks, s.block_tables.begin() + (b + 1) * s.max_blocks);
      std::vector<int32_t> c1 = {ctx[b]};
      DevBuf dq1(q1), dbt1(bt1), dc1(c1), do1(q1.size() * sizeof(float));
      do1.fill(0xff);
      cuda::DecodeArgs a1 = a;
      a1.kv.block_tables = dbt1.as<int32_t>();
      a1.kv.context_lens = dc1.as<int32_t>();
      a1.batch = 1;
      a1.q = dq1.get();
      a1.out = do1.get();
      cuda::paged_decode(a1, nullptr);
      const auto o1 = do1.download<float>();
      EXPECT_EQ(0, std::memcmp(o1.data(), out.data() + static_cast<size_t>(b) * H * D, o1.size() * sizeof(float)))
          << "batched != single for b=" << b << " ctx=" << ctx[b];
    }
  }
  return worst;
}

// The case matrix of the decode and prefill tests: one_case(rng, dtype,
// head_dim, group, block_size, n) over dtypes x head_dim 64/128/256 x groups
// x block size 16/32 (n counts the cases run), each returning its worst
// |err|/tol; prints the seed and each dtype's worst; stops at a failure.
template <class F>
void run_case_matrix(const char* what, Dtypes dtypes, std::initializer_list<int> groups, F&& one_case) {
  std::mt19937_64 rng = seeded_rng();
  int n = 0;
  for (KvDtype dt : dtypes) {
    double worst = 0;
    for (int D : {64, 128, 256})
      for (int group : groups)
        for (int bs : {16, 32}) {
          worst = std::max(worst, one_case(rng, dt, D, group, bs, n));
          ++n;
          if (::testing::Test::HasFailure()) return;
        }
    std::printf("%s %-8s worst |err|/tol = %.3f\n", what, std::string(kv_dtype_name(dt)).c_str(), worst);
  }
}

// groups: the GQA ratios of the matrix (the per-token-head run takes two of
// the three: its kernels are fp8 e4m3's, and gpu.sh's test step has 200 s).
void decode_matrix(Dtypes dtypes, std::initializer_list<int> groups = {1, 4, 8}) {
  run_case_matrix("decode", dtypes, groups, [](std::mt19937_64& rng, KvDtype dt, int D, int group, int bs, int n) {
    const ScaleMode mode = static_cast<ScaleMode>(n % 3);
    const int window = (n % 2) ? 0 : (n % 4 == 0 ? 100 : 33);
    DecodeCase c{dt, D, group, 2, bs, window, mode, n % 5 == 4 ? 30.0f : 0.0f};
    // Alternate forced small splits (many splits + reduction) and the auto plan.
    return run_decode_case(rng, c, (n % 2) ? 64 : 0, n % 3 == 0);
  });
}

TEST(CudaDecode, MatchesCpuReferenceAcrossShapesDtypesScales) {
  FP8KV_REQUIRE_GPU();
  decode_matrix(kDtypes);
}

// Per-token-head: per-key K scales on the scores, V scales folded into P (the
// scale modes of the matrix do not apply: each row has its own scale).
TEST(CudaDecode, PerTokenHeadMatchesCpuReference) {
  FP8KV_REQUIRE_GPU();
  decode_matrix(kPthDtypes, {4, 8});
}

TEST(CudaDecode, LargeGroupsSplitIntoChunks) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng(test_seed());
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2, KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    run_decode_case(rng, DecodeCase{dt, 128, 12, 1, 16, 0, ScaleMode::per_head, 0.0f}, 0, true);
    run_decode_case(rng, DecodeCase{dt, 64, 16, 2, 32, 57, ScaleMode::per_tensor, 0.0f}, 128, false);
  }
}

// Kernel attributes are per device, and the engine runs TP ranks as threads
// of one process, one GPU each (set_func_attribute_once, common.cuh). A D = 256
// decode (96-192 KB of dynamic shared memory: it fails to launch without the
// attribute) from concurrent fresh threads: one per device (the devices after
// the first never got the attributes from a per-process static), two when
// there is one device.
TEST(CudaDecode, EveryDeviceAndThreadGetsKernelAttributes) {
  FP8KV_REQUIRE_GPU();
  int ndev = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&ndev));
  const uint64_t seed = test_seed();
  const int nthreads = std::max(2, ndev);
  std::vector<std::thread> threads;
  for (int i = 0; i < nthreads; ++i)
    threads.emplace_back([i, ndev, seed] {
      const int dev = i % ndev;
      ASSERT_EQ(cudaSuccess, cudaSetDevice(dev));
      std::mt19937_64 rng(seed + static_cast<uint64_t>(i));
      for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
        const double worst = run_decode_case(rng, DecodeCase{dt, 256, 2, 2, 16, 0, ScaleMode::per_tensor, 0.0f}, 0,
                                             false);
        EXPECT_LE(worst, 1.0) << "device " << dev << " thread " << i << " " << kv_dtype_name(dt);
      }
    });
  for (auto& t : threads) t.join();
  std::printf("decode D=256 on %d thread(s) over %d device(s): ok\n", nthreads, ndev);
}

// Batch 64 x 8 KV heads at <= 1K context: 512 CTAs, more than one wave at 3
// CTAs per SM and one at 4, so on an H200 (132 SMs) the e4m3 d128 batch runs
// the F4 kernel (the plan's wide kernel) while each single sequence runs the
// default one: bitwise equal all the same (same tile order and arithmetic).
void lean_auto(KvDtype dt) {
  std::mt19937_64 rng(test_seed());
  std::uniform_int_distribution<int> u(1, 1024);
  std::vector<int> lengths(64);
  for (int& x : lengths) x = u(rng);
  lengths[0] = 1024;
  const double worst = run_decode_case(rng, DecodeCase{dt, 128, 4, 8, 16, 0, ScaleMode::per_head, 0.0f}, 0, true, lengths);
  EXPECT_LE(worst, 1.0) << kv_dtype_name(dt);
}
TEST(CudaDecode, LeanAutoBatchEqualsSingle) {
  FP8KV_REQUIRE_GPU();
  lean_auto(KvDtype::fp8_e4m3);
}
// The per-token-head d128 rows have an F4 wide kernel too.
TEST(CudaDecode, PerTokenHeadLeanAutoBatchEqualsSingle) {
  FP8KV_REQUIRE_GPU();
  for (KvDtype dt : kPthDtypes) lean_auto(dt);
}

// KV-head counts that are multiples of 4 (4 and 8, as Llama-3-8B), with many
// splits (forced 64 and 256 keys: the split reduction; every case launches
// the batch and then each sequence alone) and the auto plan; windows and
// softcap.
void kv_heads_in_fours(Dtypes dtypes) {
  std::mt19937_64 rng(test_seed());
  int n = 0;
  for (KvDtype dt : dtypes)
    for (int hkv : {4, 8})
      for (int split : {64, 256, 0}) {
        const int window = n % 3 == 1 ? 100 : 0;
        const DecodeCase c{dt, 128, n % 2 ? 4 : 2, hkv, n % 2 ? 16 : 32, window,
                           static_cast<ScaleMode>(n % 3), n % 4 == 3 ? 30.0f : 0.0f};
        EXPECT_LE(run_decode_case(rng, c, split, true), 1.0);
        ++n;
        if (::testing::Test::HasFailure()) return;
      }
}
TEST(CudaDecode, KvHeadsInFoursBatchedEqualsSingle) {
  FP8KV_REQUIRE_GPU();
  kv_heads_in_fours(kDtypes);
}
TEST(CudaDecode, PerTokenHeadKvHeadsInFoursBatchedEqualsSingle) {
  FP8KV_REQUIRE_GPU();
  kv_heads_in_fours(kPthDtypes);
}

// Long splits: more than 32 tiles per warp (block-table refresh) and many
// trips around each warp's shared-memory ring, one split (direct output) and
// two uneven splits (reduction).
TEST(CudaDecode, LongSplitsWrapTheRing) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng(test_seed());
  for (KvDtype dt : kDtypes)
    for (int D : {64, 128, 256}) {
      const std::vector<int> lengths = {4133, 2113, 17};
      run_decode_case(rng, DecodeCase{dt, D, 4, 1, 16, 0, ScaleMode::per_head, 0.0f}, 4096, D == 128, lengths);
      run_decode_case(rng, DecodeCase{dt, D, 2, 2, 32, 3000, ScaleMode::per_tensor, 0.0f}, 8192, false, lengths);
      if (HasFailure()) return;
    }
}

// One split of > 128 tiles per warp (9000 keys; 16384-key splits): the FAST
// kernels fetch block ids 32 tiles ahead and
// rotate them at tiles 32, 64, 96 and 128 of a warp; a window starting
// mid-tile and a 16-key block size cross the edge-tile masks.
void very_long_split(Dtypes dtypes) {
  std::mt19937_64 rng(test_seed());
  for (KvDtype dt : dtypes)
    for (int D : {128, 256}) {
      const std::vector<int> lengths = {9000, 33};  // (the random cache fill dominates the test's time)
      run_decode_case(rng, DecodeCase{dt, D, 4, 2, 16, 0, ScaleMode::per_head, 0.0f}, 16384, true, lengths);
      run_decode_case(rng, DecodeCase{dt, D, 2, 1, 32, 8999, ScaleMode::per_tensor, 0.0f}, 16384, false, lengths);
      if (::testing::Test::HasFailure()) return;
    }
}
TEST(CudaDecode, VeryLongSplitRefillsBlockIds) {
  FP8KV_REQUIRE_GPU();
  const KvDtype fast[] = {KvDtype::bf16, KvDtype::fp8_e4m3};  // the FAST kernels' dtypes
  very_long_split(fast);
}
TEST(CudaDecode, PerTokenHeadVeryLongSplitRefillsBlockIds) {
  FP8KV_REQUIRE_GPU();
  very_long_split(kPthDtypes);
}

// ---- prefill / chunked prefill ---------------------------------------------

struct PrefillCase {
  KvDtype dt;
  int D, group, num_kv_heads, block_size, window;
  ScaleMode mode;
  float softcap;
};

// The prefill arguments of scenario s's batch: nq[b] queries of H heads for
// sequence b, starting at row dqs[b] of dq; the output into dout.
cuda::PrefillArgs prefill_args(const Scenario& s, int H, const std::vector<int>& nq, const DevBuf& dqs,
                               const DevBuf& dq, const DevBuf& dout) {
  cuda::PrefillArgs a;
  a.kv = s.paged();
  a.batch = s.batch();
  a.num_heads = H;
  a.max_query_len = *std::max_element(nq.begin(), nq.end());
  a.q_start = dqs.as<int32_t>();
  a.q = dq.get();
  a.out = dout.get();
  return a;
}

// lengths: (context, query count) pairs; empty: the default mix.
// check_single: each sequence launched alone gives bitwise its rows of the
// batched launch.
double run_prefill_case(std::mt19937_64& rng, const PrefillCase& c, const std::vector<std::pair<int, int>>& lengths = {},
                        bool check_single = false) {
  // (context, chunk) pairs: whole prompts, chunks at an offset, single tokens.
  std::uniform_int_distribution<int> u(1, 300);
  std::vector<int> ctx = {1, 70, c.block_size * 9 + 5, u(rng), u(rng) + 64};
  std::vector<int> nq = {1, 70, 77, 0, 0};
  nq[3] = std::max(1, ctx[3] / 3);
  nq[4] = ctx[4];
  if (!lengths.empty()) {
    ctx.clear();
    nq.clear();
    for (const auto& [cl, n] : lengths) { ctx.push_back(cl); nq.push_back(n); }
  }
  Scenario s = make_scenario(rng, c.D, c.num_kv_heads, c.block_size, c.dt, c.mode, ctx, /*bf16_input=*/true);
  EXPECT_TRUE(s.store_matches()) << "CUDA store (bf16 input) differs from CPU";
  const int B = s.batch(), H = c.num_kv_heads * c.group, D = c.D;
  std::vector<int32_t> qs(B + 1, 0);
  for (int b = 0; b < B; ++b) qs[b + 1] = qs[b] + nq[b];
  const int total = qs[B];
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(total) * H * D);
  for (auto& x : q) x = nd(rng);
  const float sm = 1.0f / std::sqrt(static_cast<float>(D));
  DevBuf dq(q), dqs(qs), dout(q.size() * sizeof(float));
  dout.fill(0xff);
  cuda::PrefillArgs a = prefill_args(s, H, nq, dqs, dq, dout);
  a.window = c.window;
  a.softmax_scale = sm;
  a.logit_softcap = c.softcap;
  cuda::paged_prefill(a, nullptr);
  const auto out = dout.download<float>();
  if (check_single) {
    for (int b = 0; b < B; ++b) {
      const size_t row = static_cast<size_t>(H) * D;
      std::vector<float> q1(q.begin() + qs[b] * row, q.begin() + qs[b + 1] * row);
      std::vector<int32_t> bt1(s.block_tables.begin() + b * s.max_blocks, s.block_tables.begin() + (b + 1) * s.max_blocks);
      std::vector<int32_t> c1 = {ctx[b]}, qs1 = {0, nq[b]};
      DevBuf dq1(q1), dbt1(bt1), dc1(c1), dqs1(qs1), do1(q1.size() * sizeof(float));
      do1.fill(0xff);
      cuda::PrefillArgs a1 = a;
      a1.kv.block_tables = dbt1.as<int32_t>();
      a1.kv.context_lens = dc1.as<int32_t>();
      a1.batch = 1;
      a1.max_query_len = nq[b];
      a1.q_start = dqs1.as<int32_t>();
      a1.q = dq1.get();
      a1.out = do1.get();
      cuda::paged_prefill(a1, nullptr);
      const auto o1 = do1.download<float>();
      EXPECT_EQ(0, std::memcmp(o1.data(), out.data() + qs[b] * row, o1.size() * sizeof(float)))
          << "prefill batched != single for b=" << b << " ctx=" << ctx[b] << " nq=" << nq[b];
    }
  }
  double worst = 0;
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> pos(nq[b]);
    for (int i = 0; i < nq[b]; ++i) pos[i] = ctx[b] - nq[b] + i;
    std::vector<float> ref(static_cast<size_t>(nq[b]) * H * D);
    PagedAttentionArgs ca = s.cpu_args(b);
    ca.window = c.window;
    ca.softmax_scale = sm;
    ca.logit_softcap = c.softcap;
    paged_attention_cpu(ca, q.data() + static_cast<size_t>(qs[b]) * H * D, pos.data(), nq[b], H, ref.data());
    // The bound per (query, head) scans the whole visible context: the slow
    // part of the long-prompt test, so the query rows are split over threads
    // (each keeps its worst and its first failure; the earliest is reported).
    struct Fail { int i = -1, h = 0, d = 0; float g = 0, r = 0; double tol = 0, e = 0; };
    const int nt = std::max(1, std::min<int>(nq[b] / 16, static_cast<int>(std::thread::hardware_concurrency())));
    std::vector<double> worst_t(nt, 0.0);
    std::vector<Fail> fail_t(nt);
    std::vector<std::thread> pool;
    for (int ti = 0; ti < nt; ++ti)
      pool.emplace_back([&, ti] {
        for (int i = ti; i < nq[b]; i += nt)
          for (int h = 0; h < H; ++h) {
            const size_t row = (static_cast<size_t>(qs[b] + i) * H + h) * D;
            const double tol = attention_bound(s, b, q.data() + row, h / c.group, pos[i], c.window, sm, c.softcap);
            for (int d = 0; d < D; ++d) {
              const float g = out[row + d], r = ref[(static_cast<size_t>(i) * H + h) * D + d];
              const double e = std::isfinite(g) ? std::fabs(g - r) / tol : 1e9;
              if (e > 1.0) {
                fail_t[ti] = Fail{i, h, d, g, r, tol, e};
                return;
              }
              worst_t[ti] = std::max(worst_t[ti], e);
            }
          }
      });
    for (auto& th : pool) th.join();
    const Fail* f = nullptr;
    for (const Fail& x : fail_t)
      if (x.i >= 0 && (!f || x.i < f->i)) f = &x;
    if (f) {
      ADD_FAILURE() << "prefill " << kv_dtype_name(c.dt) << " D=" << D << " group=" << c.group
                    << " bs=" << c.block_size << " window=" << c.window << " ctx=" << ctx[b] << " nq=" << nq[b]
                    << " i=" << f->i << " h=" << f->h << " d=" << f->d << " gpu " << f->g << " cpu " << f->r
                    << " tol " << f->tol;
      return f->e;
    }
    for (double x : worst_t) worst = std::max(worst, x);
  }
  return worst;
}

// The split plan (host only, no GPU: ctas_per_sm given). Invariants for every
// shape: whole 64-key splits that cover the span, a workspace for exactly the
// partials; and the wave model's intent (docs/cuda.md): a small
// batch (at most half the resident CTAs unsplit) is split into one wave, never
// two, and at long context fills at least half the slots.
TEST(CudaPlan, SplitsCoverTheSpanAndFillTheGpu) {
  const int sms = 132, cps = 3;
  for (int D : {64, 128, 256})
    for (int hkv : {1, 8})
      for (int B : {1, 3, 8, 32, 64, 256})
        for (int C : {1, 63, 1024, 4133, 16384, 65536})
          for (int window : {0, 100}) {
            const int H = hkv * 4;
            const cuda::DecodePlan p = cuda::plan_decode(B, H, hkv, D, C, window, sms, 0, cps);
            const int span = std::max(1, window > 0 ? std::min(C, window + 15) : C);
            SCOPED_TRACE("D " + std::to_string(D) + " hkv " + std::to_string(hkv) + " B " + std::to_string(B) +
                         " C " + std::to_string(C) + " window " + std::to_string(window));
            ASSERT_GT(p.split_tokens, 0);
            EXPECT_EQ(p.split_tokens % 64, 0);
            EXPECT_GE(static_cast<int64_t>(p.max_splits) * p.split_tokens, span);
            EXPECT_LT(static_cast<int64_t>(p.max_splits - 1) * p.split_tokens, span);
            // Partials (floats: [B][H][splits] outputs of D and one log-sum-exp).
            const size_t partials = static_cast<size_t>(B) * H * p.max_splits * (D + 1) * 4;
            EXPECT_EQ(p.workspace_bytes, p.max_splits > 1 ? partials : 0u);
            const int64_t base = static_cast<int64_t>(B) * hkv, slots = sms * cps;
            if (base * 2 <= slots) {
              EXPECT_LE(base * p.max_splits, slots) << "a second wave for a small batch";
            }
            if (base * 2 <= slots && span >= 64 * slots) {
              EXPECT_GE(base * p.max_splits * 2, slots) << "under half full";
            }
          }
  // Forced split sizes are rounded up to 64 and honoured.
  const cuda::DecodePlan f = cuda::plan_decode(2, 32, 8, 128, 5000, 0, sms, 1000);
  EXPECT_EQ(f.split_tokens, 1024);
  EXPECT_EQ(f.max_splits, 5);
}

// F4 (docs/cuda.md): an fp8 e4m3 d128 plan made at the device's occupancy is
// the 3-CTA (FAST) plan when that one fits one wave, else the plan for 4 CTAs
// per SM (F4's). Assumes the H200's occupancies (FAST 3, F4 4 CTAs per SM).
TEST(CudaPlan, F4AutoReplansBeyondOneWave) {
  FP8KV_REQUIRE_GPU();
  const int sms = cuda::device_sm_count();
  int replanned = 0;
  for (int B : {1, 8, 32, 64, 256})
    for (int C : {1024, 4096, 16384, 65536}) {
      SCOPED_TRACE("B " + std::to_string(B) + " C " + std::to_string(C));
      const cuda::DecodePlan fast = cuda::plan_decode(B, 32, 8, 128, C, 0, sms, 0, 3);
      const cuda::DecodePlan f4 = cuda::plan_decode(B, 32, 8, 128, C, 0, sms, 0, 4);
      const cuda::DecodePlan got = cuda::plan_decode(B, 32, 8, 128, C, 0, sms);
      const bool beyond = static_cast<int64_t>(B) * 8 * fast.max_splits > static_cast<int64_t>(sms) * 3;
      EXPECT_EQ(got.split_tokens, beyond ? f4.split_tokens : fast.split_tokens);
      EXPECT_EQ(got.workspace_bytes, beyond ? f4.workspace_bytes : fast.workspace_bytes);
      replanned += beyond;
    }
  EXPECT_GT(replanned, 0);
}

// The prefill tests run the plan's kernel per case (prefill_plan.h): wgmma
// at head_dim 128 and 256, mma.sync at 64.
void prefill_matrix(Dtypes dtypes, std::initializer_list<int> groups = {1, 4, 8}) {
  run_case_matrix("prefill", dtypes, groups, [](std::mt19937_64& rng, KvDtype dt, int D, int group, int bs, int n) {
    const ScaleMode mode = static_cast<ScaleMode>((n + 1) % 3);
    const int window = (n % 3 == 0) ? 0 : (n % 3 == 1 ? 50 : 129);
    return run_prefill_case(
        rng, PrefillCase{dt, D, group, group == 8 ? 1 : 2, bs, window, mode, n % 7 == 6 ? 20.0f : 0.0f});
  });
}
TEST(CudaPrefill, MatchesCpuReferenceCausalWindowChunked) {
  FP8KV_REQUIRE_GPU();
  prefill_matrix(kDtypes);
}
TEST(CudaPrefill, PerTokenHeadMatchesCpuReference) {
  FP8KV_REQUIRE_GPU();
  prefill_matrix(kPthDtypes, {4, 8});
}

// head_dim 128 and 256 (the wgmma kernel's): prompts of several 128-query
// tiles and many key tiles (128 keys at D = 128; 64 / 48 at 256), a chunk
// deep into its context, a window wider than a tile, softcap on and off; and
// batched == single, bitwise. grid_cap > 0: the persistent kernel on at most
// that many CTAs (each walks many work items).
void run_long_prompts(int grid_cap, Dtypes dtypes, int D = 128) {
  std::mt19937_64 rng = seeded_rng();
  const std::vector<std::pair<int, int>> lengths = {{611, 611}, {900, 260}, {129, 129}, {300, 1}};
  int n = 0;
  for (KvDtype dt : dtypes) {
    double worst = 0;
    for (int window : {0, 200}) {
      const PrefillCase c{dt, D, 4, 2, n % 2 ? 32 : 16, window, static_cast<ScaleMode>(n % 3), n % 2 ? 0.0f : 30.0f};
      worst = std::max(worst, run_prefill_case(rng, c, lengths, true));
      ++n;
      // Progress per case (a slow CPU reference and a hung kernel look alike under a timeout).
      std::printf("  case %s window %d done\n", std::string(kv_dtype_name(dt)).c_str(), window);
      std::fflush(stdout);
      if (::testing::Test::HasFailure()) return;
    }
    std::printf("prefill-long D %d grid cap %d %-8s worst |err|/tol = %.3f\n", D, grid_cap,
                std::string(kv_dtype_name(dt)).c_str(), worst);
  }
}

TEST(CudaPrefill, LongPromptsBatchedEqualsSingle) {
  FP8KV_REQUIRE_GPU();
  run_long_prompts(0, kDtypes);
}
TEST(CudaPrefill, LongPromptsHeadDim256BatchedEqualsSingle) {
  FP8KV_REQUIRE_GPU();
  run_long_prompts(0, kDtypes, 256);
  run_long_prompts(0, kPthDtypes, 256);
}
TEST(CudaPrefill, PerTokenHeadLongPromptsBatchedEqualsSingle) {
  FP8KV_REQUIRE_GPU();
  run_long_prompts(0, kPthDtypes);
}

// The same on 7 CTAs: a CTA runs many (head, query tile, sequence) items
// back to back, its mbarrier ring running on across them.
TEST(CudaPrefill, LongPromptsOnSevenCtas) {
  FP8KV_REQUIRE_GPU();
  struct Reset {
    ~Reset() { cuda::set_prefill_max_ctas_for_tests(0); }
  } reset;
  cuda::set_prefill_max_ctas_for_tests(7);
  run_long_prompts(7, kDtypes);
  run_long_prompts(7, kDtypes, 256);
}

// bf16 activations (the engine's; the other prefill tests pass f32): q in
// bf16 and out in bf16 give bitwise the bf16 rounding of the f32 run on the
// same (bf16-exact) q. Covers the wgmma kernel's 16-byte Q loads for both q
// dtypes, at head_dim 128 and 256 (two batches of loads).
TEST(CudaPrefill, Bf16ActivationsEqualRoundedF32) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng = seeded_rng();
  const std::vector<int> ctx = {300, 129, 77};
  const std::vector<int> nq = {300, 129, 40};
  for (int D : {128, 256})
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2, KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    Scenario s = make_scenario(rng, D, 2, 16, dt, ScaleMode::per_head, ctx, /*bf16_input=*/true);
    const int B = s.batch(), H = 8;
    std::vector<int32_t> qs(B + 1, 0);
    for (int b = 0; b < B; ++b) qs[b + 1] = qs[b] + nq[b];
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(qs[B]) * H * D);
    std::vector<uint16_t> qb(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = round_bf16(nd(rng));
      qb[i] = f32_to_bf16(q[i]);
    }
    DevBuf dq(q), dqb(qb), dqs(qs), dout(q.size() * sizeof(float)), doutb(q.size() * 2);
    dout.fill(0xff);
    doutb.fill(0xff);
    cuda::PrefillArgs a = prefill_args(s, H, nq, dqs, dq, dout);
    a.window = dt == KvDtype::fp8_e5m2 ? 100 : 0;
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    cuda::paged_prefill(a, nullptr);
    a.q = dqb.get();
    a.q_dtype = cuda::ActDtype::bf16;
    a.out = doutb.get();
    a.out_dtype = cuda::ActDtype::bf16;
    cuda::paged_prefill(a, nullptr);
    const auto o32 = dout.download<float>();
    const auto o16 = doutb.download<uint16_t>();
    size_t bad = 0;
    for (size_t i = 0; i < o32.size(); ++i) bad += o16[i] != f32_to_bf16(o32[i]);
    EXPECT_EQ(bad, 0u) << kv_dtype_name(dt) << ": bf16 q/out differs from the rounded f32 run";
    std::printf("prefill-bf16act D %d %-8s mismatches %zu of %zu\n", D, std::string(kv_dtype_name(dt)).c_str(), bad,
                o32.size());
  }
}

}  // namespace
}  // namespace fp8kv::cudatest
