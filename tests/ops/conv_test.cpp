// Convolution, pooling and channel normalization beyond the op table
// (tests/ops/op_table_test.cpp checks their values and gradients on every
// backend): the errors that name what does not fit, bf16 on the cpu's
// oneDNN path against f64, the CUDA backend's cuDNN path and its direct
// kernels, and BatchNorm's running statistics as PyTorch updates them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "../gpu_device.h"
#include "../test_util.h"
#include "backend/cpu/kernels.h"
#include "kiln/kiln.h"
#include "ops/conv_geometry.h"

namespace kiln {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Conv, ErrorsNameWhatDoesNotFit) {
  EXPECT_EQ(error_of([] {
              conv2d(zeros({1, 3, 4, 4}), zeros({2, 3, 5, 5}));
            }),
            "[Conv] the window 5x5 does not fit the input 4x4 padded to 4x4");
  EXPECT_EQ(error_of([] {
              conv2d(zeros({1, 3, 4, 4}), zeros({2, 3, 3, 3}), {.dilation = {2}});
            }),
            "[Conv] the window 3x3 dilated to 5x5 does not fit the input 4x4 padded to 4x4");
  EXPECT_EQ(error_of([] {
              conv2d(zeros({1, 6, 4, 4}), zeros({4, 3, 1, 1}), {.groups = 4});
            }),
            "[Conv] 6 input and 4 output channels do not divide into 4 groups");
  EXPECT_EQ(error_of([] {
              conv2d(zeros({1, 6, 4, 4}), zeros({4, 6, 1, 1}), {.groups = 2});
            }),
            "[Conv] weight (4,6,1,1) has 6 input channels per group, expected 3 (6 channels in 2 "
            "groups)");
  EXPECT_EQ(error_of([] {
              conv2d(zeros({6, 4, 4}), zeros({4, 6, 1, 1}));
            }),
            "[conv2d] input (6,4,4): expected rank 4, [batch, channels, height, width]");
  EXPECT_EQ(error_of([] {
              conv2d(zeros({1, 2, 4, 4}), zeros({1, 2, 1, 1}), {.stride = {1, 0}});
            }),
            "[Conv] stride (1,0): expected entries >= 1");
  EXPECT_EQ(error_of([] {
              conv2d(zeros({1, 2, 4, 4}), zeros({1, 2, 1, 1}), {.stride = {1, 1, 1}});
            }),
            "[conv2d] stride has 3 entries, expected 1 or 2 (one per spatial axis)");
  EXPECT_EQ(error_of([] {
              conv2d(zeros({1, 2, 4, 4}), zeros({1, 2, 1, 1}, DType::f64));
            }),
            "[Conv] input is f32 (1,2,4,4) and weight f64 (1,2,1,1): expected one dtype");
  EXPECT_EQ(error_of([] {
              max_pool2d(zeros({1, 2, 4, 4}), {3}, {.padding = {{2, 2}}});
            }),
            "[Pool] padding (2,2) before and (2,2) after: expected at most half the window (3,3)");
  EXPECT_EQ(error_of([] {
              adaptive_avg_pool2d(zeros({1, 2, 4, 4}), 0, 1);
            }),
            "[adaptive_avg_pool2d] output size 0x1: expected at least 1x1");
}

// The output sizes of PyTorch's formula, "same" padding's included.
TEST(Conv, OutputSizesFollowPyTorch) {
  const Array x = zeros({1, 2, 10, 11});
  EXPECT_EQ(conv2d(x, zeros({3, 2, 3, 3})).shape(), (Shape{1, 3, 8, 9}));
  EXPECT_EQ(conv2d(x, zeros({3, 2, 3, 3}), {.stride = {2}, .padding = {{1, 1}}}).shape(),
            (Shape{1, 3, 5, 6}));
  EXPECT_EQ(conv2d(x, zeros({3, 2, 3, 3}), {.same = true}).shape(), (Shape{1, 3, 10, 11}));
  EXPECT_EQ(conv2d(x, zeros({3, 2, 4, 4}), {.stride = {3}, .same = true}).shape(),
            (Shape{1, 3, 4, 4}));
  EXPECT_EQ(conv2d(x, zeros({4, 1, 7, 7}), {.same = true, .groups = 2}).shape(),
            (Shape{1, 4, 10, 11}));
  EXPECT_EQ(max_pool2d(x, {3}, {.stride = {2}, .padding = {{1, 1}}}).shape(), (Shape{1, 2, 5, 6}));
  EXPECT_EQ(adaptive_avg_pool2d(x, 1, 1).shape(), (Shape{1, 2, 1, 1}));
  EXPECT_EQ(conv1d(zeros({2, 3, 9}), zeros({4, 3, 3}), {.dilation = {2}}).shape(),
            (Shape{2, 4, 5}));
}

