// kiln cuda backend: Matmul and MatmulEpilogue through cuBLASLt.
//
// kiln's arrays are row-major; cuBLASLt's default layouts are column-major.
// A row-major C [M, N] is the column-major Cᵀ [N, M], and Cᵀ = Bᵀ Aᵀ, so each
// GEMM runs as cuBLASLt's D (N x M) = op(b) (N x K) · op(a) (K x M): kiln's b
// is cuBLASLt's A (transposed where kiln's is), kiln's a its B. A batch is
// cuBLASLt's strided batch; an operand shared by every batch (rank 2, or
// batch dims of ones) has batch stride 0, and when it is b with a not
// transposed, the batch is folded into the rows instead (one [batch*M, K] x
// [K, N] GEMM: the ViT's dense layers).
//
// Types: f32 (CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 where the
// matmul's tf32 flag is set), bf16 operands with a bf16 or f32 result
// (CUBLAS_COMPUTE_32F: products summed in f32), f64 (CUBLAS_COMPUTE_64F).
//
// A MatmulEpilogue's leading steps run in cuBLASLt's epilogue where they
// match it: a per-column bias (a Row-read Add: cuBLASLt's per-row bias of
// Dᵀ), a residual (a Whole-read Add: cuBLASLt's C with beta = 1), then ReLU or
// the tanh GELU (kiln's GeluTanh; kiln's Gelu is the exact erf form, which
// cuBLASLt has not). The other steps run after the GEMM in one in-place
// elementwise kernel (epilogue.cu). Should cuBLASLt have no algorithm for a
// fused form, the GEMM runs plain and every step in the kernel.
//
// Each device has one cuBLASLt handle; each distinct GEMM (shapes, types,
// transposes, epilogue, pointer alignments) its descriptors and heuristic
// algorithm, created on first use and cached, so that a training step's
// GEMMs never query the heuristic again. Workspace comes from the kernel's
// stream-ordered scratch allocator.
#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/dynlib.h"
#include "backend/cuda/epilogue.h"
#include "ops/op_defs.h"
#include "ops/op_facts.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;
// The most workspace an algorithm may ask for (cuBLAS's advice for Hopper).
constexpr size_t kMaxWorkspace = 32u << 20;

void check_cublas(cublasStatus_t st, const char* what, const char* who) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  fail(who, std::string(what) + ": " + dyn::cublasLtGetStatusName(st) + " (" +
                dyn::cublasLtGetStatusString(st) + ")");
}

// Whether GeluTanh runs in cuBLASLt's GELU epilogue (its tanh approximation
// of GELU) rather than in epilogue.cu's scalar<GeluTanh>; KILN_CUBLASLT_GELU=0
// turns it off.
bool cublas_gelu() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUBLASLT_GELU");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

cublasLtHandle_t handle(int device) {
  static std::mutex mu;
  static cublasLtHandle_t handles[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices)
    fail("matmul", "cuda:" + std::to_string(device) + ": no such device");
  std::lock_guard<std::mutex> lock(mu);
  if (!handles[device]) check_cublas(dyn::cublasLtCreate(&handles[device]), "cublasLtCreate", "matmul");
  return handles[device];
}

// One GEMM in kiln's terms: C[batch] (M x N) = op(A[batch]) · op(B[batch]);
// stride_a/stride_b: elements between an operand's batches (0: shared).
// (batch_a and batch_b stay as matmul_dims found them.)
struct Gemm : GemmDims {
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0;
  DType in = DType::f32, out = DType::f32;
};

