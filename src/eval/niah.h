// `fp8kv eval niah`: paired needle-in-a-haystack retrieval. Prompts follow
// docs/design.md "Needle prompts" and the bundled model's canonical layout
// (models/fp8kv-mini/README.md, tools/train_bundled.py needle_prompt): the
// haystack cut to a token budget, the needle sentence inserted after the first
// sentence end at/after the chosen depth with one space on each side, then
// "\n\n" + "What is the passkey? The passkey is". Greedy; correct when the
// continuation's first five digits (after optional whitespace) equal the key.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "eval/compare.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::eval {

inline constexpr const char* kNiahQuestion = "What is the passkey? The passkey is";
std::string needle_sentence(const std::string& key);  // "The passkey is K. Remember it. K is the passkey."

// Inserts the needle into hay at byte fraction depth (0..1), snapped forward
// to the next sentence end ([.!?] followed by whitespace), as
// train_bundled.py insert_needle(sentence=True, sep=" ").
std::string insert_needle(const std::string& hay, double depth, const std::string& key);
// The canonical prompt text: insert_needle(...) right-stripped + "\n\n" + question.
std::string needle_prompt(const std::string& hay, double depth, const std::string& key);
// True when `generated` starts (after whitespace) with five digits equal to key.
bool niah_correct(const std::string& generated, const std::string& key);

struct NiahPrompt {
  int length = 0, depth = 0, trial = 0;
  std::string key;
  std::vector<int> ids;
};
struct NiahOptions {
  std::vector<int> lengths{1024, 2048, 4096};
  std::vector<int> depths{10, 50, 90};  // percent
  int trials = 5;
  uint64_t seed = 0;
  int answer_tokens = 7;  // generated tokens (prompt fits in length - answer_tokens)
  int max_model_len = 0;  // > 0: a length above it is refused first (before the haystack is measured)
  std::string max_model_len_origin = "--max-model-len";  // for that refusal (kv/planner.h max_model_len_origin)
};
// Same seed -> same prompts. Throws InputError when a length exceeds
// max_model_len (checked first: that is the cause, not the haystack) or the
// haystack is too short for a length.
std::vector<NiahPrompt> build_niah_prompts(const Tokenizer& tok, const std::string& haystack, const NiahOptions& o);

using NiahProgress = std::function<void(uint64_t done, uint64_t total)>;
// Runs every prompt on every arm; returns {"cells": [...], "mcnemar": [...], ...}.
nlohmann::json run_niah(const std::filesystem::path& model_dir, const EngineOptions& engine,
                        const std::vector<ArmSpec>& arms, const Tokenizer& tok, const std::vector<NiahPrompt>& prompts,
                        const NiahOptions& o, const NiahProgress& progress = {});

}  // namespace fp8kv::eval
