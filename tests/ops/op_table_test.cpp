// One table of cases over every primitive, driven three ways (as ggml's
// test-backend-ops): forward in f64 and f32 against a plain double-precision
// reference, lazy evaluation against eager, and every VJP against central
// finite differences in f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "../gpu_device.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/sgemm.h"
#include "backend/cpu/tiles.h"
#include "compiler/executable.h"
#include "compiler/graph.h"
#include "ops/dispatch.h"
#include "ops/op_defs.h"
#include "ops/scalar_math.h"
#include "ops/vjp.h"
#include "reference.h"

namespace kiln::testing {
namespace {

struct Input {
  Shape shape;
  enum Kind { Float, Int, Bool } kind = Float;
  double lo = -2, hi = 2;  // value range (ints: [lo, hi))
};
Input F(Shape s, double lo = -2, double hi = 2) {
  return {std::move(s), Input::Float, lo, hi};
}
Input I(Shape s, int lo, int hi) {
  return {std::move(s), Input::Int, double(lo), double(hi)};
}
Input B(Shape s) {
  return {std::move(s), Input::Bool};
}

using Fn = std::function<Array(const std::vector<Array>&)>;
using Ref = std::function<Host(const std::vector<Host>&)>;

struct Case {
  std::string name;
  std::vector<Input> inputs;
  Fn fn;
  Ref ref;
  double f32_tol = 2e-6;  // relative to the largest reference magnitude
  bool grad = true;       // check VJPs (float inputs only)
  bool large = false;     // forward-only, f32: exercises thread splitting
};

Host make_input(const Input& in, std::mt19937& rng) {
  Host h{in.shape, std::vector<double>(numel(in.shape))};
  std::uniform_real_distribution<double> u(in.lo, in.hi);
  for (auto& x : h.v) {
    if (in.kind == Input::Float) x = u(rng);
    if (in.kind == Input::Int) x = std::floor(u(rng));
    if (in.kind == Input::Bool) x = u(rng) > 0 ? 1 : 0;
  }
  return h;
}

DType dtype_for(const Input& in, DType fdt) {
  return in.kind == Input::Float ? fdt : in.kind == Input::Int ? DType::i32 : DType::bool_;
}

std::vector<Array> arrays(const Case& c, const std::vector<Host>& hs, DType fdt) {
  std::vector<Array> out;
  for (size_t i = 0; i < hs.size(); ++i)
    out.push_back(from_host(hs[i], dtype_for(c.inputs[i], fdt)));
  return out;
}

// Rounds host inputs through f32 so the reference sees what the kernel sees.
std::vector<Host> rounded(const Case& c, std::vector<Host> hs) {
  for (size_t i = 0; i < hs.size(); ++i)
    if (c.inputs[i].kind == Input::Float)
      for (auto& x : hs[i].v) x = static_cast<float>(x);
  return hs;
}

void expect_close(const Host& got, const Host& want, double rel, const std::string& what) {
  ASSERT_EQ(str(got.shape), str(want.shape)) << what;
  double scale = 1e-30;
  for (double w : want.v) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.v.size(); ++i)
    ASSERT_NEAR(got.v[i], want.v[i], rel * std::max(1.0, scale)) << what << " at flat index " << i;
}

// softmax(scale · Q Kᵀ) V per batch and head of qkv [B, T, 3, H, D].
Host ref_attention(const Host& qkv, double scale) {
  const int64_t B = qkv.shape[0], T = qkv.shape[1], H = qkv.shape[3], D = qkv.shape[4];
  auto at = [&](int64_t b, int64_t t, int64_t w, int64_t h, int64_t d) {
    return qkv.v[(((b * T + t) * 3 + w) * H + h) * D + d];
  };
  Host o{{B, T, H, D}, std::vector<double>(B * T * H * D, 0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(T);
        double m = -1e300, total = 0;
        for (int64_t j = 0; j < T; ++j) {
          for (int64_t d = 0; d < D; ++d) s[j] += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          s[j] *= scale;
          m = std::max(m, s[j]);
        }
        for (auto& x : s) total += (x = std::exp(x - m));
        for (int64_t j = 0; j < T; ++j)
          for (int64_t d = 0; d < D; ++d)
            o.v[((b * T + i) * H + h) * D + d] += s[j] / total * at(b, j, 2, h, d);
      }
  return o;
}

// attention(q, k, v) in plain loops: q [B, T, H, D], k and v [B, S, H, D];
// query i sees key j where the padding mask (bool [B, S]) keeps it and, if
// causal, j <= i + S - T; bias [B|1, H|1, T|1, S|1] is added to the scaled
// scores. A query that sees no key gets zeros.
// The flat offset in `full` of element e (row-major) of a window of `size`
// at `starts` clamped to [0, full - size] (JAX's dynamic slices).
int64_t window_offset(const Shape& full, const Shape& size, const Host& starts, int64_t e) {
  int64_t off = 0, stride = 1;
  for (int64_t d = static_cast<int64_t>(full.size()) - 1; d >= 0; --d) {
    const int64_t j = e % size[d];
    e /= size[d];
    const int64_t s = std::clamp<int64_t>(static_cast<int64_t>(starts.v[d]), 0, full[d] - size[d]);
    off += (s + j) * stride;
    stride *= full[d];
  }
  return off;
}
Host ref_dynamic_slice(const Host& x, const Host& starts, const Shape& size) {
  Host o{size, std::vector<double>(numel(size))};
  for (int64_t e = 0; e < o.size(); ++e) o.v[e] = x.v[window_offset(x.shape, size, starts, e)];
  return o;
}
Host ref_dynamic_update_slice(Host x, const Host& u, const Host& starts) {
  for (int64_t e = 0; e < u.size(); ++e) x.v[window_offset(x.shape, u.shape, starts, e)] = u.v[e];
  return x;
}

Host ref_sdpa(const Host& q, const Host& k, const Host& v, double scale, bool causal,
              const Host* bias = nullptr, const Host* keep = nullptr) {
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], D = q.shape[3], S = k.shape[1];
  Host o{q.shape, std::vector<double>(q.v.size(), 0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(S, -INFINITY);
        double m = -INFINITY, total = 0;
        for (int64_t j = 0; j < S; ++j) {
          if ((causal && j > i + S - T) || (keep && keep->v[b * S + j] == 0)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q.v[((b * T + i) * H + h) * D + d] * k.v[((b * S + j) * H + h) * D + d];
          s[j] = dot * scale;
          if (bias) {
            const Shape& bs = bias->shape;
            s[j] += bias->v[(((bs[0] > 1 ? b : 0) * bs[1] + (bs[1] > 1 ? h : 0)) * bs[2] +
                             (bs[2] > 1 ? i : 0)) *
                                bs[3] +
                            (bs[3] > 1 ? j : 0)];
          }
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;
        for (auto& x : s) total += (x = std::exp(x - m));
        for (int64_t j = 0; j < S; ++j)
          for (int64_t d = 0; d < D; ++d)
            o.v[((b * T + i) * H + h) * D + d] += s[j] / total * v.v[((b * S + j) * H + h) * D + d];
      }
  return o;
}

// PyTorch's conv2d (no bias) in plain loops: x [N, C, H, W] (channels_last:
// [N, H, W, C]), w [O, C / groups, KH, KW].
struct RefConv {
  Shape stride{1, 1}, dilation{1, 1}, lo{0, 0}, hi{0, 0};
  int64_t groups = 1;
  bool channels_last = false;
};
Host ref_conv(const Host& x, const Host& w, const RefConv& o) {
  const bool cl = o.channels_last;
  const int64_t N = x.shape[0], C = cl ? x.shape[3] : x.shape[1], H = cl ? x.shape[1] : x.shape[2],
                W = cl ? x.shape[2] : x.shape[3];
  const int64_t O = w.shape[0], CG = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  const int64_t HO = (H + o.lo[0] + o.hi[0] - o.dilation[0] * (KH - 1) - 1) / o.stride[0] + 1;
  const int64_t WO = (W + o.lo[1] + o.hi[1] - o.dilation[1] * (KW - 1) - 1) / o.stride[1] + 1;
  const int64_t OG = O / o.groups;
  auto xi = [&](int64_t n, int64_t c, int64_t h, int64_t ww) {
    return cl ? ((n * H + h) * W + ww) * C + c : ((n * C + c) * H + h) * W + ww;
  };
  Host y{cl ? Shape{N, HO, WO, O} : Shape{N, O, HO, WO}, std::vector<double>(N * O * HO * WO, 0)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oc = 0; oc < O; ++oc)
      for (int64_t a = 0; a < HO; ++a)
        for (int64_t b = 0; b < WO; ++b) {
          double s = 0;
          for (int64_t ic = 0; ic < CG; ++ic)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t h = a * o.stride[0] + i * o.dilation[0] - o.lo[0];
                const int64_t ww = b * o.stride[1] + j * o.dilation[1] - o.lo[1];
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                s += x.v[xi(n, oc / OG * CG + ic, h, ww)] * w.v[((oc * CG + ic) * KH + i) * KW + j];
              }
          y.v[cl ? ((n * HO + a) * WO + b) * O + oc : ((n * O + oc) * HO + a) * WO + b] = s;
        }
  return y;
}

// PyTorch's MaxPool2d / AvgPool2d in plain loops over x [N, C, H, W]
// (channels_last: [N, H, W, C]).
struct RefPool {
  bool max = true;
  Shape window{2, 2}, stride{2, 2}, lo{0, 0}, hi{0, 0};
  bool count_include_pad = true, channels_last = false;
};
Host ref_pool(const Host& x, const RefPool& o) {
  const bool cl = o.channels_last;
  const int64_t N = x.shape[0], C = cl ? x.shape[3] : x.shape[1], H = cl ? x.shape[1] : x.shape[2],
                W = cl ? x.shape[2] : x.shape[3];
  const int64_t HO = (H + o.lo[0] + o.hi[0] - o.window[0]) / o.stride[0] + 1;
  const int64_t WO = (W + o.lo[1] + o.hi[1] - o.window[1]) / o.stride[1] + 1;
  Host y{cl ? Shape{N, HO, WO, C} : Shape{N, C, HO, WO}, std::vector<double>(N * C * HO * WO)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t a = 0; a < HO; ++a)
        for (int64_t b = 0; b < WO; ++b) {
          double s = o.max ? -INFINITY : 0;
          int64_t count = 0;
          for (int64_t i = 0; i < o.window[0]; ++i)
            for (int64_t j = 0; j < o.window[1]; ++j) {
              const int64_t h = a * o.stride[0] + i - o.lo[0], w = b * o.stride[1] + j - o.lo[1];
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              const double v =
                  x.v[cl ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w];
              s = o.max ? std::max(s, v) : s + v;
              ++count;
            }
          if (!o.max) s /= o.count_include_pad ? o.window[0] * o.window[1] : count;
          y.v[cl ? ((n * HO + a) * WO + b) * C + c : ((n * C + c) * HO + a) * WO + b] = s;
        }
  return y;
}

// Each channel (axis `axis`) of x normalized by the given per-channel mean
// and variance (empty: the batch's, biased), then scaled and shifted.
Host ref_channel_norm(const Host& x, int axis, const Host* gamma, const Host* beta,
                      const Host* mean, const Host* var, double eps) {
  const int64_t c = x.shape[axis];
  int64_t inner = 1;
  for (size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  const int64_t n = x.size() / c;
  std::vector<double> mu(c, 0), v(c, 0);
  auto ch = [&](int64_t i) { return i / inner % c; };
  for (int64_t i = 0; i < x.size(); ++i) mu[ch(i)] += x.v[i] / n;
  for (int64_t i = 0; i < x.size(); ++i)
    v[ch(i)] += (x.v[i] - mu[ch(i)]) * (x.v[i] - mu[ch(i)]) / n;
  if (mean) mu = mean->v, v = var->v;
  Host y = x;
  for (int64_t i = 0; i < x.size(); ++i) {
    const int64_t k = ch(i);
    y.v[i] = (x.v[i] - mu[k]) / std::sqrt(v[k] + eps) * (gamma ? gamma->v[k] : 1) +
             (beta ? beta->v[k] : 0);
  }
  return y;
}

// [sum over rows of dy * x̂; sum over rows of dy] for x, dy [rows, C].
Host ref_layer_norm_param_grad(const Host& x, const Host& dy, double eps) {
  Host xh = ref_layer_norm(x, nullptr, nullptr, eps);
  int64_t c = x.shape.back(), rows = x.size() / c;
  Host o{{2, c}, std::vector<double>(2 * c, 0)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < c; ++k) {
      o.v[k] += dy.v[r * c + k] * xh.v[r * c + k];
      o.v[c + k] += dy.v[r * c + k];
    }
  return o;
}

Host binary_ref(const std::vector<Host>& h, double (*f)(double, double)) {
  return ref_map(h, [f](const double* a) { return f(a[0], a[1]); });
}
Host unary_ref(const std::vector<Host>& h, double (*f)(double)) {
  return ref_map(h, [f](const double* a) { return f(a[0]); });
}
double gelu_ref(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double fd_deriv(double (*f)(double), double x) {
  return (f(x + 1e-5) - f(x - 1e-5)) / 2e-5;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  auto unary = [&](std::string name, Array (*op)(const Array&), double (*ref)(double),
                   double lo = -2, double hi = 2, Shape s = {3, 4}) {
    c.push_back({name,
                 {F(s, lo, hi)},
                 [op](auto& x) { return op(x[0]); },
                 [ref](auto& h) { return unary_ref(h, ref); }});
  };
  unary("neg", neg, [](double x) { return -x; });
  unary("exp", exp, [](double x) { return std::exp(x); });
  unary("exp_rank0", exp, [](double x) { return std::exp(x); }, -2, 2, {});
  unary(
      "log", log, [](double x) { return std::log(x); }, 0.2, 3);
  unary(
      "sqrt", sqrt, [](double x) { return std::sqrt(x); }, 0.2, 3);
  unary(
      "rsqrt", rsqrt, [](double x) { return 1 / std::sqrt(x); }, 0.2, 3);
  unary("tanh", tanh, [](double x) { return std::tanh(x); });
  unary("erf", erf, [](double x) { return std::erf(x); });
  unary("gelu", gelu, gelu_ref, -4, 4, {5, 7});
  unary("gelu_tanh", gelu_tanh, gelu_tanh_ref, -4, 4, {5, 7});
  unary("relu", relu, [](double x) { return x > 0 ? x : 0; });
  unary("abs", abs, [](double x) { return std::fabs(x); });
  unary("square", square, [](double x) { return x * x; });
  unary(
      "sin", sin, [](double x) { return std::sin(x); }, -4, 4);
  unary(
      "cos", cos, [](double x) { return std::cos(x); }, -4, 4);
  unary(
      "log1p", log1p, [](double x) { return std::log1p(x); }, -0.9, 3);
  unary("expm1", expm1, [](double x) { return std::expm1(x); });
  unary("sign", sign, [](double x) { return double((x > 0) - (x < 0)); });
  unary(
      "floor", floor, [](double x) { return std::floor(x); }, -3, 3);
  unary(
      "round", round, [](double x) { return std::nearbyint(x); }, -3, 3);
  // Backward-only primitives: forward checked against derivatives of their forward op.
  c.push_back({"gelu_grad",
               {F({4, 6}, -4, 4)},
               [](auto& x) { return gelu_grad(x[0]); },
               [](auto& h) { return unary_ref(h, [](double x) { return fd_deriv(gelu_ref, x); }); },
               2e-6,
               false});
  c.push_back(
      {"gelu_tanh_grad",
       {F({4, 6}, -4, 4)},
       [](auto& x) { return gelu_tanh_grad(x[0]); },
       [](auto& h) { return unary_ref(h, [](double x) { return fd_deriv(gelu_tanh_ref, x); }); },
       2e-6,
       false});

  auto binary = [&](std::string name, Array (*op)(const Array&, const Array&),
                    double (*ref)(double, double), Shape a, Shape b, double lo = -2) {
    c.push_back({name,
                 {F(a, lo), F(b, lo)},
                 [op](auto& x) { return op(x[0], x[1]); },
                 [ref](auto& h) { return binary_ref(h, ref); }});
  };
  auto plus = [](double a, double b) { return a + b; };
  auto mul = [](double a, double b) { return a * b; };
  binary("add", add, plus, {3, 4}, {3, 4});
  binary("add_row_broadcast", add, plus, {3, 4}, {4});
  binary("add_both_broadcast", add, plus, {2, 1, 4}, {3, 1});
  binary("add_scalar", add, plus, {}, {3, 4});
  binary("add_rank0", add, plus, {}, {});
  binary("sub_broadcast", subtract, [](double a, double b) { return a - b; }, {3, 1}, {1, 5});
  binary("mul_broadcast", multiply, mul, {2, 3, 4}, {3, 1});
  binary(
      "div", divide, [](double a, double b) { return a / b; }, {3, 4}, {4}, 0.5);
  binary(
      "power", power, [](double a, double b) { return std::pow(a, b); }, {3, 4}, {4}, 0.5);
  c.push_back({"clip",
               {F({4, 5}, -3, 3)},
               [](auto& x) { return clip(x[0], -1.0, 1.5); },
               [](auto& h) {
                 return unary_ref(h, [](double x) { return std::min(std::max(x, -1.0), 1.5); });
               }});
  binary("maximum", maximum, [](double a, double b) { return std::max(a, b); }, {3, 4}, {3, 4});
  binary("minimum_broadcast", minimum, [](double a, double b) { return std::min(a, b); }, {3, 4},
         {1, 4});
  binary("relu_grad_broadcast", relu_grad, [](double g, double y) { return y > 0 ? g : 0.0; },
         {3, 4}, {1, 4});
  auto compare = [&](std::string name, Array (*op)(const Array&, const Array&),
                     bool (*ref)(double, double)) {
    c.push_back(
        {name,
         {I({3, 4}, -2, 2), I({4}, -2, 2)},
         [op](auto& x) {
           return astype(op(astype(x[0], DType::f32), astype(x[1], DType::f32)), DType::f32);
         },
         [ref](auto& h) {
           return ref_map(h, [ref](const double* a) { return ref(a[0], a[1]) ? 1.0 : 0.0; });
         },
         0,
         false});
  };
  compare("equal", equal, [](double a, double b) { return a == b; });
  compare("not_equal", not_equal, [](double a, double b) { return a != b; });
  compare("less", less, [](double a, double b) { return a < b; });
  compare("less_equal", less_equal, [](double a, double b) { return a <= b; });
  compare("greater", greater, [](double a, double b) { return a > b; });
  compare("greater_equal", greater_equal, [](double a, double b) { return a >= b; });
  c.push_back(
      {"where",
       {B({3, 4}), F({3, 4}), F({4})},
       [](auto& x) { return where(x[0], x[1], x[2]); },
       [](auto& h) { return ref_map(h, [](const double* a) { return a[0] ? a[1] : a[2]; }); }});
  // Logic on bool and on numbers (nonzero is true), broadcast.
  auto logic = [&](std::string name, auto f, double (*r)(bool, bool)) {
    c.push_back({name,
                 {B({3, 4}), I({4}, -1, 2)},
                 [f](auto& x) { return astype(f(x[0], x[1]), DType::f32); },
                 [r](auto& h) {
                   return ref_map(h, [r](const double* a) { return r(a[0] != 0, a[1] != 0); });
                 },
                 0,
                 false});
  };
  logic("logical_and", logical_and, [](bool a, bool b) { return double(a && b); });
  logic("logical_or", logical_or, [](bool a, bool b) { return double(a || b); });
  logic("logical_xor", logical_xor, [](bool a, bool b) { return double(a != b); });
  logic(
      "logical_not", [](const Array& a, const Array& b) { return logical_or(logical_not(b), a); },
      [](bool a, bool b) { return double(!b || a); });
  c.push_back({"cast_roundtrip",
               {F({3, 4})},
               [](auto& x) { return astype(astype(x[0], DType::i64), x[0].dtype()); },
               [](auto& h) { return unary_ref(h, [](double x) { return std::trunc(x); }); },
               0,
               false});
  c.push_back(
      {"stop_gradient",
       {F({3, 4}), F({3, 4})},
       [](auto& x) { return x[0] * stop_gradient(x[1]) + x[1]; },
       [](auto& h) { return ref_map(h, [](const double* a) { return a[0] * a[1] + a[1]; }); },
       2e-6,
       false});  // its VJP differs from finite differences by design: see autodiff_test
  // Copy: the values on the other device (ref from cpu, cpu from ref), an op
  // there, and back; its VJP copies the cotangent back the other way.
  c.push_back(
      {"copy_between_devices",
       {F({3, 4}), F({4})},
       [](auto& x) {
         const Device home = x[0].device();
         const Device other = home == Device::ref() ? Device::cpu() : Device::ref();
         return (x[0].to(other) * x[1].to(other)).to(home) + x[0];
       },
       [](auto& h) { return binary_ref(h, [](double a, double b) { return a * b + a; }); }});

  // reductions
  auto red = [&](std::string name, Shape s, std::vector<int> axes, bool keep, RefReduce kind) {
    c.push_back({name,
                 {F(s)},
                 [=](auto& x) {
                   if (kind == RefReduce::Sum) return sum(x[0], axes, keep);
                   if (kind == RefReduce::Max) return max(x[0], axes, keep);
                   return astype(argmax(x[0], axes[0], keep), DType::f32);
                 },
                 [=](auto& h) { return ref_reduce(h[0], axes, keep, kind); },
                 2e-6,
                 kind != RefReduce::Argmax});
  };
  red("sum_all", {3, 4}, {}, false, RefReduce::Sum);
  red("sum_rank0", {}, {}, false, RefReduce::Sum);
  red("sum_rows", {3, 5}, {1}, false, RefReduce::Sum);
  red("sum_cols_keepdims", {3, 5}, {0}, true, RefReduce::Sum);
  red("sum_middle", {2, 3, 4}, {1}, false, RefReduce::Sum);
  red("sum_split_axes", {2, 3, 4}, {0, 2}, true, RefReduce::Sum);
  red("max_rows", {4, 6}, {-1}, false, RefReduce::Max);
  red("max_cols", {4, 6}, {0}, true, RefReduce::Max);
  red("argmax_rows", {4, 6}, {1}, false, RefReduce::Argmax);
  red("argmax_cols_keepdims", {4, 6}, {0}, true, RefReduce::Argmax);
  // Running sums along one axis, forward and reversed.
  auto scan = [&](std::string name, Shape s, int axis, bool reverse) {
    c.push_back({name,
                 {F(s)},
                 [axis, reverse](auto& x) { return cumsum(x[0], axis, reverse); },
                 [axis, reverse](auto& h) {
                   const Shape& sh = h[0].shape;
                   const int ax = axis < 0 ? axis + static_cast<int>(sh.size()) : axis;
                   Host o{sh, std::vector<double>(h[0].v.size(), 0)};
                   for (int64_t i = 0; i < o.size(); ++i) {
                     auto idx = unravel(i, sh);
                     const int64_t at = idx[ax];
                     for (int64_t k = 0; k < sh[ax]; ++k) {
                       if (reverse ? k < at : k > at) continue;
                       idx[ax] = k;
                       o.v[i] += h[0].v[ravel(idx, sh)];
                     }
                   }
                   return o;
                 }});
  };
  scan("cumsum_rows", {3, 7}, 1, false);
  scan("cumsum_middle_reverse", {2, 5, 3}, 1, true);
  scan("cumsum_first_axis", {6, 4}, 0, false);
  scan("cumsum_vector_reverse", {9}, -1, true);
  // Sorting along one axis: the permutation (i32, compared as floats), the
  // sorted values and the top k (differentiable through their gather), and
  // the gather itself with broadcast and negative indices. The reference
  // stable-sorts each line in f64.
  auto line_order = [](const Host& x, int axis, bool descending) {
    const Shape& sh = x.shape;
    const int ax = axis < 0 ? axis + static_cast<int>(sh.size()) : axis;
    Host o{sh, std::vector<double>(x.v.size())};
    for (int64_t i = 0; i < o.size(); ++i) {
      auto idx = unravel(i, sh);
      if (idx[ax] != 0) continue;  // once per line
      std::vector<int64_t> pos(sh[ax]);
      std::iota(pos.begin(), pos.end(), 0);
      auto at = [&](int64_t k) {
        idx[ax] = k;
        return x.v[ravel(idx, sh)];
      };
      std::stable_sort(pos.begin(), pos.end(), [&](int64_t l, int64_t r) {
        return descending ? at(l) > at(r) : at(l) < at(r);
      });
      for (int64_t k = 0; k < sh[ax]; ++k) {
        idx[ax] = k;
        o.v[ravel(idx, sh)] = static_cast<double>(pos[k]);
      }
    }
    return o;
  };
  auto gather_along = [](const Host& x, const Host& order, int axis, int64_t keep) {
    const int ax = axis < 0 ? axis + static_cast<int>(x.shape.size()) : axis;
    Shape sh = x.shape;
    sh[ax] = keep;
    Host o{sh, std::vector<double>(numel(sh))};
    for (int64_t i = 0; i < o.size(); ++i) {
      auto idx = unravel(i, sh);
      idx[ax] = static_cast<int64_t>(order.v[ravel(idx, order.shape)]);
      o.v[i] = x.v[ravel(idx, x.shape)];
    }
    return o;
  };
  for (bool descending : {false, true}) {
    const std::string dir = descending ? "_descending" : "";
    c.push_back({"argsort_rows" + dir,
                 {F({4, 7})},
                 [=](auto& x) { return astype(argsort(x[0], -1, descending), DType::f32); },
                 [=](auto& h) { return line_order(h[0], -1, descending); },
                 0,
                 false});
    c.push_back({"argsort_middle" + dir,
                 {F({3, 6, 2})},
                 [=](auto& x) { return astype(argsort(x[0], 1, descending), DType::f32); },
                 [=](auto& h) { return line_order(h[0], 1, descending); },
                 0,
                 false});
    c.push_back(
        {"sort_cols" + dir,
         {F({6, 4})},
         [=](auto& x) { return sort(x[0], 0, descending); },
         [=](auto& h) { return gather_along(h[0], line_order(h[0], 0, descending), 0, 6); }});
  }
  c.push_back({"top_k_values",
               {F({3, 9})},
               [](auto& x) { return top_k(x[0], 4).first; },
               [=](auto& h) { return gather_along(h[0], line_order(h[0], -1, true), -1, 4); }});
  c.push_back({"top_k_indices",
               {F({2, 3, 5})},
               [](auto& x) { return astype(top_k(x[0], 2).second, DType::f32); },
               [=](auto& h) {
                 const Host order = line_order(h[0], -1, true);
                 Host o{{2, 3, 2}, {}};
                 for (int64_t i = 0; i < order.size(); ++i)
                   if (i % 5 < 2) o.v.push_back(order.v[i]);
                 return o;
               },
               0,
               false});
  c.push_back({"take_along_axis_negative",
               {F({4, 5}), I({4, 3}, -5, 5)},
               [](auto& x) { return take_along_axis(x[0], x[1], 1); },
               [=](auto& h) {
                 Host idx = h[1];
                 for (double& i : idx.v) i = i < 0 ? i + 5 : i;
                 return gather_along(h[0], idx, 1, 3);
               }});
  c.push_back({"take_along_axis_broadcast",
               {F({3, 4, 2}), I({1, 5, 2}, 0, 4)},
               [](auto& x) { return take_along_axis(x[0], x[1], 1); },
               [=](auto& h) {
                 Host idx{{3, 5, 2}, {}};
                 for (int a = 0; a < 3; ++a)
                   idx.v.insert(idx.v.end(), h[1].v.begin(), h[1].v.end());
                 return gather_along(h[0], idx, 1, 5);
               }});
  c.push_back({"mean",
               {F({3, 4})},
               [](auto& x) { return mean(x[0], {1}); },
               [](auto& h) {
                 Host r = ref_reduce(h[0], {1}, false, RefReduce::Sum);
                 for (auto& v : r.v) v /= 4;
                 return r;
               }});

  // matmul
  auto mm = [&](std::string name, Shape a, Shape b, bool ta, bool tb) {
    c.push_back({name,
                 {F(a), F(b)},
                 [=](auto& x) {
                   return matmul(x[0], x[1], {ta, tb, std::nullopt});
                 },
                 [=](auto& h) { return ref_matmul(h[0], h[1], ta, tb); },
                 1e-5});
  };
  mm("matmul", {3, 4}, {4, 5}, false, false);
  mm("matmul_ta", {4, 3}, {4, 5}, true, false);
  mm("matmul_tb", {3, 4}, {5, 4}, false, true);
  mm("matmul_ta_tb", {4, 3}, {5, 4}, true, true);
  mm("matmul_batched", {2, 3, 4}, {2, 4, 5}, false, false);
  mm("matmul_batched_ta_tb", {2, 4, 3}, {2, 5, 4}, true, true);
  mm("matmul_batch_rank2_rhs", {2, 3, 4}, {4, 5}, false, false);
  mm("matmul_batch_rank2_rhs_tb", {2, 3, 4}, {5, 4}, false, true);
  mm("matmul_batch_rank2_rhs_ta", {2, 4, 3}, {4, 5}, true, false);
  mm("matmul_rank2_lhs_batch", {3, 4}, {2, 4, 5}, false, false);
  mm("matmul_rank2_lhs_batch_ta", {4, 3}, {2, 4, 5}, true, false);
  mm("matmul_4d", {2, 2, 3, 4}, {2, 2, 4, 3}, false, false);

  // layout
  c.push_back({"reshape",
               {F({2, 6})},
               [](auto& x) {
                 return reshape(x[0], {3, -1}) * 1.0;
               },
               [](auto& h) {
                 return Host{{3, 4}, h[0].v};
               }});
  c.push_back({"transpose_3d",
               {F({2, 3, 4})},
               [](auto& x) {
                 return transpose(x[0], {2, 0, 1});
               },
               [](auto& h) {
                 return ref_transpose(h[0], {2, 0, 1});
               }});
  c.push_back({"transpose_tiled",
               {F({40, 50})},
               [](auto& x) { return transpose(x[0]); },
               [](auto& h) {
                 return ref_transpose(h[0], {1, 0});
               },
               0});
  c.push_back({"swapaxes_batched",
               {F({3, 20, 17})},
               [](auto& x) { return swapaxes(x[0], 1, 2); },
               [](auto& h) {
                 return ref_transpose(h[0], {0, 2, 1});
               },
               0});
  c.push_back({"broadcast_to",
               {F({3, 1})},
               [](auto& x) {
                 return broadcast_to(x[0], {2, 3, 4});
               },
               [](auto& h) {
                 Host z{{2, 3, 4}, std::vector<double>(24, 0)};
                 return ref_map({h[0], z}, [](const double* a) { return a[0]; });
               }});
  c.push_back({"concatenate",
               {F({2, 3}), F({2, 2}), F({2, 1})},
               [](auto& x) { return concatenate(x, 1); },
               [](auto& h) {
                 Host o{{2, 6}, {}};
                 for (int r = 0; r < 2; ++r)
                   for (auto* p : {&h[0], &h[1], &h[2]})
                     for (int64_t k = 0; k < p->shape[1]; ++k)
                       o.v.push_back(p->v[r * p->shape[1] + k]);
                 return o;
               }});
  c.push_back({"slice_step",
               {F({5, 6})},
               [](auto& x) {
                 return slice(x[0], {1, 0}, {5, 6}, {2, 3});
               },
               [](auto& h) {
                 Host o{{2, 2}, {}};
                 for (int i = 1; i < 5; i += 2)
                   for (int j = 0; j < 6; j += 3) o.v.push_back(h[0].v[i * 6 + j]);
                 return o;
               }});
  c.push_back({"slice_negative",
               {F({4, 5})},
               [](auto& x) { return slice(x[0], {-3}, {-1}); },
               [](auto& h) {
                 Host o{{2, 5}, {}};
                 for (int i = 1; i < 3; ++i)
                   for (int j = 0; j < 5; ++j) o.v.push_back(h[0].v[i * 5 + j]);
                 return o;
               }});
  // dynamic slices: starts drawn past both ends, so that clamping is tested
  c.push_back({"dynamic_slice",
               {F({4, 5, 6}), I({3}, -3, 7)},
               [](auto& x) {
                 return dynamic_slice(x[0], x[1], {2, 3, 4});
               },
               [](auto& h) {
                 return ref_dynamic_slice(h[0], h[1], {2, 3, 4});
               }});
  c.push_back({"dynamic_slice_whole_axis",
               {F({3, 7}), I({2}, -2, 9)},
               [](auto& x) {
                 return dynamic_slice(x[0], x[1], {3, 2});
               },
               [](auto& h) {
                 return ref_dynamic_slice(h[0], h[1], {3, 2});
               }});
  c.push_back({"dynamic_update_slice",
               {F({4, 5, 6}), F({2, 3, 4}), I({3}, -3, 7)},
               [](auto& x) { return dynamic_update_slice(x[0], x[1], x[2]); },
               [](auto& h) { return ref_dynamic_update_slice(h[0], h[1], h[2]); }});
  c.push_back({"dynamic_update_slice_kv_cache",  // one token's keys into [B, S, H, D]
               {F({2, 8, 3, 4}), F({2, 1, 3, 4}), I({4}, 0, 8)},
               [](auto& x) { return dynamic_update_slice(x[0], x[1], x[2]); },
               [](auto& h) { return ref_dynamic_update_slice(h[0], h[1], h[2]); }});
  c.push_back({"take_rows",
               {F({5, 3}), I({4}, 0, 5)},
               [](auto& x) { return take(x[0], x[1], 0); },
               [](auto& h) {
                 Host o{{4, 3}, {}};
                 for (double i : h[1].v)
                   for (int j = 0; j < 3; ++j) o.v.push_back(h[0].v[int(i) * 3 + j]);
                 return o;
               }});
  c.push_back({"take_axis1_2d_indices",
               {F({2, 5, 3}), I({2, 2}, -5, 5)},
               [](auto& x) { return take(x[0], x[1], 1); },
               [](auto& h) {
                 Host o{{2, 2, 2, 3}, {}};
                 for (int a = 0; a < 2; ++a)
                   for (double i : h[1].v) {
                     int ii = i < 0 ? int(i) + 5 : int(i);
                     for (int j = 0; j < 3; ++j) o.v.push_back(h[0].v[(a * 5 + ii) * 3 + j]);
                   }
                 return o;
               }});
  // The VJPs of slice and take, differentiable themselves.
  c.push_back({"slice_grad_step",
               {F({2, 2})},
               [](auto& x) {
                 return slice_grad(x[0], SliceAttrs{{1, 0}, {5, 6}, {2, 3}, {5, 6}});
               },
               [](auto& h) {
                 Host o{{5, 6}, std::vector<double>(30, 0.0)};
                 int k = 0;
                 for (int i = 1; i < 5; i += 2)
                   for (int j = 0; j < 6; j += 3) o.v[i * 6 + j] = h[0].v[k++];
                 return o;
               }});
  c.push_back({"scatter_add_rows",
               {I({4}, 0, 5), F({4, 3})},
               [](auto& x) {
                 return scatter_add(x[0], x[1], 0, {5, 3});
               },
               [](auto& h) {
                 Host o{{5, 3}, std::vector<double>(15, 0.0)};
                 for (int r = 0; r < 4; ++r)
                   for (int j = 0; j < 3; ++j) o.v[int(h[0].v[r]) * 3 + j] += h[1].v[r * 3 + j];
                 return o;
               }});
  c.push_back({"one_hot",
               {I({2, 3}, 0, 4)},
               [](auto& x) { return one_hot(x[0], 4); },
               [](auto& h) {
                 Host o{{2, 3, 4}, std::vector<double>(24, 0)};
                 for (int i = 0; i < 6; ++i) o.v[i * 4 + int(h[0].v[i])] = 1;
                 return o;
               },
               0,
               false});

  // fused
  c.push_back({"softmax",
               {F({3, 7})},
               [](auto& x) { return softmax(x[0]); },
               [](auto& h) { return ref_softmax(h[0], -1, false); }});
  c.push_back({"softmax_axis0",
               {F({5, 3})},
               [](auto& x) { return softmax(x[0], 0); },
               [](auto& h) { return ref_softmax(h[0], 0, false); }});
  c.push_back({"log_softmax",
               {F({2, 3, 6})},
               [](auto& x) { return log_softmax(x[0]); },
               [](auto& h) { return ref_softmax(h[0], -1, true); }});
  c.push_back({"layer_norm",
               {F({4, 8}), F({8}), F({8})},
               [](auto& x) { return layer_norm(x[0], x[1], x[2], 1e-5); },
               [](auto& h) { return ref_layer_norm(h[0], &h[1], &h[2], 1e-5); },
               1e-5});
  c.push_back({"layer_norm_plain_rank3",
               {F({2, 3, 8})},
               [](auto& x) { return layer_norm(x[0], 1e-12); },
               [](auto& h) { return ref_layer_norm(h[0], nullptr, nullptr, 1e-12); },
               1e-5});
  c.push_back({"layer_norm_param_grad",
               {F({2, 3, 8}), F({2, 3, 8})},
               [](auto& x) { return layer_norm_param_grad(x[0], x[1], 1e-5); },
               [](auto& h) { return ref_layer_norm_param_grad(h[0], h[1], 1e-5); },
               1e-5,
               false});  // a backward-only primitive: checked through layer_norm's VJP
  c.push_back({"softmax_cross_entropy",
               {F({4, 6}), I({4}, 0, 6)},
               [](auto& x) { return softmax_cross_entropy(x[0], x[1]); },
               [](auto& h) {
                 Host ls = ref_softmax(h[0], -1, true);
                 Host o{{4}, {}};
                 for (int r = 0; r < 4; ++r) o.v.push_back(-ls.v[r * 6 + int(h[1].v[r])]);
                 return o;
               }});
  c.push_back({"softmax_cross_entropy_mean_rank3",
               {F({2, 3, 5}), I({2, 3}, 0, 5)},
               [](auto& x) { return mean(softmax_cross_entropy(x[0], x[1])); },
               [](auto& h) {
                 Host ls = ref_softmax(h[0], -1, true);
                 double s = 0;
                 for (int r = 0; r < 6; ++r) s -= ls.v[r * 5 + int(h[1].v[r])];
                 return Host{{}, {s / 6}};
               }});

  c.push_back({"attention",
               {F({2, 3, 3, 2, 4})},
               [](auto& x) { return attention(x[0], 0.5); },
               [](auto& h) { return ref_attention(h[0], 0.5); },
               1e-5});
  c.push_back({"attention_one_token",
               {F({1, 1, 3, 3, 2})},
               [](auto& x) { return attention(x[0], 0.125); },
               [](auto& h) { return ref_attention(h[0], 0.125); },
               1e-5});

  // attention over separate q [B, T, H, D], k and v [B, S, H, D]
  c.push_back({"sdpa_cross",
               {F({2, 3, 2, 4}), F({2, 5, 2, 4}), F({2, 5, 2, 4})},
               [](auto& x) { return attention(x[0], x[1], x[2]); },
               [](auto& h) { return ref_sdpa(h[0], h[1], h[2], 0.5, false); },
               1e-5});
  c.push_back({"sdpa_causal",
               {F({2, 4, 2, 3}), F({2, 4, 2, 3}), F({2, 4, 2, 3})},
               [](auto& x) { return attention(x[0], x[1], x[2], {.scale = 0.7, .causal = true}); },
               [](auto& h) { return ref_sdpa(h[0], h[1], h[2], 0.7, true); },
               1e-5});
  c.push_back({"sdpa_causal_kv_cache",  // 2 new tokens after 3 cached ones
               {F({1, 2, 2, 4}), F({1, 5, 2, 4}), F({1, 5, 2, 4})},
               [](auto& x) { return attention(x[0], x[1], x[2], {.causal = true}); },
               [](auto& h) { return ref_sdpa(h[0], h[1], h[2], 0.5, true); },
               1e-5});
  c.push_back({"sdpa_bias",  // broadcast over heads
               {F({2, 3, 2, 4}), F({2, 4, 2, 4}), F({2, 4, 2, 4}), F({2, 1, 3, 4})},
               [](auto& x) { return attention(x[0], x[1], x[2], {.bias = x[3]}); },
               [](auto& h) { return ref_sdpa(h[0], h[1], h[2], 0.5, false, &h[3]); },
               1e-5});
  c.push_back({"sdpa_causal_bias_2d",  // one [T, S] bias for every batch and head
               {F({2, 4, 3, 2}), F({2, 4, 3, 2}), F({2, 4, 3, 2}), F({4, 4})},
               [](auto& x) {
                 return attention(x[0], x[1], x[2], {.scale = 0.9, .causal = true, .bias = x[3]});
               },
               [](auto& h) {
                 Host b = h[3];
                 b.shape = {1, 1, 4, 4};
                 return ref_sdpa(h[0], h[1], h[2], 0.9, true, &b);
               },
               1e-5});
  c.push_back({"sdpa_key_padding",  // random keeps: some queries see no key
               {F({3, 3, 2, 4}), F({3, 3, 2, 4}), F({3, 3, 2, 4}), B({3, 3})},
               [](auto& x) {
                 return attention(x[0], x[1], x[2], {.causal = true, .key_padding_mask = x[3]});
               },
               [](auto& h) { return ref_sdpa(h[0], h[1], h[2], 0.5, true, nullptr, &h[3]); },
               1e-5});

  // convolutions: every geometry the kernels take apart
  c.push_back({"conv2d",
               {F({2, 3, 5, 6}), F({4, 3, 3, 2})},
               [](auto& x) { return conv2d(x[0], x[1]); },
               [](auto& h) { return ref_conv(h[0], h[1], {}); },
               1e-5});
  c.push_back({"conv2d_strided_dilated_padded",
               {F({1, 2, 7, 8}), F({3, 2, 3, 3})},
               [](auto& x) {
                 return conv2d(x[0], x[1],
                               {.stride = {2, 1}, .dilation = {1, 2}, .padding = {{1, 0}, {2, 1}}});
               },
               [](auto& h) {
                 return ref_conv(h[0], h[1], {{2, 1}, {1, 2}, {1, 2}, {0, 1}});
               },
               1e-5});
  c.push_back({"conv2d_groups_channels_last",
               {F({2, 5, 4, 6}), F({4, 3, 2, 2})},
               [](auto& x) {
                 return conv2d(
                     x[0], x[1],
                     {.stride = {2}, .padding = {{0, 1}}, .groups = 2, .channels_last = true});
               },
               [](auto& h) {
                 return ref_conv(h[0], h[1], {{2, 2}, {1, 1}, {0, 0}, {1, 1}, 2, true});
               },
               1e-5});
  c.push_back({"conv2d_depthwise_same",
               {F({1, 4, 6, 5}), F({4, 1, 3, 3})},
               [](auto& x) { return conv2d(x[0], x[1], {.same = true, .groups = 4}); },
               [](auto& h) {
                 return ref_conv(h[0], h[1], {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 4});
               },
               1e-5});
  c.push_back({"conv2d_depthwise_channels_last",  // ConvNeXt's, strided, dilated, padded unevenly
               {F({2, 7, 8, 6}), F({6, 1, 3, 3})},
               [](auto& x) {
                 return conv2d(x[0], x[1],
                               {.stride = {2, 1},
                                .dilation = {2},
                                .padding = {{3, 1}, {2, 2}},
                                .groups = 6,
                                .channels_last = true});
               },
               [](auto& h) {
                 return ref_conv(h[0], h[1], {{2, 1}, {2, 2}, {3, 2}, {1, 2}, 6, true});
               },
               1e-5});
  c.push_back({"conv1d_same_strided",
               {F({2, 3, 9}), F({2, 3, 4})},
               [](auto& x) { return conv1d(x[0], x[1], {.stride = {2}, .same = true}); },
               [](auto& h) {
                 // ceil(9 / 2) = 5 outputs need 4 * 2 + 4 - 9 = 3 padding: 1 before, 2 after.
                 Host x{{2, 3, 1, 9}, h[0].v}, w{{2, 3, 1, 4}, h[1].v};
                 Host y = ref_conv(x, w, {{1, 2}, {1, 1}, {0, 1}, {0, 2}});
                 y.shape = {2, 2, 5};
                 return y;
               },
               1e-5});
  c.push_back({"conv2d_patches",  // ViT's patch embedding: kernel = stride, leftovers ignored
               {F({2, 3, 9, 8}), F({5, 3, 4, 4})},
               [](auto& x) { return conv2d(x[0], x[1], {.stride = {4}}); },
               [](auto& h) {
                 return ref_conv(h[0], h[1], {{4, 4}});
               },
               1e-5});

  c.push_back({"max_pool2d_resnet_stem",  // 3x3, stride 2, padding 1
               {F({2, 3, 7, 6})},
               [](auto& x) {
                 return max_pool2d(x[0], {3}, {.stride = {2}, .padding = {{1, 1}}});
               },
               [](auto& h) {
                 return ref_pool(h[0], {true, {3, 3}, {2, 2}, {1, 1}, {1, 1}});
               }});
  c.push_back({"max_pool2d_channels_last",
               {F({1, 5, 4, 3})},
               [](auto& x) {
                 return max_pool2d(
                     x[0], {2, 3},
                     {.stride = {1, 2}, .padding = {{1, 0}, {0, 1}}, .channels_last = true});
               },
               [](auto& h) {
                 return ref_pool(h[0], {true, {2, 3}, {1, 2}, {1, 0}, {0, 1}, true, true});
               }});
  c.push_back({"avg_pool2d",
               {F({2, 2, 5, 6})},
               [](auto& x) { return avg_pool2d(x[0], {2}); },
               [](auto& h) { return ref_pool(h[0], {false}); },
               1e-6});
  c.push_back({"avg_pool2d_padded_exclusive",
               {F({1, 3, 5, 5})},
               [](auto& x) {
                 return avg_pool2d(
                     x[0], {3}, {.stride = {2}, .padding = {{1, 1}}, .count_include_pad = false});
               },
               [](auto& h) {
                 return ref_pool(h[0], {false, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false});
               },
               1e-6});
  c.push_back({"adaptive_avg_pool2d",
               {F({2, 3, 5, 7})},
               [](auto& x) { return adaptive_avg_pool2d(x[0], 2, 3); },
               [](auto& h) {
                 // rows [0, 3) and [2, 5); columns [0, 3), [2, 5), [4, 7)
                 Host y{{2, 3, 2, 3}, std::vector<double>(36)};
                 for (int64_t n = 0; n < 6; ++n)
                   for (int64_t i = 0; i < 2; ++i)
                     for (int64_t j = 0; j < 3; ++j) {
                       double s = 0;
                       for (int64_t r = 2 * i; r < 2 * i + 3; ++r)
                         for (int64_t c = 2 * j; c < 2 * j + 3; ++c)
                           s += h[0].v[n * 35 + r * 7 + c];
                       y.v[n * 6 + i * 3 + j] = s / 9;
                     }
                 return y;
               },
               1e-6});

  c.push_back(
      {"batch_norm_training",
       {F({4, 3, 2, 3}), F({3}), F({3})},
       [](auto& x) { return batch_norm(x[0], x[1], x[2], Array(), Array(), {.training = true}).y; },
       [](auto& h) { return ref_channel_norm(h[0], 1, &h[1], &h[2], nullptr, nullptr, 1e-5); },
       1e-5});
  c.push_back(
      {"batch_norm_eval_channels_last",
       {F({2, 3, 2, 4}), F({4}), F({4}), F({4}), F({4}, 0.5, 2)},
       [](auto& x) {
         return batch_norm(x[0], x[1], x[2], x[3], x[4], {.eps = 1e-3, .channels_last = true}).y;
       },
       [](auto& h) { return ref_channel_norm(h[0], 3, &h[1], &h[2], &h[3], &h[4], 1e-3); },
       1e-5});
  c.push_back({"group_norm",
               {F({2, 6, 2, 3}), F({6}), F({6})},
               [](auto& x) { return group_norm(x[0], 3, x[1], x[2], 1e-5); },
               [](auto& h) {
                 // Each (sample, group of 2 channels) is a row of 12 values: a channel of
                 // a [6, 12] array to ref_channel_norm.
                 Host y = ref_channel_norm(Host{{6, 12}, h[0].v}, 0, nullptr, nullptr, nullptr,
                                           nullptr, 1e-5);
                 y.shape = h[0].shape;
                 for (int64_t i = 0; i < y.size(); ++i) {
                   const int64_t ch = i / 6 % 6;
                   y.v[i] = y.v[i] * h[1].v[ch] + h[2].v[ch];
                 }
                 return y;
               },
               1e-5});

  c.push_back({"min_axes",
               {F({3, 4, 5})},
               [](auto& x) {
                 return min(x[0], {0, 2});
               },
               [](auto& h) {
                 Host y{{4}, std::vector<double>(4, INFINITY)};
                 for (int64_t i = 0; i < 60; ++i)
                   y.v[i / 5 % 4] = std::min(y.v[i / 5 % 4], h[0].v[i]);
                 return y;
               }});
  c.push_back({"pad_value_and_crop",
               {F({2, 3, 4})},
               [](auto& x) {
                 return pad(x[0], {{1, 2}, {-1, 1}}, 0.5);
               },
               [](auto& h) {
                 // (2, 3, 4) -> (2, 1 + 3 + 2, 4 - 1 + 1)
                 Host y{{2, 6, 4}, std::vector<double>(48, 0.5)};
                 for (int64_t a = 0; a < 2; ++a)
                   for (int64_t b = 0; b < 3; ++b)
                     for (int64_t c = 1; c < 4; ++c)
                       y.v[(a * 6 + b + 1) * 4 + c - 1] = h[0].v[(a * 3 + b) * 4 + c];
                 return y;
               }});

  // non-contiguous inputs: the result of a transpose feeding other primitives
  c.push_back({"add_after_transpose",
               {F({4, 3}), F({4})},
               [](auto& x) { return transpose(x[0]) + x[1]; },
               [](auto& h) {
                 return ref_map({ref_transpose(h[0], {1, 0}), h[1]},
                                [](const double* a) { return a[0] + a[1]; });
               }});
  c.push_back({"layer_norm_after_transpose",
               {F({8, 3})},
               [](auto& x) { return layer_norm(transpose(x[0]), 1e-5); },
               [](auto& h) {
                 return ref_layer_norm(ref_transpose(h[0], {1, 0}), nullptr, nullptr, 1e-5);
               },
               1e-5});
  c.push_back({"matmul_after_transpose",
               {F({2, 4, 3}), F({4, 5})},
               [](auto& x) { return matmul(swapaxes(x[0], 1, 2), x[1]); },
               [](auto& h) {
                 return ref_matmul(ref_transpose(h[0], {0, 2, 1}), h[1], false, false);
               },
               1e-5});
  c.push_back({"sum_after_transpose",
               {F({3, 4, 5})},
               [](auto& x) {
                 return sum(transpose(x[0], {1, 2, 0}), {0, 2});
               },
               [](auto& h) {
                 return ref_reduce(ref_transpose(h[0], {1, 2, 0}), {0, 2}, false, RefReduce::Sum);
               }});

  // large shapes split across threads (forward, f32)
  auto large = [&](Case k) {
    k.large = true;
    k.grad = false;
    c.push_back(std::move(k));
  };
  large({"large_add_broadcast",
         {F({1024, 1031}), F({1031})},
         [](auto& x) { return x[0] + x[1]; },
         [](auto& h) { return binary_ref(h, [](double a, double b) { return a + b; }); }});
  large({"large_gelu",
         {F({3, 1000, 1000}, -5, 5)},
         [](auto& x) { return gelu(x[0]); },
         [](auto& h) { return unary_ref(h, gelu_ref); }});
  large({"large_exp",
         {F({2100000}, -20, 20)},
         [](auto& x) { return exp(x[0]); },
         [](auto& h) { return unary_ref(h, [](double x) { return std::exp(x); }); },
         3e-7});
  large({"large_sum_rows",
         {F({4096, 700})},
         [](auto& x) { return sum(x[0], {1}); },
         [](auto& h) { return ref_reduce(h[0], {1}, false, RefReduce::Sum); },
         1e-5});
  large({"large_sum_cols",
         {F({700, 4096})},
         [](auto& x) { return sum(x[0], {0}); },
         [](auto& h) { return ref_reduce(h[0], {0}, false, RefReduce::Sum); },
         1e-5});
  large({"large_softmax",
         {F({512, 1000}, -10, 10)},
         [](auto& x) { return softmax(x[0]); },
         [](auto& h) { return ref_softmax(h[0], -1, false); }});
  large({"large_layer_norm",
         {F({2048, 768}), F({768}), F({768})},
         [](auto& x) { return layer_norm(x[0], x[1], x[2], 1e-12); },
         [](auto& h) { return ref_layer_norm(h[0], &h[1], &h[2], 1e-12); },
         1e-5});
  large({"large_attention",
         {F({3, 50, 3, 4, 16})},
         [](auto& x) { return attention(x[0], 0.25); },
         [](auto& h) { return ref_attention(h[0], 0.25); },
         1e-5});
  large({"large_sdpa_causal",
         {F({2, 70, 3, 16}), F({2, 90, 3, 16}), F({2, 90, 3, 16})},
         [](auto& x) { return attention(x[0], x[1], x[2], {.causal = true}); },
         [](auto& h) { return ref_sdpa(h[0], h[1], h[2], 0.25, true); },
         1e-5});
  large({"large_layer_norm_param_grad",
         {F({1000, 96}), F({1000, 96})},
         [](auto& x) { return layer_norm_param_grad(x[0], x[1], 1e-12); },
         [](auto& h) { return ref_layer_norm_param_grad(h[0], h[1], 1e-12); },
         1e-5});
  large({"large_transpose",
         {F({1000, 1500})},
         [](auto& x) { return transpose(x[0]); },
         [](auto& h) {
           return ref_transpose(h[0], {1, 0});
         },
         0});
  large({"large_matmul_batched",
         {F({24, 197, 64}), F({24, 197, 64})},
         [](auto& x) {
           return matmul(x[0], x[1], {false, true, std::nullopt});
         },
         [](auto& h) { return ref_matmul(h[0], h[1], false, true); },
         2e-5});
  return c;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class OpTable : public ::testing::TestWithParam<Case> {};

TEST_P(OpTable, ForwardMatchesReference) {
  const Case& c = GetParam();
  std::mt19937 rng(1234);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  if (!c.large) {
    Host got = to_host(c.fn(arrays(c, hs, DType::f64)));
    expect_close(got, c.ref(hs), 1e-9, c.name + " (f64)");
  }
  auto hs32 = rounded(c, hs);
  Host got32 = to_host(c.fn(arrays(c, hs32, DType::f32)));
  expect_close(got32, c.ref(hs32), c.f32_tol, c.name + " (f32)");
}

TEST_P(OpTable, LazyEqualsEager) {
  const Case& c = GetParam();
  std::mt19937 rng(99);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  auto ins = arrays(c, hs, DType::f32);
  Array eager = c.fn(ins);
  Array lazy;
  {
    LazyScope scope;
    lazy = c.fn(ins);
  }
  if (lazy.has_primitive()) {
    EXPECT_FALSE(lazy.is_materialized()) << "a lazy op ran before eval()";
  }
  lazy.eval();
  EXPECT_EQ(lazy.to_vector<float>(), eager.to_vector<float>()) << c.name;
}

// Only the differentiable cases (the others have no VJP to check).
class OpTableGrad : public ::testing::TestWithParam<Case> {};

TEST_P(OpTableGrad, VjpMatchesFiniteDifferences) {
  const Case& c = GetParam();
  std::mt19937 rng(7);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  auto ins = arrays(c, hs, DType::f64);
  Array out = c.fn(ins);
  Host r{out.shape(), std::vector<double>(out.size())};
  std::normal_distribution<double> nd;
  for (auto& x : r.v) x = nd(rng);
  Array ct = from_host(r, DType::f64);
  auto [outs, grads] =
      vjp([&](const std::vector<Array>& x) { return std::vector<Array>{c.fn(x)}; }, ins, {ct});
  auto objective = [&](const std::vector<Host>& h) {
    Host o = to_host(c.fn(arrays(c, h, DType::f64)));
    double s = 0;
    for (size_t i = 0; i < o.v.size(); ++i) s += o.v[i] * r.v[i];
    return s;
  };
  const double eps = 1e-6;
  for (size_t k = 0; k < hs.size(); ++k) {
    if (c.inputs[k].kind != Input::Float) continue;
    Host g = to_host(grads[k]);
    ASSERT_EQ(str(g.shape), str(hs[k].shape)) << c.name << " input " << k;
    for (int64_t i = 0; i < hs[k].size(); ++i) {
      auto plus = hs, minus = hs;
      plus[k].v[i] += eps;
      minus[k].v[i] -= eps;
      double numeric = (objective(plus) - objective(minus)) / (2 * eps);
      EXPECT_NEAR(g.v[i], numeric, 1e-6 + 1e-5 * std::fabs(numeric))
          << c.name << ": d/d input " << k << " at flat index " << i;
    }
  }
}

// Max propagates NaN and gives -inf for a slice of -infs (as NumPy, JAX and
// PyTorch), along rows and columns, on the cpu and on ref, eager and jit.
TEST(Reduce, MaxPropagatesNanAndKeepsMinusInfinity) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  // Rows of 11 (past the row kernel's 8 accumulators): a NaN, all -inf, plain.
  std::vector<float> v(33, -inf);
  for (int k = 0; k < 11; ++k) v[k] = static_cast<float>(k), v[22 + k] = static_cast<float>(-k);
  v[5] = nan;
  Array x = Array::from_vector(v, {3, 11});
  for (Device d : {Device::cpu(), Device::ref()}) {
    auto f = [](const std::vector<Array>& a) {
      return std::vector<Array>{max(a[0], {1}), max(transpose(a[0]), {0})};
    };
    for (const auto& outs : {f({x.to(d)}), jit(f)({x.to(d)})})
      for (const Array& m : outs) {
        auto r = m.to_vector<float>();
        EXPECT_TRUE(std::isnan(r[0])) << d.str();
        EXPECT_EQ(r[1], -inf) << d.str();
        EXPECT_EQ(r[2], 0.0f) << d.str();
      }
  }
}

// Argmax along rows gives the first of equal maxima and the first NaN (as
// NumPy), within a block of the cpu's row kernel and across blocks, in rows
// of all -inf and rows of one element; in f32, bf16 and i32, on the cpu and
// on ref, eager and jit, against a scan on the host.
TEST(Reduce, ArgmaxFindsTheFirstMaximumAndTheFirstNan) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const int64_t n = 1000;
  std::vector<std::vector<float>> rows;
  std::vector<float> r(n);
  for (int64_t i = 0; i < n; ++i) r[i] = static_cast<float>((i * 37) % 101);  // max 100, repeated
  rows.push_back(r);
  r.assign(n, 1.0f);
  r[700] = 2.0f, r[701] = 2.0f, r[5] = 2.0f;  // the first of equals, blocks apart
  rows.push_back(r);
  r[900] = nan, r[950] = nan;  // a NaN after the maximum wins
  rows.push_back(r);
  r.assign(n, 0.0f);
  r[3] = nan, r[999] = 7.0f;
  rows.push_back(r);
  for (int64_t i = 0; i < n; ++i) r[i] = -static_cast<float>(i);  // decreasing: 0
  rows.push_back(r);
  r.assign(n, -1.0f);
  r[n - 1] = 0.0f;  // the last element of a partial block
  rows.push_back(r);
  r.assign(n, -inf);
  rows.push_back(r);  // all -inf: 0 (clang's max reduction starts above -inf), the last row
  // i32 rows: NaN as 0 and -inf as -10^9 (a float with no i32 value is
  // undefined to convert).
  const int64_t nrows = static_cast<int64_t>(rows.size());
  std::vector<float> all, ints;
  for (auto& row : rows)
    for (float v : row) {
      all.push_back(v);
      ints.push_back(std::isnan(v) ? 0.0f : std::isinf(v) ? -1e9f : v);
    }
  auto first_max = [&](const std::vector<float>& flat) {
    std::vector<int32_t> want;
    for (int64_t k = 0; k < nrows; ++k) {
      const float* row = flat.data() + k * n;
      int32_t best = 0;
      for (int64_t i = 1; i < n; ++i)
        if (!std::isnan(row[best]) && (std::isnan(row[i]) || row[i] > row[best])) best = i;
      want.push_back(best);
    }
    return want;
  };
  auto f = [](const std::vector<Array>& a) { return std::vector<Array>{argmax(a[0], 1)}; };
  for (Device d : {Device::cpu(), Device::ref()})
    for (DType dt : {DType::f32, DType::bf16, DType::i32}) {
      const std::vector<float>& flat = dt == DType::i32 ? ints : all;
      const std::vector<int32_t> want = first_max(flat);
      Array xd = astype(Array::from_vector(flat, {nrows, n}), dt).to(d);
      for (const auto& out : {f({xd}), jit(f)({xd})})
        EXPECT_EQ(astype(out[0], DType::i32).to_vector<int32_t>(), want)
            << d.str() << " " << name_of(dt);
    }
  // One element per row, and one row of 3 elements: index 0, 1.
  EXPECT_EQ(argmax(Array::from_vector<float>({4, 5}, {2, 1}), 1).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(argmax(Array::from_vector<float>({1, 3, 2}, {1, 3}), 1).to_vector<int32_t>(),
            (std::vector<int32_t>{1}));
}

// Column sums (bias gradients) split their columns by the thread count;
// each column is still summed in row order, so the bits do not change with
// it, in the Sum kernel and in a fused reduction with prologue and epilogue.
TEST(Reduce, ColumnSumsDoNotDependOnTheThreadCount) {
  Array x = random::normal(random::Key(3), {1000, 200}), b = random::normal(random::Key(4), {200});
  auto f = [](const std::vector<Array>& a) {
    return std::vector<Array>{sum(a[0], {0}), a[1] - sum(a[0] * 2.0, {0}) * 0.5};
  };
  const int saved = num_threads();
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const Array& r : f({x, b})) runs.push_back(r.to_vector<float>());
    for (const Array& r : jit(f)({x, b})) runs.push_back(r.to_vector<float>());
  }
  set_num_threads(saved);
  for (size_t i = 4; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[i % 4]) << "run " << i;
}

// Concatenation splits the output's bytes over the threads, a range across
// the inputs' pieces and rows: along the first axis (one row, the qkv
// weights' [1152, 384] from three [384, 384]) and along an inner axis of
// uneven pieces, on 1, 2 and 3 threads, against the pieces copied on the host.
TEST(Layout, ConcatenationSplitsItsBytesOverTheThreads) {
  struct Case {
    std::vector<Shape> shapes;
    int axis;
  } cases[] = {{{{384, 384}, {384, 384}, {384, 384}}, 0},
               {{{50, 3, 70}, {50, 0, 70}, {50, 11, 70}, {50, 1, 70}}, 1}};
  uint32_t seed = 40;
  const int saved = num_threads();
  for (const Case& c : cases) {
    std::vector<Array> xs;
    std::vector<std::vector<float>> host;
    for (const Shape& sh : c.shapes) {
      xs.push_back(random::normal(random::Key(seed++), sh));
      host.push_back(xs.back().to_vector<float>());
    }
    // The expected bytes: for each outer index, each input's piece in turn.
    int64_t outer = 1;
    for (int i = 0; i < c.axis; ++i) outer *= c.shapes[0][i];
    std::vector<float> want;
    for (int64_t o = 0; o < outer; ++o)
      for (const auto& h : host) {
        const int64_t piece = static_cast<int64_t>(h.size()) / outer;
        want.insert(want.end(), h.begin() + o * piece, h.begin() + (o + 1) * piece);
      }
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      EXPECT_EQ(concatenate(xs, c.axis).to_vector<float>(), want)
          << "axis " << c.axis << ", " << threads << " threads";
    }
  }
  set_num_threads(saved);
}

// The ops a case's function runs, and those its gradient runs (traced, not
// run; the gradient only for differentiable cases).
// A case's inputs in f64 (seed 5), for the tests that trace its graph.
std::vector<Array> f64_inputs(const Case& c) {
  std::mt19937 rng(5);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  return arrays(c, hs, DType::f64);
}

std::pair<std::set<Op>, std::set<Op>> ops_of(const Case& c) {
  auto ins = f64_inputs(c);
  auto ops_in = [](const std::vector<Array>& outs) {
    std::vector<Array> leaves;
    std::set<Op> ops;
    for (const auto& n : compiler::capture(outs, leaves).nodes)
      if (n.prim) ops.insert(n.prim->op());
    return ops;
  };
  LazyScope scope;
  Array out = c.fn(ins);
  std::set<Op> forward = ops_in({out}), backward;
  if (c.grad) {
    auto [outs, grads] =
        vjp([&](const std::vector<Array>& x) { return std::vector<Array>{c.fn(x)}; }, ins,
            {ones_like(out)});
    std::vector<Array> defined;
    for (auto& g : grads)
      if (g.valid()) defined.push_back(g);
    if (!defined.empty()) backward = ops_in(defined);
  }
  return {forward, backward};
}

// Every primitive's values are checked by the table: against the reference
// (a case runs it) or against finite differences (an FD-checked case's
// gradient runs it, as the VJP of LayerNorm runs LayerNormGrad). And every
// primitive with a VJP rule is differentiated by a finite-difference case. A
// new primitive without cases fails here. Exempt: the fusion passes' ops
// (made by the compiler after differentiation, checked against the unfused
// graph in the compiler tests) and the random source; from the gradient
// check, ops without a gradient (comparisons, argmax, one-hot), the
// backward-only ops (no second order), and Cast and StopGradient, whose VJPs
// finite differences cannot check (an f32 round trip swamps the step; a
// stopped gradient is zero by definition): tests/transforms/autodiff_test.cpp
// checks those two. Fill is exempt too: the creation functions run it at once
// and it is never recorded in a graph (RefBackend.FillMatchesCpu checks it on
// both backends; every test's inputs are made by it). So are the collectives,
// which average gradients after differentiation and have no VJP:
// tests/dist/collectives_test.cpp checks them on cpu and ref in every mode,
// tests/dist/mpi_test.cpp across ranks.
TEST(OpTableCoverage, EveryPrimitiveIsChecked) {
  const std::set<Op> no_grad_check{
      Op::Equal,         Op::NotEqual,       Op::Less,
      Op::LessEqual,     Op::Greater,        Op::GreaterEqual,
      Op::Argmax,        Op::OneHot,         Op::Argsort,
      Op::Cast,          Op::StopGradient,   Op::GeluGrad,
      Op::GeluTanhGrad,  Op::LayerNormGrad,  Op::LayerNormParamGrad,
      Op::AttentionGrad, Op::SdpaGrad,       Op::SoftmaxCrossEntropyGrad,
      Op::ConvGradInput, Op::ConvGradWeight, Op::PoolGrad};
  const std::set<Op> compiler_made{Op::FusedElementwise, Op::MatmulEpilogue, Op::FusedReduce};
  std::set<Op> checked, differentiated;
  for (const Case& c : cases()) {
    auto [forward, backward] = ops_of(c);
    checked.insert(forward.begin(), forward.end());
    if (!c.grad) continue;
    differentiated.insert(forward.begin(), forward.end());
    checked.insert(backward.begin(), backward.end());
  }
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    if (compiler_made.count(op) || op == Op::Random || op == Op::Fill ||
        op_kind(op) == OpKind::Collective)
      continue;
    EXPECT_TRUE(checked.count(op)) << op_name(op) << " is checked by no case of the op table";
    if (!no_grad_check.count(op)) {
      EXPECT_TRUE(differentiated.count(op))
          << op_name(op) << " has no finite-difference gradient case";
    }
  }
}

// ---- the reference backend against the cpu backend ----
// Every case runs on the cpu backend and on the ref backend (the same inputs
// moved with to(Device::ref())): forward in f64 and f32, under jit (which
// must give eager ref's bits), and every VJP in f64. The ref backend computes
// each primitive in plain f64 loops, so this checks every cpu kernel
// (threads, libraries, vector math) against a second implementation on the
// same inputs, and the ref kernels with it.

std::vector<Array> moved(const std::vector<Array>& xs, Device d) {
  std::vector<Array> out;
  for (const Array& x : xs) out.push_back(x.to(d));
  return out;
}

bool on_ref(const Array& a) {
  return a.device() == Device::ref();
}

TEST_P(OpTable, RefBackendMatchesCpu) {
  const Case& c = GetParam();
  std::mt19937 rng(4321);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  auto check = [&](const std::vector<Host>& h, DType fdt, double tol, const char* what) {
    auto ins = arrays(c, h, fdt);
    Array cpu = c.fn(ins);
    Array ref = c.fn(moved(ins, Device::ref()));
    EXPECT_TRUE(on_ref(ref)) << c.name << ": result on " << ref.device().str();
    EXPECT_EQ(ref.dtype(), cpu.dtype()) << c.name;
    expect_close(to_host(ref), to_host(cpu), tol, c.name + what);
  };
  if (!c.large) check(hs, DType::f64, 1e-9, " (f64, ref vs cpu)");
  check(rounded(c, hs), DType::f32, c.f32_tol, " (f32, ref vs cpu)");
}

TEST_P(OpTable, RefJitEqualsEager) {
  const Case& c = GetParam();
  if (c.large) GTEST_SKIP() << "forward-only thread-splitting case";
  std::mt19937 rng(77);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  for (DType fdt : {DType::f64, DType::f32}) {
    auto ins = moved(arrays(c, fdt == DType::f32 ? rounded(c, hs) : hs, fdt), Device::ref());
    Array eager = c.fn(ins);
    auto compiled = jit([&](const std::vector<Array>& x) { return std::vector<Array>{c.fn(x)}; });
    std::vector<Array> got = compiled(ins);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(on_ref(got[0])) << c.name << ": jit result on " << got[0].device().str();
    // Bit for bit (tolerance 0): the ref backend's fused kernels round every
    // intermediate as the unfused ops store it.
    const std::string what = c.name + " (" + name_of(fdt) + ", ref jit vs eager)";
    expect_close(to_host(got[0]), to_host(eager), 0, what);
    // A second call replays the compiled executable.
    expect_close(to_host(compiled(ins)[0]), to_host(eager), 0, what + ", replayed");
  }
}

// A VJP's arguments for case c in f64, on the cpu: its inputs, then a normal
// cotangent of its output's shape (both drawn from `seed`).
std::vector<Array> vjp_args(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  std::vector<Array> args = arrays(c, hs, DType::f64);
  Host r{c.fn(args).shape(), {}};
  std::normal_distribution<double> nd;
  for (int64_t i = 0; i < r.size(); ++i) r.v.push_back(nd(rng));
  args.push_back(from_host(r, DType::f64));
  return args;
}

// (inputs..., cotangent) -> (output, the float inputs' cotangents).
VectorFn vjp_fn(const Case& c) {
  return [&c](const std::vector<Array>& a) {
    std::vector<Array> x(a.begin(), a.end() - 1);
    auto [outs, grads] = vjp(
        [&](const std::vector<Array>& y) { return std::vector<Array>{c.fn(y)}; }, x, {a.back()});
    std::vector<Array> result{outs[0]};
    for (size_t k = 0; k < grads.size(); ++k)
      if (c.inputs[k].kind == Input::Float && grads[k].valid()) result.push_back(grads[k]);
    return result;
  };
}

TEST_P(OpTableGrad, RefVjpMatchesCpu) {
  const Case& c = GetParam();
  const std::vector<Array> args = vjp_args(c, 8);
  auto run = [&](Device d) {
    std::vector<Array> ins = moved(args, d);
    const Array cotangent = ins.back();
    ins.pop_back();
    return vjp([&](const std::vector<Array>& x) { return std::vector<Array>{c.fn(x)}; }, ins,
               {cotangent});
  };
  auto [cpu_out, cpu_grads] = run(Device::cpu());
  auto [ref_out, ref_grads] = run(Device::ref());
  expect_close(to_host(ref_out[0]), to_host(cpu_out[0]), 1e-9, c.name + " (vjp output)");
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    if (c.inputs[k].kind != Input::Float) continue;
    ASSERT_EQ(ref_grads[k].valid(), cpu_grads[k].valid()) << c.name << " input " << k;
    if (!cpu_grads[k].valid()) continue;
    EXPECT_TRUE(on_ref(ref_grads[k]))
        << c.name << ": gradient " << k << " on " << ref_grads[k].device().str();
    expect_close(to_host(ref_grads[k]), to_host(cpu_grads[k]), 1e-9,
                 c.name + ": d/d input " + std::to_string(k) + " (ref vs cpu)");
  }
}

