// kiln ops: the collectives' definitions (kiln/distributed.h): gradient
// averaging across ranks, which runs after differentiation.
#include "ops/defs/defs.h"

namespace kiln::defs {

void collectives(OpDefs& d) {
  constexpr const char* kWhy =
      ": collectives average gradients after differentiation and have no gradient of their own";
  // Values of one dtype, f32 or f64 -> a token (an i64 scalar).
  define(d, Op::AllReduceStart,
         {.infer = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
            KILN_EXPECT(!in.empty(), p, "a bucket with no values");
            for (const Aval& x : in)
              KILN_EXPECT(
                  x.dtype == in[0].dtype && (x.dtype == DType::f32 || x.dtype == DType::f64), p,
                  "a bucket holds f32 or f64 values of one dtype, got " + str(in[0]) + " and " +
                      str(x));
            return {{}, DType::i64};
          },
          .no_vjp = kWhy});
  // The token -> one value of the bucket, whose type the token does not say.
  define(d, Op::AllReduceWait,
         {.arity = 1,
          .check =
              [](const Primitive& p, const std::vector<Aval>& in, const Aval& out) {
                KILN_EXPECT((in[0] == Aval{{}, DType::i64}), p,
                            "the token is " + str(in[0]) + ", expected AllReduceStart's i64 ()");
                KILN_EXPECT(out.dtype == DType::f32 || out.dtype == DType::f64, p,
                            "gives " + str(out) + ", expected f32 or f64");
              },
          .no_vjp = kWhy});
}

}  // namespace kiln::defs
