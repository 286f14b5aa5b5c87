// Files named on the command line: read one an option names, check that an
// output path can be written before any computation, parse integer lists.
// Every error names the option and the path (docs/design.md "Command line",
// "Exit codes and errors"): InputError, exit 2.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace fp8kv {

// The bytes of `path`, given to `option` (e.g. "--text-file"). Refuses a
// directory, a missing or unreadable file: "--text-file d: is a directory,
// expected a file".
std::string read_option_file(const std::string& path, std::string_view option);
// read_option_file of a JSON file, its nesting depth checked (io/json_limits.h).
std::string read_option_json(const std::string& path, std::string_view option);

// Refuses, before anything is computed, an output path that cannot be
// written: empty, an existing directory, a parent that is missing, not a
// directory or not writable (probed by creating and removing an empty file),
// an existing path that is not a regular file (/dev/null, a FIFO). Leaves
// nothing behind.
void check_output_file(const std::string& path, std::string_view option);

// `dir` (where `option`'s `path` will be written) must exist, be a directory
// and be writable, probed by creating and removing an empty file: access()
// says yes to root everywhere, also in /proc. "--output p: cannot write in d: ...".
void check_writable_dir(const std::filesystem::path& dir, const std::string& path, std::string_view option);

// Refuses an output *directory* that could not be created: its parent must
// exist, be a directory and be writable (probed as above). Leaves nothing behind.
void check_output_dir_parent(const std::string& path, std::string_view option);

// "1,2,3" (spaces around items allowed) -> {1,2,3}. Every item an integer in
// [min, max]; empty items refused. Errors: "--lengths '1,x': 'x' is not an
// integer in [0, 1073741824]".
std::vector<int64_t> parse_int_list(std::string_view csv, std::string_view option, int64_t min, int64_t max);

}  // namespace fp8kv
