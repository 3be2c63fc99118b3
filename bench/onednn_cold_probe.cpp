// Do ViT-S/16's bf16 GEMMs run slower in a training step than alone because
// their operands come from memory? oneDNN's matmul primitive (Debian's
// oneDNN 2.6, brgemm on AMX) at the step's shapes (M = 32 * 197), each run
// hot (the same operands again) and cold (1 GiB written between runs), and
// the weight gradient with m < n both ways round. Not part of the build:
//   g++ -O2 -std=c++17 -fopenmp bench/onednn_cold_probe.cpp -ldnnl -o /tmp/probe
//   /tmp/probe
// Prints the median of 12 runs (after 2 untimed) per GEMM.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>
using namespace dnnl;
using dt = memory::data_type;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static std::vector<char> junk(size_t(1) << 30);

// C [m, n] = op(A) [m, k] · op(B) [k, n], bf16 operands; ta, tb: A, B stored
// transposed; bias: an f32 row as the primitive's bias argument.
void run(const char* name, long m, long k, long n, bool ta, bool tb, bool bias, dt out, bool cold) {
  static engine eng(engine::kind::cpu, 0);
  static stream s(eng);
  memory::dims st_a = ta ? memory::dims{1, m} : memory::dims{k, 1};
  memory::dims st_b = tb ? memory::dims{1, k} : memory::dims{n, 1};
  memory::desc a_md({m, k}, dt::bf16, st_a), b_md({k, n}, dt::bf16, st_b);
  memory::desc c_md({m, n}, out, memory::format_tag::ab),
      bias_md({1, n}, dt::f32, memory::format_tag::ab);
  matmul::primitive_desc pd(
      bias ? matmul::desc(a_md, b_md, bias_md, c_md) : matmul::desc(a_md, b_md, c_md), eng);
  matmul mm(pd);
  std::vector<uint16_t> a(m * k, 0x3f80), b(k * n, 0x3f80);  // bf16 ones
  std::vector<float> c(m * n), bv(n, 0.0f);
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  memory biasm(bias_md, eng, bv.data());
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias) args[DNNL_ARG_BIAS] = biasm;
  std::vector<double> ts;
  for (int r = 0; r < 14; ++r) {
    if (cold)
      for (size_t q = 0; q < junk.size(); q += 64) junk[q]++;
    const double t0 = now();
    mm.execute(s, args);
    s.wait();
    if (r >= 2) ts.push_back(now() - t0);
  }
  std::sort(ts.begin(), ts.end());
  const double t = ts[ts.size() / 2];
  std::printf("%-4s %-22s m %5ld k %5ld n %5ld: %6.3f ms %5.2f TFLOP/s  %s\n",
              cold ? "cold" : "hot", name, m, k, n, t * 1e3, 2.0 * m * n * k / t / 1e12,
              pd.impl_info_str());
}

int main() {
  const long M = 6304;
  for (bool cold : {false, true}) {
    run("qkv forward (+bias)", M, 384, 1152, false, true, true, dt::bf16, cold);
    run("fc2 forward (+bias, f32)", M, 1536, 384, false, true, true, dt::f32, cold);
    run("fc2 dX", M, 384, 1536, false, false, false, dt::bf16, cold);
    run("fc2 dW", 384, M, 1536, true, false, false, dt::bf16, cold);
    run("fc2 dW transposed", 1536, M, 384, true, false, false, dt::bf16, cold);
    run("qkv dW", 1152, M, 384, true, false, false, dt::bf16, cold);
  }
}
