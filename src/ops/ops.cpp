// kiln ops: the user-facing operations and each primitive's shape/dtype rule.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>

#include "kiln/ops.h"
#include "kiln/random.h"
#include "ops/dispatch.h"
#include "ops/op_defs.h"
#include "ops/op_facts.h"
#include "ops/vjp.h"

namespace kiln {
namespace {

void require_float(const Array& a, const char* op) {
  if (!is_floating(a.dtype()) || a.dtype() == DType::f16)
    fail(op, std::string("expected a floating-point array (f32, f64, bf16), got ") +
                 name_of(a.dtype()) + " of shape " + str(a.shape()));
}

void require_integer(const Array& a, const char* op, const char* what) {
  if (!is_integral(a.dtype()))
    fail(op, std::string(what) + " must be integers (i32 or i64), got " + name_of(a.dtype()));
}

void require_valid(const Array& a, const char* op) {
  if (!a.valid()) fail(op, "use of an empty Array handle");
}

Array unary(Op op, const Array& a) {
  require_valid(a, op_name(op));
  if (!op_has(op, kIntegers)) require_float(a, op_name(op));
  return apply(Primitive(op), {a});
}

std::pair<Array, Array> promote_pair(const Array& a, const Array& b, const char* op) {
  require_valid(a, op);
  require_valid(b, op);
  DType dt = promote(a.dtype(), b.dtype());
  return {a.dtype() == dt ? a : astype(a, dt), b.dtype() == dt ? b : astype(b, dt)};
}

Array binary(Op op, const Array& a0, const Array& b0) {
  auto [a, b] = promote_pair(a0, b0, op_name(op));
  if (op_kind(op) == OpKind::Binary && a.dtype() == DType::bool_)
    fail(op_name(op), "arithmetic on bool arrays; cast them first");
  return apply(Primitive(op), {a, b});
}

std::vector<int> normalize_axes(std::vector<int> axes, size_t rank, const char* op) {
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (auto& x : axes) x = normalize_axis(x, rank, op);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    fail(op, "repeated axis in reduction");
  return axes;
}

// The reduced shape and the empty-axis check are the primitive's rule.
Array reduce(Op op, const Array& a, std::vector<int> axes, bool keepdims) {
  require_valid(a, op_name(op));
  axes = normalize_axes(std::move(axes), a.ndim(), op_name(op));
  return apply(Primitive(op, ReduceAttrs{axes, keepdims}), {a});
}

}  // namespace

// ---- creation: a Fill run at once on the array's device ----
namespace {
Array filled(const Shape& shape, DType dtype, Device device, double start, double step) {
  if (dtype == DType::f16) fail("full", "f16 arrays are not supported yet");
  Array a = Array::empty(shape, dtype, device);
  run_kernel_with(Primitive(Op::Fill, FillAttrs{start, step}), {}, *a.node());
  return a;
}
}  // namespace

Array full(const Shape& shape, double value, DType dtype, Device device) {
  return filled(shape, dtype, device, value, 0);
}
Array zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0, dtype, device);
}
Array ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1, dtype, device);
}
Array zeros_like(const Array& a) {
  return zeros(a.shape(), a.dtype(), a.device());
}
Array ones_like(const Array& a) {
  return ones(a.shape(), a.dtype(), a.device());
}

Array arange(int64_t start, int64_t stop, int64_t step, DType dtype, Device device) {
  if (step == 0) fail("arange", "step must not be 0");
  int64_t n = std::max<int64_t>(0, (stop - start + step - (step > 0 ? 1 : -1)) / step);
  return filled({n}, dtype, device, static_cast<double>(start), static_cast<double>(step));
}
Array arange(int64_t stop, DType dtype, Device device) {
  return arange(0, stop, 1, dtype, device);
}

Array Array::to(Device device) const {
  if (!valid()) fail("to", "use of an empty Array handle");
  if (node_->device == device) return *this;
  return apply(Primitive(Op::Copy, DeviceAttrs{device}), {*this});
}

Array Array::from_device_data(const void* data, const Shape& shape, DType dtype, Device device) {
  if (device.host_visible()) return from_data(data, shape, dtype, device);
  Array out = empty(shape, dtype, device);  // (checks the shape)
  // The other library's memory as a borrowed buffer of the same shape,
  // copied by the Copy kernel (a device-to-device copy on the device's
  // stream) at once, in any mode: the memory is read before this returns.
  std::shared_ptr<ArrayNode> in = view_of(*out.node());
  in->buffer = std::make_shared<Buffer>(const_cast<void*>(data), out.nbytes(), device);
  in->id = next_array_id();
  run_kernel_with(Primitive(Op::Copy, DeviceAttrs{device}), {Array(in)}, *out.node());
  synchronize(device);
  return out;
}

