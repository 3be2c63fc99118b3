// kiln cpu backend: matmul through oneMKL and oneDNN.
//
// Path choice (measured in bench/results, see ../shared/notes/cpu-baseline.md):
// - f32 without batch (or a batch folded into the rows): sgemm (sgemm.h:
//   oneMKL's where built in, else dnnl_sgemm, which oneDNN 2.6 runs
//   1.1-2.5x faster than its f32 matmul primitive on the transposed ViT
//   shapes);
// - f32 with a batch: the matmul primitive, fastest on small batched GEMMs;
// - bf16 on a bf16 unit (AMX or AVX512-BF16): the matmul primitive, f32
//   accumulation, bf16 or f32 output; on AMX a linear's GEMMs run on kiln's
//   own kernels where they fit (the forward and input gradient, with their
//   epilogue: amx_linear; the weight gradient Aᵀ·B: amx_weight_gradient),
//   the other linears with the weight reordered into oneDNN's blocked layout
//   first (blocks_weights); where
//   the CPU has no bf16 unit (AVX2-only CPUs, AVX-512 without BF16, or
//   ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16), the bf16 operands are widened
//   to f32 (exactly) and run on the f32 path: the same products of
//   bf16-rounded values, summed in f32, at the f32 rate;
// - f64: a plain blocked loop (reference precision for gradient checks).
// Primitives are created once per shape and cached.
#include "backend/cpu/avx512.h"  // first: see its note on GCC's warnings

#include <algorithm>
#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/sgemm.h"
#include "backend/cpu/tiles.h"
#include "ops/op_defs.h"

