// kiln nn: ViTForImageClassification, parameter for parameter as HuggingFace
// transformers builds it (modeling_vit.py, eager attention).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

#include "kiln/layers.h"
#include "kiln/nn.h"

namespace kiln::nn {
namespace {

std::string layer_prefix(const std::string& model, int64_t i) {
  return model + ".encoder.layer." + std::to_string(i) + ".";
}

// The layers of encoder layer `l` of a model whose names start `m`.
struct EncoderLayer {
  LayerNorm before, after;
  MultiHeadAttention attention;
  Dropout dropout;  // after the attention's and the MLP's output projections
  MLP mlp;
  DropPath drop_path;  // of both residual branches (timm's Block); off at rate 0

  EncoderLayer(const ViTConfig& c, const std::string& m, int64_t l) {
    const std::string p = layer_prefix(m, l), att = p + "attention.attention.";
    const Init w = Init::truncated_normal(c.initializer_range);
    before = {p + "layernorm_before", c.hidden_size, c.layer_norm_eps};
    after = {p + "layernorm_after", c.hidden_size, c.layer_norm_eps};
    // Pruned heads narrow a layer's attention to heads * head_dim features.
    attention = {.query = att + "query",
                 .key = att + "key",
                 .value = att + "value",
                 .output = p + "attention.output.dense",
                 .dim = c.hidden_size,
                 .heads = c.heads_in_layer(l),
                 .head_dim = c.head_dim(),
                 .qkv_bias = c.qkv_bias,
                 .dropout = c.attention_probs_dropout_prob,
                 .weight_init = w};
    dropout = {c.hidden_dropout_prob};
    // torch.linspace(0, drop_path_rate, depth)[l], as timm's VisionTransformer.
    const int64_t depth = c.num_hidden_layers;
    drop_path = {depth > 1
                     ? c.drop_path_rate * static_cast<double>(l) / static_cast<double>(depth - 1)
                     : c.drop_path_rate};
    mlp = {.up = {p + "intermediate.dense", c.hidden_size, c.intermediate_size, true, w},
           .down = {p + "output.dense", c.intermediate_size, c.hidden_size, true, w},
           .act = c.hidden_act};
  }
  void declare(Decls& d) const {
    before.declare(d);
    after.declare(d);
    attention.declare(d);
    mlp.declare(d);
  }
  Array operator()(Scope& s, const Array& x) const {
    // (A rate of 0 takes no random site: dropout's masks stay where they were.)
    auto branch = [&](const Array& y) { return drop_path.p > 0 ? drop_path(s, y) : y; };
    Array h = x + branch(dropout(s, attention(s, before(s, x))));
    return h + branch(dropout(s, mlp(s, after(s, h))));
  }
};

}  // namespace

const std::vector<std::string>& ViTConfig::preset_names() {
  static const std::vector<std::string> names = {"vit-tiny", "vit-small", "vit-base", "vit-large",
                                                 "vit-fmnist"};
  return names;
}

ViTConfig ViTConfig::preset(const std::string& name) {
  ViTConfig c;
  if (name == "vit-tiny") {
    c.hidden_size = 192, c.num_attention_heads = 3, c.intermediate_size = 768;
  } else if (name == "vit-small") {
    c.hidden_size = 384, c.num_attention_heads = 6, c.intermediate_size = 1536;
  } else if (name == "vit-base") {
  } else if (name == "vit-fmnist") {
    // Sized for Fashion-MNIST on a 2-core CPU: 28x28 grey images, patches of
    // 7 (16 tokens + CLS), 10 classes. Patches of 4 (49 tokens) cost 1.6x
    // more per step and learned less per second in 1-epoch trials.
    c.hidden_size = 128, c.num_hidden_layers = 6, c.num_attention_heads = 4,
    c.intermediate_size = 256, c.image_size = 28, c.patch_size = 7, c.num_channels = 1,
    c.num_labels = 10;
  } else if (name == "vit-large") {
    c.hidden_size = 1024, c.num_hidden_layers = 24, c.num_attention_heads = 16,
    c.intermediate_size = 4096;
  } else {
    fail("model", "unknown preset '" + name +
                      "', expected one of vit-tiny, vit-small, vit-base, vit-large, vit-fmnist");
  }
  return c;
}

std::string to_string(const Size2d& s) {
  return s.square() ? std::to_string(s.height)
                    : std::to_string(s.height) + "x" + std::to_string(s.width);
}

const char* problem_type_name(ProblemType p) {
  switch (p) {
    case ProblemType::Unset: return "null";
    case ProblemType::Regression: return "regression";
    case ProblemType::SingleLabel: return "single_label_classification";
    case ProblemType::MultiLabel: return "multi_label_classification";
  }
  return "unknown";
}

int64_t ViTConfig::heads_in_layer(int64_t layer) const {
  auto it = pruned_heads.find(layer);
  if (it == pruned_heads.end()) return num_attention_heads;
  std::set<int64_t> gone(it->second.begin(), it->second.end());  // transformers prunes a set
  return num_attention_heads - static_cast<int64_t>(gone.size());
}

ProblemType resolve_problem(ProblemType configured, int64_t num_labels, DType labels) {
  if (configured != ProblemType::Unset) return configured;
  // ViTForImageClassification.forward: torch.long or torch.int labels are classes.
  if (num_labels == 1) return ProblemType::Regression;
  if (num_labels > 1 && is_integral(labels)) return ProblemType::SingleLabel;
  return ProblemType::MultiLabel;
}

ProblemType ViTConfig::problem_for(DType labels) const {
  return resolve_problem(problem_type, num_labels, labels);
}

std::string ViTConfig::label_name(int64_t i) const {
  return i < static_cast<int64_t>(id2label.size()) ? id2label[i] : "LABEL_" + std::to_string(i);
}

void ViTConfig::validate(const std::string& origin) const {
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0) fail(origin, std::string(field) + " must be positive, got " + std::to_string(v));
  };
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(intermediate_size, "intermediate_size");
  positive(image_size.height, "image_size (height)");
  positive(image_size.width, "image_size (width)");
  positive(patch_size.height, "patch_size (height)");
  positive(patch_size.width, "patch_size (width)");
  positive(num_channels, "num_channels");
  if (num_labels < 0)
    fail(origin, "num_labels must be >= 0 (0: no classifier), got " + std::to_string(num_labels));
  if (!id2label.empty() && static_cast<int64_t>(id2label.size()) != num_labels)
    fail(origin, "id2label names " + std::to_string(id2label.size()) + " labels, num_labels is " +
                     std::to_string(num_labels));
  // Bounds far above any real ViT that keep every size kiln derives from a
  // config (shapes, parameter and FLOP counts) inside 64-bit integers.
  auto at_most = [&](int64_t v, int64_t limit, const char* field) {
    if (v > limit)
      fail(origin, std::string(field) + " is " + std::to_string(v) + ", expected at most " +
                       std::to_string(limit));
  };
  constexpr int64_t kMaxSize = int64_t{1} << 20, kMaxLayers = 4096;
  at_most(hidden_size, kMaxSize, "hidden_size");
  at_most(num_hidden_layers, kMaxLayers, "num_hidden_layers");
  at_most(num_attention_heads, kMaxSize, "num_attention_heads");
  at_most(intermediate_size, kMaxSize, "intermediate_size");
  at_most(image_size.height, kMaxSize, "image_size (height)");
  at_most(image_size.width, kMaxSize, "image_size (width)");
  at_most(patch_size.height, kMaxSize, "patch_size (height)");
  at_most(patch_size.width, kMaxSize, "patch_size (width)");
  at_most(num_channels, kMaxSize, "num_channels");
  at_most(num_labels, kMaxSize, "num_labels");
  if (hidden_size % num_attention_heads != 0)
    fail(origin, "hidden_size " + std::to_string(hidden_size) +
                     " is not a multiple of num_attention_heads " +
                     std::to_string(num_attention_heads));
  // torch's Conv2d refuses a kernel larger than its input.
  if (patch_size.height > image_size.height || patch_size.width > image_size.width)
    fail(origin, "patch_size " + to_string(patch_size) + " is larger than image_size " +
                     to_string(image_size) + " (height x width)");
  auto probability = [&](double v, const char* field) {
    if (!(v >= 0 && v <= 1))
      fail(origin, std::string(field) + " must lie in [0, 1], got " + std::to_string(v));
  };
  probability(hidden_dropout_prob, "hidden_dropout_prob");
  probability(attention_probs_dropout_prob, "attention_probs_dropout_prob");
  if (!(drop_path_rate >= 0 && drop_path_rate < 1))
    fail(origin, "drop_path_rate must lie in [0, 1), got " + std::to_string(drop_path_rate));
  if (!(initializer_range > 0)) fail(origin, "initializer_range must be positive");
  if (!(layer_norm_eps >= 0)) fail(origin, "layer_norm_eps must be >= 0");
  if (problem_type == ProblemType::SingleLabel && num_labels == 0)
    fail(origin,
         "problem_type single_label_classification needs num_labels >= 1, got 0 (no classifier)");
  for (const auto& [layer, heads] : pruned_heads) {
    std::string at = "pruned_heads: layer " + std::to_string(layer);
    if (layer < 0 || layer >= num_hidden_layers)
      fail(origin,
           at + " is outside [0, " + std::to_string(num_hidden_layers) + ") (num_hidden_layers)");
    for (int64_t h : heads)
      if (h < 0 || h >= num_attention_heads)
        fail(origin, at + ": head " + std::to_string(h) + " is outside [0, " +
                         std::to_string(num_attention_heads) + ") (num_attention_heads)");
    // transformers would keep a zero-width attention (only the output bias
    // left); kiln's attention needs at least one head.
    if (heads_in_layer(layer) == 0)
      fail(origin, at + ": every one of its " + std::to_string(num_attention_heads) +
                       " heads is pruned; kiln needs at least one head per layer");
  }
  // The two parameters whose size is a product of more than two fields.
  constexpr double kMaxElements = double(int64_t{1} << 40);
  auto approx = [](double v) {
    std::ostringstream os;
    os << std::setprecision(3) << v;
    return os.str();
  };
  const double patch_weights =
      double(hidden_size) * num_channels * patch_size.height * patch_size.width;
  if (patch_weights > kMaxElements)
    fail(origin, "the patch projection (hidden_size x num_channels x patch height x width) has " +
                     approx(patch_weights) + " elements, expected at most 2^40");
  const double positions = (double(num_patches()) + 1) * hidden_size;
  if (positions > kMaxElements)
    fail(origin, "the position embeddings (patches + 1 tokens x hidden_size) have " +
                     approx(positions) + " elements, expected at most 2^40");
}

