// `fp8kv bench serve`'s pure parts: SSE splitting across arbitrary chunk
// boundaries, numpy-style percentiles, the prompts and arrivals, and the
// summary's arithmetic (the HTTP path is tests/e2e/bench_serve.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "server/bench_client.h"
#include "server/peer_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace fp8kv::server {
namespace {

TEST(BenchClient, SseSplitterJoinsAnySplit) {
  const std::string stream =
      "data: {\"a\":1}\n\ndata: {\"b\":\"x\\ny\"}\r\n\r\n: comment\n\ndata: [DONE]\n\n";
  // Fixed reference: the payloads in order (the comment event has no data).
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":\"x\\ny\"}", "[DONE]"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    SseSplitter s;
    std::vector<std::string> got;
    size_t i = 0;
    while (i < stream.size()) {
      const size_t n = std::min(stream.size() - i, static_cast<size_t>(1 + rng() % 9));
      for (auto& p : s.feed(stream.data() + i, n)) got.push_back(p);
      i += n;
    }
    // "\r\n\r\n" holds no "\n\n": the CRLF event ends at the next blank
    // line, and the comment line in between adds no data.
    EXPECT_EQ(got, want) << trial;
  }
  SseSplitter s;
  auto one = s.feed("data: x", 7);
  EXPECT_TRUE(one.empty());
  one = s.feed("\n\n", 2);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], "x");
}

TEST(BenchClient, PercentileIsNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], p): 50 -> 2.5, 99 -> 3.97, 0 -> 1, 100 -> 4.
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_NEAR(percentile({4, 1, 3, 2}, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
}

TEST(BenchClient, PromptsAndArrivals) {
  const auto a = random_prompts(3, 5, 100, 1), b = random_prompts(3, 5, 100, 1);
  EXPECT_EQ(a, b);
  for (const auto& p : a) {
    ASSERT_EQ(p.size(), 5u);
    for (int x : p) EXPECT_TRUE(x >= 0 && x < 100);
  }
  // bench throughput's draw: mt19937_64(seed), rng() % vocab.
  std::mt19937_64 rng(1);
  EXPECT_EQ(a[0][0], static_cast<int>(rng() % 100));

  for (double t : arrival_times(10, INFINITY, 0)) EXPECT_EQ(t, 0.0);
  // Poisson arrivals: increasing, and the mean gap of many is 1/rate within
  // 5 standard errors (the gap's sd is 1/rate: 5 / sqrt(n) relative).
  const int n = 4000;
  const double rate = 20.0;
  const auto t = arrival_times(n, rate, 3);
  for (int i = 1; i < n; ++i) EXPECT_GE(t[i], t[i - 1]);
  const double mean_gap = t.back() / (n - 1);
  EXPECT_NEAR(mean_gap * rate, 1.0, 5.0 / std::sqrt(n - 1.0));
}

TEST(BenchClient, SummaryArithmetic) {
  BenchServeSettings s;
  s.num_prompts = 3;
  BenchServeRun r;
  r.duration_s = 2.0;
  RequestOutcome ok1;
  ok1.success = true;
  ok1.prompt_len = 10;
  ok1.output_tokens = 5;
  ok1.ttft = 0.1;
  ok1.latency = 0.5;  // tpot (0.5 - 0.1) / 4 = 0.1
  ok1.itl = {0.1, 0.1, 0.1, 0.1};
  RequestOutcome ok2 = ok1;
  ok2.output_tokens = 1;  // no tpot for a 1-token output
  ok2.itl = {};
  RequestOutcome bad;
  bad.prompt_len = 10;
  bad.error = "HTTP 400";
  r.outcomes = {ok1, ok2, bad};
  const auto j = summarize(r, s);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 20);
  EXPECT_EQ(j["total_output_tokens"], 6);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["total_token_throughput"].get<double>(), 13.0);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(j["mean_itl_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["errors"][2], "HTTP 400");
}

// The server raises cpp-httplib's listen backlog of 5 (a burst of 256
// clients otherwise waits on SYN retries): the listening socket is found by
// its port; a port nobody here listens on is not.
TEST(ListenBacklog, FindsTheListeningSocketByPort) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  EXPECT_TRUE(raise_listen_backlog(port, 2048));
  // Still listening, and a port with no listener here is not found.
  int on = 0;
  len = sizeof on;
  ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len), 0);
  EXPECT_EQ(on, 1);
  close(fd);
  EXPECT_FALSE(raise_listen_backlog(port, 2048));
}

}  // namespace
}  // namespace fp8kv::server
