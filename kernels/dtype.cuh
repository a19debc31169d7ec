// dtype.cuh -- the element types our kernels are instantiated for (float, __half, __nv_bfloat16) and the two
// conversions every kernel needs: load as fp32 (all arithmetic is fp32) and store back rounded to nearest.
// Included by the .cu files; toolkit/backends/cuda_kernels.py pastes it in before compiling, so CuPy's kernel
// cache (keyed on the source text) sees an edit here too.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define NEG_INF __int_as_float(0xff800000)  // NVRTC has no INFINITY macro

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// 16 bytes seen either as one uint4 (one vectorised load/store) or as its 16 / sizeof(T) elements; a union
// keeps the elements in registers.
template <typename T> union Chunk { uint4 u; T e[16 / sizeof(T)]; };
