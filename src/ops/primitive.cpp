// kiln ops: primitive traits, hashing and printing.
#include <sstream>

#include "kiln/primitive.h"

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
size_t mix_shape(size_t h, const Shape& s) {
  h = mix(h, s.size());
  for (auto d : s) h = mix(h, static_cast<size_t>(d));
  return h;
}

void print_list(std::ostream& os, const char* key, const auto& v) {
  os << key << "=(";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << ")";
}

// "r2=Mul(r0,r1); r3=Exp(r2)": registers 0..reads-1 are the inputs.
void print_program(std::ostream& os, const FusedAttrs& f) {
  for (size_t i = 0; i < f.program.size(); ++i) {
    const auto& in = f.program[i];
    os << (i ? "; " : "") << "r" << f.reads.size() + i << "=" << op_name(in.op) << "(r" << in.a;
    if (in.b >= 0) os << ",r" << in.b;
    os << ")";
  }
}

}  // namespace

const char* op_name(Op op) {
  return kOpInfo[static_cast<int>(op)].name;
}
size_t Primitive::hash() const {
  size_t h = mix(0, static_cast<size_t>(op_));
  h = mix(h, attrs_.index());
  std::visit(
      [&](const auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, CastAttrs>) {
          h = mix(h, static_cast<size_t>(a.to));
        } else if constexpr (std::is_same_v<A, ReduceAttrs>) {
          for (int x : a.axes) h = mix(h, x);
          h = mix(h, a.keepdims);
        } else if constexpr (std::is_same_v<A, MatmulAttrs>) {
          h = mix(mix(mix(h, a.transpose_a), a.transpose_b), static_cast<size_t>(a.out));
          h = mix(h, a.tf32);
        } else if constexpr (std::is_same_v<A, ShapeAttrs>) {
          h = mix_shape(h, a.shape);
        } else if constexpr (std::is_same_v<A, PermAttrs>) {
          for (int x : a.perm) h = mix(h, x);
        } else if constexpr (std::is_same_v<A, AxisAttrs>) {
          h = mix(h, a.axis);
        } else if constexpr (std::is_same_v<A, SliceAttrs>) {
          h = mix_shape(mix_shape(mix_shape(mix_shape(h, a.start), a.stop), a.step), a.full);
        } else if constexpr (std::is_same_v<A, ScatterAttrs>) {
          h = mix_shape(mix(h, a.axis), a.shape);
        } else if constexpr (std::is_same_v<A, OneHotAttrs>) {
          h = mix(mix(h, a.depth), static_cast<size_t>(a.dtype));
        } else if constexpr (std::is_same_v<A, NormAttrs>) {
          h = mix(mix(h, std::hash<double>{}(a.eps)), a.residual);
        } else if constexpr (std::is_same_v<A, AttentionAttrs>) {
          h = mix(h, std::hash<double>{}(a.scale));
        } else if constexpr (std::is_same_v<A, FusedAttrs>) {
          for (auto r : a.reads) h = mix(h, static_cast<size_t>(r));
          for (auto& in : a.program)
            h = mix(mix(mix(h, static_cast<size_t>(in.op)), in.a), static_cast<size_t>(in.b + 1));
        } else if constexpr (std::is_same_v<A, FusedReduceAttrs>) {
          for (auto r : a.body.reads) h = mix(h, static_cast<size_t>(r));
          for (auto& in : a.body.program)
            h = mix(mix(mix(h, static_cast<size_t>(in.op)), in.a), static_cast<size_t>(in.b + 1));
          h = mix_shape(h, a.shape);
          for (int x : a.reduce.axes) h = mix(h, x);
          h = mix(h, a.reduce.keepdims);
          for (auto r : a.epilogue.reads) h = mix(h, static_cast<size_t>(r));
          for (auto& in : a.epilogue.program)
            h = mix(mix(mix(h, static_cast<size_t>(in.op)), in.a), static_cast<size_t>(in.b + 1));
          h = mix(h, static_cast<size_t>(a.epilogue_sum + 1));
        } else if constexpr (std::is_same_v<A, EpilogueAttrs>) {
          h = mix(mix(mix(h, a.mm.transpose_a), a.mm.transpose_b), static_cast<size_t>(a.mm.out));
          h = mix(h, a.mm.tf32);
          for (auto& st : a.steps)
            h = mix(mix(mix(h, static_cast<size_t>(st.op)), static_cast<size_t>(st.operand + 1)),
                    static_cast<size_t>(st.read));
        } else if constexpr (std::is_same_v<A, DeviceAttrs>) {
          h = mix(mix(h, static_cast<size_t>(a.to.type)), static_cast<size_t>(a.to.index));
        } else if constexpr (std::is_same_v<A, FillAttrs>) {
          h = mix(mix(h, std::hash<double>{}(a.start)), std::hash<double>{}(a.step));
        } else if constexpr (std::is_same_v<A, CollectiveAttrs>) {
          h = mix(mix(mix(h, static_cast<size_t>(a.bucket)), static_cast<size_t>(a.offset)),
                  a.mean);
        } else if constexpr (std::is_same_v<A, RandomAttrs>) {
          h = mix(mix(mix(h, a.key[0]), a.key[1]), static_cast<size_t>(a.kind));
          h = mix(mix(h, std::hash<double>{}(a.a)), std::hash<double>{}(a.b));
          h = mix(mix_shape(h, a.shape), static_cast<size_t>(a.dtype));
          h = mix(mix(h, a.fold), a.fold_data);
        }
      },
      attrs_);
  return h;
}

