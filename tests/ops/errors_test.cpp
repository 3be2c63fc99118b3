// Shape and dtype mismatches raise kiln::Error naming the op and the shapes.
#include <gtest/gtest.h>

#include "kiln/kiln.h"

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

TEST(Errors, NameTheOpAndBothShapes) {
  EXPECT_EQ(error_of([] {
              matmul(zeros({4, 3}), zeros({5, 2}));
            }),
            "[matmul] inner dimensions differ: (4,3) @ (5,2)");
  EXPECT_EQ(error_of([] {
              add(zeros({2, 3}), zeros({4}));
            }),
            "[Add] cannot broadcast (2,3) and (4)");
  EXPECT_EQ(error_of([] {
              matmul(zeros({2, 4, 3}), zeros({3, 3, 2}));
            }),
            "[matmul] batch dimensions differ: (2,4,3) @ (3,3,2) (they must be equal, or one "
            "operand must have rank 2)");
  EXPECT_EQ(error_of([] {
              matmul(zeros({4, 3}), zeros({3, 2}, DType::f64));
            }),
            "[matmul] operand dtypes differ: f32 (4,3) @ f64 (3,2)");
  EXPECT_EQ(error_of([] {
              reshape(zeros({2, 3}), {4, 2});
            }),
            "[reshape] cannot reshape (2,3) into (4,2)");
  EXPECT_EQ(error_of([] {
              layer_norm(zeros({2, 3}), ones({4}), zeros({4}), 1e-5);
            }),
            "[layer_norm] weight (4) and bias (4) must both be (3) for input (2,3)");
  EXPECT_EQ(error_of([] {
              softmax_cross_entropy(zeros({4, 10}), zeros({5}, DType::i32));
            }),
            "[softmax_cross_entropy] labels (5) do not match logits (4,10) (expected labels (4))");
  EXPECT_EQ(error_of([] { exp(zeros({2}, DType::i32)); }),
            "[Exp] expected a floating-point array (f32, f64, bf16), got i32 of shape (2)");
  EXPECT_EQ(error_of([] { sum(zeros({2, 3}), {2}); }), "[Sum] axis 2 is out of range for rank 2");
  EXPECT_EQ(error_of([] {
              concatenate({zeros({2, 3}), zeros({3, 3})}, 1);
            }),
            "[concatenate] shapes (2,3) and (3,3) differ outside axis 1");
  EXPECT_EQ(error_of([] { attention(zeros({2, 5, 4, 8}), 0.125); }),
            "[attention] qkv must be [batch, tokens, 3, heads, head_dim], got (2,5,4,8)");
  EXPECT_EQ(error_of([] { attention(zeros({2, 5, 2, 4, 8}), 0.125); }),
            "[attention] qkv must be [batch, tokens, 3, heads, head_dim], got (2,5,2,4,8)");
  EXPECT_EQ(error_of([] {
              attention(zeros({2, 5, 3, 4, 8}, DType::i32), 0.125);
            }),
            "[attention] expected a floating-point array (f32, f64, bf16), got i32 of shape "
            "(2,5,3,4,8)");
}

TEST(Errors, BadValuesAreCaughtBeforeAnyKernelRuns) {
  EXPECT_EQ(error_of([] {
              take(zeros({3, 2}), Array::from_vector<int32_t>({0, 3}, {2}), 0).eval();
            }),
            "[take] index 3 at position 1 is outside [-3, 3)");
  EXPECT_EQ(error_of([] {
              softmax_cross_entropy(zeros({2, 4}), Array::from_vector<int32_t>({1, 7}, {2})).eval();
            }),
            "[softmax_cross_entropy] label 7 at position 1 is outside [0, 4)");
  EXPECT_EQ(error_of([] {
              Array a;
              a.eval();
            }),
            "[eval] use of an empty Array handle");
}

TEST(Errors, LazyErrorsSurfaceAtEval) {
  Array bad;
  {
    LazyScope lazy;
    bad = take(zeros({3}), Array::from_vector<int32_t>({5}, {1}), 0);
  }
  EXPECT_EQ(error_of([&] { bad.eval(); }), "[take] index 5 at position 0 is outside [-3, 3)");
}

}  // namespace
}  // namespace kiln
