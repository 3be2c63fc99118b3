// kiln cuda backend: Conv, ConvGradInput and ConvGradWeight on cuDNN
// (conv_cudnn.cpp) wherever its legacy API expresses the convolution, else
// as direct kernels here, one thread per element of the result summing its
// window (f32 accumulation for f32 and bf16, f64 for f64): correct on every
// geometry (strides, dilation, asymmetric padding, groups, NCHW and NHWC),
// not fast. KILN_CUDA_CONV=direct keeps every convolution on the direct
// kernels; =cudnn makes one that cuDNN does not run an error (the tests'
// proof that cuDNN ran). Channels-last convolutions hand cuDNN the filter as
// KRSC, transposed here on the way in (and the weight gradient on the way
// out) where the layouts differ.
// Pool and PoolGrad alike: a thread per output, and per input element
// gathering the windows that cover it (no atomics).
#include <cstdlib>
#include <string>

#include "backend/cuda/conv_cudnn.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "ops/conv_geometry.h"

namespace kiln::cuda {
namespace {

// An NCHW or NHWC index decoded: batch, channel, row, column.
struct Nchw {
  int64_t b, c, y, x;
};
__device__ inline Nchw decode(int64_t i, int64_t c, int64_t h, int64_t w, bool channels_last) {
  Nchw r;
  if (channels_last) {
    r.c = i % c;
    i /= c;
    r.x = i % w;
    i /= w;
    r.y = i % h;
    r.b = i / h;
  } else {
    r.x = i % w;
    i /= w;
    r.y = i % h;
    i /= h;
    r.c = i % c;
    r.b = i / c;
  }
  return r;
}
__device__ inline int64_t encode(const Nchw& e, int64_t c, int64_t h, int64_t w,
                                 bool channels_last) {
  return channels_last ? ((e.b * h + e.y) * w + e.x) * c + e.c
                       : ((e.b * c + e.c) * h + e.y) * w + e.x;
}

template <typename T>
__global__ void conv_forward(ConvGeometry q, const T* x, const T* w, T* y, int64_t n) {
  using A = acc_t<T>;
  KILN_GRID_LOOP(i, n) {
    const Nchw o = decode(i, q.o, q.ho, q.wo, q.channels_last);
    const int64_t g = o.c / q.og;
    A s = 0;
    for (int64_t ic = 0; ic < q.cg; ++ic)
      for (int64_t ki = 0; ki < q.kh; ++ki) {
        const int64_t r = o.y * q.sh - q.ph + ki * q.dh;
        if (r < 0 || r >= q.h) continue;
        for (int64_t kj = 0; kj < q.kw; ++kj) {
          const int64_t col = o.x * q.sw - q.pw + kj * q.dw;
          if (col < 0 || col >= q.w) continue;
          s += load(x, encode({o.b, g * q.cg + ic, r, col}, q.c, q.h, q.w, q.channels_last)) *
               load(w, ((o.c * q.cg + ic) * q.kh + ki) * q.kw + kj);
        }
      }
    y[i] = convert<T>(s);
  }
}

// The output position whose window tap k covers input position p along one
// axis, or -1.
__device__ inline int64_t source(int64_t p, int64_t k, int64_t stride, int64_t dilation,
                                 int64_t pad, int64_t extent) {
  const int64_t t = p + pad - k * dilation;
  if (t < 0 || t % stride) return -1;
  return t / stride < extent ? t / stride : -1;
}

template <typename T>
__global__ void conv_grad_input(ConvGeometry q, const T* dy, const T* w, T* dx, int64_t n) {
  using A = acc_t<T>;
  KILN_GRID_LOOP(i, n) {
    const Nchw e = decode(i, q.c, q.h, q.w, q.channels_last);
    const int64_t g = e.c / q.cg, ic = e.c % q.cg;
    A s = 0;
    for (int64_t ki = 0; ki < q.kh; ++ki) {
      const int64_t oy = source(e.y, ki, q.sh, q.dh, q.ph, q.ho);
      if (oy < 0) continue;
      for (int64_t kj = 0; kj < q.kw; ++kj) {
        const int64_t ox = source(e.x, kj, q.sw, q.dw, q.pw, q.wo);
        if (ox < 0) continue;
        for (int64_t k = 0; k < q.og; ++k) {
          const int64_t oc = g * q.og + k;
          s += load(dy, encode({e.b, oc, oy, ox}, q.o, q.ho, q.wo, q.channels_last)) *
               load(w, ((oc * q.cg + ic) * q.kh + ki) * q.kw + kj);
        }
      }
    }
    dx[i] = convert<T>(s);
  }
}

template <typename T>
__global__ void conv_grad_weight(ConvGeometry q, const T* x, const T* dy, T* dw, int64_t n) {
  using A = acc_t<T>;
  KILN_GRID_LOOP(i, n) {
    const int64_t kj = i % q.kw, ki = i / q.kw % q.kh, ic = i / (q.kw * q.kh) % q.cg,
                  oc = i / (q.kw * q.kh * q.cg);
    const int64_t c = oc / q.og * q.cg + ic;
    A s = 0;
    for (int64_t b = 0; b < q.n; ++b)
      for (int64_t oy = 0; oy < q.ho; ++oy) {
        const int64_t r = oy * q.sh - q.ph + ki * q.dh;
        if (r < 0 || r >= q.h) continue;
        for (int64_t ox = 0; ox < q.wo; ++ox) {
          const int64_t col = ox * q.sw - q.pw + kj * q.dw;
          if (col < 0 || col >= q.w) continue;
          s += load(x, encode({b, c, r, col}, q.c, q.h, q.w, q.channels_last)) *
               load(dy, encode({b, oc, oy, ox}, q.o, q.ho, q.wo, q.channels_last));
        }
      }
    dw[i] = convert<T>(s);
  }
}

// A filter between kiln's OIHW [o, cg, khw] and cuDNN's KRSC [o, khw, cg]
// (i indexes the destination).
template <typename T>
__global__ void filter_to_krsc(const T* w, T* r, int64_t cg, int64_t khw, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    const int64_t ic = i % cg, t = i / cg % khw, oc = i / (cg * khw);
    r[i] = w[(oc * cg + ic) * khw + t];
  }
}
template <typename T>
__global__ void filter_from_krsc(const T* r, T* w, int64_t cg, int64_t khw, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    const int64_t t = i % khw, ic = i / khw % cg, oc = i / (khw * cg);
    w[i] = r[(oc * khw + t) * cg + ic];
  }
}

