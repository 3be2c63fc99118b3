// kiln compiler: attention fusion — softmax attention written out by hand
// (and the backward autodiff made of it) becomes the fused Attention and
// AttentionGrad kernels, which never store the scores. Four rules, one per
// value the graph reads (o, dV, dQ, dK); their replacements share one packed
// qkv and one AttentionGrad (Build makes an op once per sweep).
#include "compiler/fusion.h"
#include "compiler/passes.h"
#include "compiler/rules.h"

namespace kiln::compiler {
namespace {

constexpr DType kF32 = DType::f32;

Pattern f32_op(Op o, std::vector<Pattern> operands) {
  return op(o, std::move(operands)).where(is_f32);
}

// a·b with a and/or b transposed as given.
Pattern matmul(bool ta, bool tb, Pattern a, Pattern b) {
  return f32_op(Op::Matmul, {std::move(a), std::move(b)}).where([=](const Node& n) {
    const auto& m = n.prim->attrs<MatmulAttrs>();
    return m.transpose_a == ta && m.transpose_b == tb;
  });
}

// x · c (either order) or x / c for an f32 scalar c, or x itself: bound to
// `name` (x keeps its own name).
Pattern scaled(const Pattern& x, const std::string& name) {
  const Pattern c = any("c").where([](const Node& n) { return numel(n.shape) == 1 && is_f32(n); });
  return either({f32_op(Op::Mul, {x, c}).commuted(), f32_op(Op::Div, {x, c}), x}).named(name);
}

// The probabilities: p = Softmax(s, last axis), s = s0 ∘ c, s0 = q kᵀ.
Pattern probabilities() {
  const Pattern s0 = matmul(false, true, any("q"), any("k")).named("s0");
  return f32_op(Op::Softmax, {scaled(s0, "s")})
      .where([](const Node& n) { return n.prim->attrs<AxisAttrs>().axis == 3; })
      .named("p");
}

// The softmax VJP as autodiff writes it, scaled as the forward was:
// dS0 = (P ⊙ (dP - rowsum(dP ⊙ P))) ∘ c with dP = G vᵀ.
Pattern score_gradient() {
  const Pattern dp = matmul(false, true, any("g"), any("v")).named("dp");
  const Pattern t1 = f32_op(Op::Mul, {dp, any("p")}).commuted().named("t1");
  const Pattern t2 = f32_op(Op::Sum, {t1})
                         .where([](const Node& n) {
                           return n.prim->attrs<ReduceAttrs>() == ReduceAttrs{{3}, true};
                         })
                         .named("t2");
  const Pattern t3 = f32_op(Op::Sub, {dp, t2}).named("t3");
  const Pattern ds1 = f32_op(Op::Mul, {probabilities(), t3}).commuted().named("ds1");
  return scaled(ds1, "ds0");
}

// The scale op (Mul or Div) of s = s0 ∘ c, or Count: none.
Op scale_of(const Match& m, const std::string& scaled_value, const std::string& unscaled) {
  return m[scaled_value] == m[unscaled] ? Op::Count : m.node(scaled_value).prim->op();
}

// q, k and v [B, H, T, D] of one shape, f32; the scores' shape kept by the
// scale; the backward (where matched) scaled as the forward is.
bool attention_holds(const Match& m) {
  const Shape& qs = m.node("q").shape;
  bool ok = qs.size() == 4 && m.node("k").shape == qs && m.node("s").shape == m.node("s0").shape;
  for (const char* x : {"q", "k"}) ok &= is_f32(m.node(x));
  if (m.bound("v")) ok &= m.node("v").shape == qs && is_f32(m.node("v"));
  if (m.bound("ds0"))
    ok &= m.node("ds0").shape == m.node("s0").shape &&
          scale_of(m, "s", "s0") == scale_of(m, "ds0", "ds1");
  return ok;
}

// The fused kernels' operands and results, built over the new graph.
class Fused {
 public:
  explicit Fused(Build& b) : b_(b) {
    bhtd_ = b.m.node("q").shape;
    bthd_ = Shape{bhtd_[0], bhtd_[2], bhtd_[1], bhtd_[3]};
    bt1hd_ = Shape{bthd_[0], bthd_[1], 1, bthd_[2], bthd_[3]};
    bt3hd_ = Shape{bthd_[0], bthd_[1], 3, bthd_[2], bthd_[3]};
    scale_ = scale_of(b.m, "s", "s0");
  }

