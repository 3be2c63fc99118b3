// kiln cpu backend: Conv, ConvGradInput and ConvGradWeight. f32 and bf16 run
// oneDNN's convolution primitives (forward, backward data, backward weights)
// on the arrays' own layouts (NCHW or NHWC, the weight OIHW or GOIHW: the
// same memory as [O, C / groups, KH, KW]; for NHWC the weights reordered to
// and from the blocked format oneDNN's kernels choose), created once per
// shape and cached per thread; bf16 accumulates in f32. f32 convolutions
// take oneDNN's Winograd kernels where its own heuristic picks them (3x3,
// stride 1, enough channels, AVX-512), on blocked copies of the
// activations. Where the CPU has no bf16 unit the
// bf16 operands are widened to f32 (exactly), as matmuls are. f64 (gradient
// checks) is a plain loop over the window's taps. Pool and PoolGrad are
// loops over each window: channels last over an image's contiguous
// channels, a thread per range of images; otherwise a thread per range of
// (batch, channel) planes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/cpu/kernels.h"
#include "ops/conv_geometry.h"

namespace kiln::cpu {
namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One argument of a cached convolution: the memory the caller holds (plain
// NCHW/NHWC activations, OIHW weights) and the one the primitive takes; where
// they differ (weights or Winograd's activations in a blocked format), a
// reorder between them through scratch memory.
struct ConvArg {
  int arg = 0;
  dnnl::memory::desc user, prim;
  std::optional<dnnl::reorder> reorder;  // user -> prim for inputs, prim -> user for the output
};

struct CachedConv {
  dnnl::primitive prim;
  ConvArg in0, in1, out;  // the oneDNN arguments of in[0], in[1] and the output
};

ConvArg conv_arg(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& prim,
                 bool output) {
  ConvArg a{arg, user, prim, std::nullopt};
  if (user != prim)
    a.reorder = output
                    ? dnnl::reorder(dnnl::reorder::primitive_desc(engine(), prim, engine(), user))
                    : dnnl::reorder(dnnl::reorder::primitive_desc(engine(), user, engine(), prim));
  return a;
}

// The shapes of one convolution as oneDNN's descriptors.
struct ConvDescs {
  dnnl::memory::desc x, w, y;  // the caller's layouts
  dnnl::memory::dims strides, dilation, lo, hi;
};

// Any format: the one oneDNN's kernel prefers.
dnnl::memory::desc any(const dnnl::memory::desc& d) {
  return dnnl::memory::desc(d.dims(), d.data_type(), dnnl::memory::format_tag::any);
}

// How the cpu runs convolutions: KILN_CONV=auto (the default: GEMMs for
// pointwise ones, oneDNN's convolution primitives for the rest, Winograd's
// where oneDNN picks them), primitive (oneDNN's convolution primitives for
// every shape: an A/B of the GEMMs) or direct (oneDNN's direct kernels
// alone: an A/B of Winograd's too).
enum class ConvRoute { automatic, primitive, direct };

ConvRoute conv_route() {
  static const ConvRoute route = [] {
    const char* e = std::getenv("KILN_CONV");
    const std::string v = e ? e : "";
    if (v.empty() || v == "auto") return ConvRoute::automatic;
    if (v == "primitive") return ConvRoute::primitive;
    if (v == "direct") return ConvRoute::direct;
    fail("Conv", "KILN_CONV is '" + v + "', expected auto, primitive or direct");
  }();
  return route;
}

bool winograd_allowed() {
  return conv_route() != ConvRoute::direct;
}

bool is_winograd(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).find("wino") != std::string::npos;
}

// The convolution on oneDNN's Winograd kernels (F(4x4, 3x3) on AVX-512 in
// oneDNN 2.6) when convolution_auto, oneDNN's own choice for this shape and
// this CPU, picks them, each pass (forward, backward data, backward weights)
// deciding for itself; nullopt otherwise. They take blocked activations,
// reordered from and to the caller's layout (a pass over memory a side, at
// 1-2% of the convolution's time), and run ResNet-50's 3x3 convolutions at
// 2-2.4x the direct kernels' speed. Rounding differs from the direct kernels
// (the transforms' sums), within f32's usual error for such sums.
std::optional<CachedConv> winograd_conv(Op op, const ConvDescs& d) {
  const auto alg = dnnl::algorithm::convolution_auto;
  const dnnl::memory::desc x = any(d.x), w = any(d.w), y = any(d.y);
  try {
    const dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, w, y, d.strides,
                                        d.dilation, d.lo, d.hi),
        engine());
    if (op == Op::Conv) {
      if (!is_winograd(fwd)) return std::nullopt;
      return CachedConv{dnnl::convolution_forward(fwd),
                        conv_arg(DNNL_ARG_SRC, d.x, fwd.src_desc(), false),
                        conv_arg(DNNL_ARG_WEIGHTS, d.w, fwd.weights_desc(), false),
                        conv_arg(DNNL_ARG_DST, d.y, fwd.dst_desc(), true)};
    }
    if (op == Op::ConvGradInput) {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(alg, x, w, y, d.strides, d.dilation, d.lo, d.hi),
          engine(), fwd);
      if (!is_winograd(pd)) return std::nullopt;
      return CachedConv{dnnl::convolution_backward_data(pd),
                        conv_arg(DNNL_ARG_DIFF_DST, d.y, pd.diff_dst_desc(), false),
                        conv_arg(DNNL_ARG_WEIGHTS, d.w, pd.weights_desc(), false),
                        conv_arg(DNNL_ARG_DIFF_SRC, d.x, pd.diff_src_desc(), true)};
    }
    const dnnl::convolution_backward_weights::primitive_desc pd(
        dnnl::convolution_backward_weights::desc(alg, x, w, y, d.strides, d.dilation, d.lo, d.hi),
        engine(), fwd);
    if (!is_winograd(pd)) return std::nullopt;
    return CachedConv{dnnl::convolution_backward_weights(pd),
                      conv_arg(DNNL_ARG_SRC, d.x, pd.src_desc(), false),
                      conv_arg(DNNL_ARG_DIFF_DST, d.y, pd.diff_dst_desc(), false),
                      conv_arg(DNNL_ARG_DIFF_WEIGHTS, d.w, pd.diff_weights_desc(), true)};
  } catch (const dnnl::error&) {  // no kernel for this shape: the direct ones
    return std::nullopt;
  }
}

