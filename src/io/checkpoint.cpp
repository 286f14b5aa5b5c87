#include "io/checkpoint.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/fs_util.h"

namespace fp8kv {

namespace fs = std::filesystem;

namespace {

// A shard name from the index must stay inside the checkpoint directory.
void check_shard_name(const std::string& file, const std::string& tensor, const fs::path& index) {
  const fs::path p(file);
  bool ok = !file.empty() && p.is_relative();
  for (const auto& part : p)
    if (part == "..") ok = false;
  if (!ok)
    throw InputError(fmt::format("{}: weight_map entry for tensor '{}' names file '{}' (expected a file name "
                                 "relative to the checkpoint directory)",
                                 index.string(), tensor, file));
}

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(fmt::format("{}: not a directory (expected a checkpoint directory)", dir.string()));
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->dir_ = dir;
  const fs::path index = dir / "model.safetensors.index.json";
  const fs::path single = dir / "model.safetensors";

  if (fs::exists(index, ec)) {
    c->has_index_ = true;
    // The index is authoritative: only the tensors it lists, from the files it names.
    nlohmann::json j = read_json_file(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw InputError(fmt::format("{}: missing object 'weight_map'", index.string()));
    std::map<std::string, size_t> file_idx;
    std::vector<std::pair<std::string, size_t>> entries;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw InputError(fmt::format("{}: weight_map entry for tensor '{}' must be a file name string",
                                     index.string(), it.key()));
      const std::string file = it.value().get<std::string>();
      check_shard_name(file, it.key(), index);
      auto [fi, inserted] = file_idx.emplace(file, c->file_paths_.size());
      if (inserted) c->file_paths_.push_back(dir / file);
      entries.emplace_back(it.key(), fi->second);
    }
    for (const auto& p : c->file_paths_) {
      if (!fs::is_regular_file(p, ec))
        throw InputError(fmt::format("{}: shard {} listed in the index does not exist", index.string(), p.string()));
      c->files_.push_back(SafetensorsFile::open(p));
    }
    for (const auto& [name, fi] : entries) {
      if (!c->files_[fi]->find(name))
        throw InputError(fmt::format("{}: tensor '{}' listed in {} is not in that file", c->file_paths_[fi].string(),
                                     name, index.string()));
      c->where_[name] = fi;
    }
  } else if (fs::exists(single, ec)) {
    c->file_paths_.push_back(single);
    c->files_.push_back(SafetensorsFile::open(single));
    for (const auto& t : c->files_[0]->tensors()) c->where_[t.name] = 0;
  } else {
    throw InputError(fmt::format("{}: no model.safetensors or model.safetensors.index.json", dir.string()));
  }
  return c;
}

bool Checkpoint::has(const std::string& name) const { return where_.count(name) != 0; }

const TensorInfo* Checkpoint::find(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second]->find(name);
}

TensorView Checkpoint::view(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw InputError(fmt::format("missing tensor {} ({})", name, dir_.string()));
  return files_[it->second]->view(name);
}

std::vector<float> Checkpoint::to_f32(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw InputError(fmt::format("missing tensor {} ({})", name, dir_.string()));
  return files_[it->second]->to_f32(name);
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> n;
  n.reserve(where_.size());
  for (const auto& [k, v] : where_) n.push_back(k);
  return n;  // std::map keeps them sorted
}

const fs::path* Checkpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : &file_paths_[it->second];
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [k, fi] : where_) total += files_[fi]->find(k)->nbytes();
  return total;
}

}  // namespace fp8kv
