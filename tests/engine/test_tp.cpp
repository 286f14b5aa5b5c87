// Tensor parallelism on the CPU rank simulation (engine/tp_runner.h,
// engine/tp_shard.h, backend/comm.h): TP = 2 and 4 equal TP = 1
// within fp32 reordering on every family, for bf16 and fp8 caches; greedy
// generation gives the same tokens; the collectives are exact and
// deterministic; a TP size that does not fit the model is refused by name;
// the KV clip counts are summed over the ranks, in one process or several.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "../common/errors.h"
#include "backend/comm.h"
#include "backend/common/comm_timeout.h"
#include "backend/common/rank_failure.h"
#include "engine/dummy_weights.h"
#include "engine/engine.h"
#include "engine/tp_runner.h"
#include "engine/tp_shard.h"
#include "io/errors.h"
#include "model/weights.h"
#include "numerics/fp8.h"
#include "reference.h"
#include "weights_compare.h"

namespace fp8kv {
using ::testing::HasSubstr;
namespace {

using testing::tiny_config_json;
using testing::logits_of;

// ---- the comm timeout (the one reader of FP8KV_COMM_TIMEOUT_S) ----

TEST(CommTimeout, ReadsTheVariableAndFallsBackOnBadValues) {
  ::unsetenv("FP8KV_COMM_TIMEOUT_S");
  EXPECT_EQ(comm_timeout_seconds(), kDefaultCommTimeoutSeconds);
  ::setenv("FP8KV_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(comm_timeout_seconds(), 2.5);
  EXPECT_EQ(comm_timeout(), std::chrono::milliseconds(2500));
  for (const char* bad : {"", "0", "-3", "abc", "5s", "1e7"}) {
    ::setenv("FP8KV_COMM_TIMEOUT_S", bad, 1);
    EXPECT_EQ(comm_timeout_seconds(), kDefaultCommTimeoutSeconds) << "'" << bad << "'";
  }
  ::unsetenv("FP8KV_COMM_TIMEOUT_S");
}

// ---- the CPU communicator ----

TEST(CpuComm, AllReduceSumsInRankOrderAndAllGatherConcatenates) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = make_cpu_communicators(world);
    std::vector<std::vector<float>> data(world), gathered(world);
    std::vector<std::thread> th;
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        for (int it = 0; it < 50; ++it) {  // many rounds: the barrier must not let rounds overlap
          data[r].assign(7, 0.0f);
          for (int i = 0; i < 7; ++i) data[r][i] = (r == 0 ? 1e8f : 1.0f) + static_cast<float>(i + it);
          comms[r]->all_reduce_sum(data[r].data(), 7, ScalarType::f32, nullptr);
          const float mine = static_cast<float>(10 * r + it);
          gathered[r].assign(world, -1.0f);
          comms[r]->all_gather(&mine, gathered[r].data(), 1, ScalarType::f32, nullptr);
          for (int q = 0; q < world; ++q) EXPECT_EQ(gathered[r][q], static_cast<float>(10 * q + it));
        }
      });
    for (auto& t : th) t.join();
    for (int r = 0; r < world; ++r)
      for (int i = 0; i < 7; ++i) {
        // The fixed order: ((x0 + x1) + x2) + ... in fp32, from 0.
        float want = 0.0f;
        for (int q = 0; q < world; ++q) want += (q == 0 ? 1e8f : 1.0f) + static_cast<float>(i + 49);
        EXPECT_EQ(data[r][i], want) << "world " << world << " rank " << r;
      }
  }
}

