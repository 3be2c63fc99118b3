// kiln train: the data sets of a run, the training split and the held-out
// split (random images, Fashion-MNIST, an image folder; a language model's
// text or token files).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "internal.h"
#include "kiln/gpt2.h"
#include "kiln/tokens.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;

// n examples of a data set spread evenly over it (--eval-samples): example
// i is the whole set's i * size / n, so that an image folder's held-out
// split, which is in class order, gives every class its share.
class SpreadExamples final : public data::Dataset {
 public:
  SpreadExamples(std::shared_ptr<const data::Dataset> all, int64_t n)
      : all_(std::move(all)), n_(n) {}
  int64_t size() const override { return n_; }
  Shape image_shape() const override { return all_->image_shape(); }
  DType sample_dtype() const override { return all_->sample_dtype(); }
  void get_tokens(int64_t index, int32_t* tokens) const override {
    all_->get_tokens(at(index), tokens);
  }
  void get(int64_t index, float* image, int32_t* label) const override {
    all_->get(at(index), image, label);
  }
  void get(int64_t index, int64_t epoch, float* image, int32_t* label) const override {
    all_->get(at(index), epoch, image, label);
  }

 private:
  int64_t at(int64_t index) const { return index * all_->size() / n_; }
  std::shared_ptr<const data::Dataset> all_;
  int64_t n_;
};

// The folder of a language model's tokenizer: --tokenizer, else the
// pretrained model's or the resumed checkpoint's folder.
std::string tokenizer_dir(const TrainConfig& cfg) {
  if (!cfg.tokenizer.empty()) return cfg.tokenizer;
  if (!cfg.init_from.empty()) return io::resolve_model_source(cfg.init_from);
  if (!cfg.resume_dir.empty()) return cfg.resume_dir;
  fail("train", "--data " + cfg.data +
                    " needs a tokenizer: --tokenizer DIR (a folder with tokenizer.json, or "
                    "vocab.json and merges.txt), or --init-from a model folder that has one");
}

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

DataSplits lm_datasets(const TrainConfig& cfg, const nn::Model& model) {
  const bool text = cfg.data.rfind("text:", 0) == 0, tokens = cfg.data.rfind("tokens:", 0) == 0;
  if (!text && !tokens)
    fail("train", "--data '" + cfg.data + "': " + model.architecture() +
                      " is a language model; expected text:PATH or tokens:PATH");
  const nn::GPT2LMHeadModel* lm = nn::as_gpt2(model);
  const int64_t positions = lm ? lm->config().n_positions : 0;
  const int64_t seq = cfg.seq_len > 0 ? cfg.seq_len : positions;
  if (seq < 2 || (positions > 0 && seq > positions))
    fail("train", "--seq-len " + std::to_string(seq) + ": expected 2 ... " +
                      std::to_string(positions) + " (the model's n_positions)");
  const int64_t vocab = model.num_logits();
  DataSplits d;
  auto ids = std::make_shared<std::vector<int32_t>>();
  std::shared_ptr<std::vector<int32_t>> held;
  if (text) {
    const std::string path = cfg.data.substr(5), dir = tokenizer_dir(cfg);
    const data::Tokenizer tok = data::Tokenizer::from_folder(dir);
    if (tok.vocab_size() > vocab)
      fail("train", "the tokenizer of " + dir + " has " + std::to_string(tok.vocab_size()) +
                        " tokens, more than the model's vocab_size " + std::to_string(vocab));
    const data::TextTokens t = data::tokenize_text(
        path, tok, tok.token_id("<|endoftext|>").value_or(-1), data::token_cache_dir());
    *ids = t.ids;
    char mb[32];
    std::snprintf(mb, sizeof mb, "%.2f MB", static_cast<double>(t.bytes) / 1e6);
    d.description = cfg.data + ": " + std::to_string(t.files) +
                    (t.files == 1 ? " file, " : " files, ") + mb + ", " +
                    with_commas(static_cast<int64_t>(ids->size())) + " tokens" +
                    (t.cached               ? " (read from the cache " + t.cache_file + ")"
                     : t.cache_file.empty() ? ""
                                            : " (tokenized; cached in " + t.cache_file + ")");
    const bool json = fs::exists(fs::path(dir) / "tokenizer.json");
    for (const char* f : json ? std::vector<const char*>{"tokenizer.json"}
                              : std::vector<const char*>{"vocab.json", "merges.txt"})
      d.files[f] = io::read_file((fs::path(dir) / f).string(), "tokenizer");
  } else {
    const std::string path = cfg.data.substr(7);
    if (fs::is_directory(path)) {
      // nanoGPT's folder: train.bin and val.bin.
      *ids = data::read_token_file((fs::path(path) / "train.bin").string(), vocab);
      if (fs::exists(fs::path(path) / "val.bin"))
        held = std::make_shared<std::vector<int32_t>>(
            data::read_token_file((fs::path(path) / "val.bin").string(), vocab));
    } else {
      *ids = data::read_token_file(path, vocab);
    }
    d.description =
        cfg.data + ": " + with_commas(static_cast<int64_t>(ids->size())) + " tokens" +
        (held ? " (and " + with_commas(static_cast<int64_t>(held->size())) + " held out in val.bin)"
              : "");
  }
  const int64_t blocks = static_cast<int64_t>(ids->size()) / seq;
  if (held) {
    if (blocks < 1)
      fail("train", cfg.data + ": " + std::to_string(ids->size()) +
                        " tokens, not one block of --seq-len " + std::to_string(seq));
    d.train = std::make_shared<data::TokenBlocks>(ids, seq);
    if (static_cast<int64_t>(held->size()) >= seq)
      d.eval = std::make_shared<data::TokenBlocks>(held, seq);
    return d;
  }
  // The last 10% of the blocks (at least one) are held out.
  const int64_t eval_blocks = std::max<int64_t>(1, blocks / 10);
  if (blocks - eval_blocks < 1)
    fail("train", cfg.data + ": " + std::to_string(ids->size()) + " tokens make " +
                      std::to_string(blocks) + " blocks of --seq-len " + std::to_string(seq) +
                      ": too few to train on one and hold out one for evaluation");
  const int64_t cut = (blocks - eval_blocks) * seq;
  d.train = std::make_shared<data::TokenBlocks>(ids, seq, 0, cut);
  d.eval = std::make_shared<data::TokenBlocks>(ids, seq, cut, blocks * seq);
  return d;
}

}  // namespace