// The whole VJP (forward and backward) compiled with jit on ref: the same
// values as on the cpu, compiled likewise, in f64.
TEST_P(OpTableGrad, RefJitVjpMatchesCpu) {
  const Case& c = GetParam();
  const std::vector<Array> args = vjp_args(c, 9);
  auto run = [&](Device d) { return jit(vjp_fn(c))(moved(args, d)); };
  auto cpu = run(Device::cpu()), ref = run(Device::ref());
  ASSERT_EQ(ref.size(), cpu.size()) << c.name;
  for (size_t k = 0; k < cpu.size(); ++k) {
    EXPECT_TRUE(on_ref(ref[k])) << c.name << ": result " << k;
    expect_close(to_host(ref[k]), to_host(cpu[k]), 1e-9,
                 c.name + ": jitted vjp result " + std::to_string(k) + " (ref vs cpu)");
  }
}

// The compiler's fused primitives on `device` (FusedElementwise, FusedReduce
// with and without an epilogue, MatmulEpilogue batched and not, with each
// kind of operand read): the device's compiler makes them, and jit there
// equals eager there and jit on the cpu.
void check_fused_primitives_on(Device device) {
  auto f = [](const std::vector<Array>& x) {
    return std::vector<Array>{x[4] * matmul(x[0], x[1]) + x[2] + x[3],   // MatmulEpilogue
                              gelu(matmul(x[5], x[6]) + x[2]),           // batched, a Row operand
                              x[2] - sum(x[3] * x[7] * 2.0, {0}) * 0.5,  // FusedReduce + epilogue
                              tanh(x[3]) * x[7] + 1.0,                   // FusedElementwise
                              sum(exp(x[3] - x[2]), {1})};               // FusedReduce, row sums
  };
  const std::vector<Shape> shapes{{6, 8}, {8, 5}, {5}, {6, 5}, {}, {2, 6, 8}, {2, 8, 5}, {6, 5}};
  std::vector<Array> cpu;
  for (size_t i = 0; i < shapes.size(); ++i)
    cpu.push_back(random::normal(random::Key(40 + i), shapes[i]));
  const std::vector<Array> on = moved(cpu, device);
  {
    LazyScope scope;
    std::vector<Array> leaves;
    compiler::Graph g = compiler::optimize(compiler::capture(f(on), leaves), {});
    std::set<Op> ops;
    for (const auto& node : g.nodes) {
      EXPECT_TRUE(node.device == device) << node.device.str();
      if (node.prim) ops.insert(node.prim->op());
    }
    for (Op op : {Op::FusedElementwise, Op::FusedReduce, Op::MatmulEpilogue})
      EXPECT_TRUE(ops.count(op)) << op_name(op) << " not made on " << device.str();
  }
  const std::vector<Array> eager = f(on), jit_on = jit(f)(on), jit_cpu = jit(f)(cpu);
  for (size_t o = 0; o < eager.size(); ++o) {
    EXPECT_EQ(jit_on[o].device(), device);
    expect_close(to_host(jit_on[o]), to_host(eager[o]), 1e-5, "output " + std::to_string(o));
    expect_close(to_host(jit_on[o]), to_host(jit_cpu[o]), 1e-5, "output " + std::to_string(o));
  }
}

