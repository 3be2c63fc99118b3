// kiln's CUDA emulator (src/backend/cuda/emulation/): its built-ins compute
// what a GPU computes, and its checks stop a kernel where a GPU's sanitizer
// would. Each kernel below can be built with a flaw (its `flaw` argument):
// the flawless kernel must pass, each flaw must fail with its own error.
// Compiled like the backend's kernels, in emulation builds only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/dynlib.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

const Device kGpu = Device::cuda(0);

enum Flaw : int { kNone, kGlobalOffByOne, kSharedOffByOne, kNoBarrier, kUnguardedRead };

// Reverses each block's run of up to 64 elements through a shared tile:
// y[b·64 + t] = x[b·64 + count - 1 - t]. The flaws: the loader reads one
// element past x; the tile is written one slot off; the barrier between the
// tile's writes and reads is gone; the reads ignore that a last, partial
// block wrote only `count` slots.
__global__ void reverse_blocks(float* y, const float* x, int n, int flaw) {
  KILN_SHARED(float, tile, [64]);
  const int t = static_cast<int>(threadIdx.x), base = static_cast<int>(blockIdx.x) * 64;
  const int count = n - base < 64 ? n - base : 64;
  if (t < count) {
    const int i = base + t + (flaw == kGlobalOffByOne && t == count - 1 ? 1 : 0);
    tile[t + (flaw == kSharedOffByOne ? 1 : 0)] = x[i];
  }
  if (flaw != kNoBarrier) __syncthreads();
  if (t < count) y[base + t] = tile[flaw == kUnguardedRead ? 63 - t : count - 1 - t];
}

std::vector<float> iota_floats(int n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.0f);
  return v;
}

Array on_gpu(const std::vector<float>& v) {
  Array a = Array::from_vector(v, {static_cast<int64_t>(v.size())}).to(kGpu);
  a.eval();
  return a;
}

// Runs reverse_blocks with `flaw` on n elements; the kernel's error, if any.
std::string reverse(int n, int flaw, std::vector<float>* out = nullptr) {
  cuda::use_device(0);
  Array x = on_gpu(iota_floats(n));
  Array y = Array::empty({n}, DType::f32, kGpu);
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  KILN_LAUNCH((n + 63) / 64, 64, 0, s, reverse_blocks)(y.data<float>(), x.data<float>(), n, flaw);
  try {
    cuda::check_launch("reverse_blocks");
  } catch (const Error& e) {
    return e.what();
  }
  if (out) *out = y.to_vector<float>();
  return {};
}

TEST(CudaEmulator, AFlawlessTileKernelComputesItsResult) {
  std::vector<float> y;
  ASSERT_EQ(reverse(100, kNone, &y), "");
  std::vector<float> expected(100);
  for (int i = 0; i < 100; ++i) expected[i] = i < 64 ? 64.0f - i : 100.0f - (i - 64);
  EXPECT_EQ(y, expected);
}

