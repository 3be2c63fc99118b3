// kiln nn: ViTForImageClassification, parameter for parameter as HuggingFace
// transformers builds it (modeling_vit.py, eager attention).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

#include "kiln/nn.h"
#include "ops/dispatch.h"

namespace kiln::nn {
namespace {

std::string layer_prefix(const std::string& model, int64_t i) {
  return model + ".encoder.layer." + std::to_string(i) + ".";
}

// A matmul whose operands are rounded to `dt` (bf16 mixed precision) and
// whose result is f32.
Array mm(const Array& a, const Array& b, MatmulOptions o, DType dt) {
  if (dt == DType::f32) return matmul(a, b, o);
  o.out = DType::f32;
  return matmul(astype(a, dt), astype(b, dt), o);
}

// y = x · Wᵀ + b for x [..., in], W [out, in] (torch.nn.Linear).
Array linear(const Params& p, const std::string& name, const Array& x, DType dt, bool bias = true) {
  Array y = mm(x, p.at(name + ".weight"), {.transpose_b = true}, dt);
  // (y is given up: eager mode adds the bias in its buffer)
  return bias ? std::move(y) + p.at(name + ".bias") : y;
}

Array layer_norm_of(const Params& p, const std::string& name, const Array& x, double eps) {
  return layer_norm(x, p.at(name + ".weight"), p.at(name + ".bias"), eps);
}

// Inverted dropout: kept values are scaled by 1/(1-p); p = 1 drops
// everything (torch returns x * 0, whose gradient is 0).
class Dropout {
 public:
  Dropout(const ApplyOptions& opt)
      : active_(opt.train), key_(opt.dropout_key), key_array_(opt.dropout_key_array) {}
  Array operator()(const Array& x, double p) {
    if (!active_ || p <= 0) return x;
    if (p >= 1) return x * 0.0;
    uint32_t site = counter_++;
    Array keep =
        key_array_.valid()
            ? random::bernoulli(key_array_.to(x.device()), site, x.shape(), 1.0 - p)
            : random::bernoulli(random::fold_in(key_, site), x.shape(), 1.0 - p, x.device());
    return where(keep, x * (1.0 / (1.0 - p)), scalar_like(x, 0.0));
  }

