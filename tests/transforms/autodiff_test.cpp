// Autodiff as a user meets it: grad and value_and_grad over a parameter tree.
#include <gtest/gtest.h>

#include <cmath>

#include "core/array_node.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

Array vec(std::vector<float> v) {
  int64_t n = static_cast<int64_t>(v.size());
  return Array::from_vector(v, {n});
}

TEST(Autodiff, GradOfScalarFunction) {
  auto f = [](const Array& x) { return sum(x * x * x); };  // d/dx = 3x²
  Array g = grad(f)(vec({1, 2, -3}));
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{3, 12, 27}));
}

TEST(Autodiff, ValueAndGradOverParams) {
  random::Key key(0);
  auto keys = random::split(key, 3);
  Params params{{"dense.weight", random::normal(keys[0], {3, 4}, DType::f64)},
                {"dense.bias", zeros({3}, DType::f64)}};
  Array x = random::normal(keys[1], {5, 4}, DType::f64);
  Array y = Array::from_vector<int32_t>({0, 1, 2, 1, 0}, {5});
  auto loss_fn = [](const Params& p, const Array& x, const Array& y) {
    Array logits = matmul(x, p.at("dense.weight"), {.transpose_b = true}) + p.at("dense.bias");
    return mean(softmax_cross_entropy(logits, y));
  };
  auto [loss, grads] = value_and_grad(loss_fn)(params, x, y);
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads.at("dense.weight").shape(), (Shape{3, 4}));
  EXPECT_EQ(grads.at("dense.bias").shape(), (Shape{3}));
  // Closed form: dlogits = (softmax - onehot)/N; db = Σ_rows dlogits.
  Array logits = matmul(x, params.at("dense.weight"), {.transpose_b = true});
  Array d = (softmax(logits) - one_hot(y, 3, DType::f64)) / 5.0;
  auto want_b = sum(d, {0}).to_vector<double>();
  auto got_b = grads.at("dense.bias").to_vector<double>();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got_b[i], want_b[i], 1e-12);
  auto want_w = matmul(d, x, {.transpose_a = true}).to_vector<double>();
  auto got_w = grads.at("dense.weight").to_vector<double>();
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(got_w[i], want_w[i], 1e-12);
  EXPECT_NEAR(loss.item<double>(), mean(softmax_cross_entropy(logits, y)).item<double>(), 1e-12);
}

TEST(Autodiff, StopGradientBlocksTheFlow) {
  auto f = [](const std::vector<Array>& p) { return sum(p[0] * stop_gradient(p[1]) + p[1]); };
  auto [v, g] = value_and_grad(f)(std::vector<Array>{vec({1, 2}), vec({3, 4})});
  EXPECT_EQ(g[0].to_vector<float>(), (std::vector<float>{3, 4}));  // = y
  EXPECT_EQ(g[1].to_vector<float>(), (std::vector<float>{1, 1}));  // only the "+ y" path
  EXPECT_FLOAT_EQ(v.item<float>(), 1 * 3 + 2 * 4 + 3 + 4);
}