Gemm gemm_of(const MatmulAttrs& attrs, const Array& a, const Array& b, DType out) {
  Gemm g;
  static_cast<GemmDims&>(g) =
      matmul_dims(a.shape(), b.shape(), attrs.transpose_a, attrs.transpose_b, "matmul");
  const int64_t batch_a = g.batch_a, batch_b = g.batch_b;
  g.batch = std::max(batch_a, batch_b);
  g.in = a.dtype();
  g.out = out;
  if (batch_b == 1 && !g.ta) {
    // b shared by every batch of a row-major, untransposed a: one GEMM with
    // batch*M rows (a's batches are consecutive rows, and so are C's).
    g.m *= batch_a;
    g.batch = 1;
  }
  if (g.batch > INT32_MAX)
    fail("matmul", "batch of " + std::to_string(g.batch) + " GEMMs exceeds cuBLASLt's limit");
  if (g.batch > 1) {
    g.stride_a = batch_a == 1 ? 0 : g.m * g.k;
    g.stride_b = batch_b == 1 ? 0 : g.k * g.n;
  }
  return g;
}

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  fail("matmul", std::string("no cuBLASLt type for ") + name_of(dt));
}

// The operand and result dtypes the GEMMs run (ops.cpp's matmul allows no others).
void check_dtypes(const char* who, DType a, DType b, DType out) {
  if (a != b)
    fail(who, std::string("operand dtypes differ: ") + name_of(a) + " @ " + name_of(b));
  if (a != DType::f32 && a != DType::f64 && a != DType::bf16)
    fail(who, std::string("no cuda kernel for dtype ") + name_of(a) +
                  " (expected f32, f64 or bf16 operands)");
  if (out != a && !(a == DType::bf16 && out == DType::f32))
    fail(who, std::string("output dtype ") + name_of(out) + " is not supported for " +
                  name_of(a) + " inputs");
}

// The alignment cuBLASLt may assume of a matrix at p whose batches lie
// stride_bytes apart: the largest power of two up to 256 dividing both.
uint32_t alignment(const void* p, int64_t batch, int64_t stride_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) v |= static_cast<uint64_t>(stride_bytes);
  v |= 256;
  return static_cast<uint32_t>(v & (~v + 1));
}

// What the cuBLASLt epilogue does.
struct Fused {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool residual = false;  // C holds a Whole-read addend, beta = 1
};

struct Key {
  int device;
  Gemm g;
  bool tf32;
  Fused f;
  uint32_t align_a, align_b, align_c, align_d, align_bias;
  bool operator==(const Key& o) const {
    return device == o.device && g.batch == o.g.batch && g.m == o.g.m && g.n == o.g.n &&
           g.k == o.g.k && g.stride_a == o.g.stride_a && g.stride_b == o.g.stride_b &&
           g.ta == o.g.ta && g.tb == o.g.tb && g.in == o.g.in && g.out == o.g.out &&
           tf32 == o.tf32 && f.epilogue == o.f.epilogue && f.residual == o.f.residual &&
           align_a == o.align_a && align_b == o.align_b && align_c == o.align_c &&
           align_d == o.align_d && align_bias == o.align_bias;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    for (int64_t v :
         {int64_t(k.device), k.g.batch, k.g.m, k.g.n, k.g.k, k.g.stride_a, k.g.stride_b,
          int64_t(k.g.ta), int64_t(k.g.tb), int64_t(k.g.in), int64_t(k.g.out), int64_t(k.tf32),
          int64_t(k.f.epilogue), int64_t(k.f.residual), int64_t(k.align_a), int64_t(k.align_b),
          int64_t(k.align_c), int64_t(k.align_d), int64_t(k.align_bias)})
      h = h * 1000003u ^ static_cast<size_t>(v);
    return h;
  }
};

// A GEMM's descriptors and algorithm (ok false: cuBLASLt has none for it).
struct Plan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lcd = nullptr;  // C and D share one
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  // The bias pointer lives in the shared descriptor: it is set and the GEMM
  // queued under this lock.
  std::mutex mu;
};

cublasLtMatrixLayout_t layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                              int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_cublas(dyn::cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld), "cublasLtMatrixLayoutCreate",
               "matmul");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check_cublas(dyn::cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)),
                 "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", "matmul");
    check_cublas(dyn::cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)),
                 "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", "matmul");
  }
  return l;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v,
              const char* what) {
  check_cublas(dyn::cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), what, "matmul");
}

