// kiln ops: the elementwise primitives' definitions — unary and binary math
// (their scalar functions are in ops/scalar_math.h), comparisons, Where,
// Cast and StopGradient.
#include <cmath>

#include "ops/defs/defs.h"

namespace kiln::defs {
namespace {

// Floats; integers too where the op is defined on them (kIntegers).
Aval unary_type(const Primitive& p, const std::vector<Aval>& in) {
  const bool ok = is_float(in[0].dtype) || (op_has(p.op(), kIntegers) && is_integral(in[0].dtype));
  KILN_EXPECT(ok, p,
              "operand is " + str(in[0]) + ", expected a float" +
                  (op_has(p.op(), kIntegers) ? " or integer" : "") + " array");
  return in[0];
}

// Operands of one dtype (not bool, but for comparisons), broadcast.
Aval binary_type(const Primitive& p, const std::vector<Aval>& in) {
  const bool compare = op_kind(p.op()) == OpKind::Compare;
  KILN_EXPECT(in[0].dtype == in[1].dtype, p,
              "operands " + str(in[0]) + " and " + str(in[1]) + " differ in dtype");
  KILN_EXPECT(compare || in[0].dtype != DType::bool_, p, "arithmetic on bool operands");
  return {broadcast_shapes(in[0].shape, in[1].shape, p.name()),
          compare ? DType::bool_ : in[0].dtype};
}

void unary(OpDefs& d) {
  auto def = [&](Op op, VjpFn f) { define(d, op, {.arity = 1, .infer = unary_type, .vjp = f}); };
  def(Op::Neg, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = neg(a.g); });
  def(Op::Exp, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g * a.out; });
  def(Op::Log, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g / a.in[0]; });
  def(Op::Sqrt, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g / (a.out * 2.0); });
  def(Op::Rsqrt, [](const VjpArgs& a, std::vector<Array>& ct) {
    ct[0] = a.g * (a.out * a.out * a.out) * -0.5;
  });
  def(Op::Tanh,
      [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g * (1.0 - a.out * a.out); });
  def(Op::Erf, [](const VjpArgs& a, std::vector<Array>& ct) {
    ct[0] = a.g * exp(-(a.in[0] * a.in[0])) * (2.0 / std::sqrt(M_PI));
  });
  def(Op::Gelu, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g * gelu_grad(a.in[0]); });
  def(Op::GeluTanh,
      [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g * gelu_tanh_grad(a.in[0]); });
  // From the output (relu(x) > 0 exactly where x > 0), which the next layer
  // reads anyway: the input need not be kept, and a compiled step fuses the
  // ReLU into what computes its input (a BatchNorm's normalization). One
  // elementwise op (relu_grad) rather than a comparison and a select, which
  // a compiled step fuses into the BatchNorm backward around it.
  def(Op::Relu, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = relu_grad(a.g, a.out); });
  def(Op::Abs, [](const VjpArgs& a, std::vector<Array>& ct) {
    ct[0] = where(greater_equal(a.in[0], zero_like_scalar(a.in[0])), a.g, neg(a.g));
  });
  def(Op::Sin, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g * cos(a.in[0]); });
  def(Op::Cos, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = neg(a.g * sin(a.in[0])); });
  def(Op::Log1p, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g / (a.in[0] + 1.0); });
  def(Op::Expm1, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = a.g * (a.out + 1.0); });
  // Piecewise constant: a zero gradient, as in JAX.
  for (Op op : {Op::Sign, Op::Floor, Op::Round})
    def(op, [](const VjpArgs& a, std::vector<Array>& ct) { ct[0] = zeros_like(a.g); });
  for (Op op : {Op::GeluGrad, Op::GeluTanhGrad})
    define(d, op, {.arity = 1, .infer = unary_type, .no_vjp = kNoSecondOrder});
}

