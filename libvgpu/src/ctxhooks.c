/*
 * ctxhooks.c - context memory: the primary context's and that of contexts made with
 * cuCtxCreate*, measured across the creating call (measure.c) and charged to the slot's
 * context[], limit checked: a context that does not fit is released or destroyed again and the
 * caller gets CUDA_ERROR_OUT_OF_MEMORY, as from a full card. (Charged without the check, each
 * context - about 500 MiB on an H200 - carried the container past its limit: a tenant that made
 * contexts in a loop, or started processes, took the card's memory from its neighbours.) Given
 * back when the last reference to the primary context is released or it is reset, or the context
 * destroyed - and with it the charges of the modules loaded into it (owned.c).
 *
 * The primary context (about 500 MiB on an H200) is charged when this process first retains
 * it. Context creations and module loads of one process are serialised (vgpu_measure_lock),
 * so two of them never measure each other; neither is on a hot path.
 */
#include <cuda.h>
#include <pthread.h>
#include <string.h>
#include "config.h"
#include "devmap.h"
#include "forkreg.h"
#include "log.h"
#include "measure.h"
#include "owned.h"
#include "real.h"
#include "region.h"

#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuCtxCreate
#undef cuCtxDestroy

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static int ctx_refs[MAX_ORD];
static uint64_t ctx_charged[MAX_ORD];
static void *primary_ctx[MAX_ORD]; /* handle of the retained primary context, for its modules */

/* CUDA contexts do not survive fork. */
static void ctx_after_fork(void) {
    pthread_mutex_init(&ctx_mu, NULL);
    memset(ctx_refs, 0, sizeof ctx_refs);
    memset(ctx_charged, 0, sizeof ctx_charged);
    memset(primary_ctx, 0, sizeof primary_ctx);
}
__attribute__((constructor)) static void ctx_register_fork(void) { vgpu_on_fork_child(ctx_after_fork); }

/* ---------------- the primary context ---------------- */

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    typedef CUresult (*fn)(CUcontext *, CUdevice);
    if (vgpu_control_disabled() || dev < 0 || dev >= MAX_ORD) return CALL_REAL(fn, cuDevicePrimaryCtxRetain, pctx, dev);
    pthread_mutex_lock(&ctx_mu);
    int first = ctx_refs[dev] == 0;
    int rdev = first ? vgpu_rdev_of_cuda((int)dev) : -1;
    vgpu_measure_t m;
    if (rdev >= 0) vgpu_measure_lock();
    vgpu_ctx_measure_begin(rdev, &m);
    CUresult rc = CALL_REAL(fn, cuDevicePrimaryCtxRetain, pctx, dev);
    uint64_t charge = rc == CUDA_SUCCESS ? vgpu_ctx_measure_end(rdev, &m) : 0;
    if (rdev >= 0) vgpu_measure_unlock();
    if (rc == CUDA_SUCCESS && charge && rdev >= 0 && vgpu_reserve_context(rdev, charge) != 0) {
        CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease_v2, dev);
        if (pctx) *pctx = NULL;
        VLOG(VLOG_WARN, "cuDevicePrimaryCtxRetain: out of memory on device %d: the context needs %llu bytes, "
             "%llu in use, limit %llu", (int)dev, (unsigned long long)charge,
             (unsigned long long)vgpu_device_usage(rdev), (unsigned long long)vgpu_device_limit(rdev));
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (rc == CUDA_SUCCESS) {
        ctx_refs[dev]++;
        if (pctx) primary_ctx[dev] = *pctx;
        if (charge) {
            ctx_charged[dev] = charge;
            VLOG(VLOG_INFO, "context on device %d charged %llu bytes", (int)dev, (unsigned long long)charge);
        }
    }
    pthread_mutex_unlock(&ctx_mu);
    return rc;
}

static void ctx_drop(CUdevice dev, int all) {
    if (dev < 0 || dev >= MAX_ORD) return;
    pthread_mutex_lock(&ctx_mu);
    if (ctx_refs[dev] > 0) ctx_refs[dev] = all ? 0 : ctx_refs[dev] - 1;
    if (ctx_refs[dev] == 0 && ctx_charged[dev]) {
        vgpu_uncharge_context(vgpu_rdev_of_cuda((int)dev), ctx_charged[dev]);
        ctx_charged[dev] = 0;
    }
    void *gone = ctx_refs[dev] == 0 ? primary_ctx[dev] : NULL;
    pthread_mutex_unlock(&ctx_mu);
    if (gone) vgpu_modules_drop_ctx(gone);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease_v2, dev);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) ctx_drop(dev, 0);
    return rc;
}
VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease, dev);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) ctx_drop(dev, 0);
    return rc;
}
VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxReset_v2, dev);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) ctx_drop(dev, 1);
    return rc;
}
VGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxReset, dev);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) ctx_drop(dev, 1);
    return rc;
}

