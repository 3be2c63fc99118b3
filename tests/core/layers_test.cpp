// DESIGN's layer rule, checked on the sources: a layer includes only its own
// headers and those of the layers below it (public ones in include/kiln/ and
// internal ones in src/<layer>/); nothing outside src/backend includes a
// backend's headers; the command line (tools/kiln) uses the public headers
// only; and every source and header says what it holds in its first comment.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Layers, lowest first. The backends sit beside the compiler: both build on
// the ops, neither includes the other, and nothing above them includes a
// backend (nothing above knows how a kernel is written).
const std::vector<std::string> kLayers{"core", "ops",   "transforms", "compiler", "nn",
                                       "optim", "data", "io",         "train"};

int rank_of(const std::string& layer) {
  if (layer == "backend") return 3;  // beside the compiler
  for (size_t i = 0; i < kLayers.size(); ++i)
    if (kLayers[i] == layer) return static_cast<int>(i);
  return -1;
}

// The layer that owns each public header.
const std::map<std::string, std::string> kPublic{
    {"allocator.h", "core"},
    {"array.h", "core"},
    {"device.h", "core"},
    {"dtype.h", "core"},
    {"error.h", "core"},
    {"shape.h", "core"},
    {"distributed.h", "core"},  // the process group (its MPI engine is in src/backend)
    {"ops.h", "ops"},
    {"random.h", "ops"},
    {"transforms.h", "transforms"},
    {"compiler.h", "compiler"},
    {"kiln.h", "compiler"},
    {"nn.h", "nn"},
    {"resnet.h", "nn"},
    {"convnext.h", "nn"},
    {"model.h", "nn"},
    {"layers.h", "nn"},
    {"gpt2.h", "nn"},
    {"optim.h", "optim"},
    {"data.h", "data"},
    {"tokenizer.h", "data"},
    {"tokens.h", "data"},
    {"io.h", "io"},
    {"train.h", "train"}};

// The layer an included path belongs to ("" when it is not kiln's).
std::string layer_of_include(const std::string& inc) {
  if (inc.rfind("kiln/", 0) == 0) {
    auto it = kPublic.find(inc.substr(5));
    return it == kPublic.end() ? "?" + inc : it->second;
  }
  const auto slash = inc.find('/');
  if (slash == std::string::npos) return "";
  const std::string first = inc.substr(0, slash);
  return rank_of(first) >= 0 ? first : "";
}

std::vector<std::string> includes_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const size_t hash = line.find_first_not_of(" \t");
    if (hash == std::string::npos || line[hash] != '#') continue;
    const size_t inc = line.find_first_not_of(" \t", hash + 1);
    if (inc == std::string::npos || line.compare(inc, 7, "include") != 0) continue;
    const size_t open = line.find('"', inc + 7);
    const size_t close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close != std::string::npos) out.push_back(line.substr(open + 1, close - open - 1));
  }
  return out;
}

bool is_source(const fs::path& p) {
  const auto e = p.extension();
  return e == ".cpp" || e == ".h";
}

const fs::path kRoot = KILN_SOURCE_DIR;

// Every file of the library (src/<layer>/..., include/kiln/...) with its layer.
std::vector<std::pair<fs::path, std::string>> library_files() {
  std::vector<std::pair<fs::path, std::string>> files;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "src"))
    if (e.is_regular_file() && is_source(e.path()))
      files.push_back({e.path(), fs::relative(e.path(), kRoot / "src").begin()->string()});
  for (const auto& e : fs::directory_iterator(kRoot / "include" / "kiln"))
    if (e.is_regular_file() && is_source(e.path()))
      files.push_back({e.path(), kPublic.count(e.path().filename().string())
                                     ? kPublic.at(e.path().filename().string())
                                     : "?"});
  return files;
}