TEST(CpuComm, AbortWakesWaitingRanks) {
  auto comms = make_cpu_communicators(2);
  float x = 1.0f;
  std::thread t([&] { EXPECT_THROW(comms[1]->all_reduce_sum(&x, 1, ScalarType::f32, nullptr), std::runtime_error); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  abort_cpu_communicators(*comms[0]);
  t.join();
}

// ---- the CPU communicator over sockets (multi-process TP) ----

// A port the kernel just handed out (free at that moment; the rendezvous
// binds it again right after).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0)
    return 0;
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// The RankFailure that f throws; nullopt (and a test failure) when it throws none.
template <class F>
std::optional<RankFailure> rank_failure_of(F&& f) {
  try {
    f();
  } catch (const RankFailure& e) {
    return e;
  }
  ADD_FAILURE() << "no RankFailure";
  return std::nullopt;
}

// W socket ranks (threads here, processes in the engine) give bitwise the
// thread simulation's results: both sum rank 0 + rank 1 + ... in fp32.
TEST(CpuSocketComm, EqualsTheThreadSimulationBitwise) {
  for (int world : {2, 3}) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    std::vector<std::unique_ptr<Communicator>> sock(world);
    auto sim = make_cpu_communicators(world);
    std::vector<std::thread> th;
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        sock[r] = make_cpu_socket_communicator(r, world, "127.0.0.1", port, std::chrono::seconds(20));
      });
    for (auto& t : th) t.join();
    th.clear();
    for (int r = 0; r < world; ++r) ASSERT_TRUE(sock[r]) << r;
    std::mt19937 g(7);
    std::uniform_real_distribution<float> u(-8.0f, 8.0f);
    const size_t n = 3001;
    std::vector<std::vector<float>> in(world, std::vector<float>(n));
    for (auto& v : in)
      for (auto& x : v) x = u(g) * (g() % 3 == 0 ? 1e6f : 1.0f);  // large and small: order matters
    std::vector<std::vector<float>> a = in, b = in, gat(world, std::vector<float>(n * world));
    std::vector<std::vector<uint16_t>> hb(world, std::vector<uint16_t>(n)), hs(world, std::vector<uint16_t>(n));
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < n; ++i) hb[r][i] = hs[r][i] = f32_to_bf16(in[r][i]);
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        sock[r]->all_reduce_sum(a[r].data(), n, ScalarType::f32, nullptr);
        sim[r]->all_reduce_sum(b[r].data(), n, ScalarType::f32, nullptr);
        sock[r]->all_reduce_sum(hb[r].data(), n, ScalarType::bf16, nullptr);
        sim[r]->all_reduce_sum(hs[r].data(), n, ScalarType::bf16, nullptr);
        sock[r]->all_gather(in[r].data(), gat[r].data(), n, ScalarType::f32, nullptr);
      });
    for (auto& t : th) t.join();
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(0, std::memcmp(a[r].data(), b[r].data(), n * 4)) << "world " << world << " rank " << r;
      EXPECT_EQ(0, std::memcmp(a[r].data(), a[0].data(), n * 4));
      EXPECT_EQ(hb[r], hs[r]) << "bf16, rank " << r;
      for (int q = 0; q < world; ++q) EXPECT_EQ(0, std::memcmp(gat[r].data() + q * n, in[q].data(), n * 4));
    }
  }
}

// A dead peer (its process ended: closed sockets) fails the collective at
// once instead of waiting for the timeout.
TEST(CpuSocketComm, ADeadPeerFailsTheCallPromptly) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  std::unique_ptr<Communicator> c0, c1;
  std::thread t([&] { c1 = make_cpu_socket_communicator(1, 2, "127.0.0.1", port, std::chrono::seconds(60)); });
  c0 = make_cpu_socket_communicator(0, 2, "127.0.0.1", port, std::chrono::seconds(60));
  t.join();
  c1.reset();
  const auto t0 = std::chrono::steady_clock::now();
  float x = 1.0f;
  const auto e = rank_failure_of([&] { c0->all_reduce_sum(&x, 1, ScalarType::f32, nullptr); });
  ASSERT_TRUE(e);
  // The watchdog's line (docs/tp.md): the lost peer, the collective, this rank.
  EXPECT_EQ(e->kind(), RankFailure::Kind::lost);
  EXPECT_EQ(e->peer(), 1);
  EXPECT_EQ(e->self(), 0);
  EXPECT_EQ(e->op(), "all_reduce");
  EXPECT_EQ(std::string(e->what()), "rank 1 lost during all_reduce: peer closed the connection; rank 0 stops");
  EXPECT_EQ(std::string(e->at_layer(3).what()),
            "rank 1 lost during all_reduce (layer 3): peer closed the connection; rank 0 stops");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// A peer that is alive but never joins the collective: the wait ends after
