#include "calib/inject.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "calib/report.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "io/safetensors.h"
#include "io/user_files.h"
#include "model/config.h"
#include "model/weights_spec.h"
#include "numerics/version.h"

namespace fp8kv {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kScalesName = "kv_cache_scales.safetensors";
constexpr const char* kSumsName = "SHA256SUMS";
constexpr const char* kQuantConfigName = "hf_quant_config.json";

std::string rand_hex8() {
  static std::random_device rd;
  return fmt::format("{:08x}", static_cast<unsigned>(rd()));
}

void slow(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open directory to fsync", dir.string()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw InputError(fmt::format("{}: fsync of directory failed", dir.string()));
}

void fsync_file(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open to fsync", p.string()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw InputError(fmt::format("{}: fsync failed", p.string()));
}

// Exclusive lock on the checkpoint directory itself (no lock file): two
// injects into one directory must not interleave their steps.
class DirLock {
 public:
  explicit DirLock(const fs::path& dir) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) throw InputError(fmt::format("{}: cannot open directory", dir.string()));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      throw InputError(fmt::format("{}: another fp8kv inject is writing this checkpoint", dir.string()));
    }
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// Temp files left by a killed atomic write of one of the files inject writes:
// "<name>.tmp.<pid>.<hex>".
bool is_our_temp_name(const std::string& f) {
  const size_t t = f.find(".tmp.");
  if (t == std::string::npos) return false;
  const std::string base = f.substr(0, t);
  return is_scale_shard_name(base) || base == kIndexName || base == kSumsName || base == kQuantConfigName;
}

