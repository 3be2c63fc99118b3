// kiln's CUDA emulator: the cuDNN functions kiln calls (conv_cudnn.cpp), on
// the host: 2-d cross-correlations forward, backward to the data and
// backward to the filter, with padding (both sides alike), strides,
// dilation and groups, NCHW tensors with a KCRS filter or NHWC tensors with
// a KRSC one, in f32 and bf16 (sums in f32 compute type) and f64;
//
//   out = alpha · op(a, b) + beta · out
//
// Products are summed in f64 and rounded once; f32 operands are first
// rounded to TF32 where the convolution's math is tensor-op or default (as
// on Ampere and later GPUs) and kept whole on FMA math. The descriptors are checked
// as cuDNN checks them (BAD_PARAM for ones that do not make one
// convolution, NOT_SUPPORTED for what the emulator does not run: mixed
// layouts or types); the heuristics rank two algorithms per pass, the first
// of the backward passes non-deterministic and one of each pass asking for
// workspace, so that kiln's choice and its workspace are exercised. Every
// operand is checked as the GPU would find it (live memory of the stream's
// device, inputs written before, the workspace as large as the algorithm's),
// and a call is work on the handle's stream like a kernel.
// KILN_CUDA_EMULATOR_CUDNN_REFUSE=N makes the convolutions of N output
// channels refused as they run (NOT_SUPPORTED_SHAPE), for kiln's fallback.
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/dynlib.h"
#include "backend/cuda/emulation/internal.h"
#include "backend/cuda/emulation/libraries.h"
#include "backend/cuda/emulation/memory.h"

#if KILN_HAVE_CUDNN
namespace kiln::emu::cudnn {
namespace {

struct Handle {
  cudaStream_t stream = nullptr;
};
struct Tensor {
  bool set = false;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
};
struct Filter {
  bool set = false;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, h = 0, w = 0;
};
struct Conv {
  bool set = false;
  int ph = 0, pw = 0, sh = 1, sw = 1, dh = 1, dw = 1, groups = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

thread_local std::string tls_message;  // the last failure's, for cudnnGetErrorString
thread_local cudnnStatus_t tls_status = CUDNN_STATUS_SUCCESS;

cudnnStatus_t fail(cudnnStatus_t st, std::string message) {
  tls_status = st;
  tls_message = std::move(message);
  return st;
}

template <typename D, typename H>
D* as(H h) {
  return reinterpret_cast<D*>(h);
}

size_t type_size(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return 4;
    case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_BFLOAT16: return 2;
    default: return 0;
  }
}

double load(const void* p, cudnnDataType_t t, int64_t i) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return static_cast<const float*>(p)[i];
    case CUDNN_DATA_DOUBLE: return static_cast<const double*>(p)[i];
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

void store(void* p, cudnnDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDNN_DATA_FLOAT: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case CUDNN_DATA_DOUBLE: static_cast<double*>(p)[i] = v; break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); break;
  }
}

// One convolution as the descriptors make it.
struct Geometry {
  int64_t n, c, h, w;     // x
  int64_t k, cg, kh, kw;  // the filter
  int64_t ho, wo;         // y
  int64_t groups, kg;     // groups, output channels per group
  int64_t ph, pw, sh, sw, dh, dw;
  bool nhwc;
  cudnnDataType_t type;
  // f32 data on tensor-op or default math: the operands rounded to TF32 (as
  // on the GPUs kiln targets, Ampere and later, where default math allows it).
  bool tf32 = false;
  int64_t x_index(int64_t b, int64_t ch, int64_t y, int64_t x) const {
    return nhwc ? ((b * h + y) * w + x) * c + ch : ((b * c + ch) * h + y) * w + x;
  }
  int64_t y_index(int64_t b, int64_t ch, int64_t y, int64_t x) const {
    return nhwc ? ((b * ho + y) * wo + x) * k + ch : ((b * k + ch) * ho + y) * wo + x;
  }
  int64_t w_index(int64_t oc, int64_t ic, int64_t i, int64_t j) const {
    return nhwc ? ((oc * kh + i) * kw + j) * cg + ic : ((oc * cg + ic) * kh + i) * kw + j;
  }
  size_t bytes(int64_t elements) const { return static_cast<size_t>(elements) * type_size(type); }
  int64_t x_size() const { return n * c * h * w; }
  int64_t y_size() const { return n * k * ho * wo; }
  int64_t w_size() const { return k * cg * kh * kw; }
};

