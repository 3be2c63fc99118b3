// What the CPU backend does on each x86-64 ISA: the vector ISA its GEMMs run
// (which the utilization line's peak follows), and bf16 matmuls on every CPU:
// natively where oneDNN runs them on a bf16 unit (AVX-512 BF16, AMX), widened
// to f32 where there is none (AVX2-only CPUs, AVX-512 without BF16, or a
// capped oneDNN). scripts/test-isa.sh runs the suite with the ISA capped at
// AVX2 and sets KILN_EXPECT_GEMM_ISA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <tuple>

#include "backend/cpu/tiles.h"
#include "kiln/compiler.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

TEST(CpuIsa, GemmIsaIsTheOneTheCpuAndTheCapsAllow) {
  std::string isa = cpu_gemm_isa();
  EXPECT_TRUE(isa == "AVX-512" || isa == "AVX2" || isa == "SSE") << isa;
  if (!__builtin_cpu_supports("avx512f")) {
    EXPECT_NE(isa, "AVX-512");
  }
  if (const char* expected = std::getenv("KILN_EXPECT_GEMM_ISA")) {
    EXPECT_EQ(isa, expected) << "ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS did not take";
    // oneDNN has bf16 GEMMs from AVX-512 up only.
    if (std::string(expected) == "AVX2") {
      EXPECT_FALSE(cpu_bf16_gemm_native());
    }
  }
}

// bf16 GEMMs run natively exactly where they run on a bf16 unit; on a CPU
// without one (AVX-512 without BF16 included, where oneDNN would convert to
// f32 inside its matmul at a fifth of the f32 rate) kiln widens them.
TEST(CpuIsa, Bf16GemmsAreNativeOnlyOnABf16Unit) {
  const std::string unit = cpu_bf16_gemm_unit();
  EXPECT_EQ(cpu_bf16_gemm_native(), unit == "AMX" || unit == "AVX512-BF16") << unit;
  if (!__builtin_cpu_supports("avx512bf16")) {
    EXPECT_FALSE(cpu_bf16_gemm_native());
    EXPECT_EQ(unit, cpu_gemm_isa());
  }
}

// A bf16 GEMM's result against its f64 value on the same rounded operands:
// within tol, relative (absolute below 1).
struct Got {
  Array value;
  const std::vector<double>& want;
  double tol;
  const char* what;
};
void expect_close(const Got& g) {
  auto v = astype(g.value, DType::f64).to_vector<double>();
  ASSERT_EQ(v.size(), g.want.size()) << g.what;
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_NEAR(v[i], g.want[i], g.tol * std::max(1.0, std::fabs(g.want[i])))
        << g.what << " at flat index " << i;
}

// bf16 operands with f32 accumulation, against f64 on the same bf16-rounded
// values: unbatched (sgemm's path when widened) and batched (the matmul
// primitive), bf16 and f32 results, and a compiled epilogue (bias + GELU).
TEST(CpuIsa, Bf16MatmulsEqualF64OnTheRoundedOperands) {
  SCOPED_TRACE(cpu_bf16_gemm_native() ? "native bf16 GEMM" : "bf16 widened to f32");
  struct Case {
    Shape a, b;
    bool tb;
  } cases[] = {{{67, 45}, {129, 45}, true}, {{3, 20, 33}, {3, 33, 9}, false},
               {{2, 31, 64}, {64, 48}, false}};
  uint32_t seed = 7;
  for (const Case& c : cases) {
    SCOPED_TRACE(str(c.a) + " @ " + str(c.b));
    Array a = astype(random::normal(random::Key(seed++), c.a), DType::bf16);
    Array b = astype(random::normal(random::Key(seed++), c.b), DType::bf16);
    int64_t n = c.b[c.tb ? c.b.size() - 2 : c.b.size() - 1];
    Array bias = random::normal(random::Key(seed++), {n});
    const int64_t k = c.a.back();
    auto compute = [&](const std::vector<Array>& x, DType in, DType out) {
      return matmul(astype(x[0], in), astype(x[1], in), {false, c.tb, out});
    };
    auto want = compute({a, b}, DType::f64, DType::f64).to_vector<double>();
    auto epilogue = [&](const std::vector<Array>& x) {
      return std::vector<Array>{gelu(compute(x, DType::bf16, DType::f32) + x[2])};
    };
    auto want_epi = gelu(compute({a, b}, DType::f64, DType::f64) + astype(bias, DType::f64))
                        .to_vector<double>();
    const Got got[] = {
        {compute({a, b}, DType::bf16, DType::f32), want, 2e-6 * std::sqrt(double(k)), "f32 out"},
        {compute({a, b}, DType::bf16, DType::bf16), want, 8e-3, "bf16 out"},
        {jit(epilogue)({a, b, bias})[0], want_epi, 2e-6 * std::sqrt(double(k)), "epilogue"},
    };
    for (const Got& g : got) ASSERT_NO_FATAL_FAILURE(expect_close(g));
  }
}

