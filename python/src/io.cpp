// kiln's Python module: pretrained models, save_pretrained and safetensors.
#include "common.h"

namespace kiln_python {

// The config of a pretrained ViT (kiln.nn.ViT's from_pretrained); another
// family, DeiT included, is an error pointing to kiln.models.
const kiln::nn::ViTConfig& vit_config_of(const kiln::io::Pretrained& p, const std::string& src) {
  const kiln::nn::ViTForImageClassification* vit = kiln::nn::as_vit(*p.model);
  if (!vit || vit->variant() != kiln::nn::ViTVariant::ViT)
    kiln::fail("model", src + ": a " + p.model->architecture() + " (model_type \"" +
                            p.model->model_type() +
                            "\"), not a ViT; kiln.models.from_pretrained loads every family");
  return vit->config();
}

// The bindings of pretrained models, save_pretrained and safetensors.
void bind_io(nb::module_& m) {
  // ---- io ----
  m.def(
      "_load_pretrained",
      [](const std::string& src) {
        kiln::io::Pretrained p;
        {
          nb::gil_scoped_release release;
          p = kiln::io::load_pretrained(src);
        }
        return nb::make_tuple(vit_config_of(p, src), p.params, p.has_classifier, p.notes, p.dir);
      },
      "src"_a);
  m.def(
      "_adapt_classifier",
      [](const std::string& src, std::vector<std::string> labels, const kiln::random::Key& key,
         std::optional<nb::object> image_size) {
        std::optional<kiln::nn::Size2d> size;
        if (image_size) size = to_size2d(*image_size, "image_size");
        kiln::io::Pretrained p;
        {
          nb::gil_scoped_release release;
          p = kiln::io::load_pretrained(src);
          kiln::io::adapt_classifier(p, labels, key);
          if (size) kiln::io::set_image_size(p, *size);
        }
        return nb::make_tuple(vit_config_of(p, src), p.params, p.notes);
      },
      "src"_a, "labels"_a, "key"_a, "image_size"_a.none());
  m.def(
      "_save_pretrained",
      [](const std::string& dir, const kiln::nn::ViTConfig& cfg, const kiln::Params& params) {
        kiln::io::save_pretrained(dir, *kiln::nn::vit_model(cfg), params);
      },
      "dir"_a, "config"_a, "params"_a, NoGil());
  m.def(
      "load_safetensors",
      [](const std::string& path) { return kiln::io::load_safetensors(path).tensors; }, "path"_a,
      NoGil(), kiln_doc("load_safetensors"));
  m.def("save_safetensors", &kiln::io::save_safetensors, "path"_a, "tensors"_a,
        "metadata"_a = std::map<std::string, std::string>{}, NoGil(), kiln_doc("save_safetensors"));
}

// The bindings of the optimizers' update rules, schedules, clipping.
// Models of every family behind kiln::nn::Model (kiln.models).

}  // namespace kiln_python
