// libFuzzer harness: a tokenizer.json (GPT-2's byte-level BPE), then text that
// it encodes and decodes. fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_tokenizer, data, size);
}
