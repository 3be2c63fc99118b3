// The pieces of data-parallel training that one process can check: the
// AllReduceStart / AllReduceWait primitives in a group of one (eager, lazy,
// jit with replays, on cpu and ref), the backward's gradient-ready hook, the
// gradient buckets, and a training run whose gradients go through the
// buckets (the numbers of a run without them, bit for bit). The ranks
// themselves: tests/dist/mpi_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "kiln/distributed.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/train.h"
#include "train/buckets.h"

namespace kiln {
namespace {

std::vector<Array> some_arrays(DType dt, Device device) {
  return {astype(multiply(arange(0, 12, 1, DType::f32), full({}, 0.5)), dt).to(device),
          astype(reshape(arange(-3, 3, 1, DType::f32), {2, 3}), dt).to(device),
          full({}, 7.25, dt, device)};
}

void expect_same_values(const std::vector<Array>& got, const std::vector<Array>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].shape(), want[i].shape());
    EXPECT_EQ(got[i].dtype(), want[i].dtype());
    EXPECT_EQ(got[i].to_vector<double>(), want[i].to_vector<double>()) << "array " << i;
  }
}

std::vector<Array> round_trip(const std::vector<Array>& xs) {
  Array token = all_reduce_start(xs, 0);
  return all_reduce_wait(token, xs, 0);
}

// In a group of one the mean over the ranks is the array itself: eagerly,
// lazily and compiled (the compiled call replayed as a recording on ref).
TEST(Collectives, AGroupOfOneGetsItsOwnValuesInEveryMode) {
  ASSERT_EQ(dist::size(), 1);
  for (Device device : {Device::cpu(), Device::ref()}) {
    for (DType dt : {DType::f32, DType::f64}) {
      SCOPED_TRACE(device.str() + " " + name_of(dt));
      std::vector<Array> xs = some_arrays(dt, device);
      expect_same_values(round_trip(xs), xs);
      std::vector<Array> lazy;
      {
        LazyScope scope;
        lazy = round_trip(xs);
      }
      eval(lazy);
      expect_same_values(lazy, xs);
      Jitted f = jit([](const std::vector<Array>& args) { return round_trip(args); });
      for (int call = 0; call < 3; ++call) expect_same_values(f(xs), xs);
      if (device == Device::ref()) {
        EXPECT_EQ(f.cache_stats().replays, 1u);
      }
    }
  }
}

// Two buckets in flight at once, waited for in the other order; the sum
// (mean = false) of one rank is its value too.
TEST(Collectives, BucketsAreIndependent) {
  std::vector<Array> a = some_arrays(DType::f32, Device::cpu());
  std::vector<Array> b{full({5}, -2.0), full({1, 2}, 3.0)};
  Array ta = all_reduce_start(a, 0), tb = all_reduce_start(b, 1);
  expect_same_values(all_reduce_wait(tb, b, 1, /*mean=*/false), b);
  expect_same_values(all_reduce_wait(ta, a, 0), a);
}

TEST(Collectives, BadBucketsGetAClearError) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { all_reduce_start({}, 0); }).find("bucket 0 is empty"),
            std::string::npos);
  EXPECT_NE(message([] { all_reduce_start({full({2}, 1.0), full({2}, 1.0, DType::f64)}, 0); })
                .find("one dtype, got f32 and f64"),
            std::string::npos);
  EXPECT_NE(message([] { all_reduce_start({arange(3, DType::i32)}, 0); }).find("f32 or f64"),
            std::string::npos);
  EXPECT_NE(message([] { all_reduce_wait(full({2}, 1.0), {full({2}, 1.0)}, 0); })
                .find("the token is all_reduce_start's i64 scalar"),
            std::string::npos);
  EXPECT_NE(message([] { all_reduce_wait(full({}, 1, DType::i64), {full({2}, 1.0)}, 99); })
                .find("bucket 99 was never started"),
            std::string::npos);
  // A wait reads the exchange its token names, never a later one's sums.
  Array first = all_reduce_start({full({2}, 1.0)}, 7);
  Array again = all_reduce_start({full({2}, 2.0)}, 7);
  EXPECT_NE(message([&] { all_reduce_wait(first, {full({2}, 1.0)}, 7); })
                .find("bucket 7 was started again"),
            std::string::npos);
  EXPECT_EQ(all_reduce_wait(again, {full({2}, 1.0)}, 7)[0].to_vector<float>(),
            (std::vector<float>{2, 2}));
}

