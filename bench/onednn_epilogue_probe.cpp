// How a bf16 matmul's epilogue costs on oneDNN's matmul primitive (Debian's
// oneDNN 2.6, brgemm on AMX) at ViT-S/16's forward shapes (M = 32 * 197):
// the bias as a binary post-op against the primitive's bias argument, the
// residual as a whole-tensor binary post-op against a sum post-op onto a
// preloaded result, and none. Not part of the build:
//   g++ -O2 -std=c++17 -fopenmp bench/onednn_epilogue_probe.cpp -ldnnl -o /tmp/probe
//   OMP_NUM_THREADS=2 /tmp/probe
// Prints the median of 12 runs per variant.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>
using namespace dnnl;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  using dt = memory::data_type;
  struct Shp {
    long m, k, n;
    const char* name;
  } shapes[] = {{6304, 1536, 384, "fc2 fwd"},
                {6304, 384, 384, "proj fwd"},
                {6304, 384, 1536, "fc1 fwd"},
                {6304, 768, 384, "k768"},
                {6304, 1152, 384, "k1152"}};
  for (auto& sh : shapes) {
    for (int v = 0; v < 9; ++v) {
      if (sh.n == 1536 && (v < 3 || v > 6)) continue;
      memory::desc a({1, sh.m, sh.k}, dt::bf16, memory::format_tag::abc);
      memory::desc b({1, sh.k, sh.n}, dt::bf16, memory::format_tag::acb);
      dt out = (v == 6 || sh.n == 1536) ? dt::bf16 : dt::f32;
      memory::desc c({1, sh.m, sh.n}, out, memory::format_tag::abc);
      memory::desc row({1, 1, sh.n}, dt::f32, memory::format_tag::abc);
      memory::desc whole({1, sh.m, sh.n}, dt::f32, memory::format_tag::abc);
      memory::desc bias({1, 1, sh.n}, dt::f32, memory::format_tag::abc);
      primitive_attr attr;
      post_ops po;
      const char* name = "";
      bool use_bias = false, preload = false;
      switch (v) {
        case 0:
          name = "binary row + binary whole";
          po.append_binary(algorithm::binary_add, row);
          po.append_binary(algorithm::binary_add, whole);
          break;
        case 1:
          name = "binary row + sum (preloaded)";
          po.append_binary(algorithm::binary_add, row);
          po.append_sum(1.0f);
          preload = true;
          break;
        case 2:
          name = "bias arg + sum (preloaded)";
          use_bias = true;
          po.append_sum(1.0f);
          preload = true;
          break;
        case 3:
          name = "binary row only";
          po.append_binary(algorithm::binary_add, row);
          break;
        case 4: name = "none"; break;
        case 5:
          name = "bias arg only";
          use_bias = true;
          break;
        case 6:
          name = "binary row only, bf16 out";
          po.append_binary(algorithm::binary_add, row);
          break;
        case 7:
          name = "bias arg + binary whole";
          use_bias = true;
          po.append_binary(algorithm::binary_add, whole);
          break;
        case 8:
          name = "binary whole only";
          po.append_binary(algorithm::binary_add, whole);
          break;
      }
      attr.set_post_ops(po);
      auto d = use_bias ? matmul::desc(a, b, bias, c) : matmul::desc(a, b, c);
      matmul::primitive_desc pd(d, attr, eng);
      matmul prim(pd);
      memory am(a, eng), bm(b, eng), cm(c, eng), rm(row, eng), wm(whole, eng), bim(bias, eng);
      std::memset(am.get_data_handle(), 0x3f, sh.m * sh.k * 2);
      std::memset(bm.get_data_handle(), 0x3f, sh.k * sh.n * 2);
      std::memset(wm.get_data_handle(), 0, sh.m * sh.n * 4);
      std::vector<double> t;
      for (int i = 0; i < 12; ++i) {
        double t0 = now();
        if (preload) std::memcpy(cm.get_data_handle(), wm.get_data_handle(), sh.m * sh.n * 4);
        std::unordered_map<int, memory> args{
            {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
        if (use_bias) args[DNNL_ARG_BIAS] = bim;
        if (v == 0 || v == 1 || v == 3 || v == 6)
          args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = rm;
        if (v == 0) args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1] = wm;
        if (v >= 7) args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = wm;
        prim.execute(s, args);
        s.wait();
        t.push_back(now() - t0);
      }
      std::sort(t.begin(), t.end());
      printf("%-9s %-32s %s  %.2f ms  %.2f TF/s\n", sh.name, name, pd.impl_info_str(), t[6] * 1e3,
             2.0 * sh.m * sh.n * sh.k / t[6] / 1e12);
    }
  }
}
