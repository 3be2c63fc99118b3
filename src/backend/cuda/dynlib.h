// kiln cuda backend: cuBLASLt, cuDNN, NVRTC and NCCL, loaded when first called
// (dlopen) rather than linked: libkiln then starts as fast with the CUDA
// backend as without it (cuBLASLt alone is half a gigabyte), and runs where
// the driver is present but a library is not until that library is needed
// (NCCL: by a run of several ranks only). A call goes through dyn::<name>,
// with the library's own signature; a library that cannot be loaded is a
// clear kiln error naming it. In an emulation build (KILN_CUDA_EMULATION) the
// calls reach the emulator's stand-ins (emulation/libraries.h) instead;
// dyn::gpu's NVRTC is the GPU's NVRTC in every build (the compile-only
// checks of the generated kernels).
#pragma once
#include <cublasLt.h>
#include <nccl.h>
// cuDNN is a download of its own beside the CUDA toolkit: without its
// headers kiln builds without it (KILN_HAVE_CUDNN 0; every convolution on
// the direct kernels).
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define KILN_HAVE_CUDNN 1
#else
#define KILN_HAVE_CUDNN 0
#endif
#include <nvrtc.h>

#include <atomic>

namespace kiln::cuda::dyn {

enum class Lib { cublaslt, nvrtc, nccl, nvrtc_gpu, cudnn };
// The address of `name` in `lib` (loading the library on first use).
void* symbol(Lib lib, const char* name);

template <typename F>
struct Lazy {
  Lib lib;
  const char* name;
  mutable std::atomic<F*> fn{nullptr};
  template <typename... A>
  auto operator()(A... args) const {
    F* f = fn.load(std::memory_order_acquire);
    if (!f) {
      f = reinterpret_cast<F*>(symbol(lib, name));
      fn.store(f, std::memory_order_release);
    }
    return f(args...);
  }
};

#define KILN_CUBLASLT_FUNCTIONS(X)                                                               \
  X(cublasLtCreate) X(cublasLtGetStatusName) X(cublasLtGetStatusString) X(cublasLtMatmul)        \
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate)                                  \
  X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)                            \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)                     \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutSetAttribute)
#define KILN_NVRTC_FUNCTIONS(X)                                                                  \
  X(nvrtcCompileProgram) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) X(nvrtcGetCUBIN)           \
  X(nvrtcGetCUBINSize) X(nvrtcGetErrorString) X(nvrtcGetProgramLog) X(nvrtcGetProgramLogSize)    \
  X(nvrtcVersion)
// cuDNN's convolutions (conv_cudnn.cpp), through its legacy API.
#define KILN_CUDNN_FUNCTIONS(X)                                                                  \
  X(cudnnCreate)                                                                                 \
  X(cudnnSetStream) X(cudnnGetErrorString) X(cudnnCreateTensorDescriptor)                        \
      X(cudnnSetTensor4dDescriptor) X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor) \
          X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor)                 \
              X(cudnnSetConvolutionGroupCount) X(cudnnSetConvolutionMathType)                    \
                  X(cudnnGetConvolution2dForwardOutputDim)                                       \
                      X(cudnnGetConvolutionForwardAlgorithm_v7)                                  \
                          X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionForward)  \
                              X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                     \
                                  X(cudnnGetConvolutionBackwardDataWorkspaceSize)                \
                                      X(cudnnConvolutionBackwardData)                            \
                                          X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)       \
                                              X(cudnnGetConvolutionBackwardFilterWorkspaceSize)  \
                                                  X(cudnnConvolutionBackwardFilter)
#define KILN_NCCL_FUNCTIONS(X)                                                                   \
  X(ncclAllReduce) X(ncclCommInitRank) X(ncclGetErrorString) X(ncclGetUniqueId)

#define KILN_LAZY_CUBLASLT(name) inline const Lazy<decltype(::name)> name{Lib::cublaslt, #name};
#define KILN_LAZY_NVRTC(name) inline const Lazy<decltype(::name)> name{Lib::nvrtc, #name};
#define KILN_LAZY_NCCL(name) inline const Lazy<decltype(::name)> name{Lib::nccl, #name};
#define KILN_LAZY_CUDNN(name) inline const Lazy<decltype(::name)> name{Lib::cudnn, #name};
KILN_CUBLASLT_FUNCTIONS(KILN_LAZY_CUBLASLT)
KILN_NVRTC_FUNCTIONS(KILN_LAZY_NVRTC)
KILN_NCCL_FUNCTIONS(KILN_LAZY_NCCL)
#if KILN_HAVE_CUDNN
KILN_CUDNN_FUNCTIONS(KILN_LAZY_CUDNN)
#endif
namespace gpu {
#define KILN_LAZY_NVRTC_GPU(name) inline const Lazy<decltype(::name)> name{Lib::nvrtc_gpu, #name};
KILN_NVRTC_FUNCTIONS(KILN_LAZY_NVRTC_GPU)
#undef KILN_LAZY_NVRTC_GPU
}  // namespace gpu
#undef KILN_LAZY_CUBLASLT
#undef KILN_LAZY_NVRTC
#undef KILN_LAZY_NCCL
#undef KILN_LAZY_CUDNN

}  // namespace kiln::cuda::dyn
