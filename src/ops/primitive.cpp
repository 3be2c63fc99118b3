// kiln ops: primitive traits, hashing and printing.
#include <iterator>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "ops/primitive.h"

namespace kiln {
namespace {

struct OpInfo {
  const char* name;
  OpKind kind;
};

constexpr OpInfo kOpInfo[] = {
#define KILN_INFO(name, kind) {#name, OpKind::kind},
    KILN_OPS(KILN_INFO)
#undef KILN_INFO
};
static_assert(sizeof(kOpInfo) / sizeof(kOpInfo[0]) == kOpCount);

size_t mix(size_t h, size_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}

// h mixed with every value in v: an attribute type's fields, a list's length
// and elements, a scalar. Generic over KILN_FIELDS, so no member is missed.
template <typename T>
size_t hash_value(size_t h, const T& v) {
  if constexpr (requires { v.fields(); }) {
    std::apply([&](const auto&... f) { ((h = hash_value(h, f)), ...); }, v.fields());
  } else if constexpr (std::is_same_v<T, Device>) {
    h = mix(mix(h, static_cast<size_t>(v.type)), static_cast<size_t>(v.index));
  } else if constexpr (std::is_enum_v<T> || std::is_integral_v<T>) {
    h = mix(h, static_cast<size_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    h = mix(h, std::hash<T>{}(v));
  } else if constexpr (requires {
                         std::size(v);
                         std::begin(v);
                       }) {
    h = mix(h, std::size(v));
    for (const auto& x : v) h = hash_value(h, x);
  } else {
    static_assert(sizeof(T) == 0, "hash_value: a field of a type with no hash");
  }
  return h;
}

// A value as attributes print it: lists as (a,b), dtypes, devices, ops and
// reads by name, a fused program as its instructions, other attribute types
// as {name=value,...}.
template <typename T>
void print_value(std::ostream& os, const T& v);

// "name=value,name=value" over a KILN_FIELDS type's members.
template <typename T>
void print_fields(std::ostream& os, const T& v) {
  const std::string names = T::field_names;
  size_t at = 0, i = 0;
  auto one = [&](const auto& x) {
    const size_t comma = names.find(',', at);
    os << (i++ ? "," : "") << names.substr(at, comma == std::string::npos ? comma : comma - at)
       << "=";
    at = comma == std::string::npos ? names.size() : comma + 2;  // past ", "
    print_value(os, x);
  };
  std::apply([&](const auto&... f) { (one(f), ...); }, v.fields());
}

// "[whole,row] r2=Mul(r0,r1); r3=Exp(r2)": registers 0..reads-1 are the
// inputs, read as listed.
void print_program(std::ostream& os, const FusedAttrs& f) {
  print_value(os, f.reads);
  for (size_t i = 0; i < f.program.size(); ++i) {
    const auto& in = f.program[i];
    os << (i ? "; " : " ") << "r" << f.reads.size() + i << "=" << op_name(in.op) << "(r" << in.a;
    if (in.b >= 0) os << ",r" << in.b;
    os << ")" << (in.round_bf16 ? ":bf16" : "");
  }
}

template <typename T>
void print_value(std::ostream& os, const T& v) {
  if constexpr (std::is_same_v<T, FusedAttrs>) {
    print_program(os, v);
  } else if constexpr (requires { v.fields(); }) {
    os << "{";
    print_fields(os, v);
    os << "}";
  } else if constexpr (std::is_same_v<T, DType>) {
    os << name_of(v);
  } else if constexpr (std::is_same_v<T, Op>) {
    os << op_name(v);
  } else if constexpr (std::is_same_v<T, FusedRead>) {
    static const char* reads[] = {"whole", "scalar", "row"};
    os << reads[static_cast<int>(v)];
  } else if constexpr (std::is_same_v<T, Device>) {
    os << v.str();
  } else if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "1" : "0");
  } else if constexpr (std::is_enum_v<T>) {
    os << static_cast<int>(v);
  } else if constexpr (std::is_arithmetic_v<T>) {
    os << v;
  } else if constexpr (requires {
                         std::size(v);
                         std::begin(v);
                       }) {
    os << "(";
    size_t i = 0;
    for (const auto& x : v) {
      os << (i++ ? "," : "");
      print_value(os, x);
    }
    os << ")";
  } else {
    static_assert(sizeof(T) == 0, "print_value: a field of a type with no printing");
  }
}

}  // namespace

const char* op_name(Op op) {
  return kOpInfo[static_cast<int>(op)].name;
}
size_t Primitive::hash() const {
  size_t h = mix(mix(0, static_cast<size_t>(op_)), attrs_.index());
  std::visit([&](const auto& a) { h = hash_value(h, a); }, attrs_);
  return h;
}

std::string Primitive::str() const {
  std::ostringstream os;
  os << name();
  std::visit(
      [&](const auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, FusedAttrs>) {
          os << "{";
          print_program(os, a);
          os << "}";
        } else if constexpr (std::tuple_size_v<decltype(a.fields())> > 0) {
          os << "{";
          print_fields(os, a);
          os << "}";
        }
      },
      attrs_);
  return os.str();
}

}  // namespace kiln
