// kiln data: GPT-2's byte-level BPE tokenizer (include/kiln/tokenizer.h).
// As HuggingFace tokenizers runs it: added tokens matched first; the rest
// split by GPT-2's pattern (Unicode letters, numbers and spaces, through
// PCRE2 with UTF and UCP); each piece's bytes mapped to printable characters
// (GPT-2's bytes_to_unicode); the merges applied lowest rank first, every
// occurrence of the best pair left to right; the symbols looked up in the
// vocabulary. Decoding maps the characters back to bytes.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "kiln/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "kiln/error.h"

namespace kiln::data {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer pattern (tokenizers' ByteLevel with use_regex).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("tokenizer", path + ": cannot be read (missing, or not a file)");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

// The length of the UTF-8 character starting at s[i] (1 for a byte that
// starts none, which only valid text excludes).
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  return i + n <= s.size() ? n : 1;
}

// The position of the first byte of s that is not part of valid UTF-8, or
// npos.
size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t c, min;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b >> 5) == 6) {
      n = 2, c = b & 0x1f, min = 0x80;
    } else if ((b >> 4) == 14) {
      n = 3, c = b & 0x0f, min = 0x800;
    } else if ((b >> 3) == 30) {
      n = 4, c = b & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      const auto x = static_cast<unsigned char>(s[i + k]);
      if ((x >> 6) != 2) return i;
      c = (c << 6) | (x & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return i;
    i += n;
  }
  return std::string_view::npos;
}

uint32_t decode_utf8(std::string_view s, size_t i, size_t n) {
  const auto b = static_cast<unsigned char>(s[i]);
  uint32_t c = n == 1 ? b : n == 2 ? b & 0x1f : n == 3 ? b & 0x0f : b & 0x07;
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return c;
}

