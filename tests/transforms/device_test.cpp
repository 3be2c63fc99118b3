// Device-aware execution, proved on the reference backend (Device::ref(), a
// second real device on every machine): arrays move between devices, are
// created on them, run eagerly, lazily and under jit there, and a ViT
// training step on ref equals the CPU's within rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../gpu_device.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

namespace kiln {
namespace {

const Device kRef = Device::ref();

TEST(Devices, ArraysMoveBetweenDevicesAndBack) {
  Array x = random::normal(random::Key(1), {3, 4});
  Array r = x.to(kRef);
  EXPECT_EQ(r.device(), kRef);
  EXPECT_EQ(r.shape(), x.shape());
  EXPECT_EQ(r.to_vector<float>(), x.to_vector<float>());  // read straight from ref
  Array back = r.to(Device::cpu());
  EXPECT_EQ(back.device(), Device::cpu());
  EXPECT_EQ(back.to_vector<float>(), x.to_vector<float>());
  EXPECT_TRUE(x.to(Device::cpu()).same(x));  // already there: the array itself
  // Mixing devices in one op is an error that names both.
  try {
    (void)(x + r);
    FAIL() << "an op over two devices ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu and ref"), std::string::npos) << e.what();
  }
}

TEST(Devices, NamesParseAndAMissingGpuIsAClearError) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("ref"), Device::ref());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:12"), Device::cuda(12));
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""})
    EXPECT_THROW(parse_device(bad, "--device"), Error) << bad;
  EXPECT_EQ(device_name(Device::cpu()), "cpu");
  synchronize(Device::cpu());  // the host backends have nothing queued
  synchronize(kRef);
  EXPECT_EQ(device_stream(Device::cpu()), nullptr);  // nor a stream
  EXPECT_EQ(device_stream(kRef), nullptr);
  if (cuda_device_count() > 0) {
    EXPECT_NE(device_stream(Device::cuda()), nullptr);
    GTEST_SKIP() << "a CUDA GPU is visible";
  }
  EXPECT_FALSE(cuda_unavailable_reason().empty());
  // Using a CUDA device says why there is none.
  auto says_why = [](auto use, const char* what) {
    try {
      use();
      ADD_FAILURE() << what << " on a missing GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cuda_unavailable_reason()), std::string::npos)
          << e.what();
    }
  };
  says_why([] { (void)zeros({2}, DType::f32, Device::cuda()); }, "an array was made");
  says_why([] { (void)device_stream(Device::cuda()); }, "a stream was named");
  const float host[2] = {1, 2};
  says_why([&] { (void)Array::from_device_data(host, {2}, DType::f32, Device::cuda()); },
           "device memory was copied");
}

// Another library's device memory (DLPack): copied on the device, at any
// offset, before from_device_data returns; the copy outlives the source.
TEST(Devices, GpuFromDeviceDataCopiesMemoryKilnDidNotAllocate) {
  KILN_REQUIRE_GPU();
  const Device d = test_gpu();
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = 0.5f * static_cast<float>(i) - 2.0f;
  Array src = Array::from_vector(v, {12}).to(d);
  src.eval();
  const auto* p = static_cast<const float*>(src.raw());
  Array a = Array::from_device_data(p + 3, {2, 4}, DType::f32, d);
  EXPECT_EQ(a.device(), d);
  EXPECT_EQ(a.shape(), (Shape{2, 4}));
  EXPECT_NE(a.raw(), static_cast<const void*>(p + 3));
  Array b = Array::from_device_data(p, {3, 2}, DType::i64, d);  // the same bytes, as int64
  Array e = Array::from_device_data(p, {0, 5}, DType::bf16, d);
  EXPECT_THROW(Array::from_device_data(p, {-1, 2}, DType::f32, d), Error);
  src = Array();  // the source goes away; the copies hold
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(v.begin() + 3, v.begin() + 11));
  std::vector<int64_t> bits(6);
  std::memcpy(bits.data(), v.data(), sizeof(int64_t) * 6);
  EXPECT_EQ(b.to_vector<int64_t>(), bits);
  EXPECT_EQ(e.shape(), (Shape{0, 5}));
  EXPECT_EQ(e.dtype(), DType::bf16);
  EXPECT_EQ((a * 2.0).to_vector<float>()[0], 2.0f * v[3]);  // an array like any other
}

