// kiln cuda backend: Conv, ConvGradInput and ConvGradWeight through cuDNN
// (conv_cudnn.cpp), where its legacy convolution API expresses the
// convolution; conv.cu's direct kernels run the rest. Plain C++ (no cuDNN
// types), so that conv.cu includes it under nvcc and the emulator alike.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "kiln/dtype.h"
#include "ops/conv_geometry.h"
#include "ops/dispatch.h"

namespace kiln::cuda {

enum class ConvPass { Forward, GradInput, GradWeight };

// One pass of one convolution on one device, as cuDNN runs it: its
// descriptors, algorithm and workspace (cached for the process).
struct CudnnConv;

// The plan of `pass` of convolution q on dtype dt (f32, bf16 or f64; f32
// with tf32: on TF32 tensor-op math) on cuda device `device`, or null where cuDNN does not run it,
// with the reason in *why: padding that differs before and after in a way that changes the output's
// size (the legacy API pads both sides alike), extents past int32, no algorithm of cuDNN's for it,
// a refusal when it ran, or no cuDNN (a build without its headers, a machine without libcudnn).
const CudnnConv* cudnn_conv_plan(int device, ConvPass pass, const ConvGeometry& q, DType dt,
                                 bool tf32, std::string* why);

// Whether the plans of channels-last convolution q take the filter as KRSC
// ([O, KH, KW, C / groups], cuDNN's NHWC filter) rather than kiln's OIHW:
// channels-last with a window and more than one input channel per group
// (otherwise the two layouts are the same bytes).
bool cudnn_filter_krsc(const ConvGeometry& q);

// Queues the planned pass on stream s: Forward (x, w) -> y, GradInput
// (dy, w) -> dx, GradWeight (x, dy) -> dw, with the filter (w, dw) in the
// layout cudnn_filter_krsc says. Workspace comes from ctx's scratch
// allocator. False where cuDNN refuses the shape as it runs (a NOT_SUPPORTED
// status; the plan is not offered again); fails (a kiln Error naming `who`)
// on any other error.
bool cudnn_conv_run(const CudnnConv& plan, const KernelContext& ctx, cudaStream_t s, const void* a,
                    const void* b, void* out, const char* who);

}  // namespace kiln::cuda