TEST(RefBackend, FusedPrimitivesMatchCpu) {
  check_fused_primitives_on(Device::ref());
}

// A bf16 unary op is the f32 op on the widened values, rounded once: the
// cpu kernel widens blocks of 512 values, so lengths that end mid-block and
// split over the threads must give exactly that too.
TEST(Elementwise, Bf16UnaryOpsAreTheF32OpsRounded) {
  using F = std::function<Array(const Array&)>;
  const std::vector<std::pair<const char*, F>> ops{
      {"gelu", [](auto& x) { return gelu(x); }},
      {"gelu_tanh", [](auto& x) { return gelu_tanh(x); }},
      {"gelu_grad", [](auto& x) { return gelu_grad(x); }},
      {"exp", [](auto& x) { return exp(x); }},
      {"tanh", [](auto& x) { return tanh(x); }},
      {"erf", [](auto& x) { return erf(x); }},
      {"sqrt_abs", [](auto& x) { return sqrt(abs(x)); }},
      {"neg", [](auto& x) { return neg(x); }}};
  for (int64_t n : {int64_t{1}, int64_t{511}, int64_t{513}, int64_t{70001}}) {
    const Array x = astype(random::normal(random::Key(7), {n}) * 3.0, DType::bf16);
    const Array wide = astype(x, DType::f32);
    for (const auto& [name, f] : ops) {
      SCOPED_TRACE(std::string(name) + " over " + std::to_string(n));
      const Array got = f(x);
      ASSERT_EQ(got.dtype(), DType::bf16);
      const Array want = astype(f(wide), DType::bf16);
      const auto* g = static_cast<const uint16_t*>(got.raw());
      const auto* w = static_cast<const uint16_t*>(want.raw());
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) differ += g[i] != w[i];
      EXPECT_EQ(differ, 0);
    }
  }
}

