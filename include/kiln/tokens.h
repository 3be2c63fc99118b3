// kiln — token data for language models: text files tokenized once and
// cached, nanoGPT's and llm.c's .bin token files, and blocks of a token
// stream packed to a sequence length as a data set.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data.h"
#include "kiln/tokenizer.h"

namespace kiln::data {

// A .bin token file: llm.c's (a header of 256 int32, magic 20240520,
// version 1, the token count, then uint16 ids) or nanoGPT's (uint16 ids, no
// header). Ids at or above `vocab_size` (> 0) are an error naming the file,
// the position and the id; so are a truncated file and an empty one.
std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab_size = 0);
// Writes ids (each below 65536) as llm.c's .bin file, atomically (a
// temporary file, then a rename).
void write_token_file(const std::string& path, const std::vector<int32_t>& ids);

// Where tokenized text is cached: $KILN_TOKEN_CACHE, else
// ${XDG_CACHE_HOME:-~/.cache}/kiln/tokens.
std::string token_cache_dir();

struct TextTokens {
  std::vector<int32_t> ids;
  int64_t files = 0;       // text files read
  int64_t bytes = 0;       // their size
  bool cached = false;     // read from the cache, not tokenized
  std::string cache_file;  // where the ids are kept ("" when not cached)
};
// The ids of a UTF-8 text file, or of a folder's .txt files (found
// recursively, in sorted order), each document followed by `separator` (the
// tokenizer's <|endoftext|>, as GPT-2 was trained; -1: none). Tokenized once:
// the ids are cached in `cache_dir` ("" for no cache) under a key of the
// files' bytes and the tokenizer's fingerprint. An empty file, a folder
// without .txt files and invalid UTF-8 are errors naming the file.
TextTokens tokenize_text(const std::string& path, const Tokenizer& tokenizer, int32_t separator,
                         const std::string& cache_dir);

// Consecutive blocks of `seq_len` ids of a token stream (HuggingFace's
// run_clm packing: the text concatenated and cut into blocks, the last
// partial block dropped), from ids [begin, end) of the stream. Each sample
// is one block of i32 ids; a language model's labels are the block itself.
class TokenBlocks final : public Dataset {
 public:
  TokenBlocks(std::shared_ptr<const std::vector<int32_t>> ids, int64_t seq_len, int64_t begin = 0,
              int64_t end = -1);
  int64_t size() const override { return (end_ - begin_) / seq_len_; }
  Shape image_shape() const override { return {seq_len_}; }
  DType sample_dtype() const override { return DType::i32; }
  void get_tokens(int64_t index, int32_t* tokens) const override;
  void get(int64_t index, float* image, int32_t* label) const override;
  int64_t seq_len() const { return seq_len_; }

 private:
  std::shared_ptr<const std::vector<int32_t>> ids_;
  int64_t seq_len_, begin_, end_;
};

}  // namespace kiln::data
