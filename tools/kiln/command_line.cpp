// kiln — the command line: subcommands, flags and their checks (CLI11), and
// `kiln train`'s flags turned into a TrainConfig.
#include "command_line.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>

#include "kiln/io.h"

namespace kiln::cli {

// An image size: H (a square) or HxW, positive integers.
std::optional<nn::Size2d> parse_image_size(const std::string& s) {
  auto number = [](const std::string& t, int64_t& v) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos)
      return false;
    v = std::stoll(t);
    return v > 0;
  };
  size_t x = s.find('x');
  int64_t h = 0, w = 0;
  if (x == std::string::npos) {
    if (!number(s, h)) return std::nullopt;
    return nn::Size2d(h);
  }
  if (!number(s.substr(0, x), h) || !number(s.substr(x + 1), w)) return std::nullopt;
  return nn::Size2d{h, w};
}
namespace {

// Number checks whose errors say what was expected and what was found
// (CLI11's own print the whole range of a double).
CLI::Validator number_check(bool zero_ok, bool integer) {
  const std::string kind = integer ? "an integer" : "a number";
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = integer ? static_cast<double>(std::stoll(s, &used)) : std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size()) return "expected " + kind + ", got '" + s + "'";
        if (v > 0 || (zero_ok && v == 0)) return "";
        return "expected " + kind + (zero_ok ? " of 0 or more" : " above 0") + ", got " + s;
      },
      zero_ok ? "NONNEGATIVE" : "POSITIVE", zero_ok ? "nonnegative" : "positive");
}
const CLI::Validator kPositive = number_check(false, false);
const CLI::Validator kNonNegative = number_check(true, false);
const CLI::Validator kPositiveInt = number_check(false, true);
const CLI::Validator kNonNegativeInt = number_check(true, true);
// A device name kiln knows (parse_device); whether the device exists is
// checked when the command runs.
const CLI::Validator kDevice(
    [](std::string& s) -> std::string {
      try {
        parse_device(s);
      } catch (const Error&) {
        return "expected cpu, ref, cuda or cuda:N, got '" + s + "'";
      }
      return "";
    },
    "DEVICE", "device");

const CLI::Validator kImageSize(
    [](std::string& s) -> std::string {
      return parse_image_size(s)
                 ? ""
                 : "expected H or HxW (positive integers, e.g. 384 or 224x320), got '" + s + "'";
    },
    "H[xW]", "image size");

// Replaces each abbreviated long flag in args[2..] by the one flag of `sub`
// that it begins (`--batch=8` -> `--batch-size=8`); returns an error naming
// the flag when it begins several.
std::string expand_abbreviations(const CLI::App& sub, std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const CLI::Option* o : sub.get_options())
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  for (size_t i = 2; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.rfind("--", 0) != 0 || a.size() < 3) continue;
    size_t eq = a.find('=');
    std::string flag = a.substr(0, eq);
    if (std::find(names.begin(), names.end(), flag) != names.end()) continue;
    std::vector<std::string> matches;
    for (const std::string& n : names)
      if (n.rfind(flag, 0) == 0) matches.push_back(n);
    if (matches.size() > 1) {
      std::string list;
      for (const std::string& m : matches) list += (list.empty() ? "" : ", ") + m;
      return "ambiguous flag " + flag + ": it could be " + list;
    }
    if (matches.size() == 1) a = matches[0] + (eq == std::string::npos ? "" : a.substr(eq));
  }
  return "";
}

// kiln's subcommands, their flags bound to the fields of `cl`.
struct Subcommands {
  CLI::App *demo, *info, *train, *eval, *predict, *generate, *plot, *grad;
};

// kiln demo and kiln info.
void define_demo(CLI::App& app, Subcommands& s, DemoOptions& demo) {
  auto* d = s.demo = app.add_subcommand("demo", "train a small classifier with grad and SGD");
  d->add_option("--steps", demo.steps, "training steps")->check(kPositiveInt);
  d->add_option("--lr", demo.lr, "SGD learning rate")->check(kPositive);
  d->add_option("--mode", demo.mode, "execution mode")->check(CLI::IsMember({"eager", "lazy"}));
  d->add_option("--seed", demo.seed, "random seed");
  d->add_option("--threads", demo.threads, "CPU threads (default: all)")->check(kPositiveInt);
  s.info = app.add_subcommand("info", "show the build, devices and libraries");
}

