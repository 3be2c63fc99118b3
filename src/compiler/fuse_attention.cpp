// kiln compiler: attention fusion — softmax attention written out by hand
// (and the backward autodiff made of it) becomes the fused Attention and
// AttentionGrad kernels, which never store the scores.
#include <algorithm>
#include <array>
#include <optional>

#include "compiler/passes.h"
#include "compiler/rewrite.h"

namespace kiln::compiler {
namespace {

// One hand-written attention found by fuse_attention (old node ids; -1 where
// the graph has no such node).
struct AttentionMatch {
  Op scale = Op::Count;  // Mul or Div by the scalar c, or Count: none (s = s0)
  int q = -1, k = -1, v = -1, c = -1, s0 = -1, s = -1, p = -1, o = -1;  // forward
  int g = -1, dp = -1, dv = -1, t1 = -1, t2 = -1, t3 = -1, ds1 = -1, ds0 = -1, dq = -1, dk = -1;
  bool backward() const { return dv >= 0; }
};

// Questions about the graph's ops that the matcher asks.
class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g), uses_(g) {}

  // The forward attention whose output is op o, with its backward where the
  // graph holds it; nothing when o is not one, or when an intermediate is
  // read by anything else.
  std::optional<AttentionMatch> match(int o) const {
    AttentionMatch m;
    if (!match_forward(o, m)) return std::nullopt;
    // The backward, as autodiff writes it: every other reader of the
    // probabilities must be one of its three ops.
    for (int u : uses_.users[m.p]) {
      if (u == o) continue;
      int x = op_is(u, Op::Mul) ? other(u, m.p) : -1;
      if (mm(u, true, false) && in(u, 0) == m.p && m.dv < 0) {
        m.dv = u, m.g = in(u, 1);  // dV = Pᵀ G
      } else if (x >= 0 && op_is(x, Op::Sub) && m.ds1 < 0) {
        m.ds1 = u, m.t3 = x;  // P ⊙ (dP - rowsum)
      } else if (x >= 0 && mm(x, false, true) && m.t1 < 0) {
        m.t1 = u, m.dp = x;  // dP ⊙ P
      } else {
        return std::nullopt;
      }
    }
    if ((m.dv >= 0 || m.t1 >= 0 || m.ds1 >= 0) && !match_backward(m)) return std::nullopt;
    return m;
  }

 private:
  const Graph& g_;
  const Uses uses_;

  bool op_is(int i, Op op) const {
    return i >= 0 && !g_.nodes[i].is_input() && g_.nodes[i].prim->op() == op &&
           g_.nodes[i].dtype == DType::f32;
  }
  bool mm(int i, bool ta, bool tb) const {
    if (!op_is(i, Op::Matmul)) return false;
    const auto& m = g_.nodes[i].prim->attrs<MatmulAttrs>();
    return m.transpose_a == ta && m.transpose_b == tb;
  }
  int in(int i, size_t j) const { return g_.nodes[i].inputs[j]; }
  // The other operand of binary op i, one of whose operands is x.
  int other(int i, int x) const {
    const auto& ins = g_.nodes[i].inputs;
    if (ins.size() != 2) return -1;
    return ins[0] == x ? ins[1] : ins[1] == x ? ins[0] : -1;
  }
  // i is read only by the ops in `allowed` (and is not an output).
  bool read_only_by(int i, std::initializer_list<int> allowed) const {
    if (uses_.is_output[i]) return false;
    for (int u : uses_.users[i])
      if (std::find(allowed.begin(), allowed.end(), u) == allowed.end()) return false;
    return true;
  }
  bool scalar(int x) const {
    return numel(g_.nodes[x].shape) == 1 && g_.nodes[x].dtype == DType::f32;
  }

