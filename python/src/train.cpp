// kiln's Python module: training runs. kiln.train.TrainConfig binds
// kiln::train::TrainConfig field by field (its options by the names of
// `kiln train`'s flags, which are the fields' names), and kiln.train.run
// starts train::run from one through train::prepare, as the command does:
// the same checks and errors, without a command line in between.
#include <filesystem>
#include <functional>

#include "common.h"

namespace kiln_python {
namespace {

using kiln::train::TrainConfig;

nb::dict step_dict(const kiln::train::StepTiming& s) {
  nb::dict d;
  d["step"] = s.step;
  d["seconds"] = s.seconds;
  d["data_seconds"] = s.data_seconds;
  d["loss"] = s.loss;
  d["lr"] = s.lr;
  return d;
}

nb::dict eval_dict(const kiln::train::EvalResult& e) {
  nb::dict d;
  d["step"] = e.step;
  d["loss"] = e.loss;
  d["accuracy"] = e.accuracy;
  d["top5"] = e.top5;
  d["samples"] = e.samples;
  d["seconds"] = e.seconds;
  if (e.has_ema) {
    d["ema_loss"] = e.ema_loss;
    d["ema_accuracy"] = e.ema_accuracy;
    d["ema_top5"] = e.ema_top5;
  }
  return d;
}

nb::dict report_dict(const kiln::train::TrainReport& r) {
  nb::dict d;
  nb::list steps, evals;
  for (auto& s : r.steps) steps.append(step_dict(s));
  for (auto& e : r.evals) evals.append(eval_dict(e));
  d["steps"] = steps;
  d["evals"] = evals;
  d["mean"] = r.mean;
  d["median"] = r.median;
  d["p90"] = r.p90;
  d["min"] = r.min;
  d["max"] = r.max;
  d["images_per_second"] = r.images_per_second;
  d["data_wait_share"] = r.data_wait_share;
  d["first_step_seconds"] = r.first_step_seconds;
  d["compile_ms"] = r.compile_ms;
  d["compiles"] = r.compiles;
  d["parameters"] = r.parameters;
  d["peak_rss_mib"] = r.peak_rss_mib;
  d["wall_seconds"] = r.wall_seconds;
  d["flops_per_step"] = r.flops_per_step;
  return d;
}

// One option of a TrainConfig: its name (the flag's, with underscores),
// how Python reads it and how a Python value sets it.
struct Field {
  std::string name;
  std::function<nb::object(const TrainConfig&)> get;
  std::function<void(TrainConfig&, nb::handle)> set;
  const char* doc;
};

// A Python value as T, or an error that names the option.
template <typename T>
T value_as(nb::handle v, const std::string& name, const char* expected) {
  // Python's bool is an int: not taken for a number, nor a number for a bool.
  const bool is_bool = PyBool_Check(v.ptr());
  if constexpr (std::is_same_v<T, bool>) {
    if (is_bool) return nb::cast<bool>(v);
  } else if constexpr (std::is_arithmetic_v<T>) {
    if (!is_bool) {
      T out{};
      if (nb::try_cast(v, out)) return out;
    }
  } else {
    T out{};
    if (nb::try_cast(v, out)) return out;
  }
  kiln::fail("train", "TrainConfig." + name + " = " + nb::cast<std::string>(nb::repr(v)) +
                          ": expected " + expected);
}

template <typename T>
Field plain(const std::string& name, T TrainConfig::*member, const char* expected,
            const char* doc) {
  return {name, [member](const TrainConfig& c) { return nb::cast(c.*member); },
          [member, name, expected](TrainConfig& c, nb::handle v) {
            c.*member = value_as<T>(v, name, expected);
          },
          doc};
}

// A field of one of TrainConfig's option structs (mixup's, erasing's).
template <typename O, typename T>
Field nested(const std::string& name, O TrainConfig::*outer, T O::*inner, const char* expected,
             const char* doc) {
  return {name, [outer, inner](const TrainConfig& c) { return nb::cast(c.*outer.*inner); },
          [outer, inner, name, expected](TrainConfig& c, nb::handle v) {
            c.*outer.*inner = value_as<T>(v, name, expected);
          },
          doc};
}

// An option that is one of two words, each standing for a value of the field
// (layout: nchw or nhwc; attention: fused or unfused).
template <typename T>
Field either(const std::string& name, T TrainConfig::*member, const char* word_a, T a,
             const char* word_b, T b, const char* doc) {
  const std::string expected = std::string("'") + word_a + "' or '" + word_b + "'";
  return {name, [=](const TrainConfig& c) { return nb::cast(c.*member == a ? word_a : word_b); },
          [=](TrainConfig& c, nb::handle v) {
            const auto s = value_as<std::string>(v, name, expected.c_str());
            if (s != word_a && s != word_b)
              kiln::fail("train", "TrainConfig." + name + " = '" + s + "': expected " + expected);
            c.*member = s == word_a ? a : b;
          },
          doc};
}

// The pair of a MIN,MAX option (crop_scale, crop_ratio).
Field range(const std::string& name, double (TrainConfig::*member)[2], const char* doc) {
  return {name,
          [member](const TrainConfig& c) {
            return nb::cast(nb::make_tuple((c.*member)[0], (c.*member)[1]));
          },
          [member, name](TrainConfig& c, nb::handle v) {
            auto p = value_as<std::vector<double>>(v, name, "(min, max)");
            if (p.size() != 2 || !(p[0] > 0 && p[0] <= p[1] && std::isfinite(p[1])))
              kiln::fail("train",
                         "TrainConfig." + name + ": expected (min, max) with 0 < min <= max");
            (c.*member)[0] = p[0], (c.*member)[1] = p[1];
          },
          doc};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> f = [] {
    std::vector<Field> v;
    v.push_back({"model", [](const TrainConfig& c) { return nb::cast(c.model_name); },
                 [](TrainConfig& c, nb::handle h) {
                   const auto s =
                       value_as<std::string>(h, "model", "a preset name or a config.json path");
                   // A file: a model config (kiln train --config); else a preset.
                   c.model = std::filesystem::is_regular_file(s) ? kiln::io::load_model_config(s)
                                                                 : kiln::nn::model_from_preset(s);
                   c.model_name = s;
                 },
                 "a preset (vit-tiny, resnet-fmnist, gpt2, ...) or a config.json file"});
    v.push_back(
        {"mode", [](const TrainConfig& c) { return nb::cast(kiln::train::mode_name(c.mode)); },
         [](TrainConfig& c, nb::handle h) {
           c.mode = kiln::train::parse_mode(value_as<std::string>(h, "mode", "a mode name"));
         },
         "eager, lazy or jit (or pytorch, torch_xla, jax)"});
    v.push_back(either("layout", &TrainConfig::layout, "nchw", kiln::nn::Layout::NCHW, "nhwc",
                       kiln::nn::Layout::NHWC, "the images' layout: nchw or nhwc (channels last)"));
    v.push_back({"image_size",
                 [](const TrainConfig& c) -> nb::object {
                   return c.image_size.height == 0 ? nb::none() : size2d(c.image_size);
                 },
                 [](TrainConfig& c, nb::handle h) {
                   c.image_size = h.is_none() ? kiln::nn::Size2d(0) : to_size2d(h, "image_size");
                 },
                 "the images' size, H or (H, W); None: the model's"});
    v.push_back(plain("batch_size", &TrainConfig::batch_size, "an int", "images per step"));
    v.push_back(plain("accumulate", &TrainConfig::accumulate, "an int",
                      "batches whose gradients each optimizer step averages"));
    v.push_back(plain("compile_model", &TrainConfig::compile_model, "a bool",
                      "eager mode: forward and backward compiled"));
    v.push_back(plain("steps", &TrainConfig::steps, "an int", "steps, warm-up included"));
    v.push_back(plain("warmup", &TrainConfig::warmup, "an int", "untimed steps at the start"));
    v.push_back(plain("lr", &TrainConfig::lr, "a number", "the learning rate"));
    v.push_back(plain("seed", &TrainConfig::seed, "an int", "the run's random seed"));
    v.push_back(plain("workers", &TrainConfig::workers, "an int",
                      "loader threads (0: the training thread; -1: chosen)"));
    v.push_back(
        plain("log_json", &TrainConfig::log_json, "a path", "a JSON line per step into it"));
    v.push_back(plain("progress", &TrainConfig::progress, "a bool", "a live progress line"));
    v.push_back(plain("data", &TrainConfig::data, "a data set name",
                      "random, fashion-mnist, imagefolder:PATH, text:PATH or tokens:PATH"));
    v.push_back(plain("seq_len", &TrainConfig::seq_len, "an int",
                      "a language model's tokens per block (0: n_positions)"));
    v.push_back(plain("tokenizer", &TrainConfig::tokenizer, "a folder", "text data's tokenizer"));
    v.push_back(plain("skip_bad_images", &TrainConfig::skip_bad_images, "a bool",
                      "skip an image folder's unreadable files"));
    v.push_back(plain("data_dir", &TrainConfig::data_dir, "a folder", "Fashion-MNIST's files"));
    v.push_back(plain("augment", &TrainConfig::augment, "a bool", "random crops and flips"));
    v.push_back({"no_crop", [](const TrainConfig& c) { return nb::cast(!c.random_crop); },
                 [](TrainConfig& c, nb::handle h) {
                   c.random_crop = !value_as<bool>(h, "no_crop", "a bool");
                 },
                 "augment without the random resized crop"});
    v.push_back(range("crop_scale", &TrainConfig::crop_scale, "the crop's area fractions"));
    v.push_back(range("crop_ratio", &TrainConfig::crop_ratio, "the crop's width / height"));
    v.push_back(plain("flip_prob", &TrainConfig::flip_prob, "a number", "a flip's probability"));
    v.push_back({"color_jitter",
                 [](const TrainConfig& c) { return nb::cast(c.color_jitter.brightness); },
                 [](TrainConfig& c, nb::handle h) {
                   const double x = value_as<double>(h, "color_jitter", "a number");
                   c.color_jitter = {x, x, x, 0};
                 },
                 "brightness, contrast and saturation jitter (timm's --color-jitter)"});
    v.push_back(
        {"rand_augment",
         [](const TrainConfig& c) -> nb::object {
           const kiln::data::RandAugmentOptions& r = c.rand_augment;
           if (!r.enabled) return nb::none();
           // timm's string of these options (mstd above 100: uniform).
           char text[200];
           std::snprintf(text, sizeof text, "rand-m%lld-n%lld-p%.17g-mstd%.17g-mmax%lld-inc%d",
                         static_cast<long long>(r.magnitude), static_cast<long long>(r.num_layers),
                         r.prob, std::isinf(r.magnitude_std) ? 101.0 : r.magnitude_std,
                         static_cast<long long>(r.magnitude_max), r.increasing ? 1 : 0);
           return nb::str(text);
         },
         [](TrainConfig& c, nb::handle h) {
           if (h.is_none()) {
             c.rand_augment = {};
             return;
           }
           const auto s = value_as<std::string>(h, "rand_augment", "timm's config string or None");
           c.rand_augment = kiln::data::RandAugmentOptions::parse(s, "rand_augment");
         },
         "timm's RandAugment config string, e.g. rand-m9-mstd0.5; None: off"});
    v.push_back(plain("optimizer", &TrainConfig::optimizer, "sgd or adamw", "sgd or adamw"));
    v.push_back(plain("momentum", &TrainConfig::momentum, "a number", "SGD's momentum"));
    v.push_back(plain("weight_decay", &TrainConfig::weight_decay, "a number", "weight decay"));
    v.push_back(plain("exempt_from_decay", &TrainConfig::exempt_from_decay, "a bool",
                      "no decay on biases, norms and embeddings"));
    v.push_back(plain("layer_decay", &TrainConfig::layer_decay, "a number",
                      "layer-wise learning-rate decay (0: off)"));
    v.push_back(nested("mixup", &TrainConfig::mixup, &kiln::data::MixupOptions::mixup_alpha,
                       "a number", "mixup's Beta(a, a) (0: off)"));
    v.push_back(nested("cutmix", &TrainConfig::mixup, &kiln::data::MixupOptions::cutmix_alpha,
                       "a number", "cutmix's Beta(a, a) (0: off)"));
    v.push_back(nested("mixup_prob", &TrainConfig::mixup, &kiln::data::MixupOptions::prob,
                       "a number", "the chance that a batch is mixed"));
    v.push_back(nested("mixup_switch_prob", &TrainConfig::mixup,
                       &kiln::data::MixupOptions::switch_prob, "a number",
                       "with both: the chance of cutmix"));
    v.push_back(nested("reprob", &TrainConfig::erasing, &kiln::data::ErasingOptions::prob,
                       "a number", "random erasing's probability (0: off)"));
    v.push_back(nested("remode", &TrainConfig::erasing, &kiln::data::ErasingOptions::mode,
                       "a mode name", "random erasing's fill: pixel, rand or const"));
    v.push_back(plain("beta1", &TrainConfig::beta1, "a number", "AdamW's beta1"));
    v.push_back(plain("beta2", &TrainConfig::beta2, "a number", "AdamW's beta2"));
    v.push_back(plain("label_smoothing", &TrainConfig::label_smoothing, "a number",
                      "cross-entropy against smoothed labels"));
    v.push_back(plain("drop_path", &TrainConfig::drop_path, "a number",
                      "stochastic depth's rate (-1: the model's)"));
    v.push_back(
        plain("schedule", &TrainConfig::schedule, "a schedule name", "constant, cosine or linear"));
    v.push_back(
        plain("lr_warmup", &TrainConfig::lr_warmup, "an int", "steps of learning-rate warm-up"));
    v.push_back(plain("clip_norm", &TrainConfig::clip_norm, "a number",
                      "global-norm gradient clipping (0: off)"));
    v.push_back(plain("ema", &TrainConfig::ema, "a number", "the weights' EMA decay (0: none)"));
    v.push_back(plain("freeze_backbone", &TrainConfig::freeze_backbone, "a bool",
                      "train the classifier alone"));
    v.push_back(plain("eval_every", &TrainConfig::eval_every, "an int",
                      "evaluate every N steps (0: at the end)"));
    v.push_back(plain("eval_samples", &TrainConfig::eval_samples, "an int",
                      "evaluate on N held-out examples, spread evenly (0: all)"));
    v.push_back(plain("save", &TrainConfig::save_dir, "a folder", "checkpoints into it"));
    v.push_back(plain("save_every", &TrainConfig::save_every, "an int",
                      "a checkpoint every N steps (0: at the end)"));
    v.push_back(plain("save_best", &TrainConfig::save_best, "a bool",
                      "save after the best evaluation only"));
    v.push_back(plain("resume", &TrainConfig::resume_dir, "a folder", "continue this checkpoint"));
    v.push_back(plain("init_from", &TrainConfig::init_from, "a folder or Hub id",
                      "start from this pretrained model"));
    v.push_back(plain("precision", &TrainConfig::precision, "fp32, bf16 or tf32",
                      "fp32, or bf16 mixed precision (tf32: CUDA)"));
    v.push_back(plain("device", &TrainConfig::device, "a device name", "cpu, ref or cuda[:N]"));
    v.push_back(either("attention", &TrainConfig::fused_attention, "fused", true, "unfused", false,
                       "self-attention as one fused primitive, or unfused"));
    v.push_back(plain("bucket_mb", &TrainConfig::bucket_mb, "a number",
                      "data-parallel gradient buckets' size (MB)"));
    v.push_back(either("all_reduce", &TrainConfig::all_reduce_always, "auto", false, "always", true,
                       "average through the buckets even alone (always)"));
    v.push_back(plain("check_replicas", &TrainConfig::check_replicas, "an int",
                      "compare the ranks' parameters every N steps"));
    v.push_back(plain("dist_timeout", &TrainConfig::dist_timeout, "a number",
                      "seconds a collective may take"));
    return v;
  }();
  return f;
}

const Field& field(const std::string& name) {
  for (const Field& f : fields())
    if (f.name == name) return f;
  kiln::fail("train", "TrainConfig has no option '" + name +
                          "' (its options are kiln train's flags: batch_size is --batch-size)");
}

void set_options(TrainConfig& c, const nb::kwargs& options) {
  for (auto [k, v] : options) field(nb::cast<std::string>(k)).set(c, v);
}

// train::run of `cfg` through train::prepare, as `kiln train` runs it,
// calling back into Python after each step, evaluation and save; Ctrl-C (any
// pending signal whose handler raises) stops the run at the next step.
nb::dict train_run(TrainConfig cfg, int64_t epochs, int threads, nb::object on_step,
                   nb::object on_eval, nb::object on_save) {
  if (threads > 0) kiln::set_num_threads(threads);
  auto call = [](const nb::object& fn, nb::object arg) {
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (!fn.is_none()) fn(arg);
  };
  kiln::train::Callbacks cb;
  cb.on_step = [&](const kiln::train::StepTiming& s) {
    nb::gil_scoped_acquire gil;
    call(on_step, step_dict(s));
  };
  cb.on_eval = [&](const kiln::train::EvalResult& e) {
    nb::gil_scoped_acquire gil;
    call(on_eval, eval_dict(e));
  };
  cb.on_save = [&](int64_t step, const std::string& dir) {
    nb::gil_scoped_acquire gil;
    call(on_save, nb::make_tuple(step, dir));
  };
  kiln::train::TrainReport report;
  {
    nb::gil_scoped_release release;
    kiln::train::Setup setup = kiln::train::prepare(std::move(cfg), epochs);
    report = kiln::train::run(setup.config, std::move(setup.resumed), cb, std::move(setup.init));
  }
  return report_dict(report);
}

}  // namespace

void bind_train(nb::module_& m) {
  nb::class_<TrainConfig> c(m, "TrainConfig",
                            "A training run's settings (kiln::train::TrainConfig): every option "
                            "of `kiln train`, named as its flag with underscores "
                            "(batch_size is --batch-size). ``TrainConfig(**options)``; a wrong "
                            "name or value is a KilnError that names it.");
  c.def(
      "__init__",
      [](TrainConfig* self, const nb::kwargs& options) {
        new (self) TrainConfig();
        set_options(*self, options);
      },
      nb::sig("def __init__(self, **options: typing.Any) -> None"));
  c.def(
      "replace",
      [](const TrainConfig& self, const nb::kwargs& options) {
        TrainConfig out = self;
        set_options(out, options);
        return out;
      },
      nb::sig("def replace(self, **options: typing.Any) -> TrainConfig"),
      "A copy with these options changed (as dataclasses.replace).");
  c.def("__copy__", [](const TrainConfig& self) { return TrainConfig(self); });
  c.def(
      "options",
      [](const TrainConfig& self) {
        nb::dict d;
        for (const Field& f : fields()) d[f.name.c_str()] = f.get(self);
        return d;
      },
      "Every option and its value, as a dict.");
  c.def("__repr__", [](const TrainConfig& self) {
    std::string s = "TrainConfig(";
    bool first = true;
    for (const Field& f : fields()) {
      s += (first ? "" : ", ") + f.name + "=" + nb::cast<std::string>(nb::repr(f.get(self)));
      first = false;
    }
    return s + ")";
  });
  for (const Field& f : fields()) {
    const std::string name = f.name;
    c.def_prop_rw(
        f.name.c_str(), [name](const TrainConfig& self) { return field(name).get(self); },
        [name](TrainConfig& self, nb::handle v) { field(name).set(self, v); }, f.doc);
  }
  m.def("_train_run", &train_run, "config"_a, "epochs"_a, "threads"_a, "on_step"_a.none(),
        "on_eval"_a.none(), "on_save"_a.none());
}

}  // namespace kiln_python
