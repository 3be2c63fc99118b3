// Other ways to run ViT-S/16's bf16 training GEMMs on oneDNN's matmul (M =
// 32 * 197 rows), each alone, hot (COLD=1: 512 MiB written before each run),
// median of 10 runs after 2, TFLOP/s:
// - the weight gradients dW [o, i] = dYᵀ·X: as kiln runs them (dY read
//   transposed), swapped (dWᵀ = Xᵀ·dY), with dY already transposed (the
//   transpose not timed), dY in the layout oneDNN picks (its reorder
//   timed), both dY and X pre-transposed; and K split in 1, 2, 4 or 8 pieces summed by
//   the sum post-op (f32 / bf16 result);
// - the forward of proj and fc2 with their bias and f32 residual: the
//   residual by the binary add post-op (as kiln runs it), accumulated in
//   place by the sum post-op (the residual already in the result), and
//   without it (bf16 result), the weights in the blocked layout.
// Not part of the build:
//   g++ -O2 -std=c++17 -fopenmp bench/onednn_gemm_variants_probe.cpp -ldnnl -o /tmp/variants
// Results: bench/results/2026-12-07-blocked-weights/README.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>
using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static std::vector<char> junk(size_t(1) << 29);
static const bool cold = std::getenv("COLD");
static engine eng(engine::kind::cpu, 0);
static stream strm(eng);

// Median seconds of f() over 10 runs after 2.
template <typename F>
static double median_seconds(F f) {
  std::vector<double> ts;
  for (int r = 0; r < 12; ++r) {
    if (cold)
      for (size_t q = 0; q < junk.size(); q += 64) junk[q]++;
    const double t0 = now();
    f();
    strm.wait();
    if (r >= 2) ts.push_back(now() - t0);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// C [m, n] = op(A)·B, A stored [k, m] if ta; with src_any, A reordered into
// the layout oneDNN picks before each run.
static double gemm(long m, long k, long n, bool ta, bool tb, bool src_any = false) {
  memory::desc a_md({m, k}, dt::bf16, ta ? memory::dims{1, m} : memory::dims{k, 1});
  memory::desc b_md({k, n}, dt::bf16, tb ? memory::dims{1, k} : memory::dims{n, 1});
  memory::desc c_md({m, n}, dt::bf16, tag::ab);
  matmul::primitive_desc pd(
      matmul::desc(src_any ? memory::desc({m, k}, dt::bf16, tag::any) : a_md, b_md, c_md), eng);
  matmul mm(pd);
  std::vector<uint16_t> a(m * k, 0x3f80), b(k * n, 0x3f80), c(m * n);
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  memory as = src_any ? memory(pd.src_desc(), eng) : am;
  reorder ro;
  if (src_any) ro = reorder(am, as);
  return 2.0 * m * n * k / median_seconds([&] {
           if (src_any) ro.execute(strm, am, as);
           mm.execute(strm, {{DNNL_ARG_SRC, as}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
         }) / 1e12;
}

// dW [m, n] = Aᵀ·B, A [K, m], B [K, n], in `pieces` along K.
static double dw_pieces(long m, long K, long n, int pieces, dt out) {
  const long kc = K / pieces;
  memory::desc a_md({m, kc}, dt::bf16, memory::dims{1, m}), b_md({kc, n}, dt::bf16, tag::ab),
      c_md({m, n}, out, tag::ab);
  primitive_attr sum;
  post_ops po;
  po.append_sum(1.0f);
  sum.set_post_ops(po);
  matmul first(matmul::primitive_desc(matmul::desc(a_md, b_md, c_md), eng));
  matmul rest(matmul::primitive_desc(matmul::desc(a_md, b_md, c_md), sum, eng));
  std::vector<uint16_t> a(m * K, 0x3f80), b(K * n, 0x3f80);
  std::vector<float> c(m * n);
  memory cm(c_md, eng, c.data());
  return 2.0 * m * n * K / median_seconds([&] {
           for (int q = 0; q < pieces; ++q) {
             memory am(a_md, eng, a.data() + q * kc * m), bm(b_md, eng, b.data() + q * kc * n);
             (q ? rest : first)
                 .execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
           }
         }) / 1e12;
}

// The forward X·Wᵀ + bias with the residual: 0 binary add, 1 sum in place,
// 2 none (bf16 result).
static double forward(long m, long k, long n, int mode) {
  memory::desc a_md({m, k}, dt::bf16, tag::ab), b_plain({k, n}, dt::bf16, tag::ba),
      c_md({m, n}, mode == 2 ? dt::bf16 : dt::f32, tag::ab), bias_md({1, n}, dt::f32, tag::ab),
      res_md({m, n}, dt::f32, tag::ab);
  primitive_attr attr;
  post_ops po;
  if (mode == 0) po.append_binary(algorithm::binary_add, res_md);
  if (mode == 1) po.append_sum(1.0f);
  attr.set_post_ops(po);
  matmul::primitive_desc pd(
      matmul::desc(a_md, memory::desc({k, n}, dt::bf16, tag::any), bias_md, c_md), attr, eng);
  matmul mm(pd);
  std::vector<uint16_t> a(m * k, 0x3f80), b(k * n, 0x3f80);
  std::vector<float> c(m * n), bias(n), res(m * n);
  memory am(a_md, eng, a.data()), bp(b_plain, eng, b.data()), cm(c_md, eng, c.data()),
      bm(pd.weights_desc(), eng);
  reorder(bp, bm).execute(strm, bp, bm);
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, am},
                                          {DNNL_ARG_WEIGHTS, bm},
                                          {DNNL_ARG_DST, cm},
                                          {DNNL_ARG_BIAS, memory(bias_md, eng, bias.data())}};
  if (mode == 0)
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 memory(res_md, eng, res.data()));
  return 2.0 * m * n * k / median_seconds([&] { mm.execute(strm, args); }) / 1e12;
}

int main() {
  const long R = 32 * 197;
  printf("TFLOP/s (%s)\n", cold ? "cold" : "hot");
  for (auto [name, in, out] :
       {std::tuple{"qkv", 384L, 1152L}, {"proj", 384L, 384L}, {"fc1", 384L, 1536L},
        {"fc2", 1536L, 384L}}) {
    printf("%-5s dW as kiln runs it %.2f | swapped %.2f | dY pre-transposed %.2f | dY blocked "
           "%.2f | dY and X both pre-transposed %.2f\n",
           name, gemm(out, R, in, true, false), gemm(in, R, out, true, false),
           gemm(out, R, in, false, false), gemm(out, R, in, true, false, true),
           gemm(out, R, in, false, true));
    printf("%-5s dW, K in pieces (f32/bf16 result):", name);
    for (int pieces : {1, 2, 4, 8})
      printf("  %d: %.2f/%.2f", pieces, dw_pieces(out, R, in, pieces, dt::f32),
             dw_pieces(out, R, in, pieces, dt::bf16));
    printf("\n");
  }
  for (auto [name, in, out] : {std::tuple{"proj", 384L, 384L}, {"fc2", 1536L, 384L}})
    printf("%-5s forward + bias + residual: binary add %.2f | sum in place %.2f | no residual, "
           "bf16 %.2f\n",
           name, forward(R, in, out, 0), forward(R, in, out, 1), forward(R, in, out, 2));
}