nn::Size2d data_image_size(const TrainConfig& cfg, const nn::Model& model) {
  if (cfg.image_size.height > 0) return cfg.image_size;
  if (model.fixed_image_size()) return model.image_size();
  return cfg.data == "fashion-mnist" ? nn::Size2d(28) : model.image_size();
}

std::optional<data::ImageProcessor> data_processor(
    const TrainConfig& cfg, const nn::Model& model,
    const std::optional<data::ImageProcessor>& given) {
  if (cfg.data.rfind("imagefolder:", 0) != 0 || model.num_channels() != 3) return std::nullopt;
  if (given) return given;
  data::ImageProcessor p;
  p.size = data_image_size(cfg, model);
  return p;
}

std::optional<data::ImageProcessor> saved_processor(
    const TrainConfig& cfg, const nn::Model& model,
    const std::optional<data::ImageProcessor>& given) {
  if (cfg.data == "fashion-mnist" && !model.causal_lm()) {
    // Fashion-MNIST's pixels as its loader makes them: 28x28, scaled to
    // [0, 1], normalized with the data set's mean and std.
    const data::FashionMnistOptions fm;
    data::ImageProcessor p;
    p.size = 28;
    p.image_mean.assign(3, fm.mean);
    p.image_std.assign(3, fm.std);
    return p;
  }
  return data_processor(cfg, model, given);
}

