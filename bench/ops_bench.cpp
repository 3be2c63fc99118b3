// kiln op benchmarks (Google Benchmark): matmul at the ViT-Base/16 training
// shapes beside direct oneDNN calls, elementwise and LayerNorm throughput, and
// the cost of dispatching one eager op.
//
//   build/kiln-bench-ops --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdlib>
#include <vector>

#include "backend/cpu/sgemm.h"
#include "backend/cpu/tiles.h"
#include "kiln/kiln.h"
#include "ops/draws.h"

namespace {
using namespace kiln;

// One linear layer of ViT-B/16 at batch 32: x [M,K], W [N,K], M = 32*197.
// Forward Y = X·Wᵀ; backward dX = dY·W and dW = dYᵀ·X.
struct Gemm {
  const char* name;
  int64_t m, k, n;  // C[m,n] = op(A)[m,k] · op(B)[k,n]
  bool ta, tb;
};
constexpr int64_t M = 32 * 197;
const Gemm kGemms[] = {
    {"qkv_fwd", M, 768, 2304, false, true}, {"qkv_dx", M, 2304, 768, false, false},
    {"qkv_dw", 2304, M, 768, true, false},  {"proj_fwd", M, 768, 768, false, true},
    {"proj_dx", M, 768, 768, false, false}, {"proj_dw", 768, M, 768, true, false},
    {"fc1_fwd", M, 768, 3072, false, true}, {"fc1_dx", M, 3072, 768, false, false},
    {"fc1_dw", 3072, M, 768, true, false},  {"fc2_fwd", M, 3072, 768, false, true},
    {"fc2_dx", M, 768, 3072, false, false}, {"fc2_dw", 768, M, 3072, true, false},
};

// The same for ViT-S/16 (hidden 384, MLP 1536; q, k and v in one GEMM).
const Gemm kGemmsSmall[] = {
    {"qkv_fwd", M, 384, 1152, false, true}, {"qkv_dx", M, 1152, 384, false, false},
    {"qkv_dw", 1152, M, 384, true, false},  {"proj_fwd", M, 384, 384, false, true},
    {"proj_dx", M, 384, 384, false, false}, {"proj_dw", 384, M, 384, true, false},
    {"fc1_fwd", M, 384, 1536, false, true}, {"fc1_dx", M, 1536, 384, false, false},
    {"fc1_dw", 1536, M, 384, true, false},  {"fc2_fwd", M, 1536, 384, false, true},
    {"fc2_dx", M, 384, 1536, false, false}, {"fc2_dw", 384, M, 1536, true, false},
};

// GPT-2 124M's LM head at batch 4 x 1024 tokens (the vocabulary 50257, no
// multiple of 32): logits X·Wᵀ in f32, dX = dY·W and dW = dYᵀ·X in bf16.
const Gemm kGemmsLmHead[] = {{"fwd", 4096, 768, 50257, false, true},
                             {"dx", 4096, 50257, 768, false, false},
                             {"dw", 50257, 4096, 768, true, false}};

Shape shape_a(const Gemm& g) {
  return g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k};
}
Shape shape_b(const Gemm& g) {
  return g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n};
}

