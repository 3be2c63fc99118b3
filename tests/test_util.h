// Helpers the tests share: the message of what a call throws, and a JSON
// fixture read whole.
#pragma once
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

}  // namespace kiln::test_util
