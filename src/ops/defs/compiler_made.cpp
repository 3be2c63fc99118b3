// kiln ops: the definitions of the primitives that only the compiler makes
// (fused elementwise programs, GEMM epilogues, fused reductions), after
// differentiation.
#include "ops/defs/defs.h"

namespace kiln::defs {

void compiler_made(OpDefs& d) {
  constexpr const char* kWhy = " exists only inside compiled graphs, after differentiation";
  define(
      d, Op::FusedElementwise,
      {.arity_of =
           [](const Primitive& p) { return static_cast<int>(p.attrs<FusedAttrs>().reads.size()); },
       .no_vjp = kWhy});
  // a, b, then one operand per binary step.
  define(d, Op::MatmulEpilogue,
         {.arity_of =
              [](const Primitive& p) {
                int n = 2;
                for (const auto& st : p.attrs<EpilogueAttrs>().steps) n += st.operand >= 0;
                return n;
              },
          .no_vjp = kWhy});
  // The body's reads, then the epilogue's but the sums' register.
  define(d, Op::FusedReduce,
         {.arity_of =
              [](const Primitive& p) {
                const auto& a = p.attrs<FusedReduceAttrs>();
                const int epi = static_cast<int>(a.epilogue.reads.size());
                return static_cast<int>(a.body.reads.size()) +
                       (a.epilogue.program.empty() ? 0 : epi - 1);
              },
          .no_vjp = kWhy});
}

}  // namespace kiln::defs