void set_flops(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_kiln_matmul(benchmark::State& state, Gemm g, DType dt) {
  Array a = astype(random::normal(random::Key(1), shape_a(g)), dt);
  Array b = astype(random::normal(random::Key(2), shape_b(g)), dt);
  MatmulOptions opt{g.ta, g.tb, DType::f32};
  for (auto _ : state) {
    Array c = matmul(a, b, opt);  // eager: the result exists when matmul returns
    benchmark::DoNotOptimize(c.raw());
  }
  set_flops(state, 2.0 * g.m * g.n * g.k);
}

// kiln's bf16 matmul with a bf16 result, as PyTorch's bf16 matmul gives
// (bench/bf16_gemm.sh runs it beside torch's on the same shapes).
void BM_kiln_matmul_bf16_out(benchmark::State& state, Gemm g, DType out) {
  Array a = astype(random::normal(random::Key(1), shape_a(g)), DType::bf16);
  Array b = astype(random::normal(random::Key(2), shape_b(g)), DType::bf16);
  MatmulOptions opt{g.ta, g.tb, out};
  for (auto _ : state) {
    Array c = matmul(a, b, opt);
    benchmark::DoNotOptimize(c.raw());
  }
  set_flops(state, 2.0 * g.m * g.n * g.k);
}

// The same GEMM on gemm_bf16 (oneMKL's cblas_gemm_bf16bf16f32 where kiln has
// oneMKL and the CPU a bf16 unit; f32 result): the other library on offer.
void BM_gemm_bf16(benchmark::State& state, Gemm g) {
  std::vector<uint16_t> a(g.m * g.k, 0x3f00), b(g.k * g.n, 0x3e80);
  std::vector<float> c(g.m * g.n);
  for (auto _ : state) {
    cpu::gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.ta ? g.m : g.k, b.data(),
                   g.tb ? g.k : g.n, 0.0f, c.data(), g.n, "bench");
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * g.m * g.n * g.k);
}

// kiln's f32 matmul on a chosen sgemm library (oneMKL where built in, or
// oneDNN's dnnl_sgemm; src/backend/cpu/sgemm.h).
void BM_kiln_matmul_on(benchmark::State& state, Gemm g, cpu::SgemmLibrary lib) {
  const cpu::SgemmLibrary before = cpu::sgemm_library();
  cpu::set_sgemm_library(lib);
  BM_kiln_matmul(state, g, DType::f32);
  cpu::set_sgemm_library(before);
}

void BM_dnnl_sgemm(benchmark::State& state, Gemm g) {
  std::vector<float> a(g.m * g.k, 0.5f), b(g.k * g.n, 0.25f), c(g.m * g.n);
  for (auto _ : state) {
    dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.0f, a.data(), g.ta ? g.m : g.k,
               b.data(), g.tb ? g.k : g.n, 0.0f, c.data(), g.n);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * g.m * g.n * g.k);
}

void BM_dnnl_matmul_primitive(benchmark::State& state, Gemm g, dnnl::memory::data_type in) {
  using dt = dnnl::memory::data_type;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  dnnl::memory::desc a_md({g.m, g.k}, in,
                          g.ta ? dnnl::memory::dims{1, g.m} : dnnl::memory::dims{g.k, 1});
  dnnl::memory::desc b_md({g.k, g.n}, in,
                          g.tb ? dnnl::memory::dims{1, g.k} : dnnl::memory::dims{g.n, 1});
  dnnl::memory::desc c_md({g.m, g.n}, dt::f32, dnnl::memory::dims{g.n, 1});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
  dnnl::matmul prim(pd);
  dnnl::memory am(a_md, eng), bm(b_md, eng), cm(c_md, eng);
  std::memset(am.get_data_handle(), 0, a_md.get_size());
  std::memset(bm.get_data_handle(), 0, b_md.get_size());
  for (auto _ : state) {
    prim.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    strm.wait();
  }
  set_flops(state, 2.0 * g.m * g.n * g.k);
}

// ---- attention GEMMs of ViT-S/16 at batch 32: 192 (batch x heads) GEMMs of
// [197, 64] x [64, 197] and back, the six of one layer's forward and backward.
struct BatchedGemm {
  const char* name;
  int64_t m, k, n;
  bool ta, tb;
};
constexpr int64_t kHeads = 32 * 6, kT = 197, kD = 64;
const BatchedGemm kAttnGemms[] = {
    {"scores", kT, kD, kT, false, true},    // Q·Kᵀ
    {"context", kT, kT, kD, false, false},  // P·V
    {"d_probs", kT, kD, kT, false, true},   // dO·Vᵀ
    {"d_v", kT, kT, kD, true, false},       // Pᵀ·dO
    {"d_q", kT, kT, kD, false, false},      // dS·K
    {"d_k", kT, kT, kD, true, false},       // dSᵀ·Q
};

