// GPT-2's byte-level BPE tokenizer against HuggingFace tokenizers: the ids
// it gives for the GNU GPL version 2 (real English prose) and for hard cases,
// from a tokenizer trained on the GPL version 3 (tools/golden/
// make_tokenizer_golden.py), read as tokenizer.json and as vocab.json +
// merges.txt; decoding back; and the errors of bad files and bad text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "kiln/tokenizer.h"

namespace kiln::data {
namespace {

namespace fs = std::filesystem;
using test_util::error_of;

const std::string kDir = std::string(KILN_FIXTURES_DIR) + "/tokenizer_golden";

void expect_matches_tokenizers(const Tokenizer& tok, const std::string& form) {
  const nlohmann::json golden = test_util::json_fixture("tokenizer_golden/expected.json");
  EXPECT_EQ(tok.vocab_size(), golden["vocab_size"].get<int64_t>()) << form;
  ASSERT_GE(golden["cases"].size(), 10u);
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"].get<std::string>(), text = c["text"].get<std::string>();
    SCOPED_TRACE(form + ": " + name);
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "token " << i;
    EXPECT_EQ(tok.decode(got), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(got), text);  // byte-level BPE loses nothing
  }
}

TEST(Tokenizer, GivesTokenizersIdsForTheGpl2FromTokenizerJson) {
  const Tokenizer tok = Tokenizer::from_json_file(kDir + "/tokenizer.json");
  expect_matches_tokenizers(tok, "tokenizer.json");
  EXPECT_EQ(tok.token_id("<|endoftext|>"), 0);
  EXPECT_FALSE(tok.token_id("no such token").has_value());
}

TEST(Tokenizer, GivesTheSameIdsFromVocabAndMerges) {
  expect_matches_tokenizers(
      Tokenizer::from_vocab_and_merges(kDir + "/vocab.json", kDir + "/merges.txt"),
      "vocab.json + merges.txt");
}

// A folder with tokenizer.json is read from it; one with only the pair of
// files, from them (both give the same ids).
TEST(Tokenizer, AFolderIsReadFromWhatItHas) {
  const fs::path dir = fs::temp_directory_path() / ("kiln-tokenizer-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kDir + "/vocab.json", dir / "vocab.json");
  fs::copy_file(kDir + "/merges.txt", dir / "merges.txt");
  const std::string text = "This License applies to any program or other work.";
  const std::vector<int32_t> want = Tokenizer::from_folder(kDir).encode(text);
  EXPECT_EQ(Tokenizer::from_folder(dir.string()).encode(text), want);
  EXPECT_NE(Tokenizer::from_folder(dir.string()).origin().find("merges.txt"), std::string::npos);
  fs::remove(dir / "merges.txt");
  EXPECT_NE(error_of([&] {
              Tokenizer::from_folder(dir.string());
            }).find("has no tokenizer.json, nor vocab.json and merges.txt"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Tokenizer, BadTextAndIdsAreClearErrors) {
  const Tokenizer tok = Tokenizer::from_json_file(kDir + "/tokenizer.json");
  EXPECT_EQ(error_of([&] { tok.encode("caf\xc3"); }),
            "[tokenizer] the text is not valid UTF-8 at byte 3 (0xc3)");
  EXPECT_EQ(error_of([&] {
              tok.encode(
                  "a\xff"
                  "b");
            }),
            "[tokenizer] the text is not valid UTF-8 at byte 1 (0xff)");
  EXPECT_NE(error_of([&] {
              tok.decode({5, 99999});
            }).find("id 99999 is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode({-1}); }).find("id -1 is not in the vocabulary"),
            std::string::npos);
}

// Files of another kind, and broken ones, name the file and the field.
TEST(Tokenizer, AFileOfAnotherKindIsAClearError) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln-tokenizer-bad-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  auto json_error = [&](const std::string& text) {
    const std::string path = write("tokenizer.json", text);
    return error_of([&] { Tokenizer::from_json_file(path); });
  };
  const std::string wordpiece =
      R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}, "pre_tokenizer": null})";
  EXPECT_NE(json_error(wordpiece).find("model.type is \"WordPiece\", expected \"BPE\""),
            std::string::npos)
      << json_error(wordpiece);
  EXPECT_NE(json_error(wordpiece).find("tokenizer.json"), std::string::npos);
  EXPECT_NE(json_error("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(json_error(R"({"vocab": {}})").find("no \"model\" object"), std::string::npos);
  EXPECT_NE(json_error(R"({"model": {"type": 3}})").find("a field has an unexpected type"),
            std::string::npos);
  EXPECT_NE(json_error(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": "no"}})")
                .find("a field has an unexpected type"),
            std::string::npos);
  const std::string bert_pre =
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "pre_tokenizer": {"type": "BertPreTokenizer"}})";
  EXPECT_NE(json_error(bert_pre).find("pre_tokenizer is BertPreTokenizer, expected ByteLevel"),
            std::string::npos)
      << json_error(bert_pre);
  const std::string lowercase =
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "ByteLevel"}})";
  EXPECT_NE(json_error(lowercase).find("normalizer is Lowercase, expected null"),
            std::string::npos);
  const std::string bad_id =
      R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []},
          "pre_tokenizer": {"type": "ByteLevel"}})";
  EXPECT_NE(json_error(bad_id).find("token \"a\" has id \"zero\""), std::string::npos);
  const std::string bad_merge =
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]},
          "pre_tokenizer": {"type": "ByteLevel"}})";
  EXPECT_NE(json_error(bad_merge).find("model.merges 1 is \"ab\", expected \"a b\""),
            std::string::npos);
  const std::string vocab = write("vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  const std::string merges = write("merges.txt", "#version: 0.2\na b\nthree words here\n");
  EXPECT_NE(error_of([&] {
              Tokenizer::from_vocab_and_merges(vocab, merges);
            }).find("merges.txt: line 3 is \"three words here\", expected a merge \"a b\""),
            std::string::npos)
      << error_of([&] { Tokenizer::from_vocab_and_merges(vocab, merges); });
  EXPECT_NE(error_of([&] {
              Tokenizer::from_json_file((dir / "missing.json").string());
            }).find("missing.json: cannot be read"),
            std::string::npos);
  // A vocabulary without the byte characters: what BPE leaves is named.
  const std::string no_bytes = write("merges.txt", "a b\n");
  EXPECT_NE(error_of([&] {
              Tokenizer::from_vocab_and_merges(vocab, no_bytes).encode("abc");
            }).find("the symbol \"c\" that BPE leaves is not in the vocabulary"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::data
