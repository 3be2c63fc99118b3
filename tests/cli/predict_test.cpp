// kiln predict against transformers' image-classification pipeline (fixtures
// written by tools/golden/make_predict_golden.py with transformers 5.17.0):
// the same labels in the same order with the same scores for every decoding
// fixture image, softmax and multi-label sigmoid; errors name the file and
// leave the others predicted.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "kiln/data.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {
using json = nlohmann::json;

struct PredictRun {
  int status;
  std::string out, err;
};

PredictRun predict(const std::string& args) {
  const std::string err = (std::filesystem::temp_directory_path() /
                           ("kiln-predict-" + std::to_string(::getpid()) + ".err"))
                              .string();
  FILE* p = popen((test_util::kiln_cli_path() + " predict " + args + " 2>" + err).c_str(), "r");
  PredictRun r{};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err);
  return r;
}

std::vector<json> lines(const std::string& text) {
  std::vector<json> out;
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    out.push_back(json::parse(text.substr(at, nl - at)));
  return out;
}

const std::string kFixtures = std::string(KILN_FIXTURES_DIR);

TEST(Predict, EqualsTheTransformersPipeline) {
  for (const char* kind : {"single", "multi"}) {
    SCOPED_TRACE(kind);
    const std::string model = kFixtures + "/predict/" + kind;
    for (const char* mode : {"jit", "eager"}) {
      PredictRun r = predict("--model " + model + " --json --top-k 3 --batch-size 7 --mode " +
                             mode + " " + kFixtures + "/decode/images");
      ASSERT_EQ(r.status, 0) << r.err;
      std::ifstream f(model + "/expected.jsonl");
      std::vector<json> want = lines(std::string(std::istreambuf_iterator<char>(f), {}));
      std::vector<json> got = lines(r.out);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(want.size(), 40u);
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string file = got[i]["file"];
        EXPECT_EQ(std::filesystem::path(file).filename().string(), want[i]["file"]);
        ASSERT_EQ(got[i]["predictions"].size(), 3u) << file;
        for (size_t k = 0; k < 3; ++k) {
          EXPECT_EQ(got[i]["predictions"][k]["label"], want[i]["predictions"][k]["label"]) << file;
          worst = std::max(worst, std::abs(got[i]["predictions"][k]["score"].get<double>() -
                                           want[i]["predictions"][k]["score"].get<double>()));
        }
      }
      EXPECT_LT(worst, 1e-5) << mode;
      EXPECT_NE(r.err.find("40 images"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(std::string(kind) == "multi" ? "sigmoid" : "softmax"),
                std::string::npos);
    }
  }
}

// Real photographs (scikit-image's rocket, cat and coffee cup; the last as
// a camera stores it, sideways with an EXIF orientation): transformers'
// pixel_values bit for bit, and the pipeline's labels and scores.
TEST(Predict, RealPhotographsAsThePipeline) {
  const std::string dir = kFixtures + "/predict/photos";
  io::SafetensorsFile want = io::load_safetensors(dir + "/expected.safetensors");
  data::ImageProcessor proc = io::load_image_processor(kFixtures + "/predict/single");
  int checked = 0;
  for (const char* file : {"chelsea.png", "coffee_exif6.jpg", "rocket.jpg"}) {
    data::Image img = data::decode_image(data::read_file_bytes(dir + "/" + file), 3, file);
    std::vector<float> got(3 * 24 * 24);
    ASSERT_EQ(proc.output_size(img.width, img.height), nn::Size2d(24));
    proc.pixel_values(img, got.data());
    EXPECT_EQ(got, want.tensors.at(std::string("pixel_values.") + file).to_vector<float>()) << file;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
  for (const char* kind : {"single", "multi"}) {
    PredictRun r =
        predict("--model " + kFixtures + "/predict/" + kind + " --json --top-k 3 " + dir);
    ASSERT_EQ(r.status, 0) << r.err;
    std::ifstream f(dir + "/" + kind + ".jsonl");
    std::vector<json> expect = lines(std::string(std::istreambuf_iterator<char>(f), {}));
    std::vector<json> got = lines(r.out);
    ASSERT_EQ(got.size(), 3u);
    ASSERT_EQ(expect.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(std::filesystem::path(got[i]["file"].get<std::string>()).filename().string(),
                expect[i]["file"]);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(got[i]["predictions"][k]["label"], expect[i]["predictions"][k]["label"])
            << kind << " " << i;
        EXPECT_NEAR(got[i]["predictions"][k]["score"].get<double>(),
                    expect[i]["predictions"][k]["score"].get<double>(), 1e-5);
      }
    }
  }
}