// Pooling window (b, c, oy, ox): max (the first largest tap, NaN over any
// number; *arg its input index) or the average over the window's count.
template <typename T>
__device__ inline acc_t<T> window_value(const ConvGeometry& q, bool max, bool count_include_pad,
                                        const T* x, int64_t b, int64_t c, int64_t oy, int64_t ox,
                                        int64_t* arg) {
  using A = acc_t<T>;
  A v = 0;
  int64_t best = -1, n = 0;
  for (int64_t ki = 0; ki < q.kh; ++ki) {
    const int64_t r = oy * q.sh - q.ph + ki;
    if (r < 0 || r >= q.h) continue;
    for (int64_t kj = 0; kj < q.kw; ++kj) {
      const int64_t col = ox * q.sw - q.pw + kj;
      if (col < 0 || col >= q.w) continue;
      const int64_t i = encode({b, c, r, col}, q.c, q.h, q.w, q.channels_last);
      const A e = load(x, i);
      ++n;
      if (!max) {
        v += e;
      } else if (best < 0 || e > v || (e != e && v == v)) {
        v = e;
        best = i;
      }
    }
  }
  if (arg) *arg = best;
  return max ? v : v / static_cast<A>(count_include_pad ? q.kh * q.kw : n);
}

template <typename T>
__global__ void pool_forward(ConvGeometry q, bool max, bool count_include_pad, const T* x, T* y,
                             int64_t n) {
  KILN_GRID_LOOP(i, n) {
    const Nchw o = decode(i, q.c, q.ho, q.wo, q.channels_last);
    y[i] = convert<T>(window_value(q, max, count_include_pad, x, o.b, o.c, o.y, o.x, nullptr));
  }
}