namespace kiln::cpu {
namespace {

struct GemmShape : GemmDims {
  DType in, out;
  std::vector<EpilogueStep> epilogue;  // oneDNN post-ops
  bool operator==(const GemmShape&) const = default;
};

struct GemmShapeHash {
  size_t operator()(const GemmShape& s) const {
    size_t h = 0;
    for (int64_t v : {s.batch_a, s.batch_b, s.m, s.n, s.k, int64_t(s.ta), int64_t(s.tb),
                      int64_t(s.in), int64_t(s.out)})
      h = h * 1000003u ^ static_cast<size_t>(v);
    for (const auto& st : s.epilogue)
      h = h * 1000003u ^ (static_cast<size_t>(st.op) * 64 + static_cast<size_t>(st.read) * 8 +
                          static_cast<size_t>(st.operand + 1));
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
  std::vector<dnnl::memory::desc> operand_mds;  // one per binary post-op
  bool bias = false;                            // the first epilogue step is the primitive's bias
  bool transposed = false;                      // runs as Cᵀ = Bᵀ·A (runs_transposed)
  // Where B is reordered first into the primitive's own layout
  // (blocks_weights): B's plain descriptor and the reorder into the layout.
  std::optional<dnnl::memory::desc> plain_b_md;
  std::optional<dnnl::reorder> reorder_b;
};

// Whether a weight-gradient GEMM, C [m, n] = Aᵀ·B with A [k, m] and B [k, n]
// (k the batch's rows), runs as its transpose Cᵀ [n, m] = Bᵀ·A into a
// buffer of its own, then transposed into C: on AMX oneDNN 2.6's brgemm runs
// these faster with the longer side as the rows, e.g. fc2's dW of ViT-S
// (m = 384, n = 1536, k = 6304) at 1.43 against 1.07 TFLOP/s, and with its
// operands out of cache (as in a training step) 1.05 against 0.88:
// bench/results/2026-12-06-bf16-xeon-amx/. The same sums, in another order.
// (The shape is checked first, and MatmulCache::get asks before it takes its
// lock: bf16_gemm_unit's probe is a GEMM of its own.)
bool runs_transposed(const GemmShape& s) {
  if (!(s.in == DType::bf16 && s.ta && !s.tb && s.m < s.n && s.batch_a == 1 && s.batch_b == 1 &&
        s.epilogue.empty()))
    return false;
  static const bool amx = bf16_gemm_unit() == "AMX";
  return amx;
}

// Whether a bf16 GEMM C [m, n] = A·B, B [k, n] or Bᵀ (the weight of a
// linear's forward or input-gradient GEMM: B no larger than A), runs with B
// reordered first, each call, into the blocked layout oneDNN's brgemm asks
// for (its weights in format `any`), rather than read where it is. On AMX
// oneDNN 2.6 runs ViT-S's forward and dX GEMMs 15-50% faster that way, the
// reorder included (bench/results/2026-12-07-blocked-weights/). The same
// sums: only B's layout differs. Weight gradients (A transposed, B the
// batch's activations) stay as they are: reordering a large B costs more
// than it saves. (Asked before MatmulCache::get takes its lock, as
// runs_transposed.)
bool blocks_weights(const GemmShape& s) {
  if (!(s.in == DType::bf16 && !s.ta && s.batch_a == 1 && s.batch_b == 1 && s.n <= s.m))
    return false;
  static const bool amx = bf16_gemm_unit() == "AMX";
  return amx;
}

// Whether epilogue step 0 runs as the matmul's bias argument (an f32 row
// added to the accumulator) rather than a binary post-op: the same sum, 5-15%
// faster on ViT's forward GEMMs in bf16 on AMX with oneDNN 2.6:
// bench/results/2026-12-03-attention-rows-and-matmul-bias-ab-cpu/.
bool bias_first(const std::vector<EpilogueStep>& steps) {
  return !steps.empty() && steps[0].op == Op::Add && steps[0].read == FusedRead::Row &&
         steps[0].operand >= 0;
}

// The oneDNN post-op that runs an epilogue step of `op`, if oneDNN has one:
// the epilogue steps a batched MatmulEpilogue can run (supports_epilogue).
struct PostOp {
  bool binary;
  dnnl::algorithm alg;
  float alpha = 0, beta = 0;
};
std::optional<PostOp> post_op_for(Op op) {
  using alg = dnnl::algorithm;
  switch (op) {
    case Op::Add: return PostOp{true, alg::binary_add};
    case Op::Sub: return PostOp{true, alg::binary_sub};
    case Op::Mul: return PostOp{true, alg::binary_mul};
    case Op::Div: return PostOp{true, alg::binary_div};
    case Op::Maximum: return PostOp{true, alg::binary_max};
    case Op::Minimum: return PostOp{true, alg::binary_min};
    case Op::Gelu: return PostOp{false, alg::eltwise_gelu_erf};
    case Op::GeluTanh: return PostOp{false, alg::eltwise_gelu_tanh};
    case Op::Relu: return PostOp{false, alg::eltwise_relu};
    case Op::Tanh: return PostOp{false, alg::eltwise_tanh};
    case Op::Exp: return PostOp{false, alg::eltwise_exp};
    case Op::Abs: return PostOp{false, alg::eltwise_abs};
    case Op::Neg: return PostOp{false, alg::eltwise_linear, -1.0f, 0.0f};
    default: return std::nullopt;
  }
}

void append_post_op(dnnl::post_ops& ops, const EpilogueStep& st, const dnnl::memory::desc& md) {
  const auto po = post_op_for(st.op);
  if (!po) fail("MatmulEpilogue", std::string("no oneDNN post-op for ") + op_name(st.op));
  if (po->binary)
    ops.append_binary(po->alg, md);
  else
    ops.append_eltwise(1.0f, po->alg, po->alpha, po->beta);
}

class MatmulCache {
 public:
  const CachedMatmul& get(const GemmShape& s) {
    const bool transposed = runs_transposed(s);
    const bool blocked = !transposed && blocks_weights(s);
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
    if (blocked) {
      // Rank 2: oneDNN 2.6 keeps a rank-3 B of a batch of 1 in its plain
      // layout where it is `any`.
      a_dims = {s.m, s.k}, b_dims = {s.k, s.n}, c_dims = {s.m, s.n};
      a_strides = {s.k, 1}, b_strides = s.tb ? dims{1, s.k} : dims{s.n, 1}, c_strides = {s.n, 1};
    }
    dnnl::memory::desc a_md(a_dims, dnnl_type(s.in), a_strides);
    dnnl::memory::desc b_md(b_dims, dnnl_type(s.in), b_strides);
    dnnl::memory::desc c_md(c_dims, dnnl_type(s.out), c_strides);
    // The operands of the epilogue: a whole [.., m, n], a row or a scalar.
    const auto epilogue_md = [&](FusedRead read) {
      dims d = read == FusedRead::Whole ? c_dims
               : read == FusedRead::Row ? dims{1, 1, s.n}
                                        : dims{1, 1, 1};
      if (blocked && read != FusedRead::Whole) d.erase(d.begin());
      return dnnl::memory::desc(
          d, dnnl::memory::data_type::f32,
          blocked ? dnnl::memory::format_tag::ab : dnnl::memory::format_tag::abc);
    };
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (transposed) {
      // src: B [k, n] read as Bᵀ; weights: A [k, m]; dst: Cᵀ [n, m], which
      // run_primitive transposes into C (oneDNN 2.6's brgemm writes only
      // plain results). Kept only where brgemm runs it.
      dnnl::memory::desc ta_md(dims{s.n, s.k}, dnnl_type(s.in), dims{1, s.n});
      dnnl::memory::desc tb_md(dims{s.k, s.m}, dnnl_type(s.in), dims{s.m, 1});
      dnnl::memory::desc tc_md(dims{s.n, s.m}, dnnl_type(s.out), dims{s.m, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ta_md, tb_md, tc_md), attr, cpu_engine());
      if (std::string(pd.impl_info_str()).rfind("brg", 0) == 0) {
        CachedMatmul entry{pd, dnnl::matmul(pd), pd.scratchpad_desc().get_size(), {}, false, true};
        return cache_.emplace(s, std::move(entry)).first->second;
      }
    }
    std::vector<dnnl::memory::desc> operand_mds;
    const bool bias = bias_first(s.epilogue);
    dnnl::memory::desc bias_md;
    if (bias) bias_md = epilogue_md(FusedRead::Row);
    if (s.epilogue.size() > (bias ? 1u : 0u)) {
      dnnl::post_ops ops;
      for (size_t i = bias ? 1 : 0; i < s.epilogue.size(); ++i) {
        const EpilogueStep& st = s.epilogue[i];
        dnnl::memory::desc md;
        if (st.operand >= 0) {
          md = epilogue_md(st.read);
          operand_mds.push_back(md);
        }
        append_post_op(ops, st, md);
      }
      attr.set_post_ops(ops);
    }
    const dnnl::memory::desc pd_b_md =
        blocked ? dnnl::memory::desc(b_dims, dnnl_type(s.in), dnnl::memory::format_tag::any) : b_md;
    dnnl::matmul::primitive_desc pd(bias ? dnnl::matmul::desc(a_md, pd_b_md, bias_md, c_md)
                                         : dnnl::matmul::desc(a_md, pd_b_md, c_md),
                                    attr, cpu_engine());
    CachedMatmul entry{pd, dnnl::matmul(pd), pd.scratchpad_desc().get_size(),
                       std::move(operand_mds), bias};
    if (blocked && pd.weights_desc() != b_md) {
      entry.plain_b_md = b_md;
      entry.reorder_b.emplace(
          dnnl::reorder::primitive_desc(cpu_engine(), b_md, cpu_engine(), pd.weights_desc()));
    }
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

// operands: the data of each binary epilogue step, in step order.
void run_primitive(const GemmShape& s, const void* a, const void* b, void* c,
                   const std::vector<const void*>& operands = {}) {
  const CachedMatmul& mm = matmul_cache().get(s);
  std::optional<Buffer> ct;  // Cᵀ, for a GEMM that runs transposed
  void* dst = c;
  if (mm.transposed) {
    std::swap(a, b);
    ct.emplace(&cpu_allocator(), std::max<size_t>(s.m * s.n * size_of(s.out), 1), Device::cpu());
    dst = ct->data();
  }
  thread_local dnnl::stream stream(cpu_engine());
  auto& eng = cpu_engine();
  dnnl::memory am(mm.pd.src_desc(), eng, const_cast<void*>(a));
  std::optional<Buffer> blocked_b;  // B in the primitive's layout (blocks_weights)
  if (mm.reorder_b) {
    blocked_b.emplace(&cpu_allocator(), mm.pd.weights_desc().get_size(), Device::cpu());
    dnnl::memory plain(*mm.plain_b_md, eng, const_cast<void*>(b));
    dnnl::memory blocked(mm.pd.weights_desc(), eng, blocked_b->data());
    mm.reorder_b->execute(stream, plain, blocked);
    b = blocked_b->data();
  }
  dnnl::memory bm(mm.pd.weights_desc(), eng, const_cast<void*>(b));
  dnnl::memory cm(mm.pd.dst_desc(), eng, dst);
  // Scratchpad from kiln's caching allocator: no fresh pages per call.
  Buffer scratch(&cpu_allocator(), std::max<size_t>(mm.scratchpad_bytes, 1), Device::cpu());
  dnnl::memory sm(mm.pd.scratchpad_desc(), eng, scratch.data());
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}};
  size_t first = 0;  // the first post-op's epilogue step
  if (mm.bias) {
    args.emplace(DNNL_ARG_BIAS,
                 dnnl::memory(mm.pd.bias_desc(), eng, const_cast<void*>(operands[0])));
    first = 1;
  }
  for (size_t i = first, bin = first; i < s.epilogue.size(); ++i) {
    if (s.epilogue[i].operand < 0) continue;
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i - first)) | DNNL_ARG_SRC_1,
                 dnnl::memory(mm.operand_mds[bin - first], eng, const_cast<void*>(operands[bin])));
    ++bin;
  }
  mm.prim.execute(stream, args);
  stream.wait();
  if (!mm.transposed) return;
  if (s.out == DType::f32)
    transpose_tiles(static_cast<const float*>(dst), 1, s.m, s.n, static_cast<float*>(c));
  else
    transpose_tiles(static_cast<const uint16_t*>(dst), 1, s.m, s.n, static_cast<uint16_t*>(c));
}

