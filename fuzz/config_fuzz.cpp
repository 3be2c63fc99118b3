// libFuzzer harness: HuggingFace config.json files (ViTConfig::from_json as "vit" or "deit",
// ResNetConfig::from_json and ConvNextConfig::from_json by model_type, then the model's shapes).
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_config, data, size);
}
