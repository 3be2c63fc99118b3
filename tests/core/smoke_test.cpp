#include <gtest/gtest.h>
#include "kiln/kiln.h"
TEST(Smoke, Add) {
  auto a = kiln::Array::from_vector<float>({1, 2, 3}, {3});
  auto b = a + a;
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{2, 4, 6}));
}
