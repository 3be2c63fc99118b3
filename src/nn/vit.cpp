// kiln nn: ViTForImageClassification, parameter for parameter as HuggingFace
// transformers builds it (modeling_vit.py, eager attention).
#include <cmath>
#include <iomanip>
#include <sstream>

#include "kiln/nn.h"

namespace kiln::nn {
namespace {

std::string layer_prefix(int64_t i) {
  return "vit.encoder.layer." + std::to_string(i) + ".";
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

Array activation(Activation act, const Array& x) {
  switch (act) {
    case Activation::Gelu: return gelu(x);
    case Activation::GeluTanh: return gelu_tanh(x);
    case Activation::Relu: return relu(x);
  }
  return x;
}

// Inverted dropout: kept values are scaled by 1/(1-p).
class Dropout {
 public:
  Dropout(const ApplyOptions& opt)
      : active_(opt.train), key_(opt.dropout_key), key_array_(opt.dropout_key_array) {}
  Array operator()(const Array& x, double p) {
    if (!active_ || p <= 0) return x;
    uint32_t site = counter_++;
    Array keep = key_array_.valid()
                     ? random::bernoulli(key_array_, site, x.shape(), 1.0 - p)
                     : random::bernoulli(random::fold_in(key_, site), x.shape(), 1.0 - p);
    return where(keep, x * (1.0 / (1.0 - p)), scalar_like(x, 0.0));
  }

 private:
  bool active_;
  random::Key key_;
  Array key_array_;
  uint32_t counter_ = 0;
};

}  // namespace

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

void ViTConfig::validate(const std::string& origin) const {
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0) fail(origin, std::string(field) + " must be positive, got " + std::to_string(v));
  };
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(intermediate_size, "intermediate_size");
  positive(image_size, "image_size");
  positive(patch_size, "patch_size");
  positive(num_channels, "num_channels");
  positive(num_labels, "num_labels");
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
  at_most(image_size, kMaxSize, "image_size");
  at_most(patch_size, kMaxSize, "patch_size");
  at_most(num_channels, kMaxSize, "num_channels");
  at_most(num_labels, kMaxSize, "num_labels");
  if (hidden_size % num_attention_heads != 0)
    fail(origin, "hidden_size " + std::to_string(hidden_size) +
                     " is not a multiple of num_attention_heads " +
                     std::to_string(num_attention_heads));
  if (image_size % patch_size != 0)
    fail(origin, "image_size " + std::to_string(image_size) + " is not a multiple of patch_size " +
                     std::to_string(patch_size));
  auto probability = [&](double v, const char* field) {
    if (!(v >= 0 && v < 1))
      fail(origin, std::string(field) + " must lie in [0, 1), got " + std::to_string(v));
  };
  probability(hidden_dropout_prob, "hidden_dropout_prob");
  probability(attention_probs_dropout_prob, "attention_probs_dropout_prob");
  if (!(initializer_range > 0)) fail(origin, "initializer_range must be positive");
  if (!(layer_norm_eps > 0)) fail(origin, "layer_norm_eps must be positive");
  // The two parameters whose size is a product of more than two fields.
  constexpr double kMaxElements = double(int64_t{1} << 40);
  auto approx = [](double v) {
    std::ostringstream os;
    os << std::setprecision(3) << v;
    return os.str();
  };
  const double patch_weights = double(hidden_size) * num_channels * patch_size * patch_size;
  if (patch_weights > kMaxElements)
    fail(origin, "the patch projection (hidden_size x num_channels x patch_size^2) has " +
                     approx(patch_weights) + " elements, expected at most 2^40");
  const double positions = (double(num_patches()) + 1) * hidden_size;
  if (positions > kMaxElements)
    fail(origin, "the position embeddings ((image_size / patch_size)^2 + 1 tokens x " +
                     std::string("hidden_size) have ") + approx(positions) +
                     " elements, expected at most 2^40");
}

double ViTConfig::train_flops_per_image() const {
  double t = static_cast<double>(num_patches() + 1), h = hidden_size, i = intermediate_size;
  double patch = 2.0 * num_patches() * (num_channels * patch_size * patch_size) * h;
  double layer = 2.0 * t * h * 3 * h     // q, k, v
                 + 2.0 * 2 * t * t * h   // scores and probabilities · values
                 + 2.0 * t * h * h       // output projection
                 + 2.0 * 2 * t * h * i;  // MLP
  double head = 2.0 * h * num_labels;
  double forward = patch + num_hidden_layers * layer + head;
  return 3 * forward - patch;  // backward is twice the forward, but pixels need no gradient
}

ViTForImageClassification::ViTForImageClassification(ViTConfig cfg) : cfg_(cfg) {
  cfg_.validate();
}

