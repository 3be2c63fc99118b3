// Compiled executables replaying a recording of their kernels (CUDA Graphs
// on a GPU; the reference backend emulates a recording device on every
// machine, with a GPU's semantics: a replay reads and writes the memory the
// recording was made with). The first run runs op by op, the second records
// and replays, later ones replay; results never differ from eager ones, an
// output survives later runs, and donated buffers that move are recorded anew.
#include <gtest/gtest.h>

#include <cmath>

#include "compiler/executable.h"
#include "compiler/graph.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

namespace kiln {
namespace {

const Device kRef = Device::ref();

// f traced on tracers of `shapes` on `device`: the graph, and how to call it
// (its inputs are the tracers' arguments and the constants tracing made).
struct Traced {
  compiler::Graph graph;
  std::vector<Array> ph, leaves;
  std::vector<Array> inputs(const std::vector<Array>& args) const {
    std::vector<Array> in;
    for (const Array& leaf : leaves) {
      bool found = false;
      for (size_t i = 0; i < ph.size(); ++i)
        if (leaf.same(ph[i])) in.push_back(args[i]), found = true;
      if (!found) in.push_back(leaf);
    }
    return in;
  }
  // donated[i] for argument i, as the executable's input slots.
  std::vector<bool> donated(const std::vector<bool>& args) const {
    std::vector<bool> d;
    for (const Array& leaf : leaves) {
      bool v = false;
      for (size_t i = 0; i < ph.size(); ++i) v = v || (leaf.same(ph[i]) && args[i]);
      d.push_back(v);
    }
    return d;
  }
};

Traced trace(const VectorFn& f, const std::vector<Shape>& shapes, Device device = kRef) {
  Traced t;
  std::vector<Array> outs;
  for (auto& s : shapes) t.ph.push_back(compiler::tracer(s, DType::f32, device));
  {
    LazyScope lazy;
    outs = f(t.ph);
  }
  t.graph = compiler::capture(outs, t.leaves);
  return t;
}

void expect_equal(const Array& got, const Array& want, const std::string& what) {
  EXPECT_EQ(got.device(), want.device()) << what;
  EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>()) << what;
}

TEST(Replay, LaterRunsReplayOneRecordingAndEqualEagerRuns) {
  auto f = [](const std::vector<Array>& x) {
    Array h = exp(x[0] * 0.5) * x[1] + 1.0;
    return std::vector<Array>{h, sum(h * x[0], {1}), reshape(h, {12})};
  };
  Traced t = trace(f, {{3, 4}, {4}});
  compiler::Executable exe(t.graph, t.donated({false, false}), {});
  std::vector<std::vector<Array>> kept;
  for (int run = 0; run < 4; ++run) {
    std::vector<Array> args{random::normal(random::Key(10 + run), {3, 4}).to(kRef),
                            random::normal(random::Key(20 + run), {4}).to(kRef)};
    std::vector<Array> got = exe.run(t.inputs(args)), want = f(args);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      expect_equal(got[i], want[i], "run " + std::to_string(run) + " output " + std::to_string(i));
    kept.push_back(got);
    kept.push_back(want);
  }
  EXPECT_EQ(exe.recordings(), 1u);
  EXPECT_EQ(exe.replays(), 2u);
  // Every run's outputs are the caller's: later replays did not write them.
  for (size_t k = 0; k < kept.size(); k += 2)
    for (size_t i = 0; i < kept[k].size(); ++i)
      expect_equal(kept[k][i], kept[k + 1][i], "kept output " + std::to_string(i));
}

TEST(Replay, DonatedBuffersThatMoveAreRecordedAgain) {
  // p <- p - 0.1 * (p * x): the update goes into p's donated buffer.
  auto f = [](const std::vector<Array>& a) {
    return std::vector<Array>{a[0] - a[0] * a[1] * 0.1, sum(a[0])};
  };
  Traced t = trace(f, {{8}, {8}});
  compiler::Executable exe(t.graph, t.donated({true, false}), {});
  Array p = random::normal(random::Key(1), {8}).to(kRef);
  std::vector<float> host = p.to_vector<float>();
  for (int step = 0; step < 5; ++step) {
    const Array x = random::normal(random::Key(30 + step), {8}).to(kRef);
    const std::vector<float> xs = x.to_vector<float>();
    // A fresh copy of p at step 3: its buffer is not the recording's.
    if (step == 3) p = Array::from_vector<float>(p.to_vector<float>(), {8}).to(kRef);
    std::vector<Array> out = exe.run(t.inputs({p, x}));
    float total = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      total += host[i];
      host[i] = host[i] - host[i] * xs[i] * 0.1f;
    }
    EXPECT_EQ(out[0].to_vector<float>(), host) << "step " << step;
    EXPECT_FLOAT_EQ(out[1].item<float>(), total) << "step " << step;
    p = out[0];
  }
  // Step 1 recorded, step 2 replayed, step 3 (moved) recorded again, step 4 replayed.
  EXPECT_EQ(exe.recordings(), 2u);
  EXPECT_EQ(exe.replays(), 2u);
}

