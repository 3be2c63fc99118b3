// Token data: llm.c's and nanoGPT's .bin files read and written, text
// tokenized once and then read from the cache, blocks packed to a sequence
// length through the loader, and the errors for bad files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "kiln/tokens.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test_util::error_of;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("kiln-tokens-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& leaf) const { return (path / leaf).string(); }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

const std::string kTokenizer = std::string(KILN_FIXTURES_DIR) + "/tokenizer_golden/tokenizer.json";

TEST(Tokens, LlmcAndNanoGptFilesReadBack) {
  TempDir d;
  const std::vector<int32_t> ids{0, 1, 50256, 65535, 7, 300};
  data::write_token_file(d / "llmc.bin", ids);
  EXPECT_EQ(fs::file_size(d / "llmc.bin"), 1024u + 2 * ids.size());
  EXPECT_EQ(data::read_token_file(d / "llmc.bin"), ids);
  // nanoGPT's: uint16 little-endian, no header.
  std::string raw;
  for (int32_t id : ids) raw += {static_cast<char>(id & 0xff), static_cast<char>(id >> 8)};
  write_bytes(d / "nano.bin", raw);
  EXPECT_EQ(data::read_token_file(d / "nano.bin"), ids);
}

TEST(Tokens, BadTokenFilesGetClearErrors) {
  TempDir d;
  data::write_token_file(d / "a.bin", {1, 2, 50257});
  EXPECT_NE(error_of([&] {
              data::read_token_file(d / "a.bin", 50257);
            }).find("a.bin: token 2 is 50257, outside the model's vocabulary [0, 50257)"),
            std::string::npos);
  write_bytes(d / "empty.bin", "");
  EXPECT_NE(error_of([&] { data::read_token_file(d / "empty.bin"); }).find("empty token file"),
            std::string::npos);
  write_bytes(d / "odd.bin", "abc");
  EXPECT_NE(error_of([&] { data::read_token_file(d / "odd.bin"); }).find("odd size"),
            std::string::npos);
  // llm.c's header with fewer tokens than it says.
  data::write_token_file(d / "t.bin", {1, 2, 3, 4});
  fs::resize_file(d / "t.bin", 1024 + 4);
  EXPECT_NE(error_of([&] {
              data::read_token_file(d / "t.bin");
            }).find("the header says 4 tokens, the file holds 2 (truncated?)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { data::read_token_file(d / "missing.bin"); }).find("no such token file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { data::write_token_file(d / "w.bin", {70000}); }).find("does not fit"),
            std::string::npos);
}

TEST(Tokens, TextIsTokenizedOnceThenReadFromTheCache) {
  TempDir d;
  const data::Tokenizer tok = data::Tokenizer::from_json_file(kTokenizer);
  fs::create_directories(d.path / "texts" / "sub");
  write_bytes(d / "texts/b.txt", "Everyone is permitted to copy.");
  write_bytes(d / "texts/sub/a.txt", "the GNU General Public License");
  write_bytes(d / "texts/notes.md", "not read");
  const std::string cache = d / "cache";
  const data::TextTokens first = data::tokenize_text(d / "texts", tok, 0, cache);
  EXPECT_FALSE(first.cached);
  EXPECT_EQ(first.files, 2);
  // The files in sorted order ("b.txt" < "sub/a.txt"), each ended by the separator.
  std::vector<int32_t> want = tok.encode("Everyone is permitted to copy.");
  want.push_back(0);
  const std::vector<int32_t> a = tok.encode("the GNU General Public License");
  want.insert(want.end(), a.begin(), a.end());
  want.push_back(0);
  EXPECT_EQ(first.ids, want);
  ASSERT_TRUE(fs::exists(first.cache_file));
  const data::TextTokens second = data::tokenize_text(d / "texts", tok, 0, cache);
  EXPECT_TRUE(second.cached);
  EXPECT_EQ(second.ids, want);
  // Changed text, another separator: tokenized anew.
  EXPECT_FALSE(data::tokenize_text(d / "texts", tok, -1, cache).cached);
  write_bytes(d / "texts/b.txt", "Everyone is permitted to copy!");
  EXPECT_FALSE(data::tokenize_text(d / "texts", tok, 0, cache).cached);
  // No cache at all.
  EXPECT_TRUE(data::tokenize_text(d / "texts/b.txt", tok, -1, "").cache_file.empty());
}

TEST(Tokens, BadTextGetsClearErrors) {
  TempDir d;
  const data::Tokenizer tok = data::Tokenizer::from_json_file(kTokenizer);
  write_bytes(d / "empty.txt", "");
  EXPECT_NE(error_of([&] {
              data::tokenize_text(d / "empty.txt", tok, 0, "");
            }).find("empty.txt: an empty text file: nothing to train on"),
            std::string::npos);
  fs::create_directories(d.path / "none");
  EXPECT_NE(error_of([&] {
              data::tokenize_text(d / "none", tok, 0, "");
            }).find("a folder without .txt files"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              data::tokenize_text(d / "nothing", tok, 0, "");
            }).find("no such file or folder"),
            std::string::npos);
  write_bytes(d / "bad.txt", "caf\xe9");
  EXPECT_NE(error_of([&] { data::tokenize_text(d / "bad.txt", tok, 0, ""); }).find("bad.txt"),
            std::string::npos);
}

// Blocks of seq_len consecutive ids, the last partial one dropped; through
// the loader as i32 [B, T] with the labels the ids themselves.
TEST(Tokens, BlocksPackTheStreamAndLoadAsTokens) {
  auto ids = std::make_shared<std::vector<int32_t>>();
  for (int32_t i = 0; i < 23; ++i) ids->push_back(i);
  auto blocks = std::make_shared<data::TokenBlocks>(ids, 5);
  EXPECT_EQ(blocks->size(), 4);
  EXPECT_EQ(blocks->image_shape(), (Shape{5}));
  std::vector<int32_t> b(5);
  blocks->get_tokens(3, b.data());
  EXPECT_EQ(b, (std::vector<int32_t>{15, 16, 17, 18, 19}));
  EXPECT_NE(error_of([&] { data::TokenBlocks(ids, 5, 20); }).find("not one block of --seq-len 5"),
            std::string::npos);
  const data::TokenBlocks middle(ids, 4, 2, 11);
  EXPECT_EQ(middle.size(), 2);
  middle.get_tokens(1, b.data());
  EXPECT_EQ(std::vector<int32_t>(b.begin(), b.begin() + 4), (std::vector<int32_t>{6, 7, 8, 9}));
  data::Loader loader(blocks, {.batch_size = 2, .workers = 0});
  const data::Batch batch = loader.next();
  EXPECT_EQ(batch.images.dtype(), DType::i32);
  EXPECT_EQ(batch.images.shape(), (Shape{2, 5}));
  EXPECT_EQ(batch.images.to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(batch.labels.to_vector<int32_t>(), batch.images.to_vector<int32_t>());
}

}  // namespace
}  // namespace kiln
