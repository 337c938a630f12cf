/*
 * procaddr.c - door C: cuGetProcAddress / cuGetProcAddress_v2.
 *
 * Why we ask the driver first: the CUDA runtime resolves nearly every entry point through
 * these calls, by name, requested CUDA version and per-thread-default-stream flag. HAMi-core
 * answered from its own table and ignored both version and flags (core#57: a v1 request got
 * a v2 ABI; PTDS requests got legacy-stream functions). We let the real driver choose the
 * exact versioned function, then hand back our wrapper of *that very function* when we wrap
 * it (matched by address against the driver's exported symbols), and the driver's answer
 * untouched otherwise. Status and return code are the driver's.
 */
#include <cuda.h>
#include "common.h"
#include "hooks.h"

#undef cuGetProcAddress

static void swap_in_hook(const char *symbol, void **pfn) {
    if (!pfn || !*pfn || vgpu_control_disabled()) return;
    void *hook = vgpu_hook_for_real(*pfn);
    if (hook) {
        VLOG(VLOG_DEBUG, "cuGetProcAddress(%s): wrapped", symbol ? symbol : "?");
        *pfn = hook;
    } else if (symbol && vgpu_hook_for(symbol)) {
        VLOG(VLOG_INFO, "cuGetProcAddress(%s): driver returned %p, which is not an exported symbol we wrap",
             symbol, *pfn);
    }
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status) {
    typedef CUresult (*fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    fn real = (fn)REAL_PTR(cuGetProcAddress_v2);
    if (!real) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real(symbol, pfn, cudaVersion, flags, status);
    if (rc == CUDA_SUCCESS) swap_in_hook(symbol, pfn);
    return rc;
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    typedef CUresult (*fn)(const char *, void **, int, cuuint64_t);
    fn real = (fn)REAL_PTR(cuGetProcAddress);
    if (!real) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS) swap_in_hook(symbol, pfn);
    return rc;
}
