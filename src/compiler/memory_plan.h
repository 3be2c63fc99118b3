// kiln compiler: the static memory plan of an executable.
#pragma once
#include <string>
#include <vector>

#include "compiler/graph.h"

namespace kiln::compiler {

struct MemoryPlan {
  enum class Kind : uint8_t {
    Input,    // the caller's array
    Arena,    // a block of the executable's arena, reused once dead
    Fresh,    // a new buffer per run: an output (the caller keeps it), or a
              // value on another device than the arena's
    Donated,  // an output written in place into a donated input's buffer
    Alias     // shares its operand's storage (reshape, stop_gradient)
  };
  struct Slot {
    Kind kind = Kind::Arena;
    size_t offset = 0;  // Arena: byte offset
    size_t bytes = 0;
    int source = -1;            // Alias: the node aliased; Donated: the input node written into
    int first = -1, last = -1;  // live range (node positions) of an Arena block
  };
  std::vector<Slot> slots;                // one per node
  Device device = Device::cpu();          // where the arena lives
  size_t arena_bytes = 0;                 // the arena's size
  size_t naive_bytes = 0;                 // all arena values side by side (no reuse)
  size_t peak_live_bytes = 0;             // most arena bytes live at one node: no
                                          // plan of this node order needs less
  int inplace = 0;                        // ops that write over a dying operand
  int donated = 0;                        // outputs written into donated inputs
  std::string str(const Graph& g) const;  // KILN_DEBUG=3
};

// Liveness over the node order, best-fit reuse of dead blocks, in place where
// an elementwise op's operand dies at that op, donated inputs reused for
// outputs computed elementwise from them.
MemoryPlan plan_memory(const Graph& g, const std::vector<bool>& donated_inputs, bool inplace);

// True when two arena values' byte ranges overlap while both are live.
bool plan_has_conflict(const MemoryPlan& plan, std::string* why = nullptr);

}  // namespace kiln::compiler