Array scalar_like(const Array& a, double v) {
  return full({}, v, a.dtype(), a.device());
}

// ---- elementwise ----
Array neg(const Array& a) {
  return unary(Op::Neg, a);
}
Array exp(const Array& a) {
  return unary(Op::Exp, a);
}
Array log(const Array& a) {
  return unary(Op::Log, a);
}
Array sqrt(const Array& a) {
  return unary(Op::Sqrt, a);
}
Array rsqrt(const Array& a) {
  return unary(Op::Rsqrt, a);
}
Array tanh(const Array& a) {
  return unary(Op::Tanh, a);
}
Array erf(const Array& a) {
  return unary(Op::Erf, a);
}
Array gelu(const Array& a) {
  return unary(Op::Gelu, a);
}
Array gelu_tanh(const Array& a) {
  return unary(Op::GeluTanh, a);
}
Array gelu_grad(const Array& a) {
  return unary(Op::GeluGrad, a);
}
Array gelu_tanh_grad(const Array& a) {
  return unary(Op::GeluTanhGrad, a);
}
Array relu(const Array& a) {
  return unary(Op::Relu, a);
}
Array abs(const Array& a) {
  return unary(Op::Abs, a);
}
Array square(const Array& a) {
  return multiply(a, a);
}
Array sin(const Array& a) {
  return unary(Op::Sin, a);
}
Array cos(const Array& a) {
  return unary(Op::Cos, a);
}
Array log1p(const Array& a) {
  return unary(Op::Log1p, a);
}
Array expm1(const Array& a) {
  return unary(Op::Expm1, a);
}
Array sign(const Array& a) {
  return unary(Op::Sign, a);
}
Array floor(const Array& a) {
  return unary(Op::Floor, a);
}
Array round(const Array& a) {
  return unary(Op::Round, a);
}

Array add(const Array& a, const Array& b) {
  return binary(Op::Add, a, b);
}
Array subtract(const Array& a, const Array& b) {
  return binary(Op::Sub, a, b);
}
Array multiply(const Array& a, const Array& b) {
  return binary(Op::Mul, a, b);
}
Array divide(const Array& a, const Array& b) {
  return binary(Op::Div, a, b);
}
Array maximum(const Array& a, const Array& b) {
  return binary(Op::Maximum, a, b);
}
Array relu_grad(const Array& g, const Array& y) {
  return binary(Op::ReluGrad, g, y);
}
Array power(const Array& a, const Array& b) {
  return binary(Op::Pow, a, b);
}
Array clip(const Array& x, double lo, double hi) {
  require_valid(x, "clip");
  if (!(lo <= hi))
    fail("clip", "lower bound " + std::to_string(lo) + " above upper bound " + std::to_string(hi));
  return minimum(maximum(x, scalar_like(x, lo)), scalar_like(x, hi));
}
Array minimum(const Array& a, const Array& b) {
  return binary(Op::Minimum, a, b);
}
Array equal(const Array& a, const Array& b) {
  return binary(Op::Equal, a, b);
}
Array not_equal(const Array& a, const Array& b) {
  return binary(Op::NotEqual, a, b);
}
Array less(const Array& a, const Array& b) {
  return binary(Op::Less, a, b);
}
Array less_equal(const Array& a, const Array& b) {
  return binary(Op::LessEqual, a, b);
}
Array greater(const Array& a, const Array& b) {
  return binary(Op::Greater, a, b);
}
Array greater_equal(const Array& a, const Array& b) {
  return binary(Op::GreaterEqual, a, b);
}

Array where(const Array& cond, const Array& a0, const Array& b0) {
  require_valid(cond, "where");
  if (cond.dtype() != DType::bool_)
    fail("where", std::string("condition must be bool, got ") + name_of(cond.dtype()));
  auto [a, b] = promote_pair(a0, b0, "where");
  return apply(Primitive(Op::Where), {cond, a, b});
}

namespace {
// a as bool: itself, or a != 0.
Array truth(const Array& a, const char* op) {
  require_valid(a, op);
  return a.dtype() == DType::bool_ ? a : not_equal(a, scalar_like(a, 0));
}
Array bool_scalar(const Array& like, bool v) {
  return full({}, v ? 1 : 0, DType::bool_, like.device());
}
}  // namespace