void BM_kiln_batched(benchmark::State& state, BatchedGemm g) {
  Array a =
      random::normal(random::Key(1), g.ta ? Shape{kHeads, g.k, g.m} : Shape{kHeads, g.m, g.k});
  Array b =
      random::normal(random::Key(2), g.tb ? Shape{kHeads, g.n, g.k} : Shape{kHeads, g.k, g.n});
  MatmulOptions opt{g.ta, g.tb, DType::f32};
  for (auto _ : state) benchmark::DoNotOptimize(matmul(a, b, opt).raw());
  set_flops(state, 2.0 * kHeads * g.m * g.n * g.k);
}

// One single-threaded dnnl_sgemm per (batch, head), the heads split over threads.
void BM_sgemm_per_head(benchmark::State& state, BatchedGemm g) {
  std::vector<float> a(kHeads * g.m * g.k, 0.5f), b(kHeads * g.k * g.n, 0.25f),
      c(kHeads * g.m * g.n);
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < kHeads; ++h)
      dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.0f, a.data() + h * g.m * g.k,
                 g.ta ? g.m : g.k, b.data() + h * g.k * g.n, g.tb ? g.k : g.n, 0.0f,
                 c.data() + h * g.m * g.n, g.n);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * kHeads * g.m * g.n * g.k);
}

// The fused attention primitive on ViT-S/16's packed qkv at batch 32, forward
// (2 GEMMs per head) and backward (5 GEMMs per head: the scores are recomputed).
// tiles: whether kiln's tile kernels may run (bf16 on a CPU with AMX or
// AVX512-BF16; else oneMKL).
void BM_attention(benchmark::State& state, bool backward, DType dt, bool tiles) {
  Array qkv = astype(random::normal(random::Key(1), {32, kT, 3, 6, kD}), dt);
  Array dout = astype(random::normal(random::Key(2), {32, kT, 6, kD}), dt);
  cpu::set_tile_kernels(tiles);
  for (auto _ : state) {
    Array r = backward ? attention_grad(qkv, dout, 0.125) : attention(qkv, 0.125);
    benchmark::DoNotOptimize(r.raw());
  }
  cpu::set_tile_kernels(true);
  set_flops(state, (backward ? 5.0 : 2.0) * 2.0 * kHeads * kT * kT * kD);
}

// The causal attention of GPT-2 124M's training step (Sdpa on separate q, k,
// v [4, 1024, 12, 64]), forward and backward (dq, dk, dv); FLOP counted for
// the lower triangle the causal mask leaves (T² / 2 scores a head).
void BM_sdpa_causal(benchmark::State& state, bool backward, DType dt, bool tiles) {
  constexpr int64_t B = 4, T = 1024, H = 12, D = 64;
  Array q = astype(random::normal(random::Key(1), {B, T, H, D}), dt);
  Array k = astype(random::normal(random::Key(2), {B, T, H, D}), dt);
  Array v = astype(random::normal(random::Key(3), {B, T, H, D}), dt);
  Array dout = astype(random::normal(random::Key(4), {B, T, H, D}), dt);
  cpu::set_tile_kernels(tiles);
  for (auto _ : state) {
    Array r = backward ? attention_grad(q, k, v, dout, std::nullopt, 0.125, true)
                       : attention(q, k, v, {.scale = 0.125, .causal = true});
    benchmark::DoNotOptimize(r.raw());
  }
  cpu::set_tile_kernels(true);
  set_flops(state, (backward ? 5.0 : 2.0) * 2.0 * B * H * (T * T / 2) * D);
}

// The same attention unfused, as transformers' eager attention: heads
// transposed into place, batched GEMMs, scale, softmax, GEMM, transpose back.
void BM_attention_unfused(benchmark::State& state) {
  Array q = random::normal(random::Key(1), {32, kT, 6, kD});
  Array k = random::normal(random::Key(2), {32, kT, 6, kD});
  Array v = random::normal(random::Key(3), {32, kT, 6, kD});
  for (auto _ : state) {
    Array qh = transpose(q, {0, 2, 1, 3}), kh = transpose(k, {0, 2, 1, 3}),
          vh = transpose(v, {0, 2, 1, 3});
    Array p = softmax(matmul(qh, kh, {false, true, std::nullopt}) * 0.125);
    benchmark::DoNotOptimize(transpose(matmul(p, vh), {0, 2, 1, 3}).raw());
  }
  set_flops(state, 2.0 * 2.0 * kHeads * kT * kT * kD);
}