TEST(Devices, CreationRunsOnTheDevice) {
  Array f = full({2, 3}, 1.5, DType::f32, kRef);
  EXPECT_EQ(f.device(), kRef);
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(6, 1.5f));
  Array a = arange(2, 11, 3, DType::i32, kRef);
  EXPECT_EQ(a.device(), kRef);
  EXPECT_EQ(a.to_vector<int32_t>(), (std::vector<int32_t>{2, 5, 8}));
  Array z = zeros_like(f) + scalar_like(f, 2.0);  // constants follow their array
  EXPECT_EQ(z.device(), kRef);
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 2.0f));
}

// Random draws are made on the device asked for: the same numbers as the
// CPU's for the same key, and a key held in an array draws on its device.
TEST(Devices, RandomDrawsOnTheDevice) {
  const random::Key key(42);
  Array c = random::normal(key, {3, 5}), r = random::normal(key, {3, 5}, DType::f32, kRef);
  EXPECT_EQ(r.device(), kRef);
  EXPECT_EQ(r.to_vector<float>(), c.to_vector<float>());
  Array tc = random::truncated_normal(key, {7}, -1.0, 1.5);
  Array tr = random::truncated_normal(key, {7}, -1.0, 1.5, DType::f32, kRef);
  EXPECT_EQ(tr.to_vector<float>(), tc.to_vector<float>());
  Array kc = random::key_array(key), kr = random::key_array(key, kRef);
  EXPECT_EQ(kr.device(), kRef);
  Array bc = random::bernoulli(kc, 3, {4, 4}, 0.3), br = random::bernoulli(kr, 3, {4, 4}, 0.3);
  EXPECT_EQ(br.device(), kRef);
  EXPECT_EQ(br.to_vector<bool>(), bc.to_vector<bool>());
  EXPECT_EQ(random::bernoulli(key, {9}, 0.5, kRef).to_vector<bool>(),
            random::bernoulli(key, {9}, 0.5).to_vector<bool>());
}

TEST(Devices, GradientsFlowThroughCopies) {
  Array x = random::normal(random::Key(2), {5});
  auto f = [](const std::vector<Array>& in) {
    Array y = exp(in[0].to(kRef)) * 3.0;  // computed on ref
    return std::vector<Array>{sum(y.to(Device::cpu()))};
  };
  auto [outs, grads] = vjp(f, {x}, {scalar_like(x, 1.0)});
  EXPECT_EQ(grads[0].device(), Device::cpu());
  auto g = grads[0].to_vector<float>(), xv = x.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 3.0f * std::exp(xv[i]), 1e-5f);
}

TEST(Devices, LazyAndJitRunOnTheArgumentsDevice) {
  auto f = [](const std::vector<Array>& in) {
    return std::vector<Array>{gelu(matmul(in[0], in[1]) + 1.0), sum(in[0] * in[0], {1})};
  };
  std::vector<Array> cpu_args{random::normal(random::Key(3), {4, 6}),
                              random::normal(random::Key(4), {6, 5})};
  std::vector<Array> ref_args{cpu_args[0].to(kRef), cpu_args[1].to(kRef)};
  auto eager = f(ref_args);
  std::vector<Array> lazy;
  {
    LazyScope scope;
    lazy = f(ref_args);
  }
  Jitted jf(f, {});
  auto compiled = jf(ref_args);
  auto on_cpu = f(cpu_args);
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(compiled[i].device(), kRef);
    EXPECT_EQ(lazy[i].to_vector<float>(), eager[i].to_vector<float>());
    EXPECT_EQ(compiled[i].to_vector<float>(), eager[i].to_vector<float>());
    auto c = on_cpu[i].to_vector<float>(), r = eager[i].to_vector<float>();
    for (size_t k = 0; k < c.size(); ++k) EXPECT_NEAR(r[k], c[k], 1e-5f * (1 + std::fabs(c[k])));
  }
  // The device is part of the signature: the same shapes on the cpu compile anew.
  jf(cpu_args);
  EXPECT_EQ(jf.cache_stats().compiles, 2u);
  jf(ref_args);
  EXPECT_EQ(jf.cache_stats().compiles, 2u);
}

