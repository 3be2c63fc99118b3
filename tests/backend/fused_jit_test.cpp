// The cpu backend's fused programs as AVX-512 machine code
// (src/backend/cpu/fused_jit.cpp) against its interpreter (fused.cpp), which
// the op table and the compiler tests check against the unfused ops: random
// programs of every op the generator emits, over Whole, Row and Scalar reads
// of f32 and bf16 inputs, bf16-rounded instructions, f32 and bf16 outputs,
// lengths with and without a tail, and values that test the rounding (ties,
// NaN, infinities, signed zeros, subnormals), as FusedElementwise and as
// the bodies and epilogues of FusedReduce's row, column and segmented sums.
// Equal bit for bit (any NaN equals any NaN). Where the build or the CPU has
// no AVX-512 the generator is off and the tests say so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/fused_jit.h"
#include "kiln/kiln.h"
#include "ops/dispatch.h"

namespace kiln {
namespace {

constexpr Op kOps[] = {Op::Add,  Op::Sub, Op::Mul, Op::Div,      Op::Maximum, Op::Minimum,
                       Op::Relu, Op::Neg, Op::Abs, Op::ReluGrad, Op::Sqrt};  // Sqrt last

// Random values, with the special ones mixed in unless `plain`.
Array values(std::mt19937& rng, const Shape& shape, DType dt, bool plain = false) {
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f + 1.0f / 256,  // a bf16 tie, rounds down
                            1.0f + 3.0f / 256,  // a tie that rounds up
                            -2.5f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e-40f,
                            -3e38f,
                            3.3895314e38f};  // rounds to infinity in bf16
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 5), which(0, std::size(specials) - 1);
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (float& x : v) x = !plain && pick(rng) == 0 ? specials[which(rng)] : normal(rng);
  return astype(Array::from_vector(v, shape), dt);
}

std::vector<uint16_t> bits16(const Array& a) {
  const auto* p = static_cast<const uint16_t*>(a.raw());
  return {p, p + numel(a.shape())};
}

// Equal bit for bit, or both NaN.
void expect_same(const Array& jit, const Array& interpreted, const std::string& what) {
  ASSERT_EQ(jit.dtype(), interpreted.dtype()) << what;
  const int64_t n = numel(jit.shape());
  if (jit.dtype() == DType::bf16) {
    const auto a = bits16(jit), b = bits16(interpreted);
    for (int64_t i = 0; i < n; ++i) {
      const bool nan_a = (a[i] & 0x7fff) > 0x7f80, nan_b = (b[i] & 0x7fff) > 0x7f80;
      if (a[i] != b[i] && !(nan_a && nan_b)) {
        ADD_FAILURE() << what << ": element " << i << " 0x" << std::hex << a[i] << " vs 0x" << b[i];
        return;
      }
    }
    return;
  }
  const float* a = jit.data<float>();
  const float* b = interpreted.data<float>();
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      ADD_FAILURE() << what << ": element " << i << " " << a[i] << " vs " << b[i];
      return;
    }
}

// A random program over `ni` inputs: 1-6 instructions of the generator's ops
// (but sqrt where `finite`) on any earlier register, some rounded to bf16.
std::vector<FusedInstr> random_program(std::mt19937& rng, int ni, bool finite = false) {
  std::uniform_int_distribution<int> len(1, 6), op(0, std::size(kOps) - (finite ? 2 : 1)),
      coin(0, 2);
  std::vector<FusedInstr> program;
  const int count = len(rng);
  for (int i = 0; i < count; ++i) {
    std::uniform_int_distribution<int> reg(0, ni + i - 1);
    const Op o = kOps[op(rng)];
    const bool unary = op_kind(o) == OpKind::Unary;
    program.push_back({o, reg(rng), unary ? -1 : reg(rng), coin(rng) == 0});
  }
  return program;
}

