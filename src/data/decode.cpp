// kiln data: JPEG and PNG decoding as Pillow decodes them (Image.open,
// ImageOps.exif_transpose, convert("RGB") or convert("L")), byte for byte.
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include "data/pillow.h"
#include "kiln/data.h"

namespace kiln::data {
namespace {

bool is_jpeg(const std::vector<uint8_t>& b) {
  return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}
bool is_png(const std::vector<uint8_t>& b) {
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), sig, 8) == 0;
}

// PIL refuses images above this many pixels as decompression bombs (twice its
// MAX_IMAGE_PIXELS); so does kiln, before it allocates: a header of a few bytes
// can claim 65535 x 65535 pixels, 12 GB decoded.
constexpr int64_t kMaxPixels = 178956970;

void check_size(int64_t width, int64_t height, const char* format, const std::string& origin) {
  if (width <= 0 || height <= 0)
    fail(origin, std::string("is not a readable ") + format + ": its header gives no image size");
  if (width * height > kMaxPixels)
    fail(origin, "is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                     std::to_string(width * height) + " pixels, expected at most " +
                     std::to_string(kMaxPixels) + " (PIL's limit for decompression bombs)");
}

// ---- orientation: EXIF (TIFF IFD0 tag 0x0112), else XMP's tiff:Orientation ----

// The Orientation of a TIFF structure (after an optional "Exif\0\0"), as
// Pillow's Exif.load reads IFD0; nullopt when absent or unreadable (Pillow
// raises there; kiln decodes the image unrotated).
std::optional<int> exif_orientation(std::string_view d) {
  while (d.substr(0, 6) == std::string_view("Exif\0\0", 6)) d.remove_prefix(6);
  if (d.size() < 8) return std::nullopt;
  bool le;
  if (d.substr(0, 4) == std::string_view("II*\0", 4))
    le = true;
  else if (d.substr(0, 4) == std::string_view("MM\0*", 4))
    le = false;
  else
    return std::nullopt;
  auto u16 = [&](size_t at) -> uint32_t {
    auto a = static_cast<uint8_t>(d[at]), b = static_cast<uint8_t>(d[at + 1]);
    return le ? a | b << 8 : b | a << 8;
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return le ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2);
  };
  const size_t ifd = u32(4);
  if (ifd > d.size() - 2) return std::nullopt;
  const size_t n = u16(ifd);
  for (size_t i = 0; i < n; ++i) {
    const size_t e = ifd + 2 + 12 * i;
    if (e + 12 > d.size()) break;
    if (u16(e) != 0x0112 || u32(e + 4) != 1) continue;
    const uint32_t type = u16(e + 2);
    if (type == 3) return static_cast<int>(u16(e + 8));  // SHORT
    if (type == 4) return static_cast<int>(u32(e + 8));  // LONG
    return std::nullopt;
  }
  return std::nullopt;
}

// Pillow's fallback: re.search(r'tiff:Orientation(="|>)([0-9])', xmp).
std::optional<int> xmp_orientation(std::string_view x) {
  static constexpr std::string_view key = "tiff:Orientation";
  for (size_t at = x.find(key); at != std::string_view::npos; at = x.find(key, at + 1)) {
    size_t v = at + key.size();
    if (x.substr(v, 2) == "=\"")
      v += 2;
    else if (x.substr(v, 1) == ">")
      v += 1;
    else
      continue;
    if (v < x.size() && x[v] >= '0' && x[v] <= '9') return x[v] - '0';
  }
  return std::nullopt;
}

// ---- colour conversions, as Pillow's Convert.c ----

// rgb2l: ITU-R 601-2 luma in 16-bit fixed point.
uint8_t luma(uint32_t r, uint32_t g, uint32_t b) {
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

// Pixels given as RGB become the requested channels (3 as they are; 1: luma).
void put_rgb(Image& img, size_t i, uint8_t r, uint8_t g, uint8_t b) {
  if (img.channels == 3) {
    img.pixels[3 * i] = r, img.pixels[3 * i + 1] = g, img.pixels[3 * i + 2] = b;
  } else {
    img.pixels[i] = luma(r, g, b);
  }
}
// Grey pixels: replicated for RGB, kept for L.
void put_grey(Image& img, size_t i, uint8_t v) {
  if (img.channels == 3)
    img.pixels[3 * i] = img.pixels[3 * i + 1] = img.pixels[3 * i + 2] = v;
  else
    img.pixels[i] = v;
}

// ---- JPEG: libjpeg-turbo with libjpeg's defaults, as Pillow's decoder ----

struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
};

