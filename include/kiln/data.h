// kiln — data sets and a threaded loader with bounded prefetch.
#pragma once
#include <array>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/nn.h"
#include "kiln/random.h"

namespace kiln::data {

// A data set of fixed-shape float images with integer labels, or of blocks
// of token ids (sample_dtype() i32: a language model's, whose labels are
// the tokens themselves). get() must be safe to call from several threads at
// once.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Shape image_shape() const = 0;  // one sample, e.g. {3, 224, 224}; tokens: {T}
  virtual DType sample_dtype() const { return DType::f32; }
  // A token data set's sample: its ids (sample_dtype() i32).
  virtual void get_tokens(int64_t index, int32_t* tokens) const;
  virtual void get(int64_t index, float* image, int32_t* label) const = 0;
  // Augmenting data sets draw their randomness from (seed, epoch, index); the
  // loader says which epoch a sample is drawn for before get().
  virtual void get(int64_t index, int64_t epoch, float* image, int32_t* label) const {
    get(index, image, label);
  }
};

struct RandomImagesOptions {
  int64_t num_samples = 1 << 20;
  int64_t num_labels = 1000;
  nn::Size2d image_size = 224;  // height and width
  int64_t channels = 3;
  nn::Layout layout = nn::Layout::NCHW;
  uint64_t seed = 0;
};

// The reference experiment's data: N(0,1) pixels, label of sample i = i % num_labels.
// Sample i is a pure function of (seed, i).
class RandomImages final : public Dataset {
 public:
  explicit RandomImages(RandomImagesOptions opt);
  int64_t size() const override { return opt_.num_samples; }
  Shape image_shape() const override;
  void get(int64_t index, float* image, int32_t* label) const override;

 private:
  RandomImagesOptions opt_;
};

// An IDX file (the MNIST format): magic 0x0000 <type> <rank>, big-endian
// dimensions, then the data. Only unsigned-byte data (type 0x08) is read.
struct IdxArray {
  Shape shape;
  std::vector<uint8_t> data;
};
// Parses IDX bytes; `origin` (a file name) is named in every error.
IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& origin);
// Reads an IDX file, gzip-compressed or not (zlib).
IdxArray read_idx(const std::string& path);

// Where Debian's dataset-fashion-mnist package puts the data.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnistOptions {
  std::string dir = kFashionMnistDir;
  std::string split = "train";  // train (60000 images) or test (10000)
  nn::Layout layout = nn::Layout::NCHW;
  // Per-channel normalization after scaling to [0, 1]: (x - mean) / std.
  float mean = 0.2860f, std = 0.3530f;
  bool hflip = false;  // random horizontal flips (training augmentation)
  uint64_t seed = 0;   // flips of sample i in epoch e: a function of (seed, e, i)
};

// Fashion-MNIST: 28x28 grey images of 10 kinds of clothing, from the IDX files
// {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] in `dir`.
class FashionMnist final : public Dataset {
 public:
  explicit FashionMnist(FashionMnistOptions opt);
  int64_t size() const override { return n_; }
  Shape image_shape() const override;
  void get(int64_t index, float* image, int32_t* label) const override;
  void get(int64_t index, int64_t epoch, float* image, int32_t* label) const override;
  static constexpr int64_t kClasses = 10;
  // The classes' names, in label order (Zalando's, as torchvision has them).
  static const std::vector<std::string>& class_names();

 private:
  FashionMnistOptions opt_;
  int64_t n_ = 0;
  std::vector<uint8_t> images_, labels_;
};

