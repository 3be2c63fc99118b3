#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
#define T __attribute__((target("amx-tile,amx-bf16,avx512f")))
T void cfg() { Cfg c; for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  __asm__ __volatile__("" : : "m"(c) : "memory"); _tile_loadconfig(&c); }
static uint16_t *A, *B; static float* S;
// MODE 0: never reset; 1: zero at start; 2: zero + store at end to slot; 3: as amx_block_2x2 (pipelined loads) zero+store
template <int MODE>
T __attribute__((noinline)) void run(long blocks, long ks, long bstep_tiles) {
  const long sa = ks * 32 * 2;
  long bt = 0;
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (long blk = 0; blk < blocks; ++blk) {
    if (MODE >= 1 && MODE != 4) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    const uint16_t* a = A; const uint16_t* a1 = A + 16 * ks * 32;
    float* c = S + (blk & 1) * 1024;
    const long last = MODE >= 3 ? ks - 1 : ks;
    for (long s = 0; s < last; ++s) {
      const uint16_t* b = B + (bt % bstep_tiles) * 512; bt += 2;
      _tile_stream_loadd(6, b, 64);
      _tile_loadd(4, a + s * 32, sa);
      _tile_dpbf16ps(0, 4, 6);
      _tile_stream_loadd(7, b + 512, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a1 + s * 32, sa);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    if (MODE >= 3) {
      const long s = ks - 1;
      const uint16_t* b = B + (bt % bstep_tiles) * 512; bt += 2;
      _tile_stream_loadd(6, b, 64);
      _tile_loadd(4, a + s * 32, sa);
      _tile_loadd(5, a1 + s * 32, sa);
      _tile_stream_loadd(7, b + 512, 64);
      if (MODE == 3) {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6);
        _tile_stored(0, c, 128); _tile_dpbf16ps(3, 5, 7); _tile_stored(1, c + 16, 128);
        _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
      } else if (MODE == 4) {  // store then zero each
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        _tile_stored(0, c, 128); _tile_zero(0); _tile_stored(1, c + 16, 128); _tile_zero(1);
        _tile_stored(2, c + 512, 128); _tile_zero(2); _tile_stored(3, c + 528, 128); _tile_zero(3);
      } else {  // 5: plain order, stores after
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128); _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
      }
    } else if (MODE == 2) {
      _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128); _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
    }
  }
  _tile_stored(0, S, 64);
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  const long ks = atol(argv[1]), bkib = atol(argv[2]);
  A = (uint16_t*)aligned_alloc(4096, 64 * 1024); B = (uint16_t*)aligned_alloc(4096, bkib * 1024 + 4096);
  S = (float*)aligned_alloc(4096, 16384);
  for (long i = 0; i < 32 * 1024; ++i) A[i] = 0x3c00 + (rand() & 0x3ff);
  for (long i = 0; i < bkib * 512 + 2048; ++i) B[i] = 0x3c00 + (rand() & 0x3ff);
  cfg();
  const long tiles = bkib / 2;  // B 2 KiB per step pair... tiles of 1 KiB
  const long blocks = 2000000 / ks / 8;
  for (int mode = 0; mode < 6; ++mode) {
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      switch (mode) { case 0: run<0>(blocks, ks, tiles); break; case 1: run<1>(blocks, ks, tiles); break; case 2: run<2>(blocks, ks, tiles); break; case 3: run<3>(blocks, ks, tiles); break; case 4: run<4>(blocks, ks, tiles); break; default: run<5>(blocks, ks, tiles); }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    printf("ks %ld B %ld KiB mode %d: %.2f TF/s/core\n", ks, bkib, mode, 2.0 * 32 * 32 * 32 * ks * blocks / best / 1e12);
  }
}
