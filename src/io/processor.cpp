// kiln io: transformers' preprocessor_config.json (ViTImageProcessor, and
// ConvNextImageProcessor's rule in its fields).
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/io.h"

namespace kiln::io {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

// Keys that change nothing kiln computes: the class names, what transformers
// uses for other backends or for padding, output switches.
const std::set<std::string> kIgnored = {"image_processor_type",
                                        "feature_extractor_type",
                                        "processor_class",
                                        "_processor_class",
                                        "auto_map",
                                        "return_tensors",
                                        "data_format",
                                        "input_data_format",
                                        "device",
                                        "disable_grouping",
                                        "do_pad",
                                        "pad_size",
                                        "default_to_square",
                                        "backend"};

// ConvNextImageProcessor (and its feature extractor and fast forms): the
// processor of microsoft/resnet-* and facebook/convnext-*.
bool is_convnext_processor(const json& j) {
  for (const char* type : {"image_processor_type", "feature_extractor_type"})
    if (j.contains(type) && j[type].is_string() &&
        j[type].get<std::string>().rfind("ConvNext", 0) == 0)
      return true;
  return false;
}

// Notes on the fields that kiln does not read (ignored, saying so) and on a
// processor type other than ViT's and ConvNeXt's.
void note_unread_fields(const json& j, const std::string& path, std::vector<std::string>& notes) {
  const bool convnext = is_convnext_processor(j);
  std::set<std::string> known = {"do_resize",  "size",           "resample",
                                 "do_rescale", "rescale_factor", "do_normalize",
                                 "image_mean", "image_std",      "do_convert_rgb"};
  if (convnext)
    known.insert("crop_pct");
  else
    known.insert({"do_center_crop", "crop_size"});
  for (const auto& [key, value] : j.items())
    if (!known.count(key) && !kIgnored.count(key))
      notes.push_back(path + ": " +
                      (convnext && (key == "do_center_crop" || key == "crop_size")
                           ? "field '" + key + "' ignored, as ConvNextImageProcessor ignores it"
                           : "unknown field '" + key + "' ignored"));
  for (const char* type : {"image_processor_type", "feature_extractor_type"})
    if (j.contains(type) && !convnext) {
      const std::string t = j[type].is_string() ? j[type].get<std::string>() : j[type].dump();
      if (t.rfind("ViT", 0) != 0)
        notes.push_back(path + ": " + type + " is " + t +
                        "; kiln processes images as ViTImageProcessor does with these fields");
    }
}

// ConvNextImageProcessor's size and crop_pct into p's fields (`bad` fails
// naming the field; `positive_int` reads a size, failing so).
template <typename Bad, typename Positive>
void convnext_resize(const json& j, data::ImageProcessor& p, const Bad& bad,
                     const Positive& positive_int) {
  // ConvNextImageProcessor: size is the shortest edge S (an integer, or
  // {"shortest_edge": S}; 384 by default). Below 384 the shorter side is
  // resized to int(S / crop_pct) (crop_pct 224/256 by default), aspect
  // kept, and the centre S x S cropped; from 384 on the image is resized
  // to S x S. Held as the ViT processor's fields that do the same.
  int64_t edge = 384;
  if (j.contains("size") && !j["size"].is_null()) {
    const json& v = j["size"];
    if (v.is_number())
      edge = positive_int("size", v);
    else if (v.is_object() && v.size() == 1 && v.contains("shortest_edge"))
      edge = positive_int("size.shortest_edge", v["shortest_edge"]);
    else
      bad("size", "is " + v.dump() +
                      ", expected {\"shortest_edge\": S} or an integer (ConvNextImageProcessor)");
  }
  p.crop_pct = 224.0 / 256.0;
  if (j.contains("crop_pct") && !j["crop_pct"].is_null()) {
    const json& v = j["crop_pct"];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      bad("crop_pct", "is " + v.dump() + ", expected a positive number");
    p.crop_pct = v.get<double>();
  }
  if (!p.do_resize) {
    // no resize, and so no crop: the crop is part of ConvNeXt's resize
  } else if (edge < 384) {
    const double resize = std::floor(static_cast<double>(edge) / p.crop_pct);  // Python's int()
    if (!(resize >= 1 && resize <= static_cast<double>(int64_t{1} << 20)))
      bad("crop_pct", "is " + std::to_string(p.crop_pct) + ": resizing to " +
                          std::to_string(resize) + " for a crop of " + std::to_string(edge) +
                          ", expected 1 to 2^20");
    p.shortest_edge = static_cast<int64_t>(resize);
    p.do_center_crop = true;
    p.crop_size = edge;
  } else {
    p.size = edge;
  }
}

}  // namespace