struct AddedToken {
  std::string content;
  int32_t id;
};

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<int32_t, std::string> tokens;  // id -> token
  int64_t size = 0;                                 // the largest id + 1
  std::unordered_map<std::string, int> ranks;       // "a b" -> merge priority
  std::vector<AddedToken> added;                    // longest first
  bool add_prefix_space = false, use_regex = true, ignore_merges = false;
  std::string byte_char[256];  // byte -> its printable character (UTF-8)
  int byte_of[512];            // character (code point < 512) -> byte, or -1
  pcre2_code* pattern = nullptr;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece -> ids

  Impl() {
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves,
    // the others to 256, 257, ... in byte order.
    std::fill(std::begin(byte_of), std::end(byte_of), -1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
      const int c = printable ? b : next++;
      append_utf8(byte_char[b], static_cast<uint32_t>(c));
      byte_of[c] = b;
    }
  }
  ~Impl() {
    if (pattern) pcre2_code_free(pattern);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  [[noreturn]] void bad(const std::string& what) const { fail("tokenizer", origin + ": " + what); }

  void read_fields(const json& j);

  void compile_pattern() {
    int code = 0;
    PCRE2_SIZE at = 0;
    pattern = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP, &code, &at, nullptr);
    if (!pattern) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(code, msg, sizeof(msg));
      bad(std::string("PCRE2 cannot compile GPT-2's pattern: ") + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(pattern, PCRE2_JIT_COMPLETE);  // where PCRE2 has a JIT; else interpreted
  }

  void set_vocab(const json& v, const std::string& where) {
    if (!v.is_object()) bad(where + " must be an object of token -> id");
    for (const auto& [token, id] : v.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        bad(where + ": token " + json(token).dump(-1, ' ', false, json::error_handler_t::replace) +
            " has id " + id.dump(-1, ' ', false, json::error_handler_t::replace) +
            ", expected an integer in [0, 2^31)");
      add_token(token, id.get<int32_t>(), where);
    }
  }
  void add_token(const std::string& token, int32_t id, const std::string& where) {
    auto [at, fresh] = tokens.emplace(id, token);
    if (!fresh && at->second != token)
      bad(where + ": id " + std::to_string(id) + " is both " +
          json(at->second).dump(-1, ' ', false, json::error_handler_t::replace) + " and " +
          json(token).dump(-1, ' ', false, json::error_handler_t::replace));
    auto [v, added] = vocab.emplace(token, id);
    if (!added && v->second != id)
      bad(where + ": token " + json(token).dump(-1, ' ', false, json::error_handler_t::replace) +
          " has ids " + std::to_string(v->second) + " and " + std::to_string(id));
    size = std::max<int64_t>(size, int64_t{id} + 1);
  }
  void add_merge(const std::string& a, const std::string& b, const std::string& where) {
    if (a.empty() || b.empty() || a.find(' ') != std::string::npos ||
        b.find(' ') != std::string::npos)
      bad(where + " " + std::to_string(ranks.size() + 1) + " is " +
          json({a, b}).dump(-1, ' ', false, json::error_handler_t::replace) +
          ", expected two non-empty symbols without spaces");
    ranks.emplace(a + " " + b, static_cast<int>(ranks.size()));
  }
  void sort_added() {
    std::sort(added.begin(), added.end(), [](const AddedToken& x, const AddedToken& y) {
      return x.content.size() > y.content.size();
    });
  }

  // The BPE of one piece (already mapped to printable characters).
  void bpe(const std::string& word, std::vector<int32_t>& ids) const {
    if (ignore_merges) {
      auto it = vocab.find(word);
      if (it != vocab.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    std::vector<std::string> syms;
    for (size_t i = 0; i < word.size();) {
      const size_t n = utf8_length(word, i);
      syms.push_back(word.substr(i, n));
      i += n;
    }
    std::string key;
    while (syms.size() > 1) {
      int best = INT_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        key.assign(syms[i]).append(" ").append(syms[i + 1]);
        auto it = ranks.find(key);
        if (it != ranks.end() && it->second < best) best = it->second, at = i;
      }
      if (best == INT_MAX) break;
      const std::string a = syms[at], b = syms[at + 1];
      std::vector<std::string> merged;
      merged.reserve(syms.size());
      for (size_t i = 0; i < syms.size();) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          merged.push_back(a + b);
          i += 2;
        } else {
          merged.push_back(std::move(syms[i++]));
        }
      }
      syms = std::move(merged);
    }
    for (const std::string& s : syms) {
      auto it = vocab.find(s);
      if (it == vocab.end())
        bad("the symbol " + json(s).dump(-1, ' ', false, json::error_handler_t::replace) +
            " that BPE leaves is not in the vocabulary");
      ids.push_back(it->second);
    }
  }

  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
    std::string word;
    for (char ch : piece) word += byte_char[static_cast<unsigned char>(ch)];
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = cache.find(word);
      if (it != cache.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> out;
    bpe(word, out);
    ids.insert(ids.end(), out.begin(), out.end());
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() > (1u << 18)) cache.clear();
    cache.emplace(std::move(word), std::move(out));
  }

  // Text between added tokens: pre-tokenized, each piece's BPE.
  void encode_segment(std::string_view text, std::vector<int32_t>& ids) const {
    std::string prefixed;
    if (add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    if (text.empty()) return;
    if (!use_regex) return encode_piece(text, ids);
    // Freed however the loop ends (BPE may throw on a symbol the vocabulary lacks).
    const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
        pcre2_match_data_create_from_pattern(pattern, nullptr), pcre2_match_data_free);
    pcre2_match_data* md = data.get();
    if (!md) bad("out of memory for PCRE2's match data");
    size_t pos = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(pattern, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                                 pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        bad(std::string("PCRE2 failed on the text: ") + reinterpret_cast<char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[0] > pos) encode_piece(text.substr(pos, ov[0] - pos), ids);  // a gap: its own piece
      if (ov[1] == ov[0]) {  // an empty match (the pattern has none): step one character
        pos = ov[0] + utf8_length(text, ov[0]);
        continue;
      }
      encode_piece(text.substr(ov[0], ov[1] - ov[0]), ids);
      pos = ov[1];
    }
    if (pos < text.size()) encode_piece(text.substr(pos), ids);
  }
};

Tokenizer Tokenizer::from_json_file(const std::string& path) {
  return from_json(read_text(path), path);
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    impl->bad(std::string("not valid JSON: ") + e.what());
  }
  try {  // a field of an unexpected type (json's type errors) is bad input too
    impl->read_fields(j);
  } catch (const json::exception& e) {
    impl->bad(std::string("a field has an unexpected type: ") + e.what());
  }
  impl->sort_added();
  impl->compile_pattern();
  Tokenizer tok;
  tok.impl_ = std::move(impl);
  return tok;
}

