// An HTTP error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}
// (docs/server.md lists which status means what).
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace fp8kv::server {

struct ApiError : std::runtime_error {
  int status;
  std::string type;
  std::string param;  // the request field at fault; empty: none
  std::string code;   // empty: null
  ApiError(int status_, std::string message, std::string param_ = {}, std::string type_ = {}, std::string code_ = {})
      : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)),
        code(std::move(code_)) {
    if (type.empty()) type = default_type(status);
  }
  static std::string default_type(int status) {
    switch (status) {
      case 400: return "invalid_request_error";
      case 401: return "authentication_error";
      case 404: return "not_found_error";
      case 413: return "invalid_request_error";
      case 503: return "service_unavailable_error";
      default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
  }
  nlohmann::json body() const {
    nlohmann::json e = {{"message", what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty()) e["code"] = code;
    else e["code"] = status;
    return {{"error", e}};
  }
};

// A 400 naming the field.
inline ApiError bad_field(const std::string& field, const std::string& message) {
  return ApiError(400, field + ": " + message, field);
}

}  // namespace fp8kv::server
