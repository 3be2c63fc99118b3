// Does oneDNN's bf16 matmul run ViT-S/16's linears faster with the weights
// in the layout it picks (format `any`, reordered first) than read in place?
// The step's shapes (M = 32 * 197; forward X·Wᵀ, the forward with the
// step's epilogue (bias, then an f32 residual, f32 result), dX = dY·W, dW =
// dYᵀ·X), each three ways: B plain / B blocked, reordered outside the timing /
// B blocked with the reorder timed. Median of 10 runs after 2, hot (COLD=1:
// 512 MiB written before each run). D3=1 uses rank-3 descriptors with a
// batch of 1 (as kiln did), where oneDNN 2.6 keeps dX's and dW's B plain.
// Not part of the build:
//   g++ -O2 -std=c++17 -fopenmp bench/onednn_blocked_weights_probe.cpp -ldnnl -o /tmp/probe
// Results: bench/results/2026-12-07-blocked-weights/README.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>
using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static std::vector<char> junk(size_t(1) << 29);
static const bool cold = std::getenv("COLD"), d3 = std::getenv("D3");

static memory::desc md(long r, long c, dt t, bool transposed) {
  if (d3) return {{1, r, c}, t, transposed ? memory::dims{r * c, 1, r} : memory::dims{r * c, c, 1}};
  return {{r, c}, t, transposed ? memory::dims{1, r} : memory::dims{c, 1}};
}
static memory::desc any(long r, long c) {
  return d3 ? memory::desc({1, r, c}, dt::bf16, tag::any) : memory::desc({r, c}, dt::bf16, tag::any);
}

// TFLOP/s of C [m, n] = A·B three ways (see above) into out[0..2].
static void run(long m, long k, long n, bool ta, bool tb, bool epilogue, double* out) {
  static engine eng(engine::kind::cpu, 0);
  static stream s(eng);
  const memory::desc a_md = md(m, k, dt::bf16, ta), b_plain = md(k, n, dt::bf16, tb),
                     c_md = md(m, n, epilogue ? dt::f32 : dt::bf16, false),
                     bias_md = md(1, n, dt::f32, false), res_md = md(m, n, dt::f32, false);
  std::vector<uint16_t> a(m * k, 0x3f80), b(k * n, 0x3f80);
  std::vector<float> c(m * n), bias(n), res(m * n);
  for (int mode = 0; mode < 3; ++mode) {
    const memory::desc b_md = mode == 0 ? b_plain : any(k, n);
    primitive_attr attr;
    if (epilogue) {
      post_ops po;
      po.append_binary(algorithm::binary_add, res_md);
      attr.set_post_ops(po);
    }
    matmul::primitive_desc pd(
        epilogue ? matmul::desc(a_md, b_md, bias_md, c_md) : matmul::desc(a_md, b_md, c_md), attr,
        eng);
    matmul mm(pd);
    memory am(a_md, eng, a.data()), bp(b_plain, eng, b.data()), cm(c_md, eng, c.data());
    memory bm = mode == 0 ? bp : memory(pd.weights_desc(), eng);
    reorder ro;
    if (mode) {
      ro = reorder(bp, bm);
      ro.execute(s, bp, bm);
      s.wait();
    }
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (epilogue) {
      args.emplace(DNNL_ARG_BIAS, memory(bias_md, eng, bias.data()));
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                   memory(res_md, eng, res.data()));
    }
    std::vector<double> ts;
    for (int r = 0; r < 12; ++r) {
      if (cold)
        for (size_t q = 0; q < junk.size(); q += 64) junk[q]++;
      const double t0 = now();
      if (mode == 2) ro.execute(s, bp, bm);
      mm.execute(s, args);
      s.wait();
      if (r >= 2) ts.push_back(now() - t0);
    }
    std::sort(ts.begin(), ts.end());
    out[mode] = 2.0 * m * n * k / ts[ts.size() / 2] / 1e12;
  }
}

int main() {
  const long M = 32 * 197;
  struct Linear {
    const char* name;
    long in, out;
  } linears[] = {{"qkv", 384, 1152}, {"proj", 384, 384}, {"fc1", 384, 1536}, {"fc2", 1536, 384}};
  printf("TFLOP/s, B plain / blocked / blocked with its reorder (%s, %s)\n", cold ? "cold" : "hot",
         d3 ? "rank 3" : "rank 2");
  for (const Linear& l : linears) {
    double f[3], e[3], d[3], w[3];
    run(M, l.in, l.out, false, true, false, f);
    run(M, l.in, l.out, false, true, true, e);
    run(M, l.out, l.in, false, false, false, d);
    run(l.out, M, l.in, true, false, false, w);
    printf("%-5s fwd %.2f/%.2f/%.2f  fwd+bias+residual %.2f/%.2f/%.2f  dx %.2f/%.2f/%.2f  "
           "dw %.2f/%.2f/%.2f\n",
           l.name, f[0], f[1], f[2], e[0], e[1], e[2], d[0], d[1], d[2], w[0], w[1], w[2]);
  }
}
