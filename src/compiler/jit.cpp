// kiln compiler: jit (trace once per signature, replay) and the lazy mode's
// step barrier (compile what is pending, cached by graph structure).
#include <chrono>
#include <list>
#include <unordered_map>

#include "compiler/executable.h"
#include "core/array_node.h"
#include "kiln/compiler.h"
#include "kiln/ops.h"

namespace kiln {
namespace {

using compiler::Executable;
using compiler::Graph;

// What a jitted function is traced for: each argument's shape, dtype and
// device.
struct Signature {
  struct Arg {
    Shape shape;
    DType dtype;
    Device device;
    bool operator==(const Arg&) const = default;
  };
  std::vector<Arg> args;
  // The matmul precision the function is traced with (set_matmul_precision):
  // a change retraces, as JAX's default precision does.
  MatmulPrecision precision = MatmulPrecision::fp32;
  bool operator==(const Signature&) const = default;
  size_t hash() const {
    size_t h = args.size() * 2 + static_cast<size_t>(precision);
    for (auto& a : args) {
      for (auto x : a.shape) h = h * 1000003u ^ static_cast<size_t>(x);
      h = h * 31 + static_cast<size_t>(a.dtype);
      h = h * 31 + static_cast<size_t>(a.device.type) * 64 + static_cast<size_t>(a.device.index);
    }
    return h;
  }
};

// A bounded LRU cache of compiled entries.
template <typename Key, typename Value>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity ? capacity : 1) {}
  Value* find(size_t hash, const Key& key) {
    auto [b, e] = index_.equal_range(hash);
    for (auto it = b; it != e; ++it)
      if (it->second->key == key) {
        entries_.splice(entries_.begin(), entries_, it->second);  // most recently used first
        ++stats.hits;
        return &it->second->value;
      }
    ++stats.misses;
    return nullptr;
  }
  Value& insert(size_t hash, Key key, Value value) {
    ++stats.compiles;
    if (entries_.size() >= capacity_) {
      auto victim = std::prev(entries_.end());
      auto [b, e] = index_.equal_range(victim->hash);
      for (auto it = b; it != e; ++it)
        if (it->second == victim) {
          index_.erase(it);
          break;
        }
      entries_.erase(victim);
      ++stats.evictions;
    }
    entries_.push_front(Entry{hash, std::move(key), std::move(value)});
    index_.emplace(hash, entries_.begin());
    return entries_.front().value;
  }
  CacheStats stats;

 private:
  struct Entry {
    size_t hash;
    Key key;
    Value value;
  };
  size_t capacity_;
  std::list<Entry> entries_;
  std::unordered_multimap<size_t, typename std::list<Entry>::iterator> index_;
};

// One compiled signature of a jitted function: the executable and, for each
// of its input slots, the argument it takes or a constant captured at tracing.
struct JitEntry {
  std::shared_ptr<Executable> exe;
  std::vector<int> arg_of_slot;  // -1: a captured constant
  std::vector<Array> constant_of_slot;
};

}  // namespace

struct Jitted::Impl {
  VectorFn f;
  JitOptions opt;
  LruCache<Signature, JitEntry> cache;
  CompileStats last;
  Impl(VectorFn fn, JitOptions o)
      : f(std::move(fn)), opt(std::move(o)), cache(opt.cache_capacity) {}

  JitEntry compile(const std::vector<Array>& args) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<Array> tracers;
    for (auto& a : args) tracers.push_back(compiler::tracer(a.shape(), a.dtype(), a.device()));
    std::vector<Array> outputs;
    {
      LazyScope lazy;
      outputs = f(tracers);
    }
    std::vector<Array> leaves;
    Graph traced = compiler::capture(outputs, leaves);
    // Per traced slot: the argument it takes, else the constant it captured.
    std::vector<int> arg_of(leaves.size(), -1);
    std::vector<Array> constants(leaves.size());
    for (size_t s = 0; s < leaves.size(); ++s) {
      for (size_t i = 0; i < tracers.size(); ++i)
        if (leaves[s].same(tracers[i])) arg_of[s] = static_cast<int>(i);
      if (arg_of[s] < 0) constants[s] = leaves[s];
    }
    const compiler::PassOptions passes = compiler::PassOptions::from_env();
    compiler::FoldedGraph folded = compiler::fold_constants(traced, constants, passes);
    JitEntry e;
    std::vector<bool> donated(folded.from_slot.size(), false);
    for (size_t s = 0; s < folded.from_slot.size(); ++s) {
      const int from = folded.from_slot[s];
      const int arg = from >= 0 ? arg_of[from] : -1;
      e.arg_of_slot.push_back(arg);
      e.constant_of_slot.push_back(from < 0 ? folded.value[s] : constants[from]);
      for (int d : opt.donate)
        if (d == arg) donated[s] = true;
    }
    e.exe = std::make_shared<Executable>(folded.graph, donated, passes);
    last = e.exe->stats();
    last.nodes_traced = traced.num_ops();
    last.nodes_folded = static_cast<size_t>(folded.folded_ops);
    last.folded_bytes = static_cast<size_t>(folded.folded_bytes);
    // Tracing counts as compilation: the time from the call to a runnable executable.
    last.compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return e;
  }
};

