// kiln's CUDA emulator: the cuBLASLt functions kiln calls (matmul.cpp), on
// the host. What cuBLASLt computes, column-major:
//
//   D[b] = epilogue(alpha · op(A[b]) · op(B[b]) + beta · C[b] (+ bias))
//
// with the layouts' leading dimensions, batch counts and strided batch
// offsets; compute types 32F (f32 or bf16 operands, sums in f32), 32F with
// tf32 (f32 operands rounded to tf32 first, to nearest) and 64F; results
// rounded to D's type; epilogues bias (per row of D), ReLU and GELU (its tanh
// form), alone or after the bias. Products are summed in f64 and rounded
// once: at least as exact as the library, whose order of summation is its
// own. Every operand is checked as the GPU would find it: live memory of the
// stream's device (and, read, written before). A matmul is work on its
// stream like a kernel: recorded into a capture, and its operands checked
// against other streams' work on them as a kernel's are.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/dynlib.h"
#include "backend/cuda/emulation/internal.h"
#include "backend/cuda/emulation/libraries.h"
#include "backend/cuda/emulation/memory.h"

namespace kiln::emu::cublaslt {
namespace {

struct Desc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
};

struct Layout {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
};

thread_local std::string tls_status;  // the last failure's message

cublasStatus_t fail(cublasStatus_t st, std::string message) {
  tls_status = std::move(message);
  return st;
}

Desc* desc(cublasLtMatmulDesc_t d) {
  return reinterpret_cast<Desc*>(d);
}
Layout* layout(cublasLtMatrixLayout_t l) {
  return reinterpret_cast<Layout*>(l);
}

size_t type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}

template <typename T>
bool read(const void* buf, size_t size, T& v) {
  if (size != sizeof(T)) return false;
  std::memcpy(&v, buf, sizeof(T));
  return true;
}

double load(const void* p, cudaDataType_t t, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return 0.0;
  }
}

void store(void* p, cudaDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      break;
    default: break;
  }
}

// One GEMM's shapes: D is m x n; op(A) m x k, op(B) k x n.
struct Shape {
  int64_t m, n, k, batch;
};

// Why desc and the layouts do not make one GEMM that the emulator runs
// (empty where they do).
std::string check(const Desc& d, const Layout& a, const Layout& b, const Layout& c,
                  const Layout& dl, Shape& s) {
  s.m = static_cast<int64_t>(dl.rows);
  s.n = static_cast<int64_t>(dl.cols);
  const int64_t am = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const int64_t ak = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const int64_t bk = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const int64_t bn = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  s.k = ak;
  s.batch = dl.batch;
  if (am != s.m || bn != s.n || bk != s.k || c.rows != dl.rows || c.cols != dl.cols)
    return "the layouts do not make one GEMM (op(A) " + std::to_string(am) + " x " +
           std::to_string(ak) + ", op(B) " + std::to_string(bk) + " x " + std::to_string(bn) +
           ", D " + std::to_string(dl.rows) + " x " + std::to_string(dl.cols) + ")";
  for (const Layout* l : {&a, &b, &c, &dl}) {
    if (!type_size(l->type)) return "a layout's type is not f32, f64 or bf16";
    if (l->ld < static_cast<int64_t>(l->rows)) return "a leading dimension is less than its rows";
    if (l->batch != dl.batch && l->batch != 1) return "the layouts' batch counts differ";
  }
  if (a.type != b.type) return "A and B differ in type";
  const bool f64 = d.compute == CUBLAS_COMPUTE_64F;
  if (f64 != (a.type == CUDA_R_64F) || f64 != (dl.type == CUDA_R_64F))
    return "64F compute goes with f64 operands and result, and only there";
  if (d.compute != CUBLAS_COMPUTE_32F && d.compute != CUBLAS_COMPUTE_32F_FAST_TF32 && !f64)
    return "a compute type other than 32F, 32F_FAST_TF32 and 64F";
  if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.type != CUDA_R_32F)
    return "32F_FAST_TF32 with operands other than f32";
  if (c.type != dl.type) return "C and D differ in type";
  const unsigned e = d.epilogue;
  const unsigned known = CUBLASLT_EPILOGUE_BIAS | CUBLASLT_EPILOGUE_RELU | CUBLASLT_EPILOGUE_GELU;
  if (e != CUBLASLT_EPILOGUE_DEFAULT &&
      ((e & ~known) || ((e & CUBLASLT_EPILOGUE_RELU) && (e & CUBLASLT_EPILOGUE_GELU))))
    return "an epilogue other than bias, ReLU and GELU";
  if ((e & CUBLASLT_EPILOGUE_BIAS) && e != CUBLASLT_EPILOGUE_DEFAULT && d.bias_type != CUDA_R_32F &&
      d.bias_type != dl.type)
    return "a bias of another type than f32 or D's";
  return {};
}

