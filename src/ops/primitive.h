// kiln ops: the primitive set (internal: the public API is the ops of
// kiln/ops.h). Each primitive is an Op (an enum with traits) plus
// typed attributes. Its shape/dtype rule lives with its constructor in ops.cpp,
// its operand count and VJP rule in its family's definitions (src/ops/defs/),
// its facts in src/ops/op_facts.h, and each backend has one kernel table
// indexed by Op.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/shape.h"

namespace kiln {

// The primitives and their kinds. Every other fact about an op (fusable, a
// view, safe in place, what its VJP reads, its scalar function) is a column
// of the fact table in src/ops/op_facts.h.
// clang-format off
#define KILN_OPS(X)                                                                      \
  /* unary elementwise */                                                                \
  X(Neg, Unary) X(Exp, Unary) X(Log, Unary) X(Sqrt, Unary) X(Rsqrt, Unary) X(Tanh, Unary) \
  X(Erf, Unary) X(Gelu, Unary) X(GeluTanh, Unary) X(Relu, Unary) X(Abs, Unary)           \
  X(GeluGrad, Unary) X(GeluTanhGrad, Unary) X(Sin, Unary) X(Cos, Unary) X(Log1p, Unary)  \
  X(Expm1, Unary) X(Sign, Unary) X(Floor, Unary) X(Round, Unary)                         \
  /* binary elementwise with NumPy broadcasting */                                       \
  X(Add, Binary) X(Sub, Binary) X(Mul, Binary) X(Div, Binary) X(Maximum, Binary)          \
  X(Minimum, Binary) X(Pow, Binary) X(ReluGrad, Binary) X(Equal, Compare)                 \
  X(NotEqual, Compare)                                                                   \
  X(Less, Compare) X(LessEqual, Compare) X(Greater, Compare) X(GreaterEqual, Compare)     \
  X(Where, Select) X(Cast, Convert) X(StopGradient, Identity)                            \
  /* reductions over any axes */                                                         \
  X(Sum, Reduce) X(Max, Reduce) X(Argmax, Reduce) X(Cumsum, Scan) X(Argsort, Sort)      \
  X(Matmul, Contraction)                                                                 \
  /* layout */                                                                           \
  X(Reshape, Layout) X(Transpose, Layout) X(BroadcastTo, Layout) X(Concatenate, Layout)   \
  X(Slice, Layout) X(SliceGrad, Layout) X(Take, Layout) X(ScatterAdd, Layout)            \
  X(OneHot, Layout) X(DynamicSlice, Layout) X(DynamicUpdateSlice, Layout)                \
  /* fused neural-network primitives */                                                  \
  X(Softmax, Fused) X(LogSoftmax, Fused) X(LayerNorm, Fused) X(LayerNormGrad, Fused)      \
  X(SoftmaxCrossEntropy, Fused) X(SoftmaxCrossEntropyGrad, Fused)                        \
  X(Attention, Fused) X(AttentionGrad, Fused) X(LayerNormParamGrad, Fused)              \
  X(Sdpa, Fused) X(SdpaGrad, Fused)                                                      \
  X(Conv, Fused) X(ConvGradInput, Fused) X(ConvGradWeight, Fused) X(Pool, Fused)         \
  X(PoolGrad, Fused)                                                                     \
  /* made by the compiler's fusion pass */                                               \
  X(FusedElementwise, Fused) X(MatmulEpilogue, Fused) X(FusedReduce, Fused)              \
  X(Random, Source)                                                                      \
  /* moving values between devices, and filling memory on any device */                  \
  X(Copy, Transfer) X(Fill, Source)                                                      \
  /* averaging across the ranks of a data-parallel run (kiln/distributed.h) */           \
  X(AllReduceStart, Collective) X(AllReduceWait, Collective)
// clang-format on

enum class OpKind : uint8_t {
  Unary,
  Binary,
  Compare,
  Select,
  Convert,
  Identity,
  Reduce,
  Scan,
  Sort,
  Contraction,
  Layout,
  Fused,
  Source,
  Transfer,
  Collective
};

enum class Op : uint8_t {
#define KILN_ENUM(name, kind) name,
  KILN_OPS(KILN_ENUM)
#undef KILN_ENUM
      Count
};
inline constexpr int kOpCount = static_cast<int>(Op::Count);

const char* op_name(Op op);
inline constexpr OpKind kOpKinds[] = {
#define KILN_KIND(name, kind) OpKind::kind,
    KILN_OPS(KILN_KIND)
#undef KILN_KIND
};
constexpr OpKind op_kind(Op op) {
  return kOpKinds[static_cast<int>(op)];
}

// ---- typed attributes ----
// Each attribute type names its members once, with KILN_FIELDS(m1, m2, ...):
// that gives it fields() (a tuple of references to the members, in order)
// and field_names ("m1, m2, ..."), from which Primitive's hash and printing
// are generic (ops/primitive.cpp), as its defaulted == is. fields()
// decomposes *this with a structured binding, so a member added to the type
// but not to its KILN_FIELDS fails to compile: no member can be left out of
// the jit cache's key.
#define KILN_FIELDS(...)                                   \
  static constexpr const char* field_names = #__VA_ARGS__; \
  auto fields() const {                                    \
    const auto& [__VA_ARGS__] = *this;                     \
    return std::tie(__VA_ARGS__);                          \
  }

struct NoAttrs {
  auto fields() const { return std::tuple<>(); }
  static constexpr const char* field_names = "";
  bool operator==(const NoAttrs&) const = default;
};
struct CastAttrs {
  DType to;
  KILN_FIELDS(to)
  bool operator==(const CastAttrs&) const = default;
};
struct ReduceAttrs {
  std::vector<int> axes;  // sorted, unique, non-negative
  bool keepdims;
  KILN_FIELDS(axes, keepdims)
  bool operator==(const ReduceAttrs&) const = default;
};
struct ScanAttrs {  // Cumsum along `axis`, from its last element back when `reverse`
  int axis;
  bool reverse = false;
  KILN_FIELDS(axis, reverse)
  bool operator==(const ScanAttrs&) const = default;
};
// Argsort along `axis`: stable (equal elements keep their order), NaN after
// every number; `descending`: largest first, equal elements still in order.
struct SortAttrs {
  int axis;
  bool descending = false;
  KILN_FIELDS(axis, descending)
  bool operator==(const SortAttrs&) const = default;
};
struct MatmulAttrs {
  bool transpose_a;
  bool transpose_b;
  DType out;  // accumulation is always at least f32
  // f32 operands only: the products may be computed from operands rounded to
  // TF32 (10-bit mantissa), summed in f32 (set by matmul() from
  // matmul_precision(), see ops.h). CUDA runs such a GEMM on TF32 tensor
  // cores; the CPU backends have no TF32 and ignore it (their f32 GEMM is at
  // least as precise).
  bool tf32 = false;
  KILN_FIELDS(transpose_a, transpose_b, out, tf32)
  bool operator==(const MatmulAttrs&) const = default;
};
struct ShapeAttrs {  // Reshape, BroadcastTo, DynamicSlice (its sizes)
  Shape shape;
  KILN_FIELDS(shape)
  bool operator==(const ShapeAttrs&) const = default;
};
struct PermAttrs {  // Transpose
  std::vector<int> perm;
  KILN_FIELDS(perm)
  bool operator==(const PermAttrs&) const = default;
};
struct AxisAttrs {  // Concatenate, Softmax, LogSoftmax, Take
  int axis;
  KILN_FIELDS(axis)
  bool operator==(const AxisAttrs&) const = default;
};
struct SliceAttrs {  // Slice; SliceGrad scatters back into `full`
  Shape start, stop, step;
  Shape full;
  KILN_FIELDS(start, stop, step, full)
  bool operator==(const SliceAttrs&) const = default;
};
struct ScatterAttrs {  // ScatterAdd(indices, updates) into zeros(shape) along axis
  int axis;
  Shape shape;
  KILN_FIELDS(axis, shape)
  bool operator==(const ScatterAttrs&) const = default;
};
struct OneHotAttrs {
  int64_t depth;
  DType dtype;
  KILN_FIELDS(depth, dtype)
  bool operator==(const OneHotAttrs&) const = default;
};
struct NormAttrs {  // LayerNorm over the last axis
  double eps;
  // LayerNormGrad only: its last input is added to the result (the residual
  // stream's gradient; made by the compiler's fuse_layer_norm_residual).
  bool residual = false;
  KILN_FIELDS(eps, residual)
  bool operator==(const NormAttrs&) const = default;
};
// Softmax attention over a packed [B, T, 3, H, D] query/key/value array
// (see ops.h: attention); `scale` multiplies the scores before the softmax.
struct AttentionAttrs {
  double scale;
  KILN_FIELDS(scale)
  bool operator==(const AttentionAttrs&) const = default;
};
// Scaled dot-product attention over separate q [B, T, H, D] and k, v
// [B, S, H, D] (see ops.h: attention(q, k, v, options)): `scale` multiplies
// the scores; `causal` lets query i see keys j <= i + S - T (aligned to the
// bottom right, as a KV cache needs); `bias` says an additive f32 (f64 for
// f64 inputs) [B|1, H|1, T|1, S|1] operand follows v (SdpaGrad: follows
// dout). SdpaGrad(q, k, v, dout[, bias]) -> [B, T + 2S, H, D]: dq, dk and dv
// stacked along the token axis.
struct SdpaAttrs {
  double scale;
  bool causal = false;
  bool bias = false;
  KILN_FIELDS(scale, causal, bias)
  bool operator==(const SdpaAttrs&) const = default;
};
// A 2-d convolution (PyTorch's Conv2d, without bias) of x [N, C, H, W]
// (channels_last: [N, H, W, C]) with w [O, C / groups, KH, KW] into
// y [N, O, HO, WO] ([N, HO, WO, O]): per spatial axis the stride, the
// dilation of the window and the zero padding before and after;
// HO = (H + pad_lo + pad_hi - dilation (KH - 1) - 1) / stride + 1.
// ConvGradInput(dy, w) -> dx of shape `input`; ConvGradWeight(x, dy) -> dw of
// shape `weight` (the shapes the forward's operands had; empty for Conv).
// tf32: f32 operands may be rounded to TF32 on a GPU's tensor cores (the
// matmul precision when the op was built; the CPU computes in full f32).
struct ConvAttrs {
  Shape stride, dilation, pad_lo, pad_hi;  // two entries each: height, width
  int64_t groups = 1;
  bool channels_last = false;
  Shape input, weight;
  bool tf32 = false;
  KILN_FIELDS(stride, dilation, pad_lo, pad_hi, groups, channels_last, input, weight, tf32)
  bool operator==(const ConvAttrs&) const = default;
};
// Max or average pooling over windows of x [N, C, H, W] (channels_last:
// [N, H, W, C]): per spatial axis the window, the stride and the padding
// before and after (max: never chosen; average: zeros, counted by
// count_include_pad as PyTorch's AvgPool2d does, or not). PoolGrad(x, dy)
// -> dx: a max window's gradient goes to its first largest element.
enum class PoolKind : uint8_t { Max, Avg };
struct PoolAttrs {
  PoolKind kind = PoolKind::Max;
  Shape window, stride, pad_lo, pad_hi;  // two entries each: height, width
  bool channels_last = false;
  bool count_include_pad = true;
  KILN_FIELDS(kind, window, stride, pad_lo, pad_hi, channels_last, count_include_pad)
  bool operator==(const PoolAttrs&) const = default;
};
enum class RandomKind : uint8_t { Uniform, Normal, TruncatedNormal, Bernoulli, Gamma, Randint };
struct RandomAttrs {
  uint32_t key[2];
  RandomKind kind;
  // uniform [a,b); truncated normal bounds [a,b]; bernoulli p = a; gamma
  // shape a (scale 1); randint integers in [a,b)
  double a, b;
  Shape shape;
  DType dtype;
  // When set, the key is fold_in(key, fold_data). An optional i32[2] input
  // holds the key's bits instead of `key` (a key passed to a compiled function).
  bool fold = false;
  uint32_t fold_data = 0;
  KILN_FIELDS(key, kind, a, b, shape, dtype, fold, fold_data)
  bool operator==(const RandomAttrs&) const = default;
};

// A chain of f32 elementwise ops run as one kernel. Registers 0..inputs-1
// hold the inputs; instruction i writes register inputs+i; the last register
// is the output. Each input is read whole (its shape is the output's), as a
// scalar (one element), or as a row repeated over the leading axes (its
// elements are the output's trailing elements).
struct FusedInstr {
  Op op;
  int a, b;  // registers; b = -1 for unary ops
  // The result is rounded to bf16 (and kept as f32): the op computed on bf16
  // values in the unfused graph, which rounds each result as it stores it.
  bool round_bf16 = false;
  KILN_FIELDS(op, a, b, round_bf16)
  bool operator==(const FusedInstr&) const = default;
};
enum class FusedRead : uint8_t { Whole, Scalar, Row };
struct FusedAttrs {
  std::vector<FusedRead> reads;  // one per input
  std::vector<FusedInstr> program;
  KILN_FIELDS(reads, program)
  bool operator==(const FusedAttrs&) const = default;
};

// A matmul whose result runs through elementwise steps before it is stored
// (a GEMM epilogue). Inputs: a, b, then the operands of the binary steps.
// Each step applies `op` to the running value (always the left operand) and,
// for a binary op, input 2 + operand read as `read` (Whole: the output's
// shape, Row: one value per output column, Scalar: one value).
struct EpilogueStep {
  Op op;
  int operand;  // -1 for a unary op
  FusedRead read;
  KILN_FIELDS(op, operand, read)
  bool operator==(const EpilogueStep&) const = default;
};
struct EpilogueAttrs {
  MatmulAttrs mm;
  std::vector<EpilogueStep> steps;
  KILN_FIELDS(mm, steps)
  bool operator==(const EpilogueAttrs&) const = default;
};

// A sum over a contiguous group of axes of an f32 elementwise program's
// result (a reduction with its prologue fused): `body` runs over `shape`
// exactly as FusedElementwise would, and its values are summed over `axes`
// without being stored. An optional `epilogue` (a program with at least one
// instruction) then runs over the sums, in the output's shape, before they
// are stored: its register `epilogue_sum` holds the sums (no node input),
// its other input registers are the node's inputs after the body's, in order.
struct FusedReduceAttrs {
  FusedAttrs body;
  Shape shape;
  ReduceAttrs reduce;
  FusedAttrs epilogue = {};
  int epilogue_sum = -1;
  KILN_FIELDS(body, shape, reduce, epilogue, epilogue_sum)
  bool operator==(const FusedReduceAttrs&) const = default;
};

// Copy: the input's values on device `to` (kernels of the destination's
// backend run it; host-visible pairs copy memory).
struct DeviceAttrs {
  Device to;
  KILN_FIELDS(to)
  bool operator==(const DeviceAttrs&) const = default;
};
// Fill: element i of the output is start + i * step (full: step 0; arange),
// converted to the output's dtype. Run at once by the creation functions, on
// the array's device, never recorded.
struct FillAttrs {
  double start = 0, step = 0;
  KILN_FIELDS(start, step)
  bool operator==(const FillAttrs&) const = default;
};

// AllReduceStart(x...) -> token: starts summing the inputs (one dtype, f32
// or f64), packed one after another into bucket `bucket`, across the ranks of
// the process group; its output is a token (an i64 scalar) that orders the
// waits after it. AllReduceWait(token) -> y: waits for that bucket's sum and
// returns its elements [offset, offset + size(y)), divided by the number of
// ranks when `mean`. A bucket is one in-flight exchange at a time: the next
// start of the same bucket waits for the previous one to finish.
struct CollectiveAttrs {
  int bucket = 0;
  int64_t offset = 0;  // AllReduceWait
  bool mean = true;    // AllReduceWait
  KILN_FIELDS(bucket, offset, mean)
  bool operator==(const CollectiveAttrs&) const = default;
};

using Attrs =
    std::variant<NoAttrs, CastAttrs, ReduceAttrs, ScanAttrs, SortAttrs, MatmulAttrs, ShapeAttrs,
                 PermAttrs, AxisAttrs, SliceAttrs, ScatterAttrs, OneHotAttrs, NormAttrs,
                 RandomAttrs, FusedAttrs, EpilogueAttrs, FusedReduceAttrs, AttentionAttrs,
                 SdpaAttrs, DeviceAttrs, FillAttrs, CollectiveAttrs, ConvAttrs, PoolAttrs>;

class Primitive {
 public:
  Primitive(Op op, Attrs attrs = NoAttrs{}) : op_(op), attrs_(std::move(attrs)) {}
  Op op() const { return op_; }
  const char* name() const { return op_name(op_); }
  template <typename T>
  const T& attrs() const {
    return std::get<T>(attrs_);
  }
  const Attrs& attrs_variant() const { return attrs_; }
  // Structural equality and hash (used by CSE and the executable cache).
  bool operator==(const Primitive& o) const { return op_ == o.op_ && attrs_ == o.attrs_; }
  size_t hash() const;
  std::string str() const;  // "matmul{ta=0,tb=1}"

 private:
  Op op_;
  Attrs attrs_;
};

}  // namespace kiln
