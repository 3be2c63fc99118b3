// kiln data: token files (llm.c's and nanoGPT's .bin), text tokenized once
// and cached, and a token stream cut into blocks as a data set.
#include "kiln/tokens.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace kiln::data {
namespace fs = std::filesystem;
namespace {

constexpr int32_t kMagic = 20240520;  // llm.c's token files
constexpr int64_t kHeader = 256;      // int32 words

std::string read_all(const std::string& path, const char* what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail("data", path + ": no such " + std::string(what));
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("data", path + ": cannot be read (" + std::strerror(errno) + ")");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// FNV-1a, for the cache key.
uint64_t fnv(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<std::string> text_files(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  if (!fs::is_directory(path, ec)) fail("data", "text:" + path + ": no such file or folder");
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec) && it->path().extension() == ".txt")
      files.push_back(it->path().string());
  if (ec) fail("data", "text:" + path + ": " + ec.message());
  if (files.empty()) fail("data", "text:" + path + ": a folder without .txt files");
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void Dataset::get_tokens(int64_t /*index*/, int32_t* /*tokens*/) const {
  fail("data", "this data set holds images, not tokens");
}

std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab_size) {
  const std::string bytes = read_all(path, "token file");
  if (bytes.empty()) fail("data", path + ": an empty token file");
  size_t offset = 0, count = 0;
  int32_t head[3] = {0, 0, 0};
  if (bytes.size() >= sizeof head) std::memcpy(head, bytes.data(), sizeof head);
  if (head[0] == kMagic) {
    // llm.c: header[1] the version (1: uint16 ids), header[2] the count.
    if (head[1] != 1)
      fail("data", path + ": llm.c token file of version " + std::to_string(head[1]) +
                       ", expected 1 (uint16 ids)");
    if (bytes.size() < kHeader * 4)
      fail("data", path + ": " + std::to_string(bytes.size()) +
                       " bytes, shorter than llm.c's 1024-byte header");
    offset = kHeader * 4;
    count = static_cast<size_t>(head[2]);
    if (head[2] < 0 || bytes.size() - offset != 2 * count)
      fail("data", path + ": the header says " + std::to_string(head[2]) +
                       " tokens, the file holds " + std::to_string((bytes.size() - offset) / 2) +
                       " (truncated?)");
  } else {
    // nanoGPT: uint16 ids, nothing else.
    if (bytes.size() % 2 != 0)
      fail("data", path + ": " + std::to_string(bytes.size()) +
                       " bytes: not uint16 token ids (odd size) and not llm.c's header");
    count = bytes.size() / 2;
  }
  if (count == 0) fail("data", path + ": no tokens");
  std::vector<int32_t> ids(count);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + offset);
  for (size_t i = 0; i < count; ++i) {
    ids[i] = static_cast<int32_t>(p[2 * i] | (p[2 * i + 1] << 8));
    if (vocab_size > 0 && ids[i] >= vocab_size)
      fail("data", path + ": token " + std::to_string(i) + " is " + std::to_string(ids[i]) +
                       ", outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")");
  }
  return ids;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids) {
  std::string bytes(kHeader * 4 + 2 * ids.size(), '\0');
  const int32_t head[3] = {kMagic, 1, static_cast<int32_t>(ids.size())};
  if (ids.size() > static_cast<size_t>(INT32_MAX))
    fail("data", path + ": " + std::to_string(ids.size()) + " tokens, more than a .bin file holds");
  std::memcpy(bytes.data(), head, sizeof head);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 65535)
      fail("data", path + ": token id " + std::to_string(ids[i]) + " does not fit uint16");
    bytes[kHeader * 4 + 2 * i] = static_cast<char>(ids[i] & 0xff);
    bytes[kHeader * 4 + 2 * i + 1] = static_cast<char>(ids[i] >> 8);
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      fail("data", path + ": cannot be written (" + std::strerror(errno) + ")");
    }
  }
  if (const int fd = ::open(tmp.c_str(), O_RDONLY); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("data", path + ": cannot be written (" + std::strerror(errno) + ")");
  }
}

std::string token_cache_dir() {
  if (const char* e = std::getenv("KILN_TOKEN_CACHE"); e && *e) return e;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "kiln" / "tokens").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "kiln" / "tokens").string();
  return "";
}

TextTokens tokenize_text(const std::string& path, const Tokenizer& tokenizer, int32_t separator,
                         const std::string& cache_dir) {
  TextTokens out;
  const std::vector<std::string> files = text_files(path);
  std::vector<std::string> texts;
  uint64_t key = fnv(std::to_string(tokenizer.fingerprint()) + "/" + std::to_string(separator));
  for (const std::string& f : files) {
    texts.push_back(read_all(f, "text file"));
    if (texts.back().empty()) fail("data", f + ": an empty text file: nothing to train on");
    key = fnv(texts.back(), fnv(std::to_string(texts.back().size()), key));
    out.bytes += static_cast<int64_t>(texts.back().size());
  }
  out.files = static_cast<int64_t>(files.size());
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.bin", static_cast<unsigned long long>(key));
  if (!cache_dir.empty()) {
    out.cache_file = (fs::path(cache_dir) / name).string();
    std::error_code ec;
    if (fs::is_regular_file(out.cache_file, ec)) {
      out.ids = read_token_file(out.cache_file, tokenizer.vocab_size());
      out.cached = true;
      return out;
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::vector<int32_t> ids;
    try {
      ids = tokenizer.encode(texts[i]);
    } catch (const Error& e) {
      fail("data", files[i] + ": " + e.what());
    }
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    if (separator >= 0) out.ids.push_back(separator);
  }
  if (!out.cache_file.empty()) {
    std::error_code ec;
    fs::create_directories(cache_dir, ec);
    bool fits = true;
    for (int32_t id : out.ids) fits = fits && id < 65536;
    // A cache that cannot be written (read-only, full, ids beyond uint16)
    // only costs the next run the tokenizing.
    if (!ec && fits) {
      try {
        write_token_file(out.cache_file, out.ids);
      } catch (const Error&) {
        out.cache_file.clear();
      }
    } else {
      out.cache_file.clear();
    }
  }
  return out;
}

TokenBlocks::TokenBlocks(std::shared_ptr<const std::vector<int32_t>> ids, int64_t seq_len,
                         int64_t begin, int64_t end)
    : ids_(std::move(ids)), seq_len_(seq_len), begin_(begin), end_(end) {
  if (!ids_) fail("data", "token blocks of no token stream");
  const int64_t n = static_cast<int64_t>(ids_->size());
  if (end_ < 0) end_ = n;
  if (seq_len_ < 1) fail("data", "--seq-len must be positive, got " + std::to_string(seq_len_));
  if (begin_ < 0 || begin_ > end_ || end_ > n)
    fail("data", "token range [" + std::to_string(begin_) + ", " + std::to_string(end_) +
                     ") outside the stream of " + std::to_string(n));
  if (size() < 1)
    fail("data", std::to_string(end_ - begin_) + " tokens: not one block of --seq-len " +
                     std::to_string(seq_len_));
}

void TokenBlocks::get_tokens(int64_t index, int32_t* tokens) const {
  if (index < 0 || index >= size())
    fail("data", "block " + std::to_string(index) + " of " + std::to_string(size()));
  std::memcpy(tokens, ids_->data() + begin_ + index * seq_len_,
              static_cast<size_t>(seq_len_) * sizeof(int32_t));
}

void TokenBlocks::get(int64_t /*index*/, float* /*image*/, int32_t* /*label*/) const {
  fail("data", "token blocks hold token ids, not images (get_tokens)");
}

}  // namespace kiln::data