// tokenizer.json's fields into impl (its vocabulary, merges, flags and added tokens).
void Tokenizer::Impl::read_fields(const json& j) {
  Impl* impl = this;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    impl->bad("no \"model\" object: not a tokenizers tokenizer.json");
  const json& m = j["model"];
  const std::string type = m.value("type", std::string("(none)"));
  if (type != "BPE")
    impl->bad("model.type is " + json(type).dump(-1, ' ', false, json::error_handler_t::replace) +
              ", expected \"BPE\" (GPT-2's byte-level BPE; kiln reads no other tokenizer kind)");
  for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (m.contains(unsupported) && !m[unsupported].is_null())
      impl->bad(std::string("model.") + unsupported + " is " +
                m[unsupported].dump(-1, ' ', false, json::error_handler_t::replace) +
                ", expected null (GPT-2's BPE has none)");
  if (m.value("byte_fallback", false)) impl->bad("model.byte_fallback is true, expected false");
  impl->ignore_merges = m.value("ignore_merges", false);
  if (!m.contains("vocab")) impl->bad("model.vocab is missing");
  impl->set_vocab(m["vocab"], "model.vocab");
  if (!m.contains("merges") || !m["merges"].is_array()) impl->bad("model.merges is not a list");
  for (const json& x : m["merges"]) {
    if (x.is_string()) {
      const std::string s = x.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos)
        impl->bad("model.merges " + std::to_string(impl->ranks.size() + 1) + " is " +
                  x.dump(-1, ' ', false, json::error_handler_t::replace) + ", expected \"a b\"");
      impl->add_merge(s.substr(0, sp), s.substr(sp + 1), "model.merges");
    } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {
      impl->add_merge(x[0].get<std::string>(), x[1].get<std::string>(), "model.merges");
    } else {
      impl->bad("model.merges " + std::to_string(impl->ranks.size() + 1) + " is " +
                x.dump(-1, ' ', false, json::error_handler_t::replace) +
                ", expected \"a b\" or [\"a\", \"b\"]");
    }
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    impl->bad("normalizer is " + j["normalizer"].value("type", std::string("set")) +
              ", expected null (GPT-2's tokenizer normalizes nothing)");
  const json pre = j.value("pre_tokenizer", json());
  if (!pre.is_object() || pre.value("type", std::string()) != "ByteLevel")
    impl->bad("pre_tokenizer is " +
              (pre.is_object()
                   ? pre.value("type", pre.dump(-1, ' ', false, json::error_handler_t::replace))
                   : pre.dump(-1, ' ', false, json::error_handler_t::replace)) +
              ", expected ByteLevel (GPT-2's)");
  impl->add_prefix_space = pre.value("add_prefix_space", false);
  impl->use_regex = pre.value("use_regex", true);
  const json post = j.value("post_processor", json());
  if (!post.is_null() && post.value("type", std::string()) != "ByteLevel")
    impl->bad("post_processor is " +
              post.value("type", post.dump(-1, ' ', false, json::error_handler_t::replace)) +
              ", expected null or ByteLevel (kiln adds no template tokens)");
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) impl->bad("added_tokens is not a list");
    for (const json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
          !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() > INT32_MAX)
        impl->bad("added_tokens has " + t.dump(-1, ' ', false, json::error_handler_t::replace) +
                  ", expected {\"id\": n, \"content\": text}");
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (t.value(flag, false))
          impl->bad("added token " +
                    t["content"].dump(-1, ' ', false, json::error_handler_t::replace) + " sets " +
                    flag + ", which kiln does not support (GPT-2's sets none)");
      const std::string content = t["content"].get<std::string>();
      if (content.empty()) impl->bad("added_tokens has an empty token");
      impl->add_token(content, t["id"].get<int32_t>(), "added_tokens");
      impl->added.push_back({content, t["id"].get<int32_t>()});
    }
  }
}

