// Every input that ever crashed a fuzz harness (tests/fuzz/regressions/<target>/)
// and every seed of the fuzz corpora (fuzz/corpus/<target>/), fed to the same
// entry points as the libFuzzer harnesses: each must load, or fail with a
// kiln::Error that names the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "../../fuzz/targets.h"
#include "kiln/kiln.h"

namespace kiln {
namespace fuzz {
// gtest names a parameter by this (not by its bytes).
void PrintTo(const Target& target, std::ostream* os) {
  *os << target.name;
}
}  // namespace fuzz

namespace {

namespace fs = std::filesystem;

std::string read_whole(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// Feeds `file` to `target`: it loads or throws kiln::Error; anything else fails.
void expect_ok_or_kiln_error(const fuzz::Target& target, const fs::path& file) {
  SCOPED_TRACE(file.string());
  try {
    target.feed(read_whole(file));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find('['), std::string::npos)
        << "a kiln::Error names its origin: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "kiln-fuzz-" << target.name << " " << file << ": a " << typeid(e).name()
                  << " escaped instead of kiln::Error: " << e.what();
  }
}

class FuzzTarget : public ::testing::TestWithParam<fuzz::Target> {};

TEST_P(FuzzTarget, EveryInputThatEverCrashedItNowLoadsOrFailsWithAKilnError) {
  for (const fs::path& file : files_in(fs::path(KILN_FUZZ_REGRESSIONS_DIR) / GetParam().name))
    expect_ok_or_kiln_error(GetParam(), file);
}

TEST_P(FuzzTarget, EverySeedLoadsOrFailsWithAKilnError) {
  auto seeds = files_in(fs::path(KILN_FUZZ_DIR) / "corpus" / GetParam().name);
  EXPECT_FALSE(seeds.empty()) << "no seeds in fuzz/corpus/" << GetParam().name;
  for (const fs::path& file : seeds) expect_ok_or_kiln_error(GetParam(), file);
}

INSTANTIATE_TEST_SUITE_P(Fuzz, FuzzTarget, ::testing::ValuesIn(fuzz::targets()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kiln
