// fs_util (atomic replace, sha256) and Checkpoint (single file, sharded
// index authoritative over a stray model.safetensors, error cases).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "../common/temp_dir.h"
#include "io/checkpoint.h"
#include "io/fs_util.h"

using namespace fp8kv;
namespace fs = std::filesystem;

namespace {

std::span<const std::byte> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

}  // namespace

TEST(FsUtil, Sha256KnownVectors) {
  // FIPS 180-2 test vectors.
  EXPECT_EQ(sha256_hex(bytes_of("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(bytes_of("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(FsUtil, Sha256FileMatchesInMemoryAcrossChunks) {
  const test_util::TempDir tmp("fp8kv_test_fs_sha_");
  const fs::path& dir = tmp.path();
  std::string big(3 * (1 << 20) + 12345, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  write_text(dir / "big.bin", big);
  EXPECT_EQ(sha256_file_hex(dir / "big.bin"), sha256_hex(bytes_of(big)));
  // One million 'a' (FIPS vector), crossing the 1 MiB read chunk boundary.
  write_text(dir / "a.bin", std::string(1000000, 'a'));
  EXPECT_EQ(sha256_file_hex(dir / "a.bin"), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_NE(test_util::input_error_of([&] { sha256_file_hex(dir / "none"); }).find("none"), std::string::npos);
  fs::remove_all(dir);
}

TEST(FsUtil, AtomicWriteReplacesWithoutTouchingHardLinks) {
  const test_util::TempDir tmp("fp8kv_test_fs_atomic_");
  const fs::path& dir = tmp.path();
  const fs::path p = dir / "index.json";
  atomic_write_file(p, "old");
  EXPECT_EQ(read_file(p), "old");
  fs::create_hard_link(p, dir / "link.json");
  atomic_write_file(p, "new content");
  EXPECT_EQ(read_file(p), "new content");
  EXPECT_EQ(read_file(dir / "link.json"), "old");  // the other name keeps the old inode
  // No temporary files left behind.
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  EXPECT_EQ(n, 2);
  // Relative path in the current directory works (parent "." is fsynced).
  const auto cwd = fs::current_path();
  fs::current_path(dir);
  atomic_write_file("rel.txt", "r");
  fs::current_path(cwd);
  EXPECT_EQ(read_file(dir / "rel.txt"), "r");
  // Failure names the path and leaves nothing.
  const std::string err = test_util::input_error_of([&] { atomic_write_file(dir / "missing_dir" / "f", "x"); });
  EXPECT_NE(err.find("missing_dir"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir / "missing_dir"));
  fs::remove_all(dir);
}

TEST(FsUtil, ReadFileErrorsNamePath) {
  const test_util::TempDir tmp("fp8kv_test_fs_read_");
  const fs::path& dir = tmp.path();
  EXPECT_NE(test_util::input_error_of([&] { read_file(dir / "nope.json"); }).find("nope.json"), std::string::npos);
  EXPECT_NE(test_util::input_error_of([&] { read_file(dir); }).find("directory"), std::string::npos);
  write_text(dir / "bin", std::string("a\0b", 3));
  EXPECT_EQ(read_file(dir / "bin"), std::string("a\0b", 3));
  fs::remove_all(dir);
}

TEST(Checkpoint, SingleFile) {
  const test_util::TempDir tmp("fp8kv_test_fs_single_");
  const fs::path& dir = tmp.path();
  write_safetensors(dir / "model.safetensors", {make_f32_tensor("w", {2}, std::vector<float>{1.f, 2.f}),
                                                make_f32_tensor("b", {1}, std::vector<float>{3.f})});
  auto c = Checkpoint::open(dir);
  EXPECT_FALSE(c->has_index());
  EXPECT_EQ(c->files().size(), 1u);
  EXPECT_EQ(c->tensor_names(), (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(c->to_f32("w"), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(c->total_tensor_bytes(), 12u);
  EXPECT_EQ(*c->file_of("b"), dir / "model.safetensors");
  const std::string err = test_util::input_error_of([&] { c->view("zz"); });
  EXPECT_NE(err.find("missing tensor zz"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(Checkpoint, IndexIsAuthoritativeOverStrayModelFile) {
  const test_util::TempDir tmp("fp8kv_test_fs_index_");
  const fs::path& dir = tmp.path();
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {make_f32_tensor("a", {1}, std::vector<float>{1.f}),
                     make_f32_tensor("unlisted", {1}, std::vector<float>{9.f})});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {make_f32_tensor("b", {1}, std::vector<float>{2.f})});
  // A stale single file beside the shards, with a different "a".
  write_safetensors(dir / "model.safetensors", {make_f32_tensor("a", {1}, std::vector<float>{-1.f}),
                                                make_f32_tensor("stale", {1}, std::vector<float>{0.f})});
  nlohmann::json idx = {{"metadata", {{"total_size", 12}}},
                        {"weight_map",
                         {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}};
  write_text(dir / "model.safetensors.index.json", idx.dump());
  auto c = Checkpoint::open(dir);
  EXPECT_TRUE(c->has_index());
  EXPECT_EQ(c->files().size(), 2u);
  EXPECT_EQ(c->tensor_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c->to_f32("a"), (std::vector<float>{1.f}));
  EXPECT_EQ(c->to_f32("b"), (std::vector<float>{2.f}));
  EXPECT_FALSE(c->has("stale"));
  EXPECT_FALSE(c->has("unlisted"));

  // Index naming a tensor its shard lacks.
  idx["weight_map"]["c"] = "model-00002-of-00002.safetensors";
  write_text(dir / "model.safetensors.index.json", idx.dump());
  std::string err = test_util::input_error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(err.find("'c'"), std::string::npos) << err;
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
  // Index naming a missing shard.
  idx["weight_map"]["c"] = "model-00003-of-00003.safetensors";
  write_text(dir / "model.safetensors.index.json", idx.dump());
  err = test_util::input_error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(err.find("model-00003-of-00003.safetensors"), std::string::npos) << err;
  // Path escaping the directory.
  idx["weight_map"]["c"] = "../x.safetensors";
  write_text(dir / "model.safetensors.index.json", idx.dump());
  err = test_util::input_error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(err.find("../x.safetensors"), std::string::npos) << err;
  // Invalid index JSON / missing weight_map.
  write_text(dir / "model.safetensors.index.json", "{");
  EXPECT_NE(test_util::input_error_of([&] { Checkpoint::open(dir); }).find("model.safetensors.index.json"), std::string::npos);
  write_text(dir / "model.safetensors.index.json", "{}");
  EXPECT_NE(test_util::input_error_of([&] { Checkpoint::open(dir); }).find("weight_map"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Checkpoint, MissingOrMalformed) {
  const test_util::TempDir tmp("fp8kv_test_fs_bad_");
  const fs::path& dir = tmp.path();
  std::string err = test_util::input_error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(err.find("no model.safetensors"), std::string::npos) << err;
  EXPECT_NE(test_util::input_error_of([&] { Checkpoint::open(dir / "nope"); }).find("not a directory"), std::string::npos);
  write_text(dir / "model.safetensors", "garbage!");
  err = test_util::input_error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(err.find((dir / "model.safetensors").string()), std::string::npos) << err;
  fs::remove_all(dir);
}
