// bf16 against f32 matmul with oneDNN 3.x's matmul primitive at ViT-B/16
// training shapes (M = 32 * 197 = 6304): does a newer oneDNN than Debian's
// 2.6 make bf16 pay off on a CPU without AMX? Not part of the build; with
// PyPI's CPU/GNU-OpenMP build of oneDNN 3.2 unpacked in DIR:
//   pip download --no-deps onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0
//   (unzip both wheels into DIR)
//   g++ -O2 -std=c++17 -IDIR/include bench/onednn_bf16_probe.cpp -LDIR/lib -ldnnl \
//       -Wl,-rpath,DIR/lib -o /tmp/probe && /tmp/probe
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>
using namespace dnnl;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  struct Shp {
    long m, k, n;
    bool tb;
    const char* name;
  } shapes[] = {{6304, 768, 3072, true, "fc1 fwd X.W^T"},
                {6304, 3072, 768, false, "fc2 dX dY.W"},
                {768, 6304, 3072, false, "fc1 dW X^T.dY (as M=768)"},
                {6304, 768, 768, true, "qkv fwd"}};
  for (auto& sh : shapes) {
    for (auto dt : {memory::data_type::f32, memory::data_type::bf16}) {
      memory::desc a({sh.m, sh.k}, dt, memory::format_tag::ab);
      memory::desc b({sh.k, sh.n}, dt, sh.tb ? memory::format_tag::ba : memory::format_tag::ab);
      memory::desc c({sh.m, sh.n}, memory::data_type::f32, memory::format_tag::ab);
      matmul::primitive_desc pd(eng, a, b, c);
      matmul prim(pd);
      memory am(a, eng), bm(b, eng), cm(c, eng);
      std::vector<double> t;
      for (int i = 0; i < 6; ++i) {
        double t0 = now();
        prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        s.wait();
        if (i) t.push_back(now() - t0);
      }
      std::sort(t.begin(), t.end());
      double fl = 2.0 * sh.m * sh.n * sh.k;
      std::printf("%-26s %-5s %8.1f ms %7.1f GFLOP/s  (%s)\n", sh.name,
                  dt == memory::data_type::f32 ? "f32" : "bf16", t[t.size() / 2] * 1e3,
                  fl / t[t.size() / 2] / 1e9, pd.impl_info_str());
    }
  }
}