// An f32 copy of a bf16 array (exact: every bf16 is an f32), in a buffer
// of the caching allocator.
struct WidenedBf16 {
  Buffer buffer;
  explicit WidenedBf16(const Array& x)
      : buffer(&cpu_allocator(), std::max<int64_t>(numel(x.shape()), 1) * sizeof(float),
               Device::cpu()) {
    const bf16* src = x.data<bf16>();
    float* dst = static_cast<float*>(buffer.data());
    parallel_for(numel(x.shape()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<float>(src[i]);
    });
  }
  const void* data() const { return buffer.data(); }
};

// The bf16 rounding of n f32 values (a widened GEMM's result) into y.
void narrow_into(const float* x, int64_t n, void* y) {
  uint16_t* dst = static_cast<uint16_t*>(y);
  parallel_for(n, 1, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) dst[i] = narrow_bf16(x[i]);
  });
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

// bf16 GEMMs of a few rows (a decode step's: one token's activations against
// the weights), f32 accumulation, each weight read once at the memory's
// rate: oneDNN's bf16 matmul ran GPT-2's M = 1 shapes at about a third of it
// (8.6 GB/s against sgemm's 20 on the same f32 shapes: 2026-12-06, Xeon with
// AMX), and a CPU without a bf16 unit would widen the whole weight each call.
constexpr int64_t kSmallRows = 4;
bool small_bf16(const GemmShape& s) {
  return s.in == DType::bf16 && s.batch_a == 1 && s.batch_b == 1 && !s.ta && s.m <= kSmallRows;
}

