// kiln ops: the collectives' definitions (kiln/distributed.h): gradient
// averaging across ranks, which runs after differentiation.
#include "ops/defs/defs.h"

namespace kiln::defs {

void collectives(OpDefs& d) {
  constexpr const char* kWhy =
      ": collectives average gradients after differentiation and have no gradient of their own";
  define(d, Op::AllReduceStart, {.no_vjp = kWhy});  // any number of values -> a token
  define(d, Op::AllReduceWait, {.arity = 1, .no_vjp = kWhy});
}

}  // namespace kiln::defs
