// Downloads from the Hugging Face Hub, against a Hub served on 127.0.0.1 by
// the test itself: huggingface_hub's cache layout, LFS redirects, ETag
// checks (SHA-256, git blob SHA-1), resuming, tokens, 401/404, offline mode,
// no network.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/tokenizer.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

struct Request {
  std::string method, path;
  std::map<std::string, std::string> headers;  // lower-case names
};
struct Reply {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// HTTP/1.1 on 127.0.0.1, one connection at a time, closed after each reply.
class Server {
 public:
  explicit Server(std::function<Reply(const Request&)> handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 16);
    thread_ = std::thread([this] { loop(); });
  }
  ~Server() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> l(mu_);
    return log_;
  }
  void clear() {
    std::lock_guard<std::mutex> l(mu_);
    log_.clear();
  }

 private:
  void loop() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      char buf[4096];
      while (in.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
      }
      Request r;
      std::istringstream lines(in);
      std::string line;
      std::getline(lines, line);
      std::istringstream first(line);
      first >> r.method >> r.path;
      while (std::getline(lines, line) && line != "\r") {
        size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string k = line.substr(0, colon), v = line.substr(colon + 1);
        for (auto& ch : k) ch = static_cast<char>(std::tolower(ch));
        v.erase(0, v.find_first_not_of(' '));
        v.erase(v.find_last_not_of("\r") + 1);
        r.headers[k] = v;
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        log_.push_back(r);
      }
      Reply rep = handler_(r);
      std::string out = "HTTP/1.1 " + std::to_string(rep.status) + " X\r\n";
      bool length = false;
      for (auto& [k, v] : rep.headers) {
        out += k + ": " + v + "\r\n";
        length |= k == "Content-Length";
      }
      if (!length) out += "Content-Length: " + std::to_string(rep.body.size()) + "\r\n";
      out += "Connection: close\r\n\r\n";
      if (r.method != "HEAD") out += rep.body;
      for (size_t at = 0; at < out.size();) {
        ssize_t n = ::send(c, out.data() + at, out.size() - at, MSG_NOSIGNAL);
        if (n <= 0) break;
        at += static_cast<size_t>(n);
      }
      ::close(c);
    }
  }
  std::function<Reply(const Request&)> handler_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<Request> log_;
};

std::string hex_digest(const std::string& data, bool git) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, git ? EVP_sha1() : EVP_sha256(), nullptr);
  if (git) {
    std::string prefix = "blob " + std::to_string(data.size()) + std::string(1, '\0');
    EVP_DigestUpdate(ctx, prefix.data(), prefix.size());
  }
  EVP_DigestUpdate(ctx, data.data(), data.size());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  std::string s;
  char b[3];
  for (unsigned i = 0; i < n; ++i) std::snprintf(b, sizeof b, "%02x", md[i]), s += b;
  return s;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

// A Hub: repositories of files; LFS files (.safetensors) redirect to /cdn/<sha256>.
struct FakeHub {
  std::map<std::string, std::map<std::string, std::string>> repos;  // repo -> file -> bytes
  std::set<std::string> tags = {"main", "v1", kCommit};
  std::string token;                           // when set, "org/private" needs it
  std::map<std::string, std::string> corrupt;  // sha256 -> bytes served instead
  bool honour_ranges = true;
  std::string cdn;  // LFS redirects lead to another host, as the Hub's to its CDN

