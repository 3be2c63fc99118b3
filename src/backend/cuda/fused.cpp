// kiln cuda backend: FusedElementwise and FusedReduce as kernels generated
// from the fused-op description (backend/cuda_codegen.h), compiled with NVRTC
// once per program and cached — in memory, and on disk as cubins keyed by the
// source, the architecture and NVRTC's version, so that a later process
// starts without compiling.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <unistd.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/nvrtc.h"
#include "backend/cuda_codegen.h"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;

// The kernel argument block (codegen's KilnArgs, byte for byte).
struct KilnArgs {
  const float* in[codegen::kMaxInputs];
  long long row[codegen::kMaxInputs];
  float* out;
  long long n, outer, reduced, inner;
  float* part;
  long long chunk_rows, chunks;
};

struct Program {
  cudaLibrary_t library = nullptr;
  std::vector<cudaKernel_t> kernels;
};

// Where compiled kernels are kept between processes: $KILN_CACHE_DIR, else
// $XDG_CACHE_HOME/kiln, else ~/.cache/kiln (a subfolder cuda/); none when
// KILN_CACHE_DIR is "off" or no folder can be made.
fs::path cache_dir() {
  static const fs::path dir = []() -> fs::path {
    fs::path base;
    if (const char* e = std::getenv("KILN_CACHE_DIR"); e && *e) {
      if (std::string(e) == "off") return {};
      base = e;
    } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
      base = fs::path(x) / "kiln";
    } else if (const char* h = std::getenv("HOME"); h && *h) {
      base = fs::path(h) / ".cache" / "kiln";
    } else {
      return {};
    }
    std::error_code ec;
    fs::create_directories(base / "cuda", ec);
    return ec ? fs::path() : base / "cuda";
  }();
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return {};
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Written to a temporary name, then renamed: a reader never sees half a file.
void write_atomically(const fs::path& p, const std::string& bytes) {
  const fs::path tmp = p.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      f.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) fs::remove(tmp, ec);
}

std::string arch_of(int device) {
  const DeviceInfo& d = device_info(device);
  // Hopper's own instructions need the "a" target; it runs on sm_90 only.
  return "sm_" + std::to_string(d.major) + std::to_string(d.minor) + (d.major == 9 ? "a" : "");
}

// The cubin of `src` for `arch`: from the disk cache, else compiled (a
// compile error is kiln's bug: it names the program and NVRTC's log).
std::string cubin_for(const codegen::Source& src, const std::string& arch, const char* op) {
  std::string key_text = src.text + "\n// " + arch + " nvrtc " + nvrtc_version();
#ifdef KILN_CUDA_EMULATION
  // The emulator's programs are host code built against its device headers.
  key_text += " emulated " KILN_EMU_ABI;
#endif
  char key[32];
  std::snprintf(key, sizeof key, "%016zx", std::hash<std::string>{}(key_text));
  const fs::path dir = cache_dir();
  const fs::path file = dir.empty() ? fs::path() : dir / (std::string(key) + "-" + arch + ".cubin");
  if (!file.empty()) {
    std::string cached = read_file(file);
    if (!cached.empty()) return cached;
  }
  Compiled c = nvrtc_compile(src.text, arch, std::string("kiln_") + op + ".cu");
  if (!c.ok) fail(op, "NVRTC could not compile the generated kernel:\n" + c.log + "\n" + src.text);
  if (!file.empty()) write_atomically(file, c.cubin);
  return c.cubin;
}

// The program of a fused primitive, found by the primitive itself first (so
// that a launch does not generate its source again).
template <typename Gen>
const Program& program_of(const Primitive& prim, int device, const char* op, Gen generate);

const Program& program_for(const codegen::Source& src, int device, const char* op) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<std::string, Program>();  // never destroyed
  const std::string arch = arch_of(device);
  const std::string key = arch + "\n" + src.text;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  const std::string cubin = cubin_for(src, arch, op);
  Program p;
  KILN_CUDA_CHECK(cudaLibraryLoadData(&p.library, cubin.data(), nullptr, nullptr, 0, nullptr,
                                      nullptr, 0));
  for (const auto& name : src.kernels) {
    cudaKernel_t k = nullptr;
    KILN_CUDA_CHECK(cudaLibraryGetKernel(&k, p.library, name.c_str()));
    p.kernels.push_back(k);
  }
  return cache->emplace(key, std::move(p)).first->second;
}

template <typename Gen>
const Program& program_of(const Primitive& prim, int device, const char* op, Gen generate) {
  static std::mutex mu;
  // Never destroyed; entries point into program_for's cache, which keeps them.
  static auto* seen = new std::unordered_map<size_t, std::vector<std::pair<Primitive, const Program*>>>();
  const size_t h = prim.hash() * 31 + static_cast<size_t>(device);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [p, prog] : (*seen)[h])
      if (p == prim) return *prog;
  }
  const Program& prog = program_for(generate(), device, op);
  std::lock_guard<std::mutex> lock(mu);
  (*seen)[h].emplace_back(prim, &prog);
  return prog;
}

