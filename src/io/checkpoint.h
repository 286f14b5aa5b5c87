// A Hugging Face checkpoint directory: single model.safetensors or shards
// listed in model.safetensors.index.json (authoritative when present; it may
// list shards beside model.safetensors).
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace fp8kv {

class Checkpoint {
 public:
  // Throws InputError naming the file when the directory is not loadable.
  static std::unique_ptr<Checkpoint> open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  // Files actually used (in index order / the single file).
  const std::vector<std::filesystem::path>& files() const { return file_paths_; }
  bool has(const std::string& name) const;
  // Throws InputError "missing tensor <name> (<dir>)" when absent.
  TensorView view(const std::string& name) const;
  std::vector<float> to_f32(const std::string& name) const;
  const TensorInfo* find(const std::string& name) const;
  std::vector<std::string> tensor_names() const;  // sorted
  // The file holding `name` (nullptr when absent).
  const std::filesystem::path* file_of(const std::string& name) const;
  // True when the directory has model.safetensors.index.json.
  bool has_index() const { return has_index_; }
  uint64_t total_tensor_bytes() const;

 private:
  std::filesystem::path dir_;
  bool has_index_ = false;
  std::vector<std::filesystem::path> file_paths_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> file index
};

}  // namespace fp8kv