  Reply operator()(const Request& r) const {
    if (r.path.rfind("/cdn/", 0) == 0) {
      const std::string sha = r.path.substr(5);
      for (auto& [repo, files] : repos)
        for (auto& [name, bytes] : files)
          if (hex_digest(bytes, false) == sha) {
            std::string body = corrupt.count(sha) ? corrupt.at(sha) : bytes;
            auto range = r.headers.find("range");
            if (range != r.headers.end() && honour_ranges) {
              size_t from = std::stoul(range->second.substr(6));
              return {206,
                      {{"Content-Range", "bytes " + std::to_string(from) + "-" +
                                             std::to_string(body.size() - 1) + "/" +
                                             std::to_string(body.size())}},
                      body.substr(from)};
            }
            return {200, {}, body};
          }
      return {404, {}, "no such blob"};
    }
    // /org/name/resolve/<revision>/<file>
    const size_t at = r.path.find("/resolve/");
    if (at == std::string::npos) return {404, {}, ""};
    const std::string repo = r.path.substr(1, at - 1);
    const std::string rest = r.path.substr(at + 9);
    const std::string revision = rest.substr(0, rest.find('/')),
                      file = rest.substr(rest.find('/') + 1);
    if (repo == "org/old")  // a renamed repository: a redirect on the Hub itself
      return {307, {{"Location", "/org/tiny/resolve/" + revision + "/" + file}}, ""};
    if (repo == "org/private" &&
        (!r.headers.count("authorization") || r.headers.at("authorization") != "Bearer " + token))
      return {401, {}, "unauthorized"};
    auto it = repos.find(repo);
    if (it == repos.end() || !tags.count(revision) || !it->second.count(file))
      return {404, {{"X-Error-Code", "EntryNotFound"}}, "not found"};
    const std::string& bytes = it->second.at(file);
    if (file.size() > 12 && file.substr(file.size() - 12) == ".safetensors") {
      const std::string sha = hex_digest(bytes, false);
      return {302,
              {{"Location", cdn + "/cdn/" + sha},
               {"X-Repo-Commit", kCommit},
               {"X-Linked-Etag", "\"" + sha + "\""},
               {"X-Linked-Size", std::to_string(bytes.size())},
               {"ETag", "\"" + hex_digest("pointer", true) + "\""}},
              ""};
    }
    return {200,
            {{"X-Repo-Commit", kCommit}, {"ETag", "W/\"" + hex_digest(bytes, true) + "\""}},
            bytes};
  }
};

class Env {
 public:
  void set(const char* k, const std::string& v) {
    remember(k);
    ::setenv(k, v.c_str(), 1);
  }
  void unset(const char* k) {
    remember(k);
    ::unsetenv(k);
  }
  ~Env() {
    for (auto& [k, v] : saved_)
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
  }

