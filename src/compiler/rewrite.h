// kiln compiler: the graph-rewrite helper every pass builds its result with
// (Rewriter: old node ids to new ones, ops kept, replaced, dropped or added),
// the per-value readers that passes ask about (Uses), and the graph verifier
// run after each pass.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compiler/graph.h"

namespace kiln::compiler {

// Who reads each value of a graph.
struct Uses {
  std::vector<std::vector<int>> users;  // per value: the ops reading it, one entry per operand slot
  std::vector<bool> is_output;
  std::vector<int> first_use, last_use;  // the first and last op reading it (n and -1: none)
  explicit Uses(const Graph& g);
  // Read by exactly one operand slot of one op, and not a graph output: a
  // value a fused kernel may keep to itself.
  bool read_once(int i) const { return users[i].size() == 1 && !is_output[i]; }
  // The one op that reads value i (in one operand slot or several), or -1:
  // no reader, several, or a graph output.
  int sole_reader(int i) const;
};

// Builds a new graph from an old one, op by op. The old graph's inputs are
// copied first (same slots, same order); the pass then emits, for each old op
// in the order it chooses, whatever replaces it, and maps old ids to new ones.
class Rewriter {
 public:
  explicit Rewriter(const Graph& g);
  const Graph& old() const { return g_; }
  // The new graph so far.
  const Graph& current() const { return out_; }
  // The new id of old value i (-1 while it has none).
  int operator[](int i) const { return id_[i]; }
  // Old value i is read as new value `to` from now on.
  void map(int i, int to) { id_[i] = to; }
  // Emits old op i as it is, over the new ids of its operands; maps i to it.
  int keep(int i);
  // Emits old op i with another primitive and/or operands (old ids) and/or shape.
  int keep(int i, std::shared_ptr<const Primitive> prim, const std::vector<int>& old_inputs,
           const std::optional<Shape>& shape = std::nullopt);
  // Emits old op i over operands given as new ids.
  int keep_over(int i, std::vector<int> new_inputs);
  // Adds a new op over operands given as new ids (on its first operand's device).
  int add(Primitive prim, std::vector<int> new_inputs, Shape shape, DType dtype);
  int add(std::shared_ptr<const Primitive> prim, std::vector<int> new_inputs, Shape shape,
          DType dtype);
  // The new graph; its outputs are the old outputs' new ids.
  Graph finish();

 private:
  const Graph& g_;
  Graph out_;
  std::vector<int> id_;
};

// Visits the ops of g in order, each with the Rewriter that builds the result.
Graph rewrite(const Graph& g, const std::function<void(Rewriter&, int)>& visit);

// What a fusing pass does with one op: keep it, drop it (it lives on inside a
// fused op emitted elsewhere), or replace it with a new primitive over other
// operands (old ids).
struct Emit {
  enum Kind { Keep, Drop, Replace } kind = Keep;
  std::shared_ptr<const Primitive> prim = nullptr;
  std::vector<int> inputs = {};
  std::optional<Shape> shape = std::nullopt;  // a replacement's, when not the op's
};

// rewrite() asking `decide` about every op; a replacement takes the op's
// place and dtype. A dropped op i with value_of[i] != i is read as the
// (earlier) op value_of[i] from then on.
Graph rewrite_ops(const Graph& g, const std::function<Emit(int)>& decide,
                  const std::vector<int>& value_of = {});

// Checks that g is well formed: inputs numbered by slot, operands defined
// before use, outputs in range, each op on its operands' device (a Copy on
// the device it copies to), and every op's operand count and output type
// against its definition's rule (ops/op_defs.h: check_type). Fails naming
// `after` (the pass that made g), the node and what the rule says. Run after
// tracing and after every pass.
void verify(const Graph& g, const std::string& after);

}  // namespace kiln::compiler