// the timeout (not before), naming the peer as stalled; the peer, whose
// partner is gone, then fails its own next collective as "rank 0 lost".
TEST(CpuSocketComm, ASilentPeerFailsTheCallAfterTheTimeout) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const auto timeout = std::chrono::milliseconds(300);
  std::unique_ptr<Communicator> c0, c1;
  std::thread t([&] { c1 = make_cpu_socket_communicator(1, 2, "127.0.0.1", port, timeout); });
  c0 = make_cpu_socket_communicator(0, 2, "127.0.0.1", port, timeout);
  t.join();
  float x = 1.0f;
  const auto t0 = std::chrono::steady_clock::now();
  const auto stalled = rank_failure_of([&] { c0->all_reduce_sum(&x, 1, ScalarType::f32, nullptr); });
  ASSERT_TRUE(stalled);
  EXPECT_EQ(stalled->kind(), RankFailure::Kind::stalled);
  EXPECT_EQ(stalled->peer(), 1);
  EXPECT_EQ(std::string(stalled->what()),
            "rank 1 stalled during all_reduce: nothing received within the collective timeout (0.3 s, "
            "--collective-timeout); rank 0 stops");
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, timeout);
  EXPECT_LT(waited, std::chrono::seconds(5));
  c0.reset();  // rank 0 exits
  float g[2] = {};
  const auto lost = rank_failure_of([&] { c1->all_gather(&x, g, 1, ScalarType::f32, nullptr); });
  ASSERT_TRUE(lost);
  EXPECT_EQ(lost->kind(), RankFailure::Kind::lost);
  EXPECT_EQ(lost->peer(), 0);
  EXPECT_EQ(lost->self(), 1);
  EXPECT_EQ(lost->op(), "all_gather");
}

TEST(CpuSocketComm, UnreachableMasterIsBoundedAndNamed) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    make_cpu_socket_communicator(1, 2, "127.0.0.1", port, std::chrono::milliseconds(500));
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(TpMultiProcess, BadCombinationsAreInputErrors) {
  auto refused = [](TpMultiProcess mp, int world, const std::string& want) {
    EXPECT_THAT(test_util::input_error_of([&] { check_multi_process(mp, world); }), HasSubstr(want));
  };
  refused({2, 0, "127.0.0.1", 29500}, 1, "--nnodes must equal --tensor-parallel-size");
  refused({2, 2, "127.0.0.1", 29500}, 2, "--node-rank 2 is out of range for --nnodes 2");
  refused({1, -1, "127.0.0.1", 29500}, 1, "--node-rank -1 is out of range");
  refused({0, 0, "127.0.0.1", 29500}, 1, "--nnodes must be >= 1");
  refused({2, 1, "127.0.0.1", 65535}, 2, "--master-port 65535 must be in 1..65534");
  refused({2, 1, "", 29500}, 2, "--master-addr must not be empty");
  EXPECT_NO_THROW(check_multi_process({2, 1, "127.0.0.1", 29500}, 2));
  EXPECT_NO_THROW(check_multi_process({1, 0, "", 0}, 4));  // one process: the address is not used
}

// ---- the engine ----

ModelConfig config_of(const std::string& family) {
  nlohmann::json j = tiny_config_json(family == "llama_bias" || family == "llama_v212" ? "llama" : family);
  if (family == "llama_bias") j["attention_bias"] = true, j["mlp_bias"] = true;  // o_proj and down_proj biases too
  if (family == "llama_v212") j["vocab_size"] = 212;                             // vocab-parallel LM head at TP 2 and 4
  return parse_model_config(j, family + " test config");
}

