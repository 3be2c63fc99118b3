// kiln train with models of every family through the model interface: a
// ResNet (BatchNorm's running statistics carried through every mode's step,
// saved in the checkpoint, resumed, used by evaluation) and a ConvNeXt with
// stochastic depth (the same draws in eager, lazy and jit).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>

#include "../test_util.h"
#include "core/array_node.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/train.h"
#include "train/step.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("kiln-families-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p.string();
}

std::shared_ptr<const nn::Model> tiny_resnet(int64_t channels = 3, int64_t labels = 5) {
  return nn::model_from_config(
      R"({"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
          "layer_type": "basic", "num_channels": )" +
          std::to_string(channels) + R"(, "num_labels": )" + std::to_string(labels) + "}",
      "tiny_resnet.json");
}

train::TrainConfig run_of(std::shared_ptr<const nn::Model> model, const std::string& mode) {
  train::TrainConfig t;
  t.model = std::move(model);
  t.model_name = "tiny";
  t.batch_size = 4;
  t.mode = train::parse_mode(mode == "eager-compile" ? "eager" : mode);
  t.compile_model = mode == "eager-compile";
  t.steps = 4;
  t.warmup = 0;
  t.lr = 0.05;
  t.momentum = 0.9;
  t.weight_decay = 1e-4;
  t.clip_norm = 1.0;
  t.image_size = 16;
  t.workers = 0;
  return t;
}

double max_relative_difference(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (auto& [name, x] : a) {
    auto u = astype(x, DType::f64).to_vector<double>();
    auto v = astype(b.at(name), DType::f64).to_vector<double>();
    for (size_t i = 0; i < u.size(); ++i)
      worst = std::max(worst, std::fabs(u[i] - v[i]) / std::max(1.0, std::fabs(v[i])));
  }
  return worst;
}

// Every mode trains a ResNet to the same parameters and running statistics;
// the checkpoint holds the statistics beside the weights, and
// num_batches_tracked counts the batches (two per step with --accumulate 2).
TEST(TrainFamilies, AResNetTrainsAlikeInEveryModeWithItsStatistics) {
  for (int64_t accumulate : {1, 2}) {
    Params ref, ref_state;
    for (std::string mode : {"eager", "eager-compile", "lazy", "jit"}) {
      SCOPED_TRACE(mode + " accumulate " + std::to_string(accumulate));
      const std::string dir = temp_dir("resnet-" + mode);
      train::TrainConfig t = run_of(tiny_resnet(), mode);
      t.accumulate = accumulate;
      t.save_dir = dir;
      const train::TrainReport report = train::run(t);
      for (auto& st : report.steps) EXPECT_TRUE(std::isfinite(st.loss));
      EXPECT_GT(report.flops_per_step, 0);
      const io::Checkpoint ck = io::load_checkpoint(dir);
      EXPECT_EQ(ck.model->model_type(), "resnet");
      ASSERT_EQ(ck.model_state.size(), ck.model->state_shapes().size());
      for (auto& [name, v] : ck.model_state) {
        if (name.ends_with("num_batches_tracked")) {
          EXPECT_EQ(v.dtype(), DType::i64) << name;
          EXPECT_EQ(v.item<int64_t>(), 4 * accumulate) << name;
        } else if (name.ends_with("running_mean")) {
          EXPECT_GT(sum(abs(v)).item<float>(), 0.0f) << name;  // moved from its initial zeros
        }
      }
      fs::remove_all(dir);
      if (ref.empty()) {
        ref = ck.params, ref_state = ck.model_state;
        continue;
      }
      EXPECT_LT(max_relative_difference(ck.params, ref), 1e-4);
      EXPECT_LT(max_relative_difference(ck.model_state, ref_state), 1e-4);
    }
  }
}

// An eager step's new running statistics hold no graph: kept, each step's
// statistics would hold that step's activations (their batch statistics read
// them) and the previous step's statistics, so that memory grew every step.
TEST(TrainFamilies, EagerStatisticsDoNotHoldTheForwardsGraph) {
  for (const std::string mode : {"eager", "lazy", "jit"}) {
    SCOPED_TRACE(mode);
    const train::TrainConfig t = run_of(tiny_resnet(), mode);
    const auto optimizer = optim::SGD({.lr = 0.1});
    Params params = t.model->init(random::Key(0)), state = t.model->init_state();
    optim::State opt = optimizer.init(params);
    train::TrainStep step(t, *t.model, optimizer, params, state, opt);
    const Array x = random::normal(random::Key(1), {4, 3, 16, 16});
    const Array y = Array::from_data(std::vector<int64_t>{0, 1, 2, 3}.data(), {4}, DType::i64);
    for (int i = 0; i < 2; ++i) {
      std::vector<Array> scalars;
      for (double v : optimizer.scalars(opt.step + 1, 0.1))
        scalars.push_back(Array::scalar(static_cast<float>(v)));
      step(params, state, opt, {x, y, random::key_array(random::Key(2)), scalars});
    }
    for (auto& [name, v] : state) {
      EXPECT_TRUE(v.node()->inputs.empty()) << name;
      EXPECT_NE(v.node()->buffer, nullptr) << name;
    }
  }
}

