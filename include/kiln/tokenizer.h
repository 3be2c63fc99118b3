// kiln — GPT-2's tokenizer: byte-level BPE as HuggingFace tokenizers runs it
// (the ByteLevel pre-tokenizer, the BPE model and the ByteLevel decoder),
// read from a checkpoint's tokenizer.json or from vocab.json + merges.txt.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

class Tokenizer {
 public:
  // tokenizer.json (tokenizers' format): a BPE model, a ByteLevel
  // pre-tokenizer, no normalizer, and its added tokens. A file of another
  // kind (a WordPiece or Unigram model, a normalizer, a template
  // post-processor) is an error naming the file and the field.
  static Tokenizer from_json_file(const std::string& path);
  // The same from the file's text; errors name `origin`.
  static Tokenizer from_json(std::string_view text, const std::string& origin);
  // GPT-2's older pair of files: vocab.json (token -> id) and merges.txt
  // (one "a b" merge per line by priority, an optional "#version" line
  // first). `special` names added tokens already in the vocabulary
  // ("<|endoftext|>", GPT-2's one), matched in text before BPE.
  static Tokenizer from_vocab_and_merges(const std::string& vocab_path,
                                         const std::string& merges_path,
                                         const std::vector<std::string>& special = {
                                             "<|endoftext|>"});
  // A checkpoint folder: its tokenizer.json, else its vocab.json and
  // merges.txt; neither is an error naming the folder.
  static Tokenizer from_folder(const std::string& dir);

  // The ids of UTF-8 text (invalid UTF-8 is an error naming the byte). Added
  // tokens in the text are matched first, as tokenizers does.
  std::vector<int32_t> encode(std::string_view text) const;
  // The text of ids (an id outside the vocabulary is an error naming it).
  // Bytes that do not form UTF-8 on their own (a token ending mid-character)
  // come out as they are.
  std::string decode(const std::vector<int32_t>& ids) const;

  // The number of ids (the largest id + 1).
  int64_t vocab_size() const;
  // The id of a token ("<|endoftext|>"), or none.
  std::optional<int32_t> token_id(std::string_view token) const;
  // Where it was read from.
  const std::string& origin() const;
  // A hash of what it computes (the vocabulary, the merges, the added tokens
  // and the options): equal for tokenizers that give the same ids (a cache
  // of tokenized text is keyed by it).
  uint64_t fingerprint() const;

 private:
  Tokenizer() = default;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln::data