  // Attention's value [B, H, T, D].
  int forward() {
    return swap_heads(b_.add(Primitive(Op::Attention, AttentionAttrs{1.0}), {qkv()}, bthd_, kF32),
                      bhtd_);
  }

  // The gradient of q (0), k (1) or v (2), [B, H, T, D]; q's is d(q ∘ c) ∘ c.
  int gradient(int j) {
    const int all = b_.add(Primitive(Op::AttentionGrad, AttentionAttrs{1.0}),
                           {qkv(), swap_heads(b_("g"), bthd_)}, bt3hd_, kF32);
    int d = -1;
    for (int part = 0; part < 3; ++part) {  // all three where the first is made
      Shape start{0, 0, part, 0, 0}, stop = bt3hd_;
      stop[2] = part + 1;
      int x = b_.add(Primitive(Op::Slice, SliceAttrs{start, stop, Shape(5, 1), bt3hd_}), {all},
                     bt1hd_, kF32);
      x = b_.add(Primitive(Op::Reshape, ShapeAttrs{bthd_}), {x}, bthd_, kF32);
      if (part == j) d = x;
    }
    if (j == 0 && scale_ != Op::Count) d = b_.add(Primitive(scale_), {d, b_("c")}, bthd_, kF32);
    return swap_heads(d, bhtd_);
  }

 private:
  Build& b_;
  Shape bhtd_, bthd_, bt1hd_, bt3hd_;  // [B, T, 1, H, D]: one of q, k, v packed
  Op scale_;

  // The packed [B, T, 3, H, D] of q ∘ c, k and v: (q kᵀ) ∘ c = (q ∘ c) kᵀ
  // for ∘ = · or /, so that the kernel needs no constant the graph does not
  // know.
  int qkv() {
    int qc = swap_heads(b_("q"), bthd_);
    if (scale_ != Op::Count) qc = b_.add(Primitive(scale_), {qc, b_("c")}, bthd_, kF32);
    std::vector<int> parts;
    for (int x : {qc, swap_heads(b_("k"), bthd_), swap_heads(b_("v"), bthd_)})
      parts.push_back(b_.add(Primitive(Op::Reshape, ShapeAttrs{bt1hd_}), {x}, bt1hd_, kF32));
    return b_.add(Primitive(Op::Concatenate, AxisAttrs{2}), parts, bt3hd_, kF32);
  }

  // [B, H, T, D] <-> [B, T, H, D] (new ids).
  int swap_heads(int x, const Shape& to) {
    return b_.add(Primitive(Op::Transpose, PermAttrs{{0, 2, 1, 3}}), {x}, to, kF32);
  }
};

std::vector<Rule> attention_rules() {
  const Pattern p = probabilities();
  const Pattern ds0 = score_gradient();
  // The scores and probabilities die: the probabilities may be read only by
  // the forward's PV and by the backward that the other rules replace.
  const std::vector<std::string> forward_dies{"s0", "s", "p"};
  const std::vector<std::string> backward_dies{"dp", "t1", "t2", "t3", "ds1", "ds0"};
  return {
      {"attention", matmul(false, false, p, any("v")), attention_holds, forward_dies,
       [](Build& b) { return Fused(b).forward(); }},
      // dV = Pᵀ G, where G also makes the softmax VJP's dP = G vᵀ, which is
      // read with P (so that the backward is there).
      {"attention dV",
       matmul(true, false,
              p.read_by(
                  f32_op(Op::Mul, {matmul(false, true, any("g"), any("v")), any("p")}).commuted()),
              any("g")),
       attention_holds,
       {},
       [](Build& b) { return Fused(b).gradient(2); }},
      {"attention dQ", matmul(false, false, ds0, any("k")), attention_holds, backward_dies,
       [](Build& b) { return Fused(b).gradient(0); }},
      {"attention dK", matmul(true, false, ds0, any("q")), attention_holds, backward_dies,
       [](Build& b) { return Fused(b).gradient(1); }},
  };
}

}  // namespace

Graph fuse_attention(const Graph& g) {
  static const std::vector<Rule> rules = attention_rules();
  return apply_rules(g, rules, "fuse_attention");
}

}  // namespace kiln::compiler
