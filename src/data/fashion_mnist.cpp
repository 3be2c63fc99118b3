// kiln data: IDX files (zlib) and the Fashion-MNIST data set.
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "kiln/data.h"

namespace kiln::data {

namespace {

struct IdxHeader {
  Shape shape;
  size_t header_bytes = 0, data_bytes = 0;
};

// The header of IDX bytes: fails naming `origin` on a bad magic, type or rank,
// a header cut short, or a shape whose size overflows.
IdxHeader parse_idx_header(const std::vector<uint8_t>& bytes, const std::string& origin) {
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
  IdxHeader h;
  h.header_bytes = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < h.header_bytes)
    fail(origin, "is truncated inside its header (" + std::to_string(bytes.size()) + " of " +
                     std::to_string(h.header_bytes) + " bytes)");
  // Four 32-bit dimensions can multiply past 64 bits, to a small number that
  // matches the data; every partial product must fit an int64 (kiln's numel).
  int64_t total = 1;
  bool overflow = false;
  for (int d = 0; d < rank; ++d) {
    const uint8_t* p = bytes.data() + 4 + 4 * d;
    uint32_t v = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    h.shape.push_back(v);
    overflow |= __builtin_mul_overflow(total, int64_t{v}, &total);
  }
  if (overflow)
    fail(origin, "has shape " + str(h.shape) +
                     ", expected dimensions whose products (from the first) stay below 2^63");
  h.data_bytes = static_cast<size_t>(total);
  return h;
}

}  // namespace

IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& origin) {
  IdxHeader h = parse_idx_header(bytes, origin);
  const size_t got = bytes.size() - h.header_bytes;
  if (got != h.data_bytes)
    fail(origin, "has " + std::to_string(got) + " data bytes, expected " +
                     std::to_string(h.data_bytes) + " for shape " + str(h.shape) +
                     (got < h.data_bytes ? " (truncated)" : ""));
  return {h.shape, std::vector<uint8_t>(bytes.begin() + h.header_bytes, bytes.end())};
}

IdxArray read_idx(const std::string& path) {
  // gzread reads plain files as they are.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  // Once the header is in, reading stops past the size it gives: a file that
  // is not IDX, or a small gzip file that inflates to gigabytes, fails early.
  constexpr size_t kLongestHeader = 4 + 4 * 4;
  std::optional<IdxHeader> header;
  while (true) {
    int got = gzread(f.get(), chunk, sizeof chunk);
    if (got < 0) {
      int err = 0;
      fail(path, std::string("is not a readable gzip or IDX file: ") + gzerror(f.get(), &err));
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + got);
    if (!header && bytes.size() >= kLongestHeader) header = parse_idx_header(bytes, path);
    if (header && bytes.size() > header->header_bytes + header->data_bytes)
      fail(path, "has more than the " + std::to_string(header->data_bytes) +
                     " data bytes of its shape " + str(header->shape));
  }
  // A gzip stream cut short reads as a short file without an error: say so.
  int err = 0;
  const char* msg = gzerror(f.get(), &err);
  if (err) fail(path, std::string("is a damaged gzip file: ") + msg);
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

const std::vector<std::string>& FashionMnist::class_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                 "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                 "Bag",         "Ankle boot"};
  return names;
}

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
    random::uniform_block(k, 0, v);
    flip = v[0] < 0.5;
  }
  const float scale = 1.0f / (255.0f * opt_.std), shift = opt_.mean / opt_.std;
  for (int r = 0; r < 28; ++r)
    for (int c = 0; c < 28; ++c)
      image[r * 28 + c] = src[r * 28 + (flip ? 27 - c : c)] * scale - shift;
  *label = labels_[index];
}

}  // namespace kiln::data
