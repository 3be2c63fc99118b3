// kiln cpu backend: fused elementwise programs as AVX-512 machine code
// (fused_jit.h). One function a program: the constants and Scalar inputs
// broadcast once, then 16 lanes an iteration — Whole and Row inputs loaded
// (bf16 zero-extended and shifted into f32), each instruction one or a few
// vector instructions on the zmm registers of its operands, a bf16-rounded
// instruction rounded in its register, the last register stored (rounded to
// bf16 bits for a bf16 output) — and a masked iteration for the tail. The
// sums' variant loops over rows too and adds each value into its column's
// sum instead of storing it.
#include "backend/cpu/fused_jit.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/error.h"

#if defined(__AVX512F__) && defined(__BMI2__)
#define KILN_FUSED_JIT 1
#include <xbyak/xbyak.h>
#include <xbyak/xbyak_util.h>
#else
#define KILN_FUSED_JIT 0
#endif

namespace kiln::cpu {
namespace {

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on = [] {
    const char* e = std::getenv("KILN_FUSED");
    const std::string v = e ? e : "";
    if (v.empty() || v == "jit") return true;
    if (v == "interpret") return false;
    fail("FusedElementwise", "KILN_FUSED is '" + v + "', expected jit or interpret");
  }();
  return on;
}

#if KILN_FUSED_JIT

// zmm0..zmm23 hold the program's registers; the rest constants and temporaries.
constexpr int kMaxRegisters = 24;

bool has_code(Op op) {
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Relu:
    case Op::ReluGrad:
    case Op::Neg:
    case Op::Abs:
    case Op::Sqrt: return true;
    default: return false;
  }
}

class ProgramCode : public Xbyak::CodeGenerator {
 public:
  ProgramCode(const FusedAttrs& body, const std::vector<bool>& bf16_in, bool bf16_out,
              bool accumulate)
      : Xbyak::CodeGenerator(16384),
        body_(body),
        bf16_in_(bf16_in),
        bf16_out_(bf16_out),
        accumulate_(accumulate) {
    using namespace Xbyak;
    // System V: rdi = ptrs, rsi = out, rdx = n; accumulating, rcx = rows and
    // r8 = the Whole inputs' stride between rows (kept in r9 and r8). rcx
    // counts positions; r10 is a Whole input's row offset, r11 its position.
    vpxord(kZero, kZero, kZero);
    broadcast(kSign, 0x80000000u);
    broadcast(kOne, 1u);
    broadcast(kHalf, 0x7fffu);
    broadcast(kHigh, 0xffff0000u);
    broadcast(kQuiet, 0x00400000u);
    for (size_t k = 0; k < body_.reads.size(); ++k) {
      if (body_.reads[k] != FusedRead::Scalar) continue;
      mov(rax, ptr[rdi + 8 * k]);
      if (bf16_in_[k]) {
        movzx(eax, word[rax]);
        shl(eax, 16);
        vpbroadcastd(Zmm(static_cast<int>(k)), eax);
      } else {
        vbroadcastss(Zmm(static_cast<int>(k)), dword[rax]);
      }
    }
    Label row, full, tail, next, done;
    if (accumulate_) mov(r9, rcx);
    xor_(r10d, r10d);
    L(row);
    if (accumulate_) {
      test(r9, r9);
      jz(done, T_NEAR);
    }
    xor_(ecx, ecx);
    L(full);
    mov(rax, rdx);
    sub(rax, rcx);
    cmp(rax, 16);
    jl(tail, T_NEAR);
    iteration(false);
    add(rcx, 16);
    jmp(full, T_NEAR);
    L(tail);
    test(rax, rax);
    jz(next, T_NEAR);
    mov(r11d, 0xffff);
    bzhi(r11d, r11d, eax);
    kmovw(k1, r11d);
    iteration(true);
    L(next);
    if (accumulate_) {
      add(r10, r8);
      dec(r9);
      jmp(row, T_NEAR);
    }
    L(done);
    vzeroupper();
    ret();
    ready();
  }

