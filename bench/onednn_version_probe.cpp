// Is a newer oneDNN faster at ViT-S/16's bf16 training GEMMs? The matmul
// primitive at the step's shapes (M = 32 * 197; forward X·Wᵀ, dX = dY·W,
// dW = dYᵀ·X of qkv, proj, fc1, fc2), bf16 result, hot (or, with any
// argument, with 1 GiB written between runs), median of 12 runs after 2.
// Builds against oneDNN 2.x (Debian 12's) and 3.x alike. Not part of the build:
//   g++ -O2 -std=c++17 -fopenmp bench/onednn_version_probe.cpp -ldnnl -o /tmp/p26
//   g++ -O2 -std=c++17 -fopenmp -I$PREFIX/include bench/onednn_version_probe.cpp \
//     -L$PREFIX/lib -ldnnl -Wl,-rpath,$PREFIX/lib -o /tmp/p3
// where $PREFIX holds a oneDNN built from source, e.g. Debian trixie's
// onednn_3.7.2+ds.orig.tar.xz with DNNL_CPU_RUNTIME=OMP,
// ONEDNN_ENABLE_PRIMITIVE="MATMUL;REORDER" (20 min on 2 cores).
// Results: bench/results/2026-12-07-huge-pages/README.md.
#include <algorithm>
#include <chrono>
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
double run(long m, long k, long n, bool ta, bool tb, bool cold) {
  static engine eng(engine::kind::cpu, 0);
  static stream s(eng);
  memory::dims st_a = ta ? memory::dims{1, m} : memory::dims{k, 1};
  memory::dims st_b = tb ? memory::dims{1, k} : memory::dims{n, 1};
  memory::desc a_md({m, k}, dt::bf16, st_a), b_md({k, n}, dt::bf16, st_b);
  memory::desc c_md({m, n}, dt::bf16, memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  matmul::primitive_desc pd(eng, a_md, b_md, c_md);
#else
  matmul::primitive_desc pd(matmul::desc(a_md, b_md, c_md), eng);
#endif
  matmul mm(pd);
  std::vector<uint16_t> a(m * k, 0x3f80), b(k * n, 0x3f80), c(m * n);
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  std::vector<double> ts;
  for (int r = 0; r < 14; ++r) {
    if (cold)
      for (size_t q = 0; q < junk.size(); q += 64) junk[q]++;
    double t0 = now();
    mm.execute(s, args);
    s.wait();
    if (r >= 2) ts.push_back(now() - t0);
  }
  std::sort(ts.begin(), ts.end());
  return 2.0 * m * n * k / ts[ts.size() / 2] / 1e12;
}
int main(int argc, char**) {
  bool cold = argc > 1;
  const long M = 32 * 197;
  struct L {
    const char* n;
    long i, o;
  } ls[] = {{"qkv", 384, 1152}, {"proj", 384, 384}, {"fc1", 384, 1536}, {"fc2", 1536, 384}};
  double tw = 0, fl = 0;
  for (auto& l : ls) {
    double f = run(M, l.i, l.o, false, true, cold), d = run(M, l.o, l.i, false, false, cold),
           w = run(l.o, M, l.i, true, false, cold);
    double F = 2.0 * M * l.i * l.o;
    tw += F / f + F / d + F / w;
    fl += 3 * F;
    printf("%-5s fwd %.2f dx %.2f dw %.2f TFLOP/s\n", l.n, f, d, w);
  }
  printf("time-weighted %.2f\n", fl / tw);
}