// f32 exp (exp_approx, the scalar function every f32 kernel and generated
// program uses, and the Exp op on each device): a few ulp from exp over the
// normal range, 0 for results below FLT_MIN (so exp(-inf) = 0: a masked
// softmax entry weighs nothing), inf past FLT_MAX (or from 88.38), NaN kept.
std::vector<float> exp_inputs() {
  std::vector<float> x;
  for (float v = -95.0f; v <= 88.0f; v += 0.0173f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -87.3365f, -87.3366f, -87.0f, -88.0f, -104.0f, -200.0f,
                  -std::numeric_limits<float>::infinity(), 88.3f, 88.4f, 88.7f, 88.8f, 89.0f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  return x;
}

void expect_f32_exp(const std::vector<float>& x, const std::vector<float>& y,
                    const std::string& what) {
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(what + " at x = " + std::to_string(x[i]));
    const double want = std::exp(static_cast<double>(x[i]));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else if (want > std::numeric_limits<float>::max()) {
      EXPECT_EQ(y[i], std::numeric_limits<float>::infinity());
    } else if (x[i] >= 88.38f) {  // 2^128 a little early
      EXPECT_TRUE(y[i] == std::numeric_limits<float>::infinity() ||
                  std::fabs(y[i] - want) <= 5e-7 * want)
          << y[i];
    } else if (want >= std::numeric_limits<float>::min()) {
      EXPECT_NEAR(y[i], want, 5e-7 * want);
    } else {  // below FLT_MIN: 0, or a subnormal near exp (the AVX-512 kernels keep them)
      EXPECT_NEAR(y[i], want, std::numeric_limits<float>::min());
      if (x[i] <= -104.0f) {
        EXPECT_EQ(y[i], 0.0f);
      }
    }
  }
}