double max_abs(const Array& a) {
  double m = 0;
  for (double v : astype(a, DType::f64).to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

// bf16 convolutions (oneDNN on a bf16 unit, or widened to f32) against f64
// on the bf16-rounded operands: the sums in f32, the result rounded once.
TEST(Conv, Bf16MatchesF64OnTheRoundedOperands) {
  const Array x = astype(random::normal(random::Key(1), {2, 8, 9, 9}), DType::bf16);
  for (int variant = 0; variant < 3; ++variant) {
    const bool channels_last = variant > 0, depthwise = variant == 2;
    SCOPED_TRACE(depthwise ? "NHWC depthwise" : channels_last ? "NHWC" : "NCHW");
    const Array w =
        astype(random::normal(random::Key(2), depthwise ? Shape{8, 1, 3, 3} : Shape{16, 8, 3, 3}),
               DType::bf16);
    const Array xi = channels_last ? transpose(x, {0, 2, 3, 1}) : x;
    const ConvOptions opt{.stride = {2},
                          .padding = {{1, 1}},
                          .groups = depthwise ? 8 : 1,
                          .channels_last = channels_last};
    auto loss = [&](const std::vector<Array>& p) {
      return std::vector<Array>{sum(astype(conv2d(p[0], p[1], opt), DType::f32))};
    };
    const Array y = conv2d(xi, w, opt);
    const Array y64 = conv2d(astype(xi, DType::f64), astype(w, DType::f64), opt);
    ASSERT_EQ(y.dtype(), DType::bf16);
    EXPECT_LE(max_abs(astype(y, DType::f64) - y64), 1e-2 * max_abs(y64));
    auto [out, g] = vjp(loss, {xi, w}, {ones({}, DType::f32)});
    auto [out64, g64] = vjp(
        [&](const std::vector<Array>& p) {
          return std::vector<Array>{sum(conv2d(p[0], p[1], opt))};
        },
        {astype(xi, DType::f64), astype(w, DType::f64)}, {ones({}, DType::f64)});
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE(max_abs(astype(g[i], DType::f64) - g64[i]), 1e-2 * max_abs(g64[i])) << i;
  }
}

// f32 convolutions against f64 on shapes where oneDNN picks its Winograd
// kernels on an AVX-512 CPU (ResNet's 3x3 stride-1 convolutions: forward and
// backward data at a batch of 16 and 64 channels, backward weights at 256
// channels), and the direct kernels elsewhere: within f32's rounding of
// such sums, forward and both gradients, NHWC and NCHW.
TEST(Conv, F32MatchesF64WhereOneDnnPicksWinograd) {
  struct Case {
    int64_t n, hw, c;
    bool channels_last;
  };
  for (const auto& [n, hw, c, channels_last] :
       {Case{16, 14, 64, true}, Case{1, 14, 256, true}, Case{1, 14, 256, false}}) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(c) + (channels_last ? " NHWC" : " NCHW"));
    const Array x =
        random::normal(random::Key(1), channels_last ? Shape{n, hw, hw, c} : Shape{n, c, hw, hw});
    const Array w = random::normal(random::Key(2), {c, c, 3, 3});
    const Array dy = random::normal(random::Key(3), x.shape());
    const ConvOptions opt{.padding = {{1, 1}}, .channels_last = channels_last};
    auto conv_dot = [&](const Array& dy_) {
      return [&, dy_](const std::vector<Array>& p) {
        return std::vector<Array>{sum(conv2d(p[0], p[1], opt) * dy_)};
      };
    };
    const Array x64 = astype(x, DType::f64), w64 = astype(w, DType::f64);
    const Array y = conv2d(x, w, opt), y64 = conv2d(x64, w64, opt);
    EXPECT_LE(max_abs(astype(y, DType::f64) - y64), 1e-5 * max_abs(y64));
    auto [out, g] = vjp(conv_dot(dy), {x, w}, {ones({}, DType::f32)});
    auto [out64, g64] = vjp(conv_dot(astype(dy, DType::f64)), {x64, w64}, {ones({}, DType::f64)});
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE(max_abs(astype(g[i], DType::f64) - g64[i]), 1e-5 * max_abs(g64[i])) << i;
  }
}