// A ResNet saved with a ConvNextImageProcessor (microsoft/resnet-50's and
// facebook/convnext-*'s: the shorter side to shortest_edge / crop_pct, then
// the centre square; tools/golden/make_convnext_processor_golden.py with
// transformers 4.46.3): the processor's pixel_values bit for bit, the
// pipeline's labels and scores on every decoding fixture and photograph,
// and the processor written back as it was read.
TEST(Predict, AResNetWithAConvNextProcessorAsThePipeline) {
  const std::string model = kFixtures + "/predict/resnet";
  const std::string photos = kFixtures + "/predict/photos";
  std::vector<std::string> notes;
  const data::ImageProcessor proc = io::load_image_processor(model, &notes);
  EXPECT_TRUE(notes.empty()) << notes.front();
  EXPECT_EQ(proc.shortest_edge, 27);  // int(24 / 0.875)
  EXPECT_TRUE(proc.do_center_crop);
  EXPECT_EQ(proc.crop_size, nn::Size2d(24));
  io::SafetensorsFile want = io::load_safetensors(model + "/expected.safetensors");
  for (const char* file : {"chelsea.png", "coffee_exif6.jpg", "rocket.jpg"}) {
    data::Image img = data::decode_image(data::read_file_bytes(photos + "/" + file), 3, file);
    std::vector<float> got(3 * 24 * 24);
    ASSERT_EQ(proc.output_size(img.width, img.height), nn::Size2d(24));
    proc.pixel_values(img, got.data());
    EXPECT_EQ(got, want.tensors.at(std::string("pixel_values.") + file).to_vector<float>()) << file;
  }
  auto check = [&](const std::string& args, const std::string& expected, size_t count) {
    PredictRun r = predict("--model " + model + " --json --top-k 3 " + args);
    ASSERT_EQ(r.status, 0) << r.err;
    std::ifstream f(model + "/" + expected);
    std::vector<json> expect = lines(std::string(std::istreambuf_iterator<char>(f), {}));
    std::vector<json> got = lines(r.out);
    ASSERT_EQ(got.size(), count);
    ASSERT_EQ(expect.size(), count);
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(std::filesystem::path(got[i]["file"].get<std::string>()).filename().string(),
                expect[i]["file"]);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(got[i]["predictions"][k]["label"], expect[i]["predictions"][k]["label"])
            << expect[i]["file"];
        EXPECT_NEAR(got[i]["predictions"][k]["score"].get<double>(),
                    expect[i]["predictions"][k]["score"].get<double>(), 1e-5)
            << expect[i]["file"];
      }
    }
  };
  for (const char* mode : {"jit", "eager"})
    check(std::string("--mode ") + mode + " --batch-size 7 " + kFixtures + "/decode/images",
          "expected.jsonl", 40);
  check(photos, "photos.jsonl", 3);

  // Written back as a ConvNextImageProcessor that reads the same; at 384 and
  // more, a resize to the square without a crop.
  const std::string text = io::image_processor_json(proc);
  EXPECT_NE(text.find("\"ConvNextImageProcessor\""), std::string::npos) << text;
  const data::ImageProcessor back = io::parse_image_processor(text, "back.json");
  EXPECT_EQ(back.shortest_edge, 27);
  EXPECT_EQ(back.crop_size, nn::Size2d(24));
  EXPECT_EQ(back.crop_pct, 0.875);
  const data::ImageProcessor warp = io::parse_image_processor(
      R"({"feature_extractor_type": "ConvNextFeatureExtractor", "size": 384})", "w.json");
  EXPECT_FALSE(warp.do_center_crop);
  EXPECT_EQ(warp.output_size(500, 300), nn::Size2d(384));
  const data::ImageProcessor dflt = io::parse_image_processor(
      R"({"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 224}})",
      "d.json");
  EXPECT_EQ(dflt.shortest_edge, 256);  // crop_pct 224 / 256 by default
  EXPECT_EQ(dflt.output_size(500, 300), nn::Size2d(224));
  for (
      auto [text, want] : std::vector<std::pair<std::string, std::string>>{
          {R"({"image_processor_type": "ConvNextImageProcessor", "size": {"height": 224, "width": 224}})",
           "c.json: field 'size' is {\"height\":224,\"width\":224}, expected {\"shortest_edge\": "
           "S} "
           "or an integer (ConvNextImageProcessor)"},
          {R"({"image_processor_type": "ConvNextImageProcessor", "size": 224, "crop_pct": 0})",
           "c.json: field 'crop_pct' is 0, expected a positive number"}}) {
    try {
      io::parse_image_processor(text, "c.json");
      ADD_FAILURE() << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(Predict, TextOutputTopKAndBadFiles) {
  const std::string model = kFixtures + "/predict/single";
  const std::string images = kFixtures + "/decode/images/";
  PredictRun r = predict("--model " + model + " --top-k 9 " + images + "png_rgb8.png");
  ASSERT_EQ(r.status, 0) << r.err;
  // Five labels: --top-k is capped there, as in the pipeline; scores sum to 1.
  ASSERT_EQ(r.out.rfind(images + "png_rgb8.png: ", 0), 0u) << r.out;
  double sum = 0;
  int labels = 0;
  for (size_t at = r.out.find(" ("); at != std::string::npos;
       at = r.out.find(" (", at + 1), ++labels)
    sum += std::stod(r.out.substr(at + 2));
  EXPECT_EQ(labels, 5) << r.out;
  EXPECT_NEAR(sum, 1.0, 5e-4) << r.out;

  // A damaged file and one that is no image: named, the others predicted, exit 1.
  const auto dir =
      std::filesystem::temp_directory_path() / ("kiln-predict-bad-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(images + "jpeg_sub2.jpg", dir / "a.jpg");
  {
    std::ifstream in(images + "jpeg_sub0.jpg", std::ios::binary);
    std::string bytes(std::istreambuf_iterator<char>(in), {});
    std::ofstream(dir / "b.jpg", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    std::ofstream(dir / "c.png") << "not a png";
  }
  std::filesystem::copy_file(images + "png_palette8.png", dir / "d.png");
  r = predict("--model " + model + " --json " + dir.string());
  EXPECT_EQ(r.status, 1);
  std::vector<json> got = lines(r.out);
  ASSERT_EQ(got.size(), 4u) << r.out;
  EXPECT_TRUE(got[0].contains("predictions"));
  EXPECT_NE(got[1]["error"].get<std::string>().find("b.jpg] is a damaged JPEG"), std::string::npos)
      << got[1];
  EXPECT_NE(got[2]["error"].get<std::string>().find("c.png] is neither a JPEG nor a PNG"),
            std::string::npos);
  EXPECT_TRUE(got[3].contains("predictions"));
  EXPECT_NE(r.err.find("4 images"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 failed"), std::string::npos) << r.err;

  // No such input; a model without a processor gets ViTImageProcessor's
  // defaults at its image size, and a processor of another size is an error
  // for each file.
  r = predict("--model " + model + " /nonexistent.jpg");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent.jpg] no such file or folder"), std::string::npos) << r.err;
  std::filesystem::create_directories(dir / "model");
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(model + "/" + f, dir / "model" / f);
  r = predict("--model " + (dir / "model").string() + " " + images + "png_rgb8.png");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("no preprocessor_config.json in " + (dir / "model").string() +
                       ": ViTImageProcessor's defaults at the model's image size (resize to 24,"),
            std::string::npos)
      << r.err;
  std::ofstream(dir / "model" / "preprocessor_config.json")
      << R"({"size": {"height": 30, "width": 24}})";
  r = predict("--model " + (dir / "model").string() + " " + images + "png_rgb8.png " + images +
              "png_rgb16.png");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("png_rgb16.png] processes to 30x24 pixel values (preprocessor_config.json's "
                       "size), but the "
                       "model takes 24"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("2 failed"), std::string::npos) << r.err;
  // --image-size: the model and its processor go to the new size together.
  r = predict("--model " + model + " --image-size 36 " + images + "png_rgb8.png");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("images processed to 36"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

// A greyscale model: kiln train on Fashion-MNIST saves the loader's
// normalization as the checkpoint's processor, and kiln predict labels the
// README's quick start images (four of Fashion-MNIST's test images as PNGs)
// with the scores of the model on the data set's own pixels.
TEST(Predict, AGreyModelTrainedOnFashionMnistLabelsItsTestImages) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kiln-predict-grey-" + std::to_string(::getpid()));
  const std::string ckpt = (dir / "fmnist").string();
  const std::string train = test_util::kiln_cli_path() +
                            " train --model vit-fmnist --data fashion-mnist --batch-size 32 "
                            "--steps 20 --optimizer adamw --lr 2e-3 --eval-samples 64 --save " +
                            ckpt + " > /dev/null";
  ASSERT_EQ(std::system(train.c_str()), 0) << train;
  const io::Pretrained m = io::load_pretrained(ckpt);
  ASSERT_TRUE(m.has_processor);
  const data::FashionMnistOptions fm;
  EXPECT_FLOAT_EQ(static_cast<float>(m.processor.image_mean[0]), fm.mean);
  EXPECT_FLOAT_EQ(static_cast<float>(m.processor.image_std[0]), fm.std);

  // The PNGs through the saved processor give the data set's pixels.
  const std::string images = std::string(KILN_SOURCE_DIR) + "/examples/images/";
  const std::vector<std::pair<std::string, int64_t>> files{
      {"ankle-boot-0.png", 0}, {"bag-18.png", 18}, {"sneaker-9.png", 9}, {"trouser-2.png", 2}};
  std::vector<std::string> paths;
  for (const auto& [name, index] : files) paths.push_back(images + name);
  data::ImageFiles png(paths, m.processor, 28, 1);
  data::FashionMnist test({.split = "test"});
  ASSERT_EQ(png.image_shape(), (Shape{1, 28, 28}));
  std::vector<float> pixels(4 * 28 * 28), want(28 * 28);
  for (size_t i = 0; i < files.size(); ++i) {
    int32_t label = -1;
    png.get(static_cast<int64_t>(i), pixels.data() + i * 28 * 28, &label);
    ASSERT_EQ(png.error(static_cast<int64_t>(i)), "");
    test.get(files[i].second, want.data(), &label);
    for (int j = 0; j < 28 * 28; ++j)
      ASSERT_NEAR(pixels[i * 28 * 28 + j], want[j], 2e-6) << files[i].first << " pixel " << j;
  }
  // kiln predict's scores are the model's softmax on those pixels.
  const Array logits =
      m.model->apply(m.params, m.state, Array::from_vector(pixels, {4, 1, 28, 28})).logits;
  const std::vector<float> probs = softmax(logits, -1).to_vector<float>();
  const PredictRun r = predict("--model " + ckpt + " --json --top-k 10 " + images);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<json> got = lines(r.out);
  ASSERT_EQ(got.size(), 4u) << r.out;
  const std::vector<std::string> names = m.model->label_names();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i]["file"], images + files[i].first);
    ASSERT_EQ(got[i]["predictions"].size(), 10u);
    for (const json& p : got[i]["predictions"]) {
      const auto at = std::find(names.begin(), names.end(), p["label"].get<std::string>());
      ASSERT_NE(at, names.end()) << p;
      EXPECT_NEAR(p["score"].get<double>(), probs[i * 10 + (at - names.begin())], 1e-4) << p;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