TEST(CudaEmulator, AnOffByOneTileLoaderIsAnOutOfBoundsRead) {
  const std::string e = reverse(100, kGlobalOffByOne);
  EXPECT_NE(e.find("kernel reverse_blocks"), std::string::npos) << e;
  EXPECT_NE(e.find("block (1, 0, 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("thread (35, 0, 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("4-byte read of 0 bytes past the end of a 400-byte allocation on cuda:0"),
            std::string::npos)
      << e;
}

TEST(CudaEmulator, AnOffByOneSharedTileIsAnOutOfBoundsWrite) {
  const std::string e = reverse(128, kSharedOffByOne);
  EXPECT_NE(e.find("thread (63, 0, 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("past the end of shared variable `tile` (256 bytes)"), std::string::npos) << e;
}

TEST(CudaEmulator, AMissingSyncthreadsIsARace) {
  // Thread 32 writes the slot thread 31 read (the emulator runs a block's
  // threads in order up to a barrier).
  const std::string e = reverse(64, kNoBarrier);
  EXPECT_NE(e.find("thread (32, 0, 0): race: writes shared variable `tile`, byte 128, which "
                   "thread (31, 0, 0) read"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("write-after-read hazard"), std::string::npos) << e;
}

TEST(CudaEmulator, ReadingSharedMemoryNoThreadWroteIsAnInitcheckError) {
  EXPECT_EQ(reverse(128, kUnguardedRead), "");  // full blocks write every slot
  const std::string e = reverse(100, kUnguardedRead);
  EXPECT_NE(e.find("block (1, 0, 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("which no thread of the block has written (initcheck)"), std::string::npos) << e;
}

TEST(CudaEmulator, ReadingDeviceMemoryNeverWrittenIsAnInitcheckError) {
  cuda::use_device(0);
  Array x = Array::empty({64}, DType::f32, kGpu);
  Array y = Array::empty({64}, DType::f32, kGpu);
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  KILN_LAUNCH(1, 64, 0, s, reverse_blocks)(y.data<float>(), x.data<float>(), 64, kNone);
  try {
    cuda::check_launch("reverse_blocks");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("which was never written (initcheck)"), std::string::npos)
        << e.what();
  }
}

enum WarpFlaw : int { kFullWarp, kWidth16, kHalfMask, kDivergent, kDeadlock };

// y[w] = the sum of x over warp w's 32 lanes, by butterfly shuffles. The
// flaws: shuffles of width 16 (each half sums its own 16, as on the GPU); a
// mask naming half the warp, whose lanes read the other half; half the lanes at
// another shuffle; half the lanes at a __syncthreads the others never reach.
__global__ void warp_sums(float* y, const float* x, int flaw) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  if (flaw == kDeadlock && lane >= 16) __syncthreads();
  for (int o = 16; o > 0; o >>= 1) {
    if (flaw == kDivergent && lane >= 16)
      v += __shfl_down_sync(0xffffffffu, v, o);
    else
      v += __shfl_xor_sync(flaw == kHalfMask ? 0x0000ffffu : 0xffffffffu, v, o,
                           flaw == kWidth16 ? 16 : 32);
  }
  if (lane == 0) y[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = v;
}

std::string warp_sum(int flaw, std::vector<float>* out = nullptr) {
  cuda::use_device(0);
  Array x = on_gpu(iota_floats(128));
  Array y = Array::empty({4}, DType::f32, kGpu);
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  KILN_LAUNCH(2, 64, 0, s, warp_sums)(y.data<float>(), x.data<float>(), flaw);
  try {
    cuda::check_launch("warp_sums");
  } catch (const Error& e) {
    return e.what();
  }
  if (out) *out = y.to_vector<float>();
  return {};
}

TEST(CudaEmulator, WarpShufflesSumAsTheHardwareDoes) {
  std::vector<float> y;
  ASSERT_EQ(warp_sum(kFullWarp, &y), "");
  // Lanes 32w .. 32w + 31 hold 32w + 1 .. 32w + 32.
  EXPECT_EQ(y, (std::vector<float>{528, 1552, 2576, 3600}));
}

TEST(CudaEmulator, AShuffleOfTheWrongWidthGetsTheHardwaresWrongSum) {
  std::vector<float> y;
  ASSERT_EQ(warp_sum(kWidth16, &y), "");
  // Width 16: lane 0's xor partners stay in lanes 0-15 (lane ^ 16 lies in a
  // later segment: the lane's own value comes back), so lane 0 gets twice
  // the sum of lanes 0-15.
  EXPECT_EQ(y, (std::vector<float>{272, 1296, 2320, 3344}));
}

TEST(CudaEmulator, AShuffleFromALaneOutsideItsMaskIsAnError) {
  // Lanes 0-15 meet first; lane 15's partner at distance 16 is lane 31.
  const std::string e = warp_sum(kHalfMask);
  EXPECT_NE(e.find("thread (15, 0, 0): __shfl_xor_sync (mask 0x0000ffff) reads lane 31, which is "
                   "not in the mask"),
            std::string::npos)
      << e;
}

TEST(CudaEmulator, LanesAtDifferentCollectivesAreADivergentWarp) {
  const std::string e = warp_sum(kDivergent);
  EXPECT_NE(e.find("divergent warp"), std::string::npos) << e;
}

TEST(CudaEmulator, ABarrierHalfAWarpNeverReachesIsADeadlock) {
  const std::string e = warp_sum(kDeadlock);
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("at __syncthreads"), std::string::npos) << e;
  EXPECT_NE(e.find("at __shfl_xor_sync (warp 0, mask 0xffffffff)"), std::string::npos) << e;
}

// Lanes of one warp ordered by __syncwarp, warps by nothing: a write of warp
// 0 read by warp 1 is a race, the same read within warp 0 is not.
__global__ void neighbours(float* y, int reader_warp) {
  KILN_SHARED(float, slots, [64]);
  const int t = static_cast<int>(threadIdx.x);
  if (t < 32) slots[t] = static_cast<float>(t);
  __syncwarp();
  if (t / 32 == reader_warp) y[t] = slots[(t + 1) % 32];
}

TEST(CudaEmulator, SyncwarpOrdersItsWarpOnly) {
  cuda::use_device(0);
  Array y = Array::empty({64}, DType::f32, kGpu);
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  KILN_LAUNCH(1, 64, 0, s, neighbours)(y.data<float>(), 0);
  EXPECT_NO_THROW(cuda::check_launch("neighbours"));
  KILN_LAUNCH(1, 64, 0, s, neighbours)(y.data<float>(), 1);
  try {
    cuda::check_launch("neighbours");
    FAIL() << "no race found";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("race"), std::string::npos) << e.what();
  }
}

// 256 threads add into one shared and one global float: atomics never race.
__global__ void atomic_sums(float* y) {
  KILN_SHARED(float, total, );
  if (threadIdx.x == 0) total = 0.0f;
  __syncthreads();
  atomicAdd(&total, 1.0f);
  atomicAdd(y, 2.0f);
  __syncthreads();
  if (threadIdx.x == 0) y[1] = total;
}

TEST(CudaEmulator, AtomicsAddWithoutRaces) {
  cuda::use_device(0);
  Array y = on_gpu({0.0f, 0.0f});
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  KILN_LAUNCH(1, 256, 0, s, atomic_sums)(y.data<float>());
  ASSERT_NO_THROW(cuda::check_launch("atomic_sums"));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{512.0f, 256.0f}));
}

// A float4 read where the pointer is not 16-byte aligned: the GPU's
// misaligned address, whatever the host would do.
__global__ void sum_float4(float* y, const float* x, int offset) {
  const float4 v = *reinterpret_cast<const float4*>(x + offset);
  y[threadIdx.x] = v.x + v.y + v.z + v.w;
}

TEST(CudaEmulator, AVectorLoadOffItsAlignmentIsAMisalignedAddress) {
  cuda::use_device(0);
  Array x = on_gpu(iota_floats(8));
  Array y = Array::empty({1}, DType::f32, kGpu);
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  KILN_LAUNCH(1, 1, 0, s, sum_float4)(y.data<float>(), x.data<float>(), 4);
  ASSERT_NO_THROW(cuda::check_launch("sum_float4"));
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>{26.0f});
  KILN_LAUNCH(1, 1, 0, s, sum_float4)(y.data<float>(), x.data<float>(), 1);
  try {
    cuda::check_launch("sum_float4");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("thread (0, 0, 0): 16-byte read of global memory at an "
                                         "address that is not a multiple of 16 (byte 4 of a "
                                         "32-byte allocation on cuda:0)"),
              std::string::npos)
        << e.what();
  }
}

