// kiln — the layers the model families are built of: Linear, Conv2d,
// LayerNorm, BatchNorm, Embedding, MultiHeadAttention, MLP, Dropout and
// DropPath, in the manner of Flax's linen modules without their magic.
//
// A layer is a small value: its sizes, its initialization and the dotted
// name of its parameters in the model's tree (transformers' names:
// "vit.encoder.layer.0.intermediate.dense" holds ".weight" and ".bias").
// It declares its parameters (and state) and computes from them through a
// Scope, which holds the trees, the options of the pass and the counter of
// random sites. A model declares its layers in its parameters' order, inits
// them in one call, and applies them in its forward.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn.h"

namespace kiln::nn {

// How a model runs.
struct ModelOptions {
  Layout layout = Layout::NCHW;  // of pixel_values
  // Training: dropout and stochastic depth draw from `key`, BatchNorm
  // normalizes by the batch's statistics and updates its running ones.
  bool train = false;
  // With train: dropout and drop path on (false: off, a deterministic pass
  // that still updates BatchNorm's statistics, as `kiln grad` computes).
  bool drop = true;
  // The draws of dropout and drop path: an i32[2] key (random::key_array),
  // folded in per site, so that eager, lazy and jit draw the same masks and
  // a compiled step takes it as an argument. Unset: random::Key(0).
  Array key;
  DType matmul_dtype = DType::f32;  // f32, or bf16 mixed precision
  bool fused_attention = true;      // attention models: one fused primitive
  bool inference = false;           // no backward pass follows
};

// How a parameter starts (each family's _init_weights in transformers).
struct Init {
  enum class Kind { Zeros, Ones, Constant, Normal, TruncatedNormal, Uniform };
  Kind kind = Kind::Zeros;
  double value = 0;  // Constant: the value; (Truncated)Normal: the std; Uniform: the bound

  static Init zeros() { return {Kind::Zeros, 0}; }
  static Init ones() { return {Kind::Ones, 0}; }
  static Init constant(double v) { return {Kind::Constant, v}; }
  // normal_(0, std).
  static Init normal(double std) { return {Kind::Normal, std}; }
  // trunc_normal_(std=std): normal(0, std) cut at ±2 (absolute, as torch's bounds).
  static Init truncated_normal(double std) { return {Kind::TruncatedNormal, std}; }
  // uniform_(-bound, bound).
  static Init uniform(double bound) { return {Kind::Uniform, bound}; }
  // kaiming_normal_(mode="fan_out", nonlinearity="relu"): normal(0, √(2 / fan_out)).
  static Init kaiming_normal_fan_out(int64_t fan_out);
  // torch.nn.Linear's and Conv's default: uniform(±1/√fan_in) (the bias's
  // bound; kaiming_uniform(a=√5) gives the weight the same one).
  static Init torch_default(int64_t fan_in);

  Array draw(const random::Key& key, const Shape& shape, Device device) const;
};

// One parameter or state entry a layer declares: its name in the tree, its
// shape and how it starts (state: its dtype too).
struct ParamDecl {
  std::string name;
  Shape shape;
  Init init;
  DType dtype = DType::f32;
};
using Decls = std::vector<ParamDecl>;

// The names and shapes of declarations, in order.
std::vector<std::pair<std::string, Shape>> shapes_of(const Decls& decls);
// Draws every declaration: entry i from random::fold_in(key, i) (the same
// numbers on every device).
Params init_params(const Decls& decls, const random::Key& key, Device device = Device::cpu());
// The declared state at its start (no random draws).
Params init_state(const Decls& decls, Device device = Device::cpu());

// "prefix.leaf", or "leaf" for an empty prefix (a layer on its own).
std::string join_name(const std::string& prefix, const std::string& leaf);

// One forward pass: the parameters and state it reads, the state it writes,
// its options, and the counter of random sites (each Dropout or DropPath
// takes the next site whether it is active or not, so a site names a place
// in the model; its mask comes from the key folded with the site).
class Scope {
 public:
  // `who` names the model in errors ("vit", "resnet", "nn.Linear").
  Scope(const Params& params, const Params& state, ModelOptions opt, std::string who);
  const ModelOptions& options() const { return opt_; }
  bool train() const { return opt_.train; }
  // Dropout and drop path are on.
  bool dropping() const { return opt_.train && opt_.drop; }
  DType matmul_dtype() const { return opt_.matmul_dtype; }
  const std::string& who() const { return who_; }

  // An entry of the parameters or of the state; a missing one is an error
  // naming it.
  const Array& param(const std::string& name) const;
  const Array& state(const std::string& name) const;
  // Sets an entry of the state this pass returns.
  void update(const std::string& name, Array value);
  // The state after the pass: the one given, with the updates.
  const Params& new_state() const { return new_state_; }
  Params take_state() { return std::move(new_state_); }

  uint32_t next_site() { return site_++; }
  // A keep mask of `shape` with probability `keep` for random site `site`,
  // on `device`.
  Array keep_mask(uint32_t site, const Shape& shape, double keep, Device device);