CachedConv make_conv(Op op, const ConvGeometry& q, DType dt) {
  using dnnl::memory;
  using dims = memory::dims;
  const memory::data_type t = dt == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::format_tag act =
      q.channels_last ? memory::format_tag::nhwc : memory::format_tag::nchw;
  const dims w_dims =
      q.groups > 1 ? dims{q.groups, q.og, q.cg, q.kh, q.kw} : dims{q.o, q.c, q.kh, q.kw};
  const ConvDescs d{
      memory::desc(dims{q.n, q.c, q.h, q.w}, t, act),
      memory::desc(w_dims, t, q.groups > 1 ? memory::format_tag::goihw : memory::format_tag::oihw),
      memory::desc(dims{q.n, q.o, q.ho, q.wo}, t, act),
      dims{q.sh, q.sw},
      dims{q.dh - 1, q.dw - 1},
      dims{q.ph, q.pw},
      dims{q.ph_after, q.pw_after}};
  if (dt == DType::f32 && q.groups == 1 && winograd_allowed())
    if (auto c = winograd_conv(op, d)) return std::move(*c);
  // Channels-last activations: the weights in the format oneDNN's direct
  // kernels want (blocked; reordered on each call, they are small). With
  // plain OIHW weights oneDNN 2.6 has only its reference loops for NHWC,
  // ~190x slower; NCHW runs its im2col + GEMM kernels on plain weights.
  const memory::desc w_any = q.channels_last ? any(d.w) : d.w;
  const auto alg = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::desc fwd(dnnl::prop_kind::forward_training, alg, d.x, w_any, d.y,
                                            d.strides, d.dilation, d.lo, d.hi);
  const dnnl::convolution_forward::primitive_desc fwd_pd(fwd, engine());
  if (op == Op::Conv)
    return {dnnl::convolution_forward(fwd_pd), conv_arg(DNNL_ARG_SRC, d.x, d.x, false),
            conv_arg(DNNL_ARG_WEIGHTS, d.w, fwd_pd.weights_desc(), false),
            conv_arg(DNNL_ARG_DST, d.y, d.y, true)};
  if (op == Op::ConvGradInput) {
    const dnnl::convolution_backward_data::desc bd(alg, d.x, w_any, d.y, d.strides, d.dilation,
                                                   d.lo, d.hi);
    const dnnl::convolution_backward_data::primitive_desc pd(bd, engine(), fwd_pd);
    return {dnnl::convolution_backward_data(pd), conv_arg(DNNL_ARG_DIFF_DST, d.y, d.y, false),
            conv_arg(DNNL_ARG_WEIGHTS, d.w, pd.weights_desc(), false),
            conv_arg(DNNL_ARG_DIFF_SRC, d.x, d.x, true)};
  }
  const dnnl::convolution_backward_weights::desc bw(alg, d.x, w_any, d.y, d.strides, d.dilation,
                                                    d.lo, d.hi);
  const dnnl::convolution_backward_weights::primitive_desc pd(bw, engine(), fwd_pd);
  return {dnnl::convolution_backward_weights(pd), conv_arg(DNNL_ARG_SRC, d.x, d.x, false),
          conv_arg(DNNL_ARG_DIFF_DST, d.y, d.y, false),
          conv_arg(DNNL_ARG_DIFF_WEIGHTS, d.w, pd.diff_weights_desc(), true)};
}