int64_t out_extent(int64_t in, int64_t pad, int64_t window, int64_t dilation, int64_t stride) {
  const int64_t span = dilation * (window - 1) + 1;
  return in + 2 * pad < span ? 0 : (in + 2 * pad - span) / stride + 1;
}

// Why x, w and conv do not make one convolution the emulator runs (empty
// where they do), and its geometry; y (when given) must be its output.
cudnnStatus_t check(const Tensor* x, const Filter* w, const Conv* cv, const Tensor* y,
                    const char* who, Geometry& g) {
  auto bad = [&](std::string m) {
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(who) + ": " + m);
  };
  auto unsupported = [&](std::string m) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(who) + ": " + m);
  };
  if (!x || !w || !cv) return bad("a null descriptor");
  if (!x->set || !w->set || !cv->set || (y && !y->set)) return bad("a descriptor never set");
  if (cv->mode != CUDNN_CROSS_CORRELATION)
    return unsupported("the emulator runs cross-correlation only");
  if (x->type != w->type || (y && y->type != x->type))
    return unsupported("tensors and filter of different types");
  if (x->format != w->format || (y && y->format != x->format))
    return unsupported("tensors and filter in different layouts");
  const bool f64 = x->type == CUDNN_DATA_DOUBLE;
  if (cv->compute != (f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT))
    return bad("compute type " + std::to_string(cv->compute) + " for data type " +
               std::to_string(x->type));
  if (x->c != w->c * cv->groups)
    return bad("x has " + std::to_string(x->c) + " channels, the filter " + std::to_string(w->c) +
               " per group in " + std::to_string(cv->groups) + " groups");
  if (w->k % cv->groups) return bad("output channels do not divide into the groups");
  g = {x->n,
       x->c,
       x->h,
       x->w,
       w->k,
       w->c,
       w->h,
       w->w,
       out_extent(x->h, cv->ph, w->h, cv->dh, cv->sh),
       out_extent(x->w, cv->pw, w->w, cv->dw, cv->sw),
       cv->groups,
       w->k / cv->groups,
       cv->ph,
       cv->pw,
       cv->sh,
       cv->sw,
       cv->dh,
       cv->dw,
       x->format == CUDNN_TENSOR_NHWC,
       x->type,
       x->type == CUDNN_DATA_FLOAT && cv->math != CUDNN_FMA_MATH};
  if (g.ho < 1 || g.wo < 1) return bad("the window does not fit the padded input");
  if (y && (y->n != g.n || y->c != g.k || y->h != g.ho || y->w != g.wo))
    return bad("y is " + std::to_string(y->n) + "x" + std::to_string(y->c) + "x" +
               std::to_string(y->h) + "x" + std::to_string(y->w) + ", the convolution's output " +
               std::to_string(g.n) + "x" + std::to_string(g.k) + "x" + std::to_string(g.ho) + "x" +
               std::to_string(g.wo));
  return CUDNN_STATUS_SUCCESS;
}

// The algorithms each pass ranks, in the heuristics' order, with the
// workspace each asks for (the emulator computes every one alike).
struct Algo {
  int algo;
  bool deterministic;
  size_t workspace;
};
std::vector<Algo> algorithms(int pass, const Geometry& g) {
  const size_t taps = static_cast<size_t>(g.cg * g.kh * g.kw) * sizeof(int);
  switch (pass) {
    case 0:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, taps},
              {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true, 0}};
    case 1:
      return {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false, 0},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, taps}};
    default:
      return {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false, 0},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, g.bytes(g.w_size())}};
  }
}