double ViTConfig::train_flops_per_image(int64_t tokens) const {
  double t = static_cast<double>(num_patches() + tokens), h = hidden_size, i = intermediate_size;
  double patch = 2.0 * num_patches() * (num_channels * patch_size.height * patch_size.width) * h;
  double layers = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    // The attention's width: narrower with pruned heads.
    double a = static_cast<double>(heads_in_layer(l) * head_dim());
    layers += 2.0 * t * h * 3 * a;  // q, k, v
    layers += 2.0 * 2 * t * t * a;  // scores and probabilities · values
    layers += 2.0 * t * a * h;      // output projection
    layers += 2.0 * 2 * t * h * i;  // MLP
  }
  double head = 2.0 * h * num_labels;
  double forward = patch + layers + head;
  return 3 * forward - patch;  // backward is twice the forward, but pixels need no gradient
}

ViTForImageClassification::ViTForImageClassification(ViTConfig cfg, ViTVariant variant)
    : cfg_(cfg), variant_(variant) {
  cfg_.validate();
}

namespace {

// The layers outside the encoder, by name.
std::string embeddings(const std::string& m) { return m + ".embeddings."; }

Conv2d patch_projection(const ViTConfig& c, const std::string& m) {
  return {.name = embeddings(m) + "patch_embeddings.projection",
          .in = c.num_channels,
          .out = c.hidden_size,
          .kernel = c.patch_size,
          .stride = c.patch_size,
          .weight_init = Init::truncated_normal(c.initializer_range),
          .patch_matmul = true};
}

std::vector<Linear> classifiers(const ViTConfig& c, ViTVariant v) {
  if (c.num_labels == 0) return {};
  const std::vector<std::string> names =
      v == ViTVariant::DeiTWithTeacher
          ? std::vector<std::string>{"cls_classifier", "distillation_classifier"}
          : std::vector<std::string>{"classifier"};
  std::vector<Linear> out;
  for (const std::string& n : names)
    out.push_back({n, c.hidden_size, c.num_labels, true, Init::truncated_normal(c.initializer_range)});
  return out;
}

// Every parameter in transformers' order, with its initialization:
// truncated normal(initializer_range) for weights, ViT's [CLS] token and
// position embeddings (DeiT's tokens and position embeddings start at zero:
// its _init_weights leaves torch.zeros), zero biases, unit LayerNorms.
Decls declarations(const ViTConfig& c, ViTVariant v, const std::string& m, int64_t tokens) {
  const int64_t h = c.hidden_size;
  const Init token = v == ViTVariant::ViT ? Init::truncated_normal(c.initializer_range) : Init::zeros();
  Decls d{{embeddings(m) + "cls_token", {1, 1, h}, token}};
  if (v != ViTVariant::ViT) d.push_back({embeddings(m) + "distillation_token", {1, 1, h}, token});
  d.push_back({embeddings(m) + "position_embeddings", {1, c.num_patches() + tokens, h}, token});
  patch_projection(c, m).declare(d);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) EncoderLayer(c, m, l).declare(d);
  LayerNorm{m + ".layernorm", h, c.layer_norm_eps}.declare(d);
  for (const Linear& head : classifiers(c, v)) head.declare(d);
  return d;
}

}  // namespace

