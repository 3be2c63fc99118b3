// kiln cpu backend: elementwise kernels (unary, binary with broadcasting,
// comparisons, where, cast).
#include "backend/cpu/kernels.h"

namespace kiln::cpu {

namespace {

template <typename T, typename F>
void unary_apply(const Array& in, ArrayNode& out, F f) {
  const T* x = in.data<T>();
  T* y = static_cast<T*>(alloc_output(out));
  parallel_for(in.size(), 4, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = st<T>(f(ld(x[i])));
  });
}

void unary_kernel(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  Op op = p.op();
  if (op == Op::Neg || op == Op::Relu || op == Op::Abs) {
    return dispatch_numeric(in[0].dtype(), p.name(), [&](auto t) {
      using T = decltype(t);
      using A = acc_t<T>;
      switch (op) {
        case Op::Neg: return unary_apply<T>(in[0], out, [](A x) { return -x; });
        case Op::Relu: return unary_apply<T>(in[0], out, [](A x) { return x > A(0) ? x : A(0); });
        default: return unary_apply<T>(in[0], out, [](A x) { return x < A(0) ? -x : x; });
      }
    });
  }
  dispatch_float(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    switch (op) {
      case Op::Exp: return unary_apply<T>(in[0], out, [](A x) { return fast_exp(x); });
      case Op::Log: return unary_apply<T>(in[0], out, [](A x) { return std::log(x); });
      case Op::Sqrt: return unary_apply<T>(in[0], out, [](A x) { return std::sqrt(x); });
      case Op::Rsqrt: return unary_apply<T>(in[0], out, [](A x) { return A(1) / std::sqrt(x); });
      case Op::Tanh: return unary_apply<T>(in[0], out, [](A x) { return std::tanh(x); });
      case Op::Erf: return unary_apply<T>(in[0], out, [](A x) { return std::erf(x); });
      case Op::Gelu: return unary_apply<T>(in[0], out, [](A x) { return gelu_exact(x); });
      case Op::GeluTanh: return unary_apply<T>(in[0], out, [](A x) { return gelu_tanh(x); });
      case Op::GeluGrad: return unary_apply<T>(in[0], out, [](A x) { return gelu_exact_grad(x); });
      case Op::GeluTanhGrad:
        return unary_apply<T>(in[0], out, [](A x) { return gelu_tanh_grad(x); });
      default: fail(p.name(), "not a unary primitive");
    }
  });
}