// A decoded 8-bit image, rows of width * channels bytes.
struct Image {
  int64_t width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
};
// Decodes JPEG (libjpeg-turbo) or PNG (libpng) bytes as transformers'
// load_image does with Pillow, byte for byte: Image.open, then
// ImageOps.exif_transpose (the EXIF orientation, or XMP's tiff:Orientation),
// then convert("RGB") for 3 channels or convert("L") for 1. JPEG: libjpeg's
// defaults (accurate integer IDCT, smooth chroma upsampling), progressive,
// grey, CMYK/YCCK (Adobe polarity, Pillow's cmyk2rgb); PNG: every colour type
// and bit depth, interlaced or not, as Pillow unpacks it (16-bit samples by
// their high byte, but 16-bit grey clipped at 255 as Pillow's "I;16"; alpha
// and tRNS dropped; palette indices past the palette black; gamma and colour
// profiles ignored). `origin` (the file) is named in every error. A JPEG
// cut short or with corrupt data is an error (libjpeg's warnings stop it),
// except extraneous bytes before a marker, decoded through as Pillow does;
// an unreadable EXIF block is ignored.
Image decode_image(const std::vector<uint8_t>& bytes, int64_t channels, const std::string& origin);
// Reads only the header: width and height (after the orientation), or an
// error naming the file.
Image probe_image(const std::vector<uint8_t>& bytes, const std::string& origin);
// The bytes of the file at `path`; an error names it.
std::vector<uint8_t> read_file_bytes(const std::string& path);
// Whether a file's name says JPEG or PNG (.jpg, .jpeg, .png, any case): the
// files image folders and `kiln predict`'s folders are made of.
bool is_image_file_name(const std::string& path);

// Pillow's resampling filters, by Pillow's numbers (PIL.Image.Resampling, and
// preprocessor_config.json's "resample").
enum class Resample { nearest = 0, lanczos = 1, bilinear = 2, bicubic = 3, box = 4, hamming = 5 };
// `image` (1 or 3 channels) resized to width x height exactly as Pillow's
// Image.resize(size, resample) does, byte for byte: its separable
// convolution with the filter widened by the scale when shrinking,
// coefficients in 22-bit fixed point, the horizontal pass first, each pass
// rounded to 8 bits; NEAREST samples the pixel under each output pixel's
// centre as Pillow's affine scaling does.
Image resize_like_pillow(const Image& image, int64_t width, int64_t height, Resample filter);

// transformers' ViTImageProcessor (its Pillow backend): how a checkpoint's
// images become pixel_values. Field names and defaults are
// preprocessor_config.json's (io::load_image_processor reads it).
struct ImageProcessor {
  bool do_resize = true;
  // The resize's target: height x width, or (shortest_edge > 0) the shorter
  // side becomes shortest_edge, aspect kept (truncated), and with
  // longest_edge > 0 the longer side at most longest_edge.
  nn::Size2d size = 224;
  int64_t shortest_edge = 0, longest_edge = 0;
  Resample resample = Resample::bilinear;
  bool do_center_crop = false;
  nn::Size2d crop_size = 224;  // zero padding where it is larger than the image
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255;
  bool do_normalize = true;
  std::vector<double> image_mean = {0.5, 0.5, 0.5}, image_std = {0.5, 0.5, 0.5};
  // Read from a ConvNextImageProcessor (0 otherwise), whose rule the fields
  // above hold (io::parse_image_processor); kept to write it back as one.
  double crop_pct = 0;

  // The height x width of the pixel values for an image of width x height.
  nn::Size2d output_size(int64_t width, int64_t height) const;
  // Resizes (Pillow), crops, rescales and normalizes an RGB image into
  // out[3][h][w] (h x w = output_size), float for float what transformers
  // computes: (float)(u8 * rescale_factor) in double, then
  // (x - (float)mean) / (float)std in float. A greyscale image (a model of
  // num_channels 1) becomes out[1][h][w] with the first mean and std.
  void pixel_values(const Image& rgb, float* out) const;
  // Checks the fields: positive sizes, 3 means and 3 nonzero stds; an error
  // names `origin` and the field.
  void validate(const std::string& origin) const;
};