std::vector<std::pair<std::string, Shape>> ViTForImageClassification::parameter_shapes() const {
  return shapes_of(declarations(cfg_, variant_, prefix(), tokens()));
}

Array resample_position_embeddings(const Array& pos, Size2d from, Size2d to, int64_t leading) {
  const int64_t n = from.height * from.width;
  if (pos.ndim() != 3 || pos.shape()[0] != 1 || pos.shape()[1] != leading + n)
    fail("vit", "position embeddings of shape " + str(pos.shape()) + " for a grid of " +
                    to_string(from) + " patches, expected (1," + std::to_string(leading + n) +
                    ",hidden)");
  if (to.height <= 0 || to.width <= 0)
    fail("vit", "a grid of " + to_string(to) + " patches, expected at least one patch");
  if (from == to) return pos;
  const int64_t dim = pos.shape()[2];
  const std::vector<double> in = pos.to_vector<double>();
  std::vector<float> out((leading + to.height * to.width) * dim);
  for (int64_t c = 0; c < leading * dim; ++c) out[c] = static_cast<float>(in[c]);
  // torch's upsample_bicubic2d: source coordinate (x + 0.5) * in/out - 0.5,
  // Keys' cubic convolution with a = -0.75 on the 4 neighbours, clamped.
  struct Taps {
    int64_t index[4];
    double weight[4];
  };
  auto taps = [](int64_t dst, int64_t in_size, int64_t out_size) {
    const double a = -0.75;
    const double real = (dst + 0.5) * (static_cast<double>(in_size) / out_size) - 0.5;
    const double lo = std::floor(real), t = real - lo;
    auto near = [a](double x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };       // |x| <= 1
    auto far = [a](double x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };  // 1 < |x| < 2
    Taps k{};
    const double w[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
    for (int i = 0; i < 4; ++i) {
      k.index[i] = std::clamp<int64_t>(static_cast<int64_t>(lo) - 1 + i, 0, in_size - 1);
      k.weight[i] = w[i];
    }
    return k;
  };
  for (int64_t oy = 0; oy < to.height; ++oy) {
    const Taps ky = taps(oy, from.height, to.height);
    for (int64_t ox = 0; ox < to.width; ++ox) {
      const Taps kx = taps(ox, from.width, to.width);
      float* dst = &out[(leading + oy * to.width + ox) * dim];
      for (int64_t c = 0; c < dim; ++c) {
        double sum = 0;
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j)
            sum += ky.weight[i] * kx.weight[j] *
                   in[(leading + ky.index[i] * from.width + kx.index[j]) * dim + c];
        dst[c] = static_cast<float>(sum);
      }
    }
  }
  return Array::from_data(out.data(), {1, leading + to.height * to.width, dim}, DType::f32);
}