Tokenizer Tokenizer::from_vocab_and_merges(const std::string& vocab_path,
                                           const std::string& merges_path,
                                           const std::vector<std::string>& special) {
  auto impl = std::make_shared<Impl>();
  impl->origin = vocab_path;
  try {
    impl->set_vocab(json::parse(read_text(vocab_path)), "the vocabulary");
  } catch (const json::exception& e) {
    impl->bad(std::string("not valid JSON: ") + e.what());
  }
  impl->origin = merges_path;
  std::istringstream lines(read_text(merges_path));
  std::string line;
  int64_t number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      impl->bad("line " + std::to_string(number) + " is " +
                json(line).dump(-1, ' ', false, json::error_handler_t::replace) +
                ", expected a merge \"a b\"");
    impl->add_merge(line.substr(0, sp), line.substr(sp + 1), "merge");
  }
  impl->origin = vocab_path;
  for (const std::string& s : special) {
    auto it = impl->vocab.find(s);
    if (it != impl->vocab.end()) impl->added.push_back({s, it->second});
  }
  impl->sort_added();
  impl->origin = vocab_path + " + " + merges_path;
  impl->compile_pattern();
  Tokenizer tok;
  tok.impl_ = std::move(impl);
  return tok;
}

Tokenizer Tokenizer::from_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  if (fs::is_regular_file(d / "tokenizer.json"))
    return from_json_file((d / "tokenizer.json").string());
  if (fs::is_regular_file(d / "vocab.json") && fs::is_regular_file(d / "merges.txt"))
    return from_vocab_and_merges((d / "vocab.json").string(), (d / "merges.txt").string());
  fail("tokenizer", dir + ": has no tokenizer.json, nor vocab.json and merges.txt");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const Impl& t = *impl_;
  const size_t bad = invalid_utf8_at(text);
  if (bad != std::string_view::npos) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<unsigned char>(text[bad]));
    fail("tokenizer",
         "the text is not valid UTF-8 at byte " + std::to_string(bad) + " (" + byte + ")");
  }
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    // The first added token in the rest of the text (the longest where two
    // start at one place).
    size_t at = std::string_view::npos;
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : t.added) {
      const size_t f = text.find(a.content, pos);
      if (f < at) at = f, hit = &a;
    }
    if (!hit) {
      t.encode_segment(text.substr(pos), ids);
      break;
    }
    t.encode_segment(text.substr(pos, at - pos), ids);
    ids.push_back(hit->id);
    pos = at + hit->content.size();
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& t = *impl_;
  std::string out;
  for (int32_t id : ids) {
    auto at = t.tokens.find(id);
    if (at == t.tokens.end())
      fail("tokenizer", t.origin + ": id " + std::to_string(id) + " is not in the vocabulary of " +
                            std::to_string(t.size) + " ids");
    const std::string& s = at->second;
    const bool is_added = std::any_of(t.added.begin(), t.added.end(),
                                      [&](const AddedToken& a) { return a.id == id; });
    if (is_added) {
      out += s;
      continue;
    }
    for (size_t i = 0; i < s.size();) {
      const size_t n = utf8_length(s, i);
      const uint32_t c = decode_utf8(s, i, n);
      if (c < 512 && t.byte_of[c] >= 0) {
        out += static_cast<char>(t.byte_of[c]);
      } else {
        out.append(s, i, n);  // not a byte's character: kept as it is
      }
      i += n;
    }
  }
  return out;
}

int64_t Tokenizer::vocab_size() const {
  return impl_->size;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::origin() const {
  return impl_->origin;
}

uint64_t Tokenizer::fingerprint() const {
  // FNV-1a over every token by id, the merges by priority, the added tokens
  // and the flags, each field ended by a byte no UTF-8 text holds.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
  };
  const Impl& m = *impl_;
  for (int32_t id = 0; id < m.size; ++id) {
    auto it = m.tokens.find(id);
    mix(it == m.tokens.end() ? std::string_view("\xfe") : std::string_view(it->second));
  }
  std::vector<std::pair<int, std::string_view>> merges;
  for (const auto& [pair, rank] : m.ranks) merges.emplace_back(rank, pair);
  std::sort(merges.begin(), merges.end());
  for (const auto& [rank, pair] : merges) mix(pair);
  for (const AddedToken& a : m.added) mix(a.content + "\xfe" + std::to_string(a.id));
  mix(std::string{m.add_prefix_space ? '1' : '0', m.use_regex ? '1' : '0',
                  m.ignore_merges ? '1' : '0'});
  return h;
}

}  // namespace kiln::data