inline float widen_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if KILN_CPU_AVX512
// A software prefetch of the weights 16 KiB ahead of the line being read:
// two threads streaming GPT-2's per-layer weights (1 to 5 MB each) read them
// at 19.7 GB/s on the hardware prefetchers alone and 24 with it (4 or 8 KiB
// ahead: 16; 2026-12-06, Xeon, 2 vCPUs). Past a block's end it
// warms the next one's start (a prefetch never faults).
constexpr int64_t kPrefetchBytes = 16384;
inline void prefetch_ahead(const uint16_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}
#endif

// C [m, n] (f32) = A [m, k] · B, B [k, n] or (tb) [n, k], all bf16.
void gemm_small_bf16(const GemmShape& s, const void* a_data, const void* b_data, float* c) {
  const int64_t m = s.m, n = s.n, k = s.k;
  const auto* A = static_cast<const uint16_t*>(a_data);
  const auto* B = static_cast<const uint16_t*>(b_data);
  std::vector<float> a(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) a[i] = widen_bf16(A[i]);
  if (s.tb) {
    // One dot product per row of B.
    parallel_for(n, 2 * k * m, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const uint16_t* row = B + j * k;
        for (int64_t i = 0; i < m; ++i) {
          const float* ai = a.data() + i * k;
          float sum = 0;
          int64_t p = 0;
#if KILN_CPU_AVX512
          __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
          for (; p + 32 <= k; p += 32) {
            if (i == 0) prefetch_ahead(row + p);
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(ai + p), avx512::load_bf16(row + p), s0);
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(ai + p + 16), avx512::load_bf16(row + p + 16), s1);
          }
          sum = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#endif
          for (; p < k; ++p) sum += ai[p] * widen_bf16(row[p]);
          c[i * n + j] = sum;
        }
      }
    });
    return;
  }
#if KILN_CPU_AVX512
  if (m == 1 && n <= 16384) {
    // B streamed whole rows at a time (at the memory's rate: a block of
    // columns per thread strides through it and reads half as fast), a
    // partial sum of the rows of each of a few chunks, then the chunks added.
    const int64_t chunks = std::min<int64_t>(k, 8);
    std::vector<float> part(static_cast<size_t>(chunks * n), 0.0f);
    parallel_for(chunks, 2 * n * k / chunks, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        float* acc = part.data() + ch * n;
        for (int64_t p = k * ch / chunks; p < k * (ch + 1) / chunks; ++p) {
          const __m512 av = _mm512_set1_ps(a[p]);
          const uint16_t* row = B + p * n;
          int64_t j = 0;
          for (; j + 16 <= n; j += 16) {
            if (j % 32 == 0) prefetch_ahead(row + j);
            _mm512_storeu_ps(acc + j, _mm512_fmadd_ps(av, avx512::load_bf16(row + j),
                                                      _mm512_loadu_ps(acc + j)));
          }
          for (; j < n; ++j) acc[j] += a[p] * widen_bf16(row[j]);
        }
      }
    });
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {  // the chunks added in order, as below
      __m512 sum = _mm512_setzero_ps();
      for (int64_t ch = 0; ch < chunks; ++ch)
        sum = _mm512_add_ps(sum, _mm512_loadu_ps(part.data() + ch * n + j));
      _mm512_storeu_ps(c + j, sum);
    }
    for (; j < n; ++j) {
      float sum = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) sum += part[ch * n + j];
      c[j] = sum;
    }
    return;
  }
