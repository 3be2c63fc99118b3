// KILN_PROFILE's report: time and calls per primitive, and with "shapes" per
// primitive and operand shapes.
#include <gtest/gtest.h>

#include "kiln/kiln.h"
#include "ops/dispatch.h"

namespace kiln {
namespace {

TEST(KernelProfile, CountsCallsPerPrimitiveAndPerShape) {
  KernelProfile& prof = kernel_profile();
  const bool was_enabled = prof.enabled, was_by_shape = prof.by_shape;
  prof.enabled = prof.by_shape = true;
  kernel_profile_reset();
  Array a = ones({3, 4}), b = ones({4, 5});
  for (int i = 0; i < 2; ++i) (void)matmul(a, b).to_vector<float>();
  (void)(a + a).to_vector<float>();
  const std::string report = kernel_profile_report();
  prof.enabled = was_enabled, prof.by_shape = was_by_shape;
  kernel_profile_reset();
  EXPECT_NE(report.find("kernel time by primitive"), std::string::npos) << report;
  EXPECT_NE(report.find("2 calls  Matmul -> f32(3,5) from f32(3,4) f32(4,5)"), std::string::npos)
      << report;
  EXPECT_NE(report.find("1 calls  Add -> f32(3,4) from f32(3,4) f32(3,4)"), std::string::npos)
      << report;
}

}  // namespace
}  // namespace kiln
