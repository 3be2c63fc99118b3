// kiln cuda backend: convolutions through cuDNN's legacy API (conv_cudnn.h).
//
// Each distinct pass (device, pass, dtype, geometry) gets its descriptors
// and algorithm on first use, cached for the process, so that a training
// step never asks cuDNN's heuristics again. The algorithm is the first that
// cuDNN's heuristics rank (cudnnGet*Algorithm_v7) among those it runs within
// kMaxWorkspace, the deterministic ones first: a step's gradients are then
// the same from run to run, as on the cpu.
//
// Types: f32 on FMA math (no TF32: the f32 results match the cpu's within
// f32 rounding) unless the op is tf32 (set_matmul_precision(tf32): TF32
// tensor-op math, as PyTorch's cudnn.allow_tf32), bf16 with f32
// accumulation on tensor cores, f64. Layouts: NCHW with kiln's OIHW filter,
// NHWC with the KRSC filter cuDNN's NHWC kernels take (conv.cu transposes).
//
// The legacy API pads both sides of an axis alike. kiln's padding before is
// cuDNN's; the padding after only decides how many outputs there are (every
// padded element is zero either way), so a convolution runs here whenever
// that count is the same with the padding before on both sides: every
// symmetric padding, and "valid" windows whose leftovers are dropped.
//
// Where cuDNN is absent (a build without its headers, a machine without
// libcudnn) or refuses a shape when it runs (a NOT_SUPPORTED status: its
// heuristics rank what may still be refused), the plan says so and conv.cu
// runs its direct kernels.
#include "backend/cuda/conv_cudnn.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/dynlib.h"

