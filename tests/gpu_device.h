// What the GPU tests (names containing "Gpu", CTest label gpu) run on: the
// first CUDA GPU. KILN_GPU_TESTS_ON=ref runs them on the reference backend
// instead, so that the tests themselves are rehearsed on a machine without a
// GPU (bench/gpu/check.sh's rehearsal does); without either they skip.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kiln/device.h"

namespace kiln {

inline bool gpu_tests_on_ref() {
  const char* e = std::getenv("KILN_GPU_TESTS_ON");
  return e && std::string(e) == "ref";
}

inline Device test_gpu() {
  return gpu_tests_on_ref() ? Device::ref() : Device::cuda();
}

#define KILN_REQUIRE_GPU()                                          \
  if (!gpu_tests_on_ref() && cuda_device_count() == 0)              \
  GTEST_SKIP() << "no CUDA GPU visible (" << cuda_unavailable_reason() \
               << "); KILN_GPU_TESTS_ON=ref runs this test on the ref backend"

}  // namespace kiln
