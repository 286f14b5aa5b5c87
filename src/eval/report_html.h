// Self-contained HTML page for an `eval compare` report: summary table,
// inline SVG charts (dNLL as % PPL by position bucket per arm; KLD quantiles
// per arm on a log axis), per-document table. No scripts, no external files.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace fp8kv::eval {

std::string html_escape(const std::string& s);
// `report` is what run_compare returns (plus fp8kv_version).
std::string compare_report_html(const nlohmann::json& report);

}  // namespace fp8kv::eval
