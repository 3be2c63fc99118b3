// kiln data: image files for prediction, processed as a checkpoint says.
#include <algorithm>
#include <filesystem>

#include "kiln/data.h"

namespace kiln::data {
namespace fs = std::filesystem;

ImageFiles::ImageFiles(std::vector<std::string> files, ImageProcessor processor,
                       nn::Size2d image_size, int64_t channels)
    : files_(std::move(files)),
      processor_(std::move(processor)),
      size_(image_size),
      channels_(channels),
      errors_(files_.size()) {
  processor_.validate("image processor");
  if (channels_ != 1 && channels_ != 3)
    fail("image files",
         "channels " + std::to_string(channels_) + ": expected 3 (RGB) or 1 (greyscale) images");
  if (size_.height <= 0 || size_.width <= 0)
    fail("image files", "image size " + nn::to_string(size_) + " is not positive");
}

void ImageFiles::get(int64_t index, float* image, int32_t* label) const {
  const std::string& path = files_.at(index);
  try {
    Image img = decode_image(read_file_bytes(path), channels_, path);
    nn::Size2d s = processor_.output_size(img.width, img.height);
    if (s != size_)
      fail(path, "processes to " + nn::to_string(s) +
                     " pixel values (preprocessor_config.json's size" +
                     std::string(processor_.do_center_crop ? " and crop_size" : "") +
                     "), but the model takes " + nn::to_string(size_));
    processor_.pixel_values(img, image);
    *label = 0;
  } catch (const Error& e) {
    errors_[index] = e.what();
    std::fill_n(image, channels_ * size_.height * size_.width, 0.0f);
    *label = -1;
  }
}

std::vector<std::string> ImageFiles::find(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(
               p, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec) && is_image_file_name(it->path().string()))
          found.push_back(it->path().string());
      if (ec) fail(p, "cannot list the folder: " + ec.message());
      if (found.empty()) fail(p, "is a folder without .jpg, .jpeg or .png files");
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::exists(p, ec)) {
      out.push_back(p);  // named on purpose: read whatever its extension
    } else {
      fail(p, "no such file or folder");
    }
  }
  return out;
}

}  // namespace kiln::data
