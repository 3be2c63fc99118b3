// kiln io: downloads from the Hugging Face Hub into huggingface_hub's cache
// layout (libcurl; SHA-256 and git-blob SHA-1 checks with OpenSSL).
#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "internal.h"
#include "kiln/io.h"

namespace kiln::io {
namespace {
namespace fs = std::filesystem;
const std::string kOrigin = "hub";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Response {
  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names, the last of each
  std::string url;                             // the last one requested
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Response*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) r->headers.clear();  // a new response (after a redirect)
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r\n") + 1);
    r->headers[lower(line.substr(0, colon))] = value;
  }
  return size * n;
}

struct Curl {
  CURL* h;
  curl_slist* headers = nullptr;
  Curl() : h((global_init(), curl_easy_init())) {
    if (!h) fail(kOrigin, "cannot start libcurl");
  }
  ~Curl() {
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
  }
};

// What the Hub says of a file: huggingface_hub's get_hf_file_metadata.
struct FileMeta {
  bool found = false;
  std::string commit, etag, location;
  int64_t size = -1;
};

std::string what_to_do(long status, const std::string& url) {
  if (status == 401 || status == 403)
    return "the Hub answered " + std::to_string(status) + " for " + url +
           ": a private or gated model, or a token without access; set HF_TOKEN to a token that "
           "has access (https://huggingface.co/settings/tokens)";
  if (status == 404) return "the Hub answered 404 for " + url + ": no such model, revision or file";
  return "the Hub answered " + std::to_string(status) + " for " + url;
}

class Hub {
 public:
  Hub() : endpoint_(env("HF_ENDPOINT").empty() ? "https://huggingface.co" : env("HF_ENDPOINT")) {
    while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
    token_ = env("HF_TOKEN");
    if (token_.empty()) token_ = env("HUGGING_FACE_HUB_TOKEN");
  }

  std::string resolve_url(const std::string& repo, const std::string& revision,
                          const std::string& file) const {
    return endpoint_ + "/" + repo + "/resolve/" + revision + "/" + file;
  }

