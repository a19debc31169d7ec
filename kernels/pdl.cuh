// pdl.cuh -- programmatic dependent launch (PDL, Hopper and later), for the kernels of a decode step.
// A decode step at batch 1 is ~200 small dependent kernels; between two of them the GPU drains the first,
// then launches the second, whose blocks then wait a DRAM round trip for their first bytes. A kernel launched
// with the PROGRAMMATIC_STREAM_SERIALIZATION attribute (CudaKernels(pdl=True)) may instead start while the
// previous kernel on the stream still runs:
//   pdl_wait()              blocks until the previous kernel has completed and its writes are visible. Every
//                           kernel launched this way calls it before it reads anything the previous kernels
//                           wrote, or writes anything they read. Before it, only constants (weights) may be read.
//   pdl_launch_dependents() lets the next kernel start launching once every block of this one has called it.
//                           Called right after pdl_wait(), so at most two kernels overlap: the running one and the
//                           next one, prefetching its weights. When the next kernel launches, everything before the
//                           running one has completed, so nothing its SMs have cached can be older than that.
// Why not trigger before the wait: that measured faster on the H200 (0.892 against 0.921 ms for a batch-1 step), but
// kernels then launch several ahead, and with 5aac9fa's kernels the fp32 stories260K model decoded other tokens from
// a CUDA graph and tests/test_gpu_pdl.py's fp32 case failed. With today's kernels (session 30, an H100) the trigger
// first was exact in those checks and 2-7% faster at batch 1; it lands once the whole GPU suite has run with it
// (experiments/NOTEBOOK.md, "Should a kernel let the next one launch before its PDL wait?").
// In a kernel launched normally (or compiled for an older GPU) both are no-ops.
#ifndef TOOLKIT_PDL_CUH
#define TOOLKIT_PDL_CUH
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Both, at the top of a kernel (after the weight prefetch, for the GEMVs).
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_launch_dependents();
}
#endif
