// The fine-tuning knobs against PyTorch and transformers (fixture by
// tools/golden/make_finetune_golden.py): the linear schedule
// (get_linear_schedule_with_warmup), label smoothing
// (CrossEntropyLoss(label_smoothing=)), weight decay in the HF Trainer's two
// parameter groups (AdamW and SGD, eager and compiled), and the optimizer
// wrappers behind --ema and --freeze-backbone.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

namespace kiln {
namespace {

const io::SafetensorsFile& golden() {
  static io::SafetensorsFile f =
      io::load_safetensors(std::string(KILN_FIXTURES_DIR) + "/finetune_golden.safetensors");
  return f;
}

void expect_near(const Array& got, const Array& want, double tol, const std::string& what) {
  auto g = astype(got, DType::f32).to_vector<float>(),
       w = astype(want, DType::f32).to_vector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], w[i], tol * std::max(1.0f, std::fabs(w[i]))) << what << "[" << i << "]";
}

TEST(Finetune, LinearScheduleIsTransformers) {
  std::vector<double> want = golden().tensors.at("lr.linear").to_vector<double>();
  optim::Schedule s{"linear", 3, 10};
  s.validate();
  for (int64_t k = 0; k < 10; ++k) EXPECT_NEAR(s.factor(k), want[k], 1e-15) << k;
  EXPECT_EQ(s.factor(0), 0.0);  // transformers warms up from 0
  optim::Schedule bad{"linear", 4, 4};
  EXPECT_THROW(bad.validate(), Error);
}

TEST(Finetune, LabelSmoothingIsCrossEntropyLossLabelSmoothing) {
  const auto& t = golden().tensors;
  nn::ViTConfig cfg = nn::ViTConfig::preset("vit-fmnist");
  cfg.num_labels = 7;
  nn::ViTForImageClassification model(cfg);
  const Array& logits = t.at("smooth.logits");
  const Array labels = t.at("smooth.labels");
  auto [loss, grad] =
      value_and_grad([&](const Array& x) { return model.loss(x, labels, 0.1); })(logits);
  expect_near(loss, t.at("smooth.loss"), 1e-6, "loss");
  expect_near(grad, t.at("smooth.grad"), 1e-6, "grad");
  // Zero is the plain cross-entropy; out of [0, 1] is an error.
  expect_near(model.loss(logits, labels, 0.0), mean(softmax_cross_entropy(logits, labels)), 0,
              "unsmoothed");
  EXPECT_THROW(model.loss(logits, labels, 1.5), Error);
}

Params named(const std::string& prefix) {
  Params p;
  for (auto& [key, a] : golden().tensors)
    if (key.rfind(prefix, 0) == 0) p.emplace(key.substr(prefix.size()), a);
  return p;
}

