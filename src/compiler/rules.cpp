// kiln compiler: the rule engine — pattern matching with backtracking (over
// alternatives, operand orders and readers), the sweep that decides which
// matches fire, and the fixed-point driver.
#include "compiler/rules.h"

#include <memory>
#include <type_traits>

#include "compiler/passes.h"

namespace kiln::compiler {

Pattern Pattern::named(std::string n) const {
  Pattern p = *this;
  p.name = std::move(n);
  return p;
}

Pattern Pattern::where(std::function<bool(const Node&)> t) const {
  Pattern p = *this;
  if (p.test) {
    p.test = [first = p.test, then = std::move(t)](const Node& n) { return first(n) && then(n); };
  } else {
    p.test = std::move(t);
  }
  return p;
}

Pattern Pattern::commuted() const {
  if (kind != Kind::Op || operands.size() != 2)
    fail("compile", "a rule's pattern commutes an op that does not have two operand patterns");
  Pattern p = *this;
  p.commutes = true;
  return p;
}

Pattern Pattern::read_by(Pattern reader) const {
  Pattern p = *this;
  p.readers.push_back(std::move(reader));
  return p;
}

Pattern any(std::string name) {
  Pattern p;
  p.name = std::move(name);
  return p;
}

Pattern op(Op o, std::vector<Pattern> operands) {
  return op_if([o](Op x) { return x == o; }, std::move(operands));
}

Pattern op_if(std::function<bool(Op)> which, std::vector<Pattern> operands) {
  Pattern p;
  p.kind = Pattern::Kind::Op;
  p.op = std::move(which);
  p.operands = std::move(operands);
  return p;
}

Pattern either(std::vector<Pattern> alternatives) {
  Pattern p;
  p.kind = Pattern::Kind::Either;
  p.operands = std::move(alternatives);
  return p;
}

int Match::operator[](const std::string& name) const {
  for (const auto& [n, v] : bindings)
    if (*n == name) return v;
  fail("compile", "a rule asks for '" + name + "', which its pattern did not bind");
}

bool Match::bound(const std::string& name) const {
  for (const auto& [n, v] : bindings)
    if (*n == name) return true;
  return false;
}

std::vector<int> Build::operands_of(const std::string& name) const {
  std::vector<int> ins;
  for (int k : m.node(name).inputs) ins.push_back(rw_[k]);
  return ins;
}

const Node& Build::new_node(int id) const {
  return rw_.current().nodes[id];
}

int Build::add(Primitive prim, std::vector<int> inputs, Shape shape, DType dtype) {
  size_t h = prim.hash() * 31 + static_cast<size_t>(dtype);
  for (int k : inputs) h = h * 31 + static_cast<size_t>(k);
  for (int64_t d : shape) h = h * 31 + static_cast<size_t>(d);
  auto range = made_.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    const Node& n = new_node(it->second);
    if (n.inputs == inputs && n.shape == shape && n.dtype == dtype && *n.prim == prim)
      return it->second;
  }
  int id = rw_.add(std::move(prim), std::move(inputs), std::move(shape), dtype);
  made_.emplace(h, id);
  return id;
}

namespace {

// A callable passed down the matcher's recursion without allocating: what
// must still match after the current pattern (the rest of the rule).
class Then {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, Then>)
      Then(F&& f)  // NOLINT: implicit, as a function_ref
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o) { return (*static_cast<std::remove_reference_t<F>*>(o))(); }) {}
  bool operator()() const { return call_(obj_); }

 private:
  void* obj_;
  bool (*call_)(void*);
};

// Matches patterns against one graph, binding into one Match; a failed
// match leaves the bindings as it found them.
class Matcher {
 public:
  explicit Matcher(Match& m) : m_(m) {}

  bool match(const Pattern& p, int v, Then then) {
    const Node& n = m_.g.nodes[v];
    if (p.kind == Pattern::Kind::Op && (n.is_input() || !p.op(n.prim->op()))) return false;
    if (p.test && !p.test(n)) return false;
    const size_t mark = m_.bindings.size();
    if (!p.name.empty() && !bind(p.name, v)) return false;
    auto rest = [&] { return readers(p, v, 0, then); };
    bool ok = false;
    if (p.kind == Pattern::Kind::Either) {
      for (const Pattern& alt : p.operands)
        if ((ok = match(alt, v, rest))) break;
    } else if (p.kind == Pattern::Kind::Any || p.operands.empty()) {
      ok = rest();
    } else if (n.inputs.size() == p.operands.size()) {
      ok = operands(p, n.inputs, false, 0, rest) ||
           (p.commutes && operands(p, n.inputs, true, 0, rest));
    }
    if (!ok) m_.bindings.resize(mark);
    return ok;
  }

 private:
  Match& m_;

  bool bind(const std::string& name, int v) {
    for (const auto& [n, bound] : m_.bindings)
      if (*n == name) return bound == v;
    m_.bindings.push_back({&name, v});
    return true;
  }