Array logical_not(const Array& a) {
  const Array t = truth(a, "logical_not");
  return where(t, bool_scalar(t, false), bool_scalar(t, true));
}
Array logical_and(const Array& a, const Array& b) {
  const Array x = truth(a, "logical_and"), y = truth(b, "logical_and");
  return where(x, y, bool_scalar(x, false));
}
Array logical_or(const Array& a, const Array& b) {
  const Array x = truth(a, "logical_or"), y = truth(b, "logical_or");
  return where(x, bool_scalar(x, true), y);
}
Array logical_xor(const Array& a, const Array& b) {
  const Array x = truth(a, "logical_xor"), y = truth(b, "logical_xor");
  return where(x, logical_not(y), y);
}

Array astype(const Array& a, DType dtype) {
  require_valid(a, "cast");
  if (dtype == DType::f16 || a.dtype() == DType::f16) fail("cast", "f16 is not supported yet");
  if (a.dtype() == dtype) return a;
  return apply(Primitive(Op::Cast, CastAttrs{dtype}), {a});
}

Array stop_gradient(const Array& a) {
  require_valid(a, "stop_gradient");
  return apply(Primitive(Op::StopGradient), {a});
}

Array operator+(const Array& a, const Array& b) {
  return add(a, b);
}

namespace {
// a + b offering operand `reuse` (given up by the caller) for the result.
Array add_reusing(Array a, Array b, int reuse) {
  require_valid(a, "add");
  require_valid(b, "add");
  const Array& r = reuse == 0 ? a : b;
  if (a.dtype() != b.dtype() || a.dtype() == DType::bool_ ||
      broadcast_shapes(a.shape(), b.shape(), "add") != r.shape())
    return add(a, b);
  std::vector<Array> ins;  // (an initializer list would keep a second handle)
  ins.reserve(2);
  ins.push_back(std::move(a));
  ins.push_back(std::move(b));
  return apply(Primitive(Op::Add), std::move(ins), reuse);
}
}  // namespace

Array operator+(Array&& a, const Array& b) {
  return add_reusing(std::move(a), b, 0);
}
Array operator+(const Array& a, Array&& b) {
  return add_reusing(a, std::move(b), 1);
}
Array operator+(Array&& a, Array&& b) {
  return add_reusing(std::move(a), std::move(b), 0);
}
Array operator-(const Array& a, const Array& b) {
  return subtract(a, b);
}
Array operator*(const Array& a, const Array& b) {
  return multiply(a, b);
}
Array operator/(const Array& a, const Array& b) {
  return divide(a, b);
}
Array operator-(const Array& a) {
  return neg(a);
}
Array operator+(const Array& a, double b) {
  return add(a, scalar_like(a, b));
}
Array operator-(const Array& a, double b) {
  return subtract(a, scalar_like(a, b));
}
Array operator*(const Array& a, double b) {
  return multiply(a, scalar_like(a, b));
}
Array operator/(const Array& a, double b) {
  return divide(a, scalar_like(a, b));
}
Array operator+(double a, const Array& b) {
  return add(scalar_like(b, a), b);
}
Array operator-(double a, const Array& b) {
  return subtract(scalar_like(b, a), b);
}
Array operator*(double a, const Array& b) {
  return multiply(scalar_like(b, a), b);
}
Array operator/(double a, const Array& b) {
  return divide(scalar_like(b, a), b);
}

// ---- reductions ----
Array sum(const Array& a, std::vector<int> axes, bool keepdims) {
  require_valid(a, "sum");
  Array x = a.dtype() == DType::bool_ ? astype(a, DType::i32) : a;
  return reduce(Op::Sum, x, std::move(axes), keepdims);
}

Array mean(const Array& a, std::vector<int> axes, bool keepdims) {
  require_float(a, "mean");
  auto ax = normalize_axes(axes, a.ndim(), "mean");
  int64_t count = 1;
  for (int x : ax) count *= a.shape()[x];
  if (count == 0) fail("mean", "mean over an empty axis of " + str(a.shape()));
  return sum(a, ax, keepdims) * (1.0 / static_cast<double>(count));
}

Array max(const Array& a, std::vector<int> axes, bool keepdims) {
  return reduce(Op::Max, a, std::move(axes), keepdims);
}

// max of the negated values, negated: NaN propagates, and the gradient goes
// where max's goes.
Array min(const Array& a, std::vector<int> axes, bool keepdims) {
  return neg(max(neg(a), std::move(axes), keepdims));
}

Array argmax(const Array& a, int axis, bool keepdims) {
  return reduce(Op::Argmax, a, {axis}, keepdims);
}

namespace {
// The axis (normalized) of a scan or sort of a, a float or integer array of
// rank 1 or more.
int along_one_axis(const Array& a, int axis, const char* op) {
  require_valid(a, op);
  if (a.dtype() == DType::bool_ || a.dtype() == DType::f16)
    fail(op, std::string("needs a float or integer array, got ") + name_of(a.dtype()));
  if (a.ndim() == 0) fail(op, "needs an array of rank 1 or more, got a scalar");
  return normalize_axis(axis, a.ndim(), op);
}
}  // namespace