TEST(Replay, OffWithTheSwitchOrWhereTheBackendDoesNotRecord) {
  auto f = [](const std::vector<Array>& x) { return std::vector<Array>{tanh(x[0]) * 2.0}; };
  Traced t = trace(f, {{5}}, Device::cpu());
  compiler::Executable on_cpu(t.graph, t.donated({false}), {});
  for (int i = 0; i < 3; ++i) on_cpu.run(t.inputs({random::normal(random::Key(2), {5})}));
  EXPECT_EQ(on_cpu.recordings(), 0u);  // the cpu runs its kernels as they come
  EXPECT_EQ(on_cpu.replays(), 0u);
}

// Five jitted SGD steps of a small ViT on ref, parameters donated (the
// trainer's jit mode: steps 3-5 replay one recording), against the cpu's.
TEST(Replay, TrainingStepsOnRefMatchTheCpus) {
  nn::ViTConfig cfg = nn::ViTConfig::preset("vit-tiny");
  cfg.image_size = 16, cfg.patch_size = 8, cfg.hidden_size = 16, cfg.num_attention_heads = 2;
  cfg.intermediate_size = 32, cfg.num_hidden_layers = 2, cfg.num_labels = 5;
  nn::ViTForImageClassification model(cfg);
  const Params init = model.init(random::Key(7));
  auto opt = optim::sgd({.lr = 0.1});
  auto run = [&](Device d) {
    Params p;
    // Copies: the steps donate their parameters.
    for (const auto& [name, a] : init)
      p.emplace(name, Array::from_vector<float>(a.to_vector<float>(), a.shape()).to(d));
    std::vector<std::string> names;
    for (const auto& [name, a] : p) names.push_back(name);
    const size_t np = names.size();
    auto step = [&](const std::vector<Array>& in) {
      Params params = unflatten(names, in);
      auto loss_fn = [&](const Params& q) { return model.loss(model.apply(q, in[np]), in[np + 1]); };
      auto [loss, grads] = value_and_grad(loss_fn)(params);
      auto [updated, state] = opt.update(grads, opt.init(params), params);
      std::vector<Array> out = flatten(updated);
      out.push_back(loss);
      return out;
    };
    std::vector<int> donate(np);
    for (size_t i = 0; i < np; ++i) donate[i] = static_cast<int>(i);
    Jitted jstep(step, {.donate = donate});
    struct Check {
      Jitted& j;
      Device d;
      // Steps 3-5 replay the recording step 2 made (ref records; the cpu not).
      ~Check() { EXPECT_EQ(j.cache_stats().replays, d == kRef ? 3u : 0u) << d.str(); }
    } check{jstep, d};
    std::vector<Array> params = flatten(p);
    std::vector<float> losses;
    for (int s = 0; s < 5; ++s) {
      std::vector<Array> args = params;
      args.push_back(random::normal(random::Key(100 + s), {4, 3, 16, 16}).to(d));
      args.push_back(Array::from_vector<int32_t>({s % 5, 1, 2, 3}, {4}).to(d));
      std::vector<Array> out = jstep(args);
      losses.push_back(out.back().item<float>());
      params.assign(out.begin(), out.end() - 1);
    }
    return std::make_pair(losses, params);
  };
  auto [cpu_losses, cpu_params] = run(Device::cpu());
  auto [ref_losses, ref_params] = run(kRef);
  for (size_t s = 0; s < cpu_losses.size(); ++s)
    EXPECT_NEAR(ref_losses[s], cpu_losses[s], 2e-5) << "step " << s + 1;
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_EQ(ref_params[i].device(), kRef);
    auto c = cpu_params[i].to_vector<float>(), r = ref_params[i].to_vector<float>();
    for (size_t k = 0; k < c.size(); ++k)
      ASSERT_NEAR(r[k], c[k], 1e-4 * (1 + std::fabs(c[k]))) << "parameter " << i << " at " << k;
  }
}

}  // namespace
}  // namespace kiln