void run_onednn(const Primitive& p, const ConvGeometry& q, DType dt, const void* a, const void* b,
                void* y) {
  thread_local std::unordered_map<std::string, CachedConv> cache;
  const std::string key =
      p.str() + " " + str(q.input_shape()) + " " + str(q.weight_shape()) + " " + name_of(dt);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_conv(p.op(), q, dt)).first;
  CachedConv& c = it->second;
  thread_local dnnl::stream stream(engine());
  // The reordered copies live in one scratch buffer per thread, shared by
  // the cached convolutions, each copy 64-byte aligned (oneDNN's Winograd
  // kernels store with aligned instructions).
  constexpr size_t kAlign = 64;
  auto padded = [](const ConvArg& arg) {
    return arg.reorder ? (arg.prim.get_size() + kAlign - 1) / kAlign * kAlign : 0;
  };
  thread_local std::vector<char> scratch;
  const size_t need = padded(c.in0) + padded(c.in1) + padded(c.out) + kAlign;
  if (scratch.size() < need) scratch.resize(need);
  char* next = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(scratch.data()) + kAlign - 1) /
                                       kAlign * kAlign);
  // The memory the primitive reads or writes for one argument: the caller's,
  // or a scratch copy in the primitive's format.
  auto bind = [&](ConvArg& arg, void* data) {
    const dnnl::memory user(arg.user, engine(), data);
    if (!arg.reorder) return std::pair{user, user};
    char* copy = next;
    next += padded(arg);
    return std::pair{user, dnnl::memory(arg.prim, engine(), copy)};
  };
  auto [u0, m0] = bind(c.in0, const_cast<void*>(a));
  auto [u1, m1] = bind(c.in1, const_cast<void*>(b));
  auto [uy, my] = bind(c.out, y);
  if (c.in0.reorder) c.in0.reorder->execute(stream, u0, m0);
  if (c.in1.reorder) c.in1.reorder->execute(stream, u1, m1);
  c.prim.execute(stream, {{c.in0.arg, m0}, {c.in1.arg, m1}, {c.out.arg, my}});
  if (c.out.reorder) c.out.reorder->execute(stream, my, uy);
  stream.wait();
}