const Algo* find_algo(int pass, const Geometry& g, int algo, Algo& out) {
  for (const Algo& a : algorithms(pass, g))
    if (a.algo == algo) {
      out = a;
      return &out;
    }
  return nullptr;
}

template <typename Perf, typename A>
cudnnStatus_t heuristics(int pass, const Geometry& g, const Conv& cv, int requested, int* found,
                         Perf* results) {
  if (!found || !results || requested < 1)
    return fail(CUDNN_STATUS_BAD_PARAM, "the heuristics: no room for a result");
  const std::vector<Algo> algos = algorithms(pass, g);
  *found = 0;
  for (const Algo& a : algos) {
    if (*found == requested) break;
    Perf& r = results[(*found)++];
    r = Perf{};
    r.algo = static_cast<A>(a.algo);
    r.status = CUDNN_STATUS_SUCCESS;
    r.time = -1.0f;
    r.memory = a.workspace;
    r.determinism = a.deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    r.mathType = cv.math;
  }
  return CUDNN_STATUS_SUCCESS;
}

template <typename A>
cudnnStatus_t workspace_size(int pass, const Geometry& g, A algo, size_t* bytes) {
  Algo a;
  if (!bytes) return fail(CUDNN_STATUS_BAD_PARAM, "the workspace size: a null result");
  if (!find_algo(pass, g, static_cast<int>(algo), a))
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                "the workspace size: algorithm " + std::to_string(static_cast<int>(algo)) +
                    " is not one the emulator's heuristics name for this pass");
  *bytes = a.workspace;
  return CUDNN_STATUS_SUCCESS;
}

// One pass to run: 0 forward (a = x, b = w, out = y), 1 backward data
// (a = dy, b = w, out = dx), 2 backward filter (a = x, b = dy, out = dw).
struct Run {
  int pass;
  Geometry g;
  const void *a, *b;
  void* out;
  void* workspace;
  size_t workspace_bytes, workspace_needed;
  double alpha, beta;
  const char* who;
};

cudaError_t run(const Run& r, int device, std::string& message, Accesses& touched) {
  const Geometry& g = r.g;
  const int64_t x_n = g.x_size(), y_n = g.y_size(), w_n = g.w_size();
  const int64_t a_n = r.pass == 1 ? y_n : x_n, b_n = r.pass == 0 ? w_n : r.pass == 1 ? w_n : y_n;
  const int64_t o_n = r.pass == 0 ? y_n : r.pass == 1 ? x_n : w_n;
  const std::string who = r.who;
  for (auto [p, bytes, what, read] :
       {std::tuple{r.a, g.bytes(a_n), "'s first operand", true},
        std::tuple{r.b, g.bytes(b_n), "'s second operand", true},
        std::tuple{static_cast<const void*>(r.out), g.bytes(o_n), "'s result", r.beta != 0.0}}) {
    const std::string name = who + what;
    if (std::string e = check_range(p, bytes, device, read, name.c_str()); !e.empty()) {
      message = e;
      return cudaErrorIllegalAddress;
    }
  }
  if (r.workspace_needed) {
    const std::string name = who + "'s workspace";
    if (std::string e = check_range(r.workspace, r.workspace_needed, device, false, name.c_str());
        !e.empty()) {
      message = e;
      return cudaErrorIllegalAddress;
    }
    allocation_ids(r.workspace, r.workspace_needed, touched.writes);
  }
  allocation_ids(r.a, g.bytes(a_n), touched.reads);
  allocation_ids(r.b, g.bytes(b_n), touched.reads);
  allocation_ids(r.out, g.bytes(o_n), touched.writes);

  std::vector<double> acc(o_n, 0.0);
  auto operand = [&g](const void* p, int64_t i) {
    const double v = load(p, g.type, i);
    return g.tf32 ? static_cast<double>(tf32(static_cast<float>(v))) : v;
  };
  // Every (output element, tap) pair inside the input, split so that each
  // thread writes its own part of acc: forward by output channel (y), data
  // by batch (dx), filter by output channel (dw).
  const int64_t outer = r.pass == 1 ? g.n : g.k;
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < outer; ++u) {
    const int64_t b0 = r.pass == 1 ? u : 0, b1 = r.pass == 1 ? u + 1 : g.n;
    const int64_t k0 = r.pass == 1 ? 0 : u, k1 = r.pass == 1 ? g.k : u + 1;
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t oc = k0; oc < k1; ++oc) {
        const int64_t grp = oc / g.kg;
        for (int64_t oy = 0; oy < g.ho; ++oy)
          for (int64_t ox = 0; ox < g.wo; ++ox) {
            const int64_t yi = g.y_index(b, oc, oy, ox);
            for (int64_t ic = 0; ic < g.cg; ++ic)
              for (int64_t i = 0; i < g.kh; ++i) {
                const int64_t row = oy * g.sh - g.ph + i * g.dh;
                if (row < 0 || row >= g.h) continue;
                for (int64_t j = 0; j < g.kw; ++j) {
                  const int64_t col = ox * g.sw - g.pw + j * g.dw;
                  if (col < 0 || col >= g.w) continue;
                  const int64_t xi = g.x_index(b, grp * g.cg + ic, row, col);
                  const int64_t wi = g.w_index(oc, ic, i, j);
                  if (r.pass == 0)
                    acc[yi] += operand(r.a, xi) * operand(r.b, wi);
                  else if (r.pass == 1)
                    acc[xi] += operand(r.a, yi) * operand(r.b, wi);
                  else
                    acc[wi] += operand(r.a, xi) * operand(r.b, yi);
                }
              }
          }
      }
  }
  for (int64_t i = 0; i < o_n; ++i) {
    double v = r.alpha * acc[i];
    if (r.beta != 0.0) v += r.beta * load(r.out, g.type, i);
    store(r.out, g.type, i, v);
  }
  mark_written(r.out, g.bytes(o_n));
  return cudaSuccess;
}

