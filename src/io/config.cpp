// kiln io: HuggingFace config.json for ViT, ResNet and ConvNeXt, and of any
// registered model type.
#include "kiln/io.h"

namespace kiln::io {
nn::ViTConfig load_vit_config(const std::string& path) {
  return parse_vit_config(read_file(path, "config"), path);
}

nn::ViTConfig parse_vit_config(std::string_view text, const std::string& path) {
  return parse_vit_family_config(text, path, "vit");
}

nn::ViTConfig load_deit_config(const std::string& path) {
  return parse_deit_config(read_file(path, "config"), path);
}

nn::ViTConfig parse_deit_config(std::string_view text, const std::string& path) {
  return parse_vit_family_config(text, path, "deit");
}

nn::ViTConfig parse_vit_family_config(std::string_view text, const std::string& path,
                                      const std::string& model_type) {
  return nn::ViTConfig::from_json(text, path, model_type);
}

nn::ResNetConfig load_resnet_config(const std::string& path) {
  return parse_resnet_config(read_file(path, "config"), path);
}

nn::ResNetConfig parse_resnet_config(std::string_view text, const std::string& path) {
  return nn::ResNetConfig::from_json(text, path);
}

nn::ConvNextConfig load_convnext_config(const std::string& path) {
  return parse_convnext_config(read_file(path, "config"), path);
}

nn::ConvNextConfig parse_convnext_config(std::string_view text, const std::string& path) {
  return nn::ConvNextConfig::from_json(text, path);
}

std::shared_ptr<const nn::Model> load_model_config(const std::string& path) {
  return nn::model_from_config(read_file(path, "config"), path);
}

void save_vit_config(const std::string& path, const nn::ViTConfig& c) {
  write_file_atomic(path, c.to_json());
}

}  // namespace kiln::io
