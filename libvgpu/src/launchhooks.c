/*
 * launchhooks.c - kernel launches pass the compute limiter (smlimit.c) first; synchronisation
 * entry points tell it when the program last waited for the GPU and let stream-ordered pools
 * release memory above their threshold (pools.c). Pass-through otherwise: the disabled path
 * costs one load and one predictable branch per launch.
 */
#include <cuda.h>
#include "graphmem.h"
#include "pools.h"
#include "real.h"
#include "smlimit.h"

#undef cuLaunchKernel
#undef cuLaunchKernelEx
#undef cuLaunchCooperativeKernel
#undef cuGraphLaunch
#undef cuStreamSynchronize
#undef cuEventSynchronize

#define SYNCED() do { if (VGPU_UNLIKELY(vgpu_sm_state == SM_ACTIVE)) vgpu_sm_synced(); } while (0)
#define PACE(s) do { if (VGPU_UNLIKELY(vgpu_sm_state != SM_NONE)) vgpu_sm_before_launch((void *)(s)); } while (0)


typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void **);
typedef CUresult (*graph_t)(CUgraphExec, CUstream);

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    PACE(s);
    return CALL_REAL(launch_t, cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                         unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                         void **extra) {
    PACE(s);
    return CALL_REAL(launch_t, cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    PACE(c ? c->hStream : NULL);
    return CALL_REAL(launch_ex_t, cuLaunchKernelEx, c, f, params, extra);
}
VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    PACE(c ? c->hStream : NULL);
    return CALL_REAL(launch_ex_t, cuLaunchKernelEx_ptsz, c, f, params, extra);
}
VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    PACE(s);
    return CALL_REAL(coop_t, cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shm, s, params);
}
VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                    unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                                                    void **params) {
    PACE(s);
    return CALL_REAL(coop_t, cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params);
}
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    PACE(s);
    uint64_t pre[GRAPHMEM_DEVS]; /* graph memory nodes: checked before (graphmem.c), sampled after (pools.c) */
    int mem = vgpu_graph_begin((uint64_t)(uintptr_t)g, pre, "cuGraphLaunch");
    if (mem < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(graph_t, cuGraphLaunch, g, s);
    if (mem) vgpu_graph_end(pre);
    if (rc == CUDA_SUCCESS) vgpu_graphmem_after_launch();
    return rc;
}
VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    PACE(s);
    uint64_t pre[GRAPHMEM_DEVS]; /* graph memory nodes: checked before (graphmem.c), sampled after (pools.c) */
    int mem = vgpu_graph_begin((uint64_t)(uintptr_t)g, pre, "cuGraphLaunch_ptsz");
    if (mem < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(graph_t, cuGraphLaunch_ptsz, g, s);
    if (mem) vgpu_graph_end(pre);
    if (rc == CUDA_SUCCESS) vgpu_graphmem_after_launch();
    return rc;
}

/* Synchronisation entry points: pass-through; with a compute limit active they note when the
 * program last waited for the GPU (see close_slice); stream-ordered pools release memory above
 * their threshold here (pools.c). */
VGPU_EXPORT CUresult cuCtxSynchronize(void) {
    CUresult rc = CALL_REAL(CUresult(*)(void), cuCtxSynchronize);
    SYNCED();
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}
VGPU_EXPORT CUresult cuStreamSynchronize(CUstream s) {
    CUresult rc = CALL_REAL(CUresult(*)(CUstream), cuStreamSynchronize, s);
    SYNCED();
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}
VGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) {
    CUresult rc = CALL_REAL(CUresult(*)(CUstream), cuStreamSynchronize_ptsz, s);
    SYNCED();
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}
VGPU_EXPORT CUresult cuEventSynchronize(CUevent e) {
    CUresult rc = CALL_REAL(CUresult(*)(CUevent), cuEventSynchronize, e);
    SYNCED();
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}