// Pointwise convolutions over channels-last activations (ResNet's
// bottleneck 1x1s and strided shortcuts) run on the cpu as GEMMs: forward
// and both gradients against f64, in f32 and in bf16 (on the bf16 unit, or
// widened to f32), unstrided and strided (odd sizes: pixels no window reads
// get a zero gradient); the other shapes stay on oneDNN's primitives.
TEST(Conv, PointwiseRunsAsGemmAndMatchesF64) {
  const Array x = random::normal(random::Key(1), {3, 7, 5, 24});
  const Array w = random::normal(random::Key(2), {40, 24, 1, 1});
  ConvAttrs a{.stride = {1, 1}, .dilation = {1, 1}, .pad_lo = {0, 0}, .pad_hi = {0, 0}};
  a.channels_last = true;
  auto runs_as_gemm = [&](ConvAttrs b, const Shape& xs, const Shape& ws) {
    return cpu::conv_runs_as_gemm(conv_geometry(b, xs, ws, "test"));
  };
  EXPECT_TRUE(runs_as_gemm(a, x.shape(), w.shape()));
  ConvAttrs strided = a, nchw = a, grouped = a, padded = a;
  strided.stride = {2, 3};
  nchw.channels_last = false;
  grouped.groups = 2;
  padded.pad_lo = padded.pad_hi = {1, 1};
  EXPECT_TRUE(runs_as_gemm(strided, x.shape(), w.shape()));
  EXPECT_FALSE(runs_as_gemm(nchw, {3, 24, 7, 5}, w.shape()));
  EXPECT_FALSE(runs_as_gemm(grouped, x.shape(), {40, 12, 1, 1}));
  EXPECT_FALSE(runs_as_gemm(padded, x.shape(), w.shape()));
  EXPECT_FALSE(runs_as_gemm(a, x.shape(), {40, 24, 3, 3}));
  for (const Shape& stride : {Shape{1}, Shape{2}, Shape{2, 3}}) {
    const ConvOptions opt{.stride = stride, .channels_last = true};
    const Array dy = random::normal(random::Key(3), conv2d(x, w, opt).shape());
    auto conv_dot = [&](const Array& dy_) {
      return [&, dy_](const std::vector<Array>& p) {
        return std::vector<Array>{sum(astype(conv2d(p[0], p[1], opt), dy_.dtype()) * dy_)};
      };
    };
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(name_of(dt)) + ", stride " + std::to_string(stride[0]) + "x" +
                   std::to_string(stride.back()));
      const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
      const Array xd = astype(x, dt), wd = astype(w, dt);
      const Array x64 = astype(xd, DType::f64), w64 = astype(wd, DType::f64);
      const Array y = conv2d(xd, wd, opt), y64 = conv2d(x64, w64, opt);
      ASSERT_EQ(y.dtype(), dt);
      EXPECT_LE(max_abs(astype(y, DType::f64) - y64), tol * max_abs(y64));
      const Array dyd = astype(dy, dt);
      auto [out, g] = vjp(conv_dot(astype(dyd, DType::f32)), {xd, wd}, {ones({}, DType::f32)});
      auto [out64, g64] =
          vjp(conv_dot(astype(dyd, DType::f64)), {x64, w64}, {ones({}, DType::f64)});
      for (size_t i = 0; i < 2; ++i) {
        ASSERT_EQ(g[i].dtype(), dt);
        EXPECT_LE(max_abs(astype(g[i], DType::f64) - g64[i]), tol * max_abs(g64[i])) << i;
      }
      if (stride.size() == 1 && stride[0] == 2) {  // rows 1, 3 and 5: in no window
        EXPECT_EQ(max_abs(slice(g[0], {0, 1, 0, 0}, {3, 7, 5, 24}, {1, 2, 1, 1})), 0.0);
      }
    }
  }
}

