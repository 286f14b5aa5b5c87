// inject: refusals before any write, the new shard + index, weight shards
// untouched (same bytes, same inode for --output hard links), re-inject
// replaces, single-file checkpoints get an index, SHA256SUMS, naming options.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "calib/inject.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "tiny_checkpoint.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace fp8kv;
using fp8kv::testing::write_tiny_checkpoint;

namespace {

using fp8kv::test_util::TempDir;

// name -> sha256 of every file in dir (top level).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(dir))
    m[e.path().filename().string()] = e.is_regular_file() ? sha256_file_hex(e.path()) : "<dir>";
  return m;
}

nlohmann::json report(float v1, bool per_head_k = false) {
  nlohmann::json j = {{"status", "complete"}, {"target", "fp8_e4m3"}, {"rule", "safety:1.3"}};
  for (int l = 0; l < 3; ++l) {
    nlohmann::json e = {{"layer", l}, {"k_scale", 1.0}, {"v_scale", l == 1 ? v1 : 1.0}, {"q_scale", 1.0}};
    if (per_head_k && l == 2) e["k_scale"] = {0.5, 2.0};
    j["layers"].push_back(e);
  }
  return j;
}

KvScales scales_of(const fs::path& dir) {
  const auto ck = Checkpoint::open(dir);
  return load_kv_scales(*ck, KvScaleShape{3, 4, 2});
}

InjectOptions in_place(const fs::path& dir) {
  InjectOptions o;
  o.model_dir = dir;
  return o;
}

void expect_refused(const InjectOptions& o, const nlohmann::json& rep, const std::string& needle) {
  const auto before = snapshot(o.model_dir);
  std::error_code ec0;
  const bool out_existed = o.output_dir && fs::exists(*o.output_dir, ec0);
  const auto out_before = out_existed ? snapshot(*o.output_dir) : std::map<std::string, std::string>{};
  try {
    inject_kv_scales(o, rep);
    FAIL() << "expected refusal: " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(o.model_dir), before) << "a refused inject wrote something";
  if (o.output_dir && out_existed) {
    EXPECT_EQ(snapshot(*o.output_dir), out_before) << "a refused inject modified the output directory";
  } else if (o.output_dir) {
    std::error_code ec;
    EXPECT_FALSE(fs::exists(*o.output_dir, ec)) << "a refused inject created the output directory";
  }
}

}  // namespace