// kiln train: the model, where it starts, how long it runs.
CLI::App* define_train_model(CLI::App& app, Subcommands& s, TrainFlags& tf) {
  train::TrainConfig& tc = tf.config;
  auto* t = s.train = app.add_subcommand(
      "train", "train a ViT (default: the reference experiment on random images)");
  t->add_option("--batch-size", tc.batch_size, "images per step")->check(kPositiveInt);
  t->add_option("--mode", tf.mode,
                "jit (alias jax, the default), eager (pytorch) or lazy (torch_xla)")
      ->check(CLI::IsMember(train::mode_names()));
  t->add_flag("--compile-model", tc.compile_model,
              "with --mode eager: compile forward and backward, the optimizer stays eager "
              "(lazy and jit compile the whole step already)");
  auto* model_opt =
      t->add_option("--model", tf.model,
                    "preset of any family (vit-base, resnet-50, convnext-tiny, deit-small, ...)")
          ->check(CLI::IsMember(nn::model_presets()));
  auto* config_opt =
      t->add_option(
           "--config", tf.config_file,
           "a HuggingFace config.json (model_type vit, deit, resnet or convnext) instead of "
           "a preset")
          ->check(CLI::ExistingFile)
          ->excludes(model_opt);
  t->add_option("--init-from", tc.init_from,
                "start from a pretrained model: a folder that transformers saved, or a Hub id "
                "(org/name[@revision]) in the local Hugging Face cache; the data's labels decide "
                "its classifier")
      ->excludes(model_opt)
      ->excludes(config_opt);
  t->add_option("--image-size", tf.image_size,
                "train at this image size, H or HxW: a preset's or config's, or --init-from's "
                "(its position embeddings resampled as transformers' interpolate_pos_encoding)")
      ->check(kImageSize);
  t->add_option_function<int64_t>(
       "--steps",
       [&](const int64_t& v) {
         tc.steps = v;
         tf.steps_given = true;
       },
       "total steps, warm-up included (default: 8 for vit-base and vit-large, 20 otherwise)")
      ->check(kPositiveInt);
  t->add_option_function<int64_t>(
       "--warmup",
       [&](const int64_t& v) {
         tc.warmup = v;
         tf.warmup_given = true;
       },
       "untimed steps at the start (default 2)")
      ->check(kNonNegativeInt);
  t->add_option("--lr", tc.lr, "learning rate (the peak, with a schedule)")->check(kNonNegative);
  t->add_option("--seed", tc.seed, "random seed for weights and data");
  t->add_option("--layout", tf.layout, "image layout")->check(CLI::IsMember({"nchw", "nhwc"}));
  t->add_option("--threads", tf.threads, "CPU threads (default: all)")->check(kPositiveInt);
  t->add_option("--workers", tc.workers,
                "threads making batches ahead of the model, 0: none (default: 2 on the cpu; on a "
                "GPU half the host's cores, 2 to 8)")
      ->check(kNonNegativeInt);
  t->add_option("--log-json", tc.log_json,
                "write one JSON object per step (and per evaluation) to this file");
  return t;
}

