// kiln — files: safetensors, HuggingFace config.json, pretrained models and checkpoints.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/convnext.h"
#include "kiln/data.h"
#include "kiln/model.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/resnet.h"
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

// The model of a config.json by its model_type (nn::model_from_config):
// errors name the file, and an unknown model_type the types kiln has.
std::shared_ptr<const nn::Model> load_model_config(const std::string& path);

// Reads transformers' preprocessor_config.json for ViTImageProcessor: every
// field it uses (do_resize; size as an integer, [height, width],
// {height, width} or {shortest_edge[, longest_edge]}; resample 0-5;
// do_center_crop and crop_size; do_rescale, rescale_factor; do_normalize,
// image_mean, image_std as 3 numbers or one; do_convert_rgb), null meaning
// the default. Unknown fields and processor types other than ViT's are
// accepted and said in `notes`; invalid values raise an error naming the
// file and the field.
data::ImageProcessor parse_image_processor(std::string_view json, const std::string& path,
                                           std::vector<std::string>* notes = nullptr);
// DIR/preprocessor_config.json; when absent, ViTImageProcessor's defaults,
// and `notes` says so.
data::ImageProcessor load_image_processor(const std::string& dir,
                                          std::vector<std::string>* notes = nullptr);
// The file transformers' ViTImageProcessor.from_pretrained reads back to
// the same processor; save_image_processor writes it atomically.
std::string image_processor_json(const data::ImageProcessor& processor);
void save_image_processor(const std::string& path, const data::ImageProcessor& processor);

// A model that transformers saved (save_pretrained) or that the Hugging Face
// Hub holds: its model, its weights in transformers' names (f32), and what
// loading it converted or left out.
struct Pretrained {
  std::string dir;  // the folder its files were read from
  std::shared_ptr<const nn::Model> model;  // of config.json's model_type
  Params params;
  Params state;  // the model's state (BatchNorm's running statistics), none for a ViT
  // False for a headless ViTModel checkpoint (or one whose classifier was
  // dropped): params lack classifier.weight and classifier.bias.
  bool has_classifier = false;
  // Its preprocessor_config.json; when it has none (has_processor false),
  // ViTImageProcessor's defaults at the model's image size.
  data::ImageProcessor processor;
  bool has_processor = false;
  std::vector<std::string> notes;  // for the user: conversions, ignored tensors, a new classifier
};

// Reads a pretrained model of any registered family from SRC (a ViT, a
// DeiT, a ResNet, a ConvNeXt: config.json's model_type says which):
// - a folder as transformers' save_pretrained writes it: config.json
//   (transformers 4.x or 5.x) and model.safetensors, or the shards that
//   model.safetensors.index.json lists (file names confined to the folder);
//   ViTForImageClassification or headless ViTModel names (no "vit." prefix;
//   its pooler, which the classifier does not use, left out), transformers
//   5's in-memory names too; F32, F16, BF16 or F64 weights, converted to f32;
// - a Hub id, "org/name" or "org/name@revision" (a branch, tag or commit),
//   from the local Hugging Face cache where huggingface_hub keeps it
//   (hub_cache_dir(): models--org--name/refs/<revision>, snapshots/<commit>/),
//   every file confined to the repository's folder of the cache.
// Weights that do not fit the config name the tensor and both shapes.
Pretrained load_pretrained(const std::string& src);
// The folder SRC names: SRC itself when it is a folder, else the snapshot of
// the Hub id SRC in the local cache; an error says where it looked.
std::string resolve_model_source(const std::string& src);
// Whether HF_HUB_OFFLINE is set (1, ON, YES or TRUE, as huggingface_hub reads it).
bool hub_offline();
// Downloads what kiln reads of Hub model `repo` ("org/name") at `revision`
// (a branch, tag or commit) from $HF_ENDPOINT (https://huggingface.co) with
// $HF_TOKEN into hub_cache_dir() exactly as huggingface_hub lays it out
// (blobs/<etag>, snapshots/<commit>/<file> linking to ../../blobs/<etag>,
// refs/<revision>), so that transformers finds it offline: config.json,
// preprocessor_config.json when there is one, model.safetensors or
// model.safetensors.index.json and its shards, and the files of `extra` when
// the Hub has them. Each file is fetched into blobs/<etag>.incomplete
// (resumed with a Range request when one is there), checked (its size, the
// SHA-256 of an LFS file or the git blob SHA-1 of another against the ETag)
// and only then renamed into place; TLS is verified; a progress line goes to
// stderr. Returns the snapshot folder. 401, 404, no network and
// HF_HUB_OFFLINE get an error naming the URL or the cache and what to do.
std::string hub_download(const std::string& repo, const std::string& revision,
                         const std::vector<std::string>& extra = {});
