// Stop strings over streamed text: matched across deltas, never emitted, and
// a streamed client never sees the start of a stop string that may match.
#include <gtest/gtest.h>

#include <random>

#include "server/stop_matcher.h"

using fp8kv::server::StopMatcher;

namespace {
// Feeds `text` in the given pieces; returns what was emitted and the match.
std::pair<std::string, std::optional<std::string>> run(const std::vector<std::string>& stops,
                                                       const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  std::string out;
  for (const auto& p : pieces) {
    auto r = m.push(p);
    out += r.text;
    if (r.stop) return {out, r.stop};
  }
  return {out + m.flush(), std::nullopt};
}
}  // namespace

TEST(StopMatcher, MatchesAcrossPiecesAndDropsTheStop) {
  auto [out, stop] = run({"END"}, {"hello E", "N", "D and more"});
  EXPECT_EQ(out, "hello ");
  EXPECT_EQ(stop, "END");
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldStillMatch) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xxab").text, "xx");  // "ab" may start "abc"
  EXPECT_EQ(m.push("x").text, "abx");    // it did not
  EXPECT_EQ(m.push("a").text, "");
  EXPECT_EQ(m.flush(), "a");             // no match: the held text comes out at the end
}

TEST(StopMatcher, EarliestMatchWins) {
  auto [out, stop] = run({"cd", "b"}, {"abcd"});
  EXPECT_EQ(out, "a");
  EXPECT_EQ(stop, "b");
}

TEST(StopMatcher, NothingAfterAMatch) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.push("axb").stop);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more").text, "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.flush(), "");
}

// Any split of the text: generation stops at the first piece that completes a
// stop string, cut at the earliest occurrence seen so far.
TEST(StopMatcher, RandomSplitsAgreeWithPrefixSearch) {
  std::mt19937 rng(7);
  const std::string alphabet = "aab";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text, s1, s2;
    for (int i = 0; i < 12; ++i) text += alphabet[rng() % 3];
    for (int i = 0; i < 1 + static_cast<int>(rng() % 3); ++i) s1 += alphabet[rng() % 3];
    for (int i = 0; i < 1 + static_cast<int>(rng() % 4); ++i) s2 += alphabet[rng() % 3];
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 4;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    // Reference: the first prefix (at a piece boundary) that contains a stop
    // string ends generation; its earliest occurrence there is the cut.
    size_t first = std::string::npos, end = 0;
    for (const auto& p : pieces) {
      end += p.size();
      const std::string seen = text.substr(0, end);
      first = std::min(seen.find(s1), seen.find(s2));
      if (first != std::string::npos) break;
    }
    auto [out, stop] = run({s1, s2}, pieces);
    if (first == std::string::npos) {
      EXPECT_EQ(out, text);
      EXPECT_FALSE(stop);
    } else {
      EXPECT_EQ(out, text.substr(0, first)) << text << " / " << s1 << " / " << s2;
      ASSERT_TRUE(stop);
      EXPECT_EQ(text.compare(first, stop->size(), *stop), 0);
    }
  }
}
