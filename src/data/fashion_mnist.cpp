// kiln data: IDX files (zlib) and the Fashion-MNIST data set.
#include <zlib.h>

#include <cstring>
#include <filesystem>

#include "kiln/data.h"

namespace kiln::data {

IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& origin) {
  if (bytes.size() < 4)
    fail(origin, "is " + std::to_string(bytes.size()) +
                     " bytes long, too short for an IDX header (4 bytes)");
  if (bytes[0] != 0 || bytes[1] != 0)
    fail(origin, "is not an IDX file: its magic starts with " + std::to_string(bytes[0]) + " " +
                     std::to_string(bytes[1]) + ", expected 0 0");
  if (bytes[2] != 0x08)
    fail(origin, "holds IDX data of type 0x" + std::to_string(bytes[2] / 16) +
                     std::to_string(bytes[2] % 16) + ", expected 0x08 (unsigned bytes)");
  int rank = bytes[3];
  if (rank < 1 || rank > 4) fail(origin, "has rank " + std::to_string(rank) + ", expected 1 to 4");
  size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header)
    fail(origin, "is truncated inside its header (" + std::to_string(bytes.size()) + " of " +
                     std::to_string(header) + " bytes)");
  IdxArray out;
  size_t total = 1;
  for (int d = 0; d < rank; ++d) {
    const uint8_t* p = bytes.data() + 4 + 4 * d;
    uint32_t v = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    out.shape.push_back(v);
    total *= v;
  }
  if (bytes.size() - header != total)
    fail(origin, "has " + std::to_string(bytes.size() - header) + " data bytes, expected " +
                     std::to_string(total) + " for shape " + str(out.shape) +
                     (bytes.size() - header < total ? " (truncated)" : ""));
  out.data.assign(bytes.begin() + header, bytes.end());
  return out;
}

IdxArray read_idx(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  while (true) {
    int got = gzread(f, chunk, sizeof chunk);
    if (got < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      fail(path, "is not a readable gzip or IDX file: " + msg);
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + got);
  }
  // A gzip stream cut short reads as a short file without an error: say so.
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string why = err ? msg : "";
  gzclose(f);
  if (!why.empty()) fail(path, "is a damaged gzip file: " + why);
  return parse_idx(bytes, path);
}

namespace {

std::string find_file(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    std::string p = dir + "/" + stem + ext;
    if (std::filesystem::exists(p)) return p;
  }
  fail("fashion-mnist", "no " + stem + "[.gz] in " + dir +
                            " (Debian's dataset-fashion-mnist package installs it there; "
                            "scripts/setup.sh installs the package)");
}

}  // namespace

FashionMnist::FashionMnist(FashionMnistOptions opt) : opt_(std::move(opt)) {
  std::string prefix;
  if (opt_.split == "train")
    prefix = "train";
  else if (opt_.split == "test")
    prefix = "t10k";
  else
    fail("fashion-mnist", "split '" + opt_.split + "', expected train or test");
  if (!(opt_.std > 0)) fail("fashion-mnist", "std must be positive");
  std::string ipath = find_file(opt_.dir, prefix + "-images-idx3-ubyte");
  std::string lpath = find_file(opt_.dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = read_idx(ipath), labels = read_idx(lpath);
  if (images.shape.size() != 3 || images.shape[1] != 28 || images.shape[2] != 28)
    fail(ipath, "holds images of shape " + str(images.shape) + ", expected (N,28,28)");
  if (labels.shape.size() != 1 || labels.shape[0] != images.shape[0])
    fail(lpath, "holds " + str(labels.shape) + " labels for " + std::to_string(images.shape[0]) +
                    " images");
  for (size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] >= kClasses)
      fail(lpath, "label " + std::to_string(labels.data[i]) + " of sample " + std::to_string(i) +
                      " is outside [0, 10)");
  n_ = images.shape[0];
  images_ = std::move(images.data);
  labels_ = std::move(labels.data);
}

Shape FashionMnist::image_shape() const {
  return opt_.layout == nn::Layout::NCHW ? Shape{1, 28, 28} : Shape{28, 28, 1};
}

void FashionMnist::get(int64_t index, float* image, int32_t* label) const {
  get(index, -1, image, label);
}

void FashionMnist::get(int64_t index, int64_t epoch, float* image, int32_t* label) const {
  if (index < 0 || index >= n_)
    fail("fashion-mnist",
         "sample " + std::to_string(index) + " is outside [0, " + std::to_string(n_) + ")");
  const uint8_t* src = images_.data() + index * 28 * 28;
  bool flip = false;
  if (opt_.hflip && epoch >= 0) {
    random::Key k = random::fold_in(random::fold_in(random::Key(opt_.seed), uint32_t(epoch)),
                                    static_cast<uint32_t>(index));
    double v[2];
    random::draw_block(random::draw_spec(k, RandomKind::Uniform, 0, 1), 0, v);
    flip = v[0] < 0.5;
  }
  const float scale = 1.0f / (255.0f * opt_.std), shift = opt_.mean / opt_.std;
  for (int r = 0; r < 28; ++r)
    for (int c = 0; c < 28; ++c)
      image[r * 28 + c] = src[r * 28 + (flip ? 27 - c : c)] * scale - shift;
  *label = labels_[index];
}

}  // namespace kiln::data
