// The build's paths that the tests read (the source tree, its fixtures and
// fuzz corpora, the kiln command), included into every test file
// (CMakeLists.txt: -include). They are defined in one generated file,
// build/generated/test_paths.cpp, not given as every test file's flags, so
// that a test's object is the same in every clone and build folder and ccache
// shares it between them (CI's clones, the fresh-Debian root, the stages).
#pragma once

namespace kiln::test_paths {
extern const char* const kSourceDir;
extern const char* const kFixturesDir;
extern const char* const kFuzzDir;
extern const char* const kFuzzRegressionsDir;
extern const char* const kCliPath;
}  // namespace kiln::test_paths

#define KILN_SOURCE_DIR (::kiln::test_paths::kSourceDir)
#define KILN_FIXTURES_DIR (::kiln::test_paths::kFixturesDir)
#define KILN_FUZZ_DIR (::kiln::test_paths::kFuzzDir)
#define KILN_FUZZ_REGRESSIONS_DIR (::kiln::test_paths::kFuzzRegressionsDir)
#define KILN_CLI_PATH (::kiln::test_paths::kCliPath)
