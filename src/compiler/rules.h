// kiln compiler: declarative rewrites. A Rule is a pattern over the graph
// (ops, their operands, tests on the nodes, names bound to the values it
// matches), a predicate over the whole match, the bound values that must die
// for the rewrite to pay, and a replacement; apply_rules runs a set of rules
// over a graph to a fixed point with the Rewriter. simplify, the attention
// and GEMM-epilogue fusions and LayerNorm's residual fusion are rule sets.
#pragma once
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "compiler/graph.h"
#include "compiler/rewrite.h"

namespace kiln::compiler {

// Matches one value of a graph and, through its operands' patterns, the
// values it is computed from. Built with any, op, op_if and either below.
struct Pattern {
  enum class Kind { Any, Op, Either } kind = Kind::Any;
  std::function<bool(Op)> op;             // Op: which ops match
  std::vector<Pattern> operands;          // Op: one per operand (none: not examined);
                                          // Either: the alternatives, tried in order
  std::function<bool(const Node&)> test;  // when set, must hold for the value's node
  bool commutes = false;                  // Op with two operands: either order matches
  std::vector<Pattern> readers;           // each must match some op reading the value
  std::string name;                       // binds the value (a name bound twice: the
                                          // same value both times)

  // This pattern, binding its value to `n`.
  Pattern named(std::string n) const;
  // This pattern, matching only values for which t(node) holds too.
  Pattern where(std::function<bool(const Node&)> t) const;
  // This binary op's pattern with its two operands' patterns in either order.
  Pattern commuted() const;
  // This pattern, matching only values that some op matching `reader` reads
  // (the reader's pattern names this value to tie it: any("x") inside it).
  Pattern read_by(Pattern reader) const;
};

// Any value (a graph input or an op's), bound to `name` when it has one.
Pattern any(std::string name = "");
// An op `o` whose operands match `operands`, in order (none given: any).
Pattern op(Op o, std::vector<Pattern> operands = {});
// An op for which `which` holds.
Pattern op_if(std::function<bool(Op)> which, std::vector<Pattern> operands = {});
// The first of `alternatives` that lets the whole rule match.
Pattern either(std::vector<Pattern> alternatives);

// The values a pattern matched, in the graph it matched in.
class Match {
 public:
  Match(const Graph& g, const Uses& uses, int root) : g(g), uses(uses), root(root) {}
  const Graph& g;
  const Uses& uses;
  const int root;  // the op the rule rewrites
  // The value bound to `name`; fails when the pattern bound none.
  int operator[](const std::string& name) const;
  bool bound(const std::string& name) const;
  const Node& node(const std::string& name) const { return g.nodes[(*this)[name]]; }
  const Node& root_node() const { return g.nodes[root]; }

  std::vector<std::pair<const std::string*, int>> bindings;  // names in the rule's pattern
};

// What a replacement emits its ops with: the new graph's values of the bound
// values, and new ops. The same op over the same values is made once per
// sweep, so that rules rewriting several values of one computation (the
// attention's dQ, dK and dV) share the kernel that makes them.
class Build {
 public:
  Build(const Match& m, Rewriter& rw, std::unordered_multimap<size_t, int>& made)
      : m(m), rw_(rw), made_(made) {}
  const Match& m;
  // The new value of the value bound to `name`.
  int operator()(const std::string& name) const { return rw_[m[name]]; }
  // The new values of the operands of the value bound to `name`.
  std::vector<int> operands_of(const std::string& name) const;
  // A new op over new values (on its first operand's device).
  int add(Primitive prim, std::vector<int> inputs, Shape shape, DType dtype);
  const Node& new_node(int id) const;

 private:
  Rewriter& rw_;
  std::unordered_multimap<size_t, int>& made_;
};

struct Rule {
  std::string name;
  Pattern pattern;  // its root is the op that the replacement takes the place of
  // Must hold for the whole match (it may look at anything the Match shows).
  std::function<bool(const Match&)> when = nullptr;
  // Bound values that the replacement leaves unread: the rule fires only
  // where each of them is not a graph output and is read by nothing but
  // ops that this sweep's rules replace or leave dead in turn (so a fused
  // kernel never runs beside what it was meant to replace).
  std::vector<std::string> dies = {};
  // Emits the replacement and returns its value (a new id), of the root's
  // shape and dtype.
  std::function<int(Build&)> replace = nullptr;
};

// Rewrites g with `rules` to a fixed point: each sweep matches every op
// against the rules in order (the first that matches wins), replaces the
// root of every match that fires by its replacement, and drops the ops left
// dead; sweeps repeat until one fires no rule. Rewriting is bottom-up: a
// match that binds a value which another match of the sweep replaces waits
// for the next sweep, where it sees the replacement (so an epilogue chain
// grows from its GEMM one step per sweep). `pass` names the rule set in
// errors.
Graph apply_rules(const Graph& g, const std::vector<Rule>& rules, const std::string& pass);

}  // namespace kiln::compiler