TEST(Inject, InPlaceSingleFileCreatesIndexAndReinjectReplaces) {
  TempDir d;
  const fs::path m = d.path() / "m";
  write_tiny_checkpoint(m);
  const std::string weights_hash = sha256_file_hex(m / "model.safetensors");
  struct stat st0 {};
  ASSERT_EQ(::stat((m / "model.safetensors").c_str(), &st0), 0);

  auto r = inject_kv_scales(in_place(m), report(3.5f));
  EXPECT_TRUE(r.created_index);
  EXPECT_EQ(r.tensors.size(), 9u);
  ASSERT_TRUE(fs::exists(m / "model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(m / "kv_cache_scales.safetensors"));
  auto s = scales_of(m);
  EXPECT_EQ(s.layers[1].v.values, std::vector<float>{3.5f});
  EXPECT_EQ(s.layers[1].v.source_tensor, "model.layers.1.self_attn.v_scale");
  EXPECT_TRUE(s.layers[0].v.from_checkpoint);
  EXPECT_TRUE(s.layers[2].q.from_checkpoint);
  EXPECT_EQ(kv_scale_coverage(s).v_present(), 3);
  // The index lists every weight from model.safetensors plus the scales; total_size counts them all.
  const auto idx = nlohmann::json::parse(read_file(m / "model.safetensors.index.json"));
  EXPECT_EQ(idx["weight_map"]["model.layers.1.self_attn.v_scale"], "kv_cache_scales.safetensors");
  EXPECT_EQ(idx["weight_map"]["model.embed_tokens.weight"], "model.safetensors");
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), Checkpoint::open(m)->total_tensor_bytes());
  // The scale shard: float32 scalars.
  const auto sf = SafetensorsFile::open(m / "kv_cache_scales.safetensors");
  const auto* t = sf->find("model.layers.1.self_attn.v_scale");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->dtype, DType::F32);
  EXPECT_TRUE(t->shape.empty());
  EXPECT_EQ(sf->metadata().at("format"), "pt");

  // Again with other scales (and per-head k): replaced, no leftovers.
  r = inject_kv_scales(in_place(m), report(7.25f, true));
  EXPECT_FALSE(r.created_index);
  s = scales_of(m);
  EXPECT_EQ(s.layers[1].v.values, std::vector<float>{7.25f});
  EXPECT_EQ(s.layers[2].k.values, (std::vector<float>{0.5f, 2.0f}));
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(m)) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors", "model.safetensors.index.json",
                                          "kv_cache_scales.safetensors", "SHA256SUMS"}));
  // Weights: same bytes, same inode (never rewritten).
  EXPECT_EQ(sha256_file_hex(m / "model.safetensors"), weights_hash);
  struct stat st1 {};
  ASSERT_EQ(::stat((m / "model.safetensors").c_str(), &st1), 0);
  EXPECT_EQ(st0.st_ino, st1.st_ino);
  EXPECT_EQ(st0.st_mtime, st1.st_mtime);
  // SHA256SUMS lists every file with its hash.
  const std::string sums = read_file(m / "SHA256SUMS");
  EXPECT_NE(sums.find(weights_hash + "  model.safetensors\n"), std::string::npos) << sums;
  EXPECT_NE(sums.find(sha256_file_hex(m / "kv_cache_scales.safetensors") + "  kv_cache_scales.safetensors\n"),
            std::string::npos);
  EXPECT_EQ(sums.find("SHA256SUMS"), std::string::npos);
}

