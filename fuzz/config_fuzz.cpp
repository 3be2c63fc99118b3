// libFuzzer harness: HuggingFace config.json files (parse_vit_config, or parse_deit_config,
// parse_resnet_config and parse_convnext_config by model_type, then the model's shapes).
// fuzz/targets.h says what counts as a bug.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln::fuzz::run_harness(kiln::fuzz::feed_config, data, size);
}