TEST(Elementwise, F32ExpIsExpAndZeroAtMinusInfinity) {
  const std::vector<float> x = exp_inputs();
  std::vector<float> scalar(x.size());
  for (size_t i = 0; i < x.size(); ++i) scalar[i] = exp_approx(x[i]);
  expect_f32_exp(x, scalar, "exp_approx");
  const Array xs = Array::from_vector(x, {static_cast<int64_t>(x.size())});
  for (const Device& d : std::vector<Device>{Device::cpu(), Device::ref()})
    expect_f32_exp(x, exp(xs.to(d)).to_vector<float>(), "exp on " + d.str());
}

// f32 GELU in its tanh form (GPT-2's gelu_new) and its derivative, as every
// f32 kernel and generated program computes them (scalar_math.h: x·σ(2u)
// from exp_nonpositive), against f64 in the same form, x / (1 + exp(-2u)),
// which keeps the left tail's digits (0.5x(1 + tanh u) loses them even in
// f64): within 2-3e-7 of the value's size, within 2e-5 relatively down to
// x = -9, and the CPU's GeluTanh op the same. (The form with tanh had 1e-6
// in the derivative near x = 5.)
TEST(Elementwise, F32GeluTanhIsWithinItsBounds) {
  std::vector<float> xs;
  for (float x = -12.0f; x <= 12.0f; x += 0.00037f) xs.push_back(x);
  double worst = 0, worst_grad = 0, worst_tail = 0;
  for (float x : xs) {
    const double xd = x, c = std::sqrt(2.0 / M_PI);
    const double u = c * (xd + 0.044715 * xd * xd * xd), du = c * (1 + 3 * 0.044715 * xd * xd);
    const double e = std::exp(-2 * std::fabs(u)), sg = u >= 0 ? 1 / (1 + e) : e / (1 + e);
    const double cg = u >= 0 ? e / (1 + e) : 1 / (1 + e);
    const double want = xd * sg, want_grad = sg + 2 * xd * sg * cg * du;
    const double err = std::fabs(gelu_tanh<float>(x) - want) / std::max(1.0, std::fabs(want));
    const double err_grad =
        std::fabs(gelu_tanh_grad<float>(x) - want_grad) / std::max(1.0, std::fabs(want_grad));
    worst = std::max(worst, err);
    worst_grad = std::max(worst_grad, err_grad);
    if (x >= -9.0f && x < -1.0f)
      worst_tail = std::max(worst_tail, std::fabs(gelu_tanh<float>(x) - want) / std::fabs(want));
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_LT(worst_grad, 3e-7);
  EXPECT_LT(worst_tail, 2e-5);
  const Array a = Array::from_vector(xs, {static_cast<int64_t>(xs.size())});
  const auto on_cpu = gelu_tanh(a).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(on_cpu[i], gelu_tanh<float>(xs[i])) << "at x = " << xs[i];
  std::printf("gelu_tanh f32: %.3g, derivative %.3g, left tail %.3g\n", worst, worst_grad,
              worst_tail);
}

TEST(Elementwise, GpuF32ExpIsExpAndZeroAtMinusInfinity) {
  KILN_REQUIRE_GPU();
  const std::vector<float> x = exp_inputs();
  const Array xs = Array::from_vector(x, {static_cast<int64_t>(x.size())});
  expect_f32_exp(x, exp(xs.to(test_gpu())).to_vector<float>(), "exp on the gpu");
}

// Casts between f32 and bf16 (the cpu Cast kernel, split over the threads)
// give bf16's own rounding bit for bit: to nearest even, NaN kept quiet,
// infinities and subnormals kept; and bf16 -> f32 is exact. Lengths with odd
// tails.
TEST(Elementwise, F32Bf16CastsRoundAsTheBf16Type) {
  std::vector<uint32_t> bits{0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                             0xffc00001u, 0x7f800001u, 0x7f7fffffu, 0x00000001u, 0x807fffffu,
                             0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7f8000u};
  for (uint64_t i = 0; bits.size() < 70001; i += 61357) bits.push_back(static_cast<uint32_t>(i));
  std::vector<float> v(bits.size());
  std::memcpy(v.data(), bits.data(), bits.size() * 4);
  for (size_t n : {size_t{14}, size_t{1000}, bits.size()}) {
    SCOPED_TRACE(n);
    const Array x =
        Array::from_vector(std::vector<float>(v.begin(), v.begin() + n), {static_cast<int64_t>(n)});
    const Array y = astype(x, DType::bf16);
    const auto* got = static_cast<const uint16_t*>(y.raw());
    int64_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += got[i] != bf16(v[i]).bits;
    EXPECT_EQ(differ, 0);
    const std::vector<float> back = astype(y, DType::f32).to_vector<float>();
    differ = 0;
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(bf16(v[i]));
      differ += std::memcmp(&back[i], &want, 4) != 0;
    }
    EXPECT_EQ(differ, 0);
  }
}