// kiln train: the data and its augmentation.
void define_train_data(CLI::App* t, TrainFlags& tf) {
  train::TrainConfig& tc = tf.config;
  t->add_option("--data", tc.data,
                "random (the reference experiment), fashion-mnist, or imagefolder:PATH "
                "(PATH/<class>/*.jpg|png; every 10th file of a class held out); a language "
                "model's text:PATH (a UTF-8 file or a folder of .txt files, tokenized once and "
                "cached) or tokens:PATH (an llm.c or nanoGPT .bin file, or a folder with "
                "train.bin and val.bin); a single stream's last 10% held out")
      ->check([](const std::string& v) {
        if (v == "random" || v == "fashion-mnist") return std::string();
        if (v.rfind("imagefolder:", 0) == 0 && v.size() > 12) return std::string();
        if (v.rfind("text:", 0) == 0 && v.size() > 5) return std::string();
        if (v.rfind("tokens:", 0) == 0 && v.size() > 7) return std::string();
        return "'" + v +
               "': expected random, fashion-mnist, imagefolder:PATH, text:PATH or tokens:PATH";
      });
  t->add_option("--seq-len", tc.seq_len,
                "text and tokens: tokens per block (default: the model's n_positions)")
      ->check(kPositiveInt);
  t->add_option("--tokenizer", tc.tokenizer,
                "text: a folder with tokenizer.json, or vocab.json and merges.txt (default: "
                "--init-from's)");
  t->add_flag("--skip-bad-images", tc.skip_bad_images,
              "imagefolder: skip files that cannot be read (counted) instead of stopping");
  t->add_option("--data-dir", tc.data_dir, "where the Fashion-MNIST IDX files are");
  t->add_flag("--augment", tc.augment,
              "random horizontal flips (fashion-mnist); imagefolder: torchvision's "
              "RandomResizedCrop and horizontal flips, as run_image_classification.py");
  t->add_option(
       "--crop-scale", tf.crop_scale,
       "with --augment: RandomResizedCrop's range of area fractions, MIN,MAX (default 0.08,1)")
      ->delimiter(',')
      ->expected(2);
  t->add_option(
       "--crop-ratio", tf.crop_ratio,
       "with --augment: RandomResizedCrop's range of width/height, MIN,MAX (default 0.75,1.3333)")
      ->delimiter(',')
      ->expected(2);
  t->add_flag("--no-crop", tf.no_crop,
              "with --augment: no random crop (the model's preprocessing, then flips only)");
  t->add_option("--flip-prob", tc.flip_prob,
                "with --augment: probability of a horizontal flip (default 0.5; 0: none)")
      ->check(CLI::Range(0.0, 1.0));
  t->add_option_function<double>(
       "--color-jitter",
       [&](const double& x) {
         tc.color_jitter = {.brightness = x, .contrast = x, .saturation = x};
       },
       "with --augment on an RGB image folder: torchvision's ColorJitter(X, X, X) after the crop "
       "and flip (timm's --color-jitter, e.g. 0.4)")
      ->check(CLI::Range(0.0, 10.0));
  t->add_option(
      "--rand-augment", tf.rand_augment,
      "with --augment on an RGB image folder: timm's RandAugment after the crop and flip, by its "
      "config string (e.g. rand-m9-mstd0.5; -inc1 for the increasing set), bicubic, filled with "
      "the normalization mean");
  t->add_option("--epochs", tf.epochs,
                "passes over the training split (sets --steps; fashion-mnist, imagefolder)")
      ->check(kPositiveInt);
}

