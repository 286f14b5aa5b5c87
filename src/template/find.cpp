// Locating a model's chat template (docs/chat_templates.md).
#include <fmt/format.h>

#include "io/fs_util.h"
#include "template/chat_template.h"

namespace fp8kv::tmpl {

std::optional<ChatTemplateSource> find_chat_template(const std::filesystem::path& model_dir,
                                                     const std::filesystem::path& override_file) {
  namespace fs = std::filesystem;
  if (!override_file.empty()) {
    const std::string kind = path_kind(override_file);
    if (kind != "a regular file")
      throw InputError(fmt::format("--chat-template {}: {}, expected a file", override_file.string(),
                                   kind == "missing" ? "no such file" : "is " + kind));
    return ChatTemplateSource{read_file(override_file), override_file.string()};
  }
  // Optional files: absent is fine, present but not a file (a FIFO, a
  // directory) is refused, never skipped.
  fs::path jinja = model_dir / "chat_template.jinja";
  if (optional_file(jinja)) return ChatTemplateSource{read_file(jinja), jinja.string()};
  fs::path cfg = model_dir / "tokenizer_config.json";
  if (!optional_file(cfg)) return std::nullopt;
  const nlohmann::json j = read_json_file(cfg);
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return std::nullopt;
  const auto& t = j["chat_template"];
  std::string origin = cfg.string() + ": chat_template";
  if (t.is_string()) return ChatTemplateSource{t.get<std::string>(), origin};
  if (t.is_array()) {
    std::vector<std::string> names;
    for (const auto& e : t) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
          !e["template"].is_string())
        throw InputError(fmt::format("{}: chat_template list entries must be {{\"name\", \"template\"}} strings",
                                     cfg.string()));
      names.push_back(e["name"].get<std::string>());
      if (names.back() == "default")
        return ChatTemplateSource{e["template"].get<std::string>(), origin + "[default]"};
    }
    throw InputError(fmt::format("{}: chat_template lists {} named templates but none named \"default\" ({})",
                                 cfg.string(), names.size(), fmt::format("{}", fmt::join(names, ", "))));
  }
  throw InputError(fmt::format("{}: chat_template must be a string or a list of {{name, template}}", cfg.string()));
}

}  // namespace fp8kv::tmpl