TEST(Layers, LowerNeverIncludesHigher) {
  int checked = 0;
  for (const auto& [file, layer] : library_files()) {
    ASSERT_GE(rank_of(layer), 0) << file << ": in no layer of DESIGN.md";
    for (const std::string& inc : includes_of(file)) {
      const std::string to = layer_of_include(inc);
      if (to.empty()) continue;
      ++checked;
      ASSERT_GE(rank_of(to), 0) << file << " includes \"" << inc << "\", which is in no layer";
      if (to == "backend")
        EXPECT_EQ(layer, "backend") << file << " (" << layer << ") includes a backend's \"" << inc
                                    << "\": only backends know how a kernel is written";
      else if (layer == "backend")
        EXPECT_TRUE(to == "core" || to == "ops")
            << file << " (backend) includes \"" << inc << "\" of layer " << to;
      else
        EXPECT_LE(rank_of(to), rank_of(layer))
            << file << " (layer " << layer << ") includes \"" << inc << "\" of higher layer " << to;
    }
  }
  EXPECT_GT(checked, 100);  // the scan found the includes
}

// The library each layer is built into (CMakeLists.txt): a layer reaches
// the layers of another library through their public headers alone, so
// that nothing above the engine depends on its internals.
std::string library_of(const std::string& layer) {
  if (layer == "nn" || layer == "optim") return "kiln-nn";
  if (layer == "data" || layer == "io") return "kiln-io";
  if (layer == "train") return "kiln-train";
  return "kiln-engine";
}

TEST(Layers, AnotherLibrarysLayersThroughPublicHeadersOnly) {
  int checked = 0;
  for (const auto& [file, layer] : library_files()) {
    if (file.parent_path().filename() == "kiln") continue;  // a public header
    for (const std::string& inc : includes_of(file)) {
      const std::string to = layer_of_include(inc);
      if (to.empty() || inc.rfind("kiln/", 0) == 0) continue;
      ++checked;
      EXPECT_EQ(library_of(to), library_of(layer))
          << file << " (" << library_of(layer) << ") includes \"" << inc << "\", internal to "
          << library_of(to) << ": add a public entry point to its include/kiln/ header";
    }
  }
  EXPECT_GT(checked, 100);
}

// Families are plug-ins (issue 43): outside the ViT family's own files (its
// header kiln/nn.h, src/nn/vit*.cpp) and its Python bindings, the library
// and the command line take an nn::Model and never name ViTConfig.
TEST(Layers, OnlyTheVitFamilyNamesViTConfig) {
  std::vector<fs::path> files;
  for (const auto& [file, layer] : library_files()) files.push_back(file);
  for (const auto& e : fs::directory_iterator(kRoot / "tools" / "kiln"))
    if (is_source(e.path())) files.push_back(e.path());
  int scanned = 0;
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    if (name == "nn.h" || name.rfind("vit", 0) == 0) continue;
    std::ifstream in(file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ++scanned;
    EXPECT_EQ(text.find("ViTConfig"), std::string::npos) << file << " names ViTConfig";
  }
  EXPECT_GT(scanned, 100);
}

TEST(Layers, TheCommandLineUsesPublicHeadersOnly) {
  for (const auto& e : fs::directory_iterator(kRoot / "tools" / "kiln")) {
    if (!is_source(e.path())) continue;
    for (const std::string& inc : includes_of(e.path())) {
      const std::string to = layer_of_include(inc);
      EXPECT_TRUE(to.empty() || inc.rfind("kiln/", 0) == 0)
          << e.path() << " includes the library's internal \"" << inc << "\"";
    }
  }
}

TEST(Layers, EveryFileSaysWhatItHoldsFirst) {
  std::vector<fs::path> files;
  for (const auto& [file, layer] : library_files()) files.push_back(file);
  for (const auto& e : fs::directory_iterator(kRoot / "tools" / "kiln"))
    if (is_source(e.path())) files.push_back(e.path());
  for (const auto& file : files) {
    std::ifstream in(file);
    std::string first;
    std::getline(in, first);
    EXPECT_EQ(first.rfind("// ", 0), 0u) << file << " does not start with a comment";
  }
}

