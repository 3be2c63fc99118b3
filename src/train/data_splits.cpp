// kiln train: the data sets of a run, the training split and the held-out
// split (random images, Fashion-MNIST, an image folder).
#include <algorithm>
#include <cmath>

#include "internal.h"

namespace kiln::train {

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

DataSplits make_datasets(const TrainConfig& cfg, const nn::Model& model,
                         const std::optional<data::ImageProcessor>& processor) {
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
    fail("train", "--data '" + cfg.data + "', expected random, fashion-mnist or imagefolder:PATH");
  }
  return d;
}

DataSplits load_data(const TrainConfig& cfg, const std::optional<data::ImageProcessor>& processor) {
  return make_datasets(cfg, *cfg.model, processor);
}

}  // namespace kiln::train