std::string view_bytes(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// What will be written: the scale tensors and the index without our shard.
struct Plan {
  ModelConfig cfg;
  KvScaleShape shape;
  ReportScales report;
  std::string prefix;
  std::vector<TensorToWrite> tensors;
  std::vector<std::byte> shard_bytes;
  nlohmann::ordered_json index;                  // original index (or a fresh one), weight_map rebuilt later
  std::map<std::string, std::string> weight_map; // without entries pointing at scale shards
  uint64_t weight_bytes = 0;                     // bytes of the tensors in weight_map
  std::set<std::string> live_files;              // files the current index (or single file) uses
  bool created_index = false;
};

// The prefix the checkpoint's attention weights use: the text before
// "layers.L.self_attn." for the first layer L with a KV cache (layer 0 of a
// qwen3_5 model is a linear_attention layer, "layers.0.linear_attn."); when
// no such tensor exists, the prefix the engine's weight loader finds
// (detect_weight_naming: "model.", "model.language_model.", ...).
std::string detect_prefix(const Checkpoint& ck, const ModelConfig& cfg, const KvScaleShape& shape) {
  const std::vector<int> kv = shape.kv_layers();
  if (!kv.empty()) {
    const std::string needle = fmt::format("layers.{}.self_attn.", kv.front());
    for (const auto& n : ck.tensor_names()) {
      const size_t at = n.find(needle);
      if (at != std::string::npos && (at == 0 || n[at - 1] == '.')) {
        const std::string p = n.substr(0, at);
        if (p.find("vision") == std::string::npos) return p;
      }
    }
  }
  return detect_weight_naming(cfg, ck).prefix;
}

Plan make_plan(const InjectOptions& o, const nlohmann::json& report_json) {
  Plan p;
  p.cfg = load_model_config(o.model_dir);
  p.shape = kv_scale_shape(p.cfg);  // scales for the layers with a KV cache only
  p.report = parse_report_for_inject(report_json, o.report_source, p.shape);
  if (!check_model_identity(report_json, o.report_source, p.cfg, o.model_dir.string()))
    std::fprintf(stderr, "warning: %s has no model_identity (made by an older fp8kv?): cannot check that it was made "
                 "for %s\n", o.report_source.c_str(), o.model_dir.string().c_str());
  for (const auto& w : p.report.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (o.declare_kv_scheme && p.report.target != KvDtype::fp8_e4m3)
    throw InputError(fmt::format("{}: --declare-kv-scheme records kv_cache_quant_algo FP8 (e4m3), but the report's "
                                 "target is {}",
                                 o.report_source, kv_dtype_name(p.report.target)));

  const auto ck = Checkpoint::open(o.model_dir);
  p.prefix = detect_prefix(*ck, p.cfg, p.shape);
  const fs::path index_path = o.model_dir / kIndexName;
  if (ck->has_index()) {
    const auto j = nlohmann::ordered_json::parse(read_json_text(index_path), nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw InputError(fmt::format("{}: invalid JSON", index_path.string()));
    p.index = j;
  } else {
    p.index = nlohmann::ordered_json::object();
    p.index["metadata"] = nlohmann::ordered_json::object();
    p.created_index = true;
  }
  for (const auto& f : ck->files()) p.live_files.insert(f.filename().string());

  // Streams inject writes, per layer: a KV scale for one of them in a weight
  // shard would conflict with ours (a serving engine reads every tensor of
  // every listed file), and weight shards are never modified.
  for (const auto& name : ck->tensor_names()) {
    const std::string file = ck->file_of(name)->filename().string();
    if (is_scale_shard_name(file)) continue;  // ours: replaced
    if (const auto s = parse_kv_scale_name(name)) {
      const bool ours = s->stream == ScaleStream::k || s->stream == ScaleStream::v || s->stream == ScaleStream::kv ||
                        (s->stream == ScaleStream::q && o.write_q_scale);
      if (ours)
        throw InputError(fmt::format(
            "{}: {} already holds KV scale tensor {}; inject writes scales into its own shard and never modifies "
            "weight shards, so the two would conflict (use a checkpoint without KV scales in its weight shards)",
            o.model_dir.string(), file, name));
    }
    p.weight_map[name] = file;
    p.weight_bytes += ck->find(name)->nbytes();
  }

  // The scale tensors: for the layers with a KV cache only (a linear_attention
  // layer has none, and no attention module for a serving engine to give one).
  const auto& L = p.report.scales.layers;
  for (const int l : p.shape.kv_layers()) {
    auto add = [&](ScaleStream s, const std::vector<float>& v) {
      std::vector<int64_t> shape;
      if (v.size() != 1) shape = {static_cast<int64_t>(v.size())};
      p.tensors.push_back(make_f32_tensor(kv_scale_tensor_name(p.prefix, l, s, o.naming), shape, v));
    };
    add(ScaleStream::k, L[l].k.values);
    add(ScaleStream::v, L[l].v.values);
    if (o.write_q_scale) add(ScaleStream::q, L[l].q.values);
  }
  for (const auto& t : p.tensors)
    if (p.weight_map.count(t.name))
      throw InputError(fmt::format("{}: tensor {} already exists in {}", o.model_dir.string(), t.name,
                                   p.weight_map[t.name]));
  std::map<std::string, std::string> meta{{"format", "pt"},
                                          {"producer", "fp8kv " + version_string()},
                                          {"kv_scale_rule", p.report.rule},
                                          {"kv_cache_target", std::string(kv_dtype_name(p.report.target))}};
  p.shard_bytes = serialize_safetensors(p.tensors, meta);
  return p;
}

std::string index_text(const Plan& p, const std::string& shard_file) {
  nlohmann::ordered_json j = p.index;
  uint64_t total = p.weight_bytes;
  nlohmann::ordered_json wm = nlohmann::ordered_json::object();
  std::map<std::string, std::string> all = p.weight_map;
  for (const auto& t : p.tensors) {
    all[t.name] = shard_file;
    total += t.data.size();
  }
  for (const auto& [k, v] : all) wm[k] = v;  // sorted, as HF writes it
  if (!j.contains("metadata") || !j["metadata"].is_object()) j["metadata"] = nlohmann::ordered_json::object();
  j["metadata"]["total_size"] = total;
  j["weight_map"] = std::move(wm);
  return j.dump(2) + "\n";
}

std::string quant_config_text(const fs::path& existing) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  std::error_code ec;
  if (fs::is_regular_file(existing, ec)) {
    j = nlohmann::ordered_json::parse(read_json_text(existing), nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw InputError(fmt::format("{}: invalid JSON", existing.string()));
  } else {
    j["producer"] = {{"name", "fp8kv"}, {"version", version_string()}};
  }
  if (!j.contains("quantization") || !j["quantization"].is_object()) {
    j["quantization"] = nlohmann::ordered_json::object();
    j["quantization"]["quant_algo"] = nullptr;  // weights are not quantized by this
  }
  j["quantization"]["kv_cache_quant_algo"] = "FP8";
  return j.dump(4) + "\n";
}

// Reads the written scales back through the loader and compares bit for bit.
void verify(const fs::path& dir, const Plan& p, const InjectOptions& o) {
  const auto ck = Checkpoint::open(dir);
  const KvScales got = load_kv_scales(*ck, p.shape);
  for (const int l : p.shape.kv_layers()) {
    const auto& want = p.report.scales.layers[l];
    const auto& have = got.layers[l];
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (f32_bits(a[i]) != f32_bits(b[i])) return false;
      return true;
    };
    if (!have.k.from_checkpoint || !same(want.k.values, have.k.values) || !have.v.from_checkpoint ||
        !same(want.v.values, have.v.values) || (o.write_q_scale && !same(want.q.values, have.q.values)))
      throw std::runtime_error(fmt::format("inject: read-back of {} does not match the report at layer {}", dir.string(), l));
  }
}

void write_sums(const fs::path& dir) { atomic_write_file(dir / kSumsName, sha256sums_manifest(dir)); }

// Removes scale shards the live index does not reference and our temp files.
void collect_garbage(const fs::path& dir, const std::set<std::string>& live) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if ((is_scale_shard_name(f) && !live.count(f)) || is_our_temp_name(f)) fs::remove(e.path());
  }
}