// The bytes a matrix of layout l spans in memory (all its batches).
size_t span_of(const Layout& l, int64_t batch) {
  if (l.rows == 0 || l.cols == 0) return 0;
  const int64_t last = (static_cast<int64_t>(l.cols) - 1) * l.ld + static_cast<int64_t>(l.rows);
  const int64_t b = l.batch > 1 ? batch : 1;
  return static_cast<size_t>((b - 1) * l.stride + last) * type_size(l.type);
}

struct Run {
  Desc d;
  Layout a, b, c, dl;
  Shape s;
  const void *pa, *pb, *pc;
  void* pd;
  double alpha, beta;
};

cudaError_t run(const Run& r, int device, std::string& message, Accesses& touched) {
  const bool bias =
      r.d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && (r.d.epilogue & CUBLASLT_EPILOGUE_BIAS);
  struct Operand {
    const void* p;
    size_t bytes;
    const char* name;
  };
  std::vector<Operand> reads = {{r.pa, span_of(r.a, r.s.batch), "cublasLtMatmul's A"},
                                {r.pb, span_of(r.b, r.s.batch), "cublasLtMatmul's B"}};
  if (r.beta != 0.0) reads.push_back({r.pc, span_of(r.c, r.s.batch), "cublasLtMatmul's C"});
  if (bias) reads.push_back({r.d.bias, r.s.m * type_size(r.d.bias_type), "cublasLtMatmul's bias"});
  for (const Operand& o : reads)
    if (std::string e = check_range(o.p, o.bytes, device, true, o.name); !e.empty()) {
      message = e;
      return cudaErrorIllegalAddress;
    }
  if (std::string e =
          check_range(r.pd, span_of(r.dl, r.s.batch), device, false, "cublasLtMatmul's D");
      !e.empty()) {
    message = e;
    return cudaErrorIllegalAddress;
  }
  // What the matmul reads and writes, for the streams' order checks.
  for (const Operand& o : reads) allocation_ids(o.p, o.bytes, touched.reads);
  allocation_ids(r.pd, span_of(r.dl, r.s.batch), touched.writes);
  const bool fast_tf32 = r.d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const int64_t m = r.s.m, n = r.s.n, k = r.s.k;
  // op(A) row by row and op(B) column by column, each contiguous.
  std::vector<double> a(m * k), b(n * k), out(m * n);
  for (int64_t batch = 0; batch < r.s.batch; ++batch) {
    auto at = [&](const Layout& l, int64_t bt) { return l.batch > 1 ? bt * l.stride : 0; };
    const int64_t oa = at(r.a, batch), ob = at(r.b, batch), oc = at(r.c, batch),
                  od = at(r.dl, batch);
    auto operand = [&](const void* p, cudaDataType_t t, int64_t i) {
      double v = load(p, t, i);
      return fast_tf32 ? static_cast<double>(tf32(static_cast<float>(v))) : v;
    };
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p)
        a[i * k + p] = operand(r.pa, r.a.type,
                               oa + (r.d.trans_a == CUBLAS_OP_N ? i + p * r.a.ld : p + i * r.a.ld));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        b[j * k + p] = operand(r.pb, r.b.type,
                               ob + (r.d.trans_b == CUBLAS_OP_N ? p + j * r.b.ld : j + p * r.b.ld));
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const double* x = &a[i * k];
        const double* y = &b[j * k];
        double acc = 0.0;
        for (int64_t p = 0; p < k; ++p) acc += x[p] * y[p];
        out[j * m + i] = acc;
      }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double v = r.alpha * out[j * m + i];
        if (r.beta != 0.0) v += r.beta * load(r.pc, r.c.type, oc + i + j * r.c.ld);
        if (bias) v += load(r.d.bias, r.d.bias_type, i);
        if (r.d.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
          if (r.d.epilogue & CUBLASLT_EPILOGUE_RELU) v = v > 0.0 ? v : 0.0;
          if (r.d.epilogue & CUBLASLT_EPILOGUE_GELU)
            v = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        }
        store(r.pd, r.dl.type, od + i + j * r.dl.ld, v);
      }
    for (int64_t j = 0; j < n; ++j)
      mark_written(static_cast<char*>(r.pd) + (od + j * r.dl.ld) * type_size(r.dl.type),
                   m * type_size(r.dl.type));
  }
  return cudaSuccess;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  static int one;
  *handle = reinterpret_cast<cublasLtHandle_t>(&one);
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}