// EXIF (the first APP1 "Exif\0\0") and XMP (APP1 "http://ns.adobe.com/xap/1.0/\0")
// orientation, scanning the markers up to the first scan as Pillow's parser.
int jpeg_orientation(const std::vector<uint8_t>& b) {
  std::optional<int> exif, xmp;
  bool have_exif = false;
  size_t at = 2;
  while (at + 4 <= b.size()) {
    if (b[at] != 0xFF) break;
    const uint8_t marker = b[at + 1];
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {
      at += 2;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) break;  // start of scan, end of image
    const size_t len = static_cast<size_t>(b[at + 2]) << 8 | b[at + 3];
    if (len < 2 || at + 2 + len > b.size()) break;
    std::string_view s(reinterpret_cast<const char*>(&b[at + 4]), len - 2);
    if (marker == 0xE1 && s.substr(0, 6) == std::string_view("Exif\0\0", 6) && !have_exif) {
      have_exif = true;
      exif = exif_orientation(s);
    } else if (marker == 0xE1 &&
               s.substr(0, 29) == std::string_view("http://ns.adobe.com/xap/1.0/\0", 29)) {
      xmp = xmp_orientation(s.substr(29));
    }
    at += 2 + len;
  }
  return exif ? *exif : xmp.value_or(1);
}

Image decode_jpeg(const std::vector<uint8_t>& b, int64_t channels, const std::string& origin,
                  bool header_only) {
  TjHandle tj;
  if (!tj.h) fail(origin, "cannot start the JPEG decoder");
  int w = 0, h = 0, sub = 0, space = 0;
  if (tjDecompressHeader3(tj.h, b.data(), b.size(), &w, &h, &sub, &space) != 0)
    fail(origin, std::string("is not a readable JPEG: ") + tjGetErrorStr2(tj.h));
  check_size(w, h, "JPEG", origin);
  const int orientation = jpeg_orientation(b);
  Image img{w, h, channels, {}};
  if (header_only) {
    if (orientation >= 5) std::swap(img.width, img.height);
    return img;
  }
  const size_t n = static_cast<size_t>(w) * h;
  // libjpeg's warnings stop the decoding (corrupt data would otherwise be
  // decoded to the end, however large the image claims to be), except
  // extraneous bytes before a marker, which Pillow decodes through. A file
  // cut short is an error, as Pillow's "image file is truncated". At most
  // 500 progressive scans (TJFLAG_LIMITSCANS).
  auto decompress = [&](int format, std::vector<uint8_t>& dst) {
    dst.resize(n * tjPixelSize[format]);
    for (int flags : {TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS, TJFLAG_LIMITSCANS}) {
      if (tjDecompress2(tj.h, b.data(), b.size(), dst.data(), w, 0, h, format, flags) == 0) return;
      const std::string why = tjGetErrorStr2(tj.h);
      if (tjGetErrorCode(tj.h) != TJERR_WARNING ||
          why.find("extraneous bytes") == std::string::npos)
        fail(origin, "is a damaged JPEG: " + why);
    }
  };
  if (space == TJCS_CMYK || space == TJCS_YCCK) {
    // Pillow reads CMYK as "CMYK;I" (Adobe's inverted polarity, always), then
    // cmyk2rgb: each channel nk - nk * c / 255 with nk = 255 - k.
    std::vector<uint8_t> cmyk;
    decompress(TJPF_CMYK, cmyk);
    img.pixels.resize(n * channels);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t nk = cmyk[4 * i + 3];  // 255 - (255 - k)
      uint8_t rgb[3];
      for (int c = 0; c < 3; ++c) {
        const uint32_t t = (255 - cmyk[4 * i + c]) * nk + 128;  // MULDIV255
        rgb[c] = static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
      }
      put_rgb(img, i, rgb[0], rgb[1], rgb[2]);
    }
  } else if (space == TJCS_GRAY) {
    std::vector<uint8_t> grey;
    decompress(TJPF_GRAY, grey);
    img.pixels.resize(n * channels);
    for (size_t i = 0; i < n; ++i) put_grey(img, i, grey[i]);
  } else {
    decompress(TJPF_RGB, img.pixels);
    if (channels == 1) {
      for (size_t i = 0; i < n; ++i)
        img.pixels[i] = luma(img.pixels[3 * i], img.pixels[3 * i + 1], img.pixels[3 * i + 2]);
      img.pixels.resize(n);
    }
  }
  return pillow::transpose(std::move(img), orientation);
}

// ---- PNG: libpng's progressive-free low-level reader, samples as stored ----