// ---- color jitter (torchvision's ColorJitter on Pillow images) ----
struct ColorJitterOptions {
  // Factors drawn uniformly from [max(0, 1 - x), 1 + x] for brightness,
  // contrast and saturation, and a hue shift from [-hue, hue] (hue <= 0.5);
  // 0 leaves that adjustment out. timm's --color-jitter X is (X, X, X, 0).
  double brightness = 0, contrast = 0, saturation = 0, hue = 0;
  bool enabled() const { return brightness > 0 || contrast > 0 || saturation > 0 || hue > 0; }
  void validate() const;  // errors name --color-jitter
};
struct ColorJitterParams {
  int order[4] = {0, 1, 2, 3};  // 0 brightness, 1 contrast, 2 saturation, 3 hue
  double brightness = 1, contrast = 1, saturation = 1, hue = 0;
};
// The order (a uniform permutation, as torch.randperm(4)) and the factors
// of the enabled adjustments, from a source of uniform draws in [0, 1).
ColorJitterParams draw_color_jitter(const ColorJitterOptions& opt,
                                    const std::function<double()>& uniform);
// An RGB image adjusted in that order as torchvision's functional_pil does
// with Pillow, byte for byte: ImageEnhance's Brightness (a blend with
// black), Contrast (with the rounded mean of its "L" conversion) and Color
// (with its "L" conversion), as Image.blend computes them (a float32 factor,
// truncation, clipping beyond [0, 1]); the hue by shifting H of Pillow's HSV
// conversion by uint8(int8(hue · 255)), wrapping, and converting back.
void color_jitter(Image& img, const ColorJitterParams& p);

// ---- RandAugment (timm's rand_augment_transform on Pillow images) ----
// timm's RandAugment operations (its _RAND_TRANSFORMS, in that order).
enum class AugmentOp {
  AutoContrast,
  Equalize,
  Invert,
  Rotate,
  Posterize,
  Solarize,
  SolarizeAdd,
  Color,
  Contrast,
  Brightness,
  Sharpness,
  ShearX,
  ShearY,
  TranslateXRel,
  TranslateYRel,
};
inline constexpr int kAugmentOps = 15;
const char* augment_op_name(AugmentOp op);  // timm's name, e.g. "TranslateXRel"

struct RandAugmentOptions {
  bool enabled = false;
  double magnitude = 10;   // m: 0..magnitude_max
  int64_t num_layers = 2;  // n: operations drawn (with replacement) per image
  double prob = 0.5;       // p: each drawn operation's probability
  // mstd: the magnitude drawn from N(magnitude, magnitude_std) where > 0,
  // uniform in [0, magnitude] where infinite (timm: mstd above 100); then
  // clipped to [0, magnitude_max].
  double magnitude_std = 0;
  double magnitude_max = 10;  // mmax
  bool increasing = false;    // inc1: timm's _RAND_INCREASING_TRANSFORMS
  // Outside the config string: the colour the geometric operations fill
  // with (timm: the normalization mean x 255, rounded) and their filter
  // (bilinear or bicubic; timm's --train-interpolation).
  std::array<uint8_t, 3> fill = {128, 128, 128};
  Resample resample = Resample::bicubic;
  // timm's config string: "rand" then dash-separated sections m<int>,
  // n<int>, p<float>, mstd<float>, mmax<int>, inc<0|1> in any order (e.g.
  // "rand-m9-mstd0.5-inc1"). Errors name `flag` and the section. (timm reads
  // "inc0" as on; kiln as off. Weighted or named transform sets, "t...",
  // are not supported.)
  static RandAugmentOptions parse(const std::string& config, const std::string& flag);
  void validate(const std::string& flag) const;
};
// timm's LEVEL_TO_ARG: the argument operation `op` takes at `magnitude`
// (0..10 scale) in either transform set, negated where timm negates at
// random and `negate` is set. The histogram operations and Invert take none
// (0).
double augment_level_to_arg(AugmentOp op, double magnitude, bool increasing, bool negate);
// Whether timm's level function for `op` negates at random (a draw): the
// geometric operations, and the enhancements in the increasing set.
bool augment_op_negates(AugmentOp op, bool increasing);
// One operation on an RGB image, byte for byte what timm's op function does
// with Pillow: ImageOps' autocontrast, equalize, invert, posterize (0 bits:
// black) and solarize; timm's solarize_add (threshold 128); ImageEnhance's
// Color, Contrast, Brightness and Sharpness (a blend with Pillow's SMOOTH
// filter, its border kept); and the affine ones (rotate about the centre by
// `arg` degrees counter-clockwise as Image.rotate computes its matrix, shears
// by a factor, translations by a fraction of the size) by Image.transform's
// bilinear or bicubic sampling, pixels from outside the image `fill`.
void augment_op(Image& img, AugmentOp op, double arg, const std::array<uint8_t, 3>& fill,
                Resample resample);
