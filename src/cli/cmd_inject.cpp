// `fp8kv inject MODEL_DIR --report REPORT.json (--output NEW_DIR | --in-place)`:
// writes calibrated KV scales into a checkpoint as their own shard, with the
// index as the commit point (src/calib/inject.h, docs/kv_scales.md).
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "calib/inject.h"
#include "cli/commands.h"
#include "cli/text_input.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "io/user_files.h"
#include "numerics/version.h"

namespace fp8kv::cli {
namespace {

struct InjectArgs {
  std::string model, report, output;
  bool in_place = false;
  std::string naming = "hf";
  bool declare = false;
  bool no_q = false;
  int test_step_delay_ms = 0;  // tests only (InjectOptions::slow_ms)
};

int run_inject(const InjectArgs& a) {
  if (a.in_place == !a.output.empty()) throw UsageError("inject: give exactly one of --output NEW_DIR or --in-place");
  InjectOptions o;
  o.model_dir = a.model;
  if (!a.output.empty()) o.output_dir = a.output;
  o.report_source = a.report;
  o.naming = parse_kv_scale_naming(a.naming);
  o.declare_kv_scheme = a.declare;
  o.write_q_scale = !a.no_q;
  o.slow_ms = a.test_step_delay_ms;
  const nlohmann::json report = parse_json_option_file(a.report, "--report");
  const InjectResult r = inject_kv_scales(o, report);
  std::fprintf(stderr, "inject: wrote %zu scale tensors to %s/%s%s\n", r.tensors.size(), r.dir.c_str(),
               r.scales_file.c_str(), r.created_index ? " (created model.safetensors.index.json)" : "");
  nlohmann::json out;
  out["fp8kv_version"] = version_string();
  out["model"] = a.model;
  out["output"] = r.dir.string();
  out["in_place"] = a.in_place;
  out["scales_file"] = r.scales_file;
  out["tensors"] = r.tensors.size();
  out["naming"] = a.naming;
  out["created_index"] = r.created_index;
  out["declared_kv_scheme"] = a.declare;
  std::printf("%s\n", dump_json(out).c_str());
  return 0;
}

const Registrar reg_inject([](CLI::App& app) {
  auto args = std::make_shared<InjectArgs>();
  CLI::App* sub = app.add_subcommand("inject", "write calibrated KV scales (a calibrate report) into a checkpoint");
  sub->add_option("model", args->model, "checkpoint directory")->required();
  sub->add_option("--report", args->report, "REPORT.json written by fp8kv calibrate")->required();
  sub->add_option("--output", args->output, "new checkpoint directory (must not exist, or be empty)");
  sub->add_flag("--in-place", args->in_place, "modify MODEL_DIR (the index is the commit point)");
  sub->add_option("--naming", args->naming, "hf: self_attn.{k,v,q}_scale (default) | vllm-runtime: self_attn.attn.*");
  sub->add_flag("--declare-kv-scheme", args->declare,
                "record kv_cache_quant_algo FP8 in hf_quant_config.json (so --kv-cache-dtype auto picks fp8)");
  sub->add_flag("--no-q-scale", args->no_q, "write only k and v scales");
  // Test-only, hidden from --help: a pause between the file steps, so that
  // tests/e2e/inject_kill9.sh can kill -9 inside each step on a fast disk.
  sub->add_option("--test-step-delay-ms", args->test_step_delay_ms, "test only: pause between file steps")
      ->check(CLI::Range(0, 600000))
      ->group("");
  set_action(sub, [args] { return run_inject(*args); });
});

}  // namespace
}  // namespace fp8kv::cli