// The dtypes the table does not run: integer arithmetic (exact, integer
// division truncating), integer reductions and layout ops, and bf16 (within
// one bf16 rounding of the cpu's f32 math).
TEST(RefBackend, IntegerAndBf16MatchCpu) {
  using F1 = std::function<Array(const Array&, const Array&)>;
  const std::vector<std::pair<const char*, F1>> int_ops{
      {"add", [](auto& a, auto& b) { return a + b; }},
      {"sub", [](auto& a, auto& b) { return a - b; }},
      {"mul", [](auto& a, auto& b) { return a * b; }},
      {"div", [](auto& a, auto& b) { return divide(a, abs(b) + 1); }},
      {"div_negative", [](auto& a, auto& b) { return divide(a, neg(abs(b) + 1)); }},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); }},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); }},
      {"neg_relu_abs", [](auto& a, auto& b) { return neg(a) + relu(b) * abs(a); }},
      {"relu_grad", [](auto& a, auto& b) { return relu_grad(a, b); }},
      {"compare", [](auto& a, auto& b) { return astype(less(a, b), a.dtype()); }},
      {"where", [](auto& a, auto& b) { return where(greater_equal(a, b), a, b); }},
      {"sum", [](auto& a, auto&) { return sum(a, {0}); }},
      {"sum_bool", [](auto& a, auto& b) { return sum(equal(a, b)); }},
      {"max", [](auto& a, auto&) { return max(a, {1}); }},
      {"argmax", [](auto& a, auto&) { return argmax(a, 0); }},
      {"cast", [](auto& a, auto&) { return astype(astype(a, DType::f32) * 0.7, a.dtype()); }},
      {"transpose", [](auto& a, auto&) { return transpose(a); }},
      {"concatenate",
       [](auto& a, auto& b) {
         return concatenate({a, b}, 0);
       }},
      {"slice",
       [](auto& a, auto&) {
         return slice(a, {1, 0}, {4, 5}, {2, 2});
       }},
      {"broadcast",
       [](auto& a, auto&) {
         return broadcast_to(slice(a, {0}, {1}), {3, 4, 5});
       }},
      {"take", [](auto& a, auto& b) { return take(a, slice(abs(b), {0}, {1}), 1); }},
      {"one_hot", [](auto& a, auto&) { return one_hot(a, 4, a.dtype()); }},
      {"argsort", [](auto& a, auto&) { return argsort(a, 0, true); }},
      {"sort", [](auto& a, auto&) { return sort(a, -1); }},
  };
  for (DType dt : {DType::i32, DType::i64}) {
    const Array a = astype(random::uniform(random::Key(1), {4, 5}, -9, 9), dt);
    const Array b = astype(random::uniform(random::Key(2), {4, 5}, -4, 4), dt);
    for (const auto& [name, f] : int_ops) {
      SCOPED_TRACE(std::string(name_of(dt)) + " " + name);
      const Array cpu = f(a, b), ref = f(a.to(Device::ref()), b.to(Device::ref()));
      EXPECT_TRUE(on_ref(ref));
      EXPECT_EQ(ref.dtype(), cpu.dtype());
      EXPECT_EQ(ref.to_vector<int64_t>(), cpu.to_vector<int64_t>());
    }
  }
  using F2 = std::function<Array(const std::vector<Array>&)>;
  const std::vector<std::pair<const char*, F2>> bf16_ops{
      {"unary", [](auto& x) { return gelu(x[0]) + exp(x[1]) * tanh(x[0]); }},
      {"matmul_f32_out",
       [](auto& x) {
         return matmul(x[0], x[1], {false, true, DType::f32});
       }},
      {"matmul",
       [](auto& x) {
         return matmul(x[0], x[1], {true, false, std::nullopt});
       }},
      {"sum_max", [](auto& x) { return sum(x[0], {1}) + max(x[1], {1}); }},
      {"softmax", [](auto& x) { return log_softmax(x[0]) + softmax(x[1], 0); }},
      {"layer_norm", [](auto& x) { return layer_norm(x[0], 1e-5); }},
      {"scatter_add",
       [](auto& x) {
         return scatter_add(Array::from_vector<int32_t>({1, 1, 0, 3}, {4}).to(x[0].device()), x[0],
                            0, {5, 6});
       }},
  };
  const Array x0 = astype(random::normal(random::Key(5), {4, 6}), DType::bf16);
  const Array x1 = astype(random::normal(random::Key(6), {4, 6}), DType::bf16);
  for (const auto& [name, f] : bf16_ops) {
    SCOPED_TRACE(std::string("bf16 ") + name);
    const Array cpu = f({x0, x1});
    const Array ref = f(moved({x0, x1}, Device::ref()));
    EXPECT_TRUE(on_ref(ref));
    EXPECT_EQ(ref.dtype(), cpu.dtype());
    expect_close(to_host(ref), to_host(cpu), 2e-2, name);
  }
}

// Every primitive the cpu backend runs has a ref kernel. (The fused
// primitives are asked with empty programs: the cpu backend's `supports`
// reads their attributes.)
TEST(RefBackend, HasAKernelForEveryCpuPrimitive) {
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    Primitive prim = op == Op::FusedElementwise ? Primitive(op, FusedAttrs{})
                     : op == Op::FusedReduce    ? Primitive(op, FusedReduceAttrs{})
                     : op == Op::MatmulEpilogue
                         ? Primitive(op, EpilogueAttrs{MatmulAttrs{false, false, DType::f32}, {}})
                         : Primitive(op);
    const std::vector<DType> f32x2{DType::f32, DType::f32};
    EXPECT_TRUE(backend_supports(Device::cpu(), prim, f32x2, DType::f32))
        << op_name(op) << ": no cpu kernel";
    EXPECT_TRUE(backend_supports(Device::ref(), prim, f32x2, DType::f32))
        << op_name(op) << ": no ref kernel";
  }
}

// Fill (full, arange and what is built on them) on ref equals the cpu's, in
// every dtype, and the array is on ref.
TEST(RefBackend, FillMatchesCpu) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::bool_}) {
    SCOPED_TRACE(name_of(dt));
    std::vector<std::pair<Array, Array>> pairs{
        {full({3, 4}, 2.5, dt, Device::ref()), full({3, 4}, 2.5, dt, Device::cpu())},
        {full({}, -1.75, dt, Device::ref()), full({}, -1.75, dt, Device::cpu())},
        {full({0, 3}, 1, dt, Device::ref()), full({0, 3}, 1, dt, Device::cpu())},
        {arange(-3, 40, 3, dt, Device::ref()), arange(-3, 40, 3, dt, Device::cpu())},
        {arange(7, dt, Device::ref()), arange(7, dt, Device::cpu())},
        {zeros({2, 2}, dt, Device::ref()), zeros({2, 2}, dt, Device::cpu())},
        {ones({5}, dt, Device::ref()), ones({5}, dt, Device::cpu())}};
    for (const auto& [ref, cpu] : pairs) {
      EXPECT_TRUE(on_ref(ref)) << ref.device().str();
      EXPECT_EQ(ref.dtype(), dt);
      EXPECT_EQ(str(ref.shape()), str(cpu.shape()));
      EXPECT_EQ(ref.to_vector<double>(), cpu.to_vector<double>());
    }
  }
}

// Random on ref (the key held in an array on ref) draws the cpu's numbers,
// bit for bit, for every distribution.
TEST(RefBackend, RandomMatchesCpu) {
  const Array key = Array::from_vector<int32_t>({123, -456}, {2});
  struct Draw {
    RandomKind kind;
    double a, b;
    DType dtype;
  };
  for (const Draw& d :
       {Draw{RandomKind::Uniform, -1, 3, DType::f32}, Draw{RandomKind::Normal, 0, 1, DType::f64},
        Draw{RandomKind::TruncatedNormal, -2, 2, DType::f32},
        Draw{RandomKind::Bernoulli, 0.3, 0, DType::bool_},
        Draw{RandomKind::Uniform, 0, 1, DType::bf16}, Draw{RandomKind::Gamma, 0.6, 0, DType::f64},
        Draw{RandomKind::Gamma, 3.5, 0, DType::f32},
        Draw{RandomKind::Randint, -5, 1000, DType::i32}}) {
    auto draw = [&](Device dev) {
      RandomAttrs attrs{{0, 0}, d.kind, d.a, d.b, {7, 5}, d.dtype, true, 9};
      return make_array(Primitive(Op::Random, attrs), {key.to(dev)}, {7, 5}, d.dtype);
    };
    Array ref = draw(Device::ref()), cpu = draw(Device::cpu());
    EXPECT_TRUE(on_ref(ref));
    EXPECT_EQ(ref.to_vector<double>(), cpu.to_vector<double>()) << static_cast<int>(d.kind);
  }
  // Through the public API: bernoulli with a key array.
  EXPECT_EQ(random::bernoulli(key.to(Device::ref()), 3, {4, 9}, 0.5).to_vector<double>(),
            random::bernoulli(key, 3, {4, 9}, 0.5).to_vector<double>());
}

// The ref backend's errors are the cpu backend's: out-of-range indices and
// labels, integer division by zero.
TEST(RefBackend, ErrorsMatchCpu) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const Array x = from_host(Host{{4, 3}, std::vector<double>(12, 1.0)}, DType::f32);
  const Array bad = Array::from_vector<int32_t>({0, 4, 1}, {3});
  const Array zero = Array::from_vector<int32_t>({2, 0}, {2});
  const Array labels = Array::from_vector<int32_t>({0, 1, -1, 2}, {4});
  std::vector<std::function<Array(Device)>> cases{
      [&](Device d) { return take(x.to(d), bad.to(d), 0); },
      [&](Device d) {
        return scatter_add(bad.to(d), slice(x.to(d), {0}, {3}), 0, {4, 3});
      },
      [&](Device d) { return softmax_cross_entropy(x.to(d), labels.to(d)); },
      [&](Device d) { return divide(zero.to(d), zero.to(d)); }};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string cpu = message([&] { cases[i](Device::cpu()).eval(); });
    const std::string ref = message([&] { cases[i](Device::ref()).eval(); });
    EXPECT_NE(cpu, "no error") << "case " << i;
    EXPECT_EQ(ref, cpu) << "case " << i;
  }
}

// Runs fn once per f32 GEMM library kiln was built with (oneMKL where it
// is built in, oneDNN's sgemm always), then restores the default.
template <class F>
void for_each_sgemm_library(F fn) {
  const cpu::SgemmLibrary before = cpu::sgemm_library();
  std::vector<cpu::SgemmLibrary> libs{cpu::SgemmLibrary::onednn};
  if (cpu::have_onemkl()) libs.push_back(cpu::SgemmLibrary::onemkl);
  for (cpu::SgemmLibrary lib : libs) {
    cpu::set_sgemm_library(lib);
    SCOPED_TRACE(cpu::sgemm_library_name());
    fn();
  }
  cpu::set_sgemm_library(before);
}

// Both sgemm libraries against the f64 GEMM (plain loops) for every
// transpose flag, at sizes beyond one block of either library and odd ones,
// with and without a compiled epilogue (bias + residual, a leading scale as
// sgemm's alpha).
TEST(Matmul, F32LibrariesMatchF64) {
  struct Dims {
    int64_t m, k, n;
  };
  const std::vector<Dims> dims{{67, 45, 129}, {300, 384, 200}, {1, 7, 1}, {513, 1031, 17}};
  for_each_sgemm_library([&] {
    uint32_t seed = 300;
    for (const Dims& d : dims)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          SCOPED_TRACE(std::to_string(d.m) + "x" + std::to_string(d.k) + "x" + std::to_string(d.n) +
                       (ta ? " Aᵀ" : "") + (tb ? " Bᵀ" : ""));
          Array a = random::normal(random::Key(seed++), ta ? Shape{d.k, d.m} : Shape{d.m, d.k});
          Array b = random::normal(random::Key(seed++), tb ? Shape{d.n, d.k} : Shape{d.k, d.n});
          Array bias = random::normal(random::Key(seed++), {d.n});
          Array res = random::normal(random::Key(seed++), {d.m, d.n});
          Array scale = full({}, 0.5, DType::f32);
          auto plain = [&](const std::vector<Array>& x) {
            return std::vector<Array>{matmul(x[0], x[1], {ta, tb, x[0].dtype()})};
          };
          auto epilogue = [&](const std::vector<Array>& x) {  // one MatmulEpilogue
            return std::vector<Array>{x[4] * matmul(x[0], x[1], {ta, tb, x[0].dtype()}) + x[2] +
                                      x[3]};
          };
          std::vector<Array> in{a, b, bias, res, scale}, in64;
          for (const Array& x : in) in64.push_back(astype(x, DType::f64));
          {  // the compiled epilogue is one MatmulEpilogue
            LazyScope scope;
            std::vector<Array> leaves;
            compiler::Graph gr = compiler::optimize(compiler::capture(epilogue(in), leaves), {});
            int fused = 0;
            for (const auto& node : gr.nodes)
              fused += node.prim && node.prim->op() == Op::MatmulEpilogue;
            ASSERT_EQ(fused, 1);
          }
          std::vector<Array> got{plain(in)[0], jit(epilogue)(in)[0]};
          std::vector<Array> want{plain(in64)[0], epilogue(in64)[0]};
          for (size_t o = 0; o < got.size(); ++o) {
            auto g = astype(got[o], DType::f64).to_vector<double>();
            auto w = want[o].to_vector<double>();
            ASSERT_EQ(g.size(), w.size());
            const double tol = 1e-6 * std::sqrt(static_cast<double>(d.k)) * 4;
            for (size_t i = 0; i < g.size(); ++i)
              ASSERT_NEAR(g[i], w[i], tol * std::max(1.0, std::fabs(w[i])))
                  << "output " << o << " at flat index " << i;
          }
        }
  });
}

// bf16 GEMMs of 1 to 4 rows (a decode step's) take kiln's own loops, f32
// accumulation: against the f64 GEMM of the same bf16 values, with and
// without a compiled epilogue (a scale, a bias, a residual), f32 and bf16
// results, both layouts of B, and at 5 rows (oneDNN's path) alike.
TEST(Matmul, SmallRowBf16GemmsMatchF64) {
  uint32_t seed = 900;
  for (int64_t m : {1, 2, 4, 5})
    for (int64_t k : {7, 768, 771})
      for (int64_t n : {1, 515, 1030})
        for (bool tb : {false, true})
          for (DType out : {DType::f32, DType::bf16}) {
            SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                         (tb ? " Bᵀ" : "") + " -> " + name_of(out));
            const Array a = astype(random::normal(random::Key(seed++), {1, m, k}), DType::bf16);
            const Array b = astype(
                random::normal(random::Key(seed++), tb ? Shape{n, k} : Shape{k, n}), DType::bf16);
            const Array bias = random::normal(random::Key(seed++), {n});
            const Array res = random::normal(random::Key(seed++), {1, m, n});
            const Array scale = full({}, 0.5, DType::f32);
            auto epilogue = [&](const std::vector<Array>& x) {
              return std::vector<Array>{
                  x[4] * matmul(x[0], x[1],
                                {false, tb, x[0].dtype() == DType::f64 ? DType::f64 : DType::f32}) +
                  x[2] + x[3]};
            };
            const Array plain = matmul(a, b, {false, tb, out});
            const Array fused = jit(epilogue)({a, b, bias, res, scale})[0];
            const Array want_plain =
                matmul(astype(a, DType::f64), astype(b, DType::f64), {false, tb});
            std::vector<Array> in64;
            for (const Array& x : {a, b, bias, res, scale}) in64.push_back(astype(x, DType::f64));
            const Array want_fused = epilogue(in64)[0];
            const double tol = (out == DType::bf16 ? 8e-3 : 1e-6 * std::sqrt(double(k)) * 4);
            for (auto [got, want] : {std::pair{plain, want_plain}, {fused, want_fused}}) {
              auto g = astype(got, DType::f64).to_vector<double>();
              auto w = want.to_vector<double>();
              ASSERT_EQ(g.size(), w.size());
              const double t = got.dtype() == DType::bf16 ? tol : 1e-6 * std::sqrt(double(k)) * 4;
              for (size_t i = 0; i < g.size(); ++i)
                ASSERT_NEAR(g[i], w[i], t * std::max(1.0, std::fabs(w[i]))) << "at " << i;
            }
          }
}

// qkv shapes for the attention kernels against f64: ViT's head dim and token
// count and around them (odd token counts, one token, head dims 16, 24, 32).
const std::vector<Shape> kAttentionShapes{{1, 197, 3, 2, 64}, {2, 37, 3, 3, 64}, {3, 1, 3, 2, 64},
                                          {2, 50, 3, 4, 16},  {1, 7, 3, 1, 32},  {2, 21, 3, 2, 24}};