  // HEAD, following redirects that stay on the Hub (the same host, or one of
  // huggingface_hub's Hub hosts: a moved repository); one that leaves it (an
  // LFS file's CDN) carries the file's metadata and is where it is fetched.
  FileMeta head(const std::string& url_in, bool optional) const {
    std::string url = url_in;
    for (int hop = 0; hop < 6; ++hop) {
      Curl c;
      Response r;
      setup(c, url);
      curl_easy_setopt(c.h, CURLOPT_NOBODY, 1L);
      curl_easy_setopt(c.h, CURLOPT_HEADERFUNCTION, on_header);
      curl_easy_setopt(c.h, CURLOPT_HEADERDATA, &r);
      perform(c, url);
      curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &r.status);
      auto header = [&](const char* k) {
        auto it = r.headers.find(k);
        return it == r.headers.end() ? std::string() : it->second;
      };
      std::string location = header("location");
      if (!location.empty()) {
        const std::string given = location;
        location = resolve(url, given);
        if (location.empty())
          fail(kOrigin, url + ": the Hub redirected to '" + given.substr(0, 100) + "', not a URL");
      }
      if (r.status >= 300 && r.status < 400 && !location.empty() && on_hub(url, location)) {
        url = location;
        continue;
      }
      if (r.status == 404 && optional) return {};
      if (r.status >= 400) fail(kOrigin, what_to_do(r.status, url));
      FileMeta m;
      m.found = true;
      m.commit = header("x-repo-commit");
      m.etag = header("x-linked-etag");
      if (m.etag.empty()) m.etag = header("etag");
      if (m.etag.rfind("W/", 0) == 0) m.etag = m.etag.substr(2);
      m.etag.erase(std::remove(m.etag.begin(), m.etag.end(), '"'), m.etag.end());
      std::string size = header("x-linked-size");
      if (size.empty()) size = header("content-length");
      if (!size.empty() && size.find_first_not_of("0123456789") == std::string::npos &&
          size.size() < 19)
        m.size = std::stoll(size);
      m.location = location.empty() ? url : location;
      return m;
    }
    fail(kOrigin, url_in + ": more than 5 redirects");
  }

  // GET `url` (redirects followed) appending to `path` from its current
  // size (a Range request: a download cut short resumes).
  void get(const std::string& url, const std::string& path, const std::string& what,
           int64_t size) const {
    std::error_code ec;
    int64_t have = fs::exists(path, ec) ? static_cast<int64_t>(fs::file_size(path, ec)) : 0;
    if (size >= 0 && have > size) fs::remove(path, ec), have = 0;
    if (size >= 0 && have == size) return;  // fetched before, not yet checked: checked now
    FILE* f = std::fopen(path.c_str(), "ab");
    if (!f) fail(kOrigin, path + ": cannot write (" + std::strerror(errno) + ")");
    Progress progress{what, size, have};
    Curl c;
    Response r;
    setup(c, url);
    curl_easy_setopt(c.h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c.h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c.h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c.h, CURLOPT_HEADERDATA, &r);
    struct Sink {
      FILE* f;
      Progress* p;
    } sink{f, &progress};
    curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(
        c.h, CURLOPT_WRITEFUNCTION, +[](char* data, size_t s, size_t n, void* user) -> size_t {
          auto* k = static_cast<Sink*>(user);
          if (std::fwrite(data, 1, s * n, k->f) != s * n) return 0;
          k->p->add(static_cast<int64_t>(s * n));
          return s * n;
        });
    if (have > 0) curl_easy_setopt(c.h, CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(have));
    CURLcode rc = curl_easy_perform(c.h);
    long status = 0;
    curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &status);
    std::fclose(f);
    progress.done();
    if (rc == CURLE_RANGE_ERROR || (rc == CURLE_OK && have > 0 && status == 200)) {
      // The server ignored the range: start over.
      fs::remove(path, ec);
      get(url, path, what, size);
      return;
    }
    if (rc != CURLE_OK && status < 400)
      fail(kOrigin, "cannot download " + url + " (" + curl_easy_strerror(rc) +
                        "); run again to resume, or set HF_HUB_OFFLINE=1 to use only the cache");
    if (status >= 400) {
      fs::remove(path, ec);
      fail(kOrigin, what_to_do(status, url));
    }
  }

 private:
  // A URL's host in lower case, as libcurl parses it ("" when it is not a URL).
  static std::string host(const std::string& url) {
    CURLU* u = curl_url();
    std::string h;
    char* part = nullptr;
    if (u && curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &part, 0) == CURLUE_OK && part)
      h = lower(part);
    curl_free(part);
    curl_url_cleanup(u);
    return h;
  }
  // `location` (absolute or relative) resolved against `base`; "" if it is no URL.
  static std::string resolve(const std::string& base, const std::string& location) {
    CURLU* u = curl_url();
    std::string out;
    char* full = nullptr;
    if (u && curl_url_set(u, CURLUPART_URL, base.c_str(), 0) == CURLUE_OK &&
        curl_url_set(u, CURLUPART_URL, location.c_str(), 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_URL, &full, 0) == CURLUE_OK && full)
      out = full;
    curl_free(full);
    curl_url_cleanup(u);
    return out;
  }
  // huggingface_hub's _is_same_or_hub_host.
  bool on_hub(const std::string& from, const std::string& to) const {
    const std::string h = host(to);
    return !h.empty() && (h == host(from) || h == "hf.co" || h == "huggingface.co" ||
                          h == "hub-ci.huggingface.co" || h == host(endpoint_));
  }

  struct Progress {
    std::string what;
    int64_t total, done_bytes;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), shown = start;
    bool tty = ::isatty(STDERR_FILENO);
    void add(int64_t n) {
      done_bytes += n;
      auto now = std::chrono::steady_clock::now();
      if (tty && now - shown > std::chrono::milliseconds(200)) {
        shown = now;
        show("\r");
      }
    }
    void show(const char* lead) const {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      char line[256];
      if (total > 0)
        std::snprintf(line, sizeof line, "%sdownloading %s: %3.0f%% %.1f of %.1f MB (%.1f MB/s)",
                      lead, what.c_str(), 100.0 * done_bytes / total, done_bytes / 1e6, total / 1e6,
                      s > 0 ? done_bytes / 1e6 / s : 0.0);
      else
        std::snprintf(line, sizeof line, "%sdownloading %s: %.1f MB", lead, what.c_str(),
                      done_bytes / 1e6);
      std::fputs(line, stderr);
      std::fflush(stderr);
    }
    void done() const {
      show(tty ? "\r" : "");
      std::fputs("\n", stderr);
    }
  };

  void setup(Curl& c, const std::string& url) const {
    curl_easy_setopt(c.h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c.h, CURLOPT_USERAGENT, "kiln (huggingface_hub cache layout)");
    curl_easy_setopt(c.h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_LIMIT, 1L);  // stalled 60 s: an error
    curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_TIME, 60L);
    // HTTP(S) alone, redirects included: a Location of file:// or another scheme is refused.
    curl_easy_setopt(c.h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c.h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c.h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c.h, CURLOPT_SSL_VERIFYHOST, 2L);
    curl_easy_setopt(c.h, CURLOPT_NOSIGNAL, 1L);
    c.headers = curl_slist_append(c.headers, "Accept-Encoding: identity");
    // To the Hub alone, not to a CDN's signed URL (and libcurl drops it on a
    // redirect to another host).
    if (!token_.empty() && on_hub(endpoint_, url))
      c.headers = curl_slist_append(c.headers, ("Authorization: Bearer " + token_).c_str());
    curl_easy_setopt(c.h, CURLOPT_HTTPHEADER, c.headers);
  }

  void perform(Curl& c, const std::string& url) const {
    CURLcode rc = curl_easy_perform(c.h);
    if (rc != CURLE_OK)
      fail(kOrigin, "cannot reach " + url + " (" + curl_easy_strerror(rc) +
                        "); check the network and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use only "
                        "the local cache");
  }

  std::string endpoint_, token_;
};