/* ---------------- contexts made with cuCtxCreate* ---------------- */

/* Region device of `dev`, or -1 when the driver does not know it (not initialised, bad
 * ordinal): then nothing is registered and the driver answers the call itself. */
static int rdev_of_valid(CUdevice dev) {
    CUdevice d;
    if (CALL_REAL(CUresult(*)(CUdevice *, int), cuDeviceGet, &d, (int)dev) != CUDA_SUCCESS) return -1;
    return vgpu_rdev_of_cuda((int)dev);
}

#define CTX_CREATE_BODY(api, pctx, dev, realcall)                                       \
    do {                                                                                 \
        if (vgpu_control_disabled() || !(pctx)) return (realcall);                       \
        int rdev_ = rdev_of_valid((dev));                                                \
        vgpu_measure_t m_;                                                               \
        vgpu_measure_lock();                                                             \
        vgpu_ctx_measure_begin(rdev_, &m_);                                              \
        CUresult rc_ = (realcall);                                                       \
        uint64_t b_ = rc_ == CUDA_SUCCESS ? vgpu_ctx_measure_end(rdev_, &m_) : 0;        \
        vgpu_measure_unlock();                                                           \
        if (b_ && rdev_ >= 0 && vgpu_reserve_context(rdev_, b_) != 0) {                 \
            CALL_REAL(CUresult(*)(CUcontext), cuCtxDestroy_v2, *(pctx));                  \
            VLOG(VLOG_WARN, "%s: out of memory on device %d: the context needs %llu bytes, "  \
                 "%llu in use, limit %llu", api, (int)(dev), (unsigned long long)b_,      \
                 (unsigned long long)vgpu_device_usage(rdev_),                            \
                 (unsigned long long)vgpu_device_limit(rdev_));                           \
            *(pctx) = NULL;                                                              \
            return CUDA_ERROR_OUT_OF_MEMORY;                                             \
        }                                                                                \
        if (b_) {                                                                        \
            vgpu_owned_add(O_CTX, (uint64_t)(uintptr_t)*(pctx), NULL, rdev_, b_);             \
            VLOG(VLOG_INFO, "%s: context on device %d charged %llu bytes", api, (int)(dev), \
                 (unsigned long long)b_);                                                \
        }                                                                                \
        return rc_;                                                                      \
    } while (0)

VGPU_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    typedef CUresult (*fn)(CUcontext *, unsigned int, CUdevice);
    CTX_CREATE_BODY("cuCtxCreate", pctx, dev, CALL_REAL(fn, cuCtxCreate, pctx, flags, dev));
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    typedef CUresult (*fn)(CUcontext *, unsigned int, CUdevice);
    CTX_CREATE_BODY("cuCtxCreate_v2", pctx, dev, CALL_REAL(fn, cuCtxCreate_v2, pctx, flags, dev));
}

VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                                    CUdevice dev) {
    typedef CUresult (*fn)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
    CTX_CREATE_BODY("cuCtxCreate_v3", pctx, dev, CALL_REAL(fn, cuCtxCreate_v3, pctx, params, n, flags, dev));
}

#if CUDA_VERSION >= 12050 /* hooks.h: VGPU_HOOK_CTX_V4 */
VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    typedef CUresult (*fn)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
    CTX_CREATE_BODY("cuCtxCreate_v4", pctx, dev, CALL_REAL(fn, cuCtxCreate_v4, pctx, params, flags, dev));
}
#endif

static void ctx_gone(CUcontext ctx) {
    owned_t *o = vgpu_owned_take(O_CTX, (uint64_t)(uintptr_t)ctx);
    if (o) vgpu_owned_release(o);
    vgpu_modules_drop_ctx(ctx);
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CUresult rc = CALL_REAL(CUresult(*)(CUcontext), cuCtxDestroy_v2, ctx);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) ctx_gone(ctx);
    return rc;
}

VGPU_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
    CUresult rc = CALL_REAL(CUresult(*)(CUcontext), cuCtxDestroy, ctx);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) ctx_gone(ctx);
    return rc;
}