EngineOptions tp_opts(const std::string& dtype, int tp) {
  EngineOptions o = testing::small_paged_options(dtype, 1u << 20, 32);
  o.tensor_parallel_size = tp;
  return o;
}

std::unique_ptr<Engine> make(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> w, const std::string& dtype,
                             int tp) {
  return testing::create_engine(cfg, std::move(w), tp_opts(dtype, tp));
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// The tolerance. TP changes only the order of fp32 additions: o_proj and
// down_proj sum K = Hq*D (or I) products as N partial sums of K/N added in
// rank order, instead of one running sum. Each such sum then differs by at
// most ~K * 2^-24 relative to sum |w x| (Higham's gamma_K), about 1e-5 at
// K = 128; three layers of residual + norm carry that to the O(1) logits as
// a few 1e-6..1e-5 absolute (observed: 2e-6..1.5e-5).
// The cache adds one effect: a K/V value within that 1e-6 of a rounding
// boundary of the cache dtype is stored as the neighbouring code. One bf16
// ulp is 2^-7 of an O(1) value (8e-3); one e4m3 ulp is 2^-3 of the scaled
// value (~0.1 in real units at the scales below). That moves one attention
// score by |q| * ulp / sqrt(D), and the logits by about as much (observed:
// 1e-3..2e-3 for bf16, 1e-2 for e4m3 when it happens). So the bound is one
// flipped code: 1e-2 (bf16) and 5e-2 (e4m3), and the top-1 must agree at
// every position.
TEST_P(TensorParallel, ScoreEqualsTp1WithinFp32Reordering) {
  const auto [family, dtype] = GetParam();
  const ModelConfig cfg = config_of(family);
  auto w = ModelWeights::random(cfg, 17, 0.15f, true);
  std::mt19937_64 rng(3);
  std::vector<int> toks(40);
  for (auto& t : toks) t = static_cast<int>(rng() % static_cast<uint64_t>(cfg.vocab_size));
  auto e1 = make(cfg, w, dtype, 1);
  const auto ref = logits_of(*e1, toks, 7);
  const double tol = dtype == "bf16" ? 1e-2 : 5e-2;
  for (int tp : {2, 4}) {
    auto e = make(cfg, w, dtype, tp);
    EXPECT_EQ(e->kv_plan().tensor_parallel_size, tp);
    const auto got = logits_of(*e, toks, 7);
    ASSERT_EQ(got.size(), ref.size());
    double m = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(got[i].size(), ref[i].size());
      int a = 0, b = 0;
      for (size_t j = 0; j < ref[i].size(); ++j) {
        m = std::max(m, static_cast<double>(std::abs(got[i][j] - ref[i][j])));
        if (ref[i][j] > ref[i][a]) a = static_cast<int>(j);
        if (got[i][j] > got[i][b]) b = static_cast<int>(j);
      }
      EXPECT_EQ(a, b) << "top-1 at position " << i << ", tp " << tp;
    }
    EXPECT_LE(m, tol) << family << " " << dtype << " tp " << tp;
    RecordProperty("max_abs_diff_tp" + std::to_string(tp), std::to_string(m));
    std::printf("[tp] %s %s tp=%d max|dlogit| = %.3g\n", family.c_str(), dtype.c_str(), tp, m);
  }
}

TEST_P(TensorParallel, GreedyGenerationGivesTheSameTokens) {
  const auto [family, dtype] = GetParam();
  const ModelConfig cfg = config_of(family);
  auto w = ModelWeights::random(cfg, 5, 0.15f, true);
  testing::expect_greedy_same_at_tp([&](int tp) { return make(cfg, w, dtype, tp); }, {5, 17, 42, 9, 100, 3});
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallel,
                         ::testing::Combine(::testing::Values("llama", "llama_bias", "llama_v212", "mistral", "qwen2",
                                                              "qwen3", "gemma3"),
                                            ::testing::Values("bf16", "fp8_e4m3")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });
