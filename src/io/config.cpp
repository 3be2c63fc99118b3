// kiln io: the model of a HuggingFace config.json, by its registered
// model_type.
#include "kiln/io.h"

namespace kiln::io {
std::shared_ptr<const nn::Model> load_model_config(const std::string& path) {
  return nn::model_from_config(read_file(path, "config"), path);
}

}  // namespace kiln::io
