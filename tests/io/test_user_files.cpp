// Files named on the command line (io/user_files.h): directories, missing and
// unreadable inputs, unwritable outputs and integer lists are refused with an
// InputError naming the option and the path (issue 15 items 3, 7, 16).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "io/errors.h"
#include "io/user_files.h"
#include "../common/errors.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace fp8kv;

namespace {
void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
}  // namespace

TEST(UserFiles, ReadOptionFileRefusesDirectoriesAndMissingFiles) {
  test_util::TempDir d;
  const std::string dir = d.path().string();
  EXPECT_EQ(test_util::input_error_of([&] { read_option_file(dir, "--text-file"); }),
            "--text-file " + dir + ": is a directory, expected a file");
  EXPECT_EQ(test_util::input_error_of([&] { read_option_file(dir + "/nope", "--corpus"); }), "--corpus " + dir + "/nope: no such file");
  EXPECT_EQ(test_util::input_error_of([&] { read_option_file("", "--haystack"); }), "--haystack: empty path");
  write(d.path() / "a.txt", "hello");
  EXPECT_EQ(read_option_file((d.path() / "a.txt").string(), "--text-file"), "hello");
  write(d.path() / "empty.txt", "");
  EXPECT_EQ(read_option_file((d.path() / "empty.txt").string(), "--text-file"), "");
}

TEST(UserFiles, ReadOptionFileRefusesUnreadable) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  test_util::TempDir d;
  const fs::path p = d.path() / "secret.txt";
  write(p, "x");
  ::chmod(p.c_str(), 0);
  EXPECT_NE(test_util::input_error_of([&] { read_option_file(p.string(), "--text-file"); }).find("--text-file " + p.string() + ": cannot read"),
            std::string::npos);
}

TEST(UserFiles, CheckOutputFile) {
  test_util::TempDir d;
  const std::string dir = d.path().string();
  check_output_file(dir + "/out.json", "--output");  // fine, writes nothing
  EXPECT_FALSE(fs::exists(d.path() / "out.json"));
  EXPECT_EQ(test_util::input_error_of([&] { check_output_file(dir, "--html"); }), "--html " + dir + ": is a directory, expected a file path");
  EXPECT_EQ(test_util::input_error_of([&] { check_output_file(dir + "/no/out.html", "--html"); }),
            "--html " + dir + "/no/out.html: directory " + dir + "/no does not exist");
  write(d.path() / "f", "x");
  EXPECT_EQ(test_util::input_error_of([&] { check_output_file(dir + "/f/out.json", "--output"); }),
            "--output " + dir + "/f/out.json: " + dir + "/f is not a directory");
  EXPECT_EQ(test_util::input_error_of([&] { check_output_file("", "--output"); }), "--output: empty path");
  // A bare file name is relative to the working directory.
  EXPECT_EQ(test_util::input_error_of([&] { check_output_file("report.json", "--output"); }), "(no error)");
}

TEST(UserFiles, CheckOutputRefusesReadOnlyDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into any directory";
  test_util::TempDir d;
  const fs::path ro = d.path() / "ro";
  fs::create_directory(ro);
  ::chmod(ro.c_str(), 0555);
  EXPECT_NE(test_util::input_error_of([&] { check_output_file((ro / "x.json").string(), "--html"); }).find("cannot write in " + ro.string()),
            std::string::npos);
  EXPECT_NE(test_util::input_error_of([&] { check_output_dir_parent((ro / "new").string(), "--output"); }).find("cannot write in"),
            std::string::npos);
  ::chmod(ro.c_str(), 0755);
}

TEST(UserFiles, CheckOutputDirParent) {
  test_util::TempDir d;
  const std::string dir = d.path().string();
  check_output_dir_parent(dir + "/new", "--output");
  check_output_dir_parent(dir + "/new/", "--output");
  EXPECT_EQ(test_util::input_error_of([&] { check_output_dir_parent(dir + "/a/b", "--output"); }),
            "--output " + dir + "/a/b: directory " + dir + "/a does not exist");
}

TEST(UserFiles, ParseIntList) {
  EXPECT_EQ(parse_int_list("1,2, 3 ", "--lengths", 0, 100), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(parse_int_list("0", "--depths", 0, 100), (std::vector<int64_t>{0}));
  EXPECT_EQ(test_util::input_error_of([&] { parse_int_list("1,,2", "--lengths", 0, 100); }), "--lengths '1,,2': '' is not an integer in [0, 100]");
  EXPECT_EQ(test_util::input_error_of([&] { parse_int_list("1,x", "--lengths", 0, 100); }), "--lengths '1,x': 'x' is not an integer in [0, 100]");
  EXPECT_EQ(test_util::input_error_of([&] { parse_int_list("101", "--depths", 0, 100); }), "--depths '101': '101' is not an integer in [0, 100]");
  EXPECT_EQ(test_util::input_error_of([&] { parse_int_list("-1", "--ids", 0, 100); }), "--ids '-1': '-1' is not an integer in [0, 100]");
  EXPECT_EQ(test_util::input_error_of([&] { parse_int_list("", "--ids", 0, 100); }), "--ids '': '' is not an integer in [0, 100]");
  EXPECT_EQ(test_util::input_error_of([&] { parse_int_list("1.5", "--ids", 0, 100); }), "--ids '1.5': '1.5' is not an integer in [0, 100]");
  EXPECT_EQ(test_util::input_error_of([&] { parse_int_list("99999999999999999999", "--ids", 0, 100); }),
            "--ids '99999999999999999999': '99999999999999999999' is not an integer in [0, 100]");
  EXPECT_EQ(parse_int_list("-5,5", "--x", -5, 5), (std::vector<int64_t>{-5, 5}));
}

// 2026-12-01 (docs/robustness.md): an output that is not a regular file would
// be replaced by the atomic rename (root could turn /dev/null into a file).
TEST(UserFiles, CheckOutputRefusesNonRegularFiles) {
  test_util::TempDir d;
  const fs::path fifo = d.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(test_util::input_error_of([&] { check_output_file(fifo.string(), "--output"); }),
            "--output " + fifo.string() + ": is not a regular file (a device, FIFO or socket); give a file path");
  EXPECT_NE(test_util::input_error_of([&] { check_output_file("/dev/null", "--html"); }).find("--html /dev/null: is not a regular file"),
            std::string::npos);
  // A symlink to a regular file is fine (the link itself is replaced).
  write(d.path() / "target.json", "{}");
  fs::create_symlink(d.path() / "target.json", d.path() / "link.json");
  EXPECT_EQ(test_util::input_error_of([&] { check_output_file((d.path() / "link.json").string(), "--output"); }), "(no error)");
  // The probe leaves nothing behind.
  check_output_file((d.path() / "new.json").string(), "--output");
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d.path())) ++n;
  EXPECT_EQ(n, 3u);  // fifo, target.json, link.json
}

// A FIFO with no writer would block open() forever; /dev/zero never ends.
TEST(UserFiles, ReadOptionFileRefusesFifoAndDevices) {
  test_util::TempDir d;
  const fs::path fifo = d.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(test_util::input_error_of([&] { read_option_file(fifo.string(), "--text-file"); }),
            "--text-file " + fifo.string() + ": is a FIFO, expected a file");
  EXPECT_EQ(test_util::input_error_of([&] { read_option_file("/dev/zero", "--corpus"); }),
            "--corpus /dev/zero: is a character device, expected a file");
}
