// The CUDA code generator, checked without a GPU: every fused program the
// compiler makes for a ViT training step, and random programs, generate a
// source that NVRTC compiles for Hopper (sm_90a) without a register spill
// (where kiln is built with the CUDA toolkit), and whose element functions,
// compiled by the host's C++ compiler from the same text, compute what the
// cpu backend's fused kernels compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "backend/cuda_codegen.h"
#include "compiler/graph.h"
#include "compiler/passes.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/optim.h"
#include "ops/dispatch.h"
#include "ops/op_facts.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/nvrtc.h"
#endif

namespace kiln {
namespace {

struct Case {
  Primitive prim;
  std::vector<Shape> inputs;
  Shape out;
};

// The fused programs of a small ViT's jitted training step (forward,
// backward, SGD), traced on the cpu: the CUDA backend fuses what the cpu
// does (every fusable op; ops/op_facts.h).
std::vector<Case> vit_step_programs() {
  nn::ViTConfig cfg =
      io::load_config<nn::ViTConfig>(std::string(KILN_FIXTURES_DIR) + "/vit_golden/config.json");
  nn::ViTForImageClassification model(cfg);
  std::vector<std::pair<std::string, Shape>> params = model.parameter_shapes();
  std::sort(params.begin(), params.end());
  std::vector<std::string> names;
  std::vector<Array> ph;
  for (auto& [name, shape] : params) {
    names.push_back(name);
    ph.push_back(compiler::tracer(shape, DType::f32));
  }
  ph.push_back(compiler::tracer({4, 3, 32, 32}, DType::f32));
  ph.push_back(compiler::tracer({4}, DType::i64));
  std::vector<Array> outs, leaves;
  {
    LazyScope lazy;
    Params p = unflatten(names, ph);
    auto [loss, grads] = value_and_grad([&](const Params& q) {
      return mean(softmax_cross_entropy(model.apply(q, ph[names.size()]), ph[names.size() + 1]));
    })(p);
    optim::AdamW opt({.lr = 1e-3});
    auto [next, state] = opt.update(grads, opt.init(p), p);
    outs = flatten(next);
    outs.push_back(loss);
  }
  compiler::Graph g = compiler::optimize(compiler::capture(outs, leaves), {});
  std::vector<Case> cases;
  for (const auto& n : g.nodes) {
    if (!n.prim) continue;
    if (n.prim->op() != Op::FusedElementwise && n.prim->op() != Op::FusedReduce) continue;
    bool seen = false;
    for (const auto& c : cases) seen = seen || (c.prim == *n.prim && c.out == n.shape);
    if (seen) continue;
    Case c{*n.prim, {}, n.shape};
    for (int i : n.inputs) c.inputs.push_back(g.nodes[i].shape);
    cases.push_back(c);
  }
  return cases;
}

// Random chains of fusable ops over inputs read whole, as a row or a scalar.
std::vector<Case> random_programs(int count, uint32_t seed) {
  std::vector<Op> unary, binary;
  for (int i = 0; i < kOpCount; ++i) {
    Op op = static_cast<Op>(i);
    if (!op_has(op, kFusable)) continue;
    (op_kind(op) == OpKind::Unary ? unary : binary).push_back(op);
  }
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<Case> cases;
  const Shape shape{5, 7};
  for (int c = 0; c < count; ++c) {
    FusedAttrs f;
    std::vector<Shape> ins;
    const int ni = 1 + pick(4);
    for (int k = 0; k < ni; ++k) {
      FusedRead r = k == 0 ? FusedRead::Whole : static_cast<FusedRead>(pick(3));
      f.reads.push_back(r);
      ins.push_back(r == FusedRead::Whole ? shape : r == FusedRead::Row ? Shape{7} : Shape{1});
    }
    const int len = 1 + pick(8);
    for (int i = 0; i < len; ++i) {
      const int regs = ni + i;
      // Mostly the previous register, so that chains are deep.
      const int a = pick(3) ? regs - 1 : pick(regs);
      if (pick(2)) f.program.push_back({unary[pick(static_cast<int>(unary.size()))], a, -1});
      else f.program.push_back({binary[pick(static_cast<int>(binary.size()))], a, pick(regs)});
    }
    cases.push_back({Primitive(Op::FusedElementwise, f), ins, shape});
  }
  return cases;
}

// Input k's element i in every check (host and generated code alike).
float input_value(int k, int64_t i) {
  return static_cast<float>(1.5 * std::sin(0.37 * static_cast<double>(i) + 1.3 * k) + 0.1 * k);
}

std::vector<float> cpu_result(const Case& c) {
  std::vector<Array> in;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    std::vector<float> v(numel(c.inputs[k]));
    for (size_t i = 0; i < v.size(); ++i) v[i] = input_value(static_cast<int>(k), static_cast<int64_t>(i));
    in.push_back(Array::from_data(v.data(), c.inputs[k], DType::f32));
  }
  ArrayNode out;
  out.shape = c.out;
  out.dtype = DType::f32;
  run_kernel_with(c.prim, in, out);
  const float* y = static_cast<const float*>(out.buffer->data()) + out.offset;
  return std::vector<float>(y, y + numel(c.out));
}

codegen::Source source_of(const Case& c) {
  return c.prim.op() == Op::FusedElementwise ? codegen::fused_elementwise(c.prim.attrs<FusedAttrs>())
                                             : codegen::fused_reduce(c.prim.attrs<FusedReduceAttrs>());
}

// One host program that runs every case's element functions as the CUDA
// kernels do (a sum per output, in order) and prints the results.
std::string host_program(const std::vector<Case>& cases) {
  const std::string prelude = codegen::prelude();
  std::ostringstream os;
  os << prelude << "#include <cmath>\n#include <cstdio>\n#include <vector>\n";
  for (size_t c = 0; c < cases.size(); ++c)
    os << "namespace case" << c << " {\n" << source_of(cases[c]).text.substr(prelude.size()) << "}\n";
  os << "static float input_value(int k, long long i) {\n"
        "  return static_cast<float>(1.5 * std::sin(0.37 * static_cast<double>(i) + 1.3 * k) + 0.1 * k);\n}\n"
        "int main() {\n";
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    os << "  {\n    KilnArgs a{};\n    std::vector<std::vector<float>> in(" << k.inputs.size() << ");\n";
    for (size_t i = 0; i < k.inputs.size(); ++i)
      os << "    in[" << i << "].resize(" << numel(k.inputs[i]) << ");\n    for (long long j = 0; j < "
         << numel(k.inputs[i]) << "; ++j) in[" << i << "][j] = input_value(" << i << ", j);\n    a.in["
         << i << "] = in[" << i << "].data();\n    a.row[" << i << "] = " << std::max<int64_t>(1, numel(k.inputs[i]))
         << ";\n";
    if (k.prim.op() == Op::FusedElementwise) {
      os << "    for (long long i = 0; i < " << numel(k.out) << "; ++i) std::printf(\"%.9g\\n\", case" << c
         << "::kiln_body(a, i));\n";
    } else {
      const auto& f = k.prim.attrs<FusedReduceAttrs>();
      int64_t outer = 1, reduced = 1, inner = 1;
      for (int i = 0; i < f.reduce.axes.front(); ++i) outer *= f.shape[i];
      for (int i = f.reduce.axes.front(); i <= f.reduce.axes.back(); ++i) reduced *= f.shape[i];
      for (size_t i = f.reduce.axes.back() + 1; i < f.shape.size(); ++i) inner *= f.shape[i];
      os << "    for (long long o = 0; o < " << outer << "; ++o) for (long long j = 0; j < " << inner
         << "; ++j) {\n      float s = 0;\n      for (long long r = 0; r < " << reduced
         << "; ++r) s += case" << c << "::kiln_body(a, (o * " << reduced << " + r) * " << inner
         << " + j);\n      std::printf(\"%.9g\\n\", case" << c << "::kiln_epilogue(a, s, o * " << inner
         << " + j));\n    }\n";
    }
    os << "  }\n";
  }
  os << "  return 0;\n}\n";
  return os.str();
}