// A run stopped after 2 steps and resumed from its checkpoint ends where 4
// steps in one run end: parameters and running statistics bit for bit.
TEST(TrainFamilies, AResumedResNetContinuesItsStatistics) {
  const std::string whole = temp_dir("resnet-whole"), half = temp_dir("resnet-half");
  train::TrainConfig t = run_of(tiny_resnet(), "jit");
  t.save_dir = whole;
  train::run(t);
  train::TrainConfig a = run_of(tiny_resnet(), "jit");
  a.save_dir = half;
  a.save_every = 2;
  struct Stop {};
  try {
    train::run(a, {.on_save = [](int64_t step, const std::string&) {
                 if (step == 2) throw Stop{};
               }});
  } catch (const Stop&) {
  }
  train::TrainConfig b = run_of(tiny_resnet(), "jit");
  b.resume_dir = half;
  b.save_dir = half;
  EXPECT_EQ(train::run(b).first_step, 3);
  const io::Checkpoint x = io::load_checkpoint(half), y = io::load_checkpoint(whole);
  EXPECT_EQ(max_relative_difference(x.params, y.params), 0.0);
  EXPECT_EQ(max_relative_difference(x.model_state, y.model_state), 0.0);
  fs::remove_all(whole);
  fs::remove_all(half);
}

// Stochastic depth draws from the step's key: eager, lazy and jit drop the
// same branches and end at the same parameters; another seed does not.
TEST(TrainFamilies, AConvNextWithDropPathTrainsAlikeInEveryMode) {
  const auto model = nn::model_from_config(
      R"({"model_type": "convnext", "hidden_sizes": [8, 16], "depths": [2, 1], "num_labels": 5,
          "drop_path_rate": 0.5, "layer_scale_init_value": 0, "image_size": 16})",
      "tiny_convnext.json");
  Params ref;
  for (std::string mode : {"eager", "eager-compile", "lazy", "jit"}) {
    SCOPED_TRACE(mode);
    const std::string dir = temp_dir("convnext-" + mode);
    train::TrainConfig t = run_of(model, mode);
    t.save_dir = dir;
    train::run(t);
    Params p = io::load_checkpoint(dir).params;
    fs::remove_all(dir);
    if (ref.empty()) {
      ref = p;
      continue;
    }
    EXPECT_LT(max_relative_difference(p, ref), 1e-4);
  }
  const std::string dir = temp_dir("convnext-seed");
  train::TrainConfig t = run_of(model, "jit");
  t.seed = 1;
  t.save_dir = dir;
  train::run(t);
  EXPECT_GT(max_relative_difference(io::load_checkpoint(dir).params, ref), 1e-3);
  fs::remove_all(dir);
}

// --drop-path on a ViT and a DeiT (stochastic depth that transformers'
// classes lack, timm's linear rule): every mode draws the same per-example
// masks and trains to the same parameters, and not to the parameters of the
// run without it; the checkpoint's config.json keeps the rate. A ResNet has
// none to set: the error names it.
TEST(TrainFamilies, DropPathTrainsAViTAndADeiTAlikeInEveryMode) {
  for (const std::string type : {"vit", "deit"}) {
    SCOPED_TRACE(type);
    const auto model = nn::model_from_config(
        R"({"model_type": ")" + type +
            R"(", "hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2,
            "intermediate_size": 32, "image_size": 16, "patch_size": 8, "num_labels": 5})",
        "tiny.json");
    auto trained = [&](const std::string& mode, double drop_path) {
      const std::string dir = temp_dir(type + "-drop-path-" + mode);
      train::TrainConfig t = run_of(model, mode);
      t.drop_path = drop_path;
      t.save_dir = dir;
      train::run(t);
      io::Checkpoint ck = io::load_checkpoint(dir);
      fs::remove_all(dir);
      return ck;
    };
    const io::Checkpoint ref = trained("eager", 0.5);
    EXPECT_NE(ref.model->config_json().find("\"drop_path_rate\": 0.5"), std::string::npos)
        << ref.model->config_json();
    EXPECT_TRUE(ref.model->stochastic());
    for (std::string mode : {"eager-compile", "lazy", "jit"}) {
      SCOPED_TRACE(mode);
      EXPECT_LT(max_relative_difference(trained(mode, 0.5).params, ref.params), 1e-4);
    }
    EXPECT_GT(max_relative_difference(trained("jit", 0).params, ref.params), 1e-3);
  }
  train::TrainConfig t = run_of(tiny_resnet(), "jit");
  t.drop_path = 0.1;
  const std::string error = test_util::error_of([&] { train::run(t); });
  EXPECT_NE(error.find("ResNetForImageClassification has no stochastic depth"), std::string::npos)
      << error;
}