// Forward and backward together (vjp), fused against unfused: what one
// training step spends on one layer's attention. The unfused variant takes
// q, k and v as the separate [B, T, H, D] outputs of three linears, as the
// ViT's unfused path does.
void BM_attention_vjp(benchmark::State& state, bool fused) {
  Array qkv = random::normal(random::Key(1), {32, kT, 3, 6, kD});
  std::vector<Array> sep;
  for (int i = 0; i < 3; ++i) sep.push_back(random::normal(random::Key(3 + i), {32, kT, 6, kD}));
  Array dout = random::normal(random::Key(2), {32, kT, 6, kD});
  auto unfused = [](const std::vector<Array>& x) {
    auto heads = [&](int i) { return transpose(x[i], {0, 2, 1, 3}); };
    Array p = softmax(matmul(heads(0), heads(1), {false, true, std::nullopt}) * 0.125);
    return std::vector<Array>{transpose(matmul(p, heads(2)), {0, 2, 1, 3})};
  };
  auto fused_fn = [](const std::vector<Array>& x) {
    return std::vector<Array>{attention(x[0], 0.125)};
  };
  for (auto _ : state) {
    auto [outs, grads] = fused ? vjp(fused_fn, {qkv}, {dout}) : vjp(unfused, sep, {dout});
    benchmark::DoNotOptimize(grads[0].raw());
  }
  set_flops(state, (fused ? 7.0 : 6.0) * 2.0 * kHeads * kT * kT * kD);
}