namespace {

// cfg.data's splits, whole.
DataSplits all_datasets(const TrainConfig& cfg, const nn::Model& model,
                        const std::optional<data::ImageProcessor>& processor) {
  if (model.causal_lm()) return lm_datasets(cfg, model);
  if (cfg.data.rfind("text:", 0) == 0 || cfg.data.rfind("tokens:", 0) == 0)
    fail("train", "--data " + cfg.data + " is text for a language model; --model " +
                      cfg.model_name + " is an image model (" + model.architecture() + ")");
  DataSplits d;
  const nn::Size2d size = data_image_size(cfg, model);
  const int64_t channels = model.num_channels(), labels = model.num_labels();
  if (cfg.data == "random") {
    data::RandomImagesOptions dopt;
    dopt.num_labels = labels;
    dopt.image_size = size;  // height and width
    dopt.channels = channels;
    dopt.layout = cfg.layout;
    dopt.seed = cfg.seed;
    dopt.num_samples =
        std::max<int64_t>(cfg.batch_size * cfg.accumulate * cfg.steps, cfg.batch_size);
    d.train = std::make_shared<data::RandomImages>(dopt);
  } else if (cfg.data == "fashion-mnist") {
    if (channels != 1 || size != 28 || labels != 10)
      fail("train",
           "--data fashion-mnist needs a model with num_channels 1, image_size 28 and "
           "num_labels 10 (e.g. --model vit-fmnist or resnet-fmnist), got " +
               std::to_string(channels) + ", " + nn::to_string(size) + " and " +
               std::to_string(labels));
    d.train = std::make_shared<data::FashionMnist>(data::FashionMnistOptions{.dir = cfg.data_dir,
                                                                             .split = "train",
                                                                             .layout = cfg.layout,
                                                                             .hflip = cfg.augment,
                                                                             .seed = cfg.seed});
    d.eval = std::make_shared<data::FashionMnist>(
        data::FashionMnistOptions{.dir = cfg.data_dir, .split = "test", .layout = cfg.layout});
  } else if (cfg.data.rfind("imagefolder:", 0) == 0) {
    // A convolutional model takes the size its processor makes (a checkpoint's
    // or a pretrained model's), unless --image-size says otherwise.
    const std::optional<data::ImageProcessor> proc = data_processor(cfg, model, processor);
    nn::Size2d folder_size = size;
    if (proc && !model.fixed_image_size() && cfg.image_size.height <= 0) {
      if (proc->do_center_crop)
        folder_size = proc->crop_size;
      else if (proc->do_resize && proc->shortest_edge == 0)
        folder_size = proc->size;
    }
    data::ImageFolderOptions o{.root = cfg.data.substr(12),
                               .split = "train",
                               .image_size = folder_size,
                               .channels = channels,
                               .augment = cfg.augment,
                               .layout = cfg.layout,
                               .skip_bad = cfg.skip_bad_images,
                               .seed = cfg.seed,
                               .processor = proc,
                               .random_crop = cfg.random_crop,
                               .crop_scale = {cfg.crop_scale[0], cfg.crop_scale[1]},
                               .crop_ratio = {cfg.crop_ratio[0], cfg.crop_ratio[1]},
                               .flip_prob = cfg.flip_prob,
                               .color_jitter = cfg.color_jitter,
                               .rand_augment = cfg.rand_augment};
    if (proc)  // timm's img_mean: the normalization mean x 255, rounded half to even
      for (int c = 0; c < 3; ++c)
        o.rand_augment.fill[c] =
            static_cast<uint8_t>(std::min(255.0, std::nearbyint(255 * proc->image_mean[c])));
    auto train_folder = std::make_shared<data::ImageFolder>(o);
    if (static_cast<int64_t>(train_folder->classes().size()) != labels)
      fail("train",
           "--data " + cfg.data + " has " + std::to_string(train_folder->classes().size()) +
               " classes (sub-folders), the model has num_labels " + std::to_string(labels));
    o.split = "holdout";
    o.augment = false;
    auto held = std::make_shared<data::ImageFolder>(o);
    if (held->size() > 0) d.eval = held;  // else fewer than 10 files per class: no evaluation
    d.skipped = train_folder->skipped();
    d.train = train_folder;
  } else {
    fail("train", "--data '" + cfg.data +
                      "', expected random, fashion-mnist, imagefolder:PATH (images), text:PATH or "
                      "tokens:PATH (a language model's)");
  }
  return d;
}

}  // namespace

DataSplits make_datasets(const TrainConfig& cfg, const nn::Model& model,
                         const std::optional<data::ImageProcessor>& processor) {
  DataSplits d = all_datasets(cfg, model, processor);
  if (d.eval) d.eval = spread_examples(d.eval, cfg.eval_samples);
  return d;
}

std::shared_ptr<const data::Dataset> spread_examples(std::shared_ptr<const data::Dataset> all,
                                                     int64_t n) {
  if (n < 0) fail("data", "spread_examples takes n >= 0, got " + std::to_string(n));
  if (n == 0 || n >= all->size()) return all;
  return std::make_shared<SpreadExamples>(std::move(all), n);
}

DataSplits load_data(const TrainConfig& cfg, const std::optional<data::ImageProcessor>& processor) {
  return make_datasets(cfg, *cfg.model, processor);
}

}  // namespace kiln::train
