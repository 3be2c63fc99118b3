// kiln io: what its source files share and nothing outside src/io uses.
#pragma once
#include <string>

namespace kiln::io {

// The value of an environment variable, "" when unset.
std::string env(const char* name);

// A file name from a sharded index or the Hub: a plain name in the model's
// folder (no folders, no '..', at most 255 bytes); else an error from
// `origin` naming `where` the name came from.
void check_model_file_name(const std::string& name, const std::string& where,
                           const std::string& origin);

}  // namespace kiln::io