// bf16 mixed precision trains both convolutional families alike in every
// mode (the same bf16 roundings of the same values; the compiled modes may
// move an f32 value by an ulp and so a bf16 rounding by one bf16 ulp, as
// with the ViT), and not as f32 does: the precision reached the convolutions.
TEST(TrainFamilies, Bf16ConvNetsTrainAlikeInEveryMode) {
  const auto convnext = nn::model_from_config(
      R"({"model_type": "convnext", "hidden_sizes": [8, 16], "depths": [2, 1], "num_labels": 5,
          "drop_path_rate": 0.5, "image_size": 16})",
      "tiny_convnext.json");
  for (const auto& model : {tiny_resnet(), convnext}) {
    Params ref;
    for (std::string mode : {"eager", "lazy", "jit"}) {
      SCOPED_TRACE(model->model_type() + " " + mode);
      const std::string dir = temp_dir("bf16-" + mode);
      train::TrainConfig t = run_of(model, mode);
      t.precision = "bf16";
      t.save_dir = dir;
      for (auto& st : train::run(t).steps) EXPECT_TRUE(std::isfinite(st.loss));
      Params p = io::load_checkpoint(dir).params;
      fs::remove_all(dir);
      for (auto& [name, v] : p) EXPECT_EQ(v.dtype(), DType::f32) << name;  // f32 masters
      if (ref.empty()) {
        ref = p;
        continue;
      }
      EXPECT_LT(max_relative_difference(p, ref), 1e-3);
    }
    const std::string dir = temp_dir("f32");
    train::TrainConfig t = run_of(model, "jit");
    t.save_dir = dir;
    train::run(t);
    EXPECT_GT(max_relative_difference(io::load_checkpoint(dir).params, ref), 1e-4);
    fs::remove_all(dir);
  }
}

void write_idx_gz(const std::string& path, const Shape& shape, int modulo) {
  std::vector<uint8_t> b{0, 0, 0x08, static_cast<uint8_t>(shape.size())};
  int64_t n = 1;
  for (int64_t d : shape) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
    n *= d;
  }
  for (int64_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>((i * 37) % modulo));
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, b.data(), b.size()), static_cast<int>(b.size()));
  gzclose(f);
}

// A tiny ResNet's jit run on a Fashion-MNIST folder written into `data`
// (28x28 grey images, 10 classes; `train` and `test` examples).
train::TrainConfig resnet_on_fashion_mnist(const std::string& data, int64_t train, int64_t test) {
  fs::create_directories(data);
  write_idx_gz(data + "/train-images-idx3-ubyte.gz", {train, 28, 28}, 256);
  write_idx_gz(data + "/train-labels-idx1-ubyte.gz", {train}, 10);
  write_idx_gz(data + "/t10k-images-idx3-ubyte.gz", {test, 28, 28}, 256);
  write_idx_gz(data + "/t10k-labels-idx1-ubyte.gz", {test}, 10);
  train::TrainConfig t = run_of(tiny_resnet(1, 10), "jit");
  t.image_size = 0;  // Fashion-MNIST's 28
  t.data = "fashion-mnist";
  t.data_dir = data;
  return t;
}

// --eval-samples N: N examples of the held-out split, spread evenly over it
// (example i is the whole split's i * size / N), so a split in class order
// keeps every class.
TEST(TrainFamilies, EvalSamplesSpreadsOverTheHeldOutSplit) {
  const std::string data = temp_dir("fmnist-spread");
  train::TrainConfig t = resnet_on_fashion_mnist(data, 4, 10);
  const train::DataSplits whole = train::load_data(t);
  ASSERT_EQ(whole.eval->size(), 10);
  t.eval_samples = 4;
  const train::DataSplits part = train::load_data(t);
  ASSERT_EQ(part.eval->size(), 4);
  const int64_t pixels = 28 * 28;
  std::vector<float> a(pixels), b(pixels);
  for (int64_t i = 0; i < 4; ++i) {
    int32_t la = -1, lb = -2;
    part.eval->get(i, a.data(), &la);
    whole.eval->get(i * 10 / 4, b.data(), &lb);  // 0, 2, 5, 7
    EXPECT_EQ(la, lb) << i;
    EXPECT_EQ(a, b) << i;
  }
  int32_t l0 = -1, l1 = -1;
  part.eval->get(1, a.data(), &l0);
  whole.eval->get(1, b.data(), &l1);
  EXPECT_NE(l0, l1);    // not the split's first examples
  t.eval_samples = 20;  // more than the split holds: all of it
  EXPECT_EQ(train::load_data(t).eval->size(), 10);
  fs::remove_all(data);
}