// The weights' gradients, Aᵀ·B with A [k, m] and B [k, n] (k the batch's
// rows), in bf16 against f64 on the same rounded values, m below n and above
// it. On AMX, n a multiple of 32 with k >= 256 runs on kiln's own kernel
// (tiles::gemm_at_b: k over one to three of its chunks, and not a multiple
// of 32, the last chunk's rows one short of a square's 32 at k 543 and
// 1055; parts of several groups of A's rows, the last a partial one; m no
// multiple of 32, C's last band of rows partial (a vocabulary's 50257), in
// a part of whole bands and of one; the same bits on 1, 2 and 3 threads;
// C's parts by rows and, where m is less than half n, by columns); the
// others on oneDNN, m below n as Bᵀ·A transposed (matmul.cpp's
// runs_transposed).
TEST(CpuIsa, Bf16WeightGradientGemmsEqualF64OnTheRoundedOperands) {
  uint32_t seed = 11;
  struct Case {
    int64_t k, m, n;
  } cases[] = {{200, 24, 80},   {200, 80, 24}, {200, 33, 47},  {600, 64, 96},   {600, 96, 64},
               {300, 32, 32},   {600, 32, 96}, {300, 160, 64}, {600, 320, 64},  {543, 32, 64},
               {1055, 288, 64}, {600, 77, 64}, {543, 33, 96},  {1055, 301, 64}, {300, 5, 32}};
  for (auto [k, m, n] : cases) {
    SCOPED_TRACE("k " + std::to_string(k) + ", m " + std::to_string(m) + ", n " +
                 std::to_string(n));
    Array a = astype(random::normal(random::Key(seed++), {k, m}), DType::bf16);
    Array b = astype(random::normal(random::Key(seed++), {k, n}), DType::bf16);
    auto want = matmul(astype(a, DType::f64), astype(b, DType::f64), {true, false, DType::f64})
                    .to_vector<double>();
    for (DType out : {DType::f32, DType::bf16}) {
      Array got = matmul(a, b, {true, false, out});
      ASSERT_EQ(got.shape(), (Shape{m, n}));
      auto v = astype(got, DType::f64).to_vector<double>();
      const double tol = out == DType::f32 ? 2e-6 * std::sqrt(double(k)) : 8e-3;
      for (size_t i = 0; i < v.size(); ++i)
        ASSERT_NEAR(v[i], want[i], tol * std::max(1.0, std::fabs(want[i])))
            << name_of(out) << " result at flat index " << i;
      // kiln's kernel sums each value along k in one order whatever the
      // thread count (oneMKL's and oneDNN's GEMMs need not).
      if (!(k >= 256 && cpu::tiles::gemm_at_b_fits(m, n))) continue;
      const int saved = num_threads();
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        const auto again = matmul(a, b, {true, false, out});
        set_num_threads(saved);
        EXPECT_EQ(astype(again, DType::f64).to_vector<double>(), v)
            << name_of(out) << " result on " << threads << " threads";
      }
    }
  }
}