// timm's RandAugment.__call__ on an RGB image with kiln's uniform draws in
// [0, 1), in timm's order: the num_layers operations (uniform, with
// replacement), then for each: applied with probability prob, its magnitude
// (the noise by Box-Muller from two draws), its negation (where it has one).
void rand_augment(Image& img, const RandAugmentOptions& o, const std::function<double()>& uniform);

struct ImageFolderOptions {
  std::string root;             // root/<class>/<image>.{jpg,jpeg,png}
  std::string split = "all";    // all, train (all but the held-out files) or holdout
  int64_t holdout_every = 10;   // file i of each class (sorted by name) is held out when
                                // i % holdout_every == holdout_every - 1
  nn::Size2d image_size = 224;  // the crop (height x width)
  // Before the crop the image is scaled (aspect kept) to the least size that
  // covers `resize` (for a square, its shorter side becomes `resize`);
  // 0: image_size * 8 / 7.
  nn::Size2d resize = 0;
  int64_t channels = 3;  // 3 (RGB) or 1 (grey)
  bool augment = false;  // random crop and horizontal flip; else the centre crop
  std::vector<float> mean = {0.5f, 0.5f, 0.5f}, std = {0.5f, 0.5f, 0.5f};  // per channel
  nn::Layout layout = nn::Layout::NCHW;
  bool skip_bad = false;  // skip (and count) files whose header cannot be read; else an error
  uint64_t seed = 0;
  // RGB folders, as transformers' run_image_classification.py: when set,
  // images decode as Pillow does (decode_image) and, unless augmenting,
  // become pixel values as this processor (a checkpoint's
  // preprocessor_config.json) says, which must make image_size; augmented,
  // they take torchvision's RandomResizedCrop(image_size, crop_scale,
  // crop_ratio) (random_crop; else the processor's resize) resized with
  // Pillow's bilinear filter, a horizontal flip with probability flip_prob,
  // then the processor's rescaling and normalization. resize, mean and std
  // are then unused.
  std::optional<ImageProcessor> processor;
  bool random_crop = true;
  double crop_scale[2] = {0.08, 1.0}, crop_ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
  double flip_prob = 0.5;
  // Augmenting an RGB folder: torchvision's ColorJitter after the crop and
  // the flip, its draws after theirs.
  ColorJitterOptions color_jitter;
  // Augmenting an RGB folder: timm's RandAugment after the crop and the flip
  // (and color jitter, which timm leaves out with it), its draws after theirs.
  RandAugmentOptions rand_augment;
};
// torchvision's RandomResizedCrop.get_params for an image of width x height:
// up to 10 tries of an area fraction uniform in `scale` and a log-uniform
// aspect ratio in `ratio` (sides rounded half to even), placed uniformly;
// else the centre crop at the nearest allowed ratio. `uniform` gives numbers
// in [0, 1). Returns {top, left, height, width}.
std::array<int64_t, 4> random_resized_crop(int64_t width, int64_t height, const double scale[2],
                                           const double ratio[2],
                                           const std::function<double()>& uniform);

