/*
 * launchhooks.c - kernel launches pass the compute limiter (smlimit.c) first; synchronisation
 * entry points tell it when the program last waited for the GPU and let stream-ordered pools
 * release memory above their threshold (pools.c). Pass-through otherwise: the disabled path
 * costs two loads and two predictable branches per launch (one before the driver call, one after).
 */
#include <cuda.h>
#include <stdatomic.h>
#include "devmap.h"
#include "graphmem.h"
#include "pools.h"
#include "real.h"
#include "smlimit.h"
#include "smqueue.h"

#undef cuLaunchKernel
#undef cuLaunchKernelEx
#undef cuLaunchCooperativeKernel
#undef cuGraphLaunch
#undef cuStreamSynchronize
#undef cuEventSynchronize
#undef cuStreamDestroy

/* SYNC_BEGIN before the real call, SYNCED(kind, stream, per_thread) after it (rc in scope). */
#define SYNC_BEGIN uint64_t _tok = VGPU_UNLIKELY(vgpu_sm_state == SM_ACTIVE) ? vgpu_launch_token(0) : 0
#define SYNCED(k, s, pt) do { if (VGPU_UNLIKELY(vgpu_sm_state == SM_ACTIVE) && rc == CUDA_SUCCESS) vgpu_sm_synced(k, (void *)(s), pt, _tok); } while (0)
/* After the driver returned from a launch: it is in the driver's queue now (smqueue.h). */
#define LAUNCHED() do { if (VGPU_UNLIKELY(vgpu_sm_state == SM_ACTIVE)) atomic_fetch_add(&vgpu_launches_done, 1); } while (0)
#define PACE(s) do { if (VGPU_UNLIKELY(vgpu_sm_state != SM_NONE)) vgpu_sm_before_launch((void *)(s), 0); } while (0)
#define PACE_PT(s) do { if (VGPU_UNLIKELY(vgpu_sm_state != SM_NONE)) vgpu_sm_before_launch((void *)(s), 1); } while (0)


typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void **);
typedef CUresult (*graph_t)(CUgraphExec, CUstream);
typedef CUresult (*multi_t)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);
typedef CUresult (*grid_async_t)(CUfunction, int, int, CUstream);

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    PACE(s);
    CUresult rc = CALL_REAL(launch_t, cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
    LAUNCHED();
    return rc;
}
VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                         unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                         void **extra) {
    PACE_PT(s);
    CUresult rc = CALL_REAL(launch_t, cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
    LAUNCHED();
    return rc;
}
VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    PACE(c ? c->hStream : NULL);
    CUresult rc = CALL_REAL(launch_ex_t, cuLaunchKernelEx, c, f, params, extra);
    LAUNCHED();
    return rc;
}
VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    PACE_PT(c ? c->hStream : NULL);
    CUresult rc = CALL_REAL(launch_ex_t, cuLaunchKernelEx_ptsz, c, f, params, extra);
    LAUNCHED();
    return rc;
}
VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    PACE(s);
    CUresult rc = CALL_REAL(coop_t, cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shm, s, params);
    LAUNCHED();
    return rc;
}
VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                    unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                                                    void **params) {
    PACE_PT(s);
    CUresult rc = CALL_REAL(coop_t, cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shm, s, params);
    LAUNCHED();
    return rc;
}
/* The deprecated entry points (still in CUDA 13's cuda.h) launch kernels too: without these hooks
 * a program that launched that way was never measured nor paced. cuLaunch and cuLaunchGrid run on
 * the legacy default stream. */
VGPU_EXPORT CUresult cuLaunch(CUfunction f) {
    PACE(NULL);
    CUresult rc = CALL_REAL(CUresult(*)(CUfunction), cuLaunch, f);
    LAUNCHED();
    return rc;
}
VGPU_EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) {
    PACE(NULL);
    CUresult rc = CALL_REAL(CUresult(*)(CUfunction, int, int), cuLaunchGrid, f, w, h);
    LAUNCHED();
    return rc;
}
VGPU_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    PACE(s);
    CUresult rc = CALL_REAL(grid_async_t, cuLaunchGridAsync, f, w, h, s);
    LAUNCHED();
    return rc;
}
/* One kernel per listed device, each on its own device's stream: each is paced on its own card,
 * with the stream's context current meanwhile (the limiter's drain synchronises that context and
 * notes the stream there). The launches paced before the last are still counted in flight at
 * its drain, so that drain never counts as having emptied the queue (charged as busy: the safe
 * side). Returns how many launches entered the limiter. */