  // o = Softmax(q kᵀ ∘ c) v, with ∘ · or / by a scalar c, or no scale.
  bool match_forward(int o, AttentionMatch& m) const {
    if (!mm(o, false, false) || g_.nodes[o].shape.size() != 4) return false;
    m.o = o, m.p = in(o, 0), m.v = in(o, 1);
    if (!op_is(m.p, Op::Softmax) || g_.nodes[m.p].prim->attrs<AxisAttrs>().axis != 3)
      return false;
    m.s = in(m.p, 0);
    if (op_is(m.s, Op::Mul)) {
      m.scale = Op::Mul;
      for (int side = 0; side < 2; ++side)
        if (m.c < 0 && scalar(in(m.s, side))) m.c = in(m.s, side), m.s0 = in(m.s, 1 - side);
    } else if (op_is(m.s, Op::Div) && scalar(in(m.s, 1))) {
      m.scale = Op::Div, m.c = in(m.s, 1), m.s0 = in(m.s, 0);
    } else {
      m.s0 = m.s;
    }
    if (m.scale != Op::Count && m.c < 0) return false;
    if (!mm(m.s0, false, true) || g_.nodes[m.s].shape != g_.nodes[m.s0].shape) return false;
    m.q = in(m.s0, 0), m.k = in(m.s0, 1);
    const Shape& qs = g_.nodes[m.q].shape;
    bool ok = qs.size() == 4 && g_.nodes[m.k].shape == qs && g_.nodes[m.v].shape == qs;
    for (int x : {m.q, m.k, m.v}) ok &= g_.nodes[x].dtype == DType::f32;
    return ok && (m.s0 == m.s || read_only_by(m.s0, {m.s})) && read_only_by(m.s, {m.p}) &&
           !uses_.is_output[m.p];
  }

  // The softmax VJP, the scale's and the two matmuls' of the scores.
  bool match_backward(AttentionMatch& m) const {
    const auto& users = uses_.users;
    const auto& is_output = uses_.is_output;
    bool ok = m.dv >= 0 && m.t1 >= 0 && m.ds1 >= 0 && in(m.dp, 0) == m.g && in(m.dp, 1) == m.v &&
              users[m.t1].size() == 1 && !is_output[m.t1];
    if (ok) {
      m.t2 = users[m.t1][0];
      ok = op_is(m.t2, Op::Sum) &&
           g_.nodes[m.t2].prim->attrs<ReduceAttrs>() == ReduceAttrs{{3}, true} &&
           in(m.t3, 0) == m.dp && in(m.t3, 1) == m.t2 && read_only_by(m.dp, {m.t1, m.t3}) &&
           read_only_by(m.t2, {m.t3}) && read_only_by(m.t3, {m.ds1}) &&
           (m.scale == Op::Count || users[m.ds1].size() == 1) && !is_output[m.ds1];
    }
    if (ok && m.scale == Op::Count) {
      m.ds0 = m.ds1;  // no scale: the softmax VJP feeds the matmul VJPs
    } else if (ok) {
      m.ds0 = users[m.ds1][0];
      ok = (m.scale == Op::Mul
                ? op_is(m.ds0, Op::Mul) && other(m.ds0, m.ds1) == m.c
                : op_is(m.ds0, Op::Div) && in(m.ds0, 0) == m.ds1 && in(m.ds0, 1) == m.c) &&
           g_.nodes[m.ds0].shape == g_.nodes[m.s0].shape && !is_output[m.ds0];
    }
    if (!ok) return false;
    for (int u : users[m.ds0]) {
      if (mm(u, false, false) && in(u, 0) == m.ds0 && in(u, 1) == m.k && m.dq < 0)
        m.dq = u;  // dQ = dS k
      else if (mm(u, true, false) && in(u, 0) == m.ds0 && in(u, 1) == m.q && m.dk < 0)
        m.dk = u;  // dK = dSᵀ q
      else
        return false;
    }
    return true;
  }
};

enum class Action { Forward, Backward, DV, DQ, DK };

// Emits the fused kernels of the matches into the new graph: at each old op
// that a match replaces, the values it stood for.
class AttentionEmitter {
 public:
  AttentionEmitter(Rewriter& rw, const std::vector<AttentionMatch>& matches)
      : rw_(rw), matches_(matches), qkv_(matches.size(), -1), grads_(matches.size()) {}