// Images in one sub-folder per class (classes sorted by folder name), resized
// (bilinear) so that they cover `resize` (for a square, the shorter side
// becomes `resize`), cropped to image_size, optionally flipped, normalized per
// channel.
class ImageFolder final : public Dataset {
 public:
  explicit ImageFolder(ImageFolderOptions opt);
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape image_shape() const override;
  void get(int64_t index, float* image, int32_t* label) const override;
  void get(int64_t index, int64_t epoch, float* image, int32_t* label) const override;
  const std::vector<std::string>& classes() const { return classes_; }
  int64_t skipped() const { return skipped_; }
  // The class sub-folders of `root`, sorted: the labels' names, in label order.
  static std::vector<std::string> list_classes(const std::string& root);

 private:
  void get_processed(int64_t index, int64_t epoch, float* out) const;  // with opt_.processor
  ImageFolderOptions opt_;
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int32_t>> files_;
  int64_t skipped_ = 0;
};

// Image files without labels, each decoded (RGB) and processed as a
// checkpoint's preprocessor_config.json says, into [3, H, W] (image_size):
// what `kiln predict` reads. A file that cannot be read or does not process
// to image_size is not an error of the data set: its label is -1, its pixels
// zero, and error(index) says why.
class ImageFiles final : public Dataset {
 public:
  // `channels`: 3 (RGB) or 1 (greyscale, as Pillow's convert("L")).
  ImageFiles(std::vector<std::string> files, ImageProcessor processor, nn::Size2d image_size,
             int64_t channels = 3);
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape image_shape() const override { return {channels_, size_.height, size_.width}; }
  void get(int64_t index, float* image, int32_t* label) const override;
  const std::string& file(int64_t index) const { return files_.at(index); }
  // Empty unless get(index) failed; read it after get() has returned.
  const std::string& error(int64_t index) const { return errors_.at(index); }

  // The .jpg, .jpeg and .png files of `paths`: files as given, folders
  // searched recursively (sorted by path); an error names a path that is
  // neither, or a folder without images.
  static std::vector<std::string> find(const std::vector<std::string>& paths);

 private:
  std::vector<std::string> files_;
  ImageProcessor processor_;
  nn::Size2d size_;
  int64_t channels_;
  mutable std::vector<std::string> errors_;  // one slot per file, written by its get()
};

struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = false;
  uint64_t seed = 0;      // shuffling order of epoch e uses fold_in(seed, e)
  bool drop_last = true;  // drop a final partial batch
  int workers = 2;        // 0: batches are made on the caller's thread
  int prefetch = 4;       // batches made ahead of the consumer, at most
  int64_t start = 0;      // serial number of the first batch (resuming a run)
  int64_t limit = 0;      // batches made in all (from serial 0; the workers stop there); 0: no end
  // Data-parallel ranks: each batch is part `shard` of `shards` contiguous,
  // equal parts of the global batch of batch_size (samples [B·s/n, B·(s+1)/n)
  // of it), so that the ranks together see what one process sees.
  int shard = 0, shards = 1;
};

struct Batch {
  Array images;  // [B, ...image_shape] f32 (a token data set's: [B, T] i32 ids)
  Array labels;  // [B] i32 (a token data set's: the ids themselves, [B, T])
  int64_t epoch = 0;
  int64_t index = 0;  // batch number within the epoch
};

// Yields batches in order, epoch after epoch, forever; workers build them
// ahead of time. Destroying the loader stops the workers cleanly.
class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions opt);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  Batch next();
  int64_t batches_per_epoch() const { return per_epoch_; }
  // Serial number of the batch the next call to next() returns.
  int64_t position() const { return next_to_take_; }
  // Seconds the caller has spent blocked in next() waiting for a batch.
  double wait_seconds() const { return wait_seconds_; }

 private:
  Batch make(int64_t serial) const;
  std::vector<int64_t> order_for(int64_t epoch) const;
  void worker_loop(int id);

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions opt_;
  int64_t per_epoch_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::map<int64_t, Batch> done_;                 // finished batches by serial number
  std::map<int64_t, std::exception_ptr> failed_;  // a worker's error, raised by next()
  int64_t next_to_make_ = 0, next_to_take_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
  double wait_seconds_ = 0;
  mutable std::mutex order_mu_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;
};

