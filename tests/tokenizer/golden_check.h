// The tokenizer golden check shared by test_tokenizer_goldens.cpp (the
// bundled references) and test_tokenizer_real.cpp (real vocabularies):
// every encoded id and every decoded string of a golden block must match.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fp8kv::test_util {

// A string or an id list as JSON, cut at 160 characters (failure messages).
inline std::string show(const std::string& s) {
  std::string out = nlohmann::json(s).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  return out.size() > 160 ? out.substr(0, 160) + "...\"" : out;
}
inline std::string show(const std::vector<int>& v) {
  std::string out = nlohmann::json(v).dump();
  return out.size() > 160 ? out.substr(0, 160) + "...]" : out;
}

struct GoldenCheck {
  size_t cases = 0;       // cases and decode_cases checked
  size_t mismatches = 0;  // every differing encode / decode
};

// Checks tok against one golden block: "cases" (text -> ids with and without
// special tokens, ids -> decoded, decoded_skip) and "decode_cases" (ids ->
// text, text_skip). The first `max_reports` mismatches are test failures
// naming `name`. incremental: also streaming each case's ids through an
// IncrementalDecoder gives its full decode.
inline GoldenCheck check_tokenizer_golden(const Tokenizer& tok, const nlohmann::json& block, const std::string& name,
                                          size_t max_reports, bool incremental) {
  GoldenCheck r;
  auto report = [&](const std::string& what) {
    if (++r.mismatches <= max_reports) ADD_FAILURE() << name << ": " << what;
  };
  auto check_decode = [&](const std::vector<int>& ids, const nlohmann::json& want, const nlohmann::json& want_skip) {
    const std::string d = tok.decode(ids, false), ds = tok.decode(ids, true);
    if (d != want.get<std::string>())
      report("decode " + show(ids) + "\n  want " + show(want.get<std::string>()) + "\n  got  " + show(d));
    if (ds != want_skip.get<std::string>())
      report("decode(skip) " + show(ids) + "\n  want " + show(want_skip.get<std::string>()) + "\n  got  " + show(ds));
    return d;
  };
  for (const nlohmann::json& c : block["cases"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int>>();
    const auto want_ns = c["ids_no_special"].get<std::vector<int>>();
    const auto got = tok.encode(text, true), got_ns = tok.encode(text, false);
    ++r.cases;
    if (got != want) report("encode " + show(text) + "\n  want " + show(want) + "\n  got  " + show(got));
    if (got_ns != want_ns)
      report("encode(no special) " + show(text) + "\n  want " + show(want_ns) + "\n  got  " + show(got_ns));
    const std::string d = check_decode(want, c["decoded"], c["decoded_skip"]);
    if (incremental) {  // streaming the ids of valid text gives the full decode
      IncrementalDecoder inc(tok);
      std::string streamed;
      for (int id : want) streamed += inc.push(id);
      streamed += inc.flush();
      if (streamed != d)
        report("incremental decode " + show(want) + "\n  want " + show(d) + "\n  got  " + show(streamed));
    }
  }
  for (const nlohmann::json& c : block["decode_cases"]) {
    ++r.cases;
    check_decode(c["ids"].get<std::vector<int>>(), c["text"], c["text_skip"]);
  }
  return r;
}

}  // namespace fp8kv::test_util