struct PngReader {
  const std::vector<uint8_t>* bytes = nullptr;
  size_t at = 0;
  char message[200] = {};
};

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->bytes->size() - r->at) png_error(png, "the file ends early");
  std::memcpy(out, r->bytes->data() + r->at, n);
  r->at += n;
}
[[noreturn]] void png_fail(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", msg);
  png_longjmp(png, 1);
}
void png_warn(png_structp, png_const_charp) {}

struct PngHandles {
  png_structp png = nullptr;
  png_infop info = nullptr, end = nullptr;
  ~PngHandles() { png_destroy_read_struct(&png, &info, &end); }
};

// The orientation Pillow's getexif finds in a PNG: an eXIf chunk, else a
// "Raw profile type exif" text (hex); XMP ("XML:com.adobe.xmp") when neither
// has one.
int png_orientation(png_structp png, png_infop info, png_infop end) {
  std::optional<int> exif, xmp;
  for (png_infop i : {info, end}) {
    png_uint_32 n = 0;
    png_bytep data = nullptr;
    if (!exif && png_get_eXIf_1(png, i, &n, &data) && data)
      exif = exif_orientation(std::string_view(reinterpret_cast<const char*>(data), n));
    png_textp text = nullptr;
    int count = 0;
    png_get_text(png, i, &text, &count);
    for (int t = 0; t < count; ++t) {
      std::string_view key(text[t].key),
          value(text[t].text, text[t].itxt_length ? text[t].itxt_length : text[t].text_length);
      if (key == "XML:com.adobe.xmp" && !xmp) xmp = xmp_orientation(value);
      if (key == "Raw profile type exif" && !exif) {
        // "\nexif\n    <length>\n<hex lines>": what follows the third '\n'.
        size_t skip = 0;
        int lines = 0;
        while (lines < 3 && (skip = value.find('\n', skip)) != std::string_view::npos)
          ++lines, ++skip;
        if (lines < 3) continue;
        std::string raw;
        int hi = -1;
        for (char c : value.substr(skip)) {
          int v = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
          if (v < 0) continue;
          if (hi < 0)
            hi = v;
          else
            raw.push_back(static_cast<char>(hi << 4 | v)), hi = -1;
        }
        exif = exif_orientation(raw);
      }
    }
  }
  return exif ? *exif : xmp.value_or(1);
}

// png_read_end, whose errors (a file cut after the image data, no IEND) leave
// the image as read: Pillow stops reading there too.
bool read_end(png_structp png, png_infop end) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_end(png, end);
  return true;
}

