// kiln compiler: the pass pipeline — which passes run, in what order, with
// the graph verified after tracing and after each (always: the verifier is
// one linear walk, ~1% of a compilation) — and its options. The
// passes live in files by family: simplify.cpp, fuse_elementwise.cpp,
// fuse_epilogues.cpp, fuse_attention.cpp, fuse_casts.cpp, remat.cpp,
// memory_plan.cpp.
#include "compiler/passes.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "compiler/rewrite.h"
#include "ops/dispatch.h"

namespace kiln::compiler {

int debug_level() {
  return kiln::debug_level();
}

Graph optimize(const Graph& g, const PassOptions& opt) {
  verify(g, "tracing");
  Graph out = g;
  auto step = [&](const char* name, Graph (*pass)(const Graph&)) {
    out = pass(out);
    verify(out, name);
    if (debug_level() >= 2)
      std::fprintf(stderr, "[compile] after %s:\n%s", name, out.str().c_str());
  };
  if (opt.fuse && opt.attention) step("fuse_attention", fuse_attention);
  if (opt.simplify) step("simplify", simplify);
  if (opt.cse) step("cse", common_subexpression_elimination);
  if (opt.dce) step("dce", dead_code_elimination);
  if (opt.remat) step("rematerialize", [](const Graph& x) { return rematerialize(x); });
  if (opt.fuse && opt.norm) step("fuse_layer_norm_residual", fuse_layer_norm_residual);
  if (opt.fuse && opt.epilogue) step("fuse_epilogue", fuse_matmul_epilogue);
  if (opt.fuse && opt.copy) step("duplicate_shared_producers", duplicate_shared_producers);
  if (opt.fuse) step("fuse", fuse_elementwise);
  if (opt.fuse && opt.reduce) step("fuse_reductions", fuse_reductions);
  if (opt.fuse && opt.cast) step("fuse_casts", fuse_casts);
  if (opt.fuse && opt.cast) step("fuse_bf16_programs", fuse_bf16_programs);
  return out;
}

PassOptions PassOptions::from_env() {
  static const std::pair<const char*, bool PassOptions::*> kSwitches[] = {
      {"no_dce", &PassOptions::dce},
      {"no_cse", &PassOptions::cse},
      {"no_simplify", &PassOptions::simplify},
      {"no_fuse", &PassOptions::fuse},
      {"no_epilogue", &PassOptions::epilogue},
      {"no_reduce", &PassOptions::reduce},
      {"no_norm", &PassOptions::norm},
      {"no_remat", &PassOptions::remat},
      {"no_plan", &PassOptions::plan},
      {"no_inplace", &PassOptions::inplace},
      {"no_attention", &PassOptions::attention},
      {"no_cast", &PassOptions::cast},
      {"no_fold", &PassOptions::fold},
      {"no_copy", &PassOptions::copy}};
  PassOptions o;
  const char* env = std::getenv("KILN_COMPILE");
  if (!env) return o;
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    bool known = false;
    for (auto& [name, flag] : kSwitches)
      if (item == name) o.*flag = false, known = true;
    if (!known) {
      std::string all;
      for (auto& [name, flag] : kSwitches) all += (all.empty() ? "" : ", ") + std::string(name);
      fail("compile", "KILN_COMPILE has '" + item + "', expected a comma-separated list of " + all);
    }
  }
  return o;
}

}  // namespace kiln::compiler