 private:
  void remember(const char* k) {
    if (saved_.count(k)) return;
    const char* v = std::getenv(k);
    saved_[k] = v ? std::optional<std::string>(v) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(Hub, DownloadsIntoHuggingfaceHubsLayoutAndChecksEveryFile) {
  const std::string fixtures = std::string(KILN_FIXTURES_DIR) + "/pretrained/";
  FakeHub hub;
  auto& tiny = hub.repos["org/tiny"];
  tiny["config.json"] = slurp(fixtures + "v5-classifier/config.json");
  tiny["model.safetensors"] = slurp(fixtures + "v5-classifier/model.safetensors");
  tiny["preprocessor_config.json"] = R"({"size": {"height": 16, "width": 16}, "resample": 3})";
  auto& sharded = hub.repos["org/sharded"];
  for (const char* f :
       {"config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"})
    sharded[f] = slurp(fixtures + "v5-sharded/" + f);
  hub.repos["org/private"] = tiny;
  // A language model: its tokenizer comes with it.
  auto& gpt2 = hub.repos["org/gpt2"];
  const std::string golden = std::string(KILN_FIXTURES_DIR) + "/gpt2_golden/tied/";
  gpt2["config.json"] = slurp(golden + "config.json");
  gpt2["model.safetensors"] = slurp(golden + "model.safetensors");
  gpt2["tokenizer.json"] =
      slurp(std::string(KILN_FIXTURES_DIR) + "/tokenizer_golden/tokenizer.json");
  hub.token = "secret";
  // (CDN blobs are addressed by their content: the corrupt one has its own.)
  auto& bad = hub.repos["org/corrupt"];
  bad["config.json"] = slurp(fixtures + "v4-classifier/config.json");
  bad["model.safetensors"] = slurp(fixtures + "v4-classifier/model.safetensors");
  hub.corrupt[hex_digest(bad["model.safetensors"], false)] =
      std::string(bad["model.safetensors"].size(), 'x');
  Server server([&](const Request& r) { return hub(r); });
  hub.cdn = "http://localhost:" + server.url().substr(server.url().rfind(':') + 1);

  const fs::path cache = fs::temp_directory_path() / ("kiln-hub-" + std::to_string(::getpid()));
  fs::remove_all(cache);
  Env env;
  env.set("HF_ENDPOINT", server.url());
  env.set("HF_HUB_CACHE", cache.string());
  env.unset("HF_HUB_OFFLINE");
  env.unset("HF_TOKEN");
  env.unset("HUGGING_FACE_HUB_TOKEN");

  // A model with an LFS file behind a redirect: huggingface_hub's layout.
  io::Pretrained m = io::load_pretrained("org/tiny");
  io::Pretrained want = io::load_pretrained(fixtures + "v5-classifier");
  for (auto& [name, p] : want.params)
    EXPECT_EQ(m.params.at(name).to_vector<float>(), p.to_vector<float>()) << name;
  EXPECT_TRUE(m.has_processor);
  EXPECT_EQ(m.processor.resample, data::Resample::bicubic);
  const fs::path repo = cache / "models--org--tiny";
  EXPECT_EQ(slurp((repo / "refs/main").string()), kCommit);
  const fs::path snap = repo / "snapshots" / kCommit;
  EXPECT_EQ(fs::read_symlink(snap / "config.json").string(),
            "../../blobs/" + hex_digest(tiny["config.json"], true));
  EXPECT_EQ(fs::read_symlink(snap / "model.safetensors").string(),
            "../../blobs/" + hex_digest(tiny["model.safetensors"], false));
  EXPECT_EQ(slurp((snap / "model.safetensors").string()), tiny["model.safetensors"]);
  for (auto& e : fs::directory_iterator(repo / "blobs"))
    EXPECT_EQ(e.path().string().find(".incomplete"), std::string::npos) << e.path();
  bool redirected = false;
  for (auto& r : server.requests())
    redirected |= r.path.rfind("/cdn/", 0) == 0 && r.method == "GET";
  EXPECT_TRUE(redirected);

  // Cached now: no request at all; a tag gets its ref; the commit itself works.
  server.clear();
  io::load_pretrained("org/tiny");
  EXPECT_TRUE(server.requests().empty());
  io::load_pretrained("org/tiny@v1");
  EXPECT_EQ(slurp((repo / "refs/v1").string()), kCommit);
  server.clear();
  io::load_pretrained("org/tiny@" + kCommit);
  EXPECT_TRUE(server.requests().empty());

  // A language model's tokenizer.json lands in its snapshot; the files it
  // lacks (vocab.json, merges.txt) are not an error.
  const io::Pretrained lm = io::load_pretrained("org/gpt2");
  EXPECT_TRUE(lm.model->causal_lm());
  const fs::path lm_snap = cache / "models--org--gpt2" / "snapshots" / kCommit;
  EXPECT_EQ(slurp((lm_snap / "tokenizer.json").string()), gpt2["tokenizer.json"]);
  EXPECT_FALSE(fs::exists(lm_snap / "vocab.json"));
  EXPECT_EQ(data::Tokenizer::from_folder(io::resolve_model_source("org/gpt2")).vocab_size(), 1200);
  // An image model's repository is not asked for a tokenizer.
  for (auto& r : server.requests())
    EXPECT_EQ(r.path.find("org/tiny/resolve/main/tokenizer"), std::string::npos) << r.path;

  // A renamed repository: followed on the Hub, cached under the name asked for.
  io::load_pretrained("org/old");
  EXPECT_TRUE(fs::exists(cache / "models--org--old" / "snapshots" / kCommit / "model.safetensors"));

  // A sharded model: the index, then each shard it lists.
  io::Pretrained s = io::load_pretrained("org/sharded");
  EXPECT_EQ(s.params.size(), io::load_pretrained(fixtures + "v5-sharded").params.size());

  // A private model: 401 names the URL and HF_TOKEN; with the token it loads.
  std::string e = error_of([] { io::load_pretrained("org/private"); });
  EXPECT_HAS(e,
             "the Hub answered 401 for " + server.url() + "/org/private/resolve/main/config.json");
  EXPECT_HAS(e, "set HF_TOKEN");
  env.set("HF_TOKEN", "secret");
  server.clear();
  io::load_pretrained("org/private");
  env.unset("HF_TOKEN");
  int to_hub = 0;
  for (auto& r : server.requests()) {
    if (r.path.rfind("/cdn/", 0) == 0)  // the CDN is another host: no token goes there
      EXPECT_FALSE(r.headers.count("authorization")) << r.path;
    else
      to_hub +=
          r.headers.count("authorization") && r.headers.at("authorization") == "Bearer secret";
  }
  EXPECT_GE(to_hub, 3);

  // 404: no such model, or no such revision.
  EXPECT_HAS(error_of([] { io::load_pretrained("org/missing"); }), "the Hub answered 404 for");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/tiny@nope"); }),
             "/org/tiny/resolve/nope/config.json");

  // Bytes that do not match the ETag never become visible.
  e = error_of([] { io::load_pretrained("org/corrupt"); });
  EXPECT_HAS(e, "download of model.safetensors from " + hub.cdn + "/cdn/");
  EXPECT_HAS(e, "rejected: its SHA-256 is ");
  const fs::path corrupt = cache / "models--org--corrupt";
  EXPECT_FALSE(fs::exists(corrupt / "blobs" / hex_digest(bad["model.safetensors"], false)));
  EXPECT_FALSE(fs::exists(corrupt / "blobs" /
                          (hex_digest(bad["model.safetensors"], false) + ".incomplete")));
  EXPECT_FALSE(fs::exists(corrupt / "snapshots" / kCommit / "model.safetensors"));

  // A download cut short resumes with a Range request.
  hub.repos["org/resume"] = tiny;
  const std::string sha = hex_digest(tiny["model.safetensors"], false);
  fs::create_directories(cache / "models--org--resume" / "blobs");
  {
    std::ofstream part(cache / "models--org--resume" / "blobs" / (sha + ".incomplete"),
                       std::ios::binary);
    part << tiny["model.safetensors"].substr(0, 1000);
  }
  server.clear();
  io::load_pretrained("org/resume");
  bool ranged = false;
  for (auto& r : server.requests())
    if (r.path == "/cdn/" + sha && r.method == "GET")
      ranged = r.headers.count("range") && r.headers.at("range") == "bytes=1000-";
  EXPECT_TRUE(ranged);
  EXPECT_EQ(slurp((cache / "models--org--resume" / "blobs" / sha).string()),
            tiny["model.safetensors"]);
  // A download that was complete but not yet checked: checked, not fetched again.
  hub.repos["org/complete"] = tiny;
  fs::create_directories(cache / "models--org--complete" / "blobs");
  {
    std::ofstream part(cache / "models--org--complete" / "blobs" / (sha + ".incomplete"),
                       std::ios::binary);
    part << tiny["model.safetensors"];
  }
  server.clear();
  io::load_pretrained("org/complete");
  for (auto& r : server.requests()) EXPECT_NE(r.path, "/cdn/" + sha);
  // A server that ignores the range: the download starts over.
  hub.repos["org/restart"] = tiny;
  hub.honour_ranges = false;
  fs::create_directories(cache / "models--org--restart" / "blobs");
  {
    std::ofstream part(cache / "models--org--restart" / "blobs" / (sha + ".incomplete"),
                       std::ios::binary);
    part << tiny["model.safetensors"].substr(0, 1000);
  }
  io::load_pretrained("org/restart");
  EXPECT_EQ(slurp((cache / "models--org--restart" / "blobs" / sha).string()),
            tiny["model.safetensors"]);

  // Offline: the cache serves what it has; what it lacks is an error naming it.
  env.set("HF_HUB_OFFLINE", "1");
  server.clear();
  io::load_pretrained("org/tiny");
  EXPECT_TRUE(server.requests().empty());
  e = error_of([] { io::load_pretrained("org/absent"); });
  EXPECT_HAS(e, (cache / "models--org--absent").string() + " does not exist");
  EXPECT_HAS(e, "HF_HUB_OFFLINE is set");
  EXPECT_TRUE(server.requests().empty());
  env.unset("HF_HUB_OFFLINE");

  // No network: the URL, and what to do.
  env.set("HF_ENDPOINT", "http://127.0.0.1:1");
  e = error_of([] { io::load_pretrained("org/elsewhere"); });
  EXPECT_HAS(e, "cannot reach http://127.0.0.1:1/org/elsewhere/resolve/main/config.json");
  EXPECT_HAS(e, "HF_HUB_OFFLINE=1");
  fs::remove_all(cache);
}

}  // namespace
}  // namespace kiln