// kiln train: the optimizer, its schedule, evaluation and checkpoints.
void define_train_optimizer(CLI::App* t, TrainFlags& tf) {
  train::TrainConfig& tc = tf.config;
  t->add_option("--optimizer", tc.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  t->add_option("--momentum", tc.momentum, "SGD momentum")->check(kNonNegative);
  t->add_option("--weight-decay", tc.weight_decay, "weight decay (AdamW: decoupled)")
      ->check(kNonNegative);
  t->add_option("--schedule", tc.schedule,
                "learning rate: constant, cosine (after --lr-warmup), or linear (transformers' "
                "get_linear_schedule_with_warmup, the HF Trainer's default)")
      ->check(CLI::IsMember({"constant", "cosine", "linear"}));
  t->add_option("--accumulate", tc.accumulate,
                "gradient accumulation: each step averages the gradients of N batches of "
                "--batch-size (the update of one batch N times larger)")
      ->check(kPositiveInt);
  t->add_flag("--exempt-from-decay", tc.exempt_from_decay,
              "no weight decay on biases, LayerNorm weights, position embeddings and the [CLS] "
              "token (the HF Trainer's exemptions and timm's)");
  t->add_option("--mixup", tc.mixup.mixup_alpha,
                "mixup with lambda ~ Beta(A, A) (timm's --mixup, e.g. 0.8): each batch mixed with "
                "itself reversed, the loss against the mixed soft targets")
      ->check(kNonNegative);
  t->add_option("--cutmix", tc.mixup.cutmix_alpha,
                "cutmix with lambda ~ Beta(A, A) (timm's --cutmix, e.g. 1.0): a box of the "
                "reversed batch pasted in; with --mixup, one or the other per batch")
      ->check(kNonNegative);
  t->add_option("--mixup-prob", tc.mixup.prob, "the chance that a batch is mixed (timm's)")
      ->check(CLI::Range(0.0, 1.0));
  t->add_option("--mixup-switch-prob", tc.mixup.switch_prob,
                "with --mixup and --cutmix: the chance of cutmix (timm's)")
      ->check(CLI::Range(0.0, 1.0));
  t->add_option("--reprob", tc.erasing.prob,
                "random erasing: the chance that a training image gets a box of noise (timm's "
                "RandomErasing; DeiT: 0.25)")
      ->check(CLI::Range(0.0, 1.0));
  t->add_option("--remode", tc.erasing.mode,
                "random erasing's fill: pixel (a normal draw per value), rand (per channel) or "
                "const (zeros)")
      ->check(CLI::IsMember({"pixel", "rand", "const"}));
  t->add_option("--layer-decay", tc.layer_decay,
                "layer-wise learning-rate decay (BEiT's, timm's --layer-decay, e.g. 0.65): each "
                "block's lr scaled by DECAY per block above it, the embeddings lowest, the "
                "classifier at the full lr; 0: off")
      ->check(CLI::Range(0.0, 1.0));
  t->add_option("--drop-path", tc.drop_path,
                "stochastic depth rising linearly over the blocks to this rate (timm's "
                "--drop-path, e.g. 0.1 for DeiT-S; ViT, DeiT and ConvNeXt); default: the config's")
      ->check(CLI::Range(0.0, 0.999));
  t->add_option("--label-smoothing", tc.label_smoothing,
                "smooth the labels by this much, as CrossEntropyLoss(label_smoothing=)")
      ->check(CLI::Range(0.0, 1.0));
  t->add_option("--ema", tc.ema,
                "keep an exponential moving average of the weights with this decay (e.g. 0.999), "
                "evaluated beside them and saved in DIR/ema/")
      ->check(CLI::Range(0.0, 1.0));
  t->add_flag("--freeze-backbone", tc.freeze_backbone,
              "train the classifier alone (linear probing)");
  t->add_flag("--save-best", tc.save_best,
              "with --save: save only after an evaluation more accurate than all before it");
  t->add_option("--lr-warmup", tc.lr_warmup, "steps of linear learning-rate warm-up")
      ->check(kNonNegativeInt);
  t->add_option("--clip-norm", tc.clip_norm, "clip gradients to this global L2 norm (0: off)")
      ->check(kNonNegative);
  t->add_option("--eval-every", tc.eval_every,
                "evaluate on the test split every N steps (always at the end)")
      ->check(kNonNegativeInt);
  t->add_option("--eval-samples", tc.eval_samples,
                "evaluate on N examples of the test split, spread evenly over it (0: all of it)")
      ->check(kNonNegativeInt);
  t->add_option("--save", tc.save_dir,
                "checkpoint directory (transformers-loadable), written at the end");
  t->add_option("--save-every", tc.save_every, "also save every N steps")->check(kNonNegativeInt);
  t->add_option("--resume", tc.resume_dir, "continue from this checkpoint directory")
      ->check(CLI::ExistingDirectory);
}

// kiln train: precision, devices, data-parallel training, output.
void define_train_runtime(CLI::App* t, TrainFlags& tf) {
  train::TrainConfig& tc = tf.config;
  t->add_option("--precision", tc.precision,
                "fp32, bf16 (mixed: bf16 matmul operands, f32 master weights), tf32 (CUDA only)")
      ->check(CLI::IsMember({"fp32", "bf16", "tf32"}));
  t->add_option("--device", tc.device, "where the model trains: cpu, ref or cuda[:N]")
      ->check(kDevice);
  t->add_option("--bucket-mb", tc.bucket_mb,
                "data-parallel (mpirun -np N): gradients are averaged over the ranks in buckets "
                "of about this many MB, each started while the backward goes on (default 25)")
      ->check(kPositive);
  t->add_option("--all-reduce", tf.all_reduce,
                "auto: average gradients over the ranks when there are several; always: through "
                "the buckets even in a process alone (checks the path; on CUDA through NCCL)")
      ->check(CLI::IsMember({"auto", "always"}));
  t->add_option("--check-replicas", tc.check_replicas,
                "data-parallel: every N steps compare a hash of every rank's parameters "
                "(0: never)")
      ->check(kNonNegativeInt);
  t->add_option("--dist-timeout", tc.dist_timeout,
                "data-parallel: seconds after which a collective that has not finished stops "
                "every rank, naming the ranks that never reached it (0: no limit; default 300)")
      ->check(kNonNegative);
  t->add_option("--attention", tf.attention,
                "fused (one kernel per layer, forward and backward) or unfused (as transformers' "
                "eager attention)")
      ->check(CLI::IsMember({"fused", "unfused"}));
  t->add_option("--print-every", tf.print_every,
                "without a terminal: print every N steps (default: steps / 50)")
      ->check(kPositiveInt);
}

// kiln eval.
void define_eval(CLI::App& app, Subcommands& s, EvalFlags& ef) {
  auto* e = s.eval =
      app.add_subcommand("eval",
                         "loss and top-1 accuracy of a checkpoint on a data set (a language "
                         "model: loss, perplexity and next-token accuracy)");
  auto* ckpt_opt =
      e->add_option("--checkpoint", ef.checkpoint, "directory written by kiln train --save");
  e->add_option("--model", ef.model,
                "a pretrained model instead: a folder that transformers saved, or a Hub id "
                "(org/name[@revision]) in the local Hugging Face cache")
      ->excludes(ckpt_opt);
  e->add_option("--image-size", ef.image_size,
                "with --model: evaluate at this image size, H or HxW (position embeddings "
                "resampled as transformers' interpolate_pos_encoding)")
      ->check(kImageSize);
  e->add_option("--data", ef.data,
                "fashion-mnist or imagefolder:PATH; a language model: text:PATH or tokens:PATH");
  e->add_option("--data-dir", ef.data_dir, "where the Fashion-MNIST IDX files are");
  e->add_option("--split", ef.split,
                "test (fashion-mnist's test split, an image folder's held-out files, a text's "
                "held-out blocks) or train")
      ->check(CLI::IsMember({"test", "train"}));
  e->add_option("--batch-size", ef.batch_size,
                "images per batch (default 256), or blocks of --seq-len tokens (default 8)")
      ->check(kPositiveInt);
  e->add_option("--seq-len", ef.seq_len,
                "text and tokens: tokens per block (default: the model's n_positions)")
      ->check(kPositiveInt);
  e->add_option("--samples", ef.samples,
                "evaluate N examples of the split (images, or blocks of tokens), spread evenly "
                "over it, as kiln train's --eval-samples (default 0: all)")
      ->check(kNonNegativeInt);
  e->add_option("--tokenizer", ef.tokenizer,
                "text: a folder with tokenizer.json, or vocab.json and merges.txt (default: the "
                "model's or checkpoint's folder)");
  e->add_option("--mode", ef.mode, "eager or jit")->check(CLI::IsMember({"eager", "jit"}));
  e->add_option("--layout", ef.layout, "image layout")->check(CLI::IsMember({"nchw", "nhwc"}));
  e->add_option("--device", ef.device, "cpu, ref or cuda[:N]")->check(kDevice);
}

// kiln predict.
void define_predict(CLI::App& app, Subcommands& s, PredictFlags& rf) {
  auto* r = s.predict = app.add_subcommand(
      "predict",
      "the top labels of images, as transformers' image-classification pipeline gives them");
  r->add_option("--model", rf.model,
                "a model: a folder that transformers saved or kiln train --save wrote, or a Hub id "
                "(org/name[@revision]) in the local Hugging Face cache")
      ->required();
  r->add_option("inputs", rf.inputs, "image files (JPEG, PNG) and folders (searched recursively)")
      ->required();
  r->add_option("--top-k", rf.top_k, "labels per image, best first (default 5)")
      ->check(kPositiveInt);
  r->add_flag("--json", rf.json,
              "one JSON object per line: {\"file\": ..., \"predictions\": [{\"label\": ..., "
              "\"score\": ...}]}");
  r->add_option("--batch-size", rf.batch_size, "images per batch")->check(kPositiveInt);
  r->add_option("--image-size", rf.image_size,
                "predict at this image size, H or HxW (position embeddings resampled as "
                "transformers' interpolate_pos_encoding; the processor resizes to it)")
      ->check(kImageSize);
  r->add_option("--mode", rf.mode, "eager or jit")->check(CLI::IsMember({"eager", "jit"}));
  r->add_option("--precision", rf.precision, "the matmuls' inputs: fp32, tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  r->add_option("--device", rf.device, "cpu, ref or cuda[:N]")->check(kDevice);
  r->add_option("--threads", rf.threads, "compute threads (default: all cores)")
      ->check(kPositiveInt);
  r->add_option("--workers", rf.workers, "threads decoding images ahead of the model (default 2)")
      ->check(kPositiveInt);
}

// kiln generate.
void define_generate(CLI::App& app, Subcommands& s, GenerateFlags& gf) {
  auto* g = s.generate = app.add_subcommand(
      "generate", "continue a prompt with a language model (GPT-2), as transformers' generate");
  g->add_option("--model", gf.model,
                "a language model: a folder that transformers saved or kiln train --save wrote, "
                "or a Hub id (org/name[@revision]) in the local Hugging Face cache")
      ->required();
  g->add_option("--prompt", gf.prompt, "the text to continue")->required();
  g->add_option("--tokenizer", gf.tokenizer,
                "a folder with tokenizer.json or vocab.json and merges.txt (default: the model's)");
  g->add_option("--max-new-tokens", gf.max_new_tokens, "tokens to add (default 50)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--temperature", gf.temperature,
                "0 (the default): greedy; above 0: sample from softmax(logits / T)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--top-k", gf.top_k, "sample among the K most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--top-p", gf.top_p,
                "sample among the most likely tokens whose probability reaches P (1: all)")
      ->check(CLI::Range(0.0, 1.0));
  g->add_option("--seed", gf.seed, "the draws' seed (the same seed, the same text)");
  g->add_flag("--ignore-eos", gf.ignore_eos,
              "go on past the end-of-text token (config.json's eos_token_id)");
  g->add_option("--mode", gf.mode, "jit (each step one compiled program on the KV cache) or eager")
      ->check(CLI::IsMember({"eager", "jit"}));
  g->add_option("--precision", gf.precision, "the matmuls' inputs: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  g->add_option("--device", gf.device, "cpu, ref or cuda[:N]")->check(kDevice);
  g->add_option("--threads", gf.threads, "compute threads (default: all cores)")
      ->check(kPositiveInt);
}

// kiln plot and kiln grad.
void define_plot_and_grad(CLI::App& app, Subcommands& s, PlotFlags& pf, GradFlags& gf) {
  auto* pl = s.plot =
      app.add_subcommand("plot", "draw loss and accuracy curves of a --log-json file");
  pl->add_option("log", pf.log, "the JSON-lines log of kiln train --log-json")
      ->required()
      ->check(CLI::ExistingFile);
  pl->add_option("-o,--out", pf.out, "output .png or .svg file")->required();

  auto* g = s.grad = app.add_subcommand(
      "grad",
      "one training-mode forward and backward pass (no dropout); writes logits, loss, "
      "gradients (grad.NAME) and state after the forward (state.NAME: BatchNorm statistics)");
  g->add_option("--config", gf.config,
                "HuggingFace config.json of any model type kiln has (vit, deit, resnet, "
                "convnext, gpt2)")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--weights", gf.weights,
                "model.safetensors with HuggingFace names (parameters and running statistics)")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--batch", gf.batch,
                "safetensors with pixel_values and labels (integer classes, or float targets for "
                "regression and multi-label problem types); for a language model input_ids "
                "[batch, tokens] and labels (default: input_ids; -100 ignored)")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--out", gf.out, "output safetensors")->required();
  g->add_option("--layout", gf.layout, "layout of pixel_values")
      ->check(CLI::IsMember({"nchw", "nhwc"}));
  g->add_option("--device", gf.device, "cpu, ref or cuda[:N]")->check(kDevice);
}

Subcommands define(CLI::App& app, CommandLine& cl) {
  app.require_subcommand(1);
  Subcommands s;
  define_demo(app, s, cl.demo);
  CLI::App* t = define_train_model(app, s, cl.train);
  define_train_data(t, cl.train);
  define_train_optimizer(t, cl.train);
  define_train_runtime(t, cl.train);
  define_eval(app, s, cl.eval);
  define_predict(app, s, cl.predict);
  define_generate(app, s, cl.generate);
  define_plot_and_grad(app, s, cl.plot, cl.grad);
  return s;
}

// Default schedule: a few timed steps, so that the default run (vit-base on a
// 2-core CPU) finishes in minutes. The reference schedule is --steps 52 --warmup 11.
void default_schedule(const TrainFlags& f, train::TrainConfig& cfg) {
  if (!f.steps_given) cfg.steps = f.model == "vit-base" || f.model == "vit-large" ? 8 : 20;
  if (!f.warmup_given) cfg.warmup = std::min<int64_t>(2, cfg.steps - 1);
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args_in, std::ostream& out,
                               std::ostream& err) {
  CLI::App app{"kiln: train neural networks from C++"};
  CommandLine cl;
  Subcommands s = define(app, cl);
  std::vector<std::string> args = args_in;
  if (args.size() > 1 && args[1].rfind('-', 0) != 0) {
    bool known = false;
    for (auto* sub : app.get_subcommands({})) known |= sub->get_name() == args[1];
    if (!known) {
      err << "kiln: unknown command '" << args[1]
          << "'; expected one of train, eval, predict, generate, plot, grad, demo, info\n";
      cl.exit_code = 2;
      return cl;
    }
  }
  // Long flags may be abbreviated to any unique prefix, as argparse (the
  // reference script's parser) allows: `--batch 64`, `--compile`.
  if (args.size() > 1)
    for (auto* sub : app.get_subcommands({}))
      if (sub->get_name() == args[1]) {
        std::string error = expand_abbreviations(*sub, args);
        if (!error.empty()) {
          err << "kiln " << args[1] << ": " << error << "\n";
          cl.exit_code = 2;
          return cl;
        }
      }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    cl.exit_code = app.exit(e, out, err);
    return cl;
  }
  cl.command = s.train->parsed()      ? Command::train
               : s.eval->parsed()     ? Command::eval
               : s.predict->parsed()  ? Command::predict
               : s.generate->parsed() ? Command::generate
               : s.plot->parsed()     ? Command::plot
               : s.grad->parsed()     ? Command::grad
               : s.demo->parsed()     ? Command::demo
               : s.info->parsed()     ? Command::info
                                      : Command::none;
  return cl;
}