Params ViTForImageClassification::init(const random::Key& key, Device device) const {
  return init_params(declarations(cfg_, variant_, prefix(), tokens()), key, device);
}

void ViTForImageClassification::check(const Params& params, const std::string& origin) const {
  auto expected = parameter_shapes();
  for (auto& [name, shape] : expected) {
    auto it = params.find(name);
    if (it == params.end()) fail(origin, "missing parameter '" + name + "'");
    if (it->second.shape() != shape)
      fail(origin, "parameter '" + name + "' has shape " + str(it->second.shape()) + ", expected " +
                       str(shape));
  }
  if (params.size() != expected.size())
    for (auto& [name, a] : params) {
      bool known = false;
      for (auto& e : expected) known |= e.first == name;
      if (!known) fail(origin, "unexpected parameter '" + name + "'");
    }
}

Array ViTForImageClassification::apply(const Params& p, const Array& pixels,
                                       const ApplyOptions& opt) const {
  const auto& c = cfg_;
  const Size2d img = c.image_size;
  const int64_t h = c.hidden_size, ch = c.num_channels;
  Shape want = opt.layout == Layout::NCHW ? Shape{-1, ch, img.height, img.width}
                                          : Shape{-1, img.height, img.width, ch};
  bool ok = pixels.ndim() == 4;
  for (int d = 1; ok && d < 4; ++d) ok = pixels.shape()[d] == want[d];
  if (!ok)
    fail("vit", "pixel_values have shape " + str(pixels.shape()) + ", expected (B," +
                    std::to_string(want[1]) + "," + std::to_string(want[2]) + "," +
                    std::to_string(want[3]) + ")" +
                    (opt.layout == Layout::NCHW ? " (NCHW)" : " (NHWC)"));
  const DType dt = opt.matmul_dtype;
  if (dt != DType::f32 && dt != DType::bf16)
    fail("vit", std::string("matmul precision ") + name_of(dt) + ", expected f32 or bf16");
  const int64_t b = pixels.shape()[0];
  const Params no_state;
  ModelOptions mo{.layout = opt.layout,
                  .train = opt.train,
                  .key = opt.dropout_key_array.valid()
                             ? opt.dropout_key_array
                             : random::key_array(opt.dropout_key, pixels.device()),
                  .matmul_dtype = dt,
                  .fused_attention = opt.fused_attention,
                  .inference = opt.inference};
  Scope s(p, no_state, std::move(mo), "vit");
  const std::string m = prefix();
  const Dropout dropout{c.hidden_dropout_prob};

  // The patch embedding (a convolution whose stride is its kernel: a matmul
  // over patches), channels last: tokens [b, patches, hidden].
  Array x = reshape(patch_projection(c, m)(s, pixels, opt.layout, Layout::NHWC),
                    {b, c.num_patches(), h});
  std::vector<Array> seq{broadcast_to(s.param(embeddings(m) + "cls_token"), {b, 1, h})};
  if (variant_ != ViTVariant::ViT)
    seq.push_back(broadcast_to(s.param(embeddings(m) + "distillation_token"), {b, 1, h}));
  seq.push_back(x);
  x = dropout(s, concatenate(seq, 1) + s.param(embeddings(m) + "position_embeddings"));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) x = EncoderLayer(c, m, l)(s, x);
  x = LayerNorm{m + ".layernorm", h, c.layer_norm_eps}(s, x);
  Array first = reshape(slice(x, {0, 0, 0}, {b, 1, h}), {b, h});
  const std::vector<Linear> heads = classifiers(c, variant_);
  if (heads.empty()) return first;
  if (heads.size() == 1) return heads[0](s, first);
  Array second = reshape(slice(x, {0, 1, 0}, {b, 2, h}), {b, h});
  return (heads[0](s, first) + heads[1](s, second)) * 0.5;
}

