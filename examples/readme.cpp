#include <kiln/kiln.h>
using namespace kiln;

int main() {
  auto keys = random::split(random::Key(0), 3);
  Params params{{"w", random::normal(keys[0], {10, 784}) * 0.01f}, {"b", zeros({10})}};
  Array x = random::normal(keys[1], {64, 784}), y = random::randint(keys[2], {64}, 0, 10);
  auto loss_fn = [](const Params& p, const Array& x, const Array& y) {
    Array logits = matmul(x, p.at("w"), {.transpose_b = true}) + p.at("b");
    return mean(softmax_cross_entropy(logits, y));
  };
  // the loss, its gradient and the SGD update, compiled into one program
  auto sgd = [&](const std::vector<Array>& a) {
    auto [loss, g] = value_and_grad(loss_fn)(Params{{"w", a[0]}, {"b", a[1]}}, a[2], a[3]);
    return std::vector<Array>{a[0] - g.at("w") * 0.1f, a[1] - g.at("b") * 0.1f, loss};
  };
  Jitted step = jit(sgd, {.donate = {0, 1}});  // w and b updated in place
  std::vector<Array> s{params.at("w"), params.at("b")};
  for (int i = 0; i < 100; ++i) s = step({s[0], s[1], x, y});
  std::printf("loss after 100 steps: %.4f\n", s[2].item<float>());
}
