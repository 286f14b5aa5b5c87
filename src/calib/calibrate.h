// Calibration driver: runs an engine with a bf16 cache over token chunks with
// a CalibrationObserver at the store point, and builds the report. The CLI
// (`fp8kv calibrate`) tokenizes and chunks the corpus; tests call this
// directly with token ids.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "calib/report.h"
#include "engine/engine.h"

namespace fp8kv {

struct CalibrateOptions {
  ScaleRule rule;
  KvDtype target = KvDtype::fp8_e4m3;
  bool per_head = false;
  // Fewer observed tokens fail the calibration (status failed, exit 2): an
  // amax over a handful of tokens is not a range (`--min-tokens`).
  uint64_t min_tokens = kDefaultMinCalibrationTokens;
  static constexpr uint64_t kDefaultMinCalibrationTokens = 64;
};

// progress(tokens_done, tokens_total) after each chunk.
using CalibrateProgress = std::function<void(uint64_t done, uint64_t total)>;

// The engine must run a bf16 cache (what is observed must not already be
// quantized): InputError otherwise. Chunks are scored one at a time.
CalibrationReport calibrate(Engine& engine, const std::vector<std::vector<int>>& chunks, const CalibrateOptions& o,
                            const CalibrateProgress& progress = {});

// Cuts token ids into consecutive chunks of `context` tokens (the last may be
// shorter; empty input gives no chunk), keeping at most `budget` tokens over
// all calls when budget > 0 (budget is decremented).
void append_chunks(const std::vector<int>& ids, int context, uint64_t& budget, bool limited,
                   std::vector<std::vector<int>>& chunks);

// The end-of-run table (stderr): per layer amax and scales, the v_scale range
// and how many layers are above, below and at 1.0, and the largest amax and
// where it was.
std::string calibration_summary(const CalibrationReport& r);

}  // namespace fp8kv