#endif
  // A block of columns per task: each row of B's block scaled into its sums.
  constexpr int64_t kBlock = 512;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, 2 * kBlock * k * m, [&](int64_t b0, int64_t b1) {
    float acc[kSmallRows][kBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t j0 = blk * kBlock, w = std::min(kBlock, n - j0);
      for (int64_t i = 0; i < m; ++i) std::fill(acc[i], acc[i] + w, 0.0f);
      for (int64_t p = 0; p < k; ++p) {
        const uint16_t* row = B + p * n + j0;
        for (int64_t i = 0; i < m; ++i) {
          const float av = a[i * k + p];
          float* ac = acc[i];
#pragma omp simd
          for (int64_t j = 0; j < w; ++j) ac[j] += av * widen_bf16(row[j]);
        }
      }
      for (int64_t i = 0; i < m; ++i) std::copy(acc[i], acc[i] + w, c + i * n + j0);
    }
  });
}

// An f32 GEMM with an f32 result: sgemm without a batch, else the primitive.
void gemm_f32(const GemmShape& s, const void* a, const void* b, void* c) {
  if (s.batch_a == 1 && s.batch_b == 1)
    return sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, static_cast<const float*>(a), s.ta ? s.m : s.k,
                 static_cast<const float*>(b), s.tb ? s.k : s.n, 0.0f, static_cast<float*>(c),
                 s.n, "matmul");
  run_primitive(s, a, b, c);
}

GemmShape gemm_shape(const MatmulAttrs& attrs, const Array& a, const Array& b) {
  GemmShape s;
  static_cast<GemmDims&>(s) =
      matmul_dims(a.shape(), b.shape(), attrs.transpose_a, attrs.transpose_b, "matmul");
  s.in = a.dtype();
  s.out = attrs.out;
  // A batch against a rank-2 right operand is one GEMM with batch*M rows.
  if (b.ndim() == 2 && a.ndim() > 2 && !s.ta) {
    s.m *= s.batch_a;
    s.batch_a = 1;
  }
  return s;
}

// A bf16 weight gradient C [m, n] = Aᵀ·B (A [k, m], B [k, n], k the batch's
// rows) on kiln's AMX kernel (tiles::gemm_at_b) where it fits: oneDNN
// 2.6's brgemm runs ViT's weight gradients at 1.1-1.5 TFLOP/s, packing the
// transposed operand as it goes (bench/results/2026-12-07-amx-weight-gradients/).
// The sums in f32, each along k in order, then rounded once for a bf16 C.
// Returns false where it does not run (the GEMM goes to oneDNN).
constexpr int64_t kAtbMinK = 256;
bool amx_weight_gradient(const GemmShape& s, const void* a, const void* b, void* c) {
  if (!(s.in == DType::bf16 && s.ta && !s.tb && s.batch_a == 1 && s.batch_b == 1 &&
        s.epilogue.empty() && s.k >= kAtbMinK && tiles::gemm_at_b_fits(s.m, s.n)))
    return false;
  tiles::gemm_at_b(s.k, s.m, s.n, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b),
                   c, s.out == DType::bf16);
  return true;
}

// A bf16 linear's forward or input-gradient GEMM, C [m, n] = A·B with B
// [k, n] (or Bᵀ) no larger than A, on kiln's AMX kernel (tiles::gemm_ab)
// where it fits, with the epilogue (steps, operands as run_primitive takes
// them) on each block of C's rows as it is made, then C written once (f32,
// or rounded once to bf16; every post-op's op is one run_pointwise runs).
// oneDNN 2.6's brgemm ran ViT-S's forward GEMMs at 0.7-1.2 TFLOP/s inside a
// training step (1.9-2.2 alone): their activations come from memory, and
// the residual is read and the result written after the sums. The same sums
// in the same order as oneDNN's (the Fashion-MNIST recipe's losses are the
// same to the last printed digit); the step 10% faster
// (bench/results/2026-12-07-amx-linears/). Returns false where it does not
// run (the GEMM goes to oneDNN).
bool amx_linear(const GemmShape& s, const void* a, const void* b, void* c,
                const std::vector<const void*>& operands) {
  if (!(s.in == DType::bf16 && !s.ta && s.batch_a == 1 && s.batch_b == 1 && s.n <= s.m &&
        tiles::gemm_ab_fits(s.m, s.n, s.k)))
    return false;
  for (const auto& st : s.epilogue)
    if (!post_op_for(st.op)) return false;
  const int64_t n = s.n;
  const bool f32 = s.out == DType::f32;
  // The common epilogues (adds of a row or of a whole f32 operand: a bias, a
  // residual) done by the kernel as it writes C.
  tiles::LinearOut out{c, !f32};
  bool simple = s.epilogue.size() <= 4;
  for (const auto& st : s.epilogue) {
    simple = simple && st.op == Op::Add && st.operand >= 0 && st.read != FusedRead::Scalar;
    if (!simple) break;
    out.add[out.adds] = static_cast<const float*>(operands[st.operand]);
    out.whole[out.adds++] = st.read == FusedRead::Whole;
  }
  if (simple) {
    tiles::gemm_ab(s.m, n, s.k, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b),
                   s.tb, out);
    return true;
  }
  tiles::gemm_ab(
      s.m, n, s.k, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), s.tb,
      [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* cs, int64_t ldc) {
        float scalar[64];
        for (int64_t r = 0; r < rows; ++r) {
          float* y = cs + r * ldc;
          for (const auto& st : s.epilogue) {
            const float* x = nullptr;
            if (st.operand >= 0) {
              const float* src = static_cast<const float*>(operands[st.operand]);
              if (st.read == FusedRead::Whole) {
                x = src + (i0 + r) * n + j0;
              } else if (st.read == FusedRead::Row) {
                x = src + j0;
              } else {
                std::fill(scalar, scalar + 64, src[0]);
                for (int64_t j = 0; j < cols; j += 64)
                  run_pointwise(st.op, y + j, y + j, scalar, std::min<int64_t>(64, cols - j));
                continue;
              }
            }
            run_pointwise(st.op, y, y, x, cols);
          }
          if (f32) {
            std::copy(y, y + cols, static_cast<float*>(c) + (i0 + r) * n + j0);
          } else {
            uint16_t* d = static_cast<uint16_t*>(c) + (i0 + r) * n + j0;
#pragma omp simd
            for (int64_t j = 0; j < cols; ++j) d[j] = narrow_bf16(y[j]);
          }
        }
      });
  return true;
}