Array ViTForImageClassification::loss(const Array& logits, const Array& labels,
                                      double label_smoothing) const {
  return classification_loss(logits, labels, cfg_.num_labels, cfg_.problem_type, label_smoothing,
                             "vit");
}

Array classification_loss(const Array& logits, const Array& labels, int64_t num_labels,
                          ProblemType configured, double label_smoothing, const char* who) {
  const ProblemType problem = resolve_problem(configured, num_labels, labels.dtype());
  if (logits.ndim() != 2) fail(who, "logits must be [B, classes], got " + str(logits.shape()));
  const int64_t b = logits.shape()[0];
  auto require = [&](bool ok, const std::string& expected) {
    if (!ok)
      fail(who, std::string("labels are ") + name_of(labels.dtype()) + " " + str(labels.shape()) +
                    ", but problem_type " + problem_type_name(problem) + " with num_labels " +
                    std::to_string(num_labels) + " needs " + expected);
  };
  const bool integer = is_integral(labels.dtype());
  const bool real = is_floating(labels.dtype());
  const std::string like_logits = "float labels " + str(logits.shape()) + " (as the logits)";
  switch (problem) {
    case ProblemType::SingleLabel:
      require(integer && labels.shape() == Shape{b}, "integer labels " + str(Shape{b}));
      if (label_smoothing > 0) {
        if (!(label_smoothing <= 1))
          fail(who, "label smoothing " + std::to_string(label_smoothing) + ", expected 0 to 1");
        // Uniform targets' part: the mean over classes of −log softmax.
        Array uniform = -mean(log_softmax(logits, -1), {-1});
        return mean(softmax_cross_entropy(logits, labels)) * (1.0 - label_smoothing) +
               mean(uniform) * label_smoothing;
      }
      if (label_smoothing < 0)
        fail(who, "label smoothing " + std::to_string(label_smoothing) + ", expected 0 to 1");
      return mean(softmax_cross_entropy(logits, labels));
    case ProblemType::Regression:
      if (num_labels == 1) {
        // MSELoss(logits.squeeze(), labels.squeeze()): both become [B].
        require(real && (labels.shape() == Shape{b} || labels.shape() == Shape{b, 1}),
                "float labels " + str(Shape{b}) + " or " + str(Shape{b, 1}));
        Array y = astype(reshape(labels, {b}), logits.dtype());
        return mean(square(reshape(logits, {b}) - y));
      }
      require(real && labels.shape() == logits.shape(), like_logits);
      return mean(square(logits - astype(labels, logits.dtype())));
    case ProblemType::MultiLabel: {
      require(real && labels.shape() == logits.shape(), like_logits);
      // BCEWithLogitsLoss: mean of log(1 + eˣ) − x·y, i.e. −y·log σ(x) − (1−y)·log(1 − σ(x)).
      return mean(softplus(logits) - logits * astype(labels, logits.dtype()));
    }
    case ProblemType::Unset: break;
  }
  fail(who, "no problem type resolved");
}

}  // namespace kiln::nn
