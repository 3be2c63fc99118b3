// kiln fuzz targets: each feeds one input to one of kiln's parsers, the way
// kiln reads that kind of file or argument list, then checks what came out
// (sizes that agree with shapes). A target returns, or throws kiln::Error for
// bad input; any other exception, a crash, a sanitizer report, a hang or a
// huge allocation is a bug. The libFuzzer harnesses (fuzz/<name>_fuzz.cpp) and
// the regression test (tests/fuzz/fuzz_regressions_test.cpp) both run these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::fuzz {

void feed_safetensors(std::string_view bytes);   // a .safetensors file
void feed_config(std::string_view bytes);        // a HuggingFace config.json
void feed_idx(std::string_view bytes);           // an IDX file, gzip-compressed or not
void feed_image(std::string_view bytes);         // a JPEG or PNG file in an image folder
void feed_checkpoint(std::string_view bytes);    // a checkpoint directory (kCheckpointFiles)
void feed_plot_log(std::string_view bytes);      // the JSON lines that `kiln plot` draws
void feed_command_line(std::string_view bytes);  // kiln's arguments, one per line
void feed_pretrained(std::string_view bytes);    // a pretrained model's folder (kPretrainedFiles)
void feed_preprocessor(std::string_view bytes);  // a preprocessor_config.json
// A tokenizer.json, then (after kFileSeparator) text to encode with it.
void feed_tokenizer(std::string_view bytes);

// A checkpoint input holds these files in this order, separated by
// kFileSeparator. A file the input does not reach (fewer separators) is taken
// from tiny_checkpoint_files(), so that inputs can change trainer.json alone;
// an empty part leaves the file out of the directory.
inline constexpr const char* kCheckpointFiles[] = {"trainer.json", "training_state.safetensors",
                                                   "config.json", "model.safetensors"};
inline constexpr std::string_view kFileSeparator = "\n--kiln-fuzz-next-file--\n";
// The files of a small valid checkpoint (a one-layer ViT on 4x4 grey images
// with AdamW's state), in the order of kCheckpointFiles.
const std::vector<std::string>& tiny_checkpoint_files();

// A pretrained-model input holds these files in this order, as a checkpoint
// input does (kFileSeparator; a file the input does not reach comes from
// tiny_pretrained_files(); an empty part leaves it out): a sharded save.
inline constexpr const char* kPretrainedFiles[] = {"model.safetensors.index.json", "config.json",
                                                   "model-00001-of-00002.safetensors",
                                                   "model-00002-of-00002.safetensors"};
// A small valid one: the tiny checkpoint's model in two shards, the
// classifier in the second.
const std::vector<std::string>& tiny_pretrained_files();

struct Target {
  const char* name;  // the harness is kiln-fuzz-<name>, its seeds fuzz/corpus/<name>/
  void (*feed)(std::string_view bytes);
};
const std::vector<Target>& targets();

// libFuzzer's entry point for one target: kiln::Error is the expected
// outcome of bad input; any other exception escapes and aborts the run.
int run_harness(void (*feed)(std::string_view), const uint8_t* data, size_t size);

}  // namespace kiln::fuzz