// A model initialized on another device has the cpu's numbers, bit for bit
// (the draws are a function of key and index alone).
TEST(Devices, ModelInitOnRefEqualsTheCpus) {
  nn::ViTForImageClassification model(nn::ViTConfig::preset("vit-tiny"));
  const Params cpu = model.init(random::Key(3)), ref = model.init(random::Key(3), kRef);
  ASSERT_EQ(cpu.size(), ref.size());
  for (const auto& [name, a] : cpu) {
    EXPECT_EQ(ref.at(name).device(), kRef) << name;
    EXPECT_EQ(ref.at(name).to_vector<float>(), a.to_vector<float>()) << name;
  }
}

// One SGD training step of a small ViT, jitted with donated parameters, on
// the reference backend and on the CPU: the same loss and updated parameters
// within f32 rounding (the CPU's kernels use approximations and f32
// accumulation, ref f64 throughout).
TEST(Devices, VitTrainingStepOnRefEqualsTheCpus) {
  nn::ViTConfig cfg = nn::ViTConfig::preset("vit-tiny");
  cfg.image_size = 16, cfg.patch_size = 8, cfg.hidden_size = 16, cfg.num_attention_heads = 2;
  cfg.intermediate_size = 32, cfg.num_hidden_layers = 2, cfg.num_labels = 5;
  nn::ViTForImageClassification model(cfg);
  const Params init = model.init(random::Key(7));
  const Array pixels = random::normal(random::Key(8), {4, 3, 16, 16});
  const Array labels = Array::from_vector<int32_t>({0, 1, 2, 3}, {4});
  auto opt = optim::sgd({.lr = 0.1});

  auto run = [&](Device d) {
    Params p;
    for (const auto& [name, a] : init) p.emplace(name, a.to(d));
    optim::State s = opt.init(p);
    std::vector<std::string> names;
    for (const auto& [name, a] : p) names.push_back(name);
    std::vector<Array> args = flatten(p);
    const size_t np = args.size();
    args.push_back(pixels.to(d));
    args.push_back(labels.to(d));
    auto step = [&](const std::vector<Array>& in) {
      Params params = unflatten(names, in);
      auto loss_fn = [&](const Params& q) { return model.loss(model.apply(q, in[np]), in[np + 1]); };
      auto [loss, grads] = value_and_grad(loss_fn)(params);
      auto [updated, state] = opt.update(grads, s, params);
      std::vector<Array> out = flatten(updated);
      out.push_back(loss);
      return out;
    };
    Jitted jstep(step, {});
    auto out = jstep(args);
    for (const auto& a : out) EXPECT_EQ(a.device(), d);
    return out;
  };
  auto cpu = run(Device::cpu()), ref = run(kRef);
  ASSERT_EQ(cpu.size(), ref.size());
  EXPECT_NEAR(ref.back().item<float>(), cpu.back().item<float>(), 1e-5);
  for (size_t i = 0; i < cpu.size(); ++i) {
    auto c = cpu[i].to_vector<float>(), r = ref[i].to_vector<float>();
    double scale = 1e-6;
    for (float v : c) scale = std::max(scale, double(std::fabs(v)));
    for (size_t k = 0; k < c.size(); ++k)
      ASSERT_NEAR(r[k], c[k], 2e-5 * scale) << "output " << i << " at " << k;
  }
}

}  // namespace
}  // namespace kiln