// Creates the plan of key k (bias: the bias pointer, for its alignment).
void build(Plan& p, const Key& k, const void* bias) {
  const Gemm& g = k.g;
  const cudaDataType_t in = cuda_type(g.in), out = cuda_type(g.out);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  if (g.in == DType::f64) {
    compute = CUBLAS_COMPUTE_64F;
    scale = CUDA_R_64F;
  } else if (g.in == DType::f32 && k.tf32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  check_cublas(dyn::cublasLtMatmulDescCreate(&p.desc, compute, scale), "cublasLtMatmulDescCreate",
               "matmul");
  // cuBLASLt's A is kiln's b, its B kiln's a (see the top of the file).
  const cublasOperation_t op_a = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "cublasLtMatmulDescSetAttribute(TRANSA)");
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (k.f.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, k.f.epilogue,
             "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (k.f.epilogue & CUBLASLT_EPILOGUE_BIAS) {
      // f32 like D; the same bias for every batch (batch stride 0, the default).
      const int32_t bias_type = CUDA_R_32F;
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type,
               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias,
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    }
  }
  p.la = g.tb ? layout(in, g.k, g.n, g.k, g.batch, g.stride_b)
              : layout(in, g.n, g.k, g.n, g.batch, g.stride_b);
  p.lb = g.ta ? layout(in, g.m, g.k, g.m, g.batch, g.stride_a)
              : layout(in, g.k, g.m, g.k, g.batch, g.stride_a);
  p.lcd = layout(out, g.n, g.m, g.n, g.batch, g.m * g.n);

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(dyn::cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", "matmul");
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& v) {
    check_cublas(dyn::cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)),
                 "cublasLtMatmulPreferenceSetAttribute", "matmul");
  };
  const uint64_t max_ws = kMaxWorkspace;
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_ws);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b);  // cuBLASLt's A: kiln's b
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_d);
  cublasLtMatmulHeuristicResult_t results[4] = {};
  int found = 0;
  const cublasStatus_t st =
      dyn::cublasLtMatmulAlgoGetHeuristic(handle(k.device), p.desc, p.la, p.lb, p.lcd, p.lcd, pref, 4,
                                     results, &found);
  dyn::cublasLtMatmulPreferenceDestroy(pref);
  // No algorithm (p.ok stays false): a fused form falls back to the plain
  // GEMM, which reports the status where it has none either.
  const bool fused = k.f.epilogue != CUBLASLT_EPILOGUE_DEFAULT || k.f.residual;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (fused && st != CUBLAS_STATUS_SUCCESS)) return;
  check_cublas(st, "cublasLtMatmulAlgoGetHeuristic", "matmul");
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) {
      p.algo = results[i].algo;
      p.workspace = results[i].workspaceSize;
      p.ok = true;
      return;
    }
}

// The plans of every GEMM run so far, never destroyed (GEMMs may run during
// exit).
Plan& plan_for(const Key& k, const void* bias) {
  static std::mutex mu;
  static auto* plans = new std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans->find(k);
  if (it != plans->end()) return *it->second;
  auto p = std::make_unique<Plan>();
  build(*p, k, bias);
  return *plans->emplace(k, std::move(p)).first->second;
}

// The operands of a GEMM with its cuBLASLt epilogue.
struct Operands {
  const void* a;
  const void* b;
  void* d;
  const float* bias = nullptr;      // CUBLASLT_EPILOGUE_BIAS
  const float* residual = nullptr;  // Fused::residual
};