// ---- elementwise and LayerNorm, GB/s over bytes read + written ----
void BM_add(benchmark::State& state) {
  Array a = random::normal(random::Key(1), {M, 768}), b = random::normal(random::Key(2), {M, 768});
  for (auto _ : state) benchmark::DoNotOptimize((a + b).raw());
  state.SetBytesProcessed(state.iterations() * 3 * a.nbytes());
}
void BM_add_bias_broadcast(benchmark::State& state) {
  Array a = random::normal(random::Key(1), {M, 3072}), b = random::normal(random::Key(2), {3072});
  for (auto _ : state) benchmark::DoNotOptimize((a + b).raw());
  state.SetBytesProcessed(state.iterations() * 2 * a.nbytes());
}
void BM_gelu(benchmark::State& state) {
  Array a = random::normal(random::Key(1), {M, 3072});
  for (auto _ : state) benchmark::DoNotOptimize(gelu(a).raw());
  state.SetBytesProcessed(state.iterations() * 2 * a.nbytes());
}
void BM_gelu_grad(benchmark::State& state) {
  Array a = random::normal(random::Key(1), {M, 3072});
  for (auto _ : state) benchmark::DoNotOptimize(gelu_grad(a).raw());
  state.SetBytesProcessed(state.iterations() * 2 * a.nbytes());
}
// bf16 GELU at ViT-S's fc1 width, [32, 197, 1536]: the forward (a Gelu op)
// and the backward as the jit step runs it (one FusedElementwise: g ·
// gelu'(x), each op rounded to bf16). GB/s over the bf16 bytes read and
// written.
void BM_gelu_bf16(benchmark::State& state) {
  Array x = astype(random::normal(random::Key(1), {32, 197, 1536}), DType::bf16);
  for (auto _ : state) benchmark::DoNotOptimize(gelu(x).raw());
  state.SetBytesProcessed(state.iterations() * 2 * x.nbytes());
}
void BM_gelu_grad_bf16(benchmark::State& state) {
  Array x = astype(random::normal(random::Key(1), {32, 197, 1536}), DType::bf16);
  Array g = astype(random::normal(random::Key(2), {32, 197, 1536}), DType::bf16);
  Jitted step(
      [](const std::vector<Array>& a) { return std::vector<Array>{a[1] * gelu_grad(a[0])}; }, {});
  for (auto _ : state) benchmark::DoNotOptimize(step({x, g})[0].raw());
  state.SetBytesProcessed(state.iterations() * 3 * x.nbytes());
}
// GPT-2's gelu_new (the tanh form) in bf16 at its MLP width, [4, 1024, 3072]:
// the forward and the jitted backward, as above.
void BM_gelu_tanh_bf16(benchmark::State& state) {
  Array x = astype(random::normal(random::Key(1), {4, 1024, 3072}), DType::bf16);
  for (auto _ : state) benchmark::DoNotOptimize(gelu_tanh(x).raw());
  state.SetBytesProcessed(state.iterations() * 2 * x.nbytes());
}
void BM_gelu_tanh_grad_bf16(benchmark::State& state) {
  Array x = astype(random::normal(random::Key(1), {4, 1024, 3072}), DType::bf16);
  Array g = astype(random::normal(random::Key(2), {4, 1024, 3072}), DType::bf16);
  Jitted step(
      [](const std::vector<Array>& a) { return std::vector<Array>{a[1] * gelu_tanh_grad(a[0])}; },
      {});
  for (auto _ : state) benchmark::DoNotOptimize(step({x, g})[0].raw());
  state.SetBytesProcessed(state.iterations() * 3 * x.nbytes());
}
void BM_exp(benchmark::State& state) {
  Array a = random::normal(random::Key(1), {M, 768});
  for (auto _ : state) benchmark::DoNotOptimize(exp(a).raw());
  state.SetBytesProcessed(state.iterations() * 2 * a.nbytes());
}
// bf16 mixed precision's casts (eager mode runs one per linear operand and
// gradient): GB/s over bytes read + written.
void BM_cast(benchmark::State& state, DType from, DType to) {
  Array a = astype(random::normal(random::Key(1), {M, 1536}), from);
  for (auto _ : state) benchmark::DoNotOptimize(astype(a, to).raw());
  state.SetBytesProcessed(state.iterations() * a.size() * (size_of(from) + size_of(to)));
}
void BM_softmax_attention(benchmark::State& state) {
  Array a = random::normal(random::Key(1), {32 * 12, 197, 197});
  for (auto _ : state) benchmark::DoNotOptimize(softmax(a).raw());
  state.SetBytesProcessed(state.iterations() * 2 * a.nbytes());
}
void BM_layer_norm(benchmark::State& state) {
  Array x = random::normal(random::Key(1), {M, 768});
  Array g = ones({768}), b = zeros({768});
  for (auto _ : state) benchmark::DoNotOptimize(layer_norm(x, g, b, 1e-12).raw());
  state.SetBytesProcessed(state.iterations() * 2 * x.nbytes());
}
void BM_layer_norm_grad(benchmark::State& state) {
  Array x = random::normal(random::Key(1), {M, 768}), dy = random::normal(random::Key(2), {M, 768});
  Array g = ones({768});
  for (auto _ : state) benchmark::DoNotOptimize(layer_norm_grad(x, g, dy, 1e-12).raw());
  state.SetBytesProcessed(state.iterations() * 3 * x.nbytes());
}
void BM_layer_norm_param_grad(benchmark::State& state) {
  const int64_t c = state.range(0);
  Array x = random::normal(random::Key(1), {M, c}), dy = random::normal(random::Key(2), {M, c});
  for (auto _ : state) benchmark::DoNotOptimize(layer_norm_param_grad(x, dy, 1e-12).raw());
  state.SetBytesProcessed(state.iterations() * 2 * x.nbytes());
}
void BM_transpose_heads(benchmark::State& state) {
  Array x = random::normal(random::Key(1), {32, 197, 12, 64});
  for (auto _ : state) benchmark::DoNotOptimize(transpose(x, {0, 2, 1, 3}).raw());
  state.SetBytesProcessed(state.iterations() * 2 * x.nbytes());
}