// Per-token-head caches: a rank holds its own KV heads' scales, each computed
// from that head's values alone, so the bound is the e4m3 one (one flipped code).
INSTANTIATE_TEST_SUITE_P(PerTokenHead, TensorParallel,
                         ::testing::Combine(::testing::Values("llama", "gemma3"),
                                            ::testing::Values("fp8_per_token_head", "int8_per_token_head")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// Several requests stepped together (continuous batching) under TP 2.
TEST(TensorParallelEngine, BatchedStepsMatchTp1) {
  const ModelConfig cfg = config_of("qwen3");
  auto w = ModelWeights::random(cfg, 8, 0.15f, true);
  auto run = [&](int tp) {
    auto e = make(cfg, w, "fp8_e4m3", tp);
    std::vector<RequestId> ids;
    for (int i = 0; i < 3; ++i) {
      GenerateOptions g;
      g.max_tokens = 8 + i;
      g.stop_at_eos = false;
      ids.push_back(e->submit(Request{{3 + i, 7, 11 * (i + 1), 2 + i}, g}));
    }
    std::map<RequestId, std::vector<int>> out;
    while (!e->idle())
      for (const auto& ev : e->step())
        if (ev.token >= 0) out[ev.id].push_back(ev.token);
    return out;
  };
  EXPECT_EQ(run(2), run(1));
}

TEST(TensorParallelEngine, SizesThatDoNotFitAreRefusedByName) {
  const ModelConfig cfg = config_of("llama");  // 4 heads, 2 KV heads, ffn 96
  auto w = ModelWeights::random(cfg, 1, 0.1f, true);
  auto msg = [&](int tp) {
    try {
      Engine::create(cfg, w, tp_opts("bf16", tp));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(3).find("num_attention_heads 4"), std::string::npos) << msg(3);
  EXPECT_NE(msg(8).find("4"), std::string::npos) << msg(8);
  EXPECT_NE(msg(0).find(">= 1"), std::string::npos) << msg(0);
  nlohmann::json j = tiny_config_json("llama");
  j["intermediate_size"] = 90;  // 4 does not divide it
  const ModelConfig c2 = parse_model_config(j, "t");
  auto w2 = ModelWeights::random(c2, 1, 0.1f, true);
  EXPECT_THAT(test_util::input_error_of([&] { Engine::create(c2, w2, tp_opts("bf16", 4)); }),
              HasSubstr("intermediate_size 90"));
}

// The KV pool of each rank holds its heads: the plan is the planner's for TP
// N (per-rank bytes), and the log line equals `fp8kv capacity`'s.
TEST(TensorParallelEngine, KvPlanIsThePlannersPerRankPlan) {
  const ModelConfig cfg = config_of("llama");
  auto w = ModelWeights::random(cfg, 1, 0.1f, true);
  for (int tp : {1, 2, 4}) {
    auto e = Engine::create(cfg, w, tp_opts("fp8_e4m3", tp));
    KvPlanSettings s;
    s.kv_memory_bytes = 1u << 20;
    s.max_model_len = 96;
    s.max_num_batched_tokens = 32;
    s.block_size = 4;
    s.dtype = KvDtype::fp8_e4m3;
    s.tensor_parallel_size = tp;
    const KvPlan p = plan_kv_cache(cfg, s);
    EXPECT_EQ(kv_plan_log_line(e->kv_plan()), kv_plan_log_line(p));
    EXPECT_EQ(e->kv_plan().kv_heads_per_rank, tp == 4 ? 1 : 2 / tp);
  }
}

TEST(TensorParallelEngine, ObserverNeedsOneRank) {
  const ModelConfig cfg = config_of("llama");
  auto e = Engine::create(cfg, ModelWeights::random(cfg, 1, 0.1f, true), tp_opts("bf16", 2));
  struct Obs : StoreObserver {
    void observe(int, const float*, int, const float*, const float*, int, int, int) override {}
  } obs;
  EXPECT_THROW(e->set_store_observer(&obs), InputError);
  e->set_store_observer(nullptr);
}

// ---- KV clip counts under tensor parallelism (docs/design.md
// "Multi-process tensor parallelism"; docs/robustness.md "KV clipping") ----

// Whether `port` can be bound on the loopback now.
bool bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// A free port P with P + 1 free too (the control channel, the collectives).
int free_port_pair() {
  for (int i = 0; i < 64; ++i) {
    const int p = free_port();
    if (p > 0 && p < 65535 && bindable(p + 1)) return p;
  }
  return 0;
}

// Per-head scales that clip part of K and V in every layer of the tiny llama
// (|k|, |v| are O(1) there: a threshold of 448 s = 0.45 and 1.3).
KvScales clipping_scales(const ModelConfig& c) {
  KvScales s = KvScales::unity(c.num_layers);
  for (auto& l : s.layers) {
    l.k.values.assign(static_cast<size_t>(c.num_kv_heads), 1e-3f);
    l.v.values.assign(static_cast<size_t>(c.num_kv_heads), 1e-3f);
    l.k.values.back() = 3e-3f;
    l.v.values.back() = 3e-3f;
  }
  return s;
}

// Per layer and stream, the stored K/V elements whose |x / s| lies within a
// relative `eps` of e4m3's max: the only ones that can clip at one TP size
// and not at another.
struct NearTheMax : StoreObserver {
  NearTheMax(const KvScales& s, double eps) : sc(s), eps(eps), near(s.layers.size()) {}
  void observe(int layer, const float*, int, const float* k, const float* v, int hkv, int d, int t) override {
    const double m = kv_dtype_elem_max(KvDtype::fp8_e4m3);
    for (int st = 0; st < 2; ++st) {
      const std::vector<float>& s = st == 0 ? sc.layers.at(layer).k.values : sc.layers.at(layer).v.values;
      const float* x = st == 0 ? k : v;
      for (int i = 0; i < t; ++i)
        for (int h = 0; h < hkv; ++h)
          for (int j = 0; j < d; ++j) {
            const double y = std::fabs(static_cast<double>(x[(static_cast<size_t>(i) * hkv + h) * d + j]) / s.at(h));
            if (std::fabs(y - m) <= eps * m) ++near[layer][st];
          }
    }
  }
  const KvScales& sc;
  double eps;
  std::vector<std::array<uint64_t, 2>> near;
};

// Each rank counts the saturated K/V of its own heads; the engine reports
// the sum over the ranks, each KV head once. TP 2 and TP 4 (the 2 KV heads
// replicated on 2 ranks each) in one process, and TP 2 as two engines joined
// by the multi-process control channel (threads here, processes in
// tests/e2e/tp_multiproc.sh), report TP 1's counts. Stored elements: exactly
// (the same tokens and heads). Clipped: two processes give bitwise the
// simulated ranks' K/V (the same rank-order fp32 sums), so exactly their
// counts; TP N's K/V differ from TP 1's by the fp32 reordering of the
// row-parallel sums (a few 1e-6 relative, ScoreEqualsTp1WithinFp32Reordering),
// so only elements within that of the threshold can flip: at most those
// TP 1 stored within 1e-4 relative of e4m3's max (margin 10x).
TEST(TensorParallelEngine, KvClipCountsAreSummedOverRanksAndProcesses) {
  const ModelConfig cfg = config_of("llama");
  auto w = ModelWeights::random(cfg, 23, 0.15f, true);
  const KvScales scales = clipping_scales(cfg);
  std::mt19937_64 rng(11);
  std::vector<std::vector<int>> seqs(2);
  for (int i = 0; i < 2; ++i)
    for (int t = 0; t < 40 - 12 * i; ++t)
      seqs[i].push_back(static_cast<int>(rng() % static_cast<uint64_t>(cfg.vocab_size)));
  ScoreOptions so;
  so.chunk_size = 7;  // several steps: the warning checks read the counts between them
  EngineOptions base = tp_opts("fp8_e4m3", 1);
  base.num_threads = 1;
  auto run = [&](Engine& e, StoreObserver* obs) {
    e.set_kv_scales(scales);
    if (obs) e.set_store_observer(obs);
    e.score_batch(seqs, so);
    if (obs) e.set_store_observer(nullptr);
    const auto c = e.kv_clip_counts();
    EXPECT_TRUE(c.has_value());
    return c.value_or(std::vector<KvClipCounts>{});
  };
  NearTheMax near(scales, 1e-4);
  const std::vector<KvClipCounts> tp1 = run(*Engine::create(cfg, w, base), &near);
  ASSERT_EQ(tp1.size(), static_cast<size_t>(cfg.num_layers));
  std::map<int, std::vector<KvClipCounts>> in_process;
  for (int tp : {2, 4}) {
    EngineOptions o = base;
    o.tensor_parallel_size = tp;
    in_process[tp] = run(*Engine::create(cfg, w, o), nullptr);
  }
  // Two processes' worth: rank 1 serves in Engine::create until rank 0's
  // engine is destroyed.
  std::vector<KvClipCounts> mp;
  {
    EngineOptions o = base;
    o.tensor_parallel_size = 2;
    o.nnodes = 2;
    o.master_port = free_port_pair();
    o.collective_timeout_s = 30;
    ASSERT_GT(o.master_port, 0);
    std::exception_ptr follower_error;
    std::thread follower([&, o]() mutable {
      o.node_rank = 1;
      try {
        EXPECT_TRUE(Engine::create(cfg, w, o) == nullptr);
      } catch (...) {
        follower_error = std::current_exception();
      }
    });
    try {
      mp = run(*Engine::create(cfg, w, o), nullptr);
    } catch (...) {
      follower.join();
      throw;
    }
    follower.join();
    ASSERT_FALSE(follower_error) << "rank 1 failed";
  }
  uint64_t clipped = 0, stored = 0;
  for (size_t l = 0; l < tp1.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    ASSERT_EQ(mp.size(), tp1.size());
    EXPECT_EQ(mp[l].k, in_process[2][l].k);
    EXPECT_EQ(mp[l].v, in_process[2][l].v);
    EXPECT_EQ(mp[l].stored, in_process[2][l].stored);
    for (int tp : {2, 4}) {
      const KvClipCounts& c = in_process[tp][l];
      EXPECT_EQ(c.stored, tp1[l].stored) << "tp " << tp;
      EXPECT_LE(std::max(c.k, tp1[l].k) - std::min(c.k, tp1[l].k), near.near[l][0]) << "tp " << tp;
      EXPECT_LE(std::max(c.v, tp1[l].v) - std::min(c.v, tp1[l].v), near.near[l][1]) << "tp " << tp;
    }
    std::printf("[clips] layer %zu: K %llu V %llu of %llu (tp 1); 2 processes K %llu V %llu of %llu; near the max "
                "K %llu V %llu\n",
                l, static_cast<unsigned long long>(tp1[l].k), static_cast<unsigned long long>(tp1[l].v),
                static_cast<unsigned long long>(tp1[l].stored), static_cast<unsigned long long>(mp[l].k),
                static_cast<unsigned long long>(mp[l].v), static_cast<unsigned long long>(mp[l].stored),
                static_cast<unsigned long long>(near.near[l][0]), static_cast<unsigned long long>(near.near[l][1]));
    clipped += tp1[l].k + tp1[l].v;
    stored += 2 * tp1[l].stored;
  }
  // The scales clip some but not all: a sum that dropped a rank would show.
  EXPECT_GT(clipped, stored / 10);
  EXPECT_LT(clipped, stored * 9 / 10);
}

// Sharding: KV heads replicated when num_kv_heads < TP (vLLM).
// Per-rank dummy weights are bitwise the shard of the full dummy model:
// every matrix (shape, dtype, bytes) and vector, on families with biases,
// tied embeddings, a vocab-parallel head and replicated KV heads.
TEST(TpShard, DummyWeightsShardEqualsShardOfFullDummy) {
  for (const std::string fam : {"llama", "llama_bias", "llama_v212", "qwen2", "gemma3"}) {
    const ModelConfig cfg = config_of(fam);
    for (int world : {2, 4})
      if (cfg.num_heads % world == 0 && cfg.intermediate_size % world == 0)
        testing::expect_dummy_shards_equal(cfg, world, fam);
  }
}

// Per-rank loading of a tied model with a vocab-parallel head (Llama-3.2-1B's
// case): the rank's LM head is a view of its embedding rows, before and
// after widening to fp32, so a rank holds those rows once (docs/tp.md
// "Per-rank loading"). Values: the full model's rows.
TEST(TpShard, TiedVocabParallelHeadIsAViewOfTheEmbedding) {
  nlohmann::json j = tiny_config_json("qwen2");
  j["vocab_size"] = 212;
  const ModelConfig cfg = parse_model_config(j, "qwen2 vocab 212");
  ASSERT_TRUE(cfg.tie_word_embeddings);
  const auto full = dummy_weights(cfg, 3)->widened_to_f32();
  const int world = 2;
  const int64_t nv = cfg.vocab_size / world, H = cfg.hidden_size;
  for (int r = 0; r < world; ++r) {
    for (const bool dummy : {true, false}) {
      const auto bf = dummy ? dummy_weights_shard(cfg, TpShard{r, world, true}, 3)
                            : shard_weights(dummy_weights(cfg, 3), cfg, TpShard{r, world});
      const auto w = bf->widened_to_f32();
      for (const ModelWeights* m : {bf.get(), static_cast<const ModelWeights*>(w.get())}) {
        ASSERT_TRUE(m->lm_head.has_value());
        const size_t es = m->embed.bf16 ? 2 : 4;
        EXPECT_EQ(m->lm_head->data, static_cast<const char*>(m->embed.data) + static_cast<size_t>(r * nv * H) * es)
            << "rank " << r << (dummy ? " dummy" : " shard") << (m == w.get() ? " widened" : "");
      }
      ASSERT_FALSE(w->lm_head->bf16);
      EXPECT_EQ(0, std::memcmp(w->lm_head->data, static_cast<const float*>(full->embed.data) + r * nv * H,
                               static_cast<size_t>(nv * H) * sizeof(float)))
          << "rank " << r;
    }
  }
}

TEST(TpShard, KvHeadsSplitOrReplicate) {
  const ModelConfig cfg = config_of("llama");  // 2 KV heads
  EXPECT_EQ(first_kv_head(cfg, {1, 2}), 1);
  EXPECT_EQ(first_kv_head(cfg, {0, 4}), 0);
  EXPECT_EQ(first_kv_head(cfg, {1, 4}), 0);
  EXPECT_EQ(first_kv_head(cfg, {2, 4}), 1);
  EXPECT_EQ(first_kv_head(cfg, {3, 4}), 1);
  const ModelConfig rc = shard_config(cfg, 4);
  EXPECT_EQ(rc.num_heads, 1);
  EXPECT_EQ(rc.num_kv_heads, 1);
  EXPECT_EQ(rc.intermediate_size, 24);
  EXPECT_FALSE(vocab_parallel(cfg, 2));  // 211
  EXPECT_TRUE(vocab_parallel(config_of("llama_v212"), 4));
}

}  // namespace
}  // namespace fp8kv