// A pointwise convolution over channels-last activations as one GEMM of
// the [N*HO*WO, C] rows of the pixels its window reads (operands as the
// primitive takes them: x, w for Conv; dy, w for ConvGradInput; x, dy for
// ConvGradWeight). Unstrided, those rows are x itself; strided (ResNet's
// downsampling shortcuts), a compact copy of every (sh, sw)-th pixel, and
// ConvGradInput's product goes back to those pixels of a zeroed dx. dt is
// f32, or bf16 where the cpu has a bf16 GEMM unit.
void run_pointwise_gemm(Op op, const ConvGeometry& q, DType dt, const void* a, const void* b,
                        void* y) {
  const int64_t rows = q.n * q.ho * q.wo;
  const bool strided = q.ho != q.h || q.wo != q.w;
  const size_t row_bytes = q.c * size_of(dt);
  // Calls f(row, pixel) for each output pixel and the input pixel it reads.
  auto for_each_row = [&](auto&& f) {
    parallel_for(rows, q.c, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b_ = r / (q.ho * q.wo), i = r / q.wo % q.ho, j = r % q.wo;
        f(r, (b_ * q.h + i * q.sh) * q.w + j * q.sw);
      }
    });
  };
  std::optional<Buffer> picked;
  if (strided) picked.emplace(&cpu_allocator(), rows * row_bytes, Device::cpu());
  auto pick = [&](const void* x) -> const void* {
    if (!strided) return x;
    auto* dst = static_cast<char*>(picked->data());
    const auto* src = static_cast<const char*>(x);
    for_each_row([&](int64_t r, int64_t px) {
      std::memcpy(dst + r * row_bytes, src + px * row_bytes, row_bytes);
    });
    return dst;
  };
  if (op == Op::Conv) {  // y[rows, O] = x[rows, C] · W[O, C]ᵀ
    gemm(false, true, rows, q.o, q.c, dt, dt, pick(a), b, y);
  } else if (op == Op::ConvGradWeight) {  // dW[O, C] = dy[rows, O]ᵀ · x[rows, C]
    gemm(true, false, q.o, q.c, rows, dt, dt, b, pick(a), y);
  } else if (!strided) {  // dx[rows, C] = dy[rows, O] · W[O, C]
    gemm(false, false, rows, q.c, q.o, dt, dt, a, b, y);
  } else {
    gemm(false, false, rows, q.c, q.o, dt, dt, a, b, picked->data());
    std::memset(y, 0, q.n * q.h * q.w * row_bytes);
    const auto* src = static_cast<const char*>(picked->data());
    auto* dst = static_cast<char*>(y);
    for_each_row([&](int64_t r, int64_t px) {
      std::memcpy(dst + px * row_bytes, src + r * row_bytes, row_bytes);
    });
  }
}

void run(const Primitive& p, const ConvGeometry& q, DType dt, const void* a, const void* b,
         void* y) {
  if (conv_runs_as_gemm(q)) return run_pointwise_gemm(p.op(), q, dt, a, b, y);
  run_onednn(p, q, dt, a, b, y);
}

// f32 copies of bf16 values, and back.
std::unique_ptr<Buffer> widened(const Array& x) {
  auto b = std::make_unique<Buffer>(
      &cpu_allocator(), std::max<int64_t>(numel(x.shape()), 1) * sizeof(float), Device::cpu());
  const bf16* src = x.data<bf16>();
  float* dst = static_cast<float*>(b->data());
  parallel_for(numel(x.shape()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dst[i] = static_cast<float>(src[i]);
  });
  return b;
}

template <typename T>
void direct(const Primitive& p, const ConvGeometry& q, const T* a, const T* b, T* y, int64_t n) {
  std::fill(y, y + n, T(0));
  if (p.op() == Op::Conv)
    for_each_tap(q, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += a[xi] * b[wi]; });
  else if (p.op() == Op::ConvGradInput)
    for_each_tap(q, [&](int64_t xi, int64_t wi, int64_t yi) { y[xi] += a[yi] * b[wi]; });
  else
    for_each_tap(q, [&](int64_t xi, int64_t wi, int64_t yi) { y[wi] += a[xi] * b[yi]; });
}