// ---- a bias's gradient and SGD step, compiled: p - lr · sum(dy, rows) ----
// fused: one FusedReduce with the update as its epilogue (the default passes);
// unfused: KILN_COMPILE=no_reduce, a Sum and then the update's own pass. dy is
// ViT-S's fc1 output gradient [32, 197, 1536]; GB/s over dy read once.
void BM_bias_step(benchmark::State& state, bool fused) {
  Array dy = random::normal(random::Key(1), {32, 197, 1536}), p = zeros({1536});
  if (!fused) setenv("KILN_COMPILE", "no_reduce", 1);
  Jitted step(
      [](const std::vector<Array>& x) {
        return std::vector<Array>{x[0] - sum(x[1], {0, 1}) * 0.01};
      },
      {});
  step({p, dy});  // compiles with the switches of now
  unsetenv("KILN_COMPILE");
  for (auto _ : state) benchmark::DoNotOptimize(step({p, dy})[0].raw());
  state.SetBytesProcessed(state.iterations() * dy.nbytes());
}

// ---- a bias gradient alone: sum over the rows of [32·197, width] ----
void BM_sum_rows(benchmark::State& state) {
  Array dy = random::normal(random::Key(1), {M, state.range(0)});
  for (auto _ : state) benchmark::DoNotOptimize(sum(dy, {0}).raw());
  state.SetBytesProcessed(state.iterations() * dy.nbytes());
}

// ---- a language model's predictions: argmax over GPT-2's 50257 logits ----
// (an evaluation's top-1 accuracy, greedy generation), [1024, 50257]; GB/s
// over the logits read once.
void BM_argmax_rows(benchmark::State& state, DType dt) {
  Array logits = astype(random::normal(random::Key(1), {1024, 50257}), dt);
  for (auto _ : state) benchmark::DoNotOptimize(argmax(logits, -1).raw());
  state.SetBytesProcessed(state.iterations() * logits.nbytes());
}

// ---- BatchNorm's per-channel sums over a channels-last activation ----
// The backward pass's sum(dy · (x - mu)) over [32, HW, HW, C] (ResNet-50's
// activations at batch 32; args C, HW), compiled: one FusedReduce. GB/s over
// x and dy read once.
void BM_channel_sums(benchmark::State& state, DType x_dtype) {
  const int64_t c = state.range(0), hw = state.range(1);
  Array x = astype(random::normal(random::Key(1), {32, hw, hw, c}), x_dtype);
  Array dy = random::normal(random::Key(2), {32, hw, hw, c});
  Array mu = random::normal(random::Key(3), {1, 1, 1, c});
  Jitted f(
      [](const std::vector<Array>& v) {
        return std::vector<Array>{sum(v[1] * (astype(v[0], DType::f32) - v[2]), {0, 1, 2})};
      },
      {});
  f({x, dy, mu});
  for (auto _ : state) benchmark::DoNotOptimize(f({x, dy, mu})[0].raw());
  state.SetBytesProcessed(state.iterations() * (x.nbytes() + dy.nbytes()));
}

// A BatchNorm's fused elementwise passes over a channels-last activation
// [32, hw, hw, c] of x_dtype (ResNet-50's shapes), compiled: the forward
// normalization (x - mean) * scale + shift, and the backward's input
// gradient (dy - mean(dy) - (x - mean) * k) * scale with per-channel f32
// statistics. Bytes: the activations read and written.
void BM_bn_fused(benchmark::State& state, DType x_dtype, bool backward) {
  const int64_t c = state.range(0), hw = state.range(1);
  Array x = astype(random::normal(random::Key(1), {32, hw, hw, c}), x_dtype);
  Array dy = astype(random::normal(random::Key(2), {32, hw, hw, c}), x_dtype);
  std::vector<Array> rows;
  for (int k = 0; k < 4; ++k) rows.push_back(random::normal(random::Key(3 + k), {1, 1, 1, c}));
  Jitted f(
      [backward, x_dtype](const std::vector<Array>& v) {
        Array xf = astype(v[0], DType::f32);
        if (!backward) return std::vector<Array>{astype((xf - v[2]) * v[3] + v[4], x_dtype)};
        Array g = astype(v[1], DType::f32);
        return std::vector<Array>{astype((g - v[5] - (xf - v[2]) * v[4]) * v[3], x_dtype)};
      },
      {});
  std::vector<Array> args{x, dy, rows[0], rows[1], rows[2], rows[3]};
  f(args);
  for (auto _ : state) benchmark::DoNotOptimize(f(args)[0].raw());
  state.SetBytesProcessed(state.iterations() * x.nbytes() * (backward ? 3 : 2));
}