// ---- The CUDA backend's convolutions: cuDNN wherever its legacy API
// expresses the convolution (symmetric padding, or padding after that adds
// no output), the direct kernels elsewhere, each forward and both gradients
// against the cpu in f64, f32 and bf16. KILN_CUDA_CONV=cudnn makes a
// convolution cuDNN does not run an error: the proof that cuDNN ran the
// others in f32 and bf16 (on a GPU, cuDNN itself; here, the emulator's).
using test_util::ScopedEnv;

TEST(Conv, GpuRunsOnCudnnWhereItsApiExpressesTheConvolution) {
  KILN_REQUIRE_GPU();
  if (gpu_tests_on_ref()) GTEST_SKIP() << "cuDNN is the cuda backend's";
  {
    ScopedEnv env("KILN_CUDA_CONV", "cudnn");
    const std::string e = error_of([] {
      conv2d(ones({1, 2, 3, 3}).to(test_gpu()), ones({1, 2, 1, 1}).to(test_gpu()))
          .to(Device::cpu());
    });
    if (e.find("built without cuDNN's headers") != std::string::npos) GTEST_SKIP() << e;
  }
  struct Case {
    const char* name;
    Shape x, w;
    ConvOptions opt;
    bool cudnn;
  };
  const std::vector<Case> cases = {
      // ResNet's strided 3x3, channels-last: the filter goes to cuDNN as KRSC.
      {"3x3 stride 2 NHWC",
       {2, 9, 9, 8},
       {6, 8, 3, 3},
       {.stride = {2}, .padding = {{1, 1}}, .channels_last = true},
       true},
      {"1x1 NCHW", {2, 8, 5, 5}, {4, 8, 1, 1}, {}, true},
      {"depthwise 7x7 same NHWC",
       {2, 8, 9, 8},
       {8, 1, 7, 7},
       {.same = true, .groups = 8, .channels_last = true},
       true},
      {"grouped dilated NCHW",
       {1, 4, 9, 8},
       {6, 2, 3, 3},
       {.dilation = {2}, .padding = {{2, 2}}, .groups = 2},
       true},
      {"grouped 3x2 NHWC",
       {2, 6, 7, 6},
       {6, 3, 3, 2},
       {.stride = {1, 2}, .padding = {{1, 1}, {0, 0}}, .groups = 2, .channels_last = true},
       true},
      // Patches with leftovers: no padding after is needed for the outputs.
      {"4x4 patches", {2, 3, 9, 8}, {5, 3, 4, 4}, {.stride = {4}}, true},
      // Padding that differs before and after and changes the output count.
      {"asymmetric padding",
       {1, 2, 7, 8},
       {3, 2, 3, 3},
       {.stride = {2, 1}, .dilation = {1, 2}, .padding = {{1, 0}, {2, 1}}},
       false},
      {"2x2 same NHWC", {1, 5, 6, 4}, {4, 4, 2, 2}, {.same = true, .channels_last = true}, false},
  };
  for (const Case& c : cases) {
    for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(c.name) + ", " + name_of(dt));
      const Array x = astype(random::normal(random::Key(3), c.x, DType::f64), dt);
      const Array w = astype(random::normal(random::Key(4), c.w, DType::f64), dt);
      const Array y0 = conv2d(astype(x, DType::f64), astype(w, DType::f64), c.opt);
      const Array dy = astype(random::normal(random::Key(5), y0.shape(), DType::f64), dt);
      auto run = [&](Device d) {
        auto [out, g] = vjp(
            [&](const std::vector<Array>& p) {
              return std::vector<Array>{conv2d(p[0], p[1], c.opt)};
            },
            {x.to(d), w.to(d)}, {dy.to(d)});
        return std::vector<Array>{astype(out[0].to(Device::cpu()), DType::f64),
                                  astype(g[0].to(Device::cpu()), DType::f64),
                                  astype(g[1].to(Device::cpu()), DType::f64)};
      };
      // The cpu in f64 on the same (rounded) operands is the reference.
      auto [ref_out, ref_g] = vjp(
          [&](const std::vector<Array>& p) {
            return std::vector<Array>{conv2d(p[0], p[1], c.opt)};
          },
          {astype(x, DType::f64), astype(w, DType::f64)}, {astype(dy, DType::f64)});
      const std::vector<Array> ref = {ref_out[0], ref_g[0], ref_g[1]};
      const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 1e-2;
      // f32 and bf16 (what training runs) must run on cuDNN; f64 may not
      // (cuDNN's double kernels cover fewer layouts).
      const bool strict = c.cudnn && dt != DType::f64;
      for (const char* kernels : {strict ? "cudnn" : "auto", "direct"}) {
        SCOPED_TRACE(std::string("KILN_CUDA_CONV=") + kernels);
        ScopedEnv env("KILN_CUDA_CONV", kernels);
        const std::vector<Array> got = run(test_gpu());
        for (size_t i = 0; i < 3; ++i)
          EXPECT_LE(max_abs(got[i] - ref[i]), tol * max_abs(ref[i])) << (i == 0   ? "y"
                                                                         : i == 1 ? "dx"
                                                                                  : "dw");
      }
      if (!c.cudnn) {
        ScopedEnv env("KILN_CUDA_CONV", "cudnn");
        EXPECT_NE(error_of([&] { run(test_gpu()); })
                      .find("KILN_CUDA_CONV=cudnn, but cuDNN does not run this convolution: "
                            "padding ("),
                  std::string::npos);
      }
    }
  }
  ScopedEnv env("KILN_CUDA_CONV", "sideways");
  EXPECT_EQ(error_of([&] {
              conv2d(zeros({1, 2, 4, 4}).to(test_gpu()), zeros({1, 2, 1, 1}).to(test_gpu()))
                  .to(Device::cpu());
            }),
            "[Conv] KILN_CUDA_CONV is 'sideways', expected auto, cudnn or direct");
}

