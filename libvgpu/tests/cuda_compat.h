/*
 * cuda_compat.h - types of driver entry points newer than the cuda.h the harness is built against.
 * The fake driver stands for a newer driver (it exports them whatever the header) and t_cli calls
 * them, while libvgpu itself leaves their hooks out (src/hooks.h), as a real build would.
 */
#ifndef FAKE_CUDA_COMPAT_H
#define FAKE_CUDA_COMPAT_H

#include <cuda.h>

#if CUDA_VERSION < 12050 /* cuCtxCreate_v4 came with CUDA 12.5; the layout is that header's */
typedef struct CUctxCreateParams_st {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    void *cigParams;
} CUctxCreateParams;
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev);
#endif

#endif