// ---- the random images of the reference experiment: one 3 x 224 x 224
// image of standard normals on one thread (the data loader's worker), as
// random::fill_normal makes it (f32 math) and as it did before 2026-12-07
// (random::draw_block: the f64 library functions, normal(key)'s own values).
constexpr int64_t kImage = 3 * 224 * 224;
void BM_fill_normal(benchmark::State& state) {
  std::vector<float> x(kImage);
  uint32_t i = 0;
  for (auto _ : state) {
    random::fill_normal(random::fold_in(random::Key(0), i++), x.data(), kImage);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * kImage);
}
void BM_fill_normal_f64_draws(benchmark::State& state) {
  std::vector<float> x(kImage);
  uint32_t i = 0;
  for (auto _ : state) {
    const random::DrawSpec s =
        random::draw_spec(random::fold_in(random::Key(0), i++), RandomKind::Normal);
    for (int64_t j = 0; j < kImage / 2; ++j) {
      double v[2];
      random::draw_block(s, static_cast<uint64_t>(j), v);
      x[2 * j] = static_cast<float>(v[0]), x[2 * j + 1] = static_cast<float>(v[1]);
    }
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * kImage);
}

// ---- dispatch: one eager op on one element ----
void BM_dispatch_add_1elem(benchmark::State& state) {
  Array a = ones({1}), b = ones({1});
  for (auto _ : state) benchmark::DoNotOptimize((a + b).raw());
}
void BM_dispatch_exp_1elem(benchmark::State& state) {
  Array a = ones({1});
  for (auto _ : state) benchmark::DoNotOptimize(exp(a).raw());
}