namespace kiln::cuda {

#if KILN_HAVE_CUDNN

struct CudnnConv {
  bool ok = false;
  std::string why;  // where !ok
  ConvPass pass = ConvPass::Forward;
  int device = 0;
  bool f64 = false;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;
  // Set when cuDNN refused the planned algorithm as it ran (NOT_SUPPORTED):
  // the shape runs on the direct kernels from then on. `refusal` (what cuDNN
  // said) is written once, under the device's handle lock, before `refused`.
  mutable std::atomic<bool> refused{false};
  mutable std::string refusal;
};

namespace {

constexpr int kMaxDevices = 64;
// The most workspace an algorithm may ask for.
constexpr size_t kMaxWorkspace = size_t{256} << 20;

bool transform_algorithm(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transform_algorithm(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transform_algorithm(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

std::string status_text(cudnnStatus_t st) {
  return dyn::cudnnGetErrorString(st);
}

// Each device's cuDNN handle and the lock its calls hold: a handle's stream
// is state (cudnnSetStream), set before each call.
struct Handle {
  std::mutex mu;
  cudnnHandle_t h = nullptr;
};
Handle& handle(int device) {
  static Handle handles[kMaxDevices];
  if (device < 0 || device >= kMaxDevices)
    fail("Conv", "cuda:" + std::to_string(device) + ": no such device");
  return handles[device];
}

struct Key {
  int device;
  ConvPass pass;
  DType dt;
  bool tf32;
  std::array<int64_t, 19> g;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int>()(k.device) * 31 + static_cast<size_t>(k.pass) * 7 +
               static_cast<size_t>(k.dt) * 2 + (k.tf32 ? 1 : 0);
    for (int64_t v : k.g) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

Key key_of(int device, ConvPass pass, const ConvGeometry& q, DType dt, bool tf32) {
  return {device,
          pass,
          dt,
          tf32,
          {q.n, q.c, q.h, q.w, q.o, q.kh, q.kw, q.ho, q.wo, q.groups, q.sh, q.sw, q.dh, q.dw, q.ph,
           q.pw, q.ph_after, q.pw_after, q.channels_last ? 1 : 0}};
}

// The algorithms of a pass that kiln takes, in the order it tries them:
// cuDNN's ranking, the deterministic ones first; those that finish with
// status SUCCESS within kMaxWorkspace; for f32 none that needs tensor-core
// math unless tf32, and for f32 and f64 none of the FFT and non-fused Winograd
// transforms (their error is above the plain sums' rounding, which the
// tests hold f32 and f64 to).
template <typename Perf>
std::vector<const Perf*> candidates(const Perf* r, int count, DType dt, bool tf32) {
  std::vector<const Perf*> out;
  for (bool deterministic : {true, false})
    for (int i = 0; i < count; ++i) {
      if (r[i].status != CUDNN_STATUS_SUCCESS || r[i].memory > kMaxWorkspace) continue;
      if ((r[i].determinism == CUDNN_DETERMINISTIC) != deterministic) continue;
      if (dt == DType::f32 && !tf32 && r[i].mathType != CUDNN_FMA_MATH &&
          r[i].mathType != CUDNN_DEFAULT_MATH)
        continue;
      if (dt != DType::bf16 && transform_algorithm(r[i].algo)) continue;
      out.push_back(&r[i]);
    }
  return out;
}

// Fills p for the pass, or says why cuDNN does not run it.
std::string build(CudnnConv& p, ConvPass pass, const ConvGeometry& q, DType dt, bool tf32) {
  p.pass = pass;
  cudnnDataType_t type, compute;
  switch (dt) {
    case DType::f32: type = compute = CUDNN_DATA_FLOAT; break;
    case DType::f64: type = compute = CUDNN_DATA_DOUBLE; break;
    case DType::bf16:
      type = CUDNN_DATA_BFLOAT16;
      compute = CUDNN_DATA_FLOAT;
      break;
    default: return std::string("dtype ") + name_of(dt);
  }
  p.f64 = dt == DType::f64;
  for (int64_t v : {q.n, q.c, q.h, q.w, q.o, q.kh, q.kw, q.ho, q.wo, q.groups, q.sh, q.sw, q.dh,
                    q.dw, q.ph, q.pw})
    if (v > INT_MAX) return "an extent past int32";
  for (int64_t e : {q.n * q.c * q.h * q.w, q.n * q.o * q.ho * q.wo, q.o * q.cg * q.kh * q.kw})
    if (e > INT_MAX) return "a tensor of more than 2^31 - 1 elements";
  if (q.c == 0 || q.o == 0) return "no channels";
  const int64_t eh = q.dh * (q.kh - 1) + 1, ew = q.dw * (q.kw - 1) + 1;
  if (q.h + 2 * q.ph < eh || (q.h + 2 * q.ph - eh) / q.sh + 1 != q.ho || q.w + 2 * q.pw < ew ||
      (q.w + 2 * q.pw - ew) / q.sw + 1 != q.wo)
    return "padding (" + std::to_string(q.ph) + ", " + std::to_string(q.ph_after) + ") x (" +
           std::to_string(q.pw) + ", " + std::to_string(q.pw_after) +
           ") that the same padding on both sides would not give";
  const cudnnTensorFormat_t format = q.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  std::string error;
  auto ok = [&](cudnnStatus_t st, const char* what) {
    if (st != CUDNN_STATUS_SUCCESS && error.empty())
      error = std::string(what) + ": " + status_text(st);
    return error.empty();
  };
  auto i = [](int64_t v) { return static_cast<int>(v); };
  if (!ok(dyn::cudnnCreateTensorDescriptor(&p.x), "cudnnCreateTensorDescriptor") ||
      !ok(dyn::cudnnCreateTensorDescriptor(&p.y), "cudnnCreateTensorDescriptor") ||
      !ok(dyn::cudnnCreateFilterDescriptor(&p.w), "cudnnCreateFilterDescriptor") ||
      !ok(dyn::cudnnCreateConvolutionDescriptor(&p.conv), "cudnnCreateConvolutionDescriptor") ||
      !ok(dyn::cudnnSetTensor4dDescriptor(p.x, format, type, i(q.n), i(q.c), i(q.h), i(q.w)),
          "cudnnSetTensor4dDescriptor(x)") ||
      !ok(dyn::cudnnSetTensor4dDescriptor(p.y, format, type, i(q.n), i(q.o), i(q.ho), i(q.wo)),
          "cudnnSetTensor4dDescriptor(y)") ||
      !ok(dyn::cudnnSetFilter4dDescriptor(p.w, type, format, i(q.o), i(q.cg), i(q.kh), i(q.kw)),
          "cudnnSetFilter4dDescriptor") ||
      !ok(dyn::cudnnSetConvolution2dDescriptor(p.conv, i(q.ph), i(q.pw), i(q.sh), i(q.sw), i(q.dh),
                                               i(q.dw), CUDNN_CROSS_CORRELATION, compute),
          "cudnnSetConvolution2dDescriptor") ||
      !ok(dyn::cudnnSetConvolutionGroupCount(p.conv, i(q.groups)), "cudnnSetConvolutionGroupCount"))
    return error;
  // f32 on FMA math unless tf32 (TF32 tensor-op math; cuDNN's default math
  // would allow TF32 too on Ampere and later).
  const bool tensor_ops = dt == DType::bf16 || (dt == DType::f32 && tf32);
  const cudnnMathType_t math = dt == DType::f32 && !tf32 ? CUDNN_FMA_MATH
                               : tensor_ops              ? CUDNN_TENSOR_OP_MATH
                                                         : CUDNN_DEFAULT_MATH;
  if (!ok(dyn::cudnnSetConvolutionMathType(p.conv, math), "cudnnSetConvolutionMathType"))
    return error;
  int n = 0, c = 0, h = 0, w = 0;
  if (!ok(dyn::cudnnGetConvolution2dForwardOutputDim(p.conv, p.x, p.w, &n, &c, &h, &w),
          "cudnnGetConvolution2dForwardOutputDim"))
    return error;
  if (n != q.n || c != q.o || h != q.ho || w != q.wo)
    return "cuDNN's output " + std::to_string(n) + "x" + std::to_string(c) + "x" +
           std::to_string(h) + "x" + std::to_string(w) + " differs from kiln's";

  // The first candidate whose workspace (as the size query gives it too)
  // stays within kMaxWorkspace.
  auto pick = [&](auto* results, int found, auto workspace_of) -> std::string {
    for (const auto* r : candidates(results, found, dt, tf32)) {
      if (tensor_ops &&
          !ok(dyn::cudnnSetConvolutionMathType(p.conv, r->mathType), "cudnnSetConvolutionMathType"))
        return error;
      size_t bytes = 0;
      if (!ok(workspace_of(r->algo, &bytes), "the workspace size")) return error;
      if (bytes > kMaxWorkspace) continue;
      p.algo = static_cast<int>(r->algo);
      p.workspace = std::max(bytes, r->memory);
      return {};
    }
    return "no algorithm of cuDNN's for it";
  };
  constexpr int kAsk = 16;
  int found = 0;
  Handle& hd = handle(p.device);
  std::lock_guard<std::mutex> lock(hd.mu);
  if (!hd.h && !ok(dyn::cudnnCreate(&hd.h), "cudnnCreate")) return error;
  std::string e;
  if (pass == ConvPass::Forward) {
    cudnnConvolutionFwdAlgoPerf_t r[kAsk];
    if (!ok(dyn::cudnnGetConvolutionForwardAlgorithm_v7(hd.h, p.x, p.w, p.conv, p.y, kAsk, &found,
                                                        r),
            "cudnnGetConvolutionForwardAlgorithm_v7"))
      return error;
    e = pick(r, found, [&](cudnnConvolutionFwdAlgo_t a, size_t* b) {
      return dyn::cudnnGetConvolutionForwardWorkspaceSize(hd.h, p.x, p.w, p.conv, p.y, a, b);
    });
  } else if (pass == ConvPass::GradInput) {
    cudnnConvolutionBwdDataAlgoPerf_t r[kAsk];
    if (!ok(dyn::cudnnGetConvolutionBackwardDataAlgorithm_v7(hd.h, p.w, p.y, p.conv, p.x, kAsk,
                                                             &found, r),
            "cudnnGetConvolutionBackwardDataAlgorithm_v7"))
      return error;
    e = pick(r, found, [&](cudnnConvolutionBwdDataAlgo_t a, size_t* b) {
      return dyn::cudnnGetConvolutionBackwardDataWorkspaceSize(hd.h, p.w, p.y, p.conv, p.x, a, b);
    });
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t r[kAsk];
    if (!ok(dyn::cudnnGetConvolutionBackwardFilterAlgorithm_v7(hd.h, p.x, p.y, p.conv, p.w, kAsk,
                                                               &found, r),
            "cudnnGetConvolutionBackwardFilterAlgorithm_v7"))
      return error;
    e = pick(r, found, [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* b) {
      return dyn::cudnnGetConvolutionBackwardFilterWorkspaceSize(hd.h, p.x, p.y, p.conv, p.w, a, b);
    });
  }
  if (!e.empty()) return e;
  p.ok = true;
  return {};
}

}  // namespace

// Whether libcudnn loads (tried once per process); *why: why not.
bool cudnn_loadable(std::string* why) {
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      dyn::cudnnGetErrorString(CUDNN_STATUS_SUCCESS);
    } catch (const Error& e) {
      error = std::string("cuDNN is not available: ") + e.what();
    }
  });
  if (!error.empty() && why) *why = error;
  return error.empty();
}

const CudnnConv* cudnn_conv_plan(int device, ConvPass pass, const ConvGeometry& q, DType dt,
                                 bool tf32, std::string* why) {
  if (!cudnn_loadable(why)) return nullptr;
  // Plans are never destroyed (convolutions may run during exit).
  static std::mutex mu;
  static auto* plans = new std::unordered_map<Key, std::unique_ptr<CudnnConv>, KeyHash>();
  const Key k = key_of(device, pass, q, dt, tf32);
  CudnnConv* p;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans->find(k);
    if (it != plans->end()) {
      p = it->second.get();
    } else {
      auto made = std::make_unique<CudnnConv>();
      made->device = device;
      made->why = build(*made, pass, q, dt, tf32);
      p = plans->emplace(k, std::move(made)).first->second.get();
    }
  }
  if (!p->ok || p->refused.load(std::memory_order_acquire)) {
    if (why) *why = p->ok ? "cuDNN refused it as it ran: " + p->refusal : p->why;
    return nullptr;
  }
  return p;
}

bool cudnn_conv_run(const CudnnConv& p, const KernelContext& ctx, cudaStream_t s, const void* a,
                    const void* b, void* out, const char* who) {
  void* ws = p.workspace ? ctx.scratch->allocate(p.workspace) : nullptr;
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const void* one = p.f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* zero = p.f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  cudnnStatus_t st;
  const char* what = "cudnnSetStream";
  {
    Handle& hd = handle(p.device);
    std::lock_guard<std::mutex> lock(hd.mu);
    st = dyn::cudnnSetStream(hd.h, s);
    if (st == CUDNN_STATUS_SUCCESS) {
      switch (p.pass) {
        case ConvPass::Forward:
          what = "cudnnConvolutionForward";
          st = dyn::cudnnConvolutionForward(hd.h, one, p.x, a, p.w, b, p.conv,
                                            static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), ws,
                                            p.workspace, zero, p.y, out);
          break;
        case ConvPass::GradInput:
          what = "cudnnConvolutionBackwardData";
          st = dyn::cudnnConvolutionBackwardData(hd.h, one, p.w, b, p.y, a, p.conv,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo),
                                                 ws, p.workspace, zero, p.x, out);
          break;
        case ConvPass::GradWeight:
          what = "cudnnConvolutionBackwardFilter";
          st = dyn::cudnnConvolutionBackwardFilter(
              hd.h, one, p.x, a, p.y, b, p.conv,
              static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), ws, p.workspace, zero, p.w,
              out);
          break;
      }
    }
  }
  if (ws) ctx.scratch->release(ws, p.workspace);
  if (st == CUDNN_STATUS_SUCCESS) return true;
  const std::string message = std::string(what) + ": " + status_text(st);
  if (st / 1000 != CUDNN_STATUS_NOT_SUPPORTED / 1000) fail(who, message);
  {
    std::lock_guard<std::mutex> lock(handle(p.device).mu);
    if (!p.refused.load(std::memory_order_relaxed)) {
      p.refusal = message;
      p.refused.store(true, std::memory_order_release);
    }
  }
  return false;
}

#else  // !KILN_HAVE_CUDNN

struct CudnnConv {};

const CudnnConv* cudnn_conv_plan(int, ConvPass, const ConvGeometry&, DType, bool,
                                 std::string* why) {
  if (why) *why = "kiln was built without cuDNN's headers";
  return nullptr;
}

bool cudnn_conv_run(const CudnnConv&, const KernelContext&, cudaStream_t, const void*, const void*,
                    void*, const char* who) {
  fail(who, "kiln was built without cuDNN's headers");
}

#endif  // KILN_HAVE_CUDNN

bool cudnn_filter_krsc(const ConvGeometry& q) {
  return q.channels_last && q.cg > 1 && q.kh * q.kw > 1;
}

}  // namespace kiln::cuda