TEST(Inject, OutputDirHardLinksWeightsAndLeavesSourceUntouched) {
  TempDir d;
  const fs::path m = d.path() / "m", out = d.path() / "out";
  write_tiny_checkpoint(m, {.sharded = true});
  const auto before = snapshot(m);
  InjectOptions o = in_place(m);
  o.output_dir = out;
  o.naming = KvScaleNaming::vllm_runtime;
  o.declare_kv_scheme = true;
  const auto r = inject_kv_scales(o, report(2.0f));
  EXPECT_EQ(snapshot(m), before);  // the source is not modified at all
  EXPECT_FALSE(r.created_index);
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    struct stat a {}, b {};
    ASSERT_EQ(::stat((m / shard).c_str(), &a), 0);
    ASSERT_EQ(::stat((out / shard).c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << shard << " should be a hard link";
  }
  // The index was rewritten as a new file (not through the hard link).
  struct stat ia {}, ib {};
  ASSERT_EQ(::stat((m / "model.safetensors.index.json").c_str(), &ia), 0);
  ASSERT_EQ(::stat((out / "model.safetensors.index.json").c_str(), &ib), 0);
  EXPECT_NE(ia.st_ino, ib.st_ino);
  const auto s = scales_of(out);
  EXPECT_EQ(s.layers[1].v.source_tensor, "model.layers.1.self_attn.attn.v_scale");
  EXPECT_EQ(s.layers[1].v.values, std::vector<float>{2.0f});
  EXPECT_TRUE(checkpoint_declares_fp8_kv(out));
  EXPECT_FALSE(checkpoint_declares_fp8_kv(m));
  const auto q = nlohmann::json::parse(read_file(out / "hf_quant_config.json"));
  EXPECT_EQ(q["quantization"]["kv_cache_quant_algo"], "FP8");
  EXPECT_TRUE(fs::exists(out / "SHA256SUMS"));
  // No temp directory left beside the output.
  for (const auto& e : fs::directory_iterator(d.path()))
    EXPECT_EQ(e.path().filename().string().find("fp8kv-tmp"), std::string::npos) << e.path();

  // A second --output into the (now non-empty) directory is refused.
  expect_refused(o, report(2.0f), "not an empty directory");
}

TEST(Inject, RefusesBeforeWritingAnything) {
  TempDir d;
  const fs::path m = d.path() / "m";
  write_tiny_checkpoint(m);
  auto rep = report(2.0f);
  rep["status"] = "failed";
  rep["reason"] = "no token was observed (empty corpus?)";
  expect_refused(in_place(m), rep, "status is 'failed'");
  rep = report(2.0f);
  rep["layers"].erase(2);
  expect_refused(in_place(m), rep, "2 layer entries, but the model has 3 layers");
  rep = report(2.0f);
  rep["layers"][1]["v_scale"] = -3.0;
  expect_refused(in_place(m), rep, "v_scale is -3");
  rep = report(2.0f);
  rep["layers"][1]["v_scale"] = 0;
  expect_refused(in_place(m), rep, "v_scale is 0");
  rep = report(2.0f);
  rep["layers"][0]["k_scale"] = nullptr;
  expect_refused(in_place(m), rep, "k_scale is null");
  rep = report(2.0f);
  rep["layers"][0]["k_scale"] = {1.0, 1.0, 1.0};
  expect_refused(in_place(m), rep, "k_scale has 3 values");
  // --declare-kv-scheme with an e5m2 report.
  rep = report(2.0f);
  rep["target"] = "fp8_e5m2";
  InjectOptions o = in_place(m);
  o.declare_kv_scheme = true;
  expect_refused(o, rep, "target is fp8_e5m2");
  // Output inside the model directory.
  o = in_place(m);
  o.output_dir = m / "sub";
  expect_refused(o, report(2.0f), "must not be inside the model directory");
}

TEST(Inject, RefusesScalesAlreadyInAWeightShard) {
  TempDir d;
  const fs::path m = d.path() / "m";
  write_tiny_checkpoint(m);
  // Rewrite model.safetensors with a k_proj.k_scale tensor added.
  const auto sf = SafetensorsFile::open(m / "model.safetensors");
  std::vector<TensorToWrite> t;
  for (const auto& info : sf->tensors()) {
    const auto vals = sf->to_f32(info.name);
    t.push_back(make_f32_tensor(info.name, info.shape, vals));
  }
  const float one = 1.0f;
  t.push_back(make_f32_tensor("model.layers.0.self_attn.k_proj.k_scale", {}, std::span<const float>(&one, 1)));
  write_safetensors(m / "model.safetensors", t);
  expect_refused(in_place(m), report(2.0f), "model.safetensors already holds KV scale tensor model.layers.0.self_attn.k_proj.k_scale");
}

TEST(Inject, CleansLeftoversOfAKilledRun) {
  TempDir d;
  const fs::path m = d.path() / "m";
  write_tiny_checkpoint(m, {.sharded = true});
  inject_kv_scales(in_place(m), report(2.0f));
  // What a kill can leave: an orphan fresh shard and temp files.
  atomic_write_file(m / "kv_cache_scales.0badf00d.safetensors", "x");
  atomic_write_file(m / "model.safetensors.index.json.tmp.123.deadbeef", "{");
  atomic_write_file(m / "unrelated.tmp.1.2", "keep me");
  inject_kv_scales(in_place(m), report(4.0f));
  EXPECT_FALSE(fs::exists(m / "kv_cache_scales.0badf00d.safetensors"));
  EXPECT_FALSE(fs::exists(m / "model.safetensors.index.json.tmp.123.deadbeef"));
  EXPECT_TRUE(fs::exists(m / "unrelated.tmp.1.2"));
  EXPECT_EQ(scales_of(m).layers[1].v.values, std::vector<float>{4.0f});
}

TEST(Inject, ScaleShardNames) {
  EXPECT_TRUE(is_scale_shard_name("kv_cache_scales.safetensors"));
  EXPECT_TRUE(is_scale_shard_name("kv_cache_scales.0a1b2c3d.safetensors"));
  EXPECT_FALSE(is_scale_shard_name("kv_cache_scales.safetensors.tmp.1.2"));
  EXPECT_FALSE(is_scale_shard_name("model-00001-of-00002.safetensors"));
  EXPECT_FALSE(is_scale_shard_name("kv_cache_scales.xyz.safetensors"));
}