cudnnStatus_t submit_run(cudnnHandle_t handle, Run r, const void* alpha, const void* beta,
                         int algo) {
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, std::string(r.who) + ": a null handle");
  if (!alpha || !beta) return fail(CUDNN_STATUS_BAD_PARAM, std::string(r.who) + ": a null scalar");
  // The scalars are host values, read now: double for double data, else float.
  const bool f64 = r.g.type == CUDNN_DATA_DOUBLE;
  r.alpha = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  r.beta = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  Algo a;
  if (!find_algo(r.pass, r.g, algo, a))
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(r.who) + ": algorithm " +
                                                std::to_string(algo) +
                                                " is not one the emulator's heuristics name");
  r.workspace_needed = a.workspace;
  if (r.workspace_bytes < a.workspace || (a.workspace && !r.workspace))
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(r.who) + ": algorithm " + std::to_string(algo) +
                                            " needs " + std::to_string(a.workspace) +
                                            " bytes of workspace, given " +
                                            std::to_string(r.workspace ? r.workspace_bytes : 0));
  if (!r.a || !r.b || !r.out)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(r.who) + ": a null data pointer");
  // KILN_CUDA_EMULATOR_CUDNN_REFUSE=N: refuse convolutions of N output
  // channels as they run, as cuDNN refuses a shape its heuristics offered.
  if (const char* e = std::getenv("KILN_CUDA_EMULATOR_CUDNN_REFUSE"); e && std::atoll(e) == r.g.k)
    return fail(CUDNN_STATUS_NOT_SUPPORTED_SHAPE,
                std::string(r.who) + ": refused (KILN_CUDA_EMULATOR_CUDNN_REFUSE)");
  cudaStream_t stream = as<Handle>(handle)->stream;
  const int device = stream_device(stream);
  if (submit(stream, r.who, [r, device](std::string& message, Accesses& touched) {
        return run(r, device, message, touched);
      }) != cudaSuccess)
    return fail(CUDNN_STATUS_EXECUTION_FAILED, cudaGetErrorString(cudaGetLastError()));
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: a null result");
  *handle = reinterpret_cast<cudnnHandle_t>(new Handle());
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: a null handle");
  as<Handle>(handle)->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