void launch(cudaKernel_t k, unsigned blocks, cudaStream_t s, KilnArgs& args, const char* op) {
  void* params[] = {&args};
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(blocks), dim3(256),
                                   params, 0, s));
  check_launch(op);
}

// Fills the input pointers and row lengths of inputs [first, first + count)
// into slots starting at `slot`.
void bind_inputs(KilnArgs& a, const std::vector<Array>& in, size_t first, size_t count, int slot,
          const char* op) {
  for (size_t k = 0; k < count; ++k) {
    const Array& x = in.at(first + k);
    if (x.dtype() != DType::f32) fail(op, std::string("inputs must be f32, got ") + name_of(x.dtype()));
    a.in[slot + k] = x.data<float>();
    a.row[slot + k] = std::max<long long>(1, x.size());
  }
}

void fused_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                  ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& f = p.attrs<FusedAttrs>();
  if (in.size() != f.reads.size())
    fail("FusedElementwise", "expected " + std::to_string(f.reads.size()) + " inputs, got " +
                                 std::to_string(in.size()));
  const Program& prog = program_of(p, ctx.device.index, "FusedElementwise",
                                   [&] { return codegen::fused_elementwise(f); });
  KilnArgs a{};
  bind_inputs(a, in, 0, in.size(), 0, "FusedElementwise");
  a.out = out_ptr<float>(out);
  a.n = numel(out.shape);
  if (a.n == 0) return;
  const unsigned cap = static_cast<unsigned>(device_info(ctx.device.index).multiprocessors) * 8;
  launch(prog.kernels[0], std::min(blocks_for(a.n), cap), s, a, "FusedElementwise");
}

void fused_reduce_kernel(const KernelContext& ctx, const Primitive& p,
                         const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& f = p.attrs<FusedReduceAttrs>();
  const size_t nbody = f.body.reads.size();
  const size_t nepi = f.epilogue.program.empty() ? 0 : f.epilogue.reads.size() - 1;
  if (in.size() != nbody + nepi)
    fail("FusedReduce", "expected " + std::to_string(nbody + nepi) + " inputs, got " +
                            std::to_string(in.size()));
  const Program& prog =
      program_of(p, ctx.device.index, "FusedReduce", [&] { return codegen::fused_reduce(f); });
  KilnArgs a{};
  bind_inputs(a, in, 0, in.size(), 0, "FusedReduce");
  a.out = out_ptr<float>(out);
  const auto& axes = f.reduce.axes;
  a.outer = a.reduced = a.inner = 1;
  for (int i = 0; i < axes.front(); ++i) a.outer *= f.shape[i];
  for (int i = axes.front(); i <= axes.back(); ++i) a.reduced *= f.shape[i];
  for (size_t i = axes.back() + 1; i < f.shape.size(); ++i) a.inner *= f.shape[i];
  a.n = a.outer * a.inner;
  if (a.n == 0) return;
  const int sms = device_info(ctx.device.index).multiprocessors;
  const unsigned cap = static_cast<unsigned>(sms) * 16;
  if (a.inner == 1) {  // a warp per output row: 8 rows per block
    launch(prog.kernels[0], std::min(blocks_for(a.outer * 32), cap), s, a, "FusedReduce");
    return;
  }
  // Columns: a thread per output where 8 blocks of 256 per multiprocessor
  // have work; else the rows in chunks, about four blocks per multiprocessor.
  const long long tiles = a.outer * ((a.inner + 31) / 32);
  if (a.n >= static_cast<long long>(sms) * 8 * 256 || a.reduced < 64) {
    launch(prog.kernels[1], std::min(blocks_for(a.n), cap), s, a, "FusedReduce");
    return;
  }
  a.chunks = std::clamp<long long>(4LL * sms / std::max<long long>(tiles, 1), 1, a.reduced / 32);
  a.chunk_rows = (a.reduced + a.chunks - 1) / a.chunks;
  a.chunks = (a.reduced + a.chunk_rows - 1) / a.chunk_rows;
  const size_t bytes = static_cast<size_t>(a.chunks * a.n) * sizeof(float);
  a.part = static_cast<float*>(ctx.scratch->allocate(bytes));
  launch(prog.kernels[2], static_cast<unsigned>(tiles * a.chunks), s, a, "FusedReduce");
  launch(prog.kernels[3], std::min(blocks_for(a.n), cap), s, a, "FusedReduce");
  ctx.scratch->release(a.part, bytes);  // stream-ordered: after both kernels
}

}  // namespace

bool supports_fused(const Primitive& p) {
  const Attrs& a = p.attrs_variant();
  if (p.op() == Op::FusedElementwise)
    return std::holds_alternative<FusedAttrs>(a) && codegen::can_generate(p.attrs<FusedAttrs>());
  if (p.op() == Op::FusedReduce)
    return std::holds_alternative<FusedReduceAttrs>(a) &&
           codegen::can_generate(p.attrs<FusedReduceAttrs>());
  return true;
}

void register_fused(KernelTable& t) {
  t.kernels[static_cast<int>(Op::FusedElementwise)] = fused_kernel;
  t.kernels[static_cast<int>(Op::FusedReduce)] = fused_reduce_kernel;
}

}  // namespace kiln::cuda
