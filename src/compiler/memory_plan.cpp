// kiln compiler: memory planning — parameter updates scheduled to run in
// place (defer_donated_updates), liveness and arena assignment.
#include "compiler/memory_plan.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "ops/op_facts.h"

namespace kiln::compiler {
namespace {

constexpr size_t kAlign = 64;
size_t aligned(size_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

bool is_alias_op(Op op) {
  return op_has(op, kAlias);
}

// Whether node's kernel may write over its same-shaped input `j` (the op
// allows it, and no other operand shares j's buffer). root: each value's
// buffer owner.
bool inplace_input_ok(const Node& node, size_t j, const std::vector<int>& root) {
  if (!in_place_safe(*node.prim, j)) return false;
  if (node.prim->op() != Op::FusedReduce) return true;
  for (size_t k = 0; k < node.inputs.size(); ++k)
    if (k != j && root[node.inputs[k]] == root[node.inputs[j]]) return false;
  return true;
}

// Best-fit first-free allocator over one growing arena.
class Arena {
 public:
  size_t alloc(size_t bytes) {
    bytes = aligned(std::max<size_t>(bytes, 1));
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    if (best == free_.end()) {
      // Grow: extend a free block that ends at the top, else append.
      if (!free_.empty()) {
        auto last = std::prev(free_.end());
        if (last->first + last->second == top_) {
          size_t off = last->first;
          free_.erase(last);
          top_ = off + bytes;
          return off;
        }
      }
      size_t off = top_;
      top_ += bytes;
      return off;
    }
    size_t off = best->first, size = best->second;
    free_.erase(best);
    if (size > bytes) free_.emplace(off + bytes, size - bytes);
    return off;
  }
  void release(size_t off, size_t bytes) {
    bytes = aligned(std::max<size_t>(bytes, 1));
    auto it = free_.emplace(off, bytes).first;
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  size_t size() const { return top_; }

 private:
  std::map<size_t, size_t> free_;  // offset -> bytes
  size_t top_ = 0;
};

}  // namespace

MemoryPlan plan_memory(const Graph& g, const std::vector<bool>& donated_inputs, bool inplace) {
  const int n = static_cast<int>(g.nodes.size());
  MemoryPlan plan;
  plan.slots.resize(n);
  std::vector<int> root(n);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    root[i] = (!node.is_input() && is_alias_op(node.prim->op())) ? root[node.inputs[0]] : i;
    plan.slots[i].bytes = numel(node.shape) * size_of(node.dtype);
  }
  std::vector<int> last_use(n, -1);
  std::vector<bool> escapes(n, false);
  for (int i = 0; i < n; ++i)
    for (int k : g.nodes[i].inputs) last_use[root[k]] = std::max(last_use[root[k]], i);
  for (int o : g.outputs) escapes[root[o]] = true;

  // The arena lives on the device most ops run on (every op, in a graph on
  // one device); values on another device get their own buffers per run.
  std::map<std::pair<int, int>, int> ops_on;
  for (const Node& node : g.nodes)
    if (!node.is_input())
      ++ops_on[{static_cast<int>(node.device.type), node.device.index}];
  int most = -1;
  for (const auto& [d, count] : ops_on)
    if (count > most)
      most = count,
      plan.device = Device{static_cast<DeviceType>(d.first), d.second};

  Arena arena;
  std::vector<std::vector<int>> dies_at(n);
  std::vector<bool> claimed(n, false);  // donated inputs already written into
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    auto& slot = plan.slots[i];
    if (node.is_input()) {
      slot.kind = MemoryPlan::Kind::Input;
      continue;
    }
    if (root[i] != i) {
      slot.kind = MemoryPlan::Kind::Alias;
      slot.source = node.inputs[0];
      continue;
    }
    // An operand that dies here, of this op's exact shape and size.
    auto dying_operand = [&](auto accept) {
      for (size_t j = 0; j < node.inputs.size(); ++j) {
        int k = node.inputs[j], r = root[k];
        if (last_use[r] == i && g.nodes[k].shape == node.shape &&
            g.nodes[r].device == node.device && plan.slots[r].bytes == slot.bytes &&
            inplace_input_ok(node, j, root) && accept(r))
          return r;
      }
      return -1;
    };
    if (node.device != plan.device) {
      slot.kind = MemoryPlan::Kind::Fresh;  // not in the arena's memory
    } else if (escapes[i]) {
      int d = dying_operand([&](int r) {
        return g.nodes[r].is_input() && donated_inputs[g.nodes[r].input_slot] && !claimed[r] &&
               !escapes[r];
      });
      if (d >= 0) {
        slot.kind = MemoryPlan::Kind::Donated;
        slot.source = d;
        claimed[d] = true;
        ++plan.donated;
      } else {
        slot.kind = MemoryPlan::Kind::Fresh;
      }
    } else {
      plan.naive_bytes += aligned(slot.bytes);
      int d = inplace ? dying_operand([&](int r) {
        return plan.slots[r].kind == MemoryPlan::Kind::Arena && !claimed[r];
      })
                      : -1;
      slot.kind = MemoryPlan::Kind::Arena;
      slot.first = i;
      if (d >= 0) {
        // Take over the operand's block: it is not released when it dies.
        slot.offset = plan.slots[d].offset;
        claimed[d] = true;
        ++plan.inplace;
      } else {
        slot.offset = arena.alloc(slot.bytes);
      }
      int end = std::max(last_use[i], i);
      slot.last = end;
      dies_at[end].push_back(i);
    }
    for (int r : dies_at[i])
      if (!claimed[r]) arena.release(plan.slots[r].offset, plan.slots[r].bytes);
  }
  plan.arena_bytes = arena.size();
  // Peak of live arena bytes: +bytes where a block is born, -bytes just after
  // its last use (an in-place successor is born where its operand dies).
  std::vector<long long> delta(2 * n + 2, 0);
  for (const auto& s : plan.slots)
    if (s.kind == MemoryPlan::Kind::Arena) {
      delta[2 * s.first] += static_cast<long long>(aligned(std::max<size_t>(s.bytes, 1)));
      delta[2 * s.last + 1] -= static_cast<long long>(aligned(std::max<size_t>(s.bytes, 1)));
    }
  long long live = 0, peak = 0;
  for (long long d : delta) peak = std::max(peak, live += d);
  plan.peak_live_bytes = static_cast<size_t>(peak);
  return plan;
}

bool plan_has_conflict(const MemoryPlan& plan, std::string* why) {
  // Blocks are either disjoint in bytes, or disjoint in time; an in-place
  // successor starts exactly where its operand's life ends.
  std::vector<int> arena;
  for (size_t i = 0; i < plan.slots.size(); ++i)
    if (plan.slots[i].kind == MemoryPlan::Kind::Arena) arena.push_back(static_cast<int>(i));
  for (size_t a = 0; a < arena.size(); ++a)
    for (size_t b = a + 1; b < arena.size(); ++b) {
      const auto &x = plan.slots[arena[a]], &y = plan.slots[arena[b]];
      bool bytes = x.offset < y.offset + std::max<size_t>(y.bytes, 1) &&
                   y.offset < x.offset + std::max<size_t>(x.bytes, 1);
      bool time = x.first < y.last && y.first < x.last;
      if (bytes && time) {
        if (why)
          *why = "%" + std::to_string(arena[a]) + " and %" + std::to_string(arena[b]) +
                 " overlap in bytes and in time";
        return true;
      }
    }
  return false;
}

std::string MemoryPlan::str(const Graph& g) const {
  std::ostringstream os;
  const char* kinds[] = {"input", "arena", "fresh", "donated", "alias"};
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& s = slots[i];
    os << "%" << i << " " << kinds[static_cast<int>(s.kind)];
    if (s.kind == Kind::Arena)
      os << " @" << s.offset << "+" << s.bytes << " live [" << s.first << "," << s.last << "]";
    if (s.kind == Kind::Alias || s.kind == Kind::Donated) os << " of %" << s.source;
    os << " " << (g.nodes[i].prim ? g.nodes[i].prim->name() : "input") << "\n";
  }
  os << "arena " << arena_bytes << " bytes, intermediates " << naive_bytes << " bytes\n";
  return os.str();
}