// CUDA's stream semantics: work on one stream sees another stream's work
// only after waiting for an event recorded after it, or after the host
// synchronized with it before queuing the work.
TEST(CudaEmulator, AnotherStreamSeesWorkOnlyAfterWaitingForIt) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t a, b;
  cudaEvent_t written;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  void* x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 256), cudaSuccess);
  std::vector<unsigned char> host(256);
  auto message = [](cudaError_t e) { return std::string(cudaGetErrorString(e)); };

  ASSERT_EQ(cudaMemsetAsync(x, 7, 256, a), cudaSuccess);
  // b reads what a wrote without waiting: a race between the streams.
  cudaError_t e = cudaMemcpyAsync(host.data(), x, 256, cudaMemcpyDeviceToHost, b);
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_NE(message(e).find("which stream "), std::string::npos) << message(e);
  EXPECT_NE(message(e).find(" wrote in its work #1"), std::string::npos) << message(e);
  EXPECT_NE(message(e).find("has not waited for that work"), std::string::npos) << message(e);
  // Through an event: ordered.
  ASSERT_EQ(cudaEventRecord(written, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, written, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), x, 256, cudaMemcpyDeviceToHost, b), cudaSuccess);
  EXPECT_EQ(host[255], 7);
  // a overwrites what b read, not having waited for b: a race too.
  e = cudaMemsetAsync(x, 1, 256, a);
  EXPECT_NE(message(e).find(" read in its work #"), std::string::npos) << message(e);
  // The host waited for b before queuing the write: ordered.
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(x, 1, 256, a), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(cudaFree(x), cudaSuccess);
  // The races stay this thread's last error until it is read, as CUDA's do.
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaEventDestroy(written);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// One warp: D = A·B + C on WMMA fragments (A row-major, B column-major, C
// and D row-major), K = 16 for bf16 and f16, 8 for tf32. Lanes past `lanes`
// stay out: a flaw.
template <typename T, int K>
__global__ void mma_tile(
    float* d,
    const typename nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, K, T,
                                          nvcuda::wmma::row_major>::storage_element_type* a,
    const decltype(a) b, const float* c, int lanes) {
  using namespace nvcuda;
  if (static_cast<int>(threadIdx.x) >= lanes) return;
  wmma::fragment<wmma::matrix_a, 16, 16, K, T, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, K, T, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, K, float> acc;
  wmma::load_matrix_sync(fa, a, K);
  wmma::load_matrix_sync(fb, b, K);
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

float tf32_truncated(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u &= 0xffffe000u;
  std::memcpy(&v, &u, 4);
  return v;
}

// D as the tensor cores compute it: the operands as they take them, products
// summed in f32 in k order after C.
std::vector<float> mma_reference(const std::vector<float>& a, const std::vector<float>& b,
                                 const std::vector<float>& c, int k, bool tf32) {
  std::vector<float> d(256);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float s = c[r * 16 + n];
      for (int i = 0; i < k; ++i) {
        float x = a[r * k + i], y = b[n * k + i];
        if (tf32) x = tf32_truncated(x), y = tf32_truncated(y);
        s = std::fma(x, y, s);
      }
      d[r * 16 + n] = s;
    }
  return d;
}