Array cumsum(const Array& a, int axis, bool reverse) {
  const int ax = along_one_axis(a, axis, "cumsum");
  return apply(Primitive(Op::Cumsum, ScanAttrs{ax, reverse}), {a});
}

Array argsort(const Array& a, int axis, bool descending) {
  const int ax = along_one_axis(a, axis, "argsort");
  if (a.shape()[ax] > std::numeric_limits<int32_t>::max())
    fail("argsort",
         "axis " + std::to_string(ax) + " of " + str(a.shape()) + " is too long for i32 indices");
  return apply(Primitive(Op::Argsort, SortAttrs{ax, descending}), {a});
}

Array sort(const Array& a, int axis, bool descending) {
  return take_along_axis(a, argsort(a, axis, descending), axis);
}

std::pair<Array, Array> top_k(const Array& a, int64_t k) {
  require_valid(a, "top_k");
  if (a.ndim() == 0) fail("top_k", "needs an array of rank 1 or more, got a scalar");
  const int64_t n = a.shape().back();
  if (k < 0 || k > n)
    fail("top_k", "k must be in [0, " + std::to_string(n) + "] for the last axis of " +
                      str(a.shape()) + ", got " + std::to_string(k));
  Array idx = argsort(a, -1, true);
  if (k < n) {
    Shape stop = a.shape();
    stop.back() = k;
    idx = slice(idx, Shape(a.ndim(), 0), std::move(stop));
  }
  return {take_along_axis(a, idx, -1), idx};
}

Array sum_to(const Array& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  size_t lead = a.ndim() - shape.size();
  std::vector<int> axes;
  for (size_t i = 0; i < a.ndim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && a.shape()[i] != 1))
      axes.push_back(static_cast<int>(i));
  Array r = axes.empty() ? a : sum(a, axes, true);
  return reshape(r, shape);
}

// ---- matmul ----
Array matmul(const Array& a, const Array& b, const MatmulOptions& opt) {
  require_valid(a, "matmul");
  require_valid(b, "matmul");
  if (a.ndim() < 2 || b.ndim() < 2)
    fail("matmul", "operands must have rank >= 2, got " + str(a.shape()) + " @ " + str(b.shape()));
  if (a.dtype() != b.dtype())
    fail("matmul", std::string("operand dtypes differ: ") + name_of(a.dtype()) + " " +
                       str(a.shape()) + " @ " + name_of(b.dtype()) + " " + str(b.shape()));
  require_float(a, "matmul");
  DType out = opt.out.value_or(a.dtype());
  if (out != a.dtype() && !(a.dtype() == DType::bf16 && out == DType::f32))
    fail("matmul", std::string("output dtype ") + name_of(out) + " is not supported for " +
                       name_of(a.dtype()) + " inputs");
  matmul_dims(a.shape(), b.shape(), opt.transpose_a, opt.transpose_b, "matmul");
  const bool tf32 = a.dtype() == DType::f32 &&
                    opt.precision.value_or(matmul_precision()) == MatmulPrecision::tf32;
  return apply(Primitive(Op::Matmul, MatmulAttrs{opt.transpose_a, opt.transpose_b, out, tf32}),
               {a, b});
}

namespace {
std::atomic<MatmulPrecision> g_matmul_precision{MatmulPrecision::fp32};
}  // namespace

void set_matmul_precision(MatmulPrecision p) {
  if (p != MatmulPrecision::fp32 && p != MatmulPrecision::tf32)
    fail("set_matmul_precision", "unknown precision " + std::to_string(static_cast<int>(p)));
  g_matmul_precision.store(p, std::memory_order_relaxed);
}
MatmulPrecision matmul_precision() {
  return g_matmul_precision.load(std::memory_order_relaxed);
}

// ---- layout ----
Array reshape(const Array& a, Shape shape) {
  require_valid(a, "reshape");
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) fail("reshape", "more than one -1 in " + str(shape));
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      fail("reshape", "negative dimension in " + str(shape));
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || a.size() % known != 0)
      fail("reshape", "cannot reshape " + str(a.shape()) + " into " + str(shape));
    shape[infer] = a.size() / known;
  }
  if (numel(shape) != a.size())
    fail("reshape", "cannot reshape " + str(a.shape()) + " into " + str(shape));
  if (shape == a.shape()) return a;
  return apply(Primitive(Op::Reshape, ShapeAttrs{std::move(shape)}), {a});
}