// Binary ops compute their cotangents at the broadcast shape, then sum them
// back to each operand's shape.
void binary(OpDefs& d) {
  auto def = [&](Op op, VjpFn f) { define(d, op, {.arity = 2, .infer = binary_type, .vjp = f}); };
  def(Op::Add, [](const VjpArgs& a, std::vector<Array>& ct) {
    if (a.want(0)) ct[0] = sum_to(a.g, a.in[0].shape());
    if (a.want(1)) ct[1] = sum_to(a.g, a.in[1].shape());
  });
  def(Op::Sub, [](const VjpArgs& a, std::vector<Array>& ct) {
    if (a.want(0)) ct[0] = sum_to(a.g, a.in[0].shape());
    if (a.want(1)) ct[1] = sum_to(neg(a.g), a.in[1].shape());
  });
  def(Op::Mul, [](const VjpArgs& a, std::vector<Array>& ct) {
    if (a.want(0)) ct[0] = sum_to(a.g * a.in[1], a.in[0].shape());
    if (a.want(1)) ct[1] = sum_to(a.g * a.in[0], a.in[1].shape());
  });
  def(Op::Div, [](const VjpArgs& a, std::vector<Array>& ct) {
    if (a.want(0)) ct[0] = sum_to(a.g / a.in[1], a.in[0].shape());
    if (a.want(1)) ct[1] = sum_to(neg(a.g * a.out) / a.in[1], a.in[1].shape());
  });
  // relu_grad(g, y) is linear in g and piecewise constant in y.
  def(Op::ReluGrad, [](const VjpArgs& a, std::vector<Array>& ct) {
    if (a.want(0)) ct[0] = sum_to(relu_grad(a.g, a.in[1]), a.in[0].shape());
    if (a.want(1)) ct[1] = zeros_like(a.in[1]);
  });
  // Ties share the cotangent equally, as in JAX.
  auto extremum = [](const VjpArgs& a, std::vector<Array>& ct) {
    const Array first =
        a.p.op() == Op::Maximum ? greater(a.in[0], a.in[1]) : less(a.in[0], a.in[1]);
    const Array tie = equal(a.in[0], a.in[1]);
    const Array half = a.g * 0.5, zero = zero_like_scalar(a.g);
    if (a.want(0)) ct[0] = sum_to(where(first, a.g, where(tie, half, zero)), a.in[0].shape());
    if (a.want(1)) ct[1] = sum_to(where(first, zero, where(tie, half, a.g)), a.in[1].shape());
  };
  def(Op::Maximum, extremum);
  def(Op::Minimum, extremum);
  // d(x^y)/dx = y·x^(y-1); d(x^y)/dy = x^y·log(x), taken as 0 where x = 0
  // (where x^y is 0 or 1), as JAX does.
  def(Op::Pow, [](const VjpArgs& a, std::vector<Array>& ct) {
    const Array &x = a.in[0], &y = a.in[1];
    if (a.want(0)) ct[0] = sum_to(a.g * y * power(x, y - 1.0), x.shape());
    if (a.want(1)) {
      const Array zero = zero_like_scalar(x), at_zero = equal(x, zero);
      const Array log_x = where(at_zero, zero, log(where(at_zero, scalar_like(x, 1.0), x)));
      ct[1] = sum_to(a.g * a.out * log_x, y.shape());
    }
  });
  for (Op op : {Op::Equal, Op::NotEqual, Op::Less, Op::LessEqual, Op::Greater, Op::GreaterEqual})
    define(d, op, {.arity = 2, .infer = binary_type});  // bool results: no cotangents
}

}  // namespace

void elementwise(OpDefs& d) {
  unary(d);
  binary(d);
  // where(cond, a, b): a bool condition, a and b of one dtype, all broadcast.
  auto where_type = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
    KILN_EXPECT(in[0].dtype == DType::bool_, p, "condition is " + str(in[0]) + ", expected bool");
    KILN_EXPECT(in[1].dtype == in[2].dtype, p,
                "values " + str(in[1]) + " and " + str(in[2]) + " differ in dtype");
    const Shape s = broadcast_shapes(in[0].shape, in[1].shape, p.name());
    return {broadcast_shapes(s, in[2].shape, p.name()), in[1].dtype};
  };
  define(d, Op::Where,
         {.arity = 3, .infer = where_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            const Array zero = zero_like_scalar(a.g);
            if (a.want(1)) ct[1] = sum_to(where(a.in[0], a.g, zero), a.in[1].shape());
            if (a.want(2)) ct[2] = sum_to(where(a.in[0], zero, a.g), a.in[2].shape());
          }});
  auto cast_type = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
    return {in[0].shape, p.attrs<CastAttrs>().to};
  };
  define(d, Op::Cast,
         {.arity = 1, .infer = cast_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            if (is_floating(a.in[0].dtype())) ct[0] = astype(a.g, a.in[0].dtype());
          }});
  define(d, Op::StopGradient, {.arity = 1, .infer = first_type});
}

}  // namespace kiln::defs