// A depthwise convolution's weight gradient, channels last (ConvNeXt's 7x7:
// oneDNN's kernel ran it at a fifth of the forward's speed): dW[c, i, j] =
// sum over (b, y, x) of dy[b, y, x, c] * x[b, y*sh - ph + i*dh, x*sw - pw +
// j*dw, c], each tap's sums over a row of output pixels vectorized over the
// contiguous channels, in f32 (bf16 values widened as they are read). The
// rows are split into a fixed number of blocks whose partial sums are added
// in block order, so that the result does not depend on the thread count.
template <typename T>
void depthwise_grad_weight_nhwc(const ConvGeometry& q, const T* x, const T* dy, T* dw) {
  const int64_t c = q.c, taps = q.kh * q.kw, rows = q.n * q.ho;
  const int64_t blocks = std::min<int64_t>(rows, 32);
  std::vector<float> part(static_cast<size_t>(blocks * taps * c), 0.0f);
  auto load = [](const T* v, int64_t i) {
    if constexpr (std::is_same_v<T, bf16>)
      return widen_bf16(v[i].bits);
    else
      return static_cast<float>(v[i]);
  };
  parallel_for(blocks, rows / blocks * q.wo * taps * c, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* acc = part.data() + k * taps * c;
      for (int64_t row = k * rows / blocks; row < (k + 1) * rows / blocks; ++row) {
        const int64_t b = row / q.ho, yo = row % q.ho;
        const T* dyrow = dy + (b * q.ho + yo) * q.wo * c;
        for (int64_t i = 0; i < q.kh; ++i) {
          const int64_t r = yo * q.sh - q.ph + i * q.dh;
          if (r < 0 || r >= q.h) continue;
          const T* xrow = x + (b * q.h + r) * q.w * c;
          for (int64_t j = 0; j < q.kw; ++j) {
            float* a = acc + (i * q.kw + j) * c;
            for (int64_t xo = 0; xo < q.wo; ++xo) {
              const int64_t col = xo * q.sw - q.pw + j * q.dw;
              if (col < 0 || col >= q.w) continue;
              const T* xv = xrow + col * c;
              const T* gv = dyrow + xo * c;
#pragma omp simd
              for (int64_t ch = 0; ch < c; ++ch) a[ch] += load(gv, ch) * load(xv, ch);
            }
          }
        }
      }
    }
  });
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t t = 0; t < taps; ++t) {
      float v = 0;
      for (int64_t k = 0; k < blocks; ++k) v += part[(k * taps + t) * c + ch];
      dw[ch * taps + t] = st<T>(v);
    }
}

void conv_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  const auto& a = p.attrs<ConvAttrs>();
  const ConvGeometry q =
      p.op() == Op::Conv            ? conv_geometry(a, in[0].shape(), in[1].shape(), p.name())
      : p.op() == Op::ConvGradInput ? conv_geometry(a, a.input, in[1].shape(), p.name())
                                    : conv_geometry(a, in[0].shape(), a.weight, p.name());
  void* y = alloc_output(out);
  const int64_t n = numel(out.shape);
  const DType dt = in[0].dtype();
  if (n == 0) return;
  if (numel(in[0].shape()) == 0 || numel(in[1].shape()) == 0) {  // nothing to sum
    std::memset(y, 0, n * size_of(out.dtype));
    return;
  }
  if (dt == DType::f64)
    return direct(p, q, in[0].data<double>(), in[1].data<double>(), static_cast<double*>(y), n);
  if (dt != DType::f32 && dt != DType::bf16)
    fail(p.name(), std::string("no cpu kernel for dtype ") + name_of(dt));
  if (p.op() == Op::ConvGradWeight && q.channels_last && q.groups == q.c && q.o == q.c) {
    if (dt == DType::f32)
      return depthwise_grad_weight_nhwc(q, in[0].data<float>(), in[1].data<float>(),
                                        static_cast<float*>(y));
    return depthwise_grad_weight_nhwc(q, in[0].data<bf16>(), in[1].data<bf16>(),
                                      static_cast<bf16*>(y));
  }
  if (dt == DType::bf16 && !native_bf16_gemm()) {
    const auto wa = widened(in[0]), wb = widened(in[1]);
    Buffer wy(&cpu_allocator(), n * sizeof(float), Device::cpu());
    run(p, q, DType::f32, wa->data(), wb->data(), wy.data());
    const float* src = static_cast<const float*>(wy.data());
    uint16_t* dst = static_cast<uint16_t*>(y);
    parallel_for(n, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = narrow_bf16(src[i]);
    });
    return;
  }
  run(p, q, dt, in[0].raw(), in[1].raw(), y);
}