train::TrainConfig train_config(const TrainFlags& f) {
  train::TrainConfig cfg = f.config;
  cfg.mode = train::parse_mode(f.mode);
  default_schedule(f, cfg);
  if (!f.config_file.empty()) {
    cfg.model = io::load_model_config(f.config_file);
    cfg.model_name = f.config_file;
  } else {
    cfg.model = nn::model_from_preset(f.model);
    cfg.model_name = f.model;
  }
  if (!f.image_size.empty()) cfg.image_size = *parse_image_size(f.image_size);
  cfg.layout = f.layout == "nhwc" ? nn::Layout::NHWC : nn::Layout::NCHW;
  cfg.random_crop = !f.no_crop;
  if (!f.rand_augment.empty())
    cfg.rand_augment = data::RandAugmentOptions::parse(f.rand_augment, "--rand-augment");
  auto range = [](const std::vector<double>& v, double* dst, const char* flag, const char* what) {
    if (v.empty()) return;
    if (!(v[0] > 0 && v[0] <= v[1] && std::isfinite(v[1])))
      fail("train", std::string(flag) + " " + std::to_string(v[0]) + "," + std::to_string(v[1]) +
                        ": expected MIN,MAX with 0 < MIN <= MAX (" + what + ")");
    dst[0] = v[0], dst[1] = v[1];
  };
  range(f.crop_scale, cfg.crop_scale, "--crop-scale", "fractions of the image's area");
  range(f.crop_ratio, cfg.crop_ratio, "--crop-ratio", "width / height");
  cfg.fused_attention = f.attention == "fused";
  cfg.all_reduce_always = f.all_reduce == "always";
  if (f.epochs > 0 && f.steps_given)
    fail("train", "--epochs and --steps both set the length of the run; give one");
  return cfg;
}

train::Setup prepare_train(const TrainFlags& f) {
  return train::prepare(train_config(f), f.epochs);
}

std::vector<std::string> command_line_words() {
  CLI::App app;
  CommandLine cl;
  define(app, cl);
  std::vector<std::string> words;
  for (auto* sub : app.get_subcommands({})) {
    words.push_back(sub->get_name());
    for (const CLI::Option* o : sub->get_options())
      for (const std::string& n : o->get_lnames()) words.push_back("--" + n);
  }
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  return words;
}

}  // namespace kiln::cli