// A bf16 GEMM of a long reduction (k larger than m and n, and not a multiple
// of 32, so kiln's AMX kernels do not take it) on oneMKL's bf16 GEMM, f32 sums
// rounded once for a bf16 result: a language model's head's input gradient,
// dX = dlogits · W over its vocabulary (GPT-2 124M at 4 x 1024 tokens:
// 4096 x 768 from k = 50257), which oneDNN 2.6's brgemm ran at 1.06
// TFLOP/s, W reordered first, and oneMKL at 1.8 (PyTorch 2.15's oneDNN
// 3.13: 2.5). On AMX only: oneMKL ran the attention's bf16 GEMMs at a third
// of oneDNN's rate on a Zen 4's AVX512-BF16. Returns false where it does not
// run. (bench/results/2026-12-07-gpt2-sdpa-tiles/)
bool long_reduction_on_onemkl(const GemmShape& s, const void* a, const void* b, void* c) {
  if (!(s.in == DType::bf16 && s.batch_a == 1 && s.batch_b == 1 && s.epilogue.empty() &&
        s.k > s.m && s.k > s.n && s.k % 32 != 0 && have_onemkl() && gemm_bf16_native()))
    return false;
  static const bool amx = bf16_gemm_unit() == "AMX";
  if (!amx) return false;
  const auto* a16 = static_cast<const uint16_t*>(a);
  const auto* b16 = static_cast<const uint16_t*>(b);
  const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  if (s.out == DType::f32) {
    gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a16, lda, b16, ldb, 0.0f, static_cast<float*>(c),
              s.n, "matmul");
    return true;
  }
  Buffer sums(&cpu_allocator(), s.m * s.n * sizeof(float), Device::cpu());
  float* f = static_cast<float*>(sums.data());
  gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a16, lda, b16, ldb, 0.0f, f, s.n, "matmul");
  narrow_into(f, s.m * s.n, c);
  return true;
}

void matmul_kernel(const KernelContext&, const Primitive& p,
                   const std::vector<Array>& in, ArrayNode& out) {
  const Array &a = in[0], &b = in[1];
  GemmShape s = gemm_shape(p.attrs<MatmulAttrs>(), a, b);
  void* c = alloc_output(out);
  if (numel(out.shape) == 0) return;
  if (s.k == 0) {
    std::memset(c, 0, numel(out.shape) * size_of(out.dtype));
    return;
  }
  if (s.in == DType::f64)
    return gemm_f64(s, a.data<double>(), b.data<double>(), static_cast<double*>(c));
  if (small_bf16(s)) {
    if (s.out == DType::f32) return gemm_small_bf16(s, a.raw(), b.raw(), static_cast<float*>(c));
    const int64_t n = numel(out.shape);
    Buffer wc(&cpu_allocator(), n * sizeof(float), Device::cpu());
    gemm_small_bf16(s, a.raw(), b.raw(), static_cast<float*>(wc.data()));
    return narrow_into(static_cast<const float*>(wc.data()), n, c);
  }
  if (s.in == DType::bf16 && !native_bf16_gemm()) {
    WidenedBf16 wa(a), wb(b);
    s.in = DType::f32;
    if (s.out == DType::f32) return gemm_f32(s, wa.data(), wb.data(), c);
    int64_t n = numel(out.shape);
    Buffer wc(&cpu_allocator(), n * sizeof(float), Device::cpu());
    s.out = DType::f32;
    gemm_f32(s, wa.data(), wb.data(), wc.data());
    narrow_into(static_cast<const float*>(wc.data()), n, c);
    return;
  }
  if (s.in == DType::f32) return gemm_f32(s, a.raw(), b.raw(), c);
  if (amx_weight_gradient(s, a.raw(), b.raw(), c)) return;
  if (amx_linear(s, a.raw(), b.raw(), c, {})) return;
  if (long_reduction_on_onemkl(s, a.raw(), b.raw(), c)) return;
  run_primitive(s, a.raw(), b.raw(), c);
}

