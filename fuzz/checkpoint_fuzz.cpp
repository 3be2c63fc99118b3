// libFuzzer harness: checkpoint directories (load_checkpoint): trainer.json,
// training_state.safetensors, config.json and model.safetensors in one input.
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_checkpoint, data, size);
}