// One thread per input element gathers the gradient of every window that
// covers it (a max window's only where it is the window's first largest).
template <typename T>
__global__ void pool_backward(ConvGeometry q, bool max, bool count_include_pad, const T* x,
                              const T* dy, T* dx, int64_t n) {
  using A = acc_t<T>;
  KILN_GRID_LOOP(i, n) {
    const Nchw e = decode(i, q.c, q.h, q.w, q.channels_last);
    A s = 0;
    for (int64_t ki = 0; ki < q.kh; ++ki) {
      const int64_t oy = source(e.y, ki, q.sh, 1, q.ph, q.ho);
      if (oy < 0) continue;
      for (int64_t kj = 0; kj < q.kw; ++kj) {
        const int64_t ox = source(e.x, kj, q.sw, 1, q.pw, q.wo);
        if (ox < 0) continue;
        const A g = load(dy, encode({e.b, e.c, oy, ox}, q.c, q.ho, q.wo, q.channels_last));
        if (max) {
          int64_t arg = -1;
          window_value(q, true, false, x, e.b, e.c, oy, ox, &arg);
          if (arg == i) s += g;
        } else {
          int64_t count = q.kh * q.kw;
          if (!count_include_pad) {
            const int64_t r0 = oy * q.sh - q.ph, c0 = ox * q.sw - q.pw;
            const int64_t rows = (r0 + q.kh < q.h ? r0 + q.kh : q.h) - (r0 > 0 ? r0 : 0);
            const int64_t cols = (c0 + q.kw < q.w ? c0 + q.kw : q.w) - (c0 > 0 ? c0 : 0);
            count = rows * cols;
          }
          s += g / static_cast<A>(count);
        }
      }
    }
    dx[i] = convert<T>(s);
  }
}

void pool_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& a = p.attrs<PoolAttrs>();
  const ConvGeometry q = pool_geometry(a, in[0].shape(), p.name());
  const int64_t n = numel(out.shape);
  const DType dt = in[0].dtype();
  if (dt != DType::f32 && dt != DType::f64 && dt != DType::bf16)
    fail(p.name(), std::string("no cuda kernel for dtype ") + name_of(dt));
  const bool max = a.kind == PoolKind::Max;
  visit_dtype(dt, p.name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, __nv_bfloat16>) {
      T* y = out_ptr<T>(out);
      if (n == 0) return;
      if (p.op() == Op::Pool)
        KILN_LAUNCH(blocks_for(n), 256, 0, s, pool_forward<T>)
        (q, max, a.count_include_pad, ptr<T>(in[0]), y, n);
      else
        KILN_LAUNCH(blocks_for(n), 256, 0, s, pool_backward<T>)
        (q, max, a.count_include_pad, ptr<T>(in[0]), ptr<T>(in[1]), y, n);
      check_launch(p.name());
    }
  });
}

enum class ConvKernels { Auto, Cudnn, Direct };

// KILN_CUDA_CONV, read at each call (tests switch it).
ConvKernels conv_kernels(const char* who) {
  const char* e = std::getenv("KILN_CUDA_CONV");
  const std::string v = e ? e : "";
  if (v.empty() || v == "auto") return ConvKernels::Auto;
  if (v == "cudnn") return ConvKernels::Cudnn;
  if (v == "direct") return ConvKernels::Direct;
  fail(who, "KILN_CUDA_CONV is '" + v + "', expected auto, cudnn or direct");
}