// The values of x in the accumulation type A (f32 for f32 and bf16, f64 for f64).
template <typename A>
std::vector<A> values(const Array& x) {
  std::vector<A> v(numel(x.shape()));
  dispatch_float(x.dtype(), "pool", [&](auto t) {
    using T = decltype(t);
    const T* src = x.data<T>();
    parallel_for(static_cast<int64_t>(v.size()), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        if constexpr (std::is_same_v<T, bf16>)
          v[i] = static_cast<float>(src[i]);
        else
          v[i] = static_cast<A>(src[i]);
      }
    });
  });
  return v;
}

// Pool(x) and PoolGrad(x, dy), window by window, a thread per range of
// (batch, channel) planes (a max window's gradient stays in its plane).
template <typename A>
void pool_planes(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  const auto& a = p.attrs<PoolAttrs>();
  const ConvGeometry q = pool_geometry(a, in[0].shape(), p.name());
  const bool max = a.kind == PoolKind::Max, grad = p.op() == Op::PoolGrad;
  const std::vector<A> x = values<A>(in[0]);
  const std::vector<A> dy = grad ? values<A>(in[1]) : std::vector<A>();
  std::vector<A> r(numel(out.shape), A(0));
  parallel_for(q.n * q.c, q.ho * q.wo * q.kh * q.kw, [&](int64_t p0, int64_t p1) {
    for (int64_t plane = p0; plane < p1; ++plane) {
      const int64_t b = plane / q.c, c = plane % q.c;
      for (int64_t y = 0; y < q.ho; ++y)
        for (int64_t xo = 0; xo < q.wo; ++xo) {
          const int64_t yi = q.y_index(b, c, y, xo);
          if (!grad) {
            r[yi] = pool_window(q, max, a.count_include_pad, x.data(), b, c, y, xo, nullptr);
          } else if (max) {
            int64_t arg = -1;
            pool_window(q, true, false, x.data(), b, c, y, xo, &arg);
            r[arg] += dy[yi];
          } else {
            const int64_t n = for_each_in_window(q, b, c, y, xo, [](int64_t) {});
            const A share = dy[yi] / static_cast<A>(a.count_include_pad ? q.kh * q.kw : n);
            for_each_in_window(q, b, c, y, xo, [&](int64_t i) { r[i] += share; });
          }
        }
    }
  });
  dispatch_float(out.dtype, p.name(), [&](auto t) {
    using T = decltype(t);
    T* dst = static_cast<T*>(alloc_output(out));
    parallel_for(static_cast<int64_t>(r.size()), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = st<T>(r[i]);
    });
  });
}

