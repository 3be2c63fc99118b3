// Writes the seed corpora of the fuzz harnesses: fuzz/corpus/<target>/ gets a
// few small valid inputs (made by kiln's own writers, libpng, libjpeg-turbo
// and zlib) and damaged copies of them; fuzz/command_line.dict gets kiln's
// subcommands and flags (libFuzzer's -dict). Usage: kiln-fuzz-corpus FUZZ_DIR
// (the fuzz/ folder of the source tree).
#include <png.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "command_line.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "targets.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

class Corpus {
 public:
  Corpus(const fs::path& fuzz_dir, const std::string& target) : dir_(fuzz_dir / "corpus" / target) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void add(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }

 private:
  fs::path dir_;
};

std::string read_whole(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string gzip(const std::string& bytes) {
  fs::path tmp = fs::temp_directory_path() / "kiln-fuzz-corpus.gz";
  gzFile f = gzopen(tmp.c_str(), "wb9");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  std::string out = read_whole(tmp);
  fs::remove(tmp);
  return out;
}

std::string safetensors_bytes(const Params& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  fs::path tmp = fs::temp_directory_path() / "kiln-fuzz-corpus.safetensors";
  io::save_safetensors(tmp.string(), tensors, metadata);
  std::string out = read_whole(tmp);
  fs::remove(tmp);
  return out;
}

// A w x h test pattern with `channels` (1 or 3) bytes per pixel.
std::vector<uint8_t> pattern(int w, int h, int channels) {
  std::vector<uint8_t> p(static_cast<size_t>(w) * h * channels);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 37 % 251);
  return p;
}

std::string png(int w, int h, int channels) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = w;
  img.height = h;
  img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  std::vector<uint8_t> pixels = pattern(w, h, channels);
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&img, nullptr, &size, 0, pixels.data(), 0, nullptr);
  std::string out(size, '\0');
  png_image_write_to_memory(&img, out.data(), &size, 0, pixels.data(), 0, nullptr);
  out.resize(size);
  return out;
}

