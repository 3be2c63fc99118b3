// kiln nn: the layers the model families are built of (kiln/layers.h).
#include "kiln/layers.h"

#include <cmath>

namespace kiln::nn {

Init Init::kaiming_normal_fan_out(int64_t fan_out) {
  return normal(std::sqrt(2.0 / static_cast<double>(fan_out)));
}

Init Init::torch_default(int64_t fan_in) {
  return uniform(1.0 / std::sqrt(static_cast<double>(fan_in)));
}

Array Init::draw(const random::Key& key, const Shape& shape, Device device) const {
  switch (kind) {
    case Kind::Zeros: return kiln::zeros(shape, DType::f32, device);
    case Kind::Ones: return kiln::ones(shape, DType::f32, device);
    case Kind::Constant: return full(shape, value, DType::f32, device);
    case Kind::Normal: return random::normal(key, shape, DType::f32, device) * value;
    case Kind::TruncatedNormal:
      // torch.nn.init.trunc_normal_(std=value): bounds ±2 absolute.
      return random::truncated_normal(key, shape, -2.0 / value, 2.0 / value, DType::f32, device) *
             value;
    case Kind::Uniform: return random::uniform(key, shape, -value, value, DType::f32, device);
  }
  fail("nn", "unknown initializer");
}

std::vector<std::pair<std::string, Shape>> shapes_of(const Decls& decls) {
  std::vector<std::pair<std::string, Shape>> out;
  out.reserve(decls.size());
  for (const ParamDecl& d : decls) out.emplace_back(d.name, d.shape);
  return out;
}

Params init_params(const Decls& decls, const random::Key& key, Device device) {
  Params p;
  uint32_t i = 0;
  for (const ParamDecl& d : decls)
    p.emplace(d.name, d.init.draw(random::fold_in(key, i++), d.shape, device));
  eval(p);
  return p;
}

Params init_state(const Decls& decls, Device device) {
  Params s;
  for (const ParamDecl& d : decls) {
    Array a = d.init.draw(random::Key(0), d.shape, device);
    s.emplace(d.name, d.dtype == DType::f32 ? a : astype(a, d.dtype));
  }
  eval(s);
  return s;
}

std::string join_name(const std::string& prefix, const std::string& leaf) {
  return prefix.empty() ? leaf : prefix + "." + leaf;
}

Scope::Scope(const Params& params, const Params& state, ModelOptions opt, std::string who)
    : params_(params),
      state_(state),
      new_state_(state),
      opt_(std::move(opt)),
      who_(std::move(who)) {}

const Array& Scope::param(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) fail(who_, "missing parameter '" + name + "'");
  return it->second;
}

const Array& Scope::state(const std::string& name) const {
  auto it = state_.find(name);
  if (it == state_.end()) fail(who_, "missing state entry '" + name + "'");
  return it->second;
}

void Scope::update(const std::string& name, Array value) {
  new_state_[name] = std::move(value);
}

Array Scope::keep_mask(uint32_t site, const Shape& shape, double keep, Device device) {
  if (!opt_.key.valid()) opt_.key = random::key_array(random::Key(0), device);
  return random::bernoulli(opt_.key.to(device), site, shape, keep);
}

Array mixed_matmul(const Array& a, const Array& b, MatmulOptions o, DType dtype) {
  if (dtype == DType::f32) return matmul(a, b, o);
  o.out = DType::f32;
  return matmul(astype(a, dtype), astype(b, dtype), o);
}

void Linear::declare(Decls& d) const {
  d.push_back({join_name(name, "weight"), {out, in}, weight_init});
  if (bias) d.push_back({join_name(name, "bias"), {out}, bias_init});
}

Array Linear::operator()(Scope& s, const Array& x) const {
  Array y =
      mixed_matmul(x, s.param(join_name(name, "weight")), {.transpose_b = true}, s.matmul_dtype());
  // (y is given up: eager mode adds the bias in its buffer)
  return bias ? std::move(y) + s.param(join_name(name, "bias")) : y;
}

void Conv2d::declare(Decls& d) const {
  if (groups < 1 || in % groups != 0 || out % groups != 0)
    fail("nn.Conv2d", name + ": " + std::to_string(in) + " input and " + std::to_string(out) +
                          " output channels in " + std::to_string(groups) +
                          " groups, expected both divisible by groups");
  d.push_back(
      {join_name(name, "weight"), {out, in / groups, kernel.height, kernel.width}, weight_init});
  if (bias) d.push_back({join_name(name, "bias"), {out}, bias_init});
}