// out = f(a, b) over the broadcast shape; the inner loop is specialized for
// the contiguous and scalar-operand cases so that it vectorizes.
template <typename T, typename R, typename F>
void binary_apply(const std::vector<Array>& in, ArrayNode& out, F f) {
  const T* a = in[0].data<T>();
  const T* b = in[1].data<T>();
  R* y = static_cast<R*>(alloc_output(out));
  auto apply = [&](R* o, const T* x, int64_t sx, const T* z, int64_t sz, int64_t n) {
    if (sx == 1 && sz == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = st<R>(f(ld(x[i]), ld(z[i])));
    } else if (sx == 1 && sz == 0) {
      auto zv = ld(*z);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = st<R>(f(ld(x[i]), zv));
    } else if (sx == 0 && sz == 1) {
      auto xv = ld(*x);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = st<R>(f(xv, ld(z[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = st<R>(f(ld(x[i * sx]), ld(z[i * sz])));
    }
  };
  if (in[0].shape() == out.shape && in[1].shape() == out.shape) {
    parallel_for(numel(out.shape), 1,
                 [&](int64_t b0, int64_t e) { apply(y + b0, a + b0, 1, b + b0, 1, e - b0); });
    return;
  }
  auto v = make_broadcast_view(out.shape, {in[0].shape(), in[1].shape()});
  for_each_strided<3>(v, 1, [&](const int64_t* off, int64_t n, const int64_t* s) {
    apply(y + off[0], a + off[1], s[1], b + off[2], s[2], n);
  });
}

void binary_kernel(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  Op op = p.op();
  dispatch_numeric(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    switch (op) {
      case Op::Add: return binary_apply<T, T>(in, out, [](A x, A y) { return x + y; });
      case Op::Sub: return binary_apply<T, T>(in, out, [](A x, A y) { return x - y; });
      case Op::Mul: return binary_apply<T, T>(in, out, [](A x, A y) { return x * y; });
      case Op::Div:
        if constexpr (std::is_integral_v<A>) {
          const T* d = in[1].data<T>();
          for (int64_t i = 0; i < in[1].size(); ++i)
            if (d[i] == 0) fail("divide", "integer division by zero");
        }
        return binary_apply<T, T>(in, out, [](A x, A y) { return x / y; });
      case Op::Maximum: return binary_apply<T, T>(in, out, [](A x, A y) { return x > y ? x : y; });
      case Op::Minimum: return binary_apply<T, T>(in, out, [](A x, A y) { return x < y ? x : y; });
      default: fail(p.name(), "not a binary primitive");
    }
  });
}

void compare_kernel(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  Op op = p.op();
  dispatch_all(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    switch (op) {
      case Op::Equal: return binary_apply<T, bool>(in, out, [](A x, A y) { return x == y; });
      case Op::NotEqual: return binary_apply<T, bool>(in, out, [](A x, A y) { return x != y; });
      case Op::Less: return binary_apply<T, bool>(in, out, [](A x, A y) { return x < y; });
      case Op::LessEqual: return binary_apply<T, bool>(in, out, [](A x, A y) { return x <= y; });
      case Op::Greater: return binary_apply<T, bool>(in, out, [](A x, A y) { return x > y; });
      case Op::GreaterEqual: return binary_apply<T, bool>(in, out, [](A x, A y) { return x >= y; });
      default: fail(p.name(), "not a comparison primitive");
    }
  });
}

void where_kernel(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  dispatch_all(in[1].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    const bool* c = in[0].data<bool>();
    const T* a = in[1].data<T>();
    const T* b = in[2].data<T>();
    T* y = static_cast<T*>(alloc_output(out));
    auto v = make_broadcast_view(out.shape, {in[0].shape(), in[1].shape(), in[2].shape()});
    for_each_strided<4>(v, 1, [&](const int64_t* off, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i)
        y[off[0] + i] = c[off[1] + i * s[1]] ? a[off[2] + i * s[2]] : b[off[3] + i * s[3]];
    });
  });
}

void cast_kernel(const Primitive&, const std::vector<Array>& in, ArrayNode& out) {
  void* y = alloc_output(out);
  DType from = in[0].dtype(), to = out.dtype;
  const char* x = static_cast<const char*>(in[0].raw());
  size_t sx = size_of(from), sy = size_of(to);
  parallel_for(in[0].size(), 2, [&](int64_t b, int64_t e) {
    convert(x + b * sx, from, static_cast<char*>(y) + b * sy, to, e - b);
  });
}

// The output shares the input's storage.
void alias_kernel(const Primitive&, const std::vector<Array>& in, ArrayNode& out) {
  out.buffer = in[0].node()->buffer;
  out.offset = in[0].node()->offset;
}

}  // namespace

void register_elementwise(KernelTable& t) {
  for (Op op : {Op::Neg, Op::Exp, Op::Log, Op::Sqrt, Op::Rsqrt, Op::Tanh, Op::Erf, Op::Gelu,
                Op::GeluTanh, Op::Relu, Op::Abs, Op::GeluGrad, Op::GeluTanhGrad})
    t.kernels[static_cast<int>(op)] = unary_kernel;
  for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum})
    t.kernels[static_cast<int>(op)] = binary_kernel;
  for (Op op : {Op::Equal, Op::NotEqual, Op::Less, Op::LessEqual, Op::Greater, Op::GreaterEqual})
    t.kernels[static_cast<int>(op)] = compare_kernel;
  t.kernels[static_cast<int>(Op::Where)] = where_kernel;
  t.kernels[static_cast<int>(Op::Cast)] = cast_kernel;
  t.kernels[static_cast<int>(Op::StopGradient)] = alias_kernel;
  t.kernels[static_cast<int>(Op::Reshape)] = alias_kernel;
}

}  // namespace kiln::cpu