// Compiles `text` with the host compiler and runs it; its output's numbers.
std::vector<double> compile_and_run(const std::string& text, std::string* error) {
  char dir[] = "/tmp/kiln-codegen-XXXXXX";
  if (!mkdtemp(dir)) {
    *error = "mkdtemp failed";
    return {};
  }
  const std::string d = dir;
  std::ofstream(d + "/main.cpp") << text;
  const std::string cmd = std::string(KILN_CXX_COMPILER) + " -std=c++20 -O1 -I" + KILN_SOURCE_DIR +
                          "/src -I" + KILN_SOURCE_DIR + "/include " + d + "/main.cpp -o " + d +
                          "/main > " + d + "/cc.log 2>&1 && " + d + "/main > " + d + "/out.txt";
  std::vector<double> v;
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(d + "/cc.log");
    std::stringstream ss;
    ss << log.rdbuf();
    *error = "host compile or run failed: " + ss.str().substr(0, 4000);
  } else {
    std::ifstream out(d + "/out.txt");
    std::string tok;
    while (out >> tok) v.push_back(std::strtod(tok.c_str(), nullptr));
  }
  std::system(("rm -rf " + d).c_str());
  return v;
}

void check_host_numerics(const std::vector<Case>& cases) {
  std::string error;
  std::vector<double> got = compile_and_run(host_program(cases), &error);
  ASSERT_TRUE(error.empty()) << error;
  size_t at = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("program " + std::to_string(c) + ": " + cases[c].prim.str());
    std::vector<float> want = cpu_result(cases[c]);
    ASSERT_LE(at + want.size(), got.size());
    double scale = 0;
    for (float w : want) scale = std::isfinite(w) ? std::max(scale, std::fabs(double(w))) : scale;
    for (size_t i = 0; i < want.size(); ++i, ++at) {
      const double w = want[i], g = got[at];
      if (std::isnan(w)) {
        EXPECT_TRUE(std::isnan(g)) << "element " << i;
      } else if (std::isinf(w)) {
        EXPECT_EQ(w, g) << "element " << i;
      } else {
        // Elementwise: the same functions in the same order (up to FMA
        // contraction). Sums: another order of f32 additions.
        const double tol = cases[c].prim.op() == Op::FusedReduce ? 1e-5 * std::max(1.0, scale)
                                                                 : 2e-6 * std::max(1.0, std::fabs(w));
        EXPECT_NEAR(g, w, tol) << "element " << i;
      }
    }
  }
  EXPECT_EQ(at, got.size());
}

