// kiln core: errors, dtypes, shapes, devices.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/shape.h"

namespace kiln {

void fail(const std::string& origin, const std::string& message) {
  throw Error("[" + origin + "] " + message);
}

size_t size_of(DType dt) {
  switch (dt) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bool_: return 1;
  }
  return 0;
}

const char* name_of(DType dt) {
  switch (dt) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::bool_: return "bool";
  }
  return "?";
}

float f16::to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // infinity, NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
  } else {
    float f = static_cast<float>(man) * 0x1p-24f;  // zero, subnormal: man * 2^-24, exact
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f16::from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;                // NaN: a quiet one
  if (a >= 0x477ff000u) return sign | 0x7c00u;               // from 65520 up: rounds to infinity
  if (a >= 0x38800000u) {                                    // a normal f16 (from 2^-14 up)
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);  // nearest even at bit 13
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // Subnormal (or zero): a multiple of 2^-24, rounded to nearest even (the
  // scaling is exact; 1024 is the smallest normal, 0x0400).
  float mag;
  std::memcpy(&mag, &a, 4);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(mag * 0x1p24f)));
}

bool is_floating(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16;
}
bool is_integral(DType dt) {
  return dt == DType::i32 || dt == DType::i64;
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType d) {
    switch (d) {
      case DType::bool_: return 0;
      case DType::i32: return 1;
      case DType::i64: return 2;
      case DType::bf16: return 3;
      case DType::f16: return 3;
      case DType::f32: return 4;
      case DType::f64: return 5;
    }
    return 0;
  };
  if ((a == DType::bf16 && b == DType::f16) || (a == DType::f16 && b == DType::bf16))
    return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::ref: return "ref";
    case DeviceType::cuda: break;
  }
  return "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text, const std::string& what) {
  if (text == "cpu") return Device::cpu();
  if (text == "ref") return Device::ref();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return Device::cuda(std::stoi(text.substr(5)));
  fail(what, "unknown device '" + text + "' (expected cpu, ref, cuda or cuda:N)");
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ")";
  return os.str();
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) fail(op, "cannot broadcast " + str(a) + " and " + str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int normalize_axis(int64_t axis, size_t rank, const char* op) {
  int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r)
    fail(op, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

}  // namespace kiln