// The text of `file` with comments, string literals and character literals
// blanked out (newlines kept, so that line numbers stay).
std::string code_only(const fs::path& file) {
  std::ifstream in(file);
  std::string t((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out(t.size(), ' ');
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '\n') {
      out[i] = '\n';
    } else if (t.compare(i, 2, "//") == 0) {
      while (i + 1 < t.size() && t[i + 1] != '\n') ++i;
    } else if (t.compare(i, 2, "/*") == 0) {
      for (i += 2; i + 1 < t.size() && t.compare(i, 2, "*/") != 0; ++i)
        if (t[i] == '\n') out[i] = '\n';
      ++i;
    } else if (t[i] == '"' || t[i] == '\'') {
      const char q = t[i];
      if (q == '"' && i > 0 && t[i - 1] == 'R') {  // a raw string: R"delim( ... )delim"
        const size_t paren = t.find('(', i);
        const std::string end = ")" + t.substr(i + 1, paren - i - 1) + "\"";
        const size_t stop = t.find(end, paren);
        for (size_t k = i; k < stop; ++k)
          if (t[k] == '\n') out[k] = '\n';
        i = stop + end.size() - 1;
        continue;
      }
      for (++i; i < t.size() && t[i] != q && t[i] != '\n'; ++i)
        if (t[i] == '\\') ++i;
    } else {
      out[i] = t[i];
    }
  }
  return out;
}

// Whether the code before a '{' on its line opens a namespace, class, struct,
// enum or union body (not a function's).
bool opens_scope(const std::string& before) {
  for (const char* kw : {"namespace", "class", "struct", "enum", "union"}) {
    const size_t at = before.rfind(kw);
    if (at == std::string::npos) continue;
    const size_t end = at + std::string(kw).size();
    const bool word = (at == 0 || !(std::isalnum(static_cast<unsigned char>(before[at - 1])) ||
                                     before[at - 1] == '_')) &&
                      (end == before.size() || before[end] == ' ' || before[end] == '{');
    if (word && before.find_first_of(";(){}", end) == std::string::npos) return true;
  }
  return false;
}

// The first line and length of each function body in `file`: a brace count
// over its code; the bodies of namespaces, classes, structs and enums are not
// functions, the functions inside them are.
std::vector<std::pair<int, int>> function_lengths(const fs::path& file) {
  const std::string text = code_only(file);
  struct Open {
    int line;
    bool scope;
  };
  std::vector<Open> stack;
  std::vector<std::pair<int, int>> out;
  int line = 1;
  size_t start = 0;  // where the current line starts
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      start = i + 1;
    } else if (c == '{') {
      stack.push_back({line, opens_scope(text.substr(start, i - start))});
    } else if (c == '}' && !stack.empty()) {
      const Open o = stack.back();
      stack.pop_back();
      bool top = !o.scope;
      for (const Open& s : stack) top = top && s.scope;
      if (top) out.push_back({o.line, line - o.line + 1});
    }
  }
  return out;
}

// Issues #15 and #27: the library, its headers and the command line in
// readable pieces (CUDA sources too).
TEST(Layers, NoFunctionIsOver120Lines) {
  int functions = 0;
  for (const char* dir : {"src", "include", "tools"})
    for (auto it = fs::recursive_directory_iterator(kRoot / dir);
         it != fs::recursive_directory_iterator(); ++it) {
      const fs::directory_entry& e = *it;
      // Not kiln's: hidden folders (the golden fixtures' virtual environment
      // in tools/golden/.venv holds transformers' CUDA kernels).
      if (e.is_directory() && e.path().filename().string().starts_with(".")) {
        it.disable_recursion_pending();
        continue;
      }
      const auto ext = e.path().extension();
      if (!e.is_regular_file() || !(is_source(e.path()) || ext == ".cu" || ext == ".cuh")) continue;
      for (auto [first, length] : function_lengths(e.path())) {
        ++functions;
        EXPECT_LE(length, 120) << e.path() << ":" << first << ": a function of " << length
                               << " lines";
      }
    }
  EXPECT_GT(functions, 1000);
}

}  // namespace
