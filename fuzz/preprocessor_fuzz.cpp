// libFuzzer harness: a preprocessor_config.json (ViTImageProcessor or
// ConvNextImageProcessor: parse_image_processor,
// then the processor applied to a small image).
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_preprocessor, data, size);
}