static unsigned pace_each(const CUDA_LAUNCH_PARAMS *list, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        CUcontext cur, other = vgpu_stream_other_ctx(list[i].hStream, &cur);
        if (other) CALL_REAL(CUresult(*)(CUcontext), cuCtxSetCurrent, other);
        vgpu_sm_before_launch((void *)list[i].hStream, 0);
        if (other) CALL_REAL(CUresult(*)(CUcontext), cuCtxSetCurrent, cur);
    }
    return n;
}
VGPU_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags) {
    unsigned paced = VGPU_UNLIKELY(vgpu_sm_state != SM_NONE) && list ? pace_each(list, n) : 0;
    CUresult rc = CALL_REAL(multi_t, cuLaunchCooperativeKernelMultiDevice, list, n, flags);
    if (VGPU_UNLIKELY(vgpu_sm_state == SM_ACTIVE)) atomic_fetch_add(&vgpu_launches_done, paced);
    return rc;
}
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    PACE(s);
    uint64_t pre[GRAPHMEM_DEVS]; /* graph memory nodes: checked before (graphmem.c), sampled after (pools.c) */
    int mem = vgpu_graph_begin((uint64_t)(uintptr_t)g, pre, "cuGraphLaunch");
    if (mem < 0) {
        LAUNCHED(); /* refused: nothing reaches the driver */
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CALL_REAL(graph_t, cuGraphLaunch, g, s);
    LAUNCHED();
    if (mem) vgpu_graph_end(pre);
    if (rc == CUDA_SUCCESS) vgpu_graphmem_after_launch();
    return rc;
}
VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    PACE_PT(s);
    uint64_t pre[GRAPHMEM_DEVS]; /* graph memory nodes: checked before (graphmem.c), sampled after (pools.c) */
    int mem = vgpu_graph_begin((uint64_t)(uintptr_t)g, pre, "cuGraphLaunch_ptsz");
    if (mem < 0) {
        LAUNCHED(); /* refused: nothing reaches the driver */
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CALL_REAL(graph_t, cuGraphLaunch_ptsz, g, s);
    LAUNCHED();
    if (mem) vgpu_graph_end(pre);
    if (rc == CUDA_SUCCESS) vgpu_graphmem_after_launch();
    return rc;
}

/* Synchronisation entry points: pass-through; with the limiter active they tell it when all of
 * this process's work was drained (smqueue.c: a stream or event counts only while it is the one
 * stream with work); stream-ordered pools release memory above
 * their threshold here (pools.c). */
VGPU_EXPORT CUresult cuCtxSynchronize(void) {
    SYNC_BEGIN;
    CUresult rc = CALL_REAL(CUresult(*)(void), cuCtxSynchronize);
    SYNCED(VGPU_SYNC_CTX, NULL, 0);
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}
VGPU_EXPORT CUresult cuStreamSynchronize(CUstream s) {
    SYNC_BEGIN;
    CUresult rc = CALL_REAL(CUresult(*)(CUstream), cuStreamSynchronize, s);
    SYNCED(VGPU_SYNC_STREAM, s, 0);
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}
VGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) {
    SYNC_BEGIN;
    CUresult rc = CALL_REAL(CUresult(*)(CUstream), cuStreamSynchronize_ptsz, s);
    SYNCED(VGPU_SYNC_STREAM, s, 1);
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}
VGPU_EXPORT CUresult cuEventSynchronize(CUevent e) {
    SYNC_BEGIN;
    CUresult rc = CALL_REAL(CUresult(*)(CUevent), cuEventSynchronize, e);
    SYNCED(VGPU_SYNC_EVENT, NULL, 0);
    if (rc == CUDA_SUCCESS) vgpu_pools_synced();
    return rc;
}

/* A destroyed stream is never asked about again (its handle may be reused or freed). */
VGPU_EXPORT CUresult cuStreamDestroy(CUstream s) {
    if (VGPU_UNLIKELY(vgpu_sm_state == SM_ACTIVE)) vgpu_q_forget_stream(s);
    return CALL_REAL(CUresult(*)(CUstream), cuStreamDestroy, s);
}
VGPU_EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    if (VGPU_UNLIKELY(vgpu_sm_state == SM_ACTIVE)) vgpu_q_forget_stream(s);
    return CALL_REAL(CUresult(*)(CUstream), cuStreamDestroy_v2, s);
}
