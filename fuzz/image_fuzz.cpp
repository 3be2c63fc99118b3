// libFuzzer harness: JPEG and PNG files in an image folder (probe, decode, resize, crop, flip).
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_image, data, size);
}