// A linear's forward and input-gradient GEMMs, A·Bᵀ and A·B with B no
// larger than A, in bf16 against f64 on the same rounded values, with odd
// sizes, both results and the step's epilogues (bias, then an f32 residual;
// bias, then GELU; a scalar factor). On AMX, n and k multiples of 32 run on
// kiln's own kernel (tiles::gemm_ab: here with a last band of fewer than 32
// rows, k over several of its chunks, n over two of its panels; the same
// bits on 1, 2 and 3 threads), the others on oneDNN with B reordered first
// into its blocked layout (matmul.cpp's blocks_weights).
TEST(CpuIsa, Bf16LinearGemmsEqualF64OnTheRoundedOperands) {
  struct Case {
    int64_t m, k, n;
    bool tb;
  } cases[] = {{100, 48, 40, true},   {100, 40, 48, false}, {77, 33, 19, true},
               {64, 64, 64, false},   {150, 320, 96, true}, {150, 320, 96, false},
               {300, 4096, 288, true}};
  uint32_t seed = 23;
  for (const Case& c : cases) {
    SCOPED_TRACE("m " + std::to_string(c.m) + ", k " + std::to_string(c.k) + ", n " +
                 std::to_string(c.n) + (c.tb ? ", B transposed" : ""));
    Array a = astype(random::normal(random::Key(seed++), {c.m, c.k}), DType::bf16);
    Array b = astype(random::normal(random::Key(seed++), c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}),
                     DType::bf16);
    Array bias = random::normal(random::Key(seed++), {c.n});
    Array residual = random::normal(random::Key(seed++), {c.m, c.n});
    Array factor = full({}, 0.5f);
    auto product = [&](const Array& x, const Array& y, DType out) {
      return matmul(x, y, {false, c.tb, out});
    };
    const Array a64 = astype(a, DType::f64), b64 = astype(b, DType::f64);
    const Array p64 = product(a64, b64, DType::f64), bias64 = astype(bias, DType::f64);
    auto want = p64.to_vector<double>();
    auto want_res = (p64 + bias64 + astype(residual, DType::f64)).to_vector<double>();
    auto want_gelu = gelu(p64 + bias64).to_vector<double>();
    auto want_scaled = (p64 * 0.5).to_vector<double>();
    auto with_residual = [&](const std::vector<Array>& x) {
      return std::vector<Array>{product(x[0], x[1], DType::f32) + x[2] + x[3]};
    };
    auto with_gelu = [&](const std::vector<Array>& x) {
      return std::vector<Array>{gelu(product(x[0], x[1], DType::f32) + x[2])};
    };
    auto scaled = [&](const std::vector<Array>& x) {
      return std::vector<Array>{product(x[0], x[1], DType::f32) * x[2]};
    };
    const double tol = 2e-6 * std::sqrt(double(c.k));
    const Got got[] = {
        {product(a, b, DType::f32), want, tol, "f32 out"},
        {product(a, b, DType::bf16), want, 8e-3, "bf16 out"},
        {jit(with_residual)({a, b, bias, residual})[0], want_res, tol, "bias and residual"},
        {jit(with_gelu)({a, b, bias})[0], want_gelu, tol, "bias and GELU"},
        {jit(scaled)({a, b, factor})[0], want_scaled, tol, "a scalar factor"},
    };
    for (const Got& g : got) ASSERT_NO_FATAL_FAILURE(expect_close(g));
    // kiln's kernel sums each value along k in one order whatever the
    // thread count.
    if (!cpu::tiles::gemm_ab_fits(c.m, c.n, c.k)) continue;
    const int saved = num_threads();
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      const auto again = product(a, b, DType::f32);
      const auto again_res = jit(with_residual)({a, b, bias, residual})[0];
      set_num_threads(saved);
      EXPECT_EQ(again.to_vector<float>(), got[0].value.to_vector<float>()) << threads << " threads";
      EXPECT_EQ(again_res.to_vector<float>(), got[2].value.to_vector<float>())
          << threads << " threads";
    }
  }
}

// A long reduction (k larger than m and n and no multiple of 32: a language
// model's head's input gradient over its vocabulary), which runs on oneMKL's
// bf16 GEMM on AMX (matmul.cpp's long_reduction_on_onemkl) and on oneDNN
// elsewhere: against f64 on the same rounded values, f32 and bf16 results,
// each operand stored either way.
TEST(CpuIsa, Bf16LongReductionGemmsEqualF64OnTheRoundedOperands) {
  uint32_t seed = 61;
  for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{40, 1001, 24}, {33, 517, 70}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE("m " + std::to_string(m) + ", k " + std::to_string(k) + ", n " +
                     std::to_string(n) + (ta ? ", A transposed" : "") +
                     (tb ? ", B transposed" : ""));
        const Array a = astype(random::normal(random::Key(seed++), ta ? Shape{k, m} : Shape{m, k}),
                               DType::bf16);
        const Array b = astype(random::normal(random::Key(seed++), tb ? Shape{n, k} : Shape{k, n}),
                               DType::bf16);
        const auto want =
            matmul(astype(a, DType::f64), astype(b, DType::f64), {ta, tb}).to_vector<double>();
        const Got got[] = {
            {matmul(a, b, {ta, tb, DType::f32}), want, 2e-6 * std::sqrt(double(k)), "f32 out"},
            {matmul(a, b, {ta, tb, DType::bf16}), want, 8e-3, "bf16 out"},
        };
        for (const Got& g : got) ASSERT_NO_FATAL_FAILURE(expect_close(g));
      }
}

}  // namespace
}  // namespace kiln