  // Emits what `action` of match mi makes; true when it gave old op i its value.
  bool emit(int i, Action action, int mi) {
    const AttentionMatch& m = matches_[mi];
    const Shape& bhtd = rw_.old().nodes[m.q].shape;
    bthd_ = Shape{bhtd[0], bhtd[2], bhtd[1], bhtd[3]};
    bhtd_ = bhtd;
    const Shape bt1hd{bthd_[0], bthd_[1], 1, bthd_[2], bthd_[3]};
    const Shape bt3hd{bthd_[0], bthd_[1], 3, bthd_[2], bthd_[3]};
    switch (action) {
      case Action::Forward: {
        // (q kᵀ) ∘ c = (q ∘ c) kᵀ for ∘ = · or /: the scale goes into q, so
        // that the kernel needs no constant the graph does not know.
        int qc = swap_heads(rw_[m.q], bthd_);
        if (m.scale != Op::Count) qc = rw_.add(Primitive(m.scale), {qc, rw_[m.c]}, bthd_, kF32);
        std::vector<int> parts;
        for (int x : {qc, swap_heads(rw_[m.k], bthd_), swap_heads(rw_[m.v], bthd_)})
          parts.push_back(rw_.add(Primitive(Op::Reshape, ShapeAttrs{bt1hd}), {x}, bt1hd, kF32));
        qkv_[mi] = rw_.add(Primitive(Op::Concatenate, AxisAttrs{2}), parts, bt3hd, kF32);
        int a = rw_.add(Primitive(Op::Attention, AttentionAttrs{1.0}), {qkv_[mi]}, bthd_, kF32);
        rw_.map(i, swap_heads(a, bhtd_));
        return true;
      }
      case Action::Backward: {
        int d = rw_.add(Primitive(Op::AttentionGrad, AttentionAttrs{1.0}),
                        {qkv_[mi], swap_heads(rw_[m.g], bthd_)}, bt3hd, kF32);
        for (int j = 0; j < 3; ++j) {
          Shape start{0, 0, j, 0, 0}, stop = bt3hd;
          stop[2] = j + 1;
          int part = rw_.add(Primitive(Op::Slice, SliceAttrs{start, stop, Shape(5, 1), bt3hd}), {d},
                             bt1hd, kF32);
          grads_[mi][j] = rw_.add(Primitive(Op::Reshape, ShapeAttrs{bthd_}), {part}, bthd_, kF32);
        }
        return false;
      }
      case Action::DV: rw_.map(i, swap_heads(grads_[mi][2], bhtd_)); return true;
      case Action::DQ: {  // d(q ∘ c) ∘ c
        int d = grads_[mi][0];
        if (m.scale != Op::Count) d = rw_.add(Primitive(m.scale), {d, rw_[m.c]}, bthd_, kF32);
        rw_.map(i, swap_heads(d, bhtd_));
        return true;
      }
      case Action::DK: rw_.map(i, swap_heads(grads_[mi][1], bhtd_)); return true;
    }
    return false;
  }

 private:
  static constexpr DType kF32 = DType::f32;
  Rewriter& rw_;
  const std::vector<AttentionMatch>& matches_;
  std::vector<int> qkv_;
  std::vector<std::array<int, 3>> grads_;  // d(q·c), dk, dv as [B, T, H, D]
  Shape bthd_, bhtd_;

  // [B, H, T, D] <-> [B, T, H, D] (new ids).
  int swap_heads(int x, const Shape& to) {
    return rw_.add(Primitive(Op::Transpose, PermAttrs{{0, 2, 1, 3}}), {x}, to, kF32);
  }
};

}  // namespace

Graph fuse_attention(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Matcher matcher(g);
  std::vector<AttentionMatch> matches;
  for (int o = 0; o < n; ++o)
    if (auto m = matcher.match(o)) matches.push_back(*m);
  if (matches.empty()) return g;

  // The matched ops' values come from the fused kernels, emitted where the
  // old ops stood; the scores, probabilities and softmax backward are not
  // emitted.
  std::vector<std::vector<std::pair<Action, int>>> at(n);
  std::vector<bool> skip(n, false);
  for (int mi = 0; mi < static_cast<int>(matches.size()); ++mi) {
    const AttentionMatch& m = matches[mi];
    at[m.o].push_back({Action::Forward, mi});
    for (int x : {m.s0, m.s, m.p}) skip[x] = true;  // (s0 == s without a scale)
    if (!m.backward()) continue;
    at[std::min(m.dv, m.dp)].push_back({Action::Backward, mi});
    at[m.dv].push_back({Action::DV, mi});
    if (m.dq >= 0) at[m.dq].push_back({Action::DQ, mi});
    if (m.dk >= 0) at[m.dk].push_back({Action::DK, mi});
    for (int x : {m.dp, m.t1, m.t2, m.t3, m.ds1, m.ds0}) skip[x] = true;
  }
  Rewriter rw(g);
  AttentionEmitter emitter(rw, matches);
  for (int i = 0; i < n; ++i) {
    if (g.nodes[i].is_input()) continue;
    bool replaced = false;
    for (auto [action, mi] : at[i]) replaced |= emitter.emit(i, action, mi);
    if (!replaced && !skip[i]) rw.keep(i);
  }
  return rw.finish();
}

}  // namespace kiln::compiler