 private:
  const Xbyak::Zmm kZero{31}, kSign{30}, kOne{29}, kHalf{28}, kHigh{27}, kQuiet{26}, kT0{25},
      kT1{24};

  void broadcast(const Xbyak::Zmm& z, uint32_t bits) {
    mov(eax, bits);
    vpbroadcastd(z, eax);
  }

  // z (f32 values) rounded to bf16 in place, the bits in the upper half:
  // narrow_bf16's (u + 0x7fff + ((u >> 16) & 1)) with the low half cleared,
  // a NaN (u >> 16) | 0x40 instead.
  void round_bf16(const Xbyak::Zmm& z) {
    vpsrld(kT0, z, 16);
    vpandd(kT0, kT0, kOne);
    vpaddd(kT0, kT0, z);
    vpaddd(kT0, kT0, kHalf);
    vpandd(kT0, kT0, kHigh);
    vcmpps(k2, z, z, 3);  // unordered: NaN
    vpord(kT1, z, kQuiet);
    vpandd(kT1, kT1, kHigh);
    vmovdqa32(kT0 | k2, kT1);
    vmovdqa32(z, kT0);
  }

  void iteration(bool masked) {
    using namespace Xbyak;
    const int ni = static_cast<int>(body_.reads.size());
    if (accumulate_) lea(r11, ptr[r10 + rcx]);
    for (int k = 0; k < ni; ++k) {
      if (body_.reads[k] == FusedRead::Scalar) continue;
      const Zmm z(k);
      // Accumulating, a Whole input moves on by the stride each row; a Row
      // input (one value per column) does not.
      const Reg64& at = accumulate_ && body_.reads[k] == FusedRead::Whole ? r11 : rcx;
      mov(rax, ptr[rdi + 8 * k]);
      if (bf16_in_[k]) {
        if (masked)
          vpmovzxwd(z | k1 | T_z, ptr[rax + at * 2]);
        else
          vpmovzxwd(z, ptr[rax + at * 2]);
        vpslld(z, z, 16);
      } else if (masked) {
        vmovups(z | k1 | T_z, ptr[rax + at * 4]);
      } else {
        vmovups(z, ptr[rax + at * 4]);
      }
    }
    for (size_t i = 0; i < body_.program.size(); ++i) {
      const FusedInstr& ins = body_.program[i];
      const Zmm d(ni + static_cast<int>(i)), a(ins.a), b(ins.b >= 0 ? ins.b : ins.a);
      switch (ins.op) {
        case Op::Add: vaddps(d, a, b); break;
        case Op::Sub: vsubps(d, a, b); break;
        case Op::Mul: vmulps(d, a, b); break;
        case Op::Div: vdivps(d, a, b); break;
        // maxps(a, b) is a > b ? a : b and minps(a, b) a < b ? a : b, NaN
        // and signed zeros included: scalar<Maximum> and scalar<Minimum>.
        case Op::Maximum: vmaxps(d, a, b); break;
        case Op::Minimum: vminps(d, a, b); break;
        case Op::Relu: vmaxps(d, a, kZero); break;  // a > 0 ? a : 0
        case Op::ReluGrad:                          // b > 0 ? a : 0 (NaN b: 0)
          vcmpps(k2, b, kZero, 14);                 // greater than, ordered
          vmovaps(d | k2 | T_z, a);
          break;
        case Op::Neg: vpxord(d, a, kSign); break;
        case Op::Abs:               // a < 0 ? -a : a (keeps -0 and NaN as they are)
          vcmpps(k2, a, kZero, 1);  // less than, ordered
          vmovaps(d, a);
          vpxord(d | k2, a, kSign);
          break;
        case Op::Sqrt: vsqrtps(d, a); break;
        default: fail("FusedElementwise", "no machine code for an op of this program");
      }
      if (ins.round_bf16) round_bf16(d);
    }
    const Zmm last(ni + static_cast<int>(body_.program.size()) - 1);
    if (accumulate_) {  // out[i] = out[i] + value, as the C++ sums add
      if (masked) {
        vmovups(kT1 | k1 | T_z, ptr[rsi + rcx * 4]);
        vaddps(kT1, kT1, last);
        vmovups(ptr[rsi + rcx * 4] | k1, kT1);
      } else {
        vmovups(kT1, ptr[rsi + rcx * 4]);
        vaddps(kT1, kT1, last);
        vmovups(ptr[rsi + rcx * 4], kT1);
      }
    } else if (bf16_out_) {
      vmovaps(kT1, last);
      round_bf16(kT1);
      vpsrld(kT1, kT1, 16);
      if (masked)
        vpmovdw(ptr[rsi + rcx * 2] | k1, kT1);
      else
        vpmovdw(ptr[rsi + rcx * 2], kT1);
    } else if (masked) {
      vmovups(ptr[rsi + rcx * 4] | k1, last);
    } else {
      vmovups(ptr[rsi + rcx * 4], last);
    }
  }

