// kiln — array operations. Each builds one primitive (or a few) on the graph;
// in eager mode it runs at once, in lazy mode and under tracing it records.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/array.h"

namespace kiln {

// ---- creation (always materialized) ----
Array zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Array ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Array full(const Shape& shape, double value, DType dtype = DType::f32,
           Device device = Device::cpu());
Array arange(int64_t start, int64_t stop, int64_t step = 1, DType dtype = DType::f32,
             Device device = Device::cpu());
Array arange(int64_t stop, DType dtype = DType::f32, Device device = Device::cpu());
Array zeros_like(const Array& a);
Array ones_like(const Array& a);

// ---- elementwise ----
Array neg(const Array& a);
Array exp(const Array& a);
Array log(const Array& a);
Array sqrt(const Array& a);
Array rsqrt(const Array& a);
Array tanh(const Array& a);
Array erf(const Array& a);
Array gelu(const Array& a);       // x·Φ(x), exact (erf) form
Array gelu_tanh(const Array& a);  // tanh approximation (gelu_new, gelu_pytorch_tanh)
Array relu(const Array& a);
Array abs(const Array& a);
Array square(const Array& a);
Array sin(const Array& a);
Array cos(const Array& a);
Array log1p(const Array& a);  // log(1 + x), accurate near 0
Array expm1(const Array& a);  // exp(x) - 1, accurate near 0
Array sign(const Array& a);   // -1, 0 or 1 (0 and NaN kept); zero gradient
Array floor(const Array& a);  // zero gradient
Array round(const Array& a);  // to the nearest integer, halves to even (jnp.round); zero gradient
Array add(const Array& a, const Array& b);
Array subtract(const Array& a, const Array& b);
Array multiply(const Array& a, const Array& b);
Array divide(const Array& a, const Array& b);
Array maximum(const Array& a, const Array& b);
Array minimum(const Array& a, const Array& b);
// a to the power b, elementwise (jnp.power on floats); d/db uses log(a), so
// it is NaN where a < 0 and 0 where a = 0.
Array power(const Array& a, const Array& b);
// x limited to [lo, hi] (jnp.clip): minimum(maximum(x, lo), hi), so at a
// bound the gradient is shared as maximum's and minimum's are.
Array clip(const Array& x, double lo, double hi);
Array equal(const Array& a, const Array& b);
Array not_equal(const Array& a, const Array& b);
Array less(const Array& a, const Array& b);
Array less_equal(const Array& a, const Array& b);
Array greater(const Array& a, const Array& b);
Array greater_equal(const Array& a, const Array& b);
Array where(const Array& cond, const Array& a, const Array& b);
// Elementwise logic (np.logical_*): operands of any dtype, nonzero being
// true; bool results, broadcast as the arithmetic ops are.
Array logical_not(const Array& a);
Array logical_and(const Array& a, const Array& b);
Array logical_or(const Array& a, const Array& b);
Array logical_xor(const Array& a, const Array& b);
Array astype(const Array& a, DType dtype);
Array stop_gradient(const Array& a);

// A rank-0 array of a's dtype holding v (for mixing arrays with numbers).
Array scalar_like(const Array& a, double v);
Array operator+(const Array& a, const Array& b);
// a + b where one operand is a temporary the caller gives up: in eager mode
// the sum is written into that operand's buffer when nothing can read its
// value any more (no other handle, no view of its buffer, no VJP that reads
// it), instead of into a new buffer; otherwise, and in lazy and traced code,
// exactly add(a, b). KILN_EAGER_INPLACE=0 turns the reuse off.
Array operator+(Array&& a, const Array& b);
Array operator+(const Array& a, Array&& b);
Array operator+(Array&& a, Array&& b);
Array operator-(const Array& a, const Array& b);
Array operator*(const Array& a, const Array& b);
Array operator/(const Array& a, const Array& b);
Array operator-(const Array& a);
Array operator+(const Array& a, double b);
Array operator-(const Array& a, double b);
Array operator*(const Array& a, double b);
Array operator/(const Array& a, double b);
Array operator+(double a, const Array& b);
Array operator-(double a, const Array& b);
Array operator*(double a, const Array& b);
Array operator/(double a, const Array& b);

// ---- reductions (axes may be negative; empty axes = all) ----
Array sum(const Array& a, std::vector<int> axes = {}, bool keepdims = false);
Array mean(const Array& a, std::vector<int> axes = {}, bool keepdims = false);
Array max(const Array& a, std::vector<int> axes = {}, bool keepdims = false);
Array min(const Array& a, std::vector<int> axes = {}, bool keepdims = false);
// Running sums along `axis` (jnp.cumsum; reverse: from the last element
// back); floats and integers, the dtype kept, sums in f32 for bf16.
Array cumsum(const Array& a, int axis, bool reverse = false);
Array argmax(const Array& a, int axis, bool keepdims = false);  // i32
// The indices (i32) that sort `a` along `axis` (jnp.argsort with
// stable=True): equal elements keep their order and NaN sorts after every
// number; descending: largest (and NaN) first, equal elements still in their
// order. Floats and integers.
Array argsort(const Array& a, int axis = -1, bool descending = false);
// `a` sorted along `axis` (jnp.sort; the order of argsort): the gradient goes
// back to the position each element came from.
Array sort(const Array& a, int axis = -1, bool descending = false);
// The k largest elements along the last axis, largest first, and their
// indices (i32) (lax.top_k: among equal elements the lower index first).
std::pair<Array, Array> top_k(const Array& a, int64_t k);
// a's elements at `indices` along `axis` (np.take_along_axis): indices are
// integers of a's rank, with a's extent (or 1, broadcast) on every other
// axis; negative ones count from the end. Differentiable in a.
Array take_along_axis(const Array& a, const Array& indices, int axis);
// Sums a broadcast result back down to `shape` (the reverse of broadcasting).
Array sum_to(const Array& a, const Shape& shape);

// ---- matmul: [..., M, K] @ [..., K, N]; batch dims equal, or one side rank 2 ----
// The precision of f32 matmuls, process-wide (like PyTorch's
// torch.backends.cuda.matmul.allow_tf32 or JAX's jax_default_matmul_precision):
// fp32 (the default) computes in full f32; tf32 lets a GPU compute the
// products from operands rounded to TF32 (10-bit mantissa) on its tensor
// cores, summed in f32. matmul() reads the setting when it builds the op;
// jit's signature includes it, so a jitted function called after the setting
// changed is traced again (as JAX's default precision does). The
// CPU has no TF32 and computes tf32 matmuls in full f32; bf16 and f64 matmuls
// are unaffected. Convolutions (conv1d, conv2d and their gradients) follow
// the same setting, as PyTorch's torch.backends.cudnn.allow_tf32 and JAX's
// default precision let them: cuDNN's tensor-op math in tf32, its FMA math
// in fp32.
enum class MatmulPrecision { fp32, tf32 };
void set_matmul_precision(MatmulPrecision p);
MatmulPrecision matmul_precision();

struct MatmulOptions {
  bool transpose_a = false;  // a is stored [..., K, M]
  bool transpose_b = false;  // b is stored [..., N, K]
  std::optional<DType> out;  // e.g. bf16 inputs with f32 output
  // This matmul's precision (f32 operands only); unset: matmul_precision().
  std::optional<MatmulPrecision> precision;
};
Array matmul(const Array& a, const Array& b, const MatmulOptions& opt = {});

// ---- layout ----
Array reshape(const Array& a, Shape shape);  // one dim may be -1
Array transpose(const Array& a, std::vector<int> perm);
Array transpose(const Array& a);  // reverses the axes
Array swapaxes(const Array& a, int a1, int a2);
Array broadcast_to(const Array& a, const Shape& shape);
Array concatenate(const std::vector<Array>& arrays, int axis);
// NumPy a[start:stop:step] per axis (missing trailing axes are taken whole).
Array slice(const Array& a, Shape start, Shape stop, Shape step = {});
// JAX's lax.dynamic_slice and lax.dynamic_update_slice: the start of the
// window on each axis read at run time from `starts`, an i32 or i64 array
// [ndim] (on x's device), so that a compiled function takes a new position
// without recompiling (a KV cache's write position). Each start is clamped
// to [0, dim - size] so that the window fits, as JAX does. dynamic_slice
// returns the window of `sizes`; dynamic_update_slice returns x with
// `update` (x's dtype, no larger on any axis) written over the window, in
// x's memory where x is given up (jit with a donated x). Differentiable in
// x and update.
Array dynamic_slice(const Array& x, const Array& starts, const Shape& sizes);
Array dynamic_update_slice(const Array& x, const Array& update, const Array& starts);
// NumPy's pad in "constant" mode (torch.nn.functional.pad's order aside):
// `widths` gives (before, after) for the last widths.size() axes; a negative
// width crops.
Array pad(const Array& a, const std::vector<std::pair<int64_t, int64_t>>& widths,
          double value = 0.0);
// jnp.take(a, indices, axis): out shape = a[:axis] + indices + a[axis+1:].
Array take(const Array& a, const Array& indices, int axis);
Array one_hot(const Array& labels, int64_t depth, DType dtype = DType::f32);

// ---- fused neural-network primitives ----
Array softmax(const Array& a, int axis = -1);
Array log_softmax(const Array& a, int axis = -1);
// LayerNorm over the last axis; gamma and beta have the last axis' size.
Array layer_norm(const Array& x, const Array& gamma, const Array& beta, double eps);
Array layer_norm(const Array& x, double eps);  // no affine
// Per-example softmax cross-entropy: logits [..., C], integer labels [...].
Array softmax_cross_entropy(const Array& logits, const Array& labels);
// Multi-head softmax attention, one fused kernel: qkv [B, T, 3, H, D] holds
// the queries, keys and values of H heads (the output of one linear layer
// with 3·H·D outputs, reshaped); returns [B, T, H, D] with, per batch and
// head, softmax(scale · Q Kᵀ) V. The T×T probabilities are never stored: the
// backward recomputes them.
Array attention(const Array& qkv, double scale);

// Scaled dot-product attention (PyTorch's F.scaled_dot_product_attention in
// flash attention's layout): q [B, T, H, D], k and v [B, S, H, D]; returns
// [B, T, H, D] with, per batch and head, softmax(scale · Q Kᵀ + bias) V over
// the keys each query may see. One fused kernel: the T×S probabilities are
// never stored (the backward recomputes them), and a causal mask's blocks
// are skipped, not computed and discarded. A query that sees no key (every
// key masked) gets zeros, and no gradient, as in flash attention.
struct AttentionOptions {
  std::optional<double> scale;  // unset: 1 / sqrt(D)
  // Query i sees keys j <= i + S - T: the usual causal mask when T = S, and
  // aligned to the last key otherwise, so that T new tokens attend to a KV
  // cache of S - T earlier ones and to themselves.
  bool causal = false;
  // Added to the scaled scores, broadcastable to [B, H, T, S] (-inf masks a
  // score): ALiBi, relative positions, arbitrary masks. Differentiable.
  std::optional<Array> bias;
  // bool [B, S], true where a key is real: false keys are masked (padding).
  std::optional<Array> key_padding_mask;
};
Array attention(const Array& q, const Array& k, const Array& v,
                const AttentionOptions& options = {});
// Whether `device`'s backend runs the fused attention on `dtype` inputs, giving
// `dtype` (the packed form above, or q, k and v without a bias): bf16 mixed
// precision hands it bf16 inputs only where it does.
bool fused_attention_runs_in(Device device, DType dtype);
bool sdpa_runs_in(Device device, DType dtype, bool causal);

// ---- convolution ----
// PyTorch's Conv1d/Conv2d (cross-correlation, without bias; a bias is
// added after): x [N, C, H, W] (channels_last: [N, H, W, C]) with a weight
// [O, C / groups, KH, KW] (PyTorch's layout in both cases) gives
// [N, O, HO, WO] ([N, HO, WO, O]), HO = (H + pad before + pad after −
// dilation·(KH − 1) − 1) / stride + 1. conv1d takes x [N, C, L] ([N, L, C])
// and w [O, C / groups, K]. Per spatial axis, or one value for every axis.
struct ConvOptions {
  std::vector<int64_t> stride;    // empty: 1
  std::vector<int64_t> dilation;  // empty: 1
  // Zero padding (before, after) per spatial axis; empty: none.
  std::vector<std::pair<int64_t, int64_t>> padding;
  // Padding such that the output has ceil(size / stride) positions, the odd
  // element after (JAX's "SAME"; PyTorch's padding="same" at stride 1, where
  // the output keeps the input's size); replaces `padding`.
  bool same = false;
  int64_t groups = 1;  // = C: depthwise
  bool channels_last = false;
};
Array conv2d(const Array& x, const Array& w, const ConvOptions& opt = {});
Array conv1d(const Array& x, const Array& w, const ConvOptions& opt = {});

// ---- normalization over channels ----
// PyTorch's BatchNorm1d/2d/3d on x [N, C, ...] (channels_last: [N, ..., C]):
// in training (or without running statistics) each channel is normalized by
// its batch mean and biased variance, and the running statistics (when given)
// move towards the batch's: (1 − momentum)·old + momentum·new, with the
// unbiased variance, as PyTorch updates them; in evaluation by the running
// statistics. gamma and beta (the affine weight and bias) may be empty.
struct BatchNormOptions {
  bool training = false;
  double momentum = 0.1;
  double eps = 1e-5;
  bool channels_last = false;
};
struct BatchNormResult {
  Array y;
  Array running_mean, running_var;  // after the update (training), else as given
};
BatchNormResult batch_norm(const Array& x, const Array& gamma, const Array& beta,
                           const Array& running_mean, const Array& running_var,
                           const BatchNormOptions& opt = {});
// PyTorch's GroupNorm on x [N, C, ...]: each sample's channels in `groups`
// groups normalized together (biased variance), then the per-channel affine
// gamma and beta (either may be empty).
Array group_norm(const Array& x, int64_t groups, const Array& gamma, const Array& beta,
                 double eps = 1e-5);

// ---- pooling ----
// PyTorch's MaxPool2d and AvgPool2d over x [N, C, H, W] (channels_last:
// [N, H, W, C]) with a window per spatial axis (or one for both). Padding
// is at most half the window; a max window's gradient goes to its first
// largest element.
struct PoolOptions {
  std::vector<int64_t> stride;                       // empty: the window
  std::vector<std::pair<int64_t, int64_t>> padding;  // (before, after) per axis; empty: none
  bool channels_last = false;
  bool count_include_pad = true;  // average: divide by the whole window
};
Array max_pool2d(const Array& x, const std::vector<int64_t>& window, const PoolOptions& opt = {});
Array avg_pool2d(const Array& x, const std::vector<int64_t>& window, const PoolOptions& opt = {});
// PyTorch's AdaptiveAvgPool2d((height, width)): output row i averages input
// rows floor(i·H/height) to ceil((i+1)·H/height), columns alike.
Array adaptive_avg_pool2d(const Array& x, int64_t height, int64_t width,
                          bool channels_last = false);

// ---- collectives: averaging across the ranks of a data-parallel run ----
// all_reduce_start queues the sum of `xs` (f32 or f64, one dtype, on one
// host device) across the ranks of the process group (kiln/distributed.h) as
// gradient bucket `bucket`, and returns a token (an i64 scalar) at once: the
// exchange runs while later ops compute. all_reduce_wait waits for it and
// returns arrays shaped as `xs` holding the mean over the ranks (the sum when
// mean is false). One process alone gets its own values back.
Array all_reduce_start(const std::vector<Array>& xs, int bucket);
std::vector<Array> all_reduce_wait(const Array& token, const std::vector<Array>& xs, int bucket,
                                   bool mean = true);

// ---- internal building blocks, public for the compiler and tests ----
Array gelu_grad(const Array& x);       // d gelu / dx
Array gelu_tanh_grad(const Array& x);  // d gelu_tanh / dx
// relu's backward from its output: g where y > 0, else 0 (NaN y too), broadcast.
Array relu_grad(const Array& g, const Array& y);
Array layer_norm_grad(const Array& x, const Array& gamma, const Array& dy, double eps);  // dx
Array softmax_cross_entropy_grad(const Array& logits, const Array& labels,
                                 const Array& dloss);                     // dlogits
Array attention_grad(const Array& qkv, const Array& dout, double scale);  // dqkv
// attention(q, k, v)'s gradients stacked along the token axis,
// [B, T + 2S, H, D] = dq, dk, dv; bias: f32 (f64) [B|1, H|1, T|1, S|1] or none.
Array attention_grad(const Array& q, const Array& k, const Array& v, const Array& dout,
                     const std::optional<Array>& bias, double scale, bool causal);
// LayerNorm's weight and bias gradients in one pass: [2, C] holding
// sum(dy * x̂) and sum(dy) over all rows (x̂ the normalized x).
Array layer_norm_param_grad(const Array& x, const Array& dy, double eps);
Array scatter_add(const Array& indices, const Array& updates, int axis, const Shape& shape);

// In place, as PyTorch's detach_(): a computed array forgets the graph that
// computed it (its primitive and inputs, which it kept alive), keeping its
// value; a pending one (traced or lazy, no value yet) is left as it is.
// Returns whether it dropped one.
bool drop_graph(const Array& a);

// Kernel time per primitive, collected when KILN_PROFILE=1: whether it is
// on, the table so far (one line per primitive, most time first; with
// KILN_PROFILE=shapes then the costliest primitive and operand shapes), and
// a fresh start (after warm-up steps).
bool kernel_profile_enabled();
std::string kernel_profile_report();
void kernel_profile_reset();

void set_num_threads(int n);
int num_threads();
// The library that runs f32 GEMMs on the CPU, e.g. "oneMKL 2026.2 (build
// 20260915)" or "oneDNN 2.6.3 (dnnl_sgemm)" (KILN_SGEMM=onemkl|onednn).
std::string cpu_gemm_library();
// Why that library: KILN_SGEMM, or measured faster on this machine (sgemm.h).
std::string cpu_gemm_library_reason();
// The vector ISA the f32 GEMMs run on this CPU: "AVX-512", "AVX2" (no
// AVX-512, or the library capped by ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS)
// or "SSE" (no AVX2 with FMA).
std::string cpu_gemm_isa();
// Whether bf16 matmuls run natively (oneDNN on a bf16 unit: AVX512-BF16 or
// AMX); elsewhere (AVX2-only CPUs, AVX-512 without BF16, capped libraries)
// kiln widens their bf16 operands to f32 and runs them at the f32 rate.
bool cpu_bf16_gemm_native();
// The unit bf16 GEMMs run on, as the library chose it for this CPU and its
// caps: "AMX" (tiles), "AVX512-BF16" (dot products), or, where they are
// widened to f32, the f32 GEMMs' ISA (cpu_gemm_isa()).
std::string cpu_bf16_gemm_unit();

}  // namespace kiln
