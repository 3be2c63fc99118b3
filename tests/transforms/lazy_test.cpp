// The lazy mode: record a graph, run it on eval(), get exactly the eager result.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kiln.h"

namespace kiln {
namespace {

struct Model {
  Params params;
  Array x, y;
};

Model small_model() {
  auto k = random::split(random::Key(11), 4);
  Model m;
  m.params = {{"dense.weight", random::normal(k[0], {16, 8}) * 0.3},
              {"dense.bias", random::normal(k[1], {16}) * 0.1},
              {"norm.weight", ones({16})},
              {"norm.bias", zeros({16})},
              {"head.weight", random::normal(k[2], {5, 16}) * 0.3}};
  m.x = random::normal(k[3], {6, 8});
  m.y = Array::from_vector<int32_t>({0, 1, 2, 3, 4, 0}, {6});
  return m;
}

// matmul -> GELU -> LayerNorm -> matmul -> mean softmax cross-entropy
Array loss_fn(const Params& p, const Array& x, const Array& y) {
  Array h = matmul(x, p.at("dense.weight"), {.transpose_b = true}) + p.at("dense.bias");
  h = layer_norm(gelu(h), p.at("norm.weight"), p.at("norm.bias"), 1e-12);
  Array logits = matmul(h, p.at("head.weight"), {.transpose_b = true});
  return mean(softmax_cross_entropy(logits, y));
}

TEST(Lazy, RecordsWithoutRunningThenMatchesEagerExactly) {
  Model m = small_model();
  auto [eager_loss, eager_grads] = value_and_grad(loss_fn)(m.params, m.x, m.y);

  Array lazy_loss;
  Params lazy_grads;
  {
    LazyScope lazy;
    std::tie(lazy_loss, lazy_grads) = value_and_grad(loss_fn)(m.params, m.x, m.y);
  }
  EXPECT_FALSE(lazy_loss.is_materialized());
  for (auto& [name, g] : lazy_grads) EXPECT_FALSE(g.is_materialized()) << name;

  std::vector<Array> all{lazy_loss};
  for (auto& [name, g] : lazy_grads) all.push_back(g);
  eval(all);
  EXPECT_EQ(lazy_loss.item<float>(), eager_loss.item<float>());
  for (auto& [name, g] : eager_grads)
    EXPECT_EQ(lazy_grads.at(name).to_vector<float>(), g.to_vector<float>()) << name;
}

TEST(Lazy, ReadingDataEvaluatesOnDemand) {
  Array a = ones({3});
  Array b;
  {
    LazyScope lazy;
    b = exp(a) + 1.0;
    EXPECT_FALSE(b.is_materialized());
    EXPECT_FLOAT_EQ(b.to_vector<float>()[0], std::exp(1.0f) + 1.0f);
  }
  EXPECT_TRUE(b.is_materialized());
}

TEST(Lazy, EagerUseOfAPendingArrayEvaluatesIt) {
  Array pending;
  {
    LazyScope lazy;
    pending = arange(4) * 2.0;
  }
  Array eager = pending + 1.0;  // outside the scope
  EXPECT_EQ(eager.to_vector<float>(), (std::vector<float>{1, 3, 5, 7}));
}

}  // namespace
}  // namespace kiln