// Applies epilogue steps in place to c [rows, cols], a block of rows at a
// time while it is in cache (the sgemm path, which has no post-ops).
void apply_epilogue(float* c, int64_t rows, int64_t cols, const std::vector<EpilogueStep>& steps,
                    const std::vector<const float*>& operands) {
  const int64_t block = std::max<int64_t>(1, 4096 / cols);
  parallel_for((rows + block - 1) / block, block * cols * static_cast<int64_t>(steps.size()),
               [&](int64_t b0, int64_t b1) {
                 std::vector<float> tmp(cols);
                 for (int64_t r = b0 * block; r < std::min(rows, b1 * block); ++r) {
                   float* y = c + r * cols;
                   for (const auto& st : steps) {
                     const float* x = nullptr;
                     if (st.operand >= 0) {
                       const float* src = operands[st.operand];
                       if (st.read == FusedRead::Whole) {
                         x = src + r * cols;
                       } else if (st.read == FusedRead::Row) {
                         x = src;
                       } else {
                         std::fill(tmp.begin(), tmp.end(), src[0]);
                         x = tmp.data();
                       }
                     }
                     run_pointwise(st.op, y, y, x, cols);
                   }
                 }
               });
}

// A matmul with its elementwise epilogue. Batched GEMMs run on oneDNN's
// matmul primitive with the epilogue as post-ops: the result is stored once,
// after the epilogue, instead of written and read back. Unbatched f32 GEMMs
// stay on sgemm (faster than the primitive on several ViT shapes): a
// leading scale becomes sgemm's alpha and the rest runs after the GEMM in one
// in-place pass over the result (every step on a block of rows while it is in
// cache), without a separate kernel or intermediate buffer. (Interleaving the
// pass with the GEMM per row panel was measured and gained nothing:
// bench/results/2026-11-30-cpu-analysis-s6.md.)
void run_epilogue(GemmShape s, const EpilogueAttrs& attrs, const void* a_data, const void* b_data,
                  void* c, const std::vector<const void*>& operands);

void matmul_epilogue_kernel(const KernelContext&, const Primitive& p,
                            const std::vector<Array>& in, ArrayNode& out) {
  const auto& attrs = p.attrs<EpilogueAttrs>();
  const Array &a = in[0], &b = in[1];
  GemmShape s = gemm_shape(attrs.mm, a, b);
  const bool narrow = out.dtype == DType::bf16;
  if (s.in == DType::f64 || s.k == 0 || s.out != out.dtype ||
      !(out.dtype == DType::f32 || (narrow && s.in == DType::bf16)))
    fail("MatmulEpilogue",
         "needs f32 or bf16 operands with k > 0 and an f32 result (or bf16, from bf16)");
  std::vector<const void*> operands;
  for (const auto& st : attrs.steps)
    if (st.operand >= 0) {
      const Array& x = in[2 + st.operand];
      if (x.dtype() != DType::f32) fail("MatmulEpilogue", "epilogue operands must be f32");
      operands.push_back(x.raw());
    }
  void* c = alloc_output(out);
  if (numel(out.shape) == 0) return;
  if (small_bf16(s)) {
    // The GEMM in f32, the whole epilogue on its rows, rounded once if bf16.
    std::optional<Buffer> wide;
    float* y =
        narrow ? static_cast<float*>(
                     wide.emplace(&cpu_allocator(), numel(out.shape) * sizeof(float), Device::cpu())
                         .data())
               : static_cast<float*>(c);
    gemm_small_bf16(s, a.raw(), b.raw(), y);
    std::vector<const float*> ops;
    for (const void* o : operands) ops.push_back(static_cast<const float*>(o));
    apply_epilogue(y, s.m, s.n, attrs.steps, ops);
    if (narrow) narrow_into(y, numel(out.shape), c);
    return;
  }
  const void *a_data = a.raw(), *b_data = b.raw();
  std::optional<WidenedBf16> wa, wb;
  // Widened bf16 with a bf16 result: the f32 epilogue into a buffer, then
  // rounded once into the output.
  std::optional<Buffer> wide_c;
  void* bf16_out = nullptr;
  if (s.in == DType::bf16 && !native_bf16_gemm()) {
    a_data = wa.emplace(a).data(), b_data = wb.emplace(b).data();
    s.in = DType::f32;
    if (narrow) {
      bf16_out = c;
      c = wide_c.emplace(&cpu_allocator(), numel(out.shape) * sizeof(float), Device::cpu()).data();
      s.out = DType::f32;
    }
  }
  run_epilogue(s, attrs, a_data, b_data, c, operands);
  if (bf16_out) narrow_into(static_cast<const float*>(c), numel(out.shape), bf16_out);
}