data::ImageProcessor parse_image_processor(std::string_view text, const std::string& path,
                                           std::vector<std::string>* notes) {
  const std::string origin = "preprocessor";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(origin, path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(origin, path + ": expected a JSON object");
  auto bad = [&](const std::string& field, const std::string& what) {
    fail(origin, path + ": field '" + field + "' " + what);
  };
  auto note = [&](const std::string& s) {
    if (notes) notes->push_back(s);
  };
  data::ImageProcessor p;
  auto flag = [&](const char* f, bool& dst) {
    if (!j.contains(f) || j[f].is_null()) return;  // null: the class's default
    if (!j[f].is_boolean()) bad(f, "is " + j[f].dump() + ", expected true or false");
    dst = j[f].get<bool>();
  };
  auto positive = [&](const std::string& f, const json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t{1} << 20))
      bad(f, "is " + v.dump() + ", expected a positive integer (at most 2^20)");
    return v.get<int64_t>();
  };
  // An integer (a square), [height, width], or {"height", "width"}; for
  // "size" also {"shortest_edge"[, "longest_edge"]}: get_size_dict's forms.
  auto size_field = [&](const char* f, nn::Size2d& dst, int64_t* shortest, int64_t* longest) {
    if (!j.contains(f) || j[f].is_null()) return;
    const json& v = j[f];
    const std::string field = f;
    if (v.is_number()) {
      dst = positive(field, v);
    } else if (v.is_array() && v.size() == 2) {
      dst = {positive(field + "[0]", v[0]), positive(field + "[1]", v[1])};
    } else if (v.is_object() && v.contains("height") && v.contains("width") && v.size() == 2) {
      dst = {positive(field + ".height", v["height"]), positive(field + ".width", v["width"])};
    } else if (shortest && v.is_object() && v.contains("shortest_edge") &&
               v.size() == (v.contains("longest_edge") ? 2u : 1u)) {
      *shortest = positive(field + ".shortest_edge", v["shortest_edge"]);
      if (v.contains("longest_edge")) {
        *longest = positive(field + ".longest_edge", v["longest_edge"]);
        if (*longest < *shortest)
          bad(field + ".longest_edge", "is " + std::to_string(*longest) +
                                           ", expected at least shortest_edge (" +
                                           std::to_string(*shortest) + ")");
      }
    } else {
      bad(field, "is " + v.dump() +
                     ", expected an integer, [height, width], {\"height\", \"width\"}" +
                     (shortest ? std::string(" or {\"shortest_edge\"[, \"longest_edge\"]}")
                               : std::string()));
    }
  };
  auto triple = [&](const char* f, std::vector<double>& dst) {
    if (!j.contains(f) || j[f].is_null()) return;
    const json& v = j[f];
    if (v.is_number()) {
      dst.assign(3, v.get<double>());
      return;
    }
    if (!v.is_array() || v.size() != 3)
      bad(f, "is " + v.dump() + ", expected 3 numbers (R, G, B) or one");
    for (size_t c = 0; c < 3; ++c) {
      if (!v[c].is_number()) bad(f, "is " + v.dump() + ", expected 3 numbers (R, G, B) or one");
      dst[c] = v[c].get<double>();
    }
  };
  flag("do_resize", p.do_resize);
  const bool convnext = is_convnext_processor(j);
  if (!convnext) size_field("size", p.size, &p.shortest_edge, &p.longest_edge);
  if (j.contains("resample") && !j["resample"].is_null()) {
    const json& v = j["resample"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 5)
      bad("resample",
          "is " + v.dump() +
              ", expected one of PIL's filters: 0 NEAREST, 1 LANCZOS, 2 BILINEAR, 3 BICUBIC, "
              "4 BOX, 5 HAMMING");
    p.resample = static_cast<data::Resample>(v.get<int>());
  }
  if (!convnext) {
    flag("do_center_crop", p.do_center_crop);
    size_field("crop_size", p.crop_size, nullptr, nullptr);
  } else {
    convnext_resize(j, p, bad, positive);
  }
  flag("do_rescale", p.do_rescale);
  if (j.contains("rescale_factor") && !j["rescale_factor"].is_null()) {
    if (!j["rescale_factor"].is_number())
      bad("rescale_factor", "is " + j["rescale_factor"].dump() + ", expected a number");
    p.rescale_factor = j["rescale_factor"].get<double>();
  }
  flag("do_normalize", p.do_normalize);
  triple("image_mean", p.image_mean);
  triple("image_std", p.image_std);
  bool convert = true;
  flag("do_convert_rgb", convert);
  if (!convert)
    note(path + ": do_convert_rgb is false; kiln's models take RGB, so images are still converted");
  for (const char* f : {"max_height", "max_width"})
    if (j.contains("size") && j["size"].is_object() && j["size"].contains(f))
      bad("size",
          "has " + std::string(f) +
              ", which kiln does not support (expected height and width, or shortest_edge)");
  if (notes) note_unread_fields(j, path, *notes);
  try {
    p.validate(path);
  } catch (const Error& e) {
    fail(origin, e.what());
  }
  return p;
}

