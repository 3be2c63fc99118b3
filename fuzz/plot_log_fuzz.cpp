// libFuzzer harness: the JSON-lines logs that kiln plot draws (plot_log).
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_plot_log, data, size);
}