// Queues D = epilogue(a·b [+ residual] [+ bias]) on stream s; false where
// cuBLASLt has no algorithm for this fused form.
bool try_gemm(const KernelContext& ctx, cudaStream_t s, const Gemm& g, bool tf32, const Fused& f,
              const Operands& o, const char* who) {
  const size_t in_size = size_of(g.in), out_size = size_of(g.out);
  Key k{ctx.device.index, g, tf32 && g.in == DType::f32, f};
  k.align_a = alignment(o.a, g.batch, g.stride_a * static_cast<int64_t>(in_size));
  k.align_b = alignment(o.b, g.batch, g.stride_b * static_cast<int64_t>(in_size));
  k.align_d = alignment(o.d, g.batch, g.m * g.n * static_cast<int64_t>(out_size));
  k.align_c = f.residual ? alignment(o.residual, g.batch, g.m * g.n * static_cast<int64_t>(out_size))
                         : k.align_d;
  k.align_bias = (f.epilogue & CUBLASLT_EPILOGUE_BIAS) ? alignment(o.bias, 1, 0) : 0;
  Plan& p = plan_for(k, o.bias);
  if (!p.ok) return false;
  void* ws = p.workspace ? ctx.scratch->allocate(p.workspace) : nullptr;
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = g.in == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = f.residual ? alpha : f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  const void* c = f.residual ? static_cast<const void*>(o.residual) : o.d;
  cublasStatus_t st;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (f.epilogue & CUBLASLT_EPILOGUE_BIAS)
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(o.bias),
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    st = dyn::cublasLtMatmul(handle(ctx.device.index), p.desc, alpha, o.b, p.la, o.a, p.lb, beta, c,
                        p.lcd, o.d, p.lcd, &p.algo, ws, p.workspace, s);
  }
  if (ws) ctx.scratch->release(ws, p.workspace);
  check_cublas(st, "cublasLtMatmul", who);
  return true;
}

void zero_output(void* c, const ArrayNode& out, cudaStream_t s) {
  KILN_CUDA_CHECK(cudaMemsetAsync(c, 0, numel(out.shape) * size_of(out.dtype), s));
}

void matmul_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                   ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& attrs = p.attrs<MatmulAttrs>();
  const Array &a = in[0], &b = in[1];
  check_dtypes("matmul", a.dtype(), b.dtype(), out.dtype);
  const Gemm g = gemm_of(attrs, a, b, out.dtype);
  void* c = alloc_output(out);
  if (numel(out.shape) == 0) return;
  if (g.k == 0) return zero_output(c, out, s);
  if (!try_gemm(ctx, s, g, attrs.tf32, Fused{}, Operands{a.raw(), b.raw(), c}, "matmul"))
    fail("matmul", std::string("cuBLASLt has no algorithm for ") + name_of(g.in) + " [" +
                       std::to_string(g.batch) + " x " + std::to_string(g.m) + " x " +
                       std::to_string(g.k) + "] @ [" + std::to_string(g.k) + " x " +
                       std::to_string(g.n) + "] -> " + name_of(g.out));
}

// The cuBLASLt epilogue for the leading steps of `steps` that it runs exactly
// (up to the order of rounding): at most one bias (Row Add) and one residual
// (Whole Add), in either order, then, without a residual, optionally ReLU or
// the tanh GELU (an activation after the residual stays in the kernel: kiln
// does not rely on cuBLASLt adding beta·C before its activation). Returns how
// many steps it takes.
size_t fuse_leading(const std::vector<EpilogueStep>& steps, Fused& f, int& bias, int& residual) {
  size_t i = 0;
  bias = residual = -1;
  for (; i < steps.size(); ++i) {
    const EpilogueStep& st = steps[i];
    if (st.op != Op::Add || st.operand < 0) break;
    if (st.read == FusedRead::Row && bias < 0)
      bias = st.operand;
    else if (st.read == FusedRead::Whole && residual < 0)
      residual = st.operand;
    else
      break;
  }
  unsigned e = bias >= 0 ? CUBLASLT_EPILOGUE_BIAS : 0;
  if (residual >= 0 || i == steps.size()) {
    // no activation
  } else if (steps[i].op == Op::Relu) {
    e |= CUBLASLT_EPILOGUE_RELU;
    ++i;
  } else if (steps[i].op == Op::GeluTanh && cublas_gelu()) {
    e |= CUBLASLT_EPILOGUE_GELU;
    ++i;
  }
  f.epilogue = e ? static_cast<cublasLtEpilogue_t>(e) : CUBLASLT_EPILOGUE_DEFAULT;
  f.residual = residual >= 0;
  return i;
}