// Runs `make` with the generator on and off; returns {machine code, interpreter}.
template <typename F>
std::pair<Array, Array> both(F make) {
  cpu::set_fused_jit_enabled(true);
  Array a = make();
  a.eval();
  cpu::set_fused_jit_enabled(false);
  Array b = make();
  b.eval();
  cpu::set_fused_jit_enabled(true);
  return {a, b};
}

bool jit_on() {
  return cpu::fused_jit_enabled();
}

TEST(FusedJit, RandomProgramsEqualTheInterpreterBitForBit) {
  if (!jit_on()) GTEST_SKIP() << "no AVX-512 build or CPU, or KILN_FUSED=interpret";
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> inputs(1, 4), read(0, 2), coin(0, 1), rows(1, 40), cols(1, 37);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t r = cols(rng), lead = rows(rng);
    const Shape shape{lead, r};
    const int ni = inputs(rng);
    FusedAttrs attrs;
    std::vector<Array> in;
    std::vector<bool> bf16_in;
    for (int k = 0; k < ni; ++k) {
      const auto mode = k == 0 ? FusedRead::Whole : static_cast<FusedRead>(read(rng));
      const DType dt = coin(rng) ? DType::bf16 : DType::f32;
      attrs.reads.push_back(mode);
      bf16_in.push_back(dt == DType::bf16);
      in.push_back(values(rng,
                          mode == FusedRead::Whole ? shape
                          : mode == FusedRead::Row ? Shape{r}
                                                   : Shape{},
                          dt));
    }
    attrs.program = random_program(rng, ni);
    const DType out = coin(rng) ? DType::bf16 : DType::f32;
    ASSERT_NE(cpu::fused_jit(attrs, bf16_in, out == DType::bf16), nullptr);
    const Primitive prim(Op::FusedElementwise, attrs);
    auto [jit, interpreted] = both([&] { return make_array(prim, in, shape, out); });
    expect_same(jit, interpreted, "trial " + std::to_string(trial) + ": " + prim.str());
  }
}

TEST(FusedJit, ReductionBodiesAndEpiloguesEqualTheInterpreterBitForBit) {
  if (!jit_on()) GTEST_SKIP() << "no AVX-512 build or CPU, or KILN_FUSED=interpret";
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> coin(0, 1);
  // Row sums, column sums, a segmented column sum (one slice of >= 1024
  // rows), and sums over the middle axis.
  const struct {
    Shape shape;
    std::vector<int> axes;
  } cases[] = {{{33, 300}, {1}}, {{300, 33}, {0}}, {{2048, 24}, {0}}, {{3, 1500, 5}, {1}}};
  for (int trial = 0; trial < 60; ++trial) {
    const auto& c = cases[trial % std::size(cases)];
    const int ni = 2;
    // Finite sums (a NaN in a column would hide the others' order).
    FusedAttrs body{{FusedRead::Whole, FusedRead::Whole}, random_program(rng, ni, true)};
    std::vector<Array> in;
    for (int k = 0; k < ni; ++k)
      in.push_back(values(rng, c.shape, coin(rng) ? DType::bf16 : DType::f32, true));
    Shape out_shape = c.shape;
    for (int a : c.axes) out_shape[a] = 1;
    // The epilogue: the sums times a scalar, then a random step.
    FusedAttrs epilogue{{FusedRead::Whole, FusedRead::Scalar},
                        {{Op::Mul, 0, 1, false}, {coin(rng) ? Op::Sqrt : Op::Neg, 2, -1, false}}};
    in.push_back(values(rng, {}, DType::f32));
    const Primitive prim(Op::FusedReduce,
                         FusedReduceAttrs{body, c.shape, {c.axes, true}, epilogue, 0});
    auto [jit, interpreted] = both([&] { return make_array(prim, in, out_shape, DType::f32); });
    expect_same(jit, interpreted, "trial " + std::to_string(trial) + ": " + prim.str());
  }
}

}  // namespace
}  // namespace kiln