std::vector<std::pair<std::string, Shape>> ViTForImageClassification::parameter_shapes() const {
  const auto& c = cfg_;
  int64_t h = c.hidden_size;
  std::vector<std::pair<std::string, Shape>> s = {
      {"vit.embeddings.cls_token", {1, 1, h}},
      {"vit.embeddings.position_embeddings", {1, c.num_patches() + 1, h}},
      {"vit.embeddings.patch_embeddings.projection.weight",
       {h, c.num_channels, c.patch_size, c.patch_size}},
      {"vit.embeddings.patch_embeddings.projection.bias", {h}},
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = layer_prefix(l);
    for (const char* ln : {"layernorm_before", "layernorm_after"}) {
      s.push_back({p + ln + ".weight", {h}});
      s.push_back({p + ln + ".bias", {h}});
    }
    for (const char* proj : {"query", "key", "value"}) {
      s.push_back({p + "attention.attention." + proj + ".weight", {h, h}});
      if (c.qkv_bias) s.push_back({p + "attention.attention." + proj + ".bias", {h}});
    }
    s.push_back({p + "attention.output.dense.weight", {h, h}});
    s.push_back({p + "attention.output.dense.bias", {h}});
    s.push_back({p + "intermediate.dense.weight", {c.intermediate_size, h}});
    s.push_back({p + "intermediate.dense.bias", {c.intermediate_size}});
    s.push_back({p + "output.dense.weight", {h, c.intermediate_size}});
    s.push_back({p + "output.dense.bias", {h}});
  }
  s.push_back({"vit.layernorm.weight", {h}});
  s.push_back({"vit.layernorm.bias", {h}});
  s.push_back({"classifier.weight", {c.num_labels, h}});
  s.push_back({"classifier.bias", {c.num_labels}});
  return s;
}

Params ViTForImageClassification::init(const random::Key& key) const {
  Params p;
  uint32_t i = 0;
  for (auto& [name, shape] : parameter_shapes()) {
    random::Key k = random::fold_in(key, i++);
    bool is_norm = name.find("layernorm") != std::string::npos;
    bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm && !is_bias) {
      p.emplace(name, ones(shape));
    } else if (is_bias) {
      p.emplace(name, zeros(shape));
    } else {
      // torch.nn.init.trunc_normal_(std=initializer_range), bounds ±2 absolute.
      double std = cfg_.initializer_range;
      p.emplace(name, random::truncated_normal(k, shape, -2.0 / std, 2.0 / std) * std);
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
  const int64_t ps = c.patch_size, g = c.image_size / ps, n = c.num_patches(), h = c.hidden_size;
  const int64_t heads = c.num_attention_heads, dh = c.head_dim();
  Shape want = opt.layout == Layout::NCHW ? Shape{-1, c.num_channels, c.image_size, c.image_size}
                                          : Shape{-1, c.image_size, c.image_size, c.num_channels};
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

  // Patch embedding: a stride-16 16x16 convolution is a matmul over patches
  // flattened in the weight's (channel, row, column) order.
  Array patches =
      opt.layout == Layout::NCHW
          ? transpose(reshape(pixels, {b, c.num_channels, g, ps, g, ps}), {0, 2, 4, 1, 3, 5})
          : transpose(reshape(pixels, {b, g, ps, g, ps, c.num_channels}), {0, 1, 3, 5, 2, 4});
  patches = reshape(patches, {b * n, c.num_channels * ps * ps});
  Array w = reshape(p.at("vit.embeddings.patch_embeddings.projection.weight"), {h, -1});
  Array x = mm(patches, w, {.transpose_b = true}, dt) +
            p.at("vit.embeddings.patch_embeddings.projection.bias");
  x = reshape(x, {b, n, h});
  Array cls = broadcast_to(p.at("vit.embeddings.cls_token"), {b, 1, h});
  x = concatenate({cls, x}, 1) + p.at("vit.embeddings.position_embeddings");
  x = dropout(x, c.hidden_dropout_prob);
  const int64_t t = n + 1;

  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const bool fused_attention =
      opt.fused_attention && !(opt.train && c.attention_probs_dropout_prob > 0);
  auto split_heads = [&](const Array& y) {  // [b, t, h] -> [b, heads, t, dh]
    return transpose(reshape(y, {b, t, heads, dh}), {0, 2, 1, 3});
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string pre = layer_prefix(l);
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
      ctx = reshape(attention(reshape(qkv, {b, t, 3, heads, dh}), scale), {b, t, h});
    } else {
      Array q = split_heads(linear(p, att + "query", hn, dt, c.qkv_bias));
      Array k = split_heads(linear(p, att + "key", hn, dt, c.qkv_bias));
      Array v = split_heads(linear(p, att + "value", hn, dt, c.qkv_bias));
      Array scores = mm(q, k, {.transpose_b = true}, dt) * scale;
      Array probs = dropout(softmax(scores, -1), c.attention_probs_dropout_prob);
      ctx = reshape(transpose(mm(probs, v, {}, dt), {0, 2, 1, 3}), {b, t, h});
    }
    Array attn = dropout(linear(p, pre + "attention.output.dense", ctx, dt), c.hidden_dropout_prob);
    x = x + std::move(attn);
    Array hn2 = layer_norm_of(p, pre + "layernorm_after", x, c.layer_norm_eps);
    Array mid = activation(c.hidden_act, linear(p, pre + "intermediate.dense", hn2, dt));
    Array out = dropout(linear(p, pre + "output.dense", mid, dt), c.hidden_dropout_prob);
    x = x + std::move(out);
  }
  x = layer_norm_of(p, "vit.layernorm", x, c.layer_norm_eps);
  Array first = reshape(slice(x, {0, 0, 0}, {b, 1, h}), {b, h});
  return linear(p, "classifier", first, dt);
}

}  // namespace kiln::nn
