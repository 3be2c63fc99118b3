// Optimizers against PyTorch (fixture by tools/golden/make_optim_golden.py):
// AdamW with warm-up + cosine LambdaLR and clip_grad_norm_, eager and jit.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/optim.h"

namespace kiln {
namespace {

const std::string kFile = std::string(KILN_FIXTURES_DIR) + "/optim_golden/adamw.safetensors";

struct AdamWGolden {
  io::SafetensorsFile f = io::load_safetensors(kFile);
  int64_t steps = std::stoll(f.metadata.at("steps"));
  optim::AdamW opt{{.lr = std::stod(f.metadata.at("lr")),
                    .weight_decay = std::stod(f.metadata.at("weight_decay"))}};
  optim::Schedule sched{"cosine", std::stoll(f.metadata.at("warmup")), steps};
  double max_norm = std::stod(f.metadata.at("max_norm"));
  Params initial() const {
    Params p;
    for (const char* n : {"a", "b", "c"}) p.emplace(n, f.tensors.at(std::string("param/") + n));
    return p;
  }
  Params grads(int64_t step) const {
    Params g;
    for (const char* n : {"a", "b", "c"})
      g.emplace(n, f.tensors.at("grad/" + std::to_string(step) + "/" + n));
    return g;
  }
  void expect_params(const Params& p, int64_t step) const {
    for (auto& [n, a] : p) {
      auto got = a.to_vector<float>();
      auto want = f.tensors.at("after/" + std::to_string(step) + "/" + n).to_vector<float>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 2e-6 * std::max(1.0f, std::fabs(want[i])))
            << n << "[" << i << "] after step " << step;
    }
  }
};

TEST(Schedule, WarmupThenCosineMatchesTheLambdaTorchRan) {
  AdamWGolden g;
  auto want = g.f.tensors.at("lr_factors").to_vector<double>();
  for (int64_t k = 0; k < g.steps; ++k) EXPECT_NEAR(g.sched.factor(k), want[k], 1e-15);
  optim::Schedule bad{"cosine", 5, 5};
  EXPECT_THROW(bad.validate(), Error);
  optim::Schedule unknown{"exponential", 0, 5};
  EXPECT_THROW(unknown.validate(), Error);
  optim::Schedule constant{"constant", 3, 0};
  EXPECT_DOUBLE_EQ(constant.factor(0), 1.0 / 3);
  EXPECT_DOUBLE_EQ(constant.factor(7), 1.0);
}

TEST(AdamW, MatchesTorchWithClippingAndScheduleEagerly) {
  AdamWGolden g;
  auto norms = g.f.tensors.at("norms").to_vector<double>();
  Params p = g.initial();
  optim::State s = g.opt.init(p);
  for (int64_t step = 0; step < g.steps; ++step) {
    auto [clipped, norm] = optim::clip_by_global_norm(g.grads(step), g.max_norm);
    EXPECT_NEAR(norm.item<float>(), norms[step], 1e-5 * norms[step]);
    std::tie(p, s) = g.opt.update(clipped, s, p, g.sched.factor(step));
    g.expect_params(p, step);
  }
  EXPECT_EQ(s.step, g.steps);
}

TEST(AdamW, CompiledStepTakesTheScheduleAsArgumentsAndCompilesOnce) {
  AdamWGolden g;
  Params p = g.initial();
  optim::State s = g.opt.init(p);
  std::vector<std::string> pn, sn;
  for (auto& [n, a] : p) pn.push_back(n);
  for (auto& [n, a] : s.buffers) sn.push_back(n);
  const size_t np = pn.size(), ns = sn.size();
  // args: params, buffers, grads, 3 step scalars
  auto step_fn = [&](const std::vector<Array>& args) {
    Params params = unflatten(pn, args), grads = unflatten(pn, args, np + ns);
    optim::State st{unflatten(sn, args, np), 0};
    std::vector<Array> scal(args.end() - 3, args.end());
    auto [clipped, norm] = optim::clip_by_global_norm(grads, g.max_norm);
    auto [next, ns2] = g.opt.apply(clipped, st, params, scal);
    std::vector<Array> out = flatten(next);
    for (auto& b : flatten(ns2.buffers)) out.push_back(b);
    return out;
  };
  std::vector<int> donate;
  for (size_t i = 0; i < np + ns; ++i) donate.push_back(static_cast<int>(i));
  Jitted step = jit(step_fn, {.donate = donate});
  for (int64_t k = 0; k < g.steps; ++k) {
    std::vector<Array> args = flatten(p);
    for (auto& b : flatten(s.buffers)) args.push_back(b);
    for (auto& gr : flatten(g.grads(k))) args.push_back(gr);
    for (double v : g.opt.scalars(k + 1, g.opt.lr() * g.sched.factor(k)))
      args.push_back(Array::scalar(static_cast<float>(v)));
    auto out = step(args);
    p = unflatten(pn, out);
    s.buffers = unflatten(sn, out, np);
    g.expect_params(p, k);
  }
  EXPECT_EQ(step.cache_stats().compiles, 1u);
}

TEST(SGD, MomentumBufferStartsAsTheFirstGradient) {
  optim::SGD sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  Params p{{"w", Array::from_vector<float>({1, 2}, {2})}};
  Params g{{"w", Array::from_vector<float>({0.5f, -1}, {2})}};
  optim::State s = sgd.init(p);
  std::tie(p, s) = sgd.update(g, s, p);
  EXPECT_EQ(s.buffers.at("momentum/w").to_vector<float>(), (std::vector<float>{0.5f, -1}));
  std::tie(p, s) = sgd.update(g, s, p);  // b = 0.9 b + 0.5 g
  auto b = s.buffers.at("momentum/w").to_vector<float>();
  EXPECT_NEAR(b[0], 0.9 * 0.5 + 0.25, 1e-6);
  EXPECT_NEAR(b[1], -0.9 - 0.5, 1e-6);
}

TEST(Optimizers, ClearErrors) {
  EXPECT_THROW(optim::AdamW({.beta1 = 1.0}), Error);
  EXPECT_THROW(optim::AdamW({.eps = 0}), Error);
  EXPECT_THROW(optim::clip_by_global_norm({{"w", ones({2})}}, 0.0), Error);
  optim::AdamW adam({});
  Params p{{"w", ones({2})}};
  EXPECT_THROW(adam.update({}, adam.init(p), p), Error);  // no gradient for 'w'
  optim::State wrong;                                     // no exp_avg buffers
  EXPECT_THROW(adam.update(p, wrong, p), Error);
}

}  // namespace
}  // namespace kiln