// The backward tells each gradient once, as soon as it is final: in a chain
// x -> w3 -> w2 -> w1 -> loss the last layer's first. The arrays told are
// the gradients returned.
TEST(GradReady, EachGradientIsToldOnceWhenFinal) {
  Params p{{"w1", full({3}, 0.5)}, {"w2", full({3}, 2.0)}, {"w3", full({3}, -1.0)},
           {"unused", full({2}, 1.0)}};
  Array x = arange(3, DType::f32);
  auto f = [&](const Params& q) {
    Array h = tanh(x * q.at("w3"));
    h = tanh(h * q.at("w2") + q.at("w3"));  // w3 read again, later in the forward
    return sum(h * q.at("w1"));
  };
  for (bool lazy : {false, true}) {
    SCOPED_TRACE(lazy ? "lazy" : "eager");
    std::vector<std::string> order;
    Params told;
    std::optional<LazyScope> scope;
    if (lazy) scope.emplace();
    auto [value, grads] = value_and_grad_params(f, p, [&](const std::string& n, const Array& g) {
      order.push_back(n);
      EXPECT_TRUE(told.emplace(n, g).second) << n << " told twice";
    });
    scope.reset();
    // "unused" (read by nothing) is final at once; w3, read first and last by
    // the forward, is final only when the whole backward is done.
    EXPECT_EQ(order, (std::vector<std::string>{"unused", "w1", "w2", "w3"}));
    auto [v2, plain] = value_and_grad(f)(p);
    for (auto& [name, g] : grads) {
      EXPECT_TRUE(g.same(told.at(name))) << name;
      EXPECT_EQ(g.to_vector<float>(), plain.at(name).to_vector<float>()) << name;
    }
  }
}

// Buckets fill in the order gradients are told and start when full; the
// last one (with the extras) at finish(). Means over one rank are the values.
TEST(GradBuckets, FillInReadyOrderAndStartWhenFull) {
  train::GradBuckets buckets(40);  // bytes: 10 f32
  buckets.ready("a", full({8}, 1.0));
  buckets.ready("b", full({4}, 2.0));  // 48 bytes: bucket 0 starts
  buckets.ready("c", full({2}, 3.0));
  buckets.ready("d", full({2}, 4.0, DType::f64));  // another dtype: bucket 1 starts
  buckets.ready("e", full({3}, 5.0));              // f32 again: bucket 2 starts
  auto [grads, extras] = buckets.finish({full({}, 9.0)});
  std::vector<std::vector<std::string>> want{{"a", "b"}, {"c"}, {"d"}, {"e", ""}};
  EXPECT_EQ(buckets.buckets(), want);
  EXPECT_EQ(grads.at("d").dtype(), DType::f64);
  EXPECT_EQ(grads.at("b").to_vector<float>(), std::vector<float>(4, 2.0f));
  EXPECT_EQ(grads.at("e").to_vector<float>(), std::vector<float>(3, 5.0f));
  ASSERT_EQ(extras.size(), 1u);
  EXPECT_EQ(extras[0].item<float>(), 9.0f);
}

nn::ViTConfig small_config() {
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 16, c.patch_size = 8, c.hidden_size = 16, c.num_attention_heads = 2;
  c.intermediate_size = 32, c.num_hidden_layers = 2, c.num_labels = 5;
  return c;
}

// A run whose gradients and loss go through the buckets (a small bucket
// cap: several buckets per step) computes what a run without them does, bit
// for bit, in every mode: the collectives change nothing in a group of one,
// and the compiled step still donates and replays.
TEST(GradBuckets, ATrainingRunThroughTheBucketsIsTheSameRun) {
  namespace fs = std::filesystem;
  for (const char* mode : {"eager", "lazy", "jit"}) {
    for (const char* device : {"cpu", "ref"}) {
      SCOPED_TRACE(std::string(mode) + " on " + device);
      train::TrainConfig c;
      nn::ViTConfig m = small_config();
      // Three labels: graphs of their own, which no other test's lazy runs
      // leave in the process's executable cache.
      m.num_labels = 3;
      c.model = nn::vit_model(m);
      c.batch_size = 4;
      c.steps = 4;
      c.warmup = 1;
      c.mode = train::parse_mode(mode);
      c.optimizer = "adamw";
      c.clip_norm = 1.0;
      c.workers = 0;
      c.device = device;
      std::string plain_dir = (fs::temp_directory_path() / "kiln-buckets-plain").string();
      std::string bucket_dir = (fs::temp_directory_path() / "kiln-buckets-on").string();
      c.save_dir = plain_dir;
      train::TrainConfig b = c;
      b.all_reduce_always = true;
      b.bucket_mb = 0.002;  // 2 kB: a bucket every few parameters
      b.save_dir = bucket_dir;
      auto rc = train::run(c), rb = train::run(b);
      ASSERT_EQ(rb.steps.size(), rc.steps.size());
      for (size_t i = 0; i < rc.steps.size(); ++i) EXPECT_EQ(rb.steps[i].loss, rc.steps[i].loss);
      Params pc = io::load_checkpoint(plain_dir).params, pb = io::load_checkpoint(bucket_dir).params;
      for (auto& [name, x] : pc)
        EXPECT_EQ(x.to_vector<float>(), pb.at(name).to_vector<float>()) << name;
      // Every timed step exchanged its buckets.
      EXPECT_GT(rb.all_reduces, 3u * (c.steps - c.warmup));
      EXPECT_EQ(rb.compiles, rc.compiles);
      EXPECT_EQ(rb.replays, rc.replays);
      fs::remove_all(plain_dir);
      fs::remove_all(bucket_dir);
    }
  }
}

}  // namespace
}  // namespace kiln