std::string jpeg(int w, int h, int channels, int flags) {
  tjhandle tj = tjInitCompress();
  std::vector<uint8_t> pixels = pattern(w, h, channels);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  tjCompress2(tj, pixels.data(), w, 0, h, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
              channels == 1 ? TJSAMP_GRAY : TJSAMP_420, 90, flags);
  std::string out(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

std::string idx(const std::vector<uint32_t>& shape) {
  std::string b{0, 0, 0x08, static_cast<char>(shape.size())};
  size_t n = 1;
  for (uint32_t d : shape) {
    for (int s = 24; s >= 0; s -= 8) b += static_cast<char>(d >> s);
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) b += static_cast<char>(i % 10);
  return b;
}

std::string lines(const std::vector<std::string>& ls, char sep = '\n') {
  std::string out;
  for (auto& l : ls) out += l + sep;
  return out;
}

void write_dict(const fs::path& path, const std::vector<std::string>& words) {
  std::ofstream f(path);
  f << "# libFuzzer dictionary, written by fuzz/make_corpus.cpp\n";
  for (auto& w : words) f << '"' << w << "\"\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: kiln-fuzz-corpus FUZZ_DIR (the fuzz/ folder of the source tree)\n";
    return 2;
  }
  const fs::path fuzz_dir = argv[1];
  const std::vector<std::string>& tiny = fuzz::tiny_checkpoint_files();
  auto sep = std::string(fuzz::kFileSeparator);

  Corpus st(fuzz_dir, "safetensors");
  std::string small = safetensors_bytes(
      {{"f32", Array::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3})},
       {"i64", Array::from_vector(std::vector<int64_t>{7, -8}, {2})},
       {"scalar", Array::scalar(0.5f)},
       {"bf16", astype(Array::from_vector(std::vector<float>{1, -2}, {2}), DType::bf16)}},
      {{"format", "pt"}});
  st.add("small.safetensors", small);
  st.add("model.safetensors", tiny[3]);
  st.add("training_state.safetensors", tiny[1]);
  st.add("empty-header.safetensors", std::string("\x02\0\0\0\0\0\0\0{}", 10));
  st.add("truncated.safetensors", small.substr(0, small.size() - 5));
  std::string long_header = small;
  long_header[1] = 0x7f;  // header length beyond the file
  st.add("header-too-long.safetensors", long_header);

  Corpus cf(fuzz_dir, "config");
  cf.add("tiny.json", tiny[2]);
  cf.add("vit-fmnist.json", [] {
    fs::path tmp = fs::temp_directory_path() / "kiln-fuzz-corpus-config.json";
    io::save_config(tmp.string(), nn::ViTConfig::preset("vit-fmnist"));
    std::string out = read_whole(tmp);
    fs::remove(tmp);
    return out;
  }());
  cf.add("minimal.json", R"({"model_type": "vit", "num_labels": 2})");
  cf.add("wrong-types.json",
         R"({"hidden_size": "768", "qkv_bias": 1, "hidden_act": "swish", "id2label": []})");
  cf.add("inconsistent.json",
         R"({"hidden_size": 10, "num_attention_heads": 3, "image_size": 30, "patch_size": 7})");

  Corpus ix(fuzz_dir, "idx");
  ix.add("labels-idx1-ubyte", idx({12}));
  ix.add("images-idx3-ubyte", idx({2, 4, 4}));
  ix.add("images-idx3-ubyte.gz", gzip(idx({3, 5, 5})));
  ix.add("rank4-idx4-ubyte.gz", gzip(idx({1, 2, 3, 2})));
  std::string gz = gzip(idx({4, 6, 6}));
  ix.add("cut-in-half.gz", gz.substr(0, gz.size() / 2));
  ix.add("truncated-idx3-ubyte", idx({2, 4, 4}).substr(0, 30));

  Corpus im(fuzz_dir, "image");
  im.add("rgb.png", png(5, 3, 3));
  im.add("grey.png", png(3, 7, 1));
  im.add("rgb.jpg", jpeg(9, 6, 3, 0));
  im.add("grey.jpg", jpeg(6, 9, 1, 0));
  im.add("progressive.jpg", jpeg(10, 10, 3, TJFLAG_PROGRESSIVE));
  std::string cut = jpeg(16, 16, 3, 0);
  im.add("truncated.jpg", cut.substr(0, cut.size() * 2 / 3));

  // Pillow-made files of the decoding fixtures: CMYK, EXIF, 16-bit, palette, interlaced.
  for (const char* name : {"jpeg_cmyk.jpg", "jpeg_exif6.jpg", "jpeg_xmp6.jpg", "png_grey16.png",
                           "png_palette_short.png", "png_interlaced_grey4.png",
                           "png_exif3_after.png", "png_rgba16.png"})
    im.add(name, read_whole(fuzz_dir / ".." / "tests" / "fixtures" / "decode" / "images" / name));

  Corpus pp(fuzz_dir, "preprocessor");
  pp.add("saved.json", io::image_processor_json(data::ImageProcessor{}));
  pp.add("vit-base.json", R"({"do_normalize": true, "do_resize": true, "feature_extractor_type": )"
                          R"("ViTFeatureExtractor", "image_mean": [0.5, 0.5, 0.5], "image_std": )"
                          R"([0.5, 0.5, 0.5], "resample": 2, "size": 224})");
  pp.add("shortest-edge-crop.json",
         R"({"size": {"shortest_edge": 20, "longest_edge": 40}, "do_center_crop": true, )"
         R"("crop_size": {"height": 16, "width": 18}, "resample": 3, "image_std": 0.25})");
  pp.add("wrong-types.json", R"({"size": {"height": -3}, "resample": 9, "image_mean": [1, 2], )"
                             R"("do_rescale": "yes", "unknown": null})");
  pp.add("convnext.json", R"({"image_processor_type": "ConvNextImageProcessor", "crop_pct": 0.875, )"
                          R"("size": {"shortest_edge": 24}, "resample": 3})");
  pp.add("convnext-feature-extractor.json",
         R"({"feature_extractor_type": "ConvNextFeatureExtractor", "crop_pct": 2.5, "size": 400, )"
         R"("do_center_crop": true, "crop_size": 7})");

  Corpus ck(fuzz_dir, "checkpoint");
  ck.add("whole", tiny[0] + sep + tiny[1] + sep + tiny[2] + sep + tiny[3]);
  ck.add("trainer-only", tiny[0]);
  ck.add("trainer-and-state", tiny[0] + sep + tiny[1]);
  ck.add("no-state", tiny[0] + sep);
  ck.add("wrong-format",
         R"({"format": "kiln-checkpoint-0", "step": 1, "seed": 0, "data_position": 0,)"
         R"( "optimizer": "sgd"})");
  ck.add("wrong-types", R"({"format": "kiln-checkpoint-1", "step": "1", "seed": -1,)"
                        R"( "data_position": 0.5, "optimizer": "adamw"})");

  const std::vector<std::string>& pre = fuzz::tiny_pretrained_files();
  Corpus pm(fuzz_dir, "pretrained");
  pm.add("sharded", pre[0] + sep + pre[1] + sep + pre[2] + sep + pre[3]);
  pm.add("index-only", pre[0]);
  pm.add("one-tensor", std::string(R"({"weight_map": {"vit.embeddings.cls_token": )") +
                           R"("model-00001-of-00002.safetensors"}})" + sep + pre[1] + sep + pre[2] +
                           sep);
  pm.add("escaping-name", R"({"weight_map": {"vit.layernorm.weight": "../model.safetensors"}})");
  pm.add("missing-shard", pre[0] + sep + pre[1] + sep + pre[2] + sep);
  pm.add("long-name",
         R"({"weight_map": {"vit.layernorm.weight": ")" + std::string(300, 'x') + R"("}})");
  pm.add("wrong-types", R"({"weight_map": {"classifier.bias": 3}, "metadata": []})");

  Corpus pl(fuzz_dir, "plot_log");
  pl.add(
      "train.jsonl",
      lines(
          {R"({"data_wait":0.001,"loss":2.31,"lr":0.001,"step":1,"step_time":0.2,"timed":false})",
           R"({"data_wait":0.001,"loss":2.02,"lr":0.001,"step":2,"step_time":0.1,"timed":true})",
           R"({"eval_accuracy":0.4,"eval_loss":1.7,"eval_samples":100,"eval_seconds":0.5,"step":2})",
           R"({"data_wait":0.0,"loss":1.65,"lr":0.0005,"step":3,"step_time":0.1,"timed":true})",
           R"({"compile_ms":0.0,"mean":0.1,"summary":true,"wall_seconds":1.0})"}));
  pl.add("non-finite.jsonl", lines({R"({"step":1,"loss":null})", R"({"step":2,"loss":3})",
                                    R"({"step":3,"eval_loss":null,"eval_accuracy":null})"}));
  pl.add("bad-field.jsonl", lines({R"({"step":1,"loss":"high"})"}));
  pl.add("not-json.jsonl", lines({R"({"step":1,"loss":2})", "{step: 2}"}));

  Corpus cl(fuzz_dir, "command_line");
  cl.add("train", lines({"train", "--batch-size", "8", "--mode", "eager", "--model", "vit-tiny",
                         "--steps", "4", "--warmup", "1", "--optimizer", "adamw", "--schedule",
                         "cosine", "--lr-warmup", "2", "--clip-norm", "1"}));
  cl.add("train-abbreviated", lines({"train", "--batch=8", "--compile", "--mode=pytorch",
                                     "--precision", "bf16", "--data", "imagefolder:x"}));
  cl.add("train-epochs", lines({"train", "--data", "fashion-mnist", "--epochs", "2", "--model",
                                "vit-fmnist", "--eval-every", "5", "--save", "ck"}));
  cl.add("eval", lines({"eval", "--checkpoint", "ck", "--split", "train", "--mode", "eager"}));
  cl.add("plot", lines({"plot", "log.jsonl", "-o", "x.svg"}));
  cl.add("grad", lines({"grad", "--config", "c.json", "--weights", "w", "--batch", "b", "--out",
                        "o", "--layout", "nhwc"}));
  cl.add("demo", lines({"demo", "--steps", "3", "--lr", "0.5", "--mode", "lazy"}, '\0'));
  cl.add("help", lines({"train", "--help"}));
  cl.add("predict", lines({"predict", "--model", "m", "--top-k", "3", "--json", "--batch-size", "8",
                           "--image-size", "32x48", "a.jpg", "photos"}));
  cl.add("train-finetune", lines({"train",
                                  "--init-from",
                                  "org/name@main",
                                  "--data",
                                  "imagefolder:x",
                                  "--augment",
                                  "--crop-scale",
                                  "0.5,1",
                                  "--crop-ratio",
                                  "0.75,1.33",
                                  "--flip-prob",
                                  "0.2",
                                  "--accumulate",
                                  "4",
                                  "--schedule",
                                  "linear",
                                  "--exempt-from-decay",
                                  "--label-smoothing",
                                  "0.1",
                                  "--ema",
                                  "0.999",
                                  "--freeze-backbone",
                                  "--save-best",
                                  "--save",
                                  "out"}));

  // A byte-level BPE whose vocabulary holds printable ASCII (which GPT-2's
  // byte map keeps as it is) and "Ġ" (the space), a few merges and
  // <|endoftext|>; with text after the separator, and files of other kinds.
  Corpus tk(fuzz_dir, "tokenizer");
  std::string vocab;
  int id = 0;
  for (char c = '!'; c <= '~'; ++c) {
    const std::string key = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : std::string(1, c);
    vocab += (id ? ", \"" : "\"") + key + "\": " + std::to_string(id);
    ++id;
  }
  for (const char* token : {"\u0120", "th", "the", "\u0120t"}) {
    vocab += std::string(", \"") + token + "\": " + std::to_string(id);
    ++id;
  }
  const std::string bpe =
      R"({"added_tokens": [{"id": )" + std::to_string(id) +
      R"(, "content": "<|endoftext|>", "special": true}], "normalizer": null, )"
      R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}, )"
      R"("post_processor": null, "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", )"
      R"("dropout": null, "unk_token": null, "vocab": {)" +
      vocab + R"(}, "merges": ["t h", "th e", ["\u0120", "t"]]}})";
  tk.add("small.json", bpe);
  tk.add("small-with-text.json", bpe + sep + "the theme of<|endoftext|>The  end's 42!");
  tk.add("prefix-space.json", [&] {
    std::string s = bpe;
    s.replace(s.find(R"("add_prefix_space": false)"), 25, R"("add_prefix_space": true )");
    return s + sep + "then";
  }());
  tk.add("wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  tk.add("truncated.json", bpe.substr(0, bpe.size() / 2));
  tk.add("wrong-types.json",
         R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": "yes"}, )"
         R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": 1}, "post_processor": 7, )"
         R"("added_tokens": [{"id": 1, "content": "x", "lstrip": "no"}]})");

  write_dict(fuzz_dir / "command_line.dict", cli::command_line_words());
  return 0;
}
