// kiln — files: safetensors and HuggingFace config.json.
#pragma once
#include <map>
#include <string>

#include "kiln/nn.h"
#include "kiln/transforms.h"

namespace kiln::io {

struct SafetensorsFile {
  Params tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" entry
};

// Reads a .safetensors file. Malformed files (bad header length, invalid JSON,
// unknown dtype, offsets out of range or overlapping, truncated data) raise
// kiln::Error naming the file and the problem.
SafetensorsFile load_safetensors(const std::string& path);
// Writes arrays (any dtype kiln has) atomically: a temporary file, then rename.
void save_safetensors(const std::string& path, const Params& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads transformers' config.json for ViTForImageClassification; a value kiln
// cannot honour gets an error naming the field.
nn::ViTConfig load_vit_config(const std::string& path);
// Writes a config.json that transformers' ViTConfig.from_pretrained loads.
void save_vit_config(const std::string& path, const nn::ViTConfig& cfg);

// Writes `contents` to `path` atomically (temp file in the same folder, fsync, rename).
void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path, const std::string& origin);

}  // namespace kiln::io