// The hex digest of a file: SHA-256, or git's blob SHA-1 ("blob <size>\0" first).
std::string digest(const std::string& path, bool git_sha1) {
  std::ifstream in(path, std::ios::binary);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, git_sha1 ? EVP_sha1() : EVP_sha256(), nullptr);
  if (git_sha1) {
    std::error_code ec;
    const std::string prefix =
        "blob " + std::to_string(fs::file_size(path, ec)) + std::string(1, '\0');
    EVP_DigestUpdate(ctx, prefix.data(), prefix.size());
  }
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  char b[3];
  for (unsigned i = 0; i < n; ++i) std::snprintf(b, sizeof b, "%02x", md[i]), hex += b;
  return hex;
}

// An exclusive lock on `path` (created) for as long as it lives: processes
// that fetch the same blob at once (the ranks of a data-parallel run) take
// turns, as huggingface_hub's FileLock makes them.
class FileLock {
 public:
  explicit FileLock(const std::string& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail(kOrigin, path + ": cannot open the lock file (" + std::strerror(errno) + ")");
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) fail(kOrigin, path + ": cannot lock (" + std::strerror(errno) + ")");
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

// A link `link` -> `target` (relative), replacing what is there atomically.
void link_to(const std::string& target, const std::string& link) {
  std::error_code ec;
  const std::string tmp = link + ".kiln-link-" + std::to_string(::getpid());
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp, ec);
  if (ec) fail(kOrigin, link + ": cannot create a link (" + ec.message() + ")");
  fs::rename(tmp, link, ec);
  if (ec) fail(kOrigin, link + ": cannot put the link in place (" + ec.message() + ")");
}

}  // namespace