 private:
  bool active_;
  random::Key key_;
  Array key_array_;
  uint32_t counter_ = 0;
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

std::vector<std::pair<std::string, Shape>> ViTForImageClassification::parameter_shapes() const {
  const auto& c = cfg_;
  int64_t h = c.hidden_size;
  const std::string m = prefix();
  std::vector<std::pair<std::string, Shape>> s = {{m + ".embeddings.cls_token", {1, 1, h}}};
  if (variant_ != ViTVariant::ViT) s.push_back({m + ".embeddings.distillation_token", {1, 1, h}});
  s.push_back({m + ".embeddings.position_embeddings", {1, c.num_patches() + tokens(), h}});
  s.push_back({m + ".embeddings.patch_embeddings.projection.weight",
               {h, c.num_channels, c.patch_size.height, c.patch_size.width}});
  s.push_back({m + ".embeddings.patch_embeddings.projection.bias", {h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = layer_prefix(m, l);
    for (const char* ln : {"layernorm_before", "layernorm_after"}) {
      s.push_back({p + ln + ".weight", {h}});
      s.push_back({p + ln + ".bias", {h}});
    }
    const int64_t a = c.heads_in_layer(l) * c.head_dim();  // less with pruned heads
    for (const char* proj : {"query", "key", "value"}) {
      s.push_back({p + "attention.attention." + proj + ".weight", {a, h}});
      if (c.qkv_bias) s.push_back({p + "attention.attention." + proj + ".bias", {a}});
    }
    s.push_back({p + "attention.output.dense.weight", {h, a}});
    s.push_back({p + "attention.output.dense.bias", {h}});
    s.push_back({p + "intermediate.dense.weight", {c.intermediate_size, h}});
    s.push_back({p + "intermediate.dense.bias", {c.intermediate_size}});
    s.push_back({p + "output.dense.weight", {h, c.intermediate_size}});
    s.push_back({p + "output.dense.bias", {h}});
  }
  s.push_back({m + ".layernorm.weight", {h}});
  s.push_back({m + ".layernorm.bias", {h}});
  if (c.num_labels > 0) {
    const std::vector<std::string> heads =
        variant_ == ViTVariant::DeiTWithTeacher
            ? std::vector<std::string>{"cls_classifier", "distillation_classifier"}
            : std::vector<std::string>{"classifier"};
    for (const std::string& head : heads) {
      s.push_back({head + ".weight", {c.num_labels, h}});
      s.push_back({head + ".bias", {c.num_labels}});
    }
  }
  return s;
}

Array resample_position_embeddings(const Array& pos, Size2d from, Size2d to) {
  const int64_t n = from.height * from.width;
  if (pos.ndim() != 3 || pos.shape()[0] != 1 || pos.shape()[1] != 1 + n)
    fail("vit", "position embeddings of shape " + str(pos.shape()) + " for a grid of " +
                    to_string(from) + " patches, expected (1," + std::to_string(1 + n) +
                    ",hidden)");
  if (to.height <= 0 || to.width <= 0)
    fail("vit", "a grid of " + to_string(to) + " patches, expected at least one patch");
  if (from == to) return pos;
  const int64_t dim = pos.shape()[2];
  const std::vector<double> in = pos.to_vector<double>();
  std::vector<float> out((1 + to.height * to.width) * dim);
  for (int64_t c = 0; c < dim; ++c) out[c] = static_cast<float>(in[c]);
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
      float* dst = &out[(1 + oy * to.width + ox) * dim];
      for (int64_t c = 0; c < dim; ++c) {
        double sum = 0;
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j)
            sum += ky.weight[i] * kx.weight[j] *
                   in[(1 + ky.index[i] * from.width + kx.index[j]) * dim + c];
        dst[c] = static_cast<float>(sum);
      }
    }
  }
  return Array::from_data(out.data(), {1, 1 + to.height * to.width, dim}, DType::f32);
}

Params ViTForImageClassification::init(const random::Key& key, Device device) const {
  Params p;
  uint32_t i = 0;
  for (auto& [name, shape] : parameter_shapes()) {
    random::Key k = random::fold_in(key, i++);
    bool is_norm = name.find("layernorm") != std::string::npos;
    // DeiT's tokens and position embeddings start at zero (torch.zeros; its
    // _init_weights leaves them), ViT's are drawn.
    if (variant_ != ViTVariant::ViT && name.find(".embeddings.") != std::string::npos &&
        name.find("patch_embeddings") == std::string::npos) {
      p.emplace(name, zeros(shape, DType::f32, device));
      continue;
    }
    bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm && !is_bias) {
      p.emplace(name, ones(shape, DType::f32, device));
    } else if (is_bias) {
      p.emplace(name, zeros(shape, DType::f32, device));
    } else {
      // torch.nn.init.trunc_normal_(std=initializer_range), bounds ±2 absolute.
      double std = cfg_.initializer_range;
      p.emplace(name,
                random::truncated_normal(k, shape, -2.0 / std, 2.0 / std, DType::f32, device) * std);
    }
  }
  eval(p);
  return p;
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
  const Size2d img = c.image_size, ps = c.patch_size, g = c.grid();
  const int64_t n = c.num_patches(), h = c.hidden_size, ch = c.num_channels;
  const int64_t dh = c.head_dim();
  Shape want = opt.layout == Layout::NCHW ? Shape{-1, ch, img.height, img.width}
                                          : Shape{-1, img.height, img.width, ch};
  bool ok = pixels.ndim() == 4;
  for (int d = 1; ok && d < 4; ++d) ok = pixels.shape()[d] == want[d];
  if (!ok)
    fail("vit", "pixel_values have shape " + str(pixels.shape()) + ", expected (B," +
                    std::to_string(want[1]) + "," + std::to_string(want[2]) + "," +
                    std::to_string(want[3]) + ")" +
                    (opt.layout == Layout::NCHW ? " (NCHW)" : " (NHWC)"));
  const int64_t b = pixels.shape()[0];
  Dropout dropout(opt);
  const DType dt = opt.matmul_dtype;
  if (dt != DType::f32 && dt != DType::bf16)
    fail("vit", std::string("matmul precision ") + name_of(dt) + ", expected f32 or bf16");