// The pass on cuDNN, with the filter transposed to KRSC and back where the
// plan takes it so; false where cuDNN does not run it (*why says why).
template <typename T>
bool conv_on_cudnn(const KernelContext& ctx, cudaStream_t s, ConvPass pass, const ConvGeometry& q,
                   DType dt, bool tf32, const T* a, const T* b, T* y, const char* who,
                   std::string* why) {
  const CudnnConv* plan = cudnn_conv_plan(ctx.device.index, pass, q, dt, tf32, why);
  if (!plan) return false;
  bool ran;
  if (!cudnn_filter_krsc(q)) {
    ran = cudnn_conv_run(*plan, ctx, s, a, b, y, who);
  } else {
    const int64_t nw = q.o * q.cg * q.kh * q.kw;
    const size_t bytes = static_cast<size_t>(nw) * sizeof(T);
    T* r = static_cast<T*>(ctx.scratch->allocate(bytes));
    // Released once the work on it is queued (stream-ordered), or on a failure.
    struct Release {
      Allocator* alloc;
      void* mem;
      size_t bytes;
      ~Release() { alloc->release(mem, bytes); }
    } release{ctx.scratch, r, bytes};
    if (pass == ConvPass::GradWeight) {
      ran = cudnn_conv_run(*plan, ctx, s, a, b, r, who);
      if (ran) {
        KILN_LAUNCH(blocks_for(nw), 256, 0, s, filter_from_krsc<T>)(r, y, q.cg, q.kh * q.kw, nw);
        check_launch(who);
      }
    } else {
      KILN_LAUNCH(blocks_for(nw), 256, 0, s, filter_to_krsc<T>)(b, r, q.cg, q.kh * q.kw, nw);
      check_launch(who);
      ran = cudnn_conv_run(*plan, ctx, s, a, r, y, who);
    }
  }
  // A refusal as it ran: the plan now says why (and is not offered again).
  if (!ran) cudnn_conv_plan(ctx.device.index, pass, q, dt, tf32, why);
  return ran;
}

void conv_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& a = p.attrs<ConvAttrs>();
  const ConvGeometry q =
      p.op() == Op::Conv            ? conv_geometry(a, in[0].shape(), in[1].shape(), p.name())
      : p.op() == Op::ConvGradInput ? conv_geometry(a, a.input, in[1].shape(), p.name())
                                    : conv_geometry(a, in[0].shape(), a.weight, p.name());
  const ConvPass pass = p.op() == Op::Conv            ? ConvPass::Forward
                        : p.op() == Op::ConvGradInput ? ConvPass::GradInput
                                                      : ConvPass::GradWeight;
  const int64_t n = numel(out.shape);
  const DType dt = in[0].dtype();
  if (dt != DType::f32 && dt != DType::f64 && dt != DType::bf16)
    fail(p.name(), std::string("no cuda kernel for dtype ") + name_of(dt));
  const ConvKernels kernels = conv_kernels(p.name());
  visit_dtype(dt, p.name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, __nv_bfloat16>) {
      T* y = out_ptr<T>(out);
      if (n == 0) return;
      if (kernels != ConvKernels::Direct) {
        std::string why;
        if (conv_on_cudnn(ctx, s, pass, q, dt, a.tf32 && dt == DType::f32, ptr<T>(in[0]),
                          ptr<T>(in[1]), y, p.name(), &why))
          return;
        if (kernels == ConvKernels::Cudnn)
          fail(p.name(), "KILN_CUDA_CONV=cudnn, but cuDNN does not run this convolution: " + why);
      }
      if (pass == ConvPass::Forward) {
        KILN_LAUNCH(blocks_for(n), 256, 0, s, conv_forward<T>)
        (q, ptr<T>(in[0]), ptr<T>(in[1]), y, n);
      } else if (pass == ConvPass::GradInput) {
        KILN_LAUNCH(blocks_for(n), 256, 0, s, conv_grad_input<T>)
        (q, ptr<T>(in[0]), ptr<T>(in[1]), y, n);
      } else {
        KILN_LAUNCH(blocks_for(n), 256, 0, s, conv_grad_weight<T>)
        (q, ptr<T>(in[0]), ptr<T>(in[1]), y, n);
      }
      check_launch(p.name());
    }
  });
}

}  // namespace

void register_conv(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Conv)] = conv_kernel;
  t.kernels[static_cast<int>(Op::ConvGradInput)] = conv_kernel;
  t.kernels[static_cast<int>(Op::ConvGradWeight)] = conv_kernel;
  t.kernels[static_cast<int>(Op::Pool)] = pool_kernel;
  t.kernels[static_cast<int>(Op::PoolGrad)] = pool_kernel;
}

}  // namespace kiln::cuda