Jitted::Jitted(VectorFn f, JitOptions opt)
    : impl_(std::make_shared<Impl>(std::move(f), std::move(opt))) {}
Jitted::~Jitted() = default;

std::vector<Array> Jitted::operator()(const std::vector<Array>& args) {
  Signature sig;
  sig.precision = matmul_precision();
  for (auto& a : args) {
    if (!a.valid()) fail("jit", "an argument is an empty Array handle");
    sig.args.push_back({a.shape(), a.dtype(), a.device()});
  }
  for (int d : impl_->opt.donate)
    if (d < 0 || d >= static_cast<int>(args.size()))
      fail("jit", "donated argument " + std::to_string(d) + " does not exist (" +
                      std::to_string(args.size()) + " arguments)");
  size_t h = sig.hash();
  JitEntry* e = impl_->cache.find(h, sig);
  if (!e) e = &impl_->cache.insert(h, sig, impl_->compile(args));
  std::vector<Array> inputs;
  for (size_t s = 0; s < e->arg_of_slot.size(); ++s)
    inputs.push_back(e->arg_of_slot[s] >= 0 ? args[e->arg_of_slot[s]] : e->constant_of_slot[s]);
  const uint64_t before = e->exe->replays();
  std::vector<Array> out = e->exe->run(inputs);
  impl_->cache.stats.replays += e->exe->replays() - before;
  return out;
}

const CacheStats& Jitted::cache_stats() const {
  return impl_->cache.stats;
}
const CompileStats& Jitted::last_compile() const {
  return impl_->last;
}

Jitted jit(VectorFn f, JitOptions opt) {
  return Jitted(std::move(f), std::move(opt));
}

namespace {
struct LazyState {
  LruCache<Graph, std::shared_ptr<Executable>> cache{16};
  CompileStats last;
};
LazyState& lazy_state() {
  static LazyState s;
  return s;
}
}  // namespace

void mark_step(const std::vector<Array>& arrays) {
  std::vector<Array> pending;
  for (auto& a : arrays) {
    if (!a.valid()) fail("mark_step", "an empty Array handle");
    if (!a.is_materialized()) pending.push_back(a);
  }
  if (pending.empty()) return;
  std::vector<Array> leaves;
  Graph g = compiler::capture(pending, leaves);
  auto& st = lazy_state();
  size_t h = g.hash();
  auto* found = st.cache.find(h, g);
  std::shared_ptr<Executable> exe;
  if (found) {
    exe = *found;
  } else {
    exe = std::make_shared<Executable>(g, std::vector<bool>(leaves.size(), false),
                                       compiler::PassOptions::from_env());
    st.last = exe->stats();
    st.cache.insert(h, std::move(g), exe);
  }
  const uint64_t before = exe->replays();
  std::vector<Array> outs = exe->run(leaves);
  st.cache.stats.replays += exe->replays() - before;
  // The pending arrays become materialized, holding the results.
  for (size_t i = 0; i < pending.size(); ++i) {
    ArrayNode* n = pending[i].node();
    n->buffer = outs[i].node()->buffer;
    n->offset = outs[i].node()->offset;
    n->primitive.reset();
    n->drop_inputs();
  }
}

void mark_step(const Params& params, const std::vector<Array>& more) {
  std::vector<Array> all = flatten(params);
  all.insert(all.end(), more.begin(), more.end());
  mark_step(all);
}

const CacheStats& lazy_cache_stats() {
  return lazy_state().cache.stats;
}
const CompileStats& lazy_last_compile() {
  return lazy_state().last;
}

std::vector<Array> flatten(const Params& p) {
  std::vector<Array> v;
  v.reserve(p.size());
  for (auto& [name, a] : p) v.push_back(a);
  return v;
}

Params unflatten(const std::vector<std::string>& names, const std::vector<Array>& v,
                 size_t offset) {
  if (v.size() < offset + names.size())
    fail("unflatten", std::to_string(names.size()) + " names for " +
                          std::to_string(v.size() - offset) + " arrays");
  Params p;
  for (size_t i = 0; i < names.size(); ++i) p.emplace(names[i], v[offset + i]);
  return p;
}

}  // namespace kiln