std::string Primitive::str() const {
  std::ostringstream os;
  os << name();
  std::visit(
      [&](const auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, NoAttrs>) return;
        os << "{";
        if constexpr (std::is_same_v<A, CastAttrs>) {
          os << "to=" << name_of(a.to);
        } else if constexpr (std::is_same_v<A, ReduceAttrs>) {
          print_list(os, "axes", a.axes);
          os << ",keepdims=" << a.keepdims;
        } else if constexpr (std::is_same_v<A, MatmulAttrs>) {
          os << "ta=" << a.transpose_a << ",tb=" << a.transpose_b << ",out=" << name_of(a.out);
          if (a.tf32) os << ",tf32";
        } else if constexpr (std::is_same_v<A, ShapeAttrs>) {
          os << "shape=" << kiln::str(a.shape);
        } else if constexpr (std::is_same_v<A, PermAttrs>) {
          print_list(os, "perm", a.perm);
        } else if constexpr (std::is_same_v<A, AxisAttrs>) {
          os << "axis=" << a.axis;
        } else if constexpr (std::is_same_v<A, SliceAttrs>) {
          print_list(os, "start", a.start);
          print_list(os, ",stop", a.stop);
          print_list(os, ",step", a.step);
        } else if constexpr (std::is_same_v<A, ScatterAttrs>) {
          os << "axis=" << a.axis << ",shape=" << kiln::str(a.shape);
        } else if constexpr (std::is_same_v<A, OneHotAttrs>) {
          os << "depth=" << a.depth << ",dtype=" << name_of(a.dtype);
        } else if constexpr (std::is_same_v<A, NormAttrs>) {
          os << "eps=" << a.eps;
          if (a.residual) os << ",residual";
        } else if constexpr (std::is_same_v<A, DeviceAttrs>) {
          os << "to=" << a.to.str();
        } else if constexpr (std::is_same_v<A, FillAttrs>) {
          os << "start=" << a.start << ",step=" << a.step;
        } else if constexpr (std::is_same_v<A, CollectiveAttrs>) {
          os << "bucket=" << a.bucket << ",offset=" << a.offset << (a.mean ? ",mean" : "");
        } else if constexpr (std::is_same_v<A, AttentionAttrs>) {
          os << "scale=" << a.scale;
        } else if constexpr (std::is_same_v<A, FusedAttrs>) {
          print_program(os, a);
        } else if constexpr (std::is_same_v<A, FusedReduceAttrs>) {
          print_list(os, "sum axes", a.reduce.axes);
          os << " of ";
          if (a.body.program.empty()) os << "r0";
          print_program(os, a.body);
          if (!a.epilogue.program.empty()) {
            os << " then r" << a.epilogue_sum << "=sum: ";
            print_program(os, a.epilogue);
          }
        } else if constexpr (std::is_same_v<A, EpilogueAttrs>) {
          os << "ta=" << a.mm.transpose_a << ",tb=" << a.mm.transpose_b;
          if (a.mm.tf32) os << ",tf32";
          static const char* reads[] = {"whole", "scalar", "row"};
          for (auto& st : a.steps) {
            os << "; " << op_name(st.op);
            if (st.operand >= 0)
              os << "(in" << 2 + st.operand << " " << reads[static_cast<int>(st.read)] << ")";
          }
        } else if constexpr (std::is_same_v<A, RandomAttrs>) {
          os << "kind=" << static_cast<int>(a.kind) << ",shape=" << kiln::str(a.shape);
        }
        os << "}";
      },
      attrs_);
  return os.str();
}

}  // namespace kiln