const char* cudnnGetErrorString(cudnnStatus_t st) {
  static thread_local std::string text;
  switch (st) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: text = "CUDNN_STATUS_BAD_PARAM"; break;
    case CUDNN_STATUS_NOT_SUPPORTED: text = "CUDNN_STATUS_NOT_SUPPORTED"; break;
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: text = "CUDNN_STATUS_NOT_SUPPORTED_SHAPE"; break;
    case CUDNN_STATUS_EXECUTION_FAILED: text = "CUDNN_STATUS_EXECUTION_FAILED"; break;
    default: text = "CUDNN_STATUS_INTERNAL_ERROR"; break;
  }
  if (st == tls_status && !tls_message.empty()) text += " (" + tls_message + ")";
  return text.c_str();
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  *d = reinterpret_cast<cudnnTensorDescriptor_t>(new Tensor());
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor: a null descriptor");
  if (n < 1 || c < 1 || h < 1 || w < 1)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor: an extent below 1");
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                "cudnnSetTensor4dDescriptor: a layout other than NCHW and NHWC");
  if (!type_size(type))
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                "cudnnSetTensor4dDescriptor: a type other than float, double and bfloat16");
  *as<Tensor>(d) = {true, format, type, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  *d = reinterpret_cast<cudnnFilterDescriptor_t>(new Filter());
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor: a null descriptor");
  if (k < 1 || c < 1 || h < 1 || w < 1)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor: an extent below 1");
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                "cudnnSetFilter4dDescriptor: a layout other than NCHW and NHWC");
  if (!type_size(type))
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                "cudnnSetFilter4dDescriptor: a type other than float, double and bfloat16");
  *as<Filter>(d) = {true, format, type, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  *d = reinterpret_cast<cudnnConvolutionDescriptor_t>(new Conv());
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dilation_h, int dilation_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor: a null descriptor");
  if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dilation_h < 1 || dilation_w < 1)
    return fail(
        CUDNN_STATUS_BAD_PARAM,
        "cudnnSetConvolution2dDescriptor: a negative padding, or a stride or dilation below 1");
  Conv& c = *as<Conv>(d);
  c.set = true;
  c.ph = pad_h;
  c.pw = pad_w;
  c.sh = u;
  c.sw = v;
  c.dh = dilation_h;
  c.dw = dilation_w;
  c.mode = mode;
  c.compute = compute;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups) {
  if (!d || groups < 1)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: a group count below 1");
  as<Conv>(d)->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math) {
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: a null descriptor");
  as<Conv>(d)->math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t conv,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int* n, int* c,
                                                    int* h, int* wo) {
  Geometry g;
  if (cudnnStatus_t st = check(as<Tensor>(x), as<Filter>(w), as<Conv>(conv), nullptr,
                               "cudnnGetConvolution2dForwardOutputDim", g))
    return st;
  *n = static_cast<int>(g.n);
  *c = static_cast<int>(g.k);
  *h = static_cast<int>(g.ho);
  *wo = static_cast<int>(g.wo);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t conv,
                                                     const cudnnTensorDescriptor_t y,
                                                     const int requested, int* found,
                                                     cudnnConvolutionFwdAlgoPerf_t* results) {
  Geometry g;
  if (cudnnStatus_t st = check(as<Tensor>(x), as<Filter>(w), as<Conv>(conv), as<Tensor>(y),
                               "cudnnGetConvolutionForwardAlgorithm_v7", g))
    return st;
  return heuristics<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      0, g, *as<Conv>(conv), requested, found, results);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y,
    cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
  Geometry g;
  if (cudnnStatus_t st = check(as<Tensor>(x), as<Filter>(w), as<Conv>(conv), as<Tensor>(y),
                               "cudnnGetConvolutionForwardWorkspaceSize", g))
    return st;
  return workspace_size(0, g, algo, bytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      const cudnnTensorDescriptor_t xd, const void* x,
                                      const cudnnFilterDescriptor_t wd, const void* w,
                                      const cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* workspace,
                                      size_t workspace_bytes, const void* beta,
                                      const cudnnTensorDescriptor_t yd, void* y) {
  Run r{0, {}, x, w, y, workspace, workspace_bytes, 0, 0.0, 0.0, "cudnnConvolutionForward"};
  if (cudnnStatus_t st =
          check(as<Tensor>(xd), as<Filter>(wd), as<Conv>(conv), as<Tensor>(yd), r.who, r.g))
    return st;
  return submit_run(handle, r, alpha, beta, algo);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, const int requested,
    int* found, cudnnConvolutionBwdDataAlgoPerf_t* results) {
  Geometry g;
  if (cudnnStatus_t st = check(as<Tensor>(dx), as<Filter>(w), as<Conv>(conv), as<Tensor>(dy),
                               "cudnnGetConvolutionBackwardDataAlgorithm_v7", g))
    return st;
  return heuristics<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      1, g, *as<Conv>(conv), requested, found, results);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  Geometry g;
  if (cudnnStatus_t st = check(as<Tensor>(dx), as<Filter>(w), as<Conv>(conv), as<Tensor>(dy),
                               "cudnnGetConvolutionBackwardDataWorkspaceSize", g))
    return st;
  return workspace_size(1, g, algo, bytes);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           const cudnnFilterDescriptor_t wd, const void* w,
                                           const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace,
                                           size_t workspace_bytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxd, void* dx) {
  Run r{1, {}, dy, w, dx, workspace, workspace_bytes, 0, 0.0, 0.0, "cudnnConvolutionBackwardData"};
  if (cudnnStatus_t st =
          check(as<Tensor>(dxd), as<Filter>(wd), as<Conv>(conv), as<Tensor>(dyd), r.who, r.g))
    return st;
  return submit_run(handle, r, alpha, beta, algo);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, const int requested,
    int* found, cudnnConvolutionBwdFilterAlgoPerf_t* results) {
  Geometry g;
  if (cudnnStatus_t st = check(as<Tensor>(x), as<Filter>(dw), as<Conv>(conv), as<Tensor>(dy),
                               "cudnnGetConvolutionBackwardFilterAlgorithm_v7", g))
    return st;
  return heuristics<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      2, g, *as<Conv>(conv), requested, found, results);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  Geometry g;
  if (cudnnStatus_t st = check(as<Tensor>(x), as<Filter>(dw), as<Conv>(conv), as<Tensor>(dy),
                               "cudnnGetConvolutionBackwardFilterWorkspaceSize", g))
    return st;
  return workspace_size(2, g, algo, bytes);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xd, const void* x,
                                             const cudnnTensorDescriptor_t dyd, const void* dy,
                                             const cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workspace,
                                             size_t workspace_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwd, void* dw) {
  Run r{
      2, {}, x, dy, dw, workspace, workspace_bytes, 0, 0.0, 0.0, "cudnnConvolutionBackwardFilter"};
  if (cudnnStatus_t st =
          check(as<Tensor>(xd), as<Filter>(dwd), as<Conv>(conv), as<Tensor>(dyd), r.who, r.g))
    return st;
  return submit_run(handle, r, alpha, beta, algo);
}

}  // namespace kiln::emu::cudnn

#endif  // KILN_HAVE_CUDNN

namespace kiln::emu {

void* cudnn_symbol(const char* name) {
#if KILN_HAVE_CUDNN
  using namespace cudnn;
#define KILN_EMU_SYMBOL(fn)        \
  if (std::strcmp(name, #fn) == 0) \
    return reinterpret_cast<void*>(static_cast<decltype(&::fn)>(&fn));
  KILN_CUDNN_FUNCTIONS(KILN_EMU_SYMBOL)
#undef KILN_EMU_SYMBOL
#endif
  return nullptr;
}

}  // namespace kiln::emu
