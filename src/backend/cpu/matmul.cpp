// kiln cpu backend: matmul through oneDNN.
//
// Path choice (measured in bench/results, see ../shared/notes/cpu-baseline.md):
// - f32 without batch (or a batch folded into the rows): dnnl_sgemm, which
//   oneDNN 2.6 runs 1.1-2.5x faster than its f32 matmul primitive on the
//   transposed ViT shapes;
// - f32 with a batch: the matmul primitive, fastest on small batched GEMMs;
// - bf16 (AMX where the CPU has it): the matmul primitive, f32 accumulation,
//   bf16 or f32 output;
// - f64: a plain blocked loop (reference precision for gradient checks).
// Primitives are created once per shape and cached.
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "backend/cpu/kernels.h"

namespace kiln::cpu {
namespace {

struct GemmShape {
  int64_t batch_a, batch_b, m, n, k;
  bool ta, tb;
  DType in, out;
  bool operator==(const GemmShape&) const = default;
};

struct GemmShapeHash {
  size_t operator()(const GemmShape& s) const {
    size_t h = 0;
    for (int64_t v : {s.batch_a, s.batch_b, s.m, s.n, s.k, int64_t(s.ta), int64_t(s.tb),
                      int64_t(s.in), int64_t(s.out)})
      h = h * 1000003u ^ static_cast<size_t>(v);
    return h;
  }
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::memory::data_type dnnl_type(DType dt) {
  switch (dt) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    default: fail("matmul", std::string("no oneDNN type for ") + name_of(dt));
  }
}

struct CachedMatmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  size_t scratchpad_bytes;
};

class MatmulCache {
 public:
  const CachedMatmul& get(const GemmShape& s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(s);
    if (it != cache_.end()) return it->second;
    using dims = dnnl::memory::dims;
    int64_t b = std::max(s.batch_a, s.batch_b);
    // Logical [batch, M, K] x [batch, K, N]; transposition is a choice of strides.
    dims a_dims{s.batch_a, s.m, s.k}, b_dims{s.batch_b, s.k, s.n}, c_dims{b, s.m, s.n};
    dims a_strides = s.ta ? dims{s.m * s.k, 1, s.m} : dims{s.m * s.k, s.k, 1};
    dims b_strides = s.tb ? dims{s.k * s.n, 1, s.k} : dims{s.k * s.n, s.n, 1};
    dims c_strides{s.m * s.n, s.n, 1};
    dnnl::memory::desc a_md(a_dims, dnnl_type(s.in), a_strides);
    dnnl::memory::desc b_md(b_dims, dnnl_type(s.in), b_strides);
    dnnl::memory::desc c_md(c_dims, dnnl_type(s.out), c_strides);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
    CachedMatmul entry{pd, dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
    return cache_.emplace(s, std::move(entry)).first->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<GemmShape, CachedMatmul, GemmShapeHash> cache_;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}

void run_primitive(const GemmShape& s, const void* a, const void* b, void* c) {
  const CachedMatmul& mm = matmul_cache().get(s);
  thread_local dnnl::stream stream(cpu_engine());
  auto& eng = cpu_engine();
  dnnl::memory am(mm.pd.src_desc(), eng, const_cast<void*>(a));
  dnnl::memory bm(mm.pd.weights_desc(), eng, const_cast<void*>(b));
  dnnl::memory cm(mm.pd.dst_desc(), eng, c);
  // Scratchpad from kiln's caching allocator: no fresh pages per call.
  Buffer scratch(&cpu_allocator(), std::max<size_t>(mm.scratchpad_bytes, 1), Device::cpu());
  dnnl::memory sm(mm.pd.scratchpad_desc(), eng, scratch.data());
  mm.prim.execute(
      stream,
      {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  stream.wait();
}

void gemm_f64(const GemmShape& s, const double* a, const double* b, double* c) {
  int64_t batch = std::max(s.batch_a, s.batch_b);
  parallel_for(batch * s.m, s.n * s.k, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      int64_t bi = job / s.m, i = job % s.m;
      const double* A = a + (s.batch_a == 1 ? 0 : bi) * s.m * s.k;
      const double* B = b + (s.batch_b == 1 ? 0 : bi) * s.k * s.n;
      double* C = c + (bi * s.m + i) * s.n;
      for (int64_t j = 0; j < s.n; ++j) C[j] = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        double av = s.ta ? A[p * s.m + i] : A[i * s.k + p];
        if (s.tb) {
          for (int64_t j = 0; j < s.n; ++j) C[j] += av * B[j * s.k + p];
        } else {
          const double* Brow = B + p * s.n;
          for (int64_t j = 0; j < s.n; ++j) C[j] += av * Brow[j];
        }
      }
    }
  });
}

void matmul_kernel(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  const auto& attrs = p.attrs<MatmulAttrs>();
  const Array &a = in[0], &b = in[1];
  size_t ra = a.ndim(), rb = b.ndim();
  GemmShape s;
  s.ta = attrs.transpose_a;
  s.tb = attrs.transpose_b;
  s.m = a.shape()[ra - (s.ta ? 1 : 2)];
  s.k = a.shape()[ra - (s.ta ? 2 : 1)];
  s.n = b.shape()[rb - (s.tb ? 2 : 1)];
  s.batch_a = numel(Shape(a.shape().begin(), a.shape().end() - 2));
  s.batch_b = numel(Shape(b.shape().begin(), b.shape().end() - 2));
  s.in = a.dtype();
  s.out = attrs.out;
  // A batch against a rank-2 right operand is one GEMM with batch*M rows.
  if (rb == 2 && ra > 2 && !s.ta) {
    s.m *= s.batch_a;
    s.batch_a = 1;
  }
  void* c = alloc_output(out);
  if (numel(out.shape) == 0) return;
  if (s.k == 0) {
    std::memset(c, 0, numel(out.shape) * size_of(out.dtype));
    return;
  }
  if (s.in == DType::f64)
    return gemm_f64(s, a.data<double>(), b.data<double>(), static_cast<double*>(c));
  if (s.in == DType::f32 && s.batch_a == 1 && s.batch_b == 1) {
    dnnl_status_t st = dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f,
                                  a.data<float>(), s.ta ? s.m : s.k, b.data<float>(),
                                  s.tb ? s.k : s.n, 0.0f, static_cast<float*>(c), s.n);
    if (st != dnnl_success) fail("matmul", "dnnl_sgemm failed with status " + std::to_string(st));
    return;
  }
  run_primitive(s, a.raw(), b.raw(), c);
}

}  // namespace

void register_matmul(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Matmul)] = matmul_kernel;
}

}  // namespace kiln::cpu