// huggingface_hub's cache: $HF_HUB_CACHE (or $HUGGINGFACE_HUB_CACHE), else
// $HF_HOME/hub, else ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub.
std::string hub_cache_dir();
// Gives `m` a classifier for `labels` (the data's label names): when they
// differ from the checkpoint's in number or names, or it has no classifier,
// a new one is drawn as transformers does for ignore_mismatched_sizes
// (weights truncated normal with std initializer_range, biases zero) and
// m.notes says so; a classifier whose labels are transformers' made-up names
// (LABEL_0 ...) is kept when the number fits, taking the data's names. Empty
// labels keep the checkpoint's (a headless one gets a classifier for
// config.num_labels).
void adapt_classifier(Pretrained& m, const std::vector<std::string>& labels,
                      const random::Key& key);
// Converts F16, BF16 and F64 tensors of `params` to f32, on the host.
void widen_to_f32(Params& params);
// Gives `m` the image size `image_size`: its position embeddings are resampled
// for the new grid of patches as transformers' interpolate_pos_encoding does
// (nn::resample_position_embeddings), once, and m.notes says so; its
// processor makes pixel values of the new size (a centre crop keeps its
// ratio to the resize).
void set_image_size(Pretrained& m, nn::Size2d image_size);

// Writes `contents` to `path` atomically (temp file in the same folder, fsync, rename).
void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path, const std::string& origin);

// A family's config.json read into its config type by C::from_json(text,
// path, extra...) (e.g. load_config<nn::ResNetConfig>(path); the ViT
// family's from_json takes the model_type, "deit" for a DeiT, after the
// path): every field that changes what the model computes, errors naming the
// file and the field (the family's from_json says what it reads).
template <class C, class... Extra>
C load_config(const std::string& path, const Extra&... extra) {
  return C::from_json(read_file(path, "config"), path, extra...);
}
// Writes a family's config (C::to_json: the config.json that transformers'
// from_pretrained loads) atomically.
template <class C>
void save_config(const std::string& path, const C& config) {
  write_file_atomic(path, config.to_json());
}

// A training checkpoint: a directory that transformers loads with
// AutoModelForImageClassification.from_pretrained(DIR) (config.json and
// model.safetensors: the parameters and the model's state), plus kiln's
// training state (training_state.safetensors:
// the optimizer's buffers; trainer.json: step, seed, data position, the
// optimizer's name).
struct Checkpoint {
  std::shared_ptr<const nn::Model> model;  // of any registered family
  Params params;
  std::string optimizer;  // "sgd", "adamw"
  optim::State state;     // buffers and step count
  uint64_t seed = 0;
  int64_t data_position = 0;  // serial number of the next training batch
  // How evaluation processes images (preprocessor_config.json), where the
  // model takes RGB images that a processor describes.
  std::optional<data::ImageProcessor> processor;
  // --save-best: the accuracy of the evaluation this checkpoint was saved
  // after (-1: not saved so), so that a resumed run keeps the best.
  double best_accuracy = -1;
  // A moving average of the weights (train --ema), written beside them as
  // DIR/ema/, a folder transformers loads (config.json, model.safetensors,
  // preprocessor_config.json). Not read back: the optimizer state holds it.
  Params ema;
  // The model's state (BatchNorm's running statistics; none for a ViT),
  // saved among the weights as transformers keeps it.
  Params model_state;
  // Files written beside the weights as they are, name -> contents (a
  // language model's tokenizer.json, or vocab.json and merges.txt, so that
  // the checkpoint is a folder kiln generate and transformers read whole).
  std::map<std::string, std::string> files;
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

// Writes DIR as transformers' save_pretrained does, for
// AutoModelForImageClassification.from_pretrained(DIR): config.json
// (Model::config_json), model.safetensors holding the parameters (f32) and
// the state (BatchNorm's running statistics, as transformers keeps them
// among the weights) and, when given, preprocessor_config.json; staged in
// DIR.tmp and renamed into place as a checkpoint is. Parameters that do not
// fit the model are an error naming the tensor.
void save_pretrained(const std::string& dir, const nn::Model& model, const Params& params,
                     const Params& state = {},
                     const std::optional<data::ImageProcessor>& processor = std::nullopt);

}  // namespace kiln::io