TEST(CudaEmulator, WmmaComputesWithTheTensorCoresOperandRounding) {
  cuda::use_device(0);
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  Array c = random::normal(random::Key(3), {256}).to(kGpu);
  const std::vector<float> cv = c.to_vector<float>();
  Array d = Array::empty({256}, DType::f32, kGpu);
  {  // bf16: exact products of the bf16 values
    Array a = astype(random::normal(random::Key(1), {256}), DType::bf16).to(kGpu);
    Array b = astype(random::normal(random::Key(2), {256}), DType::bf16).to(kGpu);
    using B = __nv_bfloat16;
    KILN_LAUNCH(1, 32, 0, s, mma_tile<B, 16>)
    (d.data<float>(), static_cast<const B*>(a.raw()), static_cast<const B*>(b.raw()),
     c.data<float>(), 32);
    ASSERT_NO_THROW(cuda::check_launch("mma_tile"));
    EXPECT_EQ(d.to_vector<float>(),
              mma_reference(astype(a, DType::f32).to_vector<float>(),
                            astype(b, DType::f32).to_vector<float>(), cv, 16, false));
  }
  {  // tf32: f32 operands with the 13 low mantissa bits dropped
    Array a = random::normal(random::Key(4), {128}).to(kGpu);
    Array b = random::normal(random::Key(5), {128}).to(kGpu);
    using P = nvcuda::wmma::precision::tf32;
    KILN_LAUNCH(1, 32, 0, s, mma_tile<P, 8>)
    (d.data<float>(), a.data<float>(), b.data<float>(), c.data<float>(), 32);
    ASSERT_NO_THROW(cuda::check_launch("mma_tile"));
    const std::vector<float> got = d.to_vector<float>();
    EXPECT_EQ(got, mma_reference(a.to_vector<float>(), b.to_vector<float>(), cv, 8, true));
    EXPECT_NE(got, mma_reference(a.to_vector<float>(), b.to_vector<float>(), cv, 8, false));
  }
  // A lane that leaves before the warp's collective operation.
  Array a = astype(zeros({256}), DType::bf16).to(kGpu);
  using B = __nv_bfloat16;
  KILN_LAUNCH(1, 32, 0, s, mma_tile<B, 16>)
  (d.data<float>(), static_cast<const B*>(a.raw()), static_cast<const B*>(a.raw()), c.data<float>(),
   31);
  try {
    cuda::check_launch("mma_tile");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("wmma::load_matrix_sync: lane 31 of the warp did not take part"),
        std::string::npos)
        << e.what();
  }
}