void matmul_epilogue_kernel(const KernelContext& ctx, const Primitive& p,
                            const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& attrs = p.attrs<EpilogueAttrs>();
  const Array &a = in[0], &b = in[1];
  if (a.dtype() != b.dtype() || (a.dtype() != DType::f32 && a.dtype() != DType::bf16) ||
      out.dtype != DType::f32)
    fail("MatmulEpilogue", "needs f32 or bf16 operands and an f32 result");
  for (const auto& st : attrs.steps) {
    if (st.operand < 0) continue;
    if (2 + static_cast<size_t>(st.operand) >= in.size())
      fail("MatmulEpilogue", "epilogue operand " + std::to_string(st.operand) + " of " +
                                 std::to_string(in.size() - 2));
    if (in[2 + st.operand].dtype() != DType::f32)
      fail("MatmulEpilogue", "epilogue operands must be f32");
  }
  const Gemm g = gemm_of(attrs.mm, a, b, out.dtype);
  float* c = static_cast<float*>(alloc_output(out));
  const int64_t rows = g.batch * g.m, cols = g.n;
  if (numel(out.shape) == 0) return;
  auto operand = [&](int i) { return ptr<float>(in[2 + i]); };
  auto rest_from = [&](size_t first) {
    std::vector<EpilogueRun> rest;
    for (size_t i = first; i < attrs.steps.size(); ++i) {
      const EpilogueStep& st = attrs.steps[i];
      rest.push_back({st.op, st.read, st.operand >= 0 ? operand(st.operand) : nullptr});
    }
    return rest;
  };
  size_t done = 0;
  if (g.k == 0) {
    zero_output(c, out, s);
  } else {
    Fused f;
    int bias = -1, residual = -1;
    done = fuse_leading(attrs.steps, f, bias, residual);
    Operands o{a.raw(), b.raw(), c};
    if (bias >= 0) o.bias = operand(bias);
    if (residual >= 0) o.residual = operand(residual);
    if (done == 0 || !try_gemm(ctx, s, g, attrs.mm.tf32, f, o, "MatmulEpilogue")) {
      done = 0;
      if (!try_gemm(ctx, s, g, attrs.mm.tf32, Fused{}, Operands{a.raw(), b.raw(), c},
                    "MatmulEpilogue"))
        fail("MatmulEpilogue", "cuBLASLt has no algorithm for this GEMM");
    }
  }
  run_epilogue_steps(c, rows, cols, rest_from(done), s);
}

}  // namespace

bool supports_epilogue(const EpilogueAttrs& e, const std::vector<DType>& inputs, DType out) {
  if (inputs.size() < 2 || out != DType::f32 || inputs[0] != inputs[1] ||
      (inputs[0] != DType::f32 && inputs[0] != DType::bf16))
    return false;
  for (size_t i = 2; i < inputs.size(); ++i)
    if (inputs[i] != DType::f32) return false;
  for (const auto& st : e.steps) {
    if (!op_has(st.op, kFusable)) return false;
    const bool binary = op_kind(st.op) == OpKind::Binary;
    if (binary != (st.operand >= 0)) return false;
    if (binary && 2 + static_cast<size_t>(st.operand) >= inputs.size()) return false;
  }
  return true;
}

void register_matmul(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Matmul)] = matmul_kernel;
  t.kernels[static_cast<int>(Op::MatmulEpilogue)] = matmul_epilogue_kernel;
}

}  // namespace kiln::cuda
