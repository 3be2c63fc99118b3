// Helpers the tests share: the message of what a call throws, a JSON
// fixture read whole, the largest difference of two arrays, the kiln
// command to run, and an environment variable set for a scope.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kiln/array.h"

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

// The largest |a - b| over the largest |b| (b the reference).
inline double max_relative_error(const Array& a, const Array& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  if (x.size() != y.size()) return INFINITY;
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / scale;
}

// The kiln command the tests run: $KILN_CLI where it is set (bench/gpu/check.sh
// sets it to the carried bundle's kiln on a GPU machine, where this build's
// folder does not exist), else this build's.
inline std::string kiln_cli_path() {
  const char* e = std::getenv("KILN_CLI");
  return e && *e ? std::string(e) : std::string(KILN_CLI_PATH);
}

// Sets an environment variable for its scope; restores what it was (or
// unsets it) when the scope ends, whatever the test did.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) {
      saved_ = v;
      had_ = true;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, saved_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

}  // namespace kiln::test_util
