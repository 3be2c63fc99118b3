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
  ~Executable();
  // Runs the graph on `inputs` (one per input slot); returns the outputs.
  // On a device whose backend records (CUDA Graphs), the second and later
  // runs replay one recording of the kernels (see Recorded).
  std::vector<Array> run(const std::vector<Array>& inputs);
  const CompileStats& stats() const { return stats_; }
  const Graph& graph() const { return graph_; }
  const MemoryPlan& plan() const { return plan_; }
  // Runs that replayed a recording, and recordings made.
  uint64_t replays() const { return replays_; }
  uint64_t recordings() const { return recordings_; }

 private:
  // A recording of the whole run, replayed as one launch. Its kernels read
  // and write fixed memory: the arena, `staged` (each non-donated input is
  // copied there before a replay), `fresh` (each output written to a new
  // buffer: copied out after a replay, since the next replay writes it
  // again) and the donated inputs' buffers, which a replay requires to be the
  // ones recorded (a training step gets back the buffers it returned; other
  // buffers are recorded anew).
  struct Recorded;
  enum class Pass { Run, Record, Bind };
  // Binds every node's memory and runs its kernel (Run, Record: recorded by
  // the backend) or only the alias kernels (Bind: after a replay).
  void run_nodes(Pass pass);
  void record(const std::vector<Array>& inputs);
  bool replay(const std::vector<Array>& inputs);

  Graph graph_;
  MemoryPlan plan_;
  std::vector<bool> donated_;
  std::shared_ptr<Buffer> arena_;
  std::vector<std::shared_ptr<ArrayNode>> values_;  // one per node, reused across runs
  CompileStats stats_;
  bool recordable_ = false;  // one device whose backend records, nothing moves between devices
  bool record_failed_ = false;
  uint64_t runs_ = 0, replays_ = 0, recordings_ = 0;
  std::unique_ptr<Recorded> recorded_;
};


}  // namespace kiln::compiler