  // Patch embedding: a convolution whose stride is its kernel is a matmul
  // over patches flattened in the weight's (channel, row, column) order. Its
  // windows never reach the last image_size % patch_size rows and columns.
  const int64_t used_h = g.height * ps.height, used_w = g.width * ps.width;
  Array used = pixels;
  if (used_h != img.height || used_w != img.width)
    used = opt.layout == Layout::NCHW ? slice(pixels, {0, 0, 0, 0}, {b, ch, used_h, used_w})
                                      : slice(pixels, {0, 0, 0, 0}, {b, used_h, used_w, ch});
  Array patches = opt.layout == Layout::NCHW
                      ? transpose(reshape(used, {b, ch, g.height, ps.height, g.width, ps.width}),
                                  {0, 2, 4, 1, 3, 5})
                      : transpose(reshape(used, {b, g.height, ps.height, g.width, ps.width, ch}),
                                  {0, 1, 3, 5, 2, 4});
  patches = reshape(patches, {b * n, ch * ps.height * ps.width});
  const std::string m = prefix();
  Array w = reshape(p.at(m + ".embeddings.patch_embeddings.projection.weight"), {h, -1});
  Array x = mm(patches, w, {.transpose_b = true}, dt) +
            p.at(m + ".embeddings.patch_embeddings.projection.bias");
  x = reshape(x, {b, n, h});
  std::vector<Array> seq{broadcast_to(p.at(m + ".embeddings.cls_token"), {b, 1, h})};
  if (variant_ != ViTVariant::ViT)
    seq.push_back(broadcast_to(p.at(m + ".embeddings.distillation_token"), {b, 1, h}));
  seq.push_back(x);
  x = concatenate(seq, 1) + p.at(m + ".embeddings.position_embeddings");
  x = dropout(x, c.hidden_dropout_prob);
  const int64_t t = n + tokens();

  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const bool fused_attention =
      opt.fused_attention && !(opt.train && c.attention_probs_dropout_prob > 0);
  // bf16 mixed precision runs the fused attention on bf16 q, k and v (its
  // softmax in f32) where the backend has that kernel (cpu and cuda), and its
  // bf16 output feeds the output projection without a cast; elsewhere the
  // attention stays f32.
  const bool bf16_attention =
      fused_attention && dt == DType::bf16 &&
      backend_supports(x.device(), Primitive(Op::Attention, AttentionAttrs{scale}), {DType::bf16},
                       DType::bf16);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string pre = layer_prefix(m, l);
    // Pruned heads narrow a layer's attention to heads * dh features.
    const int64_t heads = c.heads_in_layer(l), a = heads * dh;
    auto split_heads = [&](const Array& y) {  // [b, t, a] -> [b, heads, t, dh]
      return transpose(reshape(y, {b, t, heads, dh}), {0, 2, 1, 3});
    };
    Array hn = layer_norm_of(p, pre + "layernorm_before", x, c.layer_norm_eps);
    std::string att = pre + "attention.attention.";
    Array ctx;
    if (fused_attention) {
      auto cat = [&](const std::string& what) {
        return concatenate(
            {p.at(att + "query." + what), p.at(att + "key." + what), p.at(att + "value." + what)},
            0);
      };
      Array qkv = mm(hn, cat("weight"), {.transpose_b = true}, dt);
      if (c.qkv_bias) qkv = std::move(qkv) + cat("bias");
      Array packed = reshape(qkv, {b, t, 3, heads, dh});
      if (bf16_attention) packed = astype(packed, DType::bf16);
      ctx = reshape(attention(packed, scale), {b, t, a});
    } else {
      Array q = split_heads(linear(p, att + "query", hn, dt, c.qkv_bias));
      Array k = split_heads(linear(p, att + "key", hn, dt, c.qkv_bias));
      Array v = split_heads(linear(p, att + "value", hn, dt, c.qkv_bias));
      Array scores = mm(q, k, {.transpose_b = true}, dt) * scale;
      Array probs = dropout(softmax(scores, -1), c.attention_probs_dropout_prob);
      ctx = reshape(transpose(mm(probs, v, {}, dt), {0, 2, 1, 3}), {b, t, a});
    }
    Array attn = dropout(linear(p, pre + "attention.output.dense", ctx, dt), c.hidden_dropout_prob);
    x = x + std::move(attn);
    Array hn2 = layer_norm_of(p, pre + "layernorm_after", x, c.layer_norm_eps);
    // bf16 mixed precision keeps the MLP's widest activation in bf16, as
    // autocast does: in training, the intermediate linear's output (bias
    // added in f32, then rounded; compiled, the GEMM writes it so), which the
    // backward pass keeps, and the activation of it, which the next GEMM
    // reads as it is. Inference keeps nothing for a backward pass: the
    // activation reads the f32 sum, and compiled, the GEMM's epilogue applies
    // it and writes bf16 once. f32 mode is unchanged.
    Array pre_act = linear(p, pre + "intermediate.dense", hn2, dt);
    if (dt == DType::bf16 && !opt.inference) pre_act = astype(pre_act, DType::bf16);
    Array mid = activate(c.hidden_act, pre_act);
    Array out = dropout(linear(p, pre + "output.dense", mid, dt), c.hidden_dropout_prob);
    x = x + std::move(out);
  }
  x = layer_norm_of(p, m + ".layernorm", x, c.layer_norm_eps);
  Array first = reshape(slice(x, {0, 0, 0}, {b, 1, h}), {b, h});
  if (c.num_labels == 0) return first;
  if (variant_ != ViTVariant::DeiTWithTeacher) return linear(p, "classifier", first, dt);
  Array second = reshape(slice(x, {0, 1, 0}, {b, 2, h}), {b, h});
  return (linear(p, "cls_classifier", first, dt) +
          linear(p, "distillation_classifier", second, dt)) *
         0.5;
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