TEST(Autodiff, UnusedParameterGetsZeros) {
  auto f = [](const Params& p) { return sum(p.at("a")); };
  Params params{{"a", vec({1, 2})}, {"b", vec({5, 6, 7})}};
  auto g = grad(f)(params);
  EXPECT_EQ(g.at("a").to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(g.at("b").to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(Autodiff, ParameterUsedTwiceAccumulates) {
  auto f = [](const Array& x) { return sum(x * 2.0 + x * x); };  // 2 + 2x
  EXPECT_EQ(grad(f)(vec({1, -1})).to_vector<float>(), (std::vector<float>{4, 0}));
}

TEST(Autodiff, CastCarriesGradientBackToTheInputDtype) {
  auto f = [](const Array& x) { return sum(astype(x, DType::f32) * 3.0); };
  Array g = grad(f)(Array::from_vector<double>({1, 2}, {2}));
  EXPECT_EQ(g.dtype(), DType::f64);
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{3, 3}));
}

TEST(Autodiff, VjpWithExplicitCotangents) {
  auto [outs, cts] =
      vjp([](const std::vector<Array>& x) { return std::vector<Array>{x[0] * x[1]}; },
          {vec({1, 2}), vec({3, 4})}, {vec({10, 100})});
  EXPECT_EQ(outs[0].to_vector<float>(), (std::vector<float>{3, 8}));
  EXPECT_EQ(cts[0].to_vector<float>(), (std::vector<float>{30, 400}));
  EXPECT_EQ(cts[1].to_vector<float>(), (std::vector<float>{10, 200}));
}

TEST(Autodiff, NonScalarValueIsAnError) {
  auto f = [](const Array& x) { return x * 2.0; };
  try {
    grad(f)(vec({1, 2}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[value_and_grad] function must return a scalar, got shape (2)");
  }
}

TEST(Autodiff, SecondOrderOfFusedBackwardIsRefusedClearly) {
  auto inner = [](const Array& x) { return sum(gelu(x)); };
  auto outer = [&](const Array& x) { return sum(grad(inner)(x)); };
  EXPECT_THROW(grad(outer)(vec({0.5f})), Error);
}

TEST(Autodiff, EagerForwardGraphIsReleasedAfterGrad) {
  auto f = [](const Array& x) { return sum(exp(x)); };
  auto [v, g] = value_and_grad(f)(vec({1, 2}));
  EXPECT_FALSE(v.has_primitive()) << "the returned value should not pin the forward graph";
}

// Eager differentiation keeps only what the backward reads: an intermediate
// that no VJP rule reads loses its buffer once its last handle is gone (as
// PyTorch's autograd keeps only saved tensors); one that is read stays.
TEST(Autodiff, EagerGradFreesValuesNoVjpReads) {
  bool doubled_freed = false, exp_kept = false, input_kept = false;
  auto f = [&](const Array& x) {
    std::weak_ptr<ArrayNode> doubled_node, exp_node;
    Array e;
    {
      Array doubled = x * 2.0;  // read by nothing: Exp's rule reads Exp's output
      e = exp(doubled);
      doubled_node = doubled.node_ptr();
      exp_node = e.node_ptr();
    }
    Array s = sum(e);  // the next op frees what the gone handle left behind
    doubled_freed = !doubled_node.lock()->buffer;
    exp_kept = exp_node.lock()->buffer != nullptr;
    input_kept = x.is_materialized();
    return s;
  };
  auto [v, g] = value_and_grad(f)(vec({0.5f, -1.0f}));
  EXPECT_TRUE(doubled_freed);
  EXPECT_TRUE(exp_kept);
  EXPECT_TRUE(input_kept);
  auto grad = g.to_vector<float>();
  EXPECT_NEAR(grad[0], 2 * std::exp(1.0f), 1e-5);
  EXPECT_NEAR(grad[1], 2 * std::exp(-2.0f), 1e-6);
  EXPECT_NEAR(v.item<float>(), std::exp(1.0f) + std::exp(-2.0f), 1e-5);
}

// `temporary + b` writes into the temporary's buffer in eager mode when
// nothing can read the temporary again: while differentiating (a matmul's
// output, which no VJP rule reads) and outside it. It does not where another
// handle holds the operand, where a VJP rule reads it (x * x keeps x), or
// where broadcasting makes the result larger; values and gradients are the
// same in every case.
TEST(Autodiff, EagerAddWritesIntoAGivenUpTemporary) {
  Array x = Array::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Array w = Array::from_vector<float>({1, 0, 2, -1, 1, 0}, {2, 3});
  Array b = Array::from_vector<float>({0.5f, -0.5f}, {2});
  const std::vector<float> want{7.5f, 0.5f, 16.5f, 0.5f};  // x·wᵀ + b
  bool reused = false, kept_for_other_handle = false, kept_for_vjp = false, other_intact = false;
  auto f = [&](const std::vector<Array>& in) {
    Array y = matmul(in[0], in[1], {.transpose_b = true});
    const void* y_buffer = y.raw();
    Array z = std::move(y) + in[2];
    reused = z.raw() == y_buffer;

    Array y2 = matmul(in[0], in[1], {.transpose_b = true});
    Array z2 = Array(y2) + in[2];  // y2 still held here
    kept_for_other_handle = z2.raw() != y2.raw();
    other_intact = y2.to_vector<float>() == std::vector<float>{7, 1, 16, 1};

    Array y3 = matmul(in[0], in[1], {.transpose_b = true});
    Array sq = y3 * y3;  // Mul's rule reads y3
    const void* y3_buffer = y3.raw();
    Array z3 = std::move(y3) + in[2];
    kept_for_vjp = z3.raw() != y3_buffer;
    return std::vector<Array>{sum(z) + sum(z2) + sum(z3) + sum(sq)};
  };
  auto [outs, grads] = vjp(f, {x, w, b}, {scalar_like(x, 1.0)});
  EXPECT_TRUE(reused);
  EXPECT_TRUE(kept_for_other_handle);
  EXPECT_TRUE(other_intact);
  EXPECT_TRUE(kept_for_vjp);
  // d/dx of 3·sum(x·wᵀ) + sum((x·wᵀ)²) = 3·1·w + 2·(x·wᵀ)·w, and so on: the
  // same as computed without any reuse.
  Array y = matmul(x, w, {.transpose_b = true});
  Array ones_y = ones_like(y);
  Array gy = ones_y * 3.0 + y * 2.0;
  EXPECT_EQ(grads[0].to_vector<float>(), matmul(gy, w).to_vector<float>());
  EXPECT_EQ(grads[1].to_vector<float>(), matmul(gy, x, {.transpose_a = true}).to_vector<float>());
  EXPECT_EQ(grads[2].to_vector<float>(), (std::vector<float>{6, 6}));
  EXPECT_FLOAT_EQ(outs[0].item<float>(), 3 * (7.5f + 0.5f + 16.5f + 0.5f) + (49 + 1 + 256 + 1));

  // Outside differentiation, and a broadcast that makes the result larger.
  Array t = matmul(x, w, {.transpose_b = true});
  const void* t_buffer = t.raw();
  Array u = std::move(t) + b;
  EXPECT_EQ(u.raw(), t_buffer);
  EXPECT_EQ(u.to_vector<float>(), want);
  Array small = Array::from_vector<float>({1, 2}, {2});
  Array big = std::move(small) + zeros({3, 2});
  EXPECT_EQ(big.to_vector<float>(), (std::vector<float>{1, 2, 1, 2, 1, 2}));
}

// A value freed that way is still correct if read: eval() recomputes it
// from its inputs (nothing reads one in practice; this guards the fallback).
TEST(Autodiff, AFreedIntermediateIsRecomputedIfRead) {
  std::weak_ptr<ArrayNode> doubled_node;
  auto f = [&](const Array& x) {
    Array e;
    {
      Array doubled = x * 2.0;
      e = exp(doubled);
      doubled_node = doubled.node_ptr();
    }
    Array s = sum(e);
    Array again(doubled_node.lock());  // a handle made from the graph itself
    EXPECT_FALSE(again.is_materialized());
    EXPECT_EQ(again.to_vector<float>(), (std::vector<float>{3.0f, 4.0f}));
    return s;
  };
  value_and_grad(f)(vec({1.5f, 2.0f}));
}

}  // namespace
}  // namespace kiln