TEST(Finetune, NoWeightDecayOnBiasesNormsPositionsAndClsAsTheTrainer) {
  EXPECT_TRUE(optim::no_weight_decay("vit.embeddings.cls_token"));
  EXPECT_TRUE(optim::no_weight_decay("vit.encoder.layer.3.layernorm_after.weight"));
  EXPECT_FALSE(optim::no_weight_decay("vit.encoder.layer.3.output.dense.weight"));
  for (const std::string kind : {"adamw", "sgd"}) {
    std::unique_ptr<optim::Optimizer> opt;
    if (kind == "adamw")
      opt = std::make_unique<optim::AdamW>(
          optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1, .exempt_from_decay = true});
    else
      opt = std::make_unique<optim::SGD>(optim::SGDOptions{
          .lr = 0.01, .momentum = 0.9, .weight_decay = 0.1, .exempt_from_decay = true});
    for (bool compiled : {false, true}) {
      SCOPED_TRACE(kind + (compiled ? " compiled" : " eager"));
      Params p = named("decay.init.");
      optim::State s = opt->init(p);
      std::vector<std::string> pn, sn;
      for (auto& [n, a] : p) pn.push_back(n);
      for (auto& [n, a] : s.buffers) sn.push_back(n);
      Jitted step = jit([&](const std::vector<Array>& args) {
        const size_t np = pn.size(), nb = sn.size();
        std::vector<Array> scal(args.end() - 3, args.end());
        auto [next, st] =
            opt->apply(unflatten(pn, args, np + nb), optim::State{unflatten(sn, args, np), 0},
                       unflatten(pn, args), scal);
        std::vector<Array> out = flatten(next);
        for (auto& b : flatten(st.buffers)) out.push_back(b);
        return out;
      });
      for (int k = 0; k < 3; ++k) {
        Params g = named("decay.grad." + std::to_string(k) + ".");
        if (compiled) {
          std::vector<Array> args = flatten(p);
          for (auto& b : flatten(s.buffers)) args.push_back(b);
          for (auto& a : flatten(g)) args.push_back(a);
          for (double v : opt->scalars(k + 1, opt->lr()))
            args.push_back(Array::scalar(static_cast<float>(v)));
          auto out = step(args);
          p = unflatten(pn, out);
          s = optim::State{unflatten(sn, out, pn.size()), s.step + 1};
        } else {
          std::tie(p, s) = opt->update(g, s, p);
        }
        Params want = named("decay." + kind + "." + std::to_string(k) + ".");
        for (auto& [n, a] : want)
          expect_near(p.at(n), a, 2e-6, n + " after step " + std::to_string(k));
      }
    }
  }
}

TEST(Finetune, MovingAverageAndFrozenParameters) {
  Params p{{"vit.w", Array::from_vector<float>({1, 2, 3}, {3})},
           {"classifier.weight", Array::from_vector<float>({4, 5}, {2})}};
  Params g{{"vit.w", Array::from_vector<float>({1, 1, 1}, {3})},
           {"classifier.weight", Array::from_vector<float>({2, -2}, {2})}};
  // EMA over SGD (lr 0.5): p1 = p0 - 0.5 g, ema1 = 0.9 p0 + 0.1 p1; p2, ema2 likewise.
  optim::WithEma ema(std::make_unique<optim::SGD>(optim::SGDOptions{.lr = 0.5}), 0.9);
  optim::State s = ema.init(p);
  EXPECT_EQ(optim::ema_params(s).at("vit.w").to_vector<float>(), (std::vector<float>{1, 2, 3}));
  Params q = p;
  std::tie(q, s) = ema.update(g, s, q);
  std::tie(q, s) = ema.update(g, s, q);
  std::vector<float> e = optim::ema_params(s).at("classifier.weight").to_vector<float>();
  // p0 = 4, p1 = 3, p2 = 2: ema1 = 3.9, ema2 = 0.9 * 3.9 + 0.1 * 2 = 3.71.
  EXPECT_NEAR(e[0], 3.71f, 1e-6);
  EXPECT_EQ(q.at("classifier.weight").to_vector<float>()[0], 2.0f);
  EXPECT_THROW(optim::WithEma(std::make_unique<optim::SGD>(optim::SGDOptions{}), 1.0), Error);

  // Masked: the frozen parameter passes through and needs no gradient; the
  // state holds the trainable ones' buffers alone.
  optim::Masked frozen(std::make_unique<optim::SGD>(optim::SGDOptions{.lr = 0.5, .momentum = 0.9}),
                       [](const std::string& n) { return n.rfind("classifier.", 0) == 0; });
  optim::State fs = frozen.init(p);
  ASSERT_EQ(fs.buffers.size(), 1u);
  EXPECT_TRUE(fs.buffers.count("momentum/classifier.weight"));
  Params only{{"classifier.weight", g.at("classifier.weight")}};
  auto [next, ns] = frozen.update(only, fs, p);
  EXPECT_EQ(next.at("vit.w").to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(next.at("classifier.weight").to_vector<float>(), (std::vector<float>{3, 6}));
}

}  // namespace
}  // namespace kiln
