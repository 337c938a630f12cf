/*
 * hooks.h - the one list of every exported hook (X-macros), so that the dlsym door, the
 * cuGetProcAddress door (doorhooks.c) and the real-function table (real.c) can never disagree.
 * Pure macros: including it creates no dependency on any source file.
 * X(name) = a CUDA driver entry point we export under exactly that (versioned) name;
 * N(name) = an NVML entry point we export; R(name) = a real CUDA function we call
 * ourselves but do not hook; RN(name) = same for NVML.
 */
#ifndef VGPU_HOOKS_H
#define VGPU_HOOKS_H

#include <cuda.h> /* CUDA_VERSION: entry points newer than the header we build against are left out */

/* cuCtxCreate_v4 (CUctxCreateParams) came with CUDA 12.5: a build against an older cuda.h neither
 * exports nor hooks it, so a newer driver's v4 contexts go uncharged there (docs/libvgpu.md). */
#if CUDA_VERSION >= 12050
#define VGPU_HOOK_CTX_V4(X) X(cuCtxCreate_v4)
#else
#define VGPU_HOOK_CTX_V4(X)
#endif

#define VGPU_CUDA_HOOKS(X) \
    X(cuInit) \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxRelease_v2) \
    X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxReset_v2) \
    X(cuGetProcAddress) X(cuGetProcAddress_v2) \
    X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemAllocPitch) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) \
    X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) \
    X(cuMemFree) X(cuMemFree_v2) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) \
    X(cuArrayCreate) X(cuArrayCreate_v2) X(cuArray3DCreate) X(cuArray3DCreate_v2) X(cuArrayDestroy) \
    X(cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy) \
    X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemRetainAllocationHandle) \
    X(cuMemAddressFree) X(cuMemImportFromShareableHandle) X(cuMemMapArrayAsync) \
    X(cuMulticastCreate) X(cuMulticastBindMem) X(cuMulticastBindAddr) X(cuMulticastUnbind) \
    X(cuMemGetInfo) X(cuMemGetInfo_v2) X(cuDeviceTotalMem) X(cuDeviceTotalMem_v2) \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) X(cuLaunchCooperativeKernelMultiDevice) \
    X(cuLaunch) X(cuLaunchGrid) X(cuLaunchGridAsync) \
    X(cuGraphLaunch) X(cuGraphLaunch_ptsz) \
    X(cuCtxSynchronize) X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) X(cuEventSynchronize) \
    X(cuStreamDestroy) X(cuStreamDestroy_v2) \
    X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) VGPU_HOOK_CTX_V4(X) X(cuCtxDestroy) X(cuCtxDestroy_v2) \
    X(cuModuleLoad) X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleLoadFatBinary) X(cuModuleUnload) \
    X(cuModuleGetFunction) X(cuLibraryGetKernel) X(cuLibraryGetModule) X(cuKernelGetFunction) \
    X(cuImportExternalMemory) X(cuDestroyExternalMemory) \
    X(cuLibraryLoadData) X(cuLibraryLoadFromFile) X(cuLibraryUnload) \
    X(cuMemPoolCreate) X(cuMemPoolTrimTo) X(cuMemPoolSetAttribute) X(cuMemPoolDestroy) X(cuDeviceSetMemPool) \
    X(cuGraphUpload) X(cuGraphUpload_ptsz) X(cuDeviceGraphMemTrim) \
    X(cuGraphInstantiate) X(cuGraphInstantiate_v2) X(cuGraphInstantiateWithFlags) X(cuGraphInstantiateWithParams) \
    X(cuGraphInstantiateWithParams_ptsz) X(cuGraphExecDestroy) X(cuCtxSetLimit) \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle) X(cuMemPoolImportPointer)

#define VGPU_CUDA_REAL_ONLY(R) \
    R(cuCtxGetDevice) R(cuDeviceGetCount) R(cuDeviceGet) R(cuDeviceGetUuid_v2) R(cuDeviceGetUuid) \
    R(cuStreamIsCapturing) R(cuDriverGetVersion) R(cuCtxGetCurrent) R(cuDeviceGetMemPool) R(cuDeviceGetGraphMemAttribute) \
    R(cuMemGetAllocationPropertiesFromHandle) \
    R(cuGraphGetNodes) R(cuGraphNodeGetType) R(cuGraphMemAllocNodeGetParams) R(cuGraphChildGraphNodeGetGraph) \
    R(cuCtxGetLimit) R(cuDeviceGetAttribute) R(cuMemGetAddressRange_v2) R(cuPointerGetAttribute) \
    R(cuStreamQuery) R(cuStreamGetCtx) R(cuCtxSetCurrent) R(cuThreadExchangeStreamCaptureMode)

#define VGPU_NVML_HOOKS(N) N(nvmlDeviceGetMemoryInfo) N(nvmlDeviceGetMemoryInfo_v2)

#define VGPU_NVML_REAL_ONLY(RN) \
    RN(nvmlInit_v2) RN(nvmlDeviceGetUUID) RN(nvmlDeviceGetIndex) RN(nvmlDeviceGetHandleByUUID) \
    RN(nvmlDeviceGetComputeRunningProcesses_v3) RN(nvmlDeviceGetComputeRunningProcesses)

#endif