void run_epilogue(GemmShape s, const EpilogueAttrs& attrs, const void* a_data, const void* b_data,
                  void* c, const std::vector<const void*>& operands) {
  if (s.in == DType::f32 && s.batch_a == 1 && s.batch_b == 1) {
    std::vector<EpilogueStep> rest = attrs.steps;
    std::vector<const float*> ops;
    for (const void* o : operands) ops.push_back(static_cast<const float*>(o));
    float alpha = 1.0f;
    if (rest[0].op == Op::Mul && rest[0].read == FusedRead::Scalar) {
      alpha = ops[rest[0].operand][0];
      rest.erase(rest.begin());
    }
    sgemm(s.ta, s.tb, s.m, s.n, s.k, alpha, static_cast<const float*>(a_data), s.ta ? s.m : s.k,
          static_cast<const float*>(b_data), s.tb ? s.k : s.n, 0.0f, static_cast<float*>(c), s.n,
          "MatmulEpilogue");
    if (!rest.empty()) apply_epilogue(static_cast<float*>(c), s.m, s.n, rest, ops);
    return;
  }
  s.epilogue = attrs.steps;
  if (amx_linear(s, a_data, b_data, c, operands)) return;
  run_primitive(s, a_data, b_data, c, operands);
}

}  // namespace

// oneDNN names its kernel for a bf16 GEMM: brg:avx512_core_amx_bf16 (AMX
// tiles), brg:avx512_core_bf16 (AVX512-BF16 dot products), or gemm:jit (bf16
// converted to f32 inside oneDNN, on AVX-512 CPUs without a bf16 unit or
// where ONEDNN_MAX_CPU_ISA stops at AVX512_CORE). Asked at a size where AMX
// pays (oneDNN keeps tiny GEMMs on AVX512-BF16 even on an AMX CPU).
std::string bf16_gemm_unit() {
  static const std::string unit = []() -> std::string {
    try {
      // Not through MatmulCache, whose choices (blocks_weights) ask this.
      using tag = dnnl::memory::format_tag;
      const dnnl::memory::dims d{1024, 1024};
      const auto bf16 = dnnl::memory::data_type::bf16;
      const dnnl::memory::desc a(d, bf16, tag::ab), b(d, bf16, tag::ba),
          c(d, dnnl::memory::data_type::f32, tag::ab);
      const std::string impl =
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), cpu_engine()).impl_info_str();
      if (impl.find("amx") != std::string::npos) return "AMX";
      if (impl.find("bf16") != std::string::npos) return "AVX512-BF16";
    } catch (const dnnl::error&) {  // no bf16 GEMM at all (AVX2-only CPUs)
    }
    return "";
  }();
  return unit;
}

// bf16 GEMMs go to oneDNN only where they run on a bf16 unit: its gemm:jit
// conversion path runs 4-5x slower than widening the operands and calling
// the f32 GEMM (ViT-S qkv forward 359 against 77 ms on an AVX-512 Xeon
// without AVX512-BF16, bench/results/2026-12-03-bf16-without-bf16-unit-cpu/).
bool native_bf16_gemm() {
  return !bf16_gemm_unit().empty();
}

bool supports_epilogue(const EpilogueAttrs& attrs, const std::vector<DType>& inputs, DType out) {
  if (inputs.size() < 2 || inputs[0] != inputs[1] ||
      (inputs[0] != DType::f32 && inputs[0] != DType::bf16))
    return false;
  // f32 results; bf16 ones from bf16 operands (a cast the compiler folded in).
  if (out != attrs.mm.out ||
      !(out == DType::f32 || (out == DType::bf16 && inputs[0] == DType::bf16)))
    return false;
  for (size_t i = 2; i < inputs.size(); ++i)
    if (inputs[i] != DType::f32) return false;
  // oneDNN takes at most 32 post-ops (post_ops_t::post_ops_limit); a longer
  // chain ends its epilogue there and the rest runs as fused elementwise ops.
  constexpr size_t kMaxPostOps = 32;
  if (attrs.steps.size() > kMaxPostOps) return false;
  for (const auto& st : attrs.steps)
    if (!post_op_for(st.op) || post_op_for(st.op)->binary != (st.operand >= 0)) return false;
  return true;
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, DType in, DType out, const void* a,
          const void* b, void* c) {
  const GemmShape s{{m, n, k, 1, 1, ta, tb}, in, out, {}};
  if (in == DType::f32 && out == DType::f32) return gemm_f32(s, a, b, c);
  if (in != DType::bf16 || !native_bf16_gemm() || (out != DType::f32 && out != DType::bf16))
    fail("gemm", std::string("no GEMM of ") + name_of(in) + " operands with a " + name_of(out) +
                     " result on this cpu");
  run_primitive(s, a, b, c);
}

void register_matmul(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Matmul)] = matmul_kernel;
  t.kernels[static_cast<int>(Op::MatmulEpilogue)] = matmul_epilogue_kernel;
}

}  // namespace kiln::cpu