// The f32 attention kernels (forward and backward, on each sgemm library)
// against the f64 ones (plain loops) at ViT's head dim and token count and
// around them: odd token counts, one token, head dims of 16, 24 and 32. The
// op table's cases are tiny; this is where the f32 backward is checked at
// sizes that split into several GEMM blocks.
TEST(Attention, F32KernelsMatchF64) {
  const std::vector<Shape>& shapes = kAttentionShapes;
  for_each_sgemm_library([&] {
    uint32_t seed = 100;
    for (const Shape& s : shapes) {
      SCOPED_TRACE(str(s));
      Array qkv = random::normal(random::Key(seed++), s);
      Array dout = random::normal(random::Key(seed++), {s[0], s[1], s[3], s[4]});
      const double scale = 1.0 / std::sqrt(static_cast<double>(s[4]));
      Array q64 = astype(qkv, DType::f64), d64 = astype(dout, DType::f64);
      auto compare = [](const Array& got, const Array& want, const char* what) {
        auto g = astype(got, DType::f64).to_vector<double>(), w = want.to_vector<double>();
        ASSERT_EQ(g.size(), w.size());
        double top = 0;
        for (double x : w) top = std::max(top, std::fabs(x));
        for (size_t i = 0; i < g.size(); ++i)
          ASSERT_NEAR(g[i], w[i], 2e-6 * std::max(1.0, top)) << what << " at flat index " << i;
      };
      compare(attention(qkv, scale), attention(q64, scale), "forward");
      compare(attention_grad(qkv, dout, scale), attention_grad(q64, d64, scale), "backward");
    }
  });
}

// The cuda backend's f32 and f64 attention kernels likewise, on every head
// dim they are tiled for (32, 64, 128, 256), with partial row and column
// tiles.
TEST(Attention, GpuF32AndF64KernelsMatchF64) {
  KILN_REQUIRE_GPU();
  std::vector<Shape> shapes = kAttentionShapes;
  shapes.insert(shapes.end(), {{1, 70, 3, 2, 128}, {2, 19, 3, 1, 160}});
  uint32_t seed = 300;
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(name_of(dt)) + " " + str(s));
      Array qkv = random::normal(random::Key(seed++), s);
      Array dout = random::normal(random::Key(seed++), {s[0], s[1], s[3], s[4]});
      const double scale = 1.0 / std::sqrt(static_cast<double>(s[4]));
      Array q64 = astype(qkv, DType::f64), d64 = astype(dout, DType::f64);
      Array q = astype(qkv, dt).to(test_gpu()), d = astype(dout, dt).to(test_gpu());
      const double tol = dt == DType::f32 ? 2e-6 : 1e-12;
      auto compare = [&](const Array& got, const Array& want, const char* what) {
        auto g = astype(got.to(Device::cpu()), DType::f64).to_vector<double>();
        auto w = want.to_vector<double>();
        ASSERT_EQ(g.size(), w.size());
        double top = 0;
        for (double x : w) top = std::max(top, std::fabs(x));
        for (size_t i = 0; i < g.size(); ++i)
          ASSERT_NEAR(g[i], w[i], tol * std::max(1.0, top)) << what << " at flat index " << i;
      };
      compare(attention(q, scale), attention(q64, scale), "forward");
      compare(attention_grad(q, d, scale), attention_grad(q64, d64, scale), "backward");
    }
  }
}

// The bf16 attention kernels of `dev` against f64 on the same bf16 values
// (shapes with at most `max_tokens` tokens): the products are exact and
// summed in f32, so what remains is the rounding of P and dS to bf16 before
// their GEMMs (on the cpu and the cuda tensor-core kernels; the cuda SIMT
// kernels keep them f32) and of the outputs (~2^-9 relative each).
void expect_bf16_attention_matches_f64(Device dev, int64_t max_tokens,
                                       const std::vector<Shape>& shapes = kAttentionShapes) {
  uint32_t seed = 300;
  for (const Shape& s : shapes) {
    if (s[1] > max_tokens) continue;
    SCOPED_TRACE(str(s) + " on " + dev.str());
    Array qkv = astype(random::normal(random::Key(seed++), s), DType::bf16);
    Array dout = astype(random::normal(random::Key(seed++), {s[0], s[1], s[3], s[4]}), DType::bf16);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s[4]));
    Array q64 = astype(qkv, DType::f64), d64 = astype(dout, DType::f64);
    auto compare = [&](const Array& got, const Array& want, const char* what) {
      ASSERT_EQ(got.dtype(), DType::bf16) << what;
      ASSERT_EQ(got.device(), dev) << what;
      auto g = astype(got.to(Device::cpu()), DType::f64).to_vector<double>();
      auto w = want.to_vector<double>();
      ASSERT_EQ(g.size(), w.size());
      double top = 0;
      for (double x : w) top = std::max(top, std::fabs(x));
      for (size_t i = 0; i < g.size(); ++i)
        ASSERT_NEAR(g[i], w[i], 1e-2 * std::max(1.0, top)) << what << " at flat index " << i;
      EXPECT_GT(top, 0.1) << what;  // not vanishing values
    };
    compare(attention(qkv.to(dev), scale), attention(q64, scale), "forward");
    compare(attention_grad(qkv.to(dev), dout.to(dev), scale), attention_grad(q64, d64, scale),
            "backward");
  }
}

// The cpu's bf16 attention: on a CPU with a bf16 unit, head dims that are
// multiples of 32 run on kiln's own tile kernels (tiles.h: AMX or
// AVX512-BF16; the shapes above cover one tile and odd tile counts of
// tokens); the other head dims, and all of them with those kernels turned
// off, on oneMKL's bf16 GEMM; under scripts/test-isa.sh's AVX2 caps, widened
// to f32. The ref backend (f64 loops over the bf16 values) agrees as well.
TEST(Attention, Bf16KernelsMatchF64OnTheRoundedInputs) {
  for (bool tiles : {true, false}) {
    SCOPED_TRACE(tiles ? "kiln's tile kernels where the CPU has a bf16 unit"
                       : "kiln's tile kernels off");
    cpu::set_tile_kernels(tiles);
    expect_bf16_attention_matches_f64(Device::cpu(), std::numeric_limits<int64_t>::max());
  }
  cpu::set_tile_kernels(true);
  expect_bf16_attention_matches_f64(Device::ref(), 37);  // the ref backend's loops are slow
}

// Where oneDNN runs bf16 GEMMs on a bf16 unit (and nothing caps the ISA
// below it), the attention takes kiln's tile kernels on that unit (on AMX
// once Linux grants the tile state): the test above then checks them, not
// only the fallback.
TEST(Attention, TileKernelsRunWhereTheCpuHasABf16Unit) {
  const std::string unit = cpu::bf16_gemm_unit();
  if (unit.empty()) GTEST_SKIP() << "oneDNN runs no bf16 GEMMs on a bf16 unit here";
  EXPECT_EQ(cpu::tile_kernels(), unit);
  cpu::set_tile_kernels(false);
  EXPECT_EQ(cpu::tile_kernels(), "");
  cpu::set_tile_kernels(true);
  EXPECT_EQ(cpu::tile_kernels(), unit);
}

// The cuda backend's bf16 attention likewise, at ViT's token count too, on
// both of its kernels: the SIMT ones (bf16 loads and stores, f32 arithmetic)
// and the tensor-core ones, the default (KILN_CUDA_BF16_ATTENTION=simt or
// tensor-cores chooses; attention_tc.cu: head dims up to 128 padded to 32,
// 64 or 128; wider ones stay on the SIMT kernels).
TEST(Attention, GpuBf16KernelsMatchF64OnTheRoundedInputs) {
  KILN_REQUIRE_GPU();
  std::vector<Shape> shapes = kAttentionShapes;
  shapes.insert(shapes.end(), {{1, 70, 3, 2, 128}, {2, 65, 3, 1, 96}, {1, 9, 3, 1, 160}});
  const char* before = std::getenv("KILN_CUDA_BF16_ATTENTION");
  const std::string saved = before ? before : "";
  for (const char* kernels : {"simt", "tensor-cores"}) {
    SCOPED_TRACE(std::string("KILN_CUDA_BF16_ATTENTION=") + kernels);
    setenv("KILN_CUDA_BF16_ATTENTION", kernels, 1);
    expect_bf16_attention_matches_f64(
        test_gpu(), gpu_tests_on_ref() ? 37 : std::numeric_limits<int64_t>::max(), shapes);
  }
  if (!gpu_tests_on_ref()) {  // a bad value names the variable and what it takes
    setenv("KILN_CUDA_BF16_ATTENTION", "fast", 1);
    Array qkv = astype(random::normal(random::Key(1), {1, 3, 3, 1, 64}), DType::bf16);
    try {
      attention(qkv.to(test_gpu()), 0.125).to(Device::cpu());
      ADD_FAILURE() << "no error for KILN_CUDA_BF16_ATTENTION=fast";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_CUDA_BF16_ATTENTION is 'fast', expected "
                                           "tensor-cores or simt"),
                std::string::npos)
          << e.what();
    }
  }
  if (before) {
    setenv("KILN_CUDA_BF16_ATTENTION", saved.c_str(), 1);
  } else {
    unsetenv("KILN_CUDA_BF16_ATTENTION");
  }
}

// ---- Sdpa: attention(q, k, v, options) at the lengths its kernels take
// apart: ViT's 197 tokens, a causal 256 (whole blocks of keys skipped), a
// KV-cache step (T < S, bottom-right aligned), odd head dims, a bias.
struct SdpaShape {
  int64_t b, t, s, h, d;
  bool causal, bias;
};
const std::vector<SdpaShape> kSdpaShapes{{2, 197, 197, 3, 64, false, false},
                                         {1, 256, 256, 2, 64, true, false},
                                         {2, 5, 70, 2, 32, true, true},
                                         {1, 67, 67, 1, 24, true, true},
                                         {2, 1, 33, 3, 16, true, false}};

// dev's kernels in dt against the ref backend's f64 loops on the same
// (dt-rounded) inputs: forward and the gradients (dq, dk, dv), within tol of
// the largest value.
void expect_sdpa_matches_f64(Device dev, DType dt, double tol,
                             const std::vector<SdpaShape>& shapes) {
  uint32_t seed = 500;
  for (const SdpaShape& c : shapes) {
    SCOPED_TRACE(std::string(name_of(dt)) + " on " + dev.str() + ": B " + std::to_string(c.b) +
                 " T " + std::to_string(c.t) + " S " + std::to_string(c.s) + " H " +
                 std::to_string(c.h) + " D " + std::to_string(c.d) + (c.causal ? " causal" : "") +
                 (c.bias ? " bias" : ""));
    auto input = [&](Shape s) { return astype(random::normal(random::Key(seed++), s), dt); };
    const Array q = input({c.b, c.t, c.h, c.d}), k = input({c.b, c.s, c.h, c.d}),
                v = input({c.b, c.s, c.h, c.d}), dout = input({c.b, c.t, c.h, c.d});
    std::optional<Array> bias;
    if (c.bias) bias = random::normal(random::Key(seed++), {1, c.h, c.t, c.s});
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    auto run = [&](DType t, Device d) {
      auto at = [&](const Array& x) { return astype(x, t).to(d); };
      std::optional<Array> b;
      if (bias) b = astype(*bias, t == DType::f64 ? DType::f64 : DType::f32).to(d);
      const Array y =
          attention(at(q), at(k), at(v), {.scale = scale, .causal = c.causal, .bias = b});
      const Array g = attention_grad(at(q), at(k), at(v), at(dout), b, scale, c.causal);
      return std::make_pair(y, g);
    };
    const auto [y, g] = run(dt, dev);
    const auto [y64, g64] = run(DType::f64, Device::ref());
    auto compare = [&](const Array& got, const Array& want, const char* what) {
      ASSERT_EQ(got.dtype(), dt) << what;
      ASSERT_EQ(str(got.shape()), str(want.shape())) << what;
      auto gv = astype(got.to(Device::cpu()), DType::f64).to_vector<double>();
      auto wv = want.to_vector<double>();  // on ref: the host's memory
      double top = 0;
      for (double x : wv) top = std::max(top, std::fabs(x));
      for (size_t i = 0; i < gv.size(); ++i)
        ASSERT_NEAR(gv[i], wv[i], tol * std::max(1.0, top)) << what << " at flat index " << i;
    };
    compare(y, y64, "forward");
    compare(g, g64, "dq, dk, dv");
  }
}

TEST(Sdpa, F32AndBf16KernelsMatchF64) {
  for (Device d : {Device::cpu(), Device::ref()}) {
    expect_sdpa_matches_f64(d, DType::f32, 2e-6, kSdpaShapes);
    expect_sdpa_matches_f64(d, DType::bf16, 1.5e-2, kSdpaShapes);
  }
}

// The cpu's bf16 Sdpa with and without kiln's tile kernels (on a CPU with a
// bf16 unit: head dims that are multiples of 32 and 16 queries or more), on
// the shapes above and on those the tile path takes apart: a last block of
// queries that fills no tile along k (100 = 64 + 36, 161 = 2 · 64 + 33), a
// KV cache's block (T < S) with a bias, keys no query sees (T < S, causal,
// bottom-right aligned: all keys seen; T > S: the first queries see none).
TEST(Sdpa, Bf16TileKernelsMatchF64) {
  std::vector<SdpaShape> shapes = kSdpaShapes;
  shapes.insert(shapes.end(), {{2, 100, 100, 2, 64, true, false},
                               {1, 161, 161, 1, 32, false, true},
                               {1, 40, 90, 2, 64, true, true},
                               {2, 70, 30, 1, 32, true, false}});
  for (bool tiles : {true, false}) {
    SCOPED_TRACE(tiles ? "kiln's tile kernels where the CPU has a bf16 unit"
                       : "kiln's tile kernels off");
    cpu::set_tile_kernels(tiles);
    expect_sdpa_matches_f64(Device::cpu(), DType::bf16, 1.5e-2, shapes);
  }
  cpu::set_tile_kernels(true);
}

TEST(Sdpa, GpuF32F64AndBf16KernelsMatchF64) {
  KILN_REQUIRE_GPU();
#if KILN_CUDA_EMULATION  // every CUDA thread a fiber: the shorter shapes
  const std::vector<SdpaShape> shapes(kSdpaShapes.begin() + 2, kSdpaShapes.end());
#else
  const std::vector<SdpaShape>& shapes = kSdpaShapes;
#endif
  expect_sdpa_matches_f64(test_gpu(), DType::f32, 2e-6, shapes);
  expect_sdpa_matches_f64(test_gpu(), DType::f64, 1e-12, shapes);
  expect_sdpa_matches_f64(test_gpu(), DType::bf16, 1.5e-2, shapes);
}

// The causal mask is a bias of -inf above the (bottom-right) diagonal, and a
// key_padding_mask one of -inf at padded keys: rows that see no key give
// zeros, in the forward and in every gradient.
TEST(Sdpa, MasksAreMinusInfinityBiasesAndEmptyRowsAreZero) {
  const int64_t B = 2, T = 4, S = 6, H = 2, D = 8;
  const Array q = random::normal(random::Key(1), {B, T, H, D});
  const Array k = random::normal(random::Key(2), {B, S, H, D});
  const Array v = random::normal(random::Key(3), {B, S, H, D});
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> causal_bias(T * S);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < S; ++j) causal_bias[i * S + j] = j <= i + S - T ? 0.0 : -inf;
  const Array cb = astype(Array::from_vector(causal_bias, {T, S}), DType::f32);
  for (Device d : {Device::cpu(), Device::ref()}) {
    SCOPED_TRACE(d.str());
    const Array a = attention(q.to(d), k.to(d), v.to(d), {.causal = true});
    const Array b = attention(q.to(d), k.to(d), v.to(d), {.bias = cb.to(d)});
    const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
    for (size_t i = 0; i < av.size(); ++i) ASSERT_NEAR(av[i], bv[i], 1e-6) << "at " << i;
    // Batch 0 keeps keys 3 to 5: its query 0 sees keys 0 to 2 (causal), all
    // padded, so its row is zero; query 1 sees key 3. Batch 1 keeps every key.
    const Array keep = Array::from_vector(std::vector<bool>{false, false, false, true, true, true,
                                                            true, true, true, true, true, true},
                                          {B, S});
    auto loss = [&](const std::vector<Array>& x) {
      const Array y = attention(x[0], x[1], x[2], {.causal = true, .key_padding_mask = keep.to(d)});
      return sum(y * y);
    };
    const Array y =
        attention(q.to(d), k.to(d), v.to(d), {.causal = true, .key_padding_mask = keep.to(d)});
    const auto yv = y.to_vector<float>();
    for (int64_t x = 0; x < H * D; ++x) EXPECT_EQ(yv[x], 0.0f) << "row (0, 0) at " << x;
    for (int64_t x = H * D; x < 2 * H * D; ++x) EXPECT_NE(yv[x], 0.0f) << "row (0, 1) at " << x;
    const std::vector<Array> gs = grad(loss)(std::vector<Array>{q.to(d), k.to(d), v.to(d)});
    const auto dq = gs[0].to_vector<float>(), dk = gs[1].to_vector<float>(),
               dv = gs[2].to_vector<float>();
    for (const float x : dq) ASSERT_TRUE(std::isfinite(x));
    for (int64_t x = 0; x < H * D; ++x) EXPECT_EQ(dq[x], 0.0f) << "dq of row (0, 0) at " << x;
    for (int64_t x = 0; x < 3 * H * D; ++x) {  // padded keys: no gradient
      EXPECT_EQ(dk[x], 0.0f) << "dk of padded key at " << x;
      EXPECT_EQ(dv[x], 0.0f) << "dv of padded key at " << x;
    }
  }
}