Array transpose(const Array& a, std::vector<int> perm) {
  require_valid(a, "transpose");
  if (perm.size() != a.ndim())
    fail("transpose",
         "permutation of " + std::to_string(perm.size()) + " axes for shape " + str(a.shape()));
  std::vector<bool> seen(perm.size());
  for (auto& p : perm) {
    p = normalize_axis(p, a.ndim(), "transpose");
    if (seen[p]) fail("transpose", "axis " + std::to_string(p) + " repeated in permutation");
    seen[p] = true;
  }
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int>(i);
  if (identity) return a;
  return apply(Primitive(Op::Transpose, PermAttrs{std::move(perm)}), {a});
}

Array transpose(const Array& a) {
  std::vector<int> perm(a.ndim());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(perm.size() - 1 - i);
  return transpose(a, perm);
}

Array swapaxes(const Array& a, int a1, int a2) {
  std::vector<int> perm(a.ndim());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[normalize_axis(a1, a.ndim(), "swapaxes")],
            perm[normalize_axis(a2, a.ndim(), "swapaxes")]);
  return transpose(a, perm);
}

Array broadcast_to(const Array& a, const Shape& shape) {
  require_valid(a, "broadcast_to");
  if (shape.size() < a.ndim())
    fail("broadcast_to", "cannot broadcast " + str(a.shape()) + " to " + str(shape));
  size_t lead = shape.size() - a.ndim();
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.shape()[i] != 1 && a.shape()[i] != shape[lead + i])
      fail("broadcast_to", "cannot broadcast " + str(a.shape()) + " to " + str(shape));
  if (shape == a.shape()) return a;
  return apply(Primitive(Op::BroadcastTo, ShapeAttrs{shape}), {a});
}

Array concatenate(const std::vector<Array>& arrays, int axis) {
  if (arrays.empty()) fail("concatenate", "no arrays given");
  for (auto& x : arrays) require_valid(x, "concatenate");
  const Array& first = arrays[0];
  int ax = normalize_axis(axis, first.ndim(), "concatenate");
  DType dt = first.dtype();
  for (auto& x : arrays) dt = promote(dt, x.dtype());
  std::vector<Array> ins;
  for (auto& x : arrays) {
    if (x.ndim() != first.ndim())
      fail("concatenate", "ranks differ: " + str(first.shape()) + " and " + str(x.shape()));
    for (size_t i = 0; i < x.ndim(); ++i)
      if (static_cast<int>(i) != ax && x.shape()[i] != first.shape()[i])
        fail("concatenate", "shapes " + str(first.shape()) + " and " + str(x.shape()) +
                                " differ outside axis " + std::to_string(ax));
    ins.push_back(astype(x, dt));
  }
  if (ins.size() == 1) return ins[0];
  return apply(Primitive(Op::Concatenate, AxisAttrs{ax}), std::move(ins));
}

Array slice(const Array& a, Shape start, Shape stop, Shape step) {
  require_valid(a, "slice");
  size_t r = a.ndim();
  if (start.size() > r || stop.size() > r || step.size() > r)
    fail("slice", "more indices than the " + std::to_string(r) + " axes of " + str(a.shape()));
  if (start.size() != stop.size())
    fail("slice", "start has " + std::to_string(start.size()) + " entries, stop " +
                      std::to_string(stop.size()));
  start.resize(r, 0);
  for (size_t i = stop.size(); i < r; ++i) stop.push_back(a.shape()[i]);
  step.resize(r, 1);
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t d = a.shape()[i];
    if (step[i] <= 0) fail("slice", "step must be positive, got " + std::to_string(step[i]));
    auto clamp = [d](int64_t x) { return std::clamp<int64_t>(x < 0 ? x + d : x, 0, d); };
    start[i] = clamp(start[i]);
    stop[i] = std::max(clamp(stop[i]), start[i]);
    out[i] = (stop[i] - start[i] + step[i] - 1) / step[i];
  }
  if (out == a.shape()) return a;
  return apply(Primitive(Op::Slice, SliceAttrs{start, stop, step, a.shape()}), {a});
}

Array dynamic_slice(const Array& x, const Array& starts, const Shape& sizes) {
  require_valid(x, "dynamic_slice");
  require_valid(starts, "dynamic_slice");
  return apply(Primitive(Op::DynamicSlice, ShapeAttrs{sizes}), {x, starts});
}

Array dynamic_update_slice(const Array& x, const Array& update, const Array& starts) {
  require_valid(x, "dynamic_update_slice");
  require_valid(update, "dynamic_update_slice");
  require_valid(starts, "dynamic_update_slice");
  return apply(Primitive(Op::DynamicUpdateSlice), {x, update, starts});
}