// Channels-last pooling (its own cpu kernel: windows over an image's
// contiguous channels) equals NCHW pooling (a plane at a time) bit for bit,
// forward and backward, max (with ties and NaNs) and average (padding
// counted and not), f32 and bf16.
TEST(Pool, ChannelsLastEqualsChannelsFirstBitForBit) {
  std::vector<float> v(2 * 5 * 7 * 6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 11) - 5.0f;  // ties
  v[17] = std::nanf("");
  v[100] = std::nanf("");
  const Array x0 = Array::from_vector<float>(v, {2, 5, 7, 6});
  const Array dy0 = random::normal(random::Key(3), {2, 5, 4, 3});
  for (DType dt : {DType::f32, DType::bf16}) {
    const Array x = astype(x0, dt), dy = astype(dy0, dt);
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE(std::string(name_of(dt)) + " kind " + std::to_string(kind));
      auto pool = [&](const Array& in, bool cl) {
        const PoolOptions o{.stride = {2},
                            .padding = {{1, 1}},
                            .channels_last = cl,
                            .count_include_pad = kind == 1};
        return kind == 0 ? max_pool2d(in, {3}, o) : avg_pool2d(in, {3}, o);
      };
      const Array xl = transpose(x, {0, 2, 3, 1});
      auto [y, gx] =
          vjp([&](const std::vector<Array>& p) { return std::vector<Array>{pool(p[0], false)}; },
              {x}, {dy});
      auto [yl, gxl] =
          vjp([&](const std::vector<Array>& p) { return std::vector<Array>{pool(p[0], true)}; },
              {xl}, {transpose(dy, {0, 2, 3, 1})});
      ASSERT_EQ(yl[0].shape(), (Shape{2, 4, 3, 5}));
      const auto a = astype(transpose(yl[0], {0, 3, 1, 2}), DType::f64).to_vector<double>(),
                 b = astype(y[0], DType::f64).to_vector<double>();
      const auto ga = astype(transpose(gxl[0], {0, 3, 1, 2}), DType::f64).to_vector<double>(),
                 gb = astype(gx[0], DType::f64).to_vector<double>();
      ASSERT_EQ(a.size(), b.size());
      int nans = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(b[i])) {
          ++nans;
          EXPECT_TRUE(std::isnan(a[i])) << i;
        } else {
          EXPECT_EQ(a[i], b[i]) << i;
        }
      }
      EXPECT_GT(nans, 0);
      for (size_t i = 0; i < ga.size(); ++i) {
        if (!std::isnan(gb[i])) {
          EXPECT_EQ(ga[i], gb[i]) << i;
        }
      }
    }
  }
}

