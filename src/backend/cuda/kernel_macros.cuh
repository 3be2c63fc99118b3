// kiln cuda backend: kernel launches and shared memory in one spelling for
// nvcc and for kiln's CUDA emulator (whose device.h, included first in an
// emulation build, defines these macros its own way):
//
//   KILN_LAUNCH(grid, block, shared bytes, stream, kernel)(args...)
//       is kernel<<<grid, block, shared bytes, stream>>>(args...);
//   KILN_SHARED(float, tile, [32][33]);
//       is __shared__ float tile[32][33];
//   KILN_DYNAMIC_SHARED(unsigned char, smem, 128);
//       is extern __shared__ __align__(128) unsigned char smem[];
#pragma once

#ifndef KILN_CUDA_EMULATION
#define KILN_LAUNCH(grid, block, shared, stream, ...) __VA_ARGS__<<<grid, block, shared, stream>>>
#define KILN_SHARED(type, name, dims) __shared__ type name dims
#define KILN_DYNAMIC_SHARED(type, name, align) \
  extern __shared__ __align__(align)           \
  type name[]
#endif
