// libFuzzer harness: kiln's arguments, one per line (parse_command_line, then the
// checks of kiln train).
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_command_line, data, size);
}