// ---- mixup and cutmix (timm's Mixup, mode "batch") ----
struct MixupOptions {
  double mixup_alpha = 0;   // Beta(α, α) for mixup's λ; 0: no mixup
  double cutmix_alpha = 0;  // Beta(α, α) for cutmix's λ; 0: no cutmix
  double prob = 1.0;        // the chance that a batch is mixed at all
  double switch_prob = 0.5;  // with both: the chance of cutmix rather than mixup
  bool enabled() const { return mixup_alpha > 0 || cutmix_alpha > 0; }
  // Throws naming the flag (--mixup, --cutmix, --mixup-prob, --mixup-switch-prob).
  void validate() const;
};

// One batch's draws: λ (the kept image's weight; 1: not mixed) and, for
// cutmix, the box [y0, y1) x [x0, x1) pasted from the reversed batch (λ then
// the share of the image outside it, timm's correct_lam).
struct MixParams {
  double lam = 1.0;
  bool cutmix = false;
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
};

// timm's _params_per_batch and cutmix_bbox_and_lam (rand_bbox, correct_lam)
// for images of height x width, drawn from `key` (Threefry: the same on
// every machine) in place of numpy's global generator.
MixParams draw_mix(const MixupOptions& opt, const random::Key& key, int64_t height, int64_t width);

// Draws of Beta(a, b) (through two Gamma draws, Marsaglia and Tsang's
// method) and of a uniform integer in [low, high), from `key` on the host.
double beta_draw(const random::Key& key, double a, double b);
int64_t randint_draw(const random::Key& key, int64_t low, int64_t high);

// Mixes images [B, C, H, W] (or [B, H, W, C] with channels_last) with the
// batch reversed (image i with image B-1-i; B even), as timm's Mixup does:
// λ·x + (1-λ)·x_reversed, or the box of x_reversed pasted into x; and
// returns them with the soft targets [B, num_classes] (f32): one-hot labels
// smoothed (1 - ε + ε/C on the label, ε/C elsewhere) mixed alike,
// λ·y + (1-λ)·y_reversed (timm's mixup_target).
std::pair<Array, Array> mix_batch(const Array& images, const Array& labels, const MixParams& mix,
                                  int64_t num_classes, double label_smoothing, bool channels_last);

// ---- random erasing (timm's RandomErasing, one box per image) ----
struct ErasingOptions {
  double prob = 0;  // the chance that an image gets a box (timm's --reprob); 0: off
  double min_area = 0.02, max_area = 1.0 / 3.0;  // of the image
  double min_aspect = 0.3;                         // and 1 / min_aspect at most
  // The box's values: "const" zeros, "rand" one normal draw per channel,
  // "pixel" a normal draw per value (timm's --remode; DeiT's: pixel).
  std::string mode = "pixel";
  bool enabled() const { return prob > 0; }
  void validate() const;  // errors name --reprob and --remode
};
// An image's box: rows [top, top + height), columns [left, left + width).
struct EraseBox {
  bool erase = false;
  int64_t top = 0, left = 0, height = 0, width = 0;
};
// timm's RandomErasing._erase for one box, from a source of uniform draws
// in [0, 1) that stands for Python's random module: random() as it is,
// uniform(a, b) = a + (b - a)·u, randint(a, b) = a + ⌊u·(b − a + 1)⌋; up to
// 10 tries of an area and a log-uniform aspect, rounded half to even.
EraseBox erase_box(const ErasingOptions& opt, int64_t height, int64_t width,
                   const std::function<double()>& uniform);
// The same with the draws of `key` (Threefry).
EraseBox draw_erase(const ErasingOptions& opt, const random::Key& key, int64_t height,
                    int64_t width);
// Images [B, C, H, W] (or [B, H, W, C]) with image i's box filled as
// opt.mode says, its normal draws from random::fold_in(key, i).
Array erase_batch(const Array& images, const std::vector<EraseBox>& boxes,
                  const ErasingOptions& opt, const random::Key& key, bool channels_last);

}  // namespace kiln::data
