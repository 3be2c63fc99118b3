// kiln — compilation: jit (JAX's model) and the lazy step barrier (torch_xla's).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "kiln/transforms.h"

namespace kiln {

struct CacheStats {
  uint64_t hits = 0, misses = 0, compiles = 0, evictions = 0;
  // Runs that replayed a recording of the executable's kernels as one launch
  // (a CUDA Graph; see compiler/executable.h).
  uint64_t replays = 0;
};

struct CompileStats {
  size_t nodes_traced = 0, nodes_compiled = 0;
  size_t arena_bytes = 0, intermediate_bytes = 0;
  int inplace = 0, donated = 0;
  // jit: ops on captured constants run once at compile time, and the bytes
  // of their results that the compiled graph reads.
  size_t nodes_folded = 0, folded_bytes = 0;
  double compile_ms = 0;  // jit: tracing included
};

struct JitOptions {
  std::vector<int> donate;    // argument positions whose buffers outputs may reuse
  size_t cache_capacity = 8;  // compiled signatures kept (least recently used evicted)
};

// jit(f) traces f once per input signature (shapes, dtypes, devices) into a
// graph, compiles it (DCE, CSE, simplification, a static memory plan) and
// replays the executable on later calls. Arrays that f closes over (not its
// arguments) are constants: the ops that read only them run once, at
// compile time (a forward pass that captures its parameters casts and
// concatenates its weights once, not on every call). A donated argument's
// buffer may be reused for an output; its old handle then raises a clear
// error if used.
class Jitted {
 public:
  Jitted(VectorFn f, JitOptions opt);
  ~Jitted();
  std::vector<Array> operator()(const std::vector<Array>& args);
  const CacheStats& cache_stats() const;
  const CompileStats& last_compile() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

Jitted jit(VectorFn f, JitOptions opt = {});

// The lazy mode's step barrier: compiles what `arrays` are pending on (found
// again by the graph's structure in a bounded cache) and runs it; afterwards
// the arrays are materialized. Recompilations are counted.
void mark_step(const std::vector<Array>& arrays);
void mark_step(const Params& params, const std::vector<Array>& more = {});
const CacheStats& lazy_cache_stats();
const CompileStats& lazy_last_compile();

// Flattening of parameter trees for compiled functions (sorted by name).
std::vector<Array> flatten(const Params& p);
Params unflatten(const std::vector<std::string>& names, const std::vector<Array>& v,
                 size_t offset = 0);

}  // namespace kiln
