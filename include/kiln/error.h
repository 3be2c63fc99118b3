// kiln — errors. Every user-facing error names its origin ("[matmul] ...").
#pragma once
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws kiln::Error("[origin] message").
[[noreturn]] void fail(const std::string& origin, const std::string& message);

}  // namespace kiln