  FusedAttrs body_;
  std::vector<bool> bf16_in_;
  bool bf16_out_, accumulate_;
};

bool cpu_ok() {
  static const bool ok = [] {
    const Xbyak::util::Cpu cpu;
    return cpu.has(Xbyak::util::Cpu::tAVX512F) && cpu.has(Xbyak::util::Cpu::tBMI2);
  }();
  return ok;
}

#endif  // KILN_FUSED_JIT

}  // namespace

bool fused_jit_enabled() {
  return KILN_FUSED_JIT && enabled_flag().load();
}
void set_fused_jit_enabled(bool on) {
  enabled_flag().store(on);
}

namespace {

// The cached code of one program, output and mode (null: none).
void* compiled(const FusedAttrs& body, const std::vector<bool>& bf16_in, bool bf16_out,
                     bool accumulate) {
#if KILN_FUSED_JIT
  if (!fused_jit_enabled() || !cpu_ok() || bf16_in.size() != body.reads.size()) return nullptr;
  const size_t nregs = body.reads.size() + body.program.size();
  if (nregs == 0 || nregs > static_cast<size_t>(kMaxRegisters)) return nullptr;
  std::string key = accumulate ? "a:" : bf16_out ? "h:" : "f:";
  for (size_t k = 0; k < body.reads.size(); ++k)
    key += std::to_string(static_cast<int>(body.reads[k])) + (bf16_in[k] ? "h," : "f,");
  for (const FusedInstr& ins : body.program) {
    if (!has_code(ins.op)) return nullptr;
    key += ";" + std::to_string(static_cast<int>(ins.op)) + "," + std::to_string(ins.a) + "," +
           std::to_string(ins.b) + (ins.round_bf16 ? "r" : "");
  }
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<ProgramCode>> cache;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::unique_ptr<ProgramCode> code;
    try {
      code = std::make_unique<ProgramCode>(body, bf16_in, bf16_out, accumulate);
    } catch (const Xbyak::Error&) {  // cannot emit it (no executable memory): interpret
    }
    it = cache.emplace(key, std::move(code)).first;
  }
  return it->second ? const_cast<uint8_t*>(it->second->getCode()) : nullptr;
#else
  (void)body;
  (void)bf16_in;
  (void)bf16_out;
  (void)accumulate;
  return nullptr;
#endif
}

}  // namespace

FusedFn fused_jit(const FusedAttrs& body, const std::vector<bool>& bf16_in, bool bf16_out) {
  return reinterpret_cast<FusedFn>(compiled(body, bf16_in, bf16_out, false));
}

FusedSumFn fused_jit_sum(const FusedAttrs& body, const std::vector<bool>& bf16_in) {
  return reinterpret_cast<FusedSumFn>(compiled(body, bf16_in, false, true));
}

}  // namespace kiln::cpu