Array Conv2d::operator()(Scope& s, const Array& x, Layout in_layout, Layout out_layout) const {
  const bool nhwc = in_layout == Layout::NHWC;
  if (x.ndim() != 4 || x.shape()[nhwc ? 3 : 1] != in)
    fail(s.who(), name + ": input " + str(x.shape()) + ", expected " + std::to_string(in) +
                      " channels on axis " + (nhwc ? "3 (NHWC)" : "1 (NCHW)"));
  const Array& w = s.param(join_name(name, "weight"));
  Array y;
  if (patch_matmul) {
    if (!(stride == kernel && padding.empty() && !same && dilation == Size2d(1) && groups == 1))
      fail(s.who(),
           name + ": a patch matmul needs stride = kernel, no padding, dilation or groups");
    // Non-overlapping windows: a matmul over patches flattened in the
    // weight's (channel, row, column) order. Like torch's Conv2d it ignores
    // the last rows and columns that no window reaches.
    const int64_t b = x.shape()[0], h = x.shape()[nhwc ? 1 : 2], wd = x.shape()[nhwc ? 2 : 3];
    const int64_t gh = h / kernel.height, gw = wd / kernel.width;
    if (gh < 1 || gw < 1)
      fail(s.who(),
           name + ": a " + to_string(kernel) + " window does not fit the input " + str(x.shape()));
    const int64_t uh = gh * kernel.height, uw = gw * kernel.width;
    Array used = x;
    if (uh != h || uw != wd)
      used =
          nhwc ? slice(x, {0, 0, 0, 0}, {b, uh, uw, in}) : slice(x, {0, 0, 0, 0}, {b, in, uh, uw});
    Array p = nhwc ? transpose(reshape(used, {b, gh, kernel.height, gw, kernel.width, in}),
                               {0, 1, 3, 5, 2, 4})
                   : transpose(reshape(used, {b, in, gh, kernel.height, gw, kernel.width}),
                               {0, 2, 4, 1, 3, 5});
    p = reshape(p, {b * gh * gw, in * kernel.height * kernel.width});
    y = mixed_matmul(p, reshape(w, {out, -1}), {.transpose_b = true}, s.matmul_dtype());
    if (bias) y = std::move(y) + s.param(join_name(name, "bias"));
    y = reshape(y, {b, gh, gw, out});
    return out_layout == Layout::NHWC ? y : transpose(y, {0, 3, 1, 2});
  }
  ConvOptions o{.stride = {stride.height, stride.width},
                .dilation = {dilation.height, dilation.width},
                .padding = padding,
                .same = same,
                .groups = groups,
                .channels_last = nhwc};
  if (s.matmul_dtype() == DType::f32) {
    y = conv2d(x, w, o);
  } else {
    // Mixed precision: bf16 operands, the f32-accumulated result widened
    // back to f32 for the bias, the normalization and the residual sums.
    y = conv2d(astype(x, s.matmul_dtype()), astype(w, s.matmul_dtype()), o);
    if (!bf16_result || bias) y = astype(y, DType::f32);
  }
  if (bias) {
    const Array& bv = s.param(join_name(name, "bias"));
    y = nhwc ? y + bv : y + reshape(bv, {out, 1, 1});
  }
  if (in_layout == out_layout) return y;
  return nhwc ? transpose(y, {0, 3, 1, 2}) : transpose(y, {0, 2, 3, 1});
}

void LayerNorm::declare(Decls& d) const {
  d.push_back({join_name(name, "weight"), {dim}, Init::ones()});
  d.push_back({join_name(name, "bias"), {dim}, Init::zeros()});
}

Array LayerNorm::operator()(Scope& s, const Array& x) const {
  const Array& g = s.param(join_name(name, "weight"));
  const Array& b = s.param(join_name(name, "bias"));
  if (!channels_first) return layer_norm(x, g, b, eps);
  if (x.ndim() < 2) fail(s.who(), name + ": a channels-first LayerNorm of " + str(x.shape()));
  // [N, C, ...] -> [N, ..., C], normalized, and back.
  const int n = static_cast<int>(x.ndim());
  std::vector<int> to_last{0}, to_first{0, n - 1};
  for (int a = 2; a < n; ++a) to_last.push_back(a), to_first.push_back(a - 1);
  to_last.push_back(1);
  return transpose(layer_norm(transpose(x, to_last), g, b, eps), to_first);
}

void BatchNorm::declare(Decls& d) const {
  d.push_back({join_name(name, "weight"), {dim}, Init::ones()});
  d.push_back({join_name(name, "bias"), {dim}, Init::zeros()});
}

void BatchNorm::declare_state(Decls& d) const {
  d.push_back({join_name(name, "running_mean"), {dim}, Init::zeros()});
  d.push_back({join_name(name, "running_var"), {dim}, Init::ones()});
  d.push_back({join_name(name, "num_batches_tracked"), {}, Init::zeros(), DType::i64});
}

Array BatchNorm::operator()(Scope& s, const Array& x, Layout layout) const {
  const std::string mean_name = join_name(name, "running_mean"),
                    var_name = join_name(name, "running_var");
  const bool narrow = x.dtype() == DType::bf16;
  const BatchNormResult r =
      batch_norm(narrow ? astype(x, DType::f32) : x, s.param(join_name(name, "weight")),
                 s.param(join_name(name, "bias")), s.state(mean_name), s.state(var_name),
                 {.training = s.train(),
                  .momentum = momentum,
                  .eps = eps,
                  .channels_last = layout == Layout::NHWC});
  if (s.train()) {
    s.update(mean_name, r.running_mean);
    s.update(var_name, r.running_var);
    const std::string n_name = join_name(name, "num_batches_tracked");
    const Array& n = s.state(n_name);
    s.update(n_name, n + scalar_like(n, 1.0));
  }
  return narrow ? astype(r.y, DType::bf16) : r.y;
}