int register_all() {
  for (const auto& g : kGemms) {
    std::string n = g.name;
    benchmark::RegisterBenchmark(("matmul_f32/" + n + "/kiln").c_str(), BM_kiln_matmul, g,
                                 DType::f32)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("matmul_f32/" + n + "/dnnl_sgemm").c_str(), BM_dnnl_sgemm, g)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("matmul_f32/" + n + "/dnnl_matmul").c_str(),
                                 BM_dnnl_matmul_primitive, g, dnnl::memory::data_type::f32)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (const auto& g : kGemms) {
    std::string n = g.name;
    benchmark::RegisterBenchmark(("matmul_bf16/" + n + "/kiln").c_str(), BM_kiln_matmul, g,
                                 DType::bf16)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("matmul_bf16/" + n + "/dnnl_matmul").c_str(),
                                 BM_dnnl_matmul_primitive, g, dnnl::memory::data_type::bf16)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (const auto& g : kGemmsSmall) {
    std::string n = g.name;
    benchmark::RegisterBenchmark(("matmul_f32_vit_small/" + n + "/kiln").c_str(), BM_kiln_matmul, g,
                                 DType::f32)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    if (cpu::have_onemkl())  // the default is oneMKL: the same matmul on oneDNN's sgemm
      benchmark::RegisterBenchmark(("matmul_f32_vit_small/" + n + "/kiln_on_dnnl_sgemm").c_str(),
                                   BM_kiln_matmul_on, g, cpu::SgemmLibrary::onednn)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  }
  for (const auto& g : kGemmsSmall) {
    std::string n = g.name;
    benchmark::RegisterBenchmark(("matmul_bf16_vit_small/" + n + "/kiln").c_str(),
                                 BM_kiln_matmul_bf16_out, g, DType::bf16)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        ("matmul_bf16_vit_small/" + n + (cpu::gemm_bf16_native() ? "/onemkl" : "/widened")).c_str(),
        BM_gemm_bf16, g)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (const auto& g : kGemmsLmHead) {
    const DType out = std::string(g.name) == "fwd" ? DType::f32 : DType::bf16;
    benchmark::RegisterBenchmark((std::string("matmul_bf16_gpt2_lm_head/") + g.name).c_str(),
                                 BM_kiln_matmul_bf16_out, g, out)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    if (cpu::gemm_bf16_native())
      benchmark::RegisterBenchmark(
          (std::string("matmul_bf16_gpt2_lm_head/") + g.name + "/onemkl").c_str(), BM_gemm_bf16, g)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  }
  for (const auto& g : kAttnGemms) {
    std::string n = g.name;
    benchmark::RegisterBenchmark(("attn_f32/" + n + "/kiln").c_str(), BM_kiln_batched, g)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("attn_f32/" + n + "/sgemm_per_head").c_str(), BM_sgemm_per_head,
                                 g)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (DType dt : {DType::f32, DType::bf16})
    for (bool backward : {false, true})
      for (bool tiles : {true, false}) {
        if (!tiles && (dt != DType::bf16 || cpu::tile_kernels().empty())) continue;
        benchmark::RegisterBenchmark(
            (std::string("attention_") + name_of(dt) +
             (backward ? "/backward/fused" : "/forward/fused") + (tiles ? "" : "/no_tiles"))
                .c_str(),
            BM_attention, backward, dt, tiles)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
  for (bool backward : {false, true})
    for (bool tiles : {true, false}) {
      if (!tiles && cpu::tile_kernels().empty()) continue;
      benchmark::RegisterBenchmark(
          (std::string("sdpa_causal_bf16") + (backward ? "/backward" : "/forward") +
           (tiles ? "" : "/no_tiles"))
              .c_str(),
          BM_sdpa_causal, backward, DType::bf16, tiles)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  benchmark::RegisterBenchmark("attention_f32/vjp/fused", BM_attention_vjp, true)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("attention_f32/vjp/unfused", BM_attention_vjp, false)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("attention_f32/forward/unfused", BM_attention_unfused)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("cast/f32_to_bf16", BM_cast, DType::f32, DType::bf16)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("cast/bf16_to_f32", BM_cast, DType::bf16, DType::f32)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  for (bool fused : {true, false})
    benchmark::RegisterBenchmark(fused ? "bias_step/fused" : "bias_step/unfused", BM_bias_step,
                                 fused)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  return 0;
}
const int registered = register_all();

}  // namespace

BENCHMARK(BM_add)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_add_bias_broadcast)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gelu)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gelu_grad)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gelu_bf16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gelu_grad_bf16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gelu_tanh_bf16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gelu_tanh_grad_bf16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_exp)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_softmax_attention)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_layer_norm)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_layer_norm_grad)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_layer_norm_param_grad)
    ->Arg(192)
    ->Arg(384)
    ->Arg(768)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_transpose_heads)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_argmax_rows, f32, DType::f32)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_argmax_rows, bf16, DType::bf16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_sum_rows)->Arg(192)->Arg(576)->Arg(768)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_channel_sums, f32, DType::f32)
    ->Args({256, 56})
    ->Args({64, 56})
    ->Args({1024, 14})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_channel_sums, bf16, DType::bf16)
    ->Args({256, 56})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_bn_fused, forward_f32, DType::f32, false)
    ->Args({256, 56})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_bn_fused, forward_bf16, DType::bf16, false)
    ->Args({256, 56})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_bn_fused, backward_f32, DType::f32, true)
    ->Args({256, 56})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_bn_fused, backward_bf16, DType::bf16, true)
    ->Args({256, 56})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_fill_normal)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fill_normal_f64_draws)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_dispatch_add_1elem);
BENCHMARK(BM_dispatch_exp_1elem);
BENCHMARK_MAIN();