 private:
  const Params& params_;
  const Params& state_;
  Params new_state_;
  ModelOptions opt_;
  std::string who_;
  uint32_t site_ = 0;
};

// a @ b (MatmulOptions as given) with both operands rounded to `dtype` and
// an f32 result (bf16 mixed precision), or a plain f32 matmul.
Array mixed_matmul(const Array& a, const Array& b, MatmulOptions opt, DType dtype);

// y = x · Wᵀ + b for x [..., in], W [out, in] (torch.nn.Linear; "name.weight",
// "name.bias"), in the scope's matmul precision.
struct Linear {
  std::string name;
  int64_t in = 0, out = 0;
  bool bias = true;
  Init weight_init = Init::normal(0.02);
  Init bias_init = Init::zeros();
  void declare(Decls& d) const;
  Array operator()(Scope& s, const Array& x) const;
};

// A 2-D convolution (torch.nn.Conv2d; weight [out, in / groups, kh, kw]).
// Inputs and outputs channels first (NCHW) or last (NHWC) as asked. With
// `patch_matmul` (a ViT's patch embedding: stride = kernel, no padding,
// dilation or groups) it is one matmul over the flattened patches, in the
// scope's matmul precision; otherwise kiln's conv2d (oneDNN's
// convolutions on the cpu: 0.7% faster on ConvNeXt-T's 4x4 and 2x2 patch
// convolutions), on bf16 operands in bf16 mixed precision, the result f32.
struct Conv2d {
  std::string name;
  int64_t in = 0, out = 0;
  Size2d kernel = 1, stride = 1, dilation = 1;
  // Zero padding (before, after) per spatial axis; empty: none.
  std::vector<std::pair<int64_t, int64_t>> padding;
  bool same = false;  // padding "same" (see ConvOptions::same)
  int64_t groups = 1;
  bool bias = true;
  Init weight_init = Init::normal(0.02);
  Init bias_init = Init::zeros();
  bool patch_matmul = false;
  // Mixed precision (a bf16 matmul_dtype): the result kept in bf16, as
  // PyTorch's autocast keeps a convolution's, rather than widened to f32
  // (for a BatchNorm that reads bf16; no bias).
  bool bf16_result = false;
  void declare(Decls& d) const;
  Array operator()(Scope& s, const Array& x, Layout in_layout, Layout out_layout) const;
  Array operator()(Scope& s, const Array& x, Layout layout) const {
    return (*this)(s, x, layout, layout);
  }
  // A square window padded by `p` on every side.
  static std::vector<std::pair<int64_t, int64_t>> pad(int64_t p) { return {{p, p}, {p, p}}; }
};

// LayerNorm over the last axis (channels last), or over axis 1 of an
// [N, C, ...] input (transformers' ConvNext "channels_first" data format).
struct LayerNorm {
  std::string name;
  int64_t dim = 0;
  double eps = 1e-5;
  bool channels_first = false;
  void declare(Decls& d) const;
  Array operator()(Scope& s, const Array& x) const;
};

// BatchNorm2d (torch's): in training, the batch's statistics normalize and
// update "running_mean", "running_var" (unbiased, by momentum) and
// "num_batches_tracked" in the scope's state; in evaluation the running
// statistics normalize.
// A bf16 input is normalized in f32 (its statistics too) and the result
// rounded back to bf16, as PyTorch's mixed BatchNorm computes.
struct BatchNorm {
  std::string name;
  int64_t dim = 0;
  double eps = 1e-5, momentum = 0.1;
  void declare(Decls& d) const;        // weight (ones), bias (zeros)
  void declare_state(Decls& d) const;  // running statistics
  Array operator()(Scope& s, const Array& x, Layout layout) const;
};

// A table of `num` vectors of `dim` ("name.weight" [num, dim]) read at
// integer ids of any shape: [...] -> [..., dim].
struct Embedding {
  std::string name;
  int64_t num = 0, dim = 0;
  Init init = Init::normal(0.02);
  void declare(Decls& d) const;
  Array operator()(Scope& s, const Array& ids) const;
};

// Inverted dropout (torch.nn.Dropout): in training with drop on, each
// element is kept with probability 1 - p and scaled by 1 / (1 - p); p = 1
// gives zeros. Takes a random site on every call.
struct Dropout {
  double p = 0;
  Array operator()(Scope& s, const Array& x) const;
};

// Stochastic depth (timm's and transformers' drop_path): each example of
// the batch (axis 0) keeps its residual branch with probability 1 - p,
// scaled by 1 / (1 - p). Takes a random site on every call.
struct DropPath {
  double p = 0;
  Array operator()(Scope& s, const Array& x) const;
};

// Self-attention with `heads` heads of head_dim (heads·head_dim may differ
// from dim: pruned heads): query, key and value Linears of dim ->
// heads·head_dim, softmax(QKᵀ/√head_dim)·V, and the output Linear back to
// dim. x [B, T, dim] -> [B, T, dim]. With the scope's fused_attention, q, k
// and v come from one GEMM against the three weights concatenated and
// kiln::attention (bf16 q, k, v in bf16 mixed precision where the backend
// has that kernel); otherwise as transformers' eager attention, whose
// probabilities take `dropout` (which always takes the unfused path while
// dropping).
struct MultiHeadAttention {
  std::string query, key, value, output;  // the Linears' names
  int64_t dim = 0, heads = 1, head_dim = 0;
  bool qkv_bias = true;
  double dropout = 0;
  Init weight_init = Init::normal(0.02);
  void declare(Decls& d) const;  // query, key, value, then output
  Array operator()(Scope& s, const Array& x) const;
};

// The feed-forward block: up (dim -> hidden), the activation, down
// (hidden -> dim). In bf16 mixed precision training, up's output is rounded
// to bf16 before the activation (the backward keeps it), as autocast does.
struct MLP {
  Linear up, down;
  Activation act = Activation::Gelu;
  void declare(Decls& d) const;
  Array operator()(Scope& s, const Array& x) const;
};

}  // namespace kiln::nn
