// kiln compiler: an executable — a compiled graph with its memory plan.
#pragma once
#include <string>
#include <vector>

#include "compiler/graph.h"
#include "compiler/memory_plan.h"
#include "compiler/passes.h"
#include "kiln/compiler.h"

namespace kiln::compiler {

class Executable {
 public:
  // Runs the passes on `g` and plans memory. donated[i]: input slot i may be overwritten.
  Executable(const Graph& g, std::vector<bool> donated, const PassOptions& opt);
  // Runs the graph on `inputs` (one per input slot); returns the outputs.
  std::vector<Array> run(const std::vector<Array>& inputs);
  const CompileStats& stats() const { return stats_; }
  const Graph& graph() const { return graph_; }
  const MemoryPlan& plan() const { return plan_; }

 private:
  Graph graph_;
  MemoryPlan plan_;
  std::vector<bool> donated_;
  std::shared_ptr<Buffer> arena_;
  std::vector<std::shared_ptr<ArrayNode>> values_;  // one per node, reused across runs
  CompileStats stats_;
};


}  // namespace kiln::compiler