Array pad(const Array& a, const std::vector<std::pair<int64_t, int64_t>>& widths, double value) {
  require_valid(a, "pad");
  const size_t r = a.ndim();
  if (widths.size() > r)
    fail("pad", std::to_string(widths.size()) + " (before, after) pairs for the " +
                    std::to_string(r) + " axes of " + str(a.shape()));
  // Negative widths crop first; the rest is zeros around the values (a
  // SliceGrad), the value added outside them.
  Shape start(r, 0), stop = a.shape(), inner_start(r, 0), full(r);
  bool crop = false, grow = false;
  for (size_t i = 0; i < r; ++i) {
    const size_t w = i + widths.size() - r;  // the pairs cover the last axes
    const auto [lo, hi] = i + widths.size() >= r ? widths[w] : std::pair<int64_t, int64_t>{0, 0};
    if (lo < 0) start[i] = -lo, crop = true;
    if (hi < 0) stop[i] = a.shape()[i] + hi, crop = true;
    if (stop[i] < start[i])
      fail("pad", "cropping " + std::to_string(-std::min<int64_t>(lo, 0)) + " and " +
                      std::to_string(-std::min<int64_t>(hi, 0)) + " from axis " +
                      std::to_string(i) + " of " + str(a.shape()) + " leaves less than nothing");
    inner_start[i] = std::max<int64_t>(lo, 0);
    full[i] = stop[i] - start[i] + inner_start[i] + std::max<int64_t>(hi, 0);
    grow = grow || lo > 0 || hi > 0;
  }
  const Array x = crop ? slice(a, start, stop) : a;
  if (!grow) return x;
  Shape inner_stop(r);
  for (size_t i = 0; i < r; ++i) inner_stop[i] = inner_start[i] + x.shape()[i];
  const SliceAttrs at{inner_start, inner_stop, Shape(r, 1), full};
  const Array y = slice_grad(x, at);
  if (value == 0) return y;
  return y + (scalar_like(y, value) - slice_grad(ones_like(x), at) * value);
}

Array slice_grad(const Array& g, const SliceAttrs& attrs) {
  return apply(Primitive(Op::SliceGrad, attrs), {g});
}

Array take(const Array& a, const Array& indices, int axis) {
  require_valid(a, "take");
  require_valid(indices, "take");
  require_integer(indices, "take", "indices");
  int ax = normalize_axis(axis, a.ndim(), "take");
  return apply(Primitive(Op::Take, AxisAttrs{ax}), {a, indices});
}

// Gathers from a flattened: the flat position of each output element is its
// index along the axis (wrapped and range-checked by a take from an iota)
// times the axis' stride, plus its coordinate times the stride on every
// other axis.
Array take_along_axis(const Array& a, const Array& indices, int axis) {
  const char* op = "take_along_axis";
  require_valid(a, op);
  require_valid(indices, op);
  require_integer(indices, op, "indices");
  if (indices.ndim() != a.ndim() || a.ndim() == 0)
    fail(op, "indices of shape " + str(indices.shape()) + " for an array of shape " +
                 str(a.shape()) + ": expected the same rank, 1 or more");
  const int ax = normalize_axis(axis, a.ndim(), op);
  Shape out = a.shape();
  out[ax] = indices.shape()[ax];
  for (int d = 0; d < static_cast<int>(a.ndim()); ++d)
    if (d != ax && indices.shape()[d] != a.shape()[d] && indices.shape()[d] != 1)
      fail(op, "indices of shape " + str(indices.shape()) + " for an array of shape " +
                   str(a.shape()) + ": axis " + std::to_string(d) + " has " +
                   std::to_string(indices.shape()[d]) + ", expected " +
                   std::to_string(a.shape()[d]) + " or 1");
  const DType it = a.size() > std::numeric_limits<int32_t>::max() ? DType::i64 : DType::i32;
  const Device dev = a.device();
  if (numel(out) == 0) return take(reshape(a, {a.size()}), full(out, 0, it, dev), 0);
  std::vector<int64_t> stride(a.ndim(), 1);
  for (int d = static_cast<int>(a.ndim()) - 2; d >= 0; --d)
    stride[d] = stride[d + 1] * a.shape()[d + 1];
  Array flat = take(arange(a.shape()[ax], it, dev), indices, 0);
  if (stride[ax] != 1) flat = flat * static_cast<double>(stride[ax]);
  for (int d = 0; d < static_cast<int>(a.ndim()); ++d) {
    if (d == ax || out[d] == 1) continue;
    Shape s(a.ndim(), 1);
    s[d] = out[d];
    flat = flat + reshape(arange(0, out[d] * stride[d], stride[d], it, dev), std::move(s));
  }
  return take(reshape(a, {a.size()}), flat, 0);
}

