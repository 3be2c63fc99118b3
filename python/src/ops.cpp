// kiln's Python module: the ops (creation, elementwise, reductions, matmul,
// layout, the fused neural-network primitives, convolutions and pooling).
#include "common.h"

namespace kiln_python {

// ---- Python numbers as operands ---------------------------------------------

// The array a Python operand stands for beside `like`: an Array as it is, a
// Python number as a scalar of like's dtype (a float beside an integer or
// bool array: float32; an int beside a bool array: int32), as JAX's weak
// types make it; anything else (numpy) through asarray.
Array operand(const Array& like, nb::handle x) {
  if (nb::isinstance<Array>(x)) return nb::cast<Array>(x);
  DType dt = like.dtype();
  double v;
  if (nb::isinstance<nb::bool_>(x)) {
    v = nb::cast<bool>(x) ? 1 : 0;
  } else if (nb::isinstance<nb::int_>(x)) {
    v = static_cast<double>(nb::cast<int64_t>(x));
    if (dt == DType::bool_) dt = DType::i32;
  } else if (nb::isinstance<nb::float_>(x)) {
    v = nb::cast<double>(x);
    if (!kiln::is_floating(dt)) dt = DType::f32;
  } else {
    return from_ndarray(nb::cast<nb::ndarray<nb::ro>>(x), like.device(), std::nullopt);
  }
  return kiln::full({}, v, dt, like.device());
}

// Whether a Python object can be an operand beside an array: an array, a
// number, or something with the buffer or array protocol (numpy arrays).
bool is_operand(nb::handle x) {
  return nb::isinstance<Array>(x) || nb::isinstance<nb::bool_>(x) || nb::isinstance<nb::int_>(x) ||
         nb::isinstance<nb::float_>(x) || nb::hasattr(x, "__array_interface__") ||
         nb::hasattr(x, "__dlpack__");
}

// An operator: NotImplemented for other operands (so that `a == None` is
// False, as Python's fallback makes it), else f(a, b) without the GIL.

std::vector<int> axes_of(nb::handle axis) {
  if (axis.is_none()) return {};
  if (nb::isinstance<nb::int_>(axis)) return {nb::cast<int>(axis)};
  return nb::cast<std::vector<int>>(axis);
}

void bind_ops(nb::module_& m) {
  // ---- creation ----
  m.def("_from_ndarray", &from_ndarray, "x"_a, "device"_a = nb::none(), "bits_of"_a = nb::none(),
        "A new array holding a copy of x (numpy or DLPack), in x's dtype.");
  m.def(
      "_copy",
      [](const Array& a) {
        nb::gil_scoped_release release;
        a.eval();
        return Array::from_device_data(a.raw(), a.shape(), a.dtype(), a.device());
      },
      "a"_a,
      "A new array holding a copy of a's values, on a's device (a DLPack copy=True export).");
  m.def(
      "_stream",
      [](const Device& d) { return reinterpret_cast<uintptr_t>(kiln::device_stream(d)); }, "d"_a,
      "The stream (as an integer) that kiln's work on a CUDA device queues on: DLPack's "
      "`stream` argument to a producer; 0 on host devices.");
  m.def("_exported", &is_exported, "a"_a, "Whether a numpy or DLPack view of a's memory is alive.");
  m.def("zeros", &kiln::zeros, "shape"_a, "dtype"_a = DType::f32, "device"_a = Device::cpu(),
        NoGil(), kiln_doc("zeros"));
  m.def("ones", &kiln::ones, "shape"_a, "dtype"_a = DType::f32, "device"_a = Device::cpu(), NoGil(),
        kiln_doc("ones"));
  m.def("full", &kiln::full, "shape"_a, "value"_a, "dtype"_a = DType::f32,
        "device"_a = Device::cpu(), NoGil(), kiln_doc("full"));
  m.def("arange", nb::overload_cast<int64_t, int64_t, int64_t, DType, Device>(&kiln::arange),
        "start"_a, "stop"_a, "step"_a = 1, "dtype"_a = DType::f32, "device"_a = Device::cpu(),
        NoGil(), kiln_doc("arange"));

  // ---- elementwise ----
#define KILN_UNARY(name) m.def(#name, &kiln::name, "x"_a, NoGil(), kiln_doc(#name))
  KILN_UNARY(neg);
  KILN_UNARY(exp);
  KILN_UNARY(log);
  KILN_UNARY(sqrt);
  KILN_UNARY(rsqrt);
  KILN_UNARY(tanh);
  KILN_UNARY(erf);
  KILN_UNARY(gelu);
  KILN_UNARY(gelu_tanh);
  KILN_UNARY(relu);
  KILN_UNARY(abs);
  KILN_UNARY(square);
  KILN_UNARY(sin);
  KILN_UNARY(cos);
  KILN_UNARY(log1p);
  KILN_UNARY(expm1);
  KILN_UNARY(sign);
  KILN_UNARY(floor);
  KILN_UNARY(round);
  KILN_UNARY(stop_gradient);
#undef KILN_UNARY
#define KILN_BINARY(name)                                                                      \
  m.def(#name, binary([](const Array& a, const Array& b) { return kiln::name(a, b); }), "a"_a, \
        "b"_a, kiln_doc(#name))
  KILN_BINARY(add);
  KILN_BINARY(subtract);
  KILN_BINARY(multiply);
  KILN_BINARY(divide);
  KILN_BINARY(power);
  KILN_BINARY(maximum);
  KILN_BINARY(minimum);
  KILN_BINARY(equal);
  KILN_BINARY(not_equal);
  KILN_BINARY(less);
  KILN_BINARY(less_equal);
  KILN_BINARY(greater);
  KILN_BINARY(greater_equal);
  KILN_BINARY(logical_and);
  KILN_BINARY(logical_or);
  KILN_BINARY(logical_xor);
#undef KILN_BINARY
  m.def("logical_not", &kiln::logical_not, "x"_a, NoGil(), kiln_doc("logical_not"));
  m.def(
      "where",
      [](const Array& c, nb::handle a, nb::handle b) {
        Array x = nb::isinstance<Array>(a)   ? nb::cast<Array>(a)
                  : nb::isinstance<Array>(b) ? operand(nb::cast<Array>(b), a)
                                             : operand(kiln::zeros({}, DType::f32, c.device()), a);
        Array y = operand(x, b);
        nb::gil_scoped_release release;
        return kiln::where(c, x, y);
      },
      "condition"_a, "x"_a, "y"_a, kiln_doc("where"));
  m.def("astype", &kiln::astype, "x"_a, "dtype"_a, NoGil(), kiln_doc("astype"));
  m.def("clip", &kiln::clip, "x"_a, "lo"_a, "hi"_a, NoGil(), kiln_doc("clip"));
  m.def("cumsum", &kiln::cumsum, "x"_a, "axis"_a, "reverse"_a = false, NoGil(), kiln_doc("cumsum"));
}

// A reduction over `axis`: None (all axes), an int or a sequence of ints.
template <Array (*Reduce)(const Array&, std::vector<int>, bool)>
void def_reduction(nb::module_& m, const char* name) {
  m.def(
      name,
      [](const Array& a, nb::handle axis, bool keepdims) {
        auto ax = axes_of(axis);
        nb::gil_scoped_release release;
        return Reduce(a, ax, keepdims);
      },
      "x"_a, "axis"_a = nb::none(), "keepdims"_a = false, kiln_doc(name));
}

// The bindings of reductions, matmul, layout and the fused primitives.
void bind_reductions_layout(nb::module_& m) {
  // ---- reductions ----
  def_reduction<kiln::sum>(m, "sum");
  def_reduction<kiln::mean>(m, "mean");
  def_reduction<kiln::max>(m, "max");
  m.def("argmax", &kiln::argmax, "x"_a, "axis"_a, "keepdims"_a = false, NoGil(),
        kiln_doc("argmax"));
  m.def("sum_to", &kiln::sum_to, "x"_a, "shape"_a, NoGil(), kiln_doc("sum_to"));
  m.def("argsort", &kiln::argsort, "x"_a, "axis"_a = -1, "descending"_a = false, NoGil(),
        kiln_doc("argsort"));
  m.def("sort", &kiln::sort, "x"_a, "axis"_a = -1, "descending"_a = false, NoGil(),
        kiln_doc("sort"));
  m.def("top_k", &kiln::top_k, "x"_a, "k"_a, NoGil(), kiln_doc("top_k"));
  m.def("take_along_axis", &kiln::take_along_axis, "x"_a, "indices"_a, "axis"_a, NoGil(),
        kiln_doc("take_along_axis"));

  // ---- matmul ----
  m.def(
      "matmul",
      [](const Array& a, const Array& b, bool ta, bool tb, std::optional<DType> out) {
        kiln::MatmulOptions o;
        o.transpose_a = ta;
        o.transpose_b = tb;
        o.out = out;
        return kiln::matmul(a, b, o);
      },
      "a"_a, "b"_a, "transpose_a"_a = false, "transpose_b"_a = false, "out_dtype"_a = nb::none(),
      NoGil(), kiln_doc("matmul"));
  m.def(
      "set_matmul_precision",
      [](const std::string& p) {
        if (p == "fp32" || p == "highest" || p == "float32")
          kiln::set_matmul_precision(kiln::MatmulPrecision::fp32);
        else if (p == "tf32" || p == "high" || p == "tensorfloat32")
          kiln::set_matmul_precision(kiln::MatmulPrecision::tf32);
        else
          kiln::fail("set_matmul_precision",
                     "precision '" + p + "': expected fp32 (highest) or tf32 (high)");
      },
      "precision"_a);
  m.def(
      "matmul_precision",
      [] { return kiln::matmul_precision() == kiln::MatmulPrecision::fp32 ? "fp32" : "tf32"; },
      kiln_doc("matmul_precision"));

  // ---- layout ----
  m.def("reshape", &kiln::reshape, "x"_a, "shape"_a, NoGil(), kiln_doc("reshape"));
  m.def("transpose", nb::overload_cast<const Array&, std::vector<int>>(&kiln::transpose), "x"_a,
        "axes"_a, NoGil(), kiln_doc("transpose"));
  m.def("swapaxes", &kiln::swapaxes, "x"_a, "axis1"_a, "axis2"_a, NoGil(), kiln_doc("swapaxes"));
  m.def("broadcast_to", &kiln::broadcast_to, "x"_a, "shape"_a, NoGil(), kiln_doc("broadcast_to"));
  m.def("concatenate", &kiln::concatenate, "arrays"_a, "axis"_a = 0, NoGil(),
        kiln_doc("concatenate"));
  m.def("slice", &kiln::slice, "x"_a, "start"_a, "stop"_a, "step"_a = Shape{}, NoGil(),
        kiln_doc("slice"));
  m.def("take", &kiln::take, "x"_a, "indices"_a, "axis"_a, NoGil(), kiln_doc("take"));
  m.def("dynamic_slice", &kiln::dynamic_slice, "x"_a, "starts"_a, "sizes"_a, NoGil(),
        kiln_doc("dynamic_slice"));
  m.def("dynamic_update_slice", &kiln::dynamic_update_slice, "x"_a, "update"_a, "starts"_a, NoGil(),
        kiln_doc("dynamic_slice"));
  m.def("one_hot", &kiln::one_hot, "labels"_a, "depth"_a, "dtype"_a = DType::f32, NoGil(),
        kiln_doc("one_hot"));

  // ---- fused neural-network primitives ----
  m.def("softmax", &kiln::softmax, "x"_a, "axis"_a = -1, NoGil(), kiln_doc("softmax"));
  m.def("log_softmax", &kiln::log_softmax, "x"_a, "axis"_a = -1, NoGil(), kiln_doc("log_softmax"));
  m.def(
      "layer_norm",
      [](const Array& x, std::optional<Array> w, std::optional<Array> b, double eps) {
        if (w.has_value() != b.has_value())
          kiln::fail("layer_norm", "give both weight and bias, or neither");
        return w ? kiln::layer_norm(x, *w, *b, eps) : kiln::layer_norm(x, eps);
      },
      "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5, NoGil());
  m.def("softmax_cross_entropy", &kiln::softmax_cross_entropy, "logits"_a, "labels"_a, NoGil(),
        kiln_doc("softmax_cross_entropy"));
  m.def("attention", static_cast<Array (*)(const Array&, double)>(&kiln::attention), "qkv"_a,
        "scale"_a, NoGil(), kiln_doc("attention"));
  m.def(
      "attention",
      [](const Array& q, const Array& k, const Array& v, std::optional<double> scale, bool causal,
         std::optional<Array> bias, std::optional<Array> key_padding_mask) {
        return kiln::attention(q, k, v, {scale, causal, bias, key_padding_mask});
      },
      "q"_a, "k"_a, "v"_a, nb::kw_only(), "scale"_a = nb::none(), "causal"_a = false,
      "bias"_a = nb::none(), "key_padding_mask"_a = nb::none(), NoGil(),
      "Scaled dot-product attention (PyTorch's scaled_dot_product_attention) of q [B, T, H, D] "
      "over k and v [B, S, H, D]: causal (query i sees keys j <= i + S - T, aligned to the last "
      "key), an additive bias broadcast to [B, H, T, S], a bool [B, S] key_padding_mask (True: "
      "a real key); scale defaults to 1/sqrt(D). Rows that see no key are zeros. One primitive "
      "whose backward recomputes the probabilities.");

  // ---- convolution, pooling, normalization over channels (kiln/__init__.py
  // takes PyTorch's forms of the arguments and passes them here normalized) ----
  using Pads = std::vector<std::pair<int64_t, int64_t>>;
  m.def(
      "_conv",
      [](const Array& x, const Array& w, std::vector<int64_t> stride, Pads padding, bool same,
         std::vector<int64_t> dilation, int64_t groups, bool channels_last) {
        const kiln::ConvOptions o{stride, dilation, padding, same, groups, channels_last};
        return x.ndim() == 3 ? kiln::conv1d(x, w, o) : kiln::conv2d(x, w, o);
      },
      "x"_a, "weight"_a, "stride"_a, "padding"_a, "same"_a, "dilation"_a, "groups"_a,
      "channels_last"_a, NoGil());
  m.def(
      "_pool",
      [](const Array& x, bool max, std::vector<int64_t> window, std::vector<int64_t> stride,
         Pads padding, bool channels_last, bool count_include_pad) {
        const kiln::PoolOptions o{stride, padding, channels_last, count_include_pad};
        return max ? kiln::max_pool2d(x, window, o) : kiln::avg_pool2d(x, window, o);
      },
      "x"_a, "max"_a, "window"_a, "stride"_a, "padding"_a, "channels_last"_a, "count_include_pad"_a,
      NoGil());
  m.def("adaptive_avg_pool2d", &kiln::adaptive_avg_pool2d, "x"_a, "height"_a, "width"_a,
        "channels_last"_a = false, NoGil(),
        "PyTorch's AdaptiveAvgPool2d((height, width)) on [N, C, H, W] (or channels last).");
  m.def(
      "batch_norm",
      [](const Array& x, std::optional<Array> running_mean, std::optional<Array> running_var,
         std::optional<Array> weight, std::optional<Array> bias, bool training, double momentum,
         double eps, bool channels_last) {
        const kiln::BatchNormResult r = kiln::batch_norm(
            x, weight.value_or(Array()), bias.value_or(Array()), running_mean.value_or(Array()),
            running_var.value_or(Array()), {training, momentum, eps, channels_last});
        auto given = [](const Array& a) {
          return a.valid() ? std::optional<Array>(a) : std::optional<Array>();
        };
        return std::make_tuple(r.y, given(r.running_mean), given(r.running_var));
      },
      "x"_a, "running_mean"_a = nb::none(), "running_var"_a = nb::none(), "weight"_a = nb::none(),
      "bias"_a = nb::none(), "training"_a = false, "momentum"_a = 0.1, "eps"_a = 1e-5,
      "channels_last"_a = false, NoGil(),
      "PyTorch's batch_norm on [N, C, ...]: returns (y, running_mean, running_var), the running "
      "statistics updated in training (None where none were given).");
  m.def(
      "group_norm",
      [](const Array& x, int64_t groups, std::optional<Array> weight, std::optional<Array> bias,
         double eps) {
        return kiln::group_norm(x, groups, weight.value_or(Array()), bias.value_or(Array()), eps);
      },
      "x"_a, "num_groups"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5,
      NoGil(), "PyTorch's group_norm on [N, C, ...].");
  m.def(
      "pad", [](const Array& x, Pads widths, double value) { return kiln::pad(x, widths, value); },
      "x"_a, "widths"_a, "value"_a = 0.0, NoGil(),
      "NumPy's constant pad: (before, after) for the last len(widths) axes; negative crops.");
  m.def("min", &kiln::min, "x"_a, "axes"_a = std::vector<int>{}, "keepdims"_a = false, NoGil(),
        "The smallest element over `axes` (all: empty); NaN propagates.");
}

// The bindings of evaluation, the lazy mode, autodiff, jit.

}  // namespace kiln_python
