// libFuzzer harness: a pretrained model's folder as transformers shards it
// (model.safetensors.index.json, config.json and two shards: load_pretrained).
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_pretrained, data, size);
}
