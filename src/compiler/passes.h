// kiln compiler: graph-to-graph passes (each keeps the numerics exactly) and
// the pipeline that runs them.
#pragma once
#include <string>

#include "compiler/graph.h"

namespace kiln::compiler {

// Removes ops no output depends on (inputs always stay: they are arguments).
Graph dead_code_elimination(const Graph& g);
// Merges ops with equal primitives, attributes and inputs.
Graph common_subexpression_elimination(const Graph& g);
// Algebraic simplification: identity reshapes/transposes/casts/stop_gradients
// are removed, reshape∘reshape and transpose∘transpose fold into one op.
Graph simplify(const Graph& g);

// Fuses chains of f32 elementwise ops (each intermediate read by one op of the
// chain only) into FusedElementwise kernels: one pass over memory per chain.
// Chains of bf16 ops fuse too where the backend runs them: the program
// computes in f32 and rounds each op's result to bf16, as the unfused ops do
// (bf16 mixed precision's GELU backward, g · gelu'(x), is one kernel).
Graph fuse_elementwise(const Graph& g);

// A fusable f32 op P of one instruction per element (kOneInstruction: no
// transcendental, which would cost more than the read) read by several ops,
// each of which would fuse it were
// it read by that op alone (an elementwise op of its shape, or a Sum over
// contiguous axes, which takes it as its prologue), and which reads at most
// one operand of its own shape (the others rows or scalars: x - mean, dy *
// scale): P is copied in front of each reader after the first, so that no
// kernel stores it and each reader's kernel computes it from what P read.
// Each reader then reads P's one large operand where it read P: no more
// traffic, and P's store and the reads of it are gone (a BatchNorm's x -
// mean, read by its variance, its output and its backward). Run right
// before fuse_elementwise.
Graph duplicate_shared_producers(const Graph& g);

// Folds the elementwise ops that follow an f32 matmul (bias add, scaling,
// residual add, GELU, ...) into a MatmulEpilogue whose backend runs them as
// GEMM post-ops. A chain continues while the running value is read by one op
// only and is not a graph output; the other operand of a binary step is read
// whole, as one value per column, or as a scalar.
Graph fuse_matmul_epilogue(const Graph& g);

// Fuses a Sum over a contiguous group of axes with the f32 elementwise op or
// FusedElementwise that produces its operand (read by the Sum only) into one
// FusedReduce: the summed values are never stored. The elementwise op that
// alone reads the Sum in its shape (directly, or through a Reshape only it
// reads) joins as the epilogue when its other operands precede the Sum; the
// FusedReduce takes the Sum's place and the epilogue op's value. Run after
// fuse_elementwise.
Graph fuse_reductions(const Graph& g);

// Folds casts between f32 and bf16 into the kernels beside them (bf16 mixed
// precision): a cast to bf16 of an f32 value that only it reads (directly or
// through reshapes only they read) makes the producer write bf16 — a
// FusedElementwise, an elementwise op (which becomes a one-instruction
// FusedElementwise), a LayerNorm, or a Matmul or MatmulEpilogue of bf16
// operands — and a fused program,
// an elementwise op or LayerNorm's backward (its dy) that reads a cast to f32
// of a bf16 value reads the bf16 value itself, widening it as it loads it,
// and so does a Sum over contiguous axes of one (through reshapes), as a
// FusedReduce. Only where the backend
// runs the result (backend_supports with the new dtypes). The programs still compute in f32 and
// round once to bf16 as they store, so no value changes. Run after the fusing passes.
Graph fuse_casts(const Graph& g);

// bf16 programs joined after fuse_casts: a bf16 program or elementwise op
// (a BatchNorm's normalization in bf16 mixed precision, its cast folded in)
// read whole by one bf16 elementwise op or program alone (the ReLU after
// it, the residual add and ReLU) becomes part of that program, its result
// rounded to bf16 in a register as it was when stored, so no value changes
// and a pass over the activation goes. Where the backend runs the result.
Graph fuse_bf16_programs(const Graph& g);

// Folds the residual stream's gradient into LayerNorm's backward: an f32
// Add(r, LayerNormGrad(...)) (either order, same shapes) whose LayerNormGrad
// is read by that Add only becomes one LayerNormGrad{residual} that adds r
// while it writes dx: one pass over memory less per LayerNorm.
Graph fuse_layer_norm_residual(const Graph& g);

// Recognizes softmax attention written out by hand (or transformers' eager
// attention) and maps it to the fused kernels: with q, k, v f32 [B, H, T, D],
// o = Matmul(Softmax(Matmul(q, kᵀ) · c, last axis), v) for a scalar c becomes
// a transpose of Attention(qkv) on the packed [B, T, 3, H, D] of q·c, k, v;
// where the graph also holds the backward autodiff made of it (dP = G vᵀ,
// dV = Pᵀ G, the softmax VJP, the scale, dQ = dS k, dK = dSᵀ q), those
// become one AttentionGrad and slices of it. The scores and probabilities
// are then never stored. A match whose intermediates are read by anything
// else (an output, a dropout on the probabilities) is left alone. Run before
// simplify, which folds the transposes it adds into the ones around it.
Graph fuse_attention(const Graph& g);

// Rematerialization: a cheap op (a cast, ReLU, negation or absolute value;
// not GELU or other transcendental ones, nor LayerNorm, whose recomputation
// costs more than the memory it saves is worth in speed) whose output is read
// again long after it was made (`gap` or more ops later: in a training graph,
// by the backward pass) while its inputs stay live until then anyway is
// recomputed just before that late read instead of being kept: its buffer no
// longer spans the forward-backward boundary (in a ViT with bf16 mixed
// precision: the bf16 casts of the activations that the weight gradients
// read). Costs one pass over memory per late read. A cast of parameters
// (graph inputs, or their reshapes and concatenations) is kept instead: a
// weight is cast to bf16 once per step. Run after CSE, which would merge the
// copies back.
Graph rematerialize(const Graph& g, int gap = 64);

// Schedules each output computed elementwise from a donated input (a
// parameter update) after the input's last other use, so that the update can
// write in place. Only ops no other op reads are moved.
Graph defer_donated_updates(const Graph& g, const std::vector<bool>& donated_inputs);

// Which passes run; KILN_COMPILE=no_dce,no_cse,no_simplify,no_fuse,no_epilogue,no_reduce,
// no_norm,no_remat,no_plan,no_inplace,no_attention,no_cast,no_fold turns some off (for
// bisecting a bug).
struct PassOptions {
  bool dce = true, cse = true, simplify = true, fuse = true, epilogue = true, reduce = true,
       norm = true, remat = true, plan = true, inplace = true, attention = true, cast = true,
       fold = true, copy = true;
  static PassOptions from_env();
};

// A jitted function's graph with its constants folded: `graph`'s input slot
// s takes what the traced graph's slot from_slot[s] took (an argument or a
// captured constant), or, where from_slot[s] is -1, the folded value value[s].
struct FoldedGraph {
  Graph graph;
  std::vector<int> from_slot;
  std::vector<Array> value;
  int folded_ops = 0;
  int64_t folded_bytes = 0;
};

// Constant folding for jit: the ops that read only captured constants
// (`constants[slot]` valid: an array the traced function closed over, not
// an argument) run once, now, and the values that the rest of the graph
// reads of them become inputs (as XLA folds closed-over arrays). A model
// whose parameters a jitted function captures casts and concatenates its
// weights at compile time, not on every call. Not folded: outputs, draws and
// fills, collectives, and ops larger than their operands together (a
// broadcast). With nothing to fold (or PassOptions::fold off) the graph is
// returned as it is.
FoldedGraph fold_constants(const Graph& g, const std::vector<Array>& constants,
                           const PassOptions& opt);

// Runs the passes that PassOptions enables, in order; the graph verifier
// checks the traced graph and each pass's result, and KILN_DEBUG=2 prints
// each.
Graph optimize(const Graph& g, const PassOptions& opt);
// KILN_DEBUG's level (0 when unset).
int debug_level();

}  // namespace kiln::compiler