void Embedding::declare(Decls& d) const {
  d.push_back({join_name(name, "weight"), {num, dim}, init});
}

Array Embedding::operator()(Scope& s, const Array& ids) const {
  if (!is_integral(ids.dtype()))
    fail(s.who(), name + ": ids of dtype " + name_of(ids.dtype()) + ", expected integers");
  return take(s.param(join_name(name, "weight")), ids, 0);
}

Array Dropout::operator()(Scope& s, const Array& x) const {
  const uint32_t site = s.next_site();
  if (!s.dropping() || p <= 0) return x;
  if (p >= 1) return x * 0.0;
  const Array keep = s.keep_mask(site, x.shape(), 1.0 - p, x.device());
  return where(keep, x * (1.0 / (1.0 - p)), scalar_like(x, 0.0));
}

Array DropPath::operator()(Scope& s, const Array& x) const {
  const uint32_t site = s.next_site();
  if (!s.dropping() || p <= 0 || x.ndim() == 0) return x;
  if (p >= 1) return x * 0.0;
  Shape per_example(x.ndim(), 1);
  per_example[0] = x.shape()[0];
  const Array keep = s.keep_mask(site, per_example, 1.0 - p, x.device());
  return x * astype(keep, x.dtype()) / (1.0 - p);
}

void MultiHeadAttention::declare(Decls& d) const {
  const int64_t a = heads * head_dim;
  for (const std::string* n : {&query, &key, &value}) {
    d.push_back({join_name(*n, "weight"), {a, dim}, weight_init});
    if (qkv_bias) d.push_back({join_name(*n, "bias"), {a}, Init::zeros()});
  }
  d.push_back({join_name(output, "weight"), {dim, a}, weight_init});
  d.push_back({join_name(output, "bias"), {dim}, Init::zeros()});
}

Array MultiHeadAttention::operator()(Scope& s, const Array& x) const {
  if (x.ndim() != 3 || x.shape()[2] != dim)
    fail(s.who(), query + ": attention input " + str(x.shape()) + ", expected [batch, tokens, " +
                      std::to_string(dim) + "]");
  const int64_t b = x.shape()[0], t = x.shape()[1], a = heads * head_dim;
  const DType dt = s.matmul_dtype();
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const Dropout probs_dropout{dropout};
  const bool fused = s.options().fused_attention && !(s.dropping() && dropout > 0);
  Array ctx;
  if (fused) {
    const uint32_t site = s.next_site();  // the probabilities' (unused) site
    (void)site;
    auto cat = [&](const char* leaf) {
      return concatenate({s.param(join_name(query, leaf)), s.param(join_name(key, leaf)),
                          s.param(join_name(value, leaf))},
                         0);
    };
    Array qkv = mixed_matmul(x, cat("weight"), {.transpose_b = true}, dt);
    if (qkv_bias) qkv = std::move(qkv) + cat("bias");
    Array packed = reshape(qkv, {b, t, 3, heads, head_dim});
    // bf16 mixed precision runs the fused attention on bf16 q, k and v (its
    // softmax in f32) where the backend has that kernel (cpu and cuda); its
    // bf16 output feeds the output projection without a cast.
    if (dt == DType::bf16 && fused_attention_runs_in(x.device(), DType::bf16))
      packed = astype(packed, DType::bf16);
    ctx = reshape(attention(packed, scale), {b, t, a});
  } else {
    auto heads_of = [&](const std::string& n) {  // [b, t, a] -> [b, heads, t, head_dim]
      const Array y = Linear{n, dim, a, qkv_bias}(s, x);
      return transpose(reshape(y, {b, t, heads, head_dim}), {0, 2, 1, 3});
    };
    const Array q = heads_of(query), k = heads_of(key), v = heads_of(value);
    const Array scores = mixed_matmul(q, k, {.transpose_b = true}, dt) * scale;
    const Array probs = probs_dropout(s, softmax(scores, -1));
    ctx = reshape(transpose(mixed_matmul(probs, v, {}, dt), {0, 2, 1, 3}), {b, t, a});
  }
  return Linear{output, a, dim}(s, ctx);
}

void MLP::declare(Decls& d) const {
  up.declare(d);
  down.declare(d);
}

Array MLP::operator()(Scope& s, const Array& x) const {
  // bf16 mixed precision keeps the widest activation in bf16, as autocast
  // does: in training, up's output (bias added in f32, then rounded;
  // compiled, the GEMM writes it so), which the backward pass keeps, and the
  // activation of it, which the next GEMM reads as it is. Inference keeps
  // nothing for a backward pass: the activation reads the f32 sum, and
  // compiled, the GEMM's epilogue applies it and writes bf16 once.
  Array pre = up(s, x);
  if (s.matmul_dtype() == DType::bf16 && !s.options().inference) pre = astype(pre, DType::bf16);
  return down(s, activate(act, pre));
}

}  // namespace kiln::nn