InjectResult inject_in_place(const InjectOptions& o, Plan& p) {
  const fs::path& dir = o.model_dir;
  DirLock lock(dir);
  collect_garbage(dir, p.live_files);
  const std::string content = view_bytes(p.shard_bytes);

  // 1. fresh shard
  std::string fresh;
  do fresh = fmt::format("kv_cache_scales.{}.safetensors", rand_hex8());
  while (fs::exists(dir / fresh));
  atomic_write_file(dir / fresh, content);
  slow(o.slow_ms);
  // 2. commit: the index points at the fresh shard
  atomic_write_file(dir / kIndexName, index_text(p, fresh));
  slow(o.slow_ms);
  // 3. the final name (no live index refers to it now)
  atomic_write_file(dir / kScalesName, content);
  slow(o.slow_ms);
  // 4. the index points at the final name
  atomic_write_file(dir / kIndexName, index_text(p, kScalesName));
  slow(o.slow_ms);
  // 5. garbage
  collect_garbage(dir, {kScalesName});
  fsync_dir(dir);
  slow(o.slow_ms);
  verify(dir, p, o);
  // 6. declaration, manifest
  if (o.declare_kv_scheme) {
    atomic_write_file(dir / kQuantConfigName, quant_config_text(dir / kQuantConfigName));
    slow(o.slow_ms);
  }
  write_sums(dir);

  InjectResult r;
  r.dir = dir;
  r.scales_file = kScalesName;
  for (const auto& t : p.tensors) r.tensors.push_back(t.name);
  r.created_index = p.created_index;
  return r;
}

// Hard link (or copy) every file of src into dst, except those inject writes.
void mirror(const fs::path& src, const fs::path& dst, bool top, bool declare, bool& hardlinked) {
  fs::create_directory(dst);
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string f = e.path().filename().string();
    if (top && (f == kIndexName || f == kSumsName || is_scale_shard_name(f) || is_our_temp_name(f) ||
                (declare && f == kQuantConfigName)))
      continue;
    const fs::path target = fs::canonical(e.path());  // dereference symlinks (HF cache blobs)
    if (fs::is_directory(target)) {
      mirror(target, dst / f, false, declare, hardlinked);
      continue;
    }
    if (!fs::is_regular_file(target)) continue;
    std::error_code ec;
    fs::create_hard_link(target, dst / f, ec);
    if (!ec) {
      hardlinked = true;
      continue;
    }
    fs::copy_file(target, dst / f);
    fsync_file(dst / f);
  }
  fsync_dir(dst);
}