// PyTorch's BatchNorm2d(3) in training: the batch's mean and biased variance
// normalize; the running statistics move by momentum towards the batch mean
// and the unbiased variance.
TEST(BatchNorm, RunningStatisticsMoveAsPyTorchMovesThem) {
  std::vector<double> v(2 * 3 * 2 * 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(1.0 + 0.7 * i) * (1 + i % 5);
  const Array x = Array::from_vector<double>(v, {2, 3, 2, 2});
  const Array rm = Array::from_vector<double>({0.5, -1, 2}, {3});
  const Array rv = Array::from_vector<double>({1, 2, 0.25}, {3});
  const BatchNormResult r =
      batch_norm(x, Array(), Array(), rm, rv, {.training = true, .momentum = 0.2});
  const std::vector<double> y = r.y.to_vector<double>(), m = r.running_mean.to_vector<double>(),
                            var = r.running_var.to_vector<double>();
  const double old_m[] = {0.5, -1, 2}, old_v[] = {1, 2, 0.25};
  for (int c = 0; c < 3; ++c) {
    std::vector<double> xs;
    for (int n = 0; n < 2; ++n)
      for (int k = 0; k < 4; ++k) xs.push_back(v[(n * 3 + c) * 4 + k]);
    double mu = 0, ss = 0;
    for (double e : xs) mu += e / 8;
    for (double e : xs) ss += (e - mu) * (e - mu);
    EXPECT_NEAR(m[c], 0.8 * old_m[c] + 0.2 * mu, 1e-12);
    EXPECT_NEAR(var[c], 0.8 * old_v[c] + 0.2 * ss / 7, 1e-12);
    for (int n = 0; n < 2; ++n)
      for (int k = 0; k < 4; ++k)
        EXPECT_NEAR(y[(n * 3 + c) * 4 + k],
                    (v[(n * 3 + c) * 4 + k] - mu) / std::sqrt(ss / 8 + 1e-5), 1e-12);
  }
  // In evaluation the running statistics normalize and stay.
  const BatchNormResult e = batch_norm(x, Array(), Array(), rm, rv);
  EXPECT_NEAR(e.y.to_vector<double>()[5], (v[5] - (-1)) / std::sqrt(2 + 1e-5), 1e-12);
  EXPECT_EQ(e.running_mean.to_vector<double>(), rm.to_vector<double>());
  // Their gradients stop at the statistics.
  auto [out, g] = vjp(
      [&](const std::vector<Array>& p) {
        return std::vector<Array>{
            sum(batch_norm(p[0], Array(), Array(), p[1], p[2], {.training = true}).running_mean)};
      },
      {x, rm, rv}, {ones({}, DType::f64)});
  EXPECT_TRUE(!g[0].valid() || max_abs(g[0]) == 0.0);
  EXPECT_NEAR(g[1].to_vector<double>()[0], 0.9, 1e-15);
  EXPECT_EQ(error_of([&] {
              batch_norm(zeros({1, 3}), Array(), Array(), Array(), Array(), {.training = true});
            }),
            "[batch_norm] input (1,3) has 1 value per channel: training needs more than one "
            "(PyTorch's rule)");
  EXPECT_EQ(error_of([&] {
              batch_norm(zeros({2, 3}), zeros({4}), Array(), Array(), Array());
            }),
            "[batch_norm] weight (4): expected (3), one value per channel");
}

}  // namespace
}  // namespace kiln