// The same channels last (NHWC, a ResNet's max pooling): a thread per
// range of images, each output pixel's window tap by tap in window order
// over its contiguous channels, so that every comparison and sum is the one
// pool_window makes (the same values, NaN and ties included) at memory speed
// rather than a channel's stride apart. PoolGrad adds each output's dy into
// the image's input gradient (windows overlap, so an image is one thread's),
// accumulated in A.
template <typename T, typename A>
void pool_channels_last(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  const auto& a = p.attrs<PoolAttrs>();
  const ConvGeometry q = pool_geometry(a, in[0].shape(), p.name());
  const bool max = a.kind == PoolKind::Max, grad = p.op() == Op::PoolGrad;
  const T* x = in[0].data<T>();
  const T* dy = grad ? in[1].data<T>() : nullptr;
  T* dst = static_cast<T*>(alloc_output(out));
  const int64_t c = q.c, image = q.h * q.w * c;
  parallel_for(q.n, q.ho * q.wo * q.kh * q.kw * c, [&](int64_t b0, int64_t b1) {
    std::vector<A> v(c), acc;
    std::vector<int32_t> arg(c);  // the window tap of each channel's max
    std::vector<int64_t> taps;
    if (grad) acc.resize(image);
    for (int64_t b = b0; b < b1; ++b) {
      const T* xb = x + b * image;
      if (grad) std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t yo = 0; yo < q.ho; ++yo)
        for (int64_t xo = 0; xo < q.wo; ++xo) {
          taps.clear();
          for_each_in_window(q, 0, 0, yo, xo, [&](int64_t i) { taps.push_back(i); });
          const int64_t n = static_cast<int64_t>(taps.size());
          const int64_t yi = ((b * q.ho + yo) * q.wo + xo) * c;
          if (max) {
            // Branch-free selects over the channels, so that they vectorize.
            A* vb = v.data();
            int32_t* ab = arg.data();
            const T* t0 = xb + taps[0];
            for (int64_t ch = 0; ch < c; ++ch) vb[ch] = static_cast<A>(t0[ch]);
            if (grad) std::fill(arg.begin(), arg.end(), 0);
            for (int64_t k = 1; k < n; ++k) {
              const T* t = xb + taps[k];
              const int32_t kk = static_cast<int32_t>(k);
              if (!grad) {
#pragma omp simd
                for (int64_t ch = 0; ch < c; ++ch) {
                  const A u = static_cast<A>(t[ch]), w = vb[ch];
                  vb[ch] = (u > w || (u != u && w == w)) ? u : w;
                }
              } else {
#pragma omp simd
                for (int64_t ch = 0; ch < c; ++ch) {
                  const A u = static_cast<A>(t[ch]), w = vb[ch];
                  const bool take = u > w || (u != u && w == w);
                  vb[ch] = take ? u : w;
                  ab[ch] = take ? kk : ab[ch];
                }
              }
            }
            if (!grad) {
              for (int64_t ch = 0; ch < c; ++ch) dst[yi + ch] = st<T>(vb[ch]);
            } else {
              for (int64_t ch = 0; ch < c; ++ch)
                acc[taps[ab[ch]] + ch] += static_cast<A>(dy[yi + ch]);
            }
          } else {
            const A count = static_cast<A>(a.count_include_pad ? q.kh * q.kw : n);
            if (!grad) {
              std::fill(v.begin(), v.end(), A(0));
              for (int64_t k = 0; k < n; ++k) {
                const T* t = xb + taps[k];
                for (int64_t ch = 0; ch < c; ++ch) v[ch] += static_cast<A>(t[ch]);
              }
              for (int64_t ch = 0; ch < c; ++ch) dst[yi + ch] = st<T>(v[ch] / count);
            } else {
              for (int64_t ch = 0; ch < c; ++ch) v[ch] = static_cast<A>(dy[yi + ch]) / count;
              for (int64_t k = 0; k < n; ++k)
                for (int64_t ch = 0; ch < c; ++ch) acc[taps[k] + ch] += v[ch];
            }
          }
        }
      if (grad)
        for (int64_t i = 0; i < image; ++i) dst[b * image + i] = st<T>(acc[i]);
    }
  });
}

void pool_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  const DType dt = in[0].dtype();
  if (p.attrs<PoolAttrs>().channels_last && in[0].ndim() == 4) {
    if (dt == DType::f64) return pool_channels_last<double, double>(p, in, out);
    if (dt == DType::f32) return pool_channels_last<float, float>(p, in, out);
    if (dt == DType::bf16) return pool_channels_last<bf16, float>(p, in, out);
  }
  if (dt == DType::f64) return pool_planes<double>(p, in, out);
  if (dt != DType::f32 && dt != DType::bf16)
    fail(p.name(), std::string("no cpu kernel for dtype ") + name_of(dt));
  pool_planes<float>(p, in, out);
}

}  // namespace

bool conv_runs_as_gemm(const ConvGeometry& q) {
  return conv_route() == ConvRoute::automatic && q.channels_last && q.groups == 1 && q.kh == 1 &&
         q.kw == 1 && q.ph == 0 && q.pw == 0 && q.ph_after == 0 && q.pw_after == 0;
}

void register_conv(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Pool)] = pool_kernel;
  t.kernels[static_cast<int>(Op::PoolGrad)] = pool_kernel;
  t.kernels[static_cast<int>(Op::Conv)] = conv_kernel;
  t.kernels[static_cast<int>(Op::ConvGradInput)] = conv_kernel;
  t.kernels[static_cast<int>(Op::ConvGradWeight)] = conv_kernel;
}

}  // namespace kiln::cpu