Array scatter_add(const Array& indices, const Array& updates, int axis, const Shape& shape) {
  require_integer(indices, "scatter_add", "indices");
  return apply(Primitive(Op::ScatterAdd, ScatterAttrs{axis, shape}), {indices, updates});
}

Array one_hot(const Array& labels, int64_t depth, DType dtype) {
  require_valid(labels, "one_hot");
  require_integer(labels, "one_hot", "labels");
  if (depth <= 0) fail("one_hot", "depth must be positive, got " + std::to_string(depth));
  return apply(Primitive(Op::OneHot, OneHotAttrs{depth, dtype}), {labels});
}

// ---- collectives ----
Array all_reduce_start(const std::vector<Array>& xs, int bucket) {
  if (xs.empty()) fail("all_reduce_start", "bucket " + std::to_string(bucket) + " is empty");
  for (const Array& x : xs) {
    require_valid(x, "all_reduce_start");
    if (x.dtype() != xs[0].dtype() || (x.dtype() != DType::f32 && x.dtype() != DType::f64))
      fail("all_reduce_start", std::string("a bucket holds f32 or f64 arrays of one dtype, got ") +
                                   name_of(xs[0].dtype()) + " and " + name_of(x.dtype()));
    if (x.device() != xs[0].device())
      fail("all_reduce_start", "a bucket's arrays are on one device, got " +
                                   xs[0].device().str() + " and " + x.device().str());
  }
  return apply(Primitive(Op::AllReduceStart, CollectiveAttrs{bucket, 0, false}), xs);
}

std::vector<Array> all_reduce_wait(const Array& token, const std::vector<Array>& xs, int bucket,
                                   bool mean) {
  require_valid(token, "all_reduce_wait");
  if (token.dtype() != DType::i64 || token.size() != 1)
    fail("all_reduce_wait", "the token is all_reduce_start's i64 scalar, got " +
                                std::string(name_of(token.dtype())) + " " + str(token.shape()));
  std::vector<Array> out;
  int64_t offset = 0;
  for (const Array& x : xs) {
    out.push_back(make_array(Primitive(Op::AllReduceWait, CollectiveAttrs{bucket, offset, mean}),
                             {token}, x.shape(), x.dtype()));
    offset += x.size();
  }
  return out;
}

// ---- fused ----
Array softmax(const Array& a, int axis) {
  require_float(a, "softmax");
  int ax = normalize_axis(axis, a.ndim(), "softmax");
  return apply(Primitive(Op::Softmax, AxisAttrs{ax}), {a});
}

Array log_softmax(const Array& a, int axis) {
  require_float(a, "log_softmax");
  int ax = normalize_axis(axis, a.ndim(), "log_softmax");
  return apply(Primitive(Op::LogSoftmax, AxisAttrs{ax}), {a});
}

Array layer_norm(const Array& x, const Array& gamma, const Array& beta, double eps) {
  require_float(x, "layer_norm");
  if (x.ndim() == 0) fail("layer_norm", "input must have rank >= 1");
  Shape c = {x.shape().back()};
  if (gamma.shape() != c || beta.shape() != c)
    fail("layer_norm", "weight " + str(gamma.shape()) + " and bias " + str(beta.shape()) +
                           " must both be " + str(c) + " for input " + str(x.shape()));
  return apply(Primitive(Op::LayerNorm, NormAttrs{eps}),
               {x, astype(gamma, x.dtype()), astype(beta, x.dtype())});
}

Array layer_norm(const Array& x, double eps) {
  require_float(x, "layer_norm");
  if (x.ndim() == 0) fail("layer_norm", "input must have rank >= 1");
  return apply(Primitive(Op::LayerNorm, NormAttrs{eps}), {x});
}

Array layer_norm_grad(const Array& x, const Array& gamma, const Array& dy, double eps) {
  std::vector<Array> ins = {x};
  if (gamma.valid()) ins.push_back(gamma);
  ins.push_back(dy);
  return apply(Primitive(Op::LayerNormGrad, NormAttrs{eps}), std::move(ins));
}

Array layer_norm_param_grad(const Array& x, const Array& dy, double eps) {
  return apply(Primitive(Op::LayerNormParamGrad, NormAttrs{eps}), {x, dy});
}

