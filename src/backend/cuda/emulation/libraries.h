// kiln's CUDA emulator: its cuBLASLt, cuDNN, NVRTC and NCCL, which dynlib.h's
// calls reach in an emulation build instead of the libraries (cublaslt.cpp,
// cudnn.cpp, nvrtc.cpp, nccl.cpp). Each has the library's signatures.
#pragma once

namespace kiln::emu {

// The address of the emulated library function `name` (null where the
// emulator has none).
void* cublaslt_symbol(const char* name);
void* nvrtc_symbol(const char* name);
void* nccl_symbol(const char* name);
void* cudnn_symbol(const char* name);

// f32 to the nearest tf32 (ties away from zero): an f32 operand as the
// tensor cores take it in TF32 math (cuBLASLt's fast-tf32 compute, cuDNN's
// tensor-op math on f32 data).
float tf32(float v);

}  // namespace kiln::emu