// A ResNet on Fashion-MNIST-shaped data (28x28 grey, 10 classes):
// evaluation normalizes by the running statistics, and evaluating the saved
// checkpoint gives the run's last numbers; --freeze-backbone trains only
// the classifier while the statistics still follow the batches.
TEST(TrainFamilies, AResNetEvaluatesWithItsRunningStatistics) {
  const std::string data = temp_dir("fmnist"), dir = temp_dir("resnet-fmnist");
  train::TrainConfig t = resnet_on_fashion_mnist(data, 16, 10);
  t.save_dir = dir;
  const train::TrainReport report = train::run(t);
  ASSERT_EQ(report.evals.size(), 1u);
  EXPECT_EQ(report.evals[0].samples, 10);
  const io::Checkpoint ck = io::load_checkpoint(dir);
  EXPECT_EQ(ck.model->label_names()[0], "T-shirt/top");  // the data's labels
  const train::DataSplits splits = train::load_data(t);
  for (bool compiled : {false, true}) {
    const train::EvalResult e = train::evaluate(ck.model, ck.params, ck.model_state, *splits.eval,
                                                4, nn::Layout::NCHW, compiled);
    EXPECT_NEAR(e.loss, report.evals[0].loss, 1e-4 * std::max(1.0, e.loss));
    EXPECT_DOUBLE_EQ(e.accuracy, report.evals[0].accuracy);
  }
  // Fresh statistics (zero means, unit variances) give other logits.
  const train::EvalResult fresh = train::evaluate(ck.model, ck.params, ck.model->init_state(),
                                                  *splits.eval, 4, nn::Layout::NCHW, false);
  EXPECT_GT(std::fabs(fresh.loss - report.evals[0].loss), 1e-3);

  train::TrainConfig frozen = t;
  frozen.freeze_backbone = true;
  frozen.init_from.clear();
  const std::string fdir = temp_dir("resnet-frozen");
  frozen.save_dir = fdir;
  frozen.seed = 0;
  train::run(frozen);
  const io::Checkpoint f = io::load_checkpoint(fdir);
  const Params init = f.model->init(random::split(random::Key(0), 3)[0]);
  for (auto& [name, v] : f.params) {
    const double moved = max_relative_difference({{name, v}}, {{name, init.at(name)}});
    if (name.rfind("classifier.", 0) == 0) {
      EXPECT_GT(moved, 0.0) << name;
    } else {
      EXPECT_EQ(moved, 0.0) << name;
    }
  }
  for (auto& [name, v] : f.model_state) {
    if (name.ends_with("num_batches_tracked")) {
      EXPECT_EQ(v.item<int64_t>(), 4) << name;
    }
  }
  for (const auto& d : {data, dir, fdir}) fs::remove_all(d);
}

// --freeze-backbone trains the heads alone: a DeiT with a teacher's two
// (cls_classifier and distillation_classifier) move, nothing else does.
TEST(TrainFamilies, FreezeBackboneTrainsEveryHeadOfADeiT) {
  const auto model = nn::model_from_config(
      R"({"model_type": "deit", "architectures": ["DeiTForImageClassificationWithTeacher"],
          "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 32, "image_size": 16, "patch_size": 8, "num_labels": 5})",
      "tiny_deit.json");
  train::TrainConfig t = run_of(model, "jit");
  t.freeze_backbone = true;
  const std::string dir = temp_dir("deit-frozen");
  t.save_dir = dir;
  train::run(t);
  const io::Checkpoint f = io::load_checkpoint(dir);
  const Params init = f.model->init(random::split(random::Key(0), 3)[0]);
  int heads = 0;
  for (auto& [name, v] : f.params) {
    const double moved = max_relative_difference({{name, v}}, {{name, init.at(name)}});
    if (name.find("classifier.") != std::string::npos) {
      ++heads;
      EXPECT_GT(moved, 0.0) << name;
    } else {
      EXPECT_EQ(moved, 0.0) << name;
    }
  }
  EXPECT_EQ(heads, 4);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