// NCCL's all-reduce between two emulated devices of one process, a thread
// each, over more than one of the emulator's 1 MiB chunks.
TEST(CudaEmulator, NcclSumsOverTwoDevicesInOneProcess) {
  ncclUniqueId id;
  ASSERT_EQ(cuda::dyn::ncclGetUniqueId(&id), ncclSuccess);
  const size_t n = 300000;
  std::vector<float> got[2];
  auto rank = [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    ncclComm_t comm = nullptr;
    ASSERT_EQ(cuda::dyn::ncclCommInitRank(&comm, 2, id, r), ncclSuccess);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i)
      host[i] = static_cast<float>(r + 1) * static_cast<float>(i % 1000);
    void* x = nullptr;
    ASSERT_EQ(cudaMalloc(&x, n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cuda::dyn::ncclAllReduce(x, x, n, ncclFloat32, ncclSum, comm, s), ncclSuccess)
        << cuda::dyn::ncclGetErrorString(ncclUnhandledCudaError);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    got[r].resize(n);
    ASSERT_EQ(cudaMemcpy(got[r].data(), x, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(x);
    cudaStreamDestroy(s);
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(got[0].size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[0][i], 3.0f * static_cast<float>(i % 1000)) << i;
  EXPECT_EQ(got[0], got[1]);
}

// cuDNN's convolution as the emulator runs it: a 3x3 NHWC convolution with
// a KRSC filter computes its sums; the flaws kiln's conv_cudnn.cpp could
// have are each refused with what is wrong: too little workspace for the
// algorithm, an output descriptor of the wrong extent, a filter in another
// layout than the tensors, and an input never written (initcheck).
TEST(CudaEmulator, CudnnConvolvesAndRefusesWhatCudnnRefuses) {
  namespace dyn = cuda::dyn;
  cuda::use_device(0);
  auto s = static_cast<cudaStream_t>(device_stream(kGpu));
  cudnnHandle_t h;
  ASSERT_EQ(dyn::cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(dyn::cudnnSetStream(h, s), CUDNN_STATUS_SUCCESS);
  cudnnTensorDescriptor_t xd, yd, bad_y;
  cudnnFilterDescriptor_t wd, nchw_w;
  cudnnConvolutionDescriptor_t cd;
  for (auto* d : {&xd, &yd, &bad_y})
    ASSERT_EQ(dyn::cudnnCreateTensorDescriptor(d), CUDNN_STATUS_SUCCESS);
  for (auto* d : {&wd, &nchw_w})
    ASSERT_EQ(dyn::cudnnCreateFilterDescriptor(d), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(dyn::cudnnCreateConvolutionDescriptor(&cd), CUDNN_STATUS_SUCCESS);
  // x [1, 4, 4, 2] NHWC, w [1, 3, 3, 2] KRSC, padding 1: y [1, 4, 4, 1].
  ASSERT_EQ(dyn::cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 2, 4, 4),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(dyn::cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 1, 4, 4),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(dyn::cudnnSetTensor4dDescriptor(bad_y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 1, 3, 4),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(dyn::cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, 1, 2, 3, 3),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(
      dyn::cudnnSetFilter4dDescriptor(nchw_w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 2, 3, 3),
      CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(dyn::cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT),
            CUDNN_STATUS_SUCCESS);
  std::vector<float> xv(32), wv(18);
  for (int i = 0; i < 32; ++i) xv[i] = static_cast<float>(i % 7) - 3.0f;
  for (int i = 0; i < 18; ++i) wv[i] = static_cast<float>(i % 5) - 2.0f;
  Array x = on_gpu(xv), w = on_gpu(wv);
  Array y = Array::empty({16}, DType::f32, kGpu), unwritten = Array::empty({32}, DType::f32, kGpu);
  cudnnConvolutionFwdAlgoPerf_t perf[4];
  int found = 0;
  ASSERT_EQ(dyn::cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 4, &found, perf),
            CUDNN_STATUS_SUCCESS);
  ASSERT_GE(found, 1);
  const size_t need = perf[0].memory;
  ASSERT_GT(need, 0u);
  Array ws = Array::empty({static_cast<int64_t>(need)}, DType::bool_, kGpu);
  const float one = 1.0f, zero = 0.0f;
  auto forward = [&](cudnnFilterDescriptor_t f, cudnnTensorDescriptor_t yy, const void* in,
                     size_t ws_bytes) {
    return dyn::cudnnConvolutionForward(h, &one, xd, in, f, w.raw(), cd, perf[0].algo,
                                        ws.data<bool>(), ws_bytes, &zero, yy, y.data<float>());
  };
  ASSERT_EQ(forward(wd, yd, x.raw(), need), CUDNN_STATUS_SUCCESS);
  const std::vector<float> got = y.to_vector<float>();
  for (int oy = 0; oy < 4; ++oy)
    for (int ox = 0; ox < 4; ++ox) {
      double want = 0;
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
          const int r = oy - 1 + i, c = ox - 1 + j;
          if (r < 0 || r > 3 || c < 0 || c > 3) continue;
          for (int ch = 0; ch < 2; ++ch)
            want += xv[(r * 4 + c) * 2 + ch] * wv[(i * 3 + j) * 2 + ch];
        }
      EXPECT_EQ(got[oy * 4 + ox], static_cast<float>(want)) << oy << "," << ox;
    }
  auto message = [&](cudnnStatus_t st) { return std::string(dyn::cudnnGetErrorString(st)); };
  cudnnStatus_t st = forward(wd, yd, x.raw(), need - 1);
  EXPECT_EQ(st, CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(message(st).find("bytes of workspace, given " + std::to_string(need - 1)),
            std::string::npos)
      << message(st);
  st = forward(wd, bad_y, x.raw(), need);
  EXPECT_EQ(st, CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(message(st).find("y is 1x1x3x4, the convolution's output 1x1x4x4"), std::string::npos)
      << message(st);
  st = forward(nchw_w, yd, x.raw(), need);
  EXPECT_EQ(st, CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_NE(message(st).find("different layouts"), std::string::npos) << message(st);
  st = forward(wd, yd, unwritten.raw(), need);
  EXPECT_EQ(st, CUDNN_STATUS_EXECUTION_FAILED);
  EXPECT_NE(message(st).find("cudnnConvolutionForward's first operand"), std::string::npos)
      << message(st);
  cudaGetLastError();  // the failed work's error, cleared
}

// A convolution cuDNN refuses as it runs (a NOT_SUPPORTED status for a
// shape its heuristics offered) runs on kiln's direct kernels instead, with
// the right values, and is not offered to cuDNN again: KILN_CUDA_CONV=cudnn
// then says why.
TEST(CudaEmulator, AConvolutionCudnnRefusesAsItRunsFallsBackToTheDirectKernels) {
  const Array x = random::normal(random::Key(7), {2, 3, 6, 6}, DType::f64);
  const Array w = random::normal(random::Key(8), {13, 3, 3, 3}, DType::f64);
  const ConvOptions opt{.padding = {{1, 1}}};
  const std::vector<double> want = conv2d(x, w, opt).to_vector<double>();
  {
    test_util::ScopedEnv refuse("KILN_CUDA_EMULATOR_CUDNN_REFUSE", "13");
    const std::vector<double> got = conv2d(x.to(kGpu), w.to(kGpu), opt).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  }
  test_util::ScopedEnv cudnn_only("KILN_CUDA_CONV", "cudnn");
  const std::string e =
      test_util::error_of([&] { conv2d(x.to(kGpu), w.to(kGpu), opt).to_vector<double>(); });
  EXPECT_NE(e.find("cuDNN does not run this convolution: cuDNN refused it as it ran: "
                   "cudnnConvolutionForward: CUDNN_STATUS_NOT_SUPPORTED_SHAPE"),
            std::string::npos)
      << e;
}

// With the matmul precision tf32 an f32 convolution and its gradients run
// on cuDNN's tensor-op math, which the emulator computes from operands
// rounded to TF32 (as Ampere and later GPUs do): further from the f64 values
// than f32 rounding, within TF32's; in fp32 they are on FMA math, within f32
// rounding.
TEST(CudaEmulator, Tf32ConvolutionsRunOnCudnnsTensorOpMath) {
  const Array x = random::normal(random::Key(11), {2, 8, 6, 6}, DType::f32);
  const Array w = random::normal(random::Key(12), {4, 8, 3, 3}, DType::f32);
  const Array r = random::normal(random::Key(13), {2, 4, 6, 6}, DType::f32);
  const ConvOptions opt{.padding = {{1, 1}}};
  // The convolution and the gradient of sum(conv(x, w) * r) to x and w.
  auto run = [&](const Array& xs, const Array& ws, const Array& rs) {
    auto [y, g] = value_and_grad_vector(
        [&](const std::vector<Array>& p) { return sum(conv2d(p[0], p[1], opt) * rs); }, {xs, ws});
    return std::vector<Array>{conv2d(xs, ws, opt), g[0], g[1]};
  };
  const std::vector<Array> want =
      run(astype(x, DType::f64), astype(w, DType::f64), astype(r, DType::f64));
  auto errors = [&](MatmulPrecision p) {
    struct Restore {
      ~Restore() { set_matmul_precision(MatmulPrecision::fp32); }
    } restore;
    set_matmul_precision(p);
    const std::vector<Array> got = run(x.to(kGpu), w.to(kGpu), r.to(kGpu));
    std::vector<double> rel;
    for (size_t i = 0; i < got.size(); ++i)
      rel.push_back(
          test_util::max_relative_error(astype(got[i].to(Device::cpu()), DType::f64), want[i]));
    return rel;
  };
  const std::vector<double> fp32 = errors(MatmulPrecision::fp32),
                            tf32 = errors(MatmulPrecision::tf32);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i == 0 ? "forward" : i == 1 ? "gradient to x" : "gradient to w");
    EXPECT_LT(fp32[i], 1e-6);
    EXPECT_GT(tf32[i], 2e-5);
    EXPECT_LT(tf32[i], 5e-3);
  }
}

}  // namespace
}  // namespace kiln
