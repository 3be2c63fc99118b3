// kiln train: what its source files share and nothing outside src/train uses
// (the clock, the optimizer of a config, the targets a model learns).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "kiln/train.h"

namespace kiln::train {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// cfg.optimizer with cfg's learning rate, betas, momentum and weight decay.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg);

// The processor a run saves with its checkpoints (preprocessor_config.json,
// which kiln predict reads): data_processor's, or for Fashion-MNIST the
// loader's own normalization at 28x28 (greyscale).
std::optional<data::ImageProcessor> saved_processor(
    const TrainConfig& cfg, const nn::Model& model,
    const std::optional<data::ImageProcessor>& given);

// The data sets of cfg for `model` (cfg.model, or a resumed checkpoint's);
// an RGB image folder's images processed by `processor` (data_processor).
DataSplits make_datasets(const TrainConfig& cfg, const nn::Model& model,
                         const std::optional<data::ImageProcessor>& processor);

// The data sets label each image with a class (integer); a language
// model's labels are its tokens, as they are. A model trained for
// another problem type learns from the class in the form that problem needs:
// its one-hot vector (float) for multi-label classification and for
// regression with several outputs, the class index as a number for
// regression with one output.
Array targets_for(const nn::Model& model, const Array& classes);

// Whether `param` is trained: all are, but the classifier's alone with
// --freeze-backbone.
bool trains(const TrainConfig& cfg, const std::string& param);
// Whether `param` belongs to a classifier head ("classifier.", ResNet's
// "classifier.1.", DeiT's "cls_classifier." and "distillation_classifier.").
bool in_head(const std::string& param);

// A model without a classifier (num_labels 0) has no classes to learn (a
// language model learns its tokens).
void require_classifier(const nn::Model& model, const std::string& origin);

}  // namespace kiln::train