Image decode_png(const std::vector<uint8_t>& b, int64_t channels, const std::string& origin,
                 bool header_only) {
  PngReader reader{&b};
  PngHandles p;
  p.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, png_fail, png_warn);
  if (!p.png || !(p.info = png_create_info_struct(p.png)) ||
      !(p.end = png_create_info_struct(p.png)))
    fail(origin, "cannot start the PNG decoder");
  png_set_read_fn(p.png, &reader, png_read_bytes);
  png_set_user_limits(p.png, 1u << 30, 1u << 30);
  Image img;
  std::vector<uint8_t> rows;
  std::vector<png_bytep> row_pointers;
  if (setjmp(png_jmpbuf(p.png))) {
    fail(origin, std::string(img.width ? "is a damaged PNG: " : "is not a readable PNG: ") +
                     reader.message);
  }
  png_read_info(p.png, p.info);
  const int64_t w = png_get_image_width(p.png, p.info), h = png_get_image_height(p.png, p.info);
  const int bits = png_get_bit_depth(p.png, p.info), type = png_get_color_type(p.png, p.info);
  check_size(w, h, "PNG", origin);
  img = Image{w, h, channels, {}};
  if (header_only) {
    // The orientation of chunks before the image data (those after it would
    // need the whole file decoded): the size a probe reports.
    if (png_orientation(p.png, p.info, p.end) >= 5) std::swap(img.width, img.height);
    return img;
  }
  if (bits < 8) png_set_packing(p.png);  // a byte per sample, values as stored
  png_set_interlace_handling(p.png);
  png_read_update_info(p.png, p.info);
  const size_t stride = png_get_rowbytes(p.png, p.info);
  rows.resize(stride * h);
  row_pointers.resize(h);
  for (int64_t y = 0; y < h; ++y) row_pointers[y] = rows.data() + y * stride;
  png_read_image(p.png, row_pointers.data());
  read_end(p.png, p.end);  // the chunks after the image: an eXIf there counts
  if (setjmp(png_jmpbuf(p.png)))  // read_end's jump buffer is gone: this frame's again
    fail(origin, std::string("is a damaged PNG: ") + reader.message);

  png_colorp palette = nullptr;
  int palette_size = 0;
  if (type == PNG_COLOR_TYPE_PALETTE) png_get_PLTE(p.png, p.info, &palette, &palette_size);
  const int samples = png_get_channels(p.png, p.info);
  const int step = bits == 16 ? 2 : 1;  // bytes per sample; 16-bit samples are big-endian
  img.pixels.resize(static_cast<size_t>(w) * h * channels);
  for (int64_t y = 0; y < h; ++y) {
    const uint8_t* row = row_pointers[y];
    for (int64_t x = 0; x < w; ++x) {
      const uint8_t* s = row + x * samples * step;  // the high byte of each sample
      const size_t i = static_cast<size_t>(y * w + x);
      switch (type) {
        case PNG_COLOR_TYPE_GRAY:
          if (bits == 16)  // Pillow's "I;16" -> RGB/L clips at 255
            put_grey(img, i, s[0] ? 255 : s[1]);
          else  // "1", "L;2", "L;4": the value scaled to 0-255
            put_grey(img, i,
                     static_cast<uint8_t>(s[0] * (bits == 1   ? 255
                                                  : bits == 2 ? 85
                                                  : bits == 4 ? 17
                                                              : 1)));
          break;
        case PNG_COLOR_TYPE_GRAY_ALPHA: put_grey(img, i, s[0]); break;
        case PNG_COLOR_TYPE_RGB:
        case PNG_COLOR_TYPE_RGB_ALPHA: put_rgb(img, i, s[0], s[step], s[2 * step]); break;
        case PNG_COLOR_TYPE_PALETTE:
          if (s[0] < palette_size)
            put_rgb(img, i, palette[s[0]].red, palette[s[0]].green, palette[s[0]].blue);
          else  // an index past the palette reads black, as in Pillow
            put_rgb(img, i, 0, 0, 0);
          break;
        default:
          fail(origin, "has PNG colour type " + std::to_string(type) + ", which is not valid");
      }
    }
  }
  return pillow::transpose(std::move(img), png_orientation(p.png, p.info, p.end));
}

Image decode(const std::vector<uint8_t>& b, int64_t channels, const std::string& origin,
             bool header_only) {
  if (channels != 1 && channels != 3)
    fail(origin, "images are decoded to 1 or 3 channels, not " + std::to_string(channels));
  if (is_jpeg(b)) return decode_jpeg(b, channels, origin, header_only);
  if (is_png(b)) return decode_png(b, channels, origin, header_only);
  fail(origin, "is neither a JPEG nor a PNG file (" + std::to_string(b.size()) + " bytes)");
}

}  // namespace

Image decode_image(const std::vector<uint8_t>& bytes, int64_t channels, const std::string& origin) {
  return decode(bytes, channels, origin, false);
}

Image probe_image(const std::vector<uint8_t>& bytes, const std::string& origin) {
  return decode(bytes, 3, origin, true);
}

bool is_image_file_name(const std::string& path) {
  std::string e = std::filesystem::path(path).extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  if (f.bad()) fail(path, std::string("cannot read: ") + std::strerror(errno));
  return bytes;
}

// The image as ImageOps.exif_transpose leaves it: orientation 2-8 flips
// and/or rotates (Pillow's Transpose methods); anything else changes nothing.
Image pillow::transpose(Image in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int64_t W = in.width, H = in.height, C = in.channels;
  const bool swap = orientation >= 5;
  Image out{swap ? H : W, swap ? W : H, C, std::vector<uint8_t>(in.pixels.size())};
  for (int64_t y = 0; y < out.height; ++y)
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = x, sy = y;  // the source pixel (column, row)
      switch (orientation) {
        case 2: sx = W - 1 - x; break;                  // FLIP_LEFT_RIGHT
        case 3: sx = W - 1 - x, sy = H - 1 - y; break;  // ROTATE_180
        case 4: sy = H - 1 - y; break;                  // FLIP_TOP_BOTTOM
        case 5: sx = y, sy = x; break;                  // TRANSPOSE
        case 6: sx = y, sy = H - 1 - x; break;          // ROTATE_270 (a quarter clockwise)
        case 7: sx = W - 1 - y, sy = H - 1 - x; break;  // TRANSVERSE
        case 8: sx = W - 1 - y, sy = x; break;          // ROTATE_90
      }
      std::memcpy(&out.pixels[(y * out.width + x) * C], &in.pixels[(sy * W + sx) * C], C);
    }
  return out;
}

}  // namespace kiln::data