InjectResult inject_to_output(const InjectOptions& o, Plan& p) {
  const fs::path out = fs::absolute(*o.output_dir).lexically_normal();
  const fs::path parent = out.parent_path();
  // The new checkpoint is built beside `out`: the nearest existing ancestor
  // must be a writable directory. Refuse here, naming --output, rather than
  // fail inside the filesystem calls below.
  fs::path existing = parent;
  std::error_code ec;
  while (!existing.empty() && !fs::exists(existing, ec)) existing = existing.parent_path();
  if (!existing.empty() && !fs::is_directory(existing, ec))
    throw InputError(fmt::format("--output {}: {} is not a directory", o.output_dir->string(), existing.string()));
  if (!existing.empty()) check_writable_dir(existing, o.output_dir->string(), "--output");
  fs::create_directories(parent, ec);
  if (ec)
    throw InputError(fmt::format("--output {}: cannot create {}: {}", o.output_dir->string(), parent.string(),
                                 ec.message()));
  const fs::path tmp = parent / fmt::format(".{}.fp8kv-tmp.{}", out.filename().string(), rand_hex8());
  InjectResult r;
  try {
    mirror(o.model_dir, tmp, true, o.declare_kv_scheme, r.hardlinked);
    atomic_write_file(tmp / kScalesName, view_bytes(p.shard_bytes));
    atomic_write_file(tmp / kIndexName, index_text(p, kScalesName));
    if (o.declare_kv_scheme)
      atomic_write_file(tmp / kQuantConfigName, quant_config_text(o.model_dir / kQuantConfigName));
    slow(o.slow_ms);
    verify(tmp, p, o);
    write_sums(tmp);
    fsync_dir(tmp);
    slow(o.slow_ms);
    // rename(2) also replaces an empty directory.
    if (::rename(tmp.c_str(), out.c_str()) != 0)
      throw InputError(fmt::format("{}: cannot move the new checkpoint into place", out.string()));
    fsync_dir(parent);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    // e.g. a read-only file system or a full disk under --output.
    throw InputError(fmt::format("--output {}: {}", o.output_dir->string(), e.what()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  r.dir = out;
  r.scales_file = kScalesName;
  for (const auto& t : p.tensors) r.tensors.push_back(t.name);
  r.created_index = p.created_index;
  return r;
}

}  // namespace

bool is_scale_shard_name(const std::string& f) {
  if (f == kScalesName) return true;
  const std::string head = "kv_cache_scales.", tail = ".safetensors";
  if (f.size() <= head.size() + tail.size() || f.compare(0, head.size(), head) != 0 ||
      f.compare(f.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  const std::string mid = f.substr(head.size(), f.size() - head.size() - tail.size());
  return std::all_of(mid.begin(), mid.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string sha256sums_manifest(const fs::path& dir) {
  std::vector<std::string> names;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink);
       it != fs::recursive_directory_iterator(); ++it) {
    if (!fs::is_regular_file(it->path())) continue;  // follows symlinks
    const std::string rel = fs::relative(it->path(), dir).generic_string();
    if (rel == kSumsName || is_our_temp_name(it->path().filename().string())) continue;
    names.push_back(rel);
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += sha256_file_hex(dir / n) + "  " + n + "\n";
  return out;
}

InjectResult inject_kv_scales(const InjectOptions& o, const nlohmann::json& report) {
  std::error_code ec;
  if (!fs::is_directory(o.model_dir, ec))
    throw InputError(fmt::format("{}: not a directory (expected a checkpoint directory)", o.model_dir.string()));
  if (o.output_dir) {
    const fs::path& out = *o.output_dir;
    if (fs::exists(out, ec)) {
      if (!fs::is_directory(out, ec) || !fs::is_empty(out, ec))
        throw InputError(fmt::format("{}: --output exists and is not an empty directory", out.string()));
      if (fs::equivalent(out, o.model_dir, ec))
        throw InputError(fmt::format("{}: --output is the model directory (use --in-place)", out.string()));
    }
    const fs::path a = fs::weakly_canonical(o.model_dir), b = fs::weakly_canonical(out);
    auto rel = b.lexically_relative(a);
    if (!rel.empty() && rel.native().rfind("..", 0) != 0)
      throw InputError(fmt::format("{}: --output must not be inside the model directory {}", out.string(),
                                   o.model_dir.string()));
  }
  Plan p = make_plan(o, report);  // every check happens here, before any write
  return o.output_dir ? inject_to_output(o, p) : inject_in_place(o, p);
}

}  // namespace fp8kv
