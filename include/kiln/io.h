// kiln — files: safetensors and HuggingFace config.json.
#pragma once
#include <map>
#include <string>
#include <string_view>

#include "kiln/nn.h"
#include "kiln/optim.h"
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
// The same from the file's bytes; `path` is named in errors.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path);
// Writes arrays (any dtype kiln has) atomically: a temporary file, then rename.
void save_safetensors(const std::string& path, const Params& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads transformers' config.json for ViTForImageClassification: every field
// that changes what it computes (ViTConfig's fields, image_size and patch_size
// as integers or [height, width], every ACT2FN hidden_act, id2label or
// num_labels, problem_type, pruned_heads). Fields that change nothing it
// computes (encoder_stride, the pooler's, torch_dtype, output switches,
// attn_implementation "eager" or "sdpa", unknown keys) are accepted and
// ignored. A value kiln cannot honour gets an error naming the file and the
// field, what was found and what was expected.
nn::ViTConfig load_vit_config(const std::string& path);
// The same from the file's text; `path` is named in errors.
nn::ViTConfig parse_vit_config(std::string_view json, const std::string& path);
// Writes a config.json that transformers' ViTConfig.from_pretrained loads.
void save_vit_config(const std::string& path, const nn::ViTConfig& cfg);

// Writes `contents` to `path` atomically (temp file in the same folder, fsync, rename).
void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path, const std::string& origin);

// A training checkpoint: a directory that transformers loads with
// ViTForImageClassification.from_pretrained(DIR) (config.json and
// model.safetensors), plus kiln's training state (training_state.safetensors:
// the optimizer's buffers; trainer.json: step, seed, data position, the
// optimizer's name).
struct Checkpoint {
  nn::ViTConfig config;
  Params params;
  std::string optimizer;  // "sgd", "adamw"
  optim::State state;     // buffers and step count
  uint64_t seed = 0;
  int64_t data_position = 0;  // serial number of the next training batch
};

// Writes DIR atomically: everything goes to DIR.tmp first; then DIR (if any)
// is renamed to DIR.old, DIR.tmp to DIR, and DIR.old is removed. A run killed
// at any point leaves a complete checkpoint in DIR or, between the two
// renames, in DIR.old, which load_checkpoint falls back to.
void save_checkpoint(const std::string& dir, const Checkpoint& ckpt);
// The first half of save_checkpoint (exposed for tests): writes DIR.tmp.
std::string stage_checkpoint(const std::string& dir, const Checkpoint& ckpt);
// The second half: the renames.
void commit_checkpoint(const std::string& staged, const std::string& dir);
Checkpoint load_checkpoint(const std::string& dir);

}  // namespace kiln::io