Array softmax_cross_entropy(const Array& logits, const Array& labels) {
  require_float(logits, "softmax_cross_entropy");
  require_valid(labels, "softmax_cross_entropy");
  require_integer(labels, "softmax_cross_entropy", "labels");
  Shape expect(logits.shape().begin(), logits.shape().end() - (logits.ndim() ? 1 : 0));
  if (logits.ndim() == 0 || labels.shape() != expect)
    fail("softmax_cross_entropy", "labels " + str(labels.shape()) + " do not match logits " +
                                      str(logits.shape()) + " (expected labels " + str(expect) +
                                      ")");
  return apply(Primitive(Op::SoftmaxCrossEntropy), {logits, labels});
}

Array attention(const Array& qkv, double scale) {
  require_float(qkv, "attention");
  const Shape& s = qkv.shape();
  if (s.size() != 5 || s[2] != 3)
    fail("attention", "qkv must be [batch, tokens, 3, heads, head_dim], got " + str(s));
  if (!std::isfinite(scale)) fail("attention", "scale must be finite");
  return apply(Primitive(Op::Attention, AttentionAttrs{scale}), {qkv});
}

Array attention(const Array& q, const Array& k, const Array& v, const AttentionOptions& o) {
  const char* op = "attention";
  for (const Array* a : {&q, &k, &v}) require_float(*a, op);
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    fail(op, std::string("q, k and v must have one dtype, got ") + name_of(q.dtype()) + ", " +
                 name_of(k.dtype()) + " and " + name_of(v.dtype()));
  const Shape &qs = q.shape(), &ks = k.shape();
  if (qs.size() != 4) fail(op, "q must be [batch, tokens, heads, head_dim], got " + str(qs));
  if (ks.size() != 4 || ks[0] != qs[0] || ks[2] != qs[2] || ks[3] != qs[3])
    fail(op, "k must be [batch, keys, heads, head_dim] with q's batch, heads and head_dim " +
                 str(qs) + ", got " + str(ks));
  if (v.shape() != ks) fail(op, "v must have k's shape " + str(ks) + ", got " + str(v.shape()));
  const double scale = o.scale     ? *o.scale
                       : qs[3] > 0 ? 1.0 / std::sqrt(static_cast<double>(qs[3]))
                                   : 1.0;
  if (!std::isfinite(scale)) fail(op, "scale must be finite, got " + std::to_string(scale));
  const DType bias_type = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Shape full{qs[0], qs[2], qs[1], ks[1]};  // [B, H, T, S]
  std::optional<Array> bias;
  if (o.bias) {
    require_float(*o.bias, op);
    const Shape& bs = o.bias->shape();
    Shape b4(4 - std::min<size_t>(4, bs.size()), 1);
    b4.insert(b4.end(), bs.begin(), bs.end());
    bool fits = bs.size() <= 4;
    for (size_t i = 0; fits && i < 4; ++i) fits = b4[i] == 1 || b4[i] == full[i];
    if (!fits)
      fail(op,
           "bias " + str(bs) + " does not broadcast to [batch, heads, tokens, keys] " + str(full));
    bias = astype(reshape(*o.bias, b4), bias_type);
  }
  if (o.key_padding_mask) {
    const Array& m = *o.key_padding_mask;
    if (m.dtype() != DType::bool_ || m.shape() != Shape{qs[0], ks[1]})
      fail(op, "key_padding_mask must be bool [batch, keys] " + str(Shape{qs[0], ks[1]}) +
                   ", got " + std::string(name_of(m.dtype())) + " " + str(m.shape()));
    const Array masked =
        where(reshape(m, {qs[0], 1, 1, ks[1]}), zeros({}, bias_type, q.device()),
              kiln::full({}, -std::numeric_limits<double>::infinity(), bias_type, q.device()));
    bias = bias ? *bias + masked : masked;
  }
  std::vector<Array> in{q, k, v};
  if (bias) in.push_back(*bias);
  return apply(Primitive(Op::Sdpa, SdpaAttrs{scale, o.causal, bias.has_value()}), in);
}

Array attention_grad(const Array& q, const Array& k, const Array& v, const Array& dout,
                     const std::optional<Array>& bias, double scale, bool causal) {
  std::vector<Array> in{q, k, v, dout};
  if (bias) in.push_back(*bias);
  return apply(Primitive(Op::SdpaGrad, SdpaAttrs{scale, causal, bias.has_value()}), in);
}

Array attention_grad(const Array& qkv, const Array& dout, double scale) {
  return apply(Primitive(Op::AttentionGrad, AttentionAttrs{scale}), {qkv, dout});
}

Array softmax_cross_entropy_grad(const Array& logits, const Array& labels, const Array& dloss) {
  return apply(Primitive(Op::SoftmaxCrossEntropyGrad), {logits, labels, dloss});
}

}  // namespace kiln
