// Helpers the tests share: the message of what a call throws, a JSON
// fixture read whole, and the kiln command to run.
#pragma once
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace kiln::test_util {

// What f throws (std::exception's what()), or "" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// tests/fixtures/<name>, parsed.
inline nlohmann::json json_fixture(const std::string& name) {
  std::ifstream f(std::string(KILN_FIXTURES_DIR) + "/" + name);
  std::stringstream s;
  s << f.rdbuf();
  return nlohmann::json::parse(s.str());
}

// The kiln command the tests run: $KILN_CLI where it is set (bench/gpu/check.sh
// sets it to the carried bundle's kiln on a GPU machine, where this build's
// folder does not exist), else this build's.
inline std::string kiln_cli_path() {
  const char* e = std::getenv("KILN_CLI");
  return e && *e ? std::string(e) : std::string(KILN_CLI_PATH);
}

}  // namespace kiln::test_util
