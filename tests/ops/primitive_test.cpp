// Primitive's hash and printing are generic over each attribute type's
// KILN_FIELDS: changing any one member of any attribute type changes the hash
// (the jit cache's key) and the printed form.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/primitive.h"

namespace kiln {
namespace {

// Each variant of `base` made by `edits` (one member changed each) differs
// from base, and from every other variant, in ==, hash and str.
template <typename A>
void expect_every_field_counts(Op op, const A& base,
                               const std::vector<std::function<void(A&)>>& edits) {
  std::vector<Primitive> ps{Primitive(op, base)};
  for (const auto& edit : edits) {
    A a = base;
    edit(a);
    ps.emplace_back(op, a);
  }
  for (size_t i = 0; i < ps.size(); ++i)
    for (size_t j = i + 1; j < ps.size(); ++j) {
      SCOPED_TRACE(ps[i].str() + " vs " + ps[j].str());
      EXPECT_FALSE(ps[i] == ps[j]);
      EXPECT_NE(ps[i].hash(), ps[j].hash());
      EXPECT_NE(ps[i].str(), ps[j].str());
    }
  EXPECT_EQ(ps[0].hash(), Primitive(op, base).hash());
}

TEST(Primitive, EveryAttributeFieldReachesTheHashAndThePrintedForm) {
  expect_every_field_counts<MatmulAttrs>(
      Op::Matmul, {false, true, DType::f32, false},
      {[](auto& a) { a.transpose_a = true; }, [](auto& a) { a.transpose_b = false; },
       [](auto& a) { a.out = DType::bf16; }, [](auto& a) { a.tf32 = true; }});
  expect_every_field_counts<SliceAttrs>(
      Op::Slice, {{0, 1}, {2, 3}, {1, 1}, {4, 4}},
      {[](auto& a) { a.start[1] = 0; }, [](auto& a) { a.stop[0] = 1; },
       [](auto& a) { a.step[0] = 2; },
       [](auto& a) {
         a.full = {4, 5};
       }});
  RandomAttrs r{{1, 2}, RandomKind::Normal, 0, 1, {3}, DType::f32};
  expect_every_field_counts<RandomAttrs>(
      Op::Random, r,
      {[](auto& a) { a.key[0] = 9; }, [](auto& a) { a.key[1] = 9; },
       [](auto& a) { a.kind = RandomKind::Uniform; }, [](auto& a) { a.a = -1; },
       [](auto& a) { a.b = 2; }, [](auto& a) { a.shape = {4}; },
       [](auto& a) { a.dtype = DType::bf16; }, [](auto& a) { a.fold = true; },
       [](auto& a) { a.fold_data = 7; }});
  expect_every_field_counts<FillAttrs>(Op::Fill, {0, 1},
                                       {[](auto& a) { a.start = 1; }, [](auto& a) { a.step = 2; }});
  FusedAttrs body{{FusedRead::Whole, FusedRead::Row}, {{Op::Mul, 0, 1}, {Op::Exp, 2, -1}}};
  FusedReduceAttrs fr{body, {4, 8}, {{1}, false}, {{FusedRead::Whole}, {{Op::Mul, 0, 1}}}, 1};
  expect_every_field_counts<FusedReduceAttrs>(
      Op::FusedReduce, fr,
      {[](auto& a) { a.body.reads[1] = FusedRead::Scalar; },
       [](auto& a) { a.body.program[0].op = Op::Add; }, [](auto& a) { a.body.program[1].a = 1; },
       [](auto& a) {
         a.shape = {8, 4};
       },
       [](auto& a) { a.reduce.keepdims = true; }, [](auto& a) { a.epilogue.program[0].b = 0; },
       [](auto& a) { a.epilogue_sum = 0; }});
  EpilogueAttrs e{{false, true, DType::f32, false}, {{Op::Add, 0, FusedRead::Row}}};
  expect_every_field_counts<EpilogueAttrs>(
      Op::MatmulEpilogue, e,
      {[](auto& a) { a.mm.tf32 = true; }, [](auto& a) { a.mm.out = DType::bf16; },
       [](auto& a) { a.steps[0].op = Op::Mul; }, [](auto& a) { a.steps[0].operand = 1; },
       [](auto& a) { a.steps[0].read = FusedRead::Whole; }});
}

TEST(Primitive, PrintsItsFieldsByName) {
  EXPECT_EQ(Primitive(Op::Matmul, MatmulAttrs{false, true, DType::bf16, false}).str(),
            "Matmul{transpose_a=0,transpose_b=1,out=bf16,tf32=0}");
  EXPECT_EQ(Primitive(Op::Sum, ReduceAttrs{{0, 2}, true}).str(), "Sum{axes=(0,2),keepdims=1}");
  EXPECT_EQ(Primitive(Op::Cast, CastAttrs{DType::bf16}).str(), "Cast{to=bf16}");
  EXPECT_EQ(Primitive(Op::Exp).str(), "Exp");
  FusedAttrs f{{FusedRead::Whole, FusedRead::Scalar}, {{Op::Mul, 0, 1}, {Op::Exp, 2, -1}}};
  EXPECT_EQ(Primitive(Op::FusedElementwise, f).str(),
            "FusedElementwise{(whole,scalar) r2=Mul(r0,r1); r3=Exp(r2)}");
}

}  // namespace
}  // namespace kiln