data::ImageProcessor load_image_processor(const std::string& dir, std::vector<std::string>* notes) {
  const std::string path = (fs::path(dir) / "preprocessor_config.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (notes)
      notes->push_back("no preprocessor_config.json in " + dir +
                       ": ViTImageProcessor's defaults (resize to 224x224 bilinear, rescale 1/255, "
                       "normalize with mean 0.5 and std 0.5)");
    return {};
  }
  return parse_image_processor(read_file(path, "preprocessor"), path, notes);
}

std::string image_processor_json(const data::ImageProcessor& p) {
  json j;
  const bool convnext =
      p.crop_pct > 0 &&
      (p.do_center_crop
           ? p.shortest_edge > 0 && p.longest_edge == 0 &&
                 p.crop_size.height == p.crop_size.width && p.crop_size.height < 384
           : p.shortest_edge == 0 && p.size.height == p.size.width && p.size.height >= 384);
  j["image_processor_type"] = convnext ? "ConvNextImageProcessor" : "ViTImageProcessor";
  j["do_resize"] = p.do_resize;
  if (convnext) {
    const int64_t edge = p.do_center_crop ? p.crop_size.height : p.size.height;
    j["size"] = {{"shortest_edge", edge}};
    // crop_pct as read where it still gives the resize, else one that does
    // (the resize changed with the image size: set_image_size).
    double pct = p.crop_pct;
    if (p.do_center_crop &&
        std::floor(static_cast<double>(edge) / pct) != static_cast<double>(p.shortest_edge))
      pct = static_cast<double>(edge) / (static_cast<double>(p.shortest_edge) + 0.5);
    j["crop_pct"] = pct;
  } else if (p.shortest_edge > 0) {
    j["size"] = {{"shortest_edge", p.shortest_edge}};
    if (p.longest_edge > 0) j["size"]["longest_edge"] = p.longest_edge;
  } else {
    j["size"] = {{"height", p.size.height}, {"width", p.size.width}};
  }
  j["resample"] = static_cast<int>(p.resample);
  if (p.do_center_crop && !convnext) {
    j["do_center_crop"] = true;
    j["crop_size"] = {{"height", p.crop_size.height}, {"width", p.crop_size.width}};
  }
  j["do_rescale"] = p.do_rescale;
  j["rescale_factor"] = p.rescale_factor;
  j["do_normalize"] = p.do_normalize;
  j["image_mean"] = p.image_mean;
  j["image_std"] = p.image_std;
  j["do_convert_rgb"] = true;
  return j.dump(2) + "\n";
}

void save_image_processor(const std::string& path, const data::ImageProcessor& p) {
  write_file_atomic(path, image_processor_json(p));
}

}  // namespace kiln::io