TEST(CudaCodegen, VitTrainingStepProgramsComputeWhatTheCpuComputes) {
  std::vector<Case> cases = vit_step_programs();
  int reduces = 0;
  for (const auto& c : cases) reduces += c.prim.op() == Op::FusedReduce;
  // The step fuses elementwise chains (GELU's backward, AdamW's update, ...)
  // and reductions with their prologues (bias gradients, ...).
  EXPECT_GE(cases.size() - reduces, 5u);
  EXPECT_GE(reduces, 1);
  check_host_numerics(cases);
}

TEST(CudaCodegen, RandomProgramsComputeWhatTheCpuComputes) {
  check_host_numerics(random_programs(40, 7));
}

TEST(CudaCodegen, RefusesWhatItCannotGenerate) {
  FusedAttrs f{{FusedRead::Whole}, {{Op::Matmul, 0, -1}}};
  EXPECT_FALSE(codegen::can_generate(f));
  EXPECT_THROW(codegen::fused_elementwise(f), Error);
  FusedAttrs many;
  many.reads.assign(codegen::kMaxInputs + 1, FusedRead::Whole);
  many.program.push_back({Op::Add, 0, 1});
  EXPECT_FALSE(codegen::can_generate(many));
  FusedAttrs forward_ref{{FusedRead::Whole}, {{Op::Exp, 1, -1}}};  // reads its own register
  EXPECT_FALSE(codegen::can_generate(forward_ref));
  FusedAttrs rounded{{FusedRead::Whole}, {{Op::Exp, 0, -1, true}}};  // a bf16 op's rounding
  EXPECT_FALSE(codegen::can_generate(rounded));
  EXPECT_TRUE(codegen::can_generate(FusedAttrs{{FusedRead::Whole}, {{Op::Exp, 0, -1}}}));
}

#ifdef KILN_HAVE_CUDA
// CI's compile-only check (no GPU needed): every program compiles for
// Hopper and keeps its values in registers. Each source text once: NVRTC
// 13.0 (an H200 machine's, 2026-12-04) gave no ptxas report when it compiled
// a text it had compiled before in the same process.
void check_nvrtc(const std::vector<Case>& cases) {
  std::set<std::string> seen;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.prim.str());
    const std::string text = source_of(c).text;
    if (!seen.insert(text).second) continue;
    cuda::Compiled k = cuda::nvrtc_compile_for_gpu(text, "sm_90a");
    ASSERT_TRUE(k.ok) << k.log;
    EXPECT_FALSE(k.cubin.empty());
    EXPECT_EQ(k.spill_stores, 0) << k.log;
    EXPECT_EQ(k.spill_loads, 0) << k.log;
    EXPECT_GT(k.registers, 0) << "no ptxas report in the log: " << k.log;
  }
}

TEST(CudaCodegen, VitTrainingStepProgramsCompileForHopperWithoutSpills) {
  check_nvrtc(vit_step_programs());
}

TEST(CudaCodegen, RandomProgramsCompileForHopperWithoutSpills) {
  check_nvrtc(random_programs(40, 11));
}

TEST(CudaCodegen, CompileErrorsAreReported) {
  cuda::Compiled k = cuda::nvrtc_compile_for_gpu(
      "extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90a");
  EXPECT_FALSE(k.ok);
  EXPECT_NE(k.log.find("undefined_thing"), std::string::npos) << k.log;
}
#endif

}  // namespace
}  // namespace kiln