  bool operands(const Pattern& p, const std::vector<int>& ins, bool swapped, size_t j, Then then) {
    if (j == p.operands.size()) return then();
    auto rest = [&] { return operands(p, ins, swapped, j + 1, then); };
    return match(p.operands[j], ins[swapped ? 1 - j : j], rest);
  }

  bool readers(const Pattern& p, int v, size_t j, Then then) {
    if (j == p.readers.size()) return then();
    auto rest = [&] { return readers(p, v, j + 1, then); };
    const auto& users = m_.uses.users[v];
    for (size_t i = 0; i < users.size(); ++i) {
      if (i > 0 && users[i] == users[i - 1]) continue;  // one reader in two operand slots
      if (match(p.readers[j], users[i], rest)) return true;
    }
    return false;
  }
};

// One sweep: sets `fired` and returns the rewritten graph when some rule
// fired (else returns nothing useful).
Graph sweep(const Graph& g, const std::vector<Rule>& rules, const std::string& pass, bool& fired) {
  const int n = static_cast<int>(g.nodes.size());
  const Uses uses(g);
  std::vector<Match> matches;
  std::vector<int> rule_of, match_at(n, -1);
  for (int i = 0; i < n; ++i) {
    if (g.nodes[i].is_input()) continue;
    for (int r = 0; r < static_cast<int>(rules.size()); ++r) {
      const Rule& rule = rules[r];
      if (rule.pattern.kind == Pattern::Kind::Op && !rule.pattern.op(g.nodes[i].prim->op()))
        continue;
      Match m(g, uses, i);
      Matcher matcher(m);
      if (!matcher.match(rule.pattern, i, [&] { return !rule.when || rule.when(m); })) continue;
      match_at[i] = static_cast<int>(matches.size());
      matches.push_back(std::move(m));
      rule_of.push_back(r);
      break;
    }
  }
  // The matches that fire: the largest set in which every value a match
  // says dies is read only by ops that the set replaces or that die too.
  std::vector<bool> fires(matches.size(), true);
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<bool> gone(n, false);
    for (size_t mi = 0; mi < matches.size(); ++mi) {
      if (!fires[mi]) continue;
      gone[matches[mi].root] = true;
      for (const std::string& d : rules[rule_of[mi]].dies) gone[matches[mi][d]] = true;
    }
    for (size_t mi = 0; mi < matches.size(); ++mi) {
      if (!fires[mi]) continue;
      for (const std::string& d : rules[rule_of[mi]].dies) {
        const int v = matches[mi][d];
        bool dies = !uses.is_output[v];
        for (int u : uses.users[v]) dies &= gone[u];
        if (!dies) {
          fires[mi] = false, changed = true;
          break;
        }
      }
    }
  }
  // Bottom-up: a match that binds a value another firing match replaces
  // waits for the next sweep, which matches the replacement instead (the
  // first match in the graph's order never waits).
  std::vector<bool> replaced(n, false);
  for (size_t mi = 0; mi < matches.size(); ++mi) {
    if (!fires[mi]) continue;
    for (const auto& [name, v] : matches[mi].bindings)
      if (v != matches[mi].root && replaced[v]) fires[mi] = false;
    replaced[matches[mi].root] = fires[mi];
  }
  fired = false;
  for (bool f : fires) fired |= f;
  if (!fired) return {};
  Rewriter rw(g);
  std::unordered_multimap<size_t, int> made;
  for (int i = 0; i < n; ++i) {
    if (g.nodes[i].is_input()) continue;
    const int mi = match_at[i];
    if (mi < 0 || !fires[mi]) {
      rw.keep(i);
      continue;
    }
    const Rule& rule = rules[rule_of[mi]];
    Build b(matches[mi], rw, made);
    const int v = rule.replace(b);
    const Node& now = b.new_node(v);
    if (now.shape != g.nodes[i].shape || now.dtype != g.nodes[i].dtype)
      fail("compile", pass + ": rule " + rule.name + " replaced %" + std::to_string(i) + " (" +
                          str(g.nodes[i].shape) + " " + name_of(g.nodes[i].dtype) +
                          ") with a value of " + str(now.shape) + " " + name_of(now.dtype));
    rw.map(i, v);
  }
  return dead_code_elimination(rw.finish());
}

}  // namespace

Graph apply_rules(const Graph& g, const std::vector<Rule>& rules, const std::string& pass) {
  // Rules that keep matching their own replacements would never stop (or
  // grow the graph without bound): the sweeps and the size are capped.
  constexpr int kMaxSweeps = 32;
  const size_t max_nodes = 4 * g.nodes.size() + 1024;
  bool fired = false;
  Graph cur = sweep(g, rules, pass, fired);
  if (!fired) return g;
  for (int s = 1; s <= kMaxSweeps && cur.nodes.size() <= max_nodes; ++s) {
    Graph next = sweep(cur, rules, pass, fired);
    if (!fired) return cur;
    cur = std::move(next);
  }
  fail("compile", pass + ": its rules still fire after " + std::to_string(kMaxSweeps) +
                      " sweeps or " + std::to_string(max_nodes) + " nodes (from " +
                      std::to_string(g.nodes.size()) +
                      "): a rule that matches its own replacement?");
}

}  // namespace kiln::compiler