std::string hub_download(const std::string& repo, const std::string& revision,
                         const std::vector<std::string>& wanted) {
  if (hub_offline())
    fail(kOrigin, repo + "@" + revision + " is not in the Hugging Face cache (" + hub_cache_dir() +
                      ") and HF_HUB_OFFLINE is set: download it with the network on (unset "
                      "HF_HUB_OFFLINE), or pass the model's folder");
  Hub hub;
  std::string folder = "models--" + repo;
  for (size_t p; (p = folder.find('/')) != std::string::npos;) folder.replace(p, 1, "--");
  const std::string root = hub_cache_dir() + "/" + folder;
  std::error_code ec;
  std::string commit;
  // One file: its metadata, its blob (checked before it becomes visible), its link.
  auto fetch = [&](const std::string& file, bool optional) -> bool {
    const std::string rev = commit.empty() ? revision : commit;
    FileMeta m = hub.head(hub.resolve_url(repo, rev, file), optional);
    if (!m.found) return false;
    if (commit.empty()) {
      if (!is_hex(m.commit, 40))
        fail(kOrigin, hub.resolve_url(repo, rev, file) +
                          ": the answer has no commit hash (X-Repo-Commit '" +
                          m.commit.substr(0, 60) + "'); is HF_ENDPOINT a Hugging Face Hub?");
      commit = m.commit;
      // The cache's folders, once the Hub has answered.
      fs::create_directories(root + "/blobs", ec);
      if (!ec) fs::create_directories(root + "/snapshots/" + commit, ec);
      if (ec) fail(kOrigin, root + ": cannot create the cache's folders (" + ec.message() + ")");
    } else if (!m.commit.empty() && m.commit != commit) {
      fail(kOrigin,
           file + ": the Hub gave commit " + m.commit + " where the other files are at " + commit);
    }
    if (m.etag.empty() || m.etag.size() > 128 ||
        m.etag.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") !=
            std::string::npos)
      fail(kOrigin, hub.resolve_url(repo, rev, file) + ": unexpected ETag '" +
                        m.etag.substr(0, 80) + "' (expected the file's hash)");
    const std::string blob = root + "/blobs/" + m.etag;
    // huggingface_hub's lock of the same blob: <cache>/.locks/models--org--name/<etag>.lock
    const std::string locks = hub_cache_dir() + "/.locks/" + folder;
    fs::create_directories(locks, ec);
    FileLock lock(locks + "/" + m.etag + ".lock");
    if (!fs::exists(blob, ec)) {
      const std::string part = blob + ".incomplete";
      hub.get(m.location, part, repo + "/" + file, m.size);
      const int64_t got = static_cast<int64_t>(fs::file_size(part, ec));
      auto reject = [&](const std::string& why) {
        fs::remove(part, ec);
        fail(kOrigin, "download of " + file + " from " + m.location + " rejected: " + why);
      };
      if (m.size >= 0 && got != m.size)
        reject(std::to_string(got) + " bytes, the Hub announced " + std::to_string(m.size));
      if (is_hex(m.etag, 64) && digest(part, false) != m.etag)  // an LFS file: its SHA-256
        reject("its SHA-256 is " + digest(part, false) + ", the Hub's ETag " + m.etag);
      if (is_hex(m.etag, 40) && digest(part, true) != m.etag)  // a git blob: its SHA-1
        reject("its git blob hash is " + digest(part, true) + ", the Hub's ETag " + m.etag);
      fs::rename(part, blob, ec);
      if (ec) fail(kOrigin, blob + ": cannot put the download in place (" + ec.message() + ")");
    }
    link_to("../../blobs/" + m.etag, root + "/snapshots/" + commit + "/" + file);
    return true;
  };
  fetch("config.json", false);
  for (const std::string& file : wanted) fetch(file, true);
  fetch("preprocessor_config.json", true);
  // A language model's tokenizer (kiln generate and text data read it from the snapshot).
  bool lm = false;
  try {
    const std::string config = root + "/snapshots/" + commit + "/config.json";
    lm = nn::model_from_config(read_file(config, kOrigin), config)->causal_lm();
  } catch (const Error&) {
    // A config of another kind: load_pretrained says what is wrong with it.
  }
  if (lm)
    for (const char* file : {"tokenizer.json", "vocab.json", "merges.txt"}) fetch(file, true);
  if (!fetch("model.safetensors", true)) {
    if (!fetch("model.safetensors.index.json", true))
      fail(kOrigin, repo + "@" + revision +
                        " has no model.safetensors or model.safetensors.index.json on the Hub "
                        "(kiln reads safetensors weights only)");
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(
          read_file(root + "/snapshots/" + commit + "/model.safetensors.index.json", kOrigin));
    } catch (const nlohmann::json::exception& e) {
      fail(kOrigin, repo + ": model.safetensors.index.json is not valid JSON (" + e.what() + ")");
    }
    std::set<std::string> shards;
    if (index.is_object() && index.contains("weight_map") && index["weight_map"].is_object())
      for (auto& [tensor, file] : index["weight_map"].items())
        if (file.is_string()) shards.insert(file.get<std::string>());
    for (const std::string& shard : shards) {
      check_model_file_name(shard, repo + ": model.safetensors.index.json", kOrigin);
      fetch(shard, false);
    }
  }
  if (revision != commit) {
    fs::create_directories(fs::path(root + "/refs/" + revision).parent_path(), ec);
    write_file_atomic(root + "/refs/" + revision, commit);
  }
  return root + "/snapshots/" + commit;
}

bool hub_offline() {
  std::string v = env("HF_HUB_OFFLINE");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::toupper(c); });
  return v == "1" || v == "ON" || v == "YES" || v == "TRUE";
}

}  // namespace kiln::io