// A NaN query makes its row's output and dq NaN, and the dk and dv of its
// (batch, head), on every backend (no backend takes a NaN row for an empty
// one); the other rows stay finite.
void expect_sdpa_nan_rows_propagate(Device d) {
  const int64_t B = 2, T = 3, S = 4, H = 2, D = 4;
  std::vector<float> qv = random::normal(random::Key(4), {B, T, H, D}).to_vector<float>();
  for (int64_t x = 0; x < D; ++x) qv[x] = std::nanf("");  // batch 0, query 0, head 0
  const Array q = Array::from_vector(qv, {B, T, H, D});
  const Array k = random::normal(random::Key(5), {B, S, H, D});
  const Array dout = random::normal(random::Key(6), {B, T, H, D});
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(name_of(dt)) + " on " + d.str());
    auto at = [&](const Array& x) { return astype(x, dt).to(d); };
    const auto y = astype(attention(at(q), at(k), at(k)), DType::f32).to_vector<float>();
    const auto g =
        astype(attention_grad(at(q), at(k), at(k), at(dout), std::nullopt, 0.5, false), DType::f32)
            .to_vector<float>();
    auto nan_at = [&](const std::vector<float>& v, int64_t rows, int64_t b, int64_t r, int64_t h) {
      return std::isnan(v[((b * rows + r) * H + h) * D]);
    };
    EXPECT_TRUE(nan_at(y, T, 0, 0, 0));
    EXPECT_FALSE(nan_at(y, T, 0, 0, 1) || nan_at(y, T, 0, 1, 0) || nan_at(y, T, 1, 0, 0));
    const int64_t rows = T + 2 * S;
    EXPECT_TRUE(nan_at(g, rows, 0, 0, 0)) << "dq";
    EXPECT_TRUE(nan_at(g, rows, 0, T, 0)) << "dk";
    EXPECT_TRUE(nan_at(g, rows, 0, T + S, 0)) << "dv";
    EXPECT_FALSE(nan_at(g, rows, 0, 1, 0) || nan_at(g, rows, 0, T, 1) || nan_at(g, rows, 1, T, 0));
  }
}

TEST(Sdpa, NanRowsPropagate) {
  expect_sdpa_nan_rows_propagate(Device::cpu());
  expect_sdpa_nan_rows_propagate(Device::ref());
}

TEST(Sdpa, GpuNanRowsPropagate) {
  KILN_REQUIRE_GPU();
  expect_sdpa_nan_rows_propagate(test_gpu());
}

TEST(Sdpa, BadOperandsNameWhatWasExpected) {
  const Array q = zeros({1, 3, 2, 4}), k = zeros({1, 5, 2, 4});
  auto expect_error = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one saying " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] {
        attention(zeros({3, 2, 4}), k, k);
      },
      "q must be [batch, tokens, heads, head_dim]");
  expect_error(
      [&] {
        attention(q, zeros({1, 5, 2, 8}), zeros({1, 5, 2, 8}));
      },
      "k must be [batch, keys, heads, head_dim]");
  expect_error([&] { attention(q, k, zeros({1, 4, 2, 4})); }, "v must have k's shape");
  expect_error([&] { attention(q, k, astype(k, DType::f64)); }, "q, k and v must have one dtype");
  expect_error([&] { attention(q, k, k, {.bias = zeros({3, 4})}); }, "does not broadcast");
  expect_error(
      [&] {
        attention(q, k, k, {.key_padding_mask = zeros({1, 5})});
      },
      "key_padding_mask must be bool [batch, keys]");
  expect_error([&] { attention(q, k, k, {.scale = std::nan("")}); }, "scale must be finite");
}

// ---- The CUDA backend against the cpu, case by case. GPU tests: their
// names contain "Gpu", CTest labels them `gpu`, and they skip (saying why)
// where no CUDA GPU is visible. The cpu is the reference: forward in f64 and
// f32 (f32 within the case's tolerance or 1e-5, for the GPU's own float math
// and summation order), every VJP in f64, eagerly and jitted.

bool on_cuda(const Array& a) {
  return a.device() == test_gpu();
}

double gpu_f32_tol(const Case& c) {
  return std::max(c.f32_tol, 1e-5);
}

TEST_P(OpTable, GpuForwardMatchesCpu) {
  KILN_REQUIRE_GPU();
  const Case& c = GetParam();
  std::mt19937 rng(4321);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  auto check = [&](const std::vector<Host>& h, DType fdt, double tol, const char* what) {
    auto ins = arrays(c, h, fdt);
    Array cpu = c.fn(ins);
    Array gpu = c.fn(moved(ins, test_gpu()));
    EXPECT_TRUE(on_cuda(gpu)) << c.name << ": result on " << gpu.device().str();
    EXPECT_EQ(gpu.dtype(), cpu.dtype()) << c.name;
    expect_close(to_host(gpu), to_host(cpu), tol, c.name + what);
  };
  if (!c.large) check(hs, DType::f64, 1e-9, " (f64, cuda vs cpu)");
  check(rounded(c, hs), DType::f32, gpu_f32_tol(c), " (f32, cuda vs cpu)");
}

TEST_P(OpTable, GpuJitMatchesEager) {
  KILN_REQUIRE_GPU();
  const Case& c = GetParam();
  if (c.large) GTEST_SKIP() << "forward-only thread-splitting case";
  std::mt19937 rng(77);
  std::vector<Host> hs;
  for (auto& in : c.inputs) hs.push_back(make_input(in, rng));
  for (DType fdt : {DType::f64, DType::f32}) {
    auto ins = moved(arrays(c, fdt == DType::f32 ? rounded(c, hs) : hs, fdt), test_gpu());
    Array eager = c.fn(ins);
    auto compiled = jit([&](const std::vector<Array>& x) { return std::vector<Array>{c.fn(x)}; });
    std::vector<Array> got = compiled(ins);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(on_cuda(got[0])) << c.name << ": jit result on " << got[0].device().str();
    const double tol = fdt == DType::f64 ? 1e-12 : gpu_f32_tol(c);
    const std::string what = c.name + " (" + name_of(fdt) + ", cuda jit vs eager)";
    expect_close(to_host(got[0]), to_host(eager), tol, what);
    expect_close(to_host(compiled(ins)[0]), to_host(eager), tol, what + ", replayed");
  }
}

TEST_P(OpTableGrad, GpuVjpMatchesCpu) {
  KILN_REQUIRE_GPU();
  const Case& c = GetParam();
  const std::vector<Array> args = vjp_args(c, 8);
  for (bool compiled : {false, true}) {
    auto run = [&](Device d) {
      const VectorFn f = vjp_fn(c);
      return compiled ? jit(f)(moved(args, d)) : f(moved(args, d));
    };
    auto cpu = run(Device::cpu()), gpu = run(test_gpu());
    ASSERT_EQ(gpu.size(), cpu.size()) << c.name;
    for (size_t k = 0; k < cpu.size(); ++k) {
      EXPECT_TRUE(on_cuda(gpu[k])) << c.name << ": result " << k;
      expect_close(to_host(gpu[k]), to_host(cpu[k]), 1e-9,
                   c.name + (compiled ? ": jitted" : ": eager") + " vjp result " +
                       std::to_string(k) + " (cuda vs cpu)");
    }
  }
}

// Every primitive the cpu backend runs has a CUDA kernel (no GPU needed: the
// table is there wherever kiln is built with the CUDA toolkit).
TEST(CudaBackend, HasAKernelForEveryCpuPrimitive) {
#ifndef KILN_HAVE_CUDA
  GTEST_SKIP() << "kiln was built without the CUDA backend";
#endif
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    Primitive prim = op == Op::FusedElementwise
                         ? Primitive(op, FusedAttrs{{FusedRead::Whole}, {{Op::Exp, 0, -1}}})
                     : op == Op::FusedReduce
                         ? Primitive(op, FusedReduceAttrs{{{FusedRead::Whole}, {{Op::Exp, 0, -1}}},
                                                          {2, 3},
                                                          {{1}, false}})
                     : op == Op::MatmulEpilogue
                         ? Primitive(op, EpilogueAttrs{MatmulAttrs{false, false, DType::f32}, {}})
                         : Primitive(op);
    EXPECT_TRUE(backend_supports(Device::cuda(), prim, {DType::f32, DType::f32}, DType::f32))
        << op_name(op) << ": no cuda kernel";
  }
}

// The compiler's fused primitives on the GPU (generated kernels and GEMM
// epilogues).
TEST(GpuBackend, FusedPrimitivesMatchCpu) {
  KILN_REQUIRE_GPU();
  check_fused_primitives_on(test_gpu());
}

// Fill and Random on the GPU: the cpu's values (Random: the same Threefry
// stream, bit for bit where the math is exact; f64 normals within an ulp).
TEST(GpuBackend, FillAndRandomMatchCpu) {
  KILN_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::bool_}) {
    SCOPED_TRACE(name_of(dt));
    EXPECT_EQ(arange(-3, 40, 3, dt, test_gpu()).to_vector<double>(),
              arange(-3, 40, 3, dt, Device::cpu()).to_vector<double>());
    EXPECT_EQ(full({3, 4}, 2.5, dt, test_gpu()).to_vector<double>(),
              full({3, 4}, 2.5, dt, Device::cpu()).to_vector<double>());
  }
  const Array key = Array::from_vector<int32_t>({123, -456}, {2});
  struct Draw {
    RandomKind kind;
    double a, b;
    DType dtype;
  };
  for (const Draw& d :
       {Draw{RandomKind::Uniform, -1, 3, DType::f32}, Draw{RandomKind::Normal, 0, 1, DType::f64},
        Draw{RandomKind::Normal, 0, 1, DType::f32},
        Draw{RandomKind::TruncatedNormal, -2, 2, DType::f32},
        Draw{RandomKind::Bernoulli, 0.3, 0, DType::bool_},
        Draw{RandomKind::Uniform, 0, 1, DType::bf16}, Draw{RandomKind::Gamma, 0.6, 0, DType::f64},
        Draw{RandomKind::Gamma, 3.5, 0, DType::f32},
        Draw{RandomKind::Randint, -5, 1000, DType::i32}}) {
    for (bool with_key_array : {false, true}) {
      auto draw = [&](Device dev) {
        RandomAttrs attrs{{7, 9}, d.kind, d.a, d.b, {7, 5}, d.dtype, with_key_array, 9};
        std::vector<Array> in;
        if (with_key_array) in.push_back(key.to(dev));
        return make_array(Primitive(Op::Random, attrs), in, {7, 5}, d.dtype, -1, dev);
      };
      const std::vector<double> gpu = draw(test_gpu()).to_vector<double>();
      const std::vector<double> cpu = draw(Device::cpu()).to_vector<double>();
      ASSERT_EQ(gpu.size(), cpu.size());
      for (size_t i = 0; i < cpu.size(); ++i)
        EXPECT_NEAR(gpu[i], cpu[i], d.dtype == DType::f64 ? 1e-14 * std::fabs(cpu[i]) : 0.0)
            << "kind " << static_cast<int>(d.kind) << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPrimitives, OpTable, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// ---- The VJP-read facts (op_facts.h) checked against the rules: every
// primitive that the cases' functions build is traced lazily, its VJP rule is
// run lazily on it, and the values the cotangents' graphs reach — which of its
// inputs, and its output — must be exactly what vjp_reads declares: eager
// differentiation keeps those values alive and frees the others.

// Which of `targets` the graphs of `roots` reach (a target is not looked
// through: the output's own inputs are not read through it).
std::vector<bool> reached(const std::vector<Array>& roots,
                          const std::vector<const ArrayNode*>& targets) {
  std::vector<bool> hit(targets.size(), false);
  std::set<const ArrayNode*> seen;
  std::vector<const ArrayNode*> stack;
  for (const Array& r : roots)
    if (r.node()) stack.push_back(r.node());
  while (!stack.empty()) {
    const ArrayNode* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    bool target = false;
    for (size_t t = 0; t < targets.size(); ++t)
      if (targets[t] == n) hit[t] = target = true;
    if (target) continue;
    for (const Array& in : n->inputs)
      if (in.node()) stack.push_back(in.node());
  }
  return hit;
}

// The primitives of the graph behind `root` (each node once).
std::vector<std::shared_ptr<ArrayNode>> graph_nodes(const Array& root) {
  std::vector<std::shared_ptr<ArrayNode>> out, stack{root.node_ptr()};
  std::set<const ArrayNode*> seen;
  while (!stack.empty()) {
    auto n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n.get()).second) continue;
    if (n->primitive) out.push_back(n);
    for (const Array& in : n->inputs) stack.push_back(in.node_ptr());
  }
  return out;
}

TEST(VjpReads, EveryRuleReadsExactlyWhatItsFactsDeclare) {
  std::set<Op> checked;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<Array> ins = f64_inputs(c);
    Array y;
    {
      LazyScope lazy;
      y = c.fn(ins);
    }
    // The primitives of the case, then those of its rules' graphs (the
    // backward-only primitives: LayerNormGrad, AttentionGrad, ...), but not
    // those of the rules of these (second order, and so on without end).
    std::vector<std::pair<std::shared_ptr<ArrayNode>, bool>> work;
    for (auto& n : graph_nodes(y)) work.emplace_back(n, true);
    std::set<const ArrayNode*> traced;
    while (!work.empty()) {
      const auto [node, first_order] = work.back();
      work.pop_back();
      if (!traced.insert(node.get()).second) continue;
      const Primitive& p = *node->primitive;
      const Array out(node);
      std::vector<bool> need;
      for (const Array& in : node->inputs) need.push_back(is_floating(in.dtype()));
      checked.insert(p.op());
      // Integer arithmetic (index computations) wants no cotangent: autodiff
      // never runs its rule.
      if (op_def(p.op()).vjp && std::find(need.begin(), need.end(), true) == need.end()) continue;
      const Array g = ones(out.shape(), out.dtype(), out.device());
      const VjpReads facts = vjp_reads(p.op());
      std::vector<Array> ct;
      try {
        LazyScope lazy;
        ct = vjp_rule(p, node->inputs, out, g, need);
      } catch (const Error&) {  // no rule (backward-only primitives): nothing to keep
        EXPECT_TRUE(facts.inputs == 0 && !facts.output) << p.str() << " has no VJP rule";
        continue;
      }
      std::vector<const ArrayNode*> targets{node.get()};
      for (const Array& in : node->inputs) targets.push_back(in.node());
      const std::vector<bool> hit = reached(ct, targets);
      for (const Array& x : ct)
        if (x.node() && first_order)
          for (auto& n : graph_nodes(x)) work.emplace_back(n, false);
      EXPECT_EQ(hit[0], facts.output)
          << p.str() << ": the rule " << (hit[0] ? "reads" : "does not read") << " its output";
      for (size_t i = 0; i < node->inputs.size(); ++i)
        EXPECT_EQ(hit[1 + i], facts.input(i))
            << p.str() << ": the rule " << (hit[1 + i] ? "reads" : "does not read") << " input "
            << i;
    }
  }
  // Every primitive was traced but those that only the compiler, the
  // creation functions and data-parallel training make.
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    const bool no_rule = op_kind(op) == OpKind::Source || op_kind(op) == OpKind::Collective ||
                         op == Op::FusedElementwise || op == Op::MatmulEpilogue ||
                         op == Op::FusedReduce;
    if (!no_rule) {
      EXPECT_TRUE(checked.count(op)) << op_name(op) << " was not traced";
    }
    if (op_kind(op) == OpKind::Fused && no_rule) {  // compiler-made: no rule, nothing kept
      EXPECT_EQ(vjp_reads(op).inputs, 0u) << op_name(op);
      EXPECT_FALSE(vjp_reads(op).output) << op_name(op);
    }
  }
}

std::vector<Case> grad_cases() {
  std::vector<Case> out;
  for (auto& c : cases())
    if (c.grad) out.push_back(c);
  return out;
}
INSTANTIATE_TEST_SUITE_P(AllPrimitives, OpTableGrad, ::testing::ValuesIn(grad_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kiln::testing