Graph defer_donated_updates(const Graph& g, const std::vector<bool>& donated) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> root(n), last_use(n, -1), op_users(n, 0);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    const bool alias = !node.is_input() && op_has(node.prim->op(), kAlias);
    root[i] = alias ? root[node.inputs[0]] : i;
    for (int k : node.inputs) {
      last_use[root[k]] = std::max(last_use[root[k]], i);
      ++op_users[k];
    }
  }
  std::vector<bool> is_output(n, false);
  for (int o : g.outputs) is_output[o] = true;
  std::vector<std::vector<int>> after(n);
  std::vector<bool> moved(n, false);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.is_input() || !is_output[i] || op_users[i] || !op_has(node.prim->op(), kPointwise)) continue;
    for (int k : node.inputs) {
      int r = root[k];
      if (g.nodes[r].is_input() && donated[g.nodes[r].input_slot] &&
          g.nodes[k].shape == node.shape && last_use[r] > i) {
        after[last_use[r]].push_back(i);
        moved[i] = true;
        break;
      }
    }
  }
  // Emit in the new order.
  Rewriter rw(g);
  std::function<void(int)> emit = [&](int i) {
    if (!g.nodes[i].is_input()) rw.keep(i);
    for (int j : after[i]) emit(j);
  };
  for (int i = 0; i < n; ++i)
    if (!moved[i]) emit(i);
  return rw.finish();
}

}  // namespace kiln::compiler
