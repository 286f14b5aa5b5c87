#pragma once
#include <string>
namespace fp8kv {
// "0.1.0 (abc123def456)": goes into every JSON result as "fp8kv_version".
// Defined in version.cpp, the only source compiled with the commit (so a new
// commit recompiles one file, not the tree).
std::string version_string();
}  // namespace fp8kv