const char* cublasLtGetStatusString(cublasStatus_t st) {
  if (st != CUBLAS_STATUS_SUCCESS && !tls_status.empty()) return tls_status.c_str();
  return st == CUBLAS_STATUS_SUCCESS ? "success" : "the emulated cuBLASLt failed";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  auto* x = new Desc();
  x->compute = compute;
  x->scale = scale;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(x);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  Desc& x = *desc(d);
  bool ok = true;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = read(buf, size, x.trans_a); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = read(buf, size, x.trans_b); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = read(buf, size, x.epilogue); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = read(buf, size, x.bias); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      int32_t t = 0;
      ok = read(buf, size, t);
      x.bias_type = static_cast<cudaDataType_t>(t);
      break;
    }
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescSetAttribute: attribute " +
                                                   std::to_string(attr) + " is not emulated");
  }
  return ok ? CUBLAS_STATUS_SUCCESS
            : fail(CUBLAS_STATUS_INVALID_VALUE,
                   "cublasLtMatmulDescSetAttribute: a value of the wrong size");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  auto* x = new Layout();
  x->type = type;
  x->rows = rows;
  x->cols = cols;
  x->ld = ld;
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(x);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  Layout& x = *layout(l);
  bool ok = true;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = read(buf, size, x.batch) && x.batch >= 1; break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ok = read(buf, size, x.stride); break;
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutSetAttribute: attribute " +
                                                   std::to_string(attr) + " is not emulated");
  }
  return ok ? CUBLAS_STATUS_SUCCESS
            : fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutSetAttribute: a bad value");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  static cublasLtMatmulPreferenceOpaque_t one;
  *p = &one;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t) {
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* found) {
  Shape s;
  *found = 0;
  if (std::string e = check(*desc(d), *layout(a), *layout(b), *layout(c), *layout(dl), s);
      !e.empty())
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic: " + e);
  if (requested < 1) return fail(CUBLAS_STATUS_INVALID_VALUE, "asked for no algorithm");
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].workspaceSize = 0;
  results[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t stream) {
  Run r;
  r.d = *desc(d);
  r.a = *layout(a);
  r.b = *layout(b);
  r.c = *layout(c);
  r.dl = *layout(dl);
  if (std::string e = check(r.d, r.a, r.b, r.c, r.dl, r.s); !e.empty())
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: " + e);
  // The scalars are host values, read now (CUBLASLT_POINTER_MODE_HOST).
  const bool f64 = r.d.scale == CUDA_R_64F;
  r.alpha = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  r.beta = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  r.pa = A;
  r.pb = B;
  r.pc = C;
  r.pd = D;
  const int device = stream_device(stream);
  if (submit(stream, "cublasLtMatmul", [r, device](std::string& message, Accesses& touched) {
        return run(r, device, message, touched);
      }) != cudaSuccess)
    return fail(CUBLAS_STATUS_EXECUTION_FAILED, cudaGetErrorString(cudaGetLastError()));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace kiln::emu::cublaslt

namespace kiln::emu {

float tf32(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &b, 4);
  return v;
}

void* cublaslt_symbol(const char* name) {
  using namespace cublaslt;
#define KILN_EMU_SYMBOL(fn)        \
  if (std::strcmp(name, #fn) == 0) \
    return reinterpret_cast<void*>(static_cast<decltype(&::fn)>(&fn));
  KILN_CUBLASLT_FUNCTIONS(KILN_EMU_SYMBOL)
#undef KILN_EMU_SYMBOL
  return nullptr;
}

}  // namespace kiln::emu
