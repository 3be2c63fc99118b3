// kiln — element types.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace kiln {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, bool_ };

size_t size_of(DType dt);
const char* name_of(DType dt);
bool is_floating(DType dt);
bool is_integral(DType dt);  // i32, i64 (bool is neither)
// The type two operands are computed in: the wider float, else the wider int.
DType promote(DType a, DType b);

// bfloat16 storage: the top 16 bits of an IEEE f32, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// IEEE binary16 storage, for reading and writing f16 weights (no op computes
// in f16): float -> f16 rounds to nearest even, overflows to infinity, keeps
// subnormals; f16 -> float is exact.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }
  static float to_float(uint16_t h);
  static uint16_t from_float(float f);
};

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::bool_;
};

}  // namespace kiln
