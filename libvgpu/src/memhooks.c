/*
 * memhooks.c - device memory limits: every allocation API is checked against the shared
 * region before the driver is asked, every free gives the bytes back, and the memory
 * queries report the limit as the card's size. (Contexts: ctxhooks.c; modules: modhooks.c;
 * stream-ordered pools: pools.c / poolhooks.c.)
 *
 * Order of operations (why): reserve -> real call -> on failure give back. An allocation
 * over the limit therefore never reaches the driver (no side effects), and two processes
 * cannot both take the last bytes (region.c). Frees remove the tracking entry (alloctrack.c)
 * before the real free.
 *
 * Imported memory: cuImportExternalMemory (memory another API - Vulkan, D3D, a dma-buf - made
 * in this process or handed over) is charged to the importer at its descriptor's size, limit
 * checked, and given back at cuDestroyExternalMemory: from the card's side it is device
 * memory this container holds, and no other libvgpu counter has it. Memory imported from
 * another CUDA process (cuIpcOpenMemHandle, cuMemImportFromShareableHandle) is NOT charged: the
 * exporting process was charged when it allocated it, and charging the importer too would
 * count the same bytes twice (inside one container, where both share the limit, a program
 * passing a buffer between its workers would hit the limit at half of it).
 */
#include <cuda.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "alloctrack.h"
#include "ipcshare.h"
#include "config.h"
#include "devmap.h"
#include "log.h"
#include "pools.h"
#include "real.h"
#include "region.h"

/* cuda.h maps the unversioned names onto _v2; we define both spellings ourselves. */
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuMemAllocPitch
#undef cuMemAllocAsync
#undef cuMemFreeAsync
#undef cuMemAllocFromPoolAsync
#undef cuInit

typedef CUresult (*freeasync_t)(CUdeviceptr, CUstream);

/* ---------------- helpers ---------------- */

static int off(void) { return vgpu_control_disabled(); }

static void log_oom(int rdev, uint64_t bytes, const char *api) {
    if (vgpu_log_level < VLOG_WARN || !vgpu_region) return;
    vgpu_device_t *d = &vgpu_region->devices[rdev];
    VLOG(VLOG_WARN, "%s: out of memory on %s: %llu bytes requested, %llu in use, limit %llu", api, d->uuid,
         (unsigned long long)bytes, (unsigned long long)vgpu_device_usage(rdev),
         (unsigned long long)vgpu_device_limit(rdev));
}

/* Reserve for the current context's device. Returns rdev (>= 0), -1 when the device is
 * unknown (no context: the driver will answer), or -2 when over the limit. */
static int reserve_current(uint64_t bytes, const char *api) {
    int rdev = vgpu_current_rdev();
    if (rdev < 0) return -1;
    if (vgpu_reserve(rdev, bytes) != 0) {
        log_oom(rdev, bytes, api);
        return -2;
    }
    return rdev;
}

static void give_back(int rdev, uint64_t bytes) {
    if (rdev >= 0) vgpu_unreserve(rdev, bytes);
}

static CUresult free_tracked(int kind, uint64_t key, CUresult (*do_free)(uint64_t, void *), void *arg) {
    track_t *t = key ? vgpu_track_take(kind, key) : NULL;
    CUresult rc = do_free(key, arg);
    if (t) {
        if (rc == CUDA_SUCCESS) {
            if (t->pool >= 0) vgpu_pool_freed(t->pool, t->bytes);
            else if (vgpu_share_freed(t->key)) vgpu_unreserve(t->rdev, t->bytes); /* 0: exported, kept */
            free(t);
        } else {
            vgpu_track_put(t);
        }
    }
    return rc;
}

/* ---------------- cuInit ---------------- */

VGPU_EXPORT CUresult cuInit(unsigned int flags) {
    CUresult rc = CALL_REAL(CUresult(*)(unsigned int), cuInit, flags);
    if (rc == CUDA_SUCCESS && !off()) vgpu_my_slot(); /* register early: the monitor sees us at once */
    return rc;
}

/* ---------------- linear allocations ---------------- */

#define ALLOC_BODY(api, bytes, realcall, key)                            \
    do {                                                                  \
        int rdev_ = reserve_current((bytes), api);                        \
        if (rdev_ == -2) return CUDA_ERROR_OUT_OF_MEMORY;                 \
        CUresult rc_ = (realcall);                                        \
        if (rc_ != CUDA_SUCCESS) { give_back(rdev_, (bytes)); return rc_; } \
        if (rdev_ >= 0) vgpu_track_add(K_PTR, (uint64_t)(key), rdev_, (bytes)); \
        return rc_;                                                       \
    } while (0)

typedef unsigned int CUdeviceptr_v1_;

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAlloc_v2, dptr, bytes);
    ALLOC_BODY("cuMemAlloc_v2", bytes, CALL_REAL(fn, cuMemAlloc_v2, dptr, bytes), *dptr);
}

VGPU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1_ *dptr, unsigned int bytes) {
    typedef CUresult (*fn)(CUdeviceptr_v1_ *, unsigned int);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAlloc, dptr, bytes);
    ALLOC_BODY("cuMemAlloc", (uint64_t)bytes, CALL_REAL(fn, cuMemAlloc, dptr, bytes), *dptr);
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t, unsigned int);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAllocManaged, dptr, bytes, flags);
    ALLOC_BODY("cuMemAllocManaged", bytes, CALL_REAL(fn, cuMemAllocManaged, dptr, bytes, flags), *dptr);
}

/* During stream capture cuMemAllocAsync allocates nothing: it adds a memory-allocation node to
 * the graph being captured, whose memory graphmem.c checks when the graph is instantiated and
 * launched. Charging it to the stream's pool here would count it twice. */
static int capturing(CUstream s) {
    typedef CUresult (*cap_t)(CUstream, CUstreamCaptureStatus *);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!s) return 0; /* the legacy stream cannot capture */
    return CALL_REAL(cap_t, cuStreamIsCapturing, s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Stream-ordered allocations are charged through their pool's model (pools.c): memory the pool
 * keeps after frees stays charged until a synchronisation or cuMemPoolTrimTo releases it. The
 * device is the stream's (cuMemAllocAsync takes the memory from the current pool of the stream's
 * device, whichever context is current); a pool made on a device is charged to that device. */
#define POOL_ALLOC_BODY(api, bytes, poolh, realcall)                                           \
    do {                                                                                       \
        int d_ = -1, rdev_ = -1, pidx_ = -1;                                                   \
        uint64_t grown_ = 0;                                                                   \
        if (capturing(s)) return (realcall); /* a graph node: charged at instantiation */      \
        if ((d_ = vgpu_stream_cudev(s)) >= 0) rdev_ = vgpu_rdev_of_cuda(d_);                   \
        if (rdev_ >= 0) {                                                                      \
            pidx_ = vgpu_pool_charge(rdev_, (poolh), (bytes), &grown_);                        \
            if (pidx_ == -2) { log_oom(rdev_, (bytes), api); return CUDA_ERROR_OUT_OF_MEMORY; } \
        }                                                                                      \
        CUresult rc_ = (realcall);                                                             \
        if (rc_ != CUDA_SUCCESS) {                                                             \
            if (pidx_ >= 0) vgpu_pool_undo(pidx_, (bytes), grown_);                            \
            else give_back(rdev_, (bytes));                                                    \
            return rc_;                                                                        \
        }                                                                                      \
        if (rdev_ >= 0) vgpu_track_add_pool(K_PTR, (uint64_t)*dptr, rdev_, (bytes), pidx_);         \
        return rc_;                                                                            \
    } while (0)

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t, CUstream);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAllocAsync, dptr, bytes, s);
    POOL_ALLOC_BODY("cuMemAllocAsync", bytes, vgpu_device_pool(d_), CALL_REAL(fn, cuMemAllocAsync, dptr, bytes, s));
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t, CUstream);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAllocAsync_ptsz, dptr, bytes, s);
    POOL_ALLOC_BODY("cuMemAllocAsync_ptsz", bytes, vgpu_device_pool(d_),
                    CALL_REAL(fn, cuMemAllocAsync_ptsz, dptr, bytes, s));
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAllocFromPoolAsync, dptr, bytes, pool, s);
    POOL_ALLOC_BODY("cuMemAllocFromPoolAsync", bytes, (uint64_t)(uintptr_t)pool,
                    CALL_REAL(fn, cuMemAllocFromPoolAsync, dptr, bytes, pool, s));
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAllocFromPoolAsync_ptsz, dptr, bytes, pool, s);
    POOL_ALLOC_BODY("cuMemAllocFromPoolAsync_ptsz", bytes, (uint64_t)(uintptr_t)pool,
                    CALL_REAL(fn, cuMemAllocFromPoolAsync_ptsz, dptr, bytes, pool, s));
}

/* Pitch: the driver picks the pitch, so reserve an estimate (rows padded to 512 bytes)
 * and settle the difference after the call; if the real pitch needs more than the limit
 * allows, the allocation is undone and the caller gets OOM. */
VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                        unsigned int elem) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    typedef CUresult (*ffn)(CUdeviceptr);
    if (off() || !dptr || !pitch) return CALL_REAL(fn, cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    uint64_t est = ((uint64_t)width + 511) / 512 * 512 * (uint64_t)height;
    int rdev = reserve_current(est, "cuMemAllocPitch_v2");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS) { give_back(rdev, est); return rc; }
    if (rdev < 0) return rc;
    uint64_t actual = (uint64_t)*pitch * (uint64_t)height;
    if (actual > est) {
        if (vgpu_reserve(rdev, actual - est) != 0) {
            CALL_REAL(ffn, cuMemFree_v2, *dptr);
            give_back(rdev, est);
            log_oom(rdev, actual, "cuMemAllocPitch_v2");
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (actual < est) {
        give_back(rdev, est - actual);
    }
    vgpu_track_add(K_PTR, *dptr, rdev, actual);
    return rc;
}

/* The v1 ABI (CUDA < 3.2: 32-bit pointer, pitch and sizes), same rule. */
VGPU_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1_ *dptr, unsigned int *pitch, unsigned int width,
                                     unsigned int height, unsigned int elem) {
    typedef CUresult (*fn)(CUdeviceptr_v1_ *, unsigned int *, unsigned int, unsigned int, unsigned int);
    typedef CUresult (*ffn)(CUdeviceptr_v1_);
    if (off() || !dptr || !pitch) return CALL_REAL(fn, cuMemAllocPitch, dptr, pitch, width, height, elem);
    uint64_t est = ((uint64_t)width + 511) / 512 * 512 * (uint64_t)height;
    int rdev = reserve_current(est, "cuMemAllocPitch");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuMemAllocPitch, dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS) { give_back(rdev, est); return rc; }
    if (rdev < 0) return rc;
    uint64_t actual = (uint64_t)*pitch * (uint64_t)height;
    if (actual > est) {
        if (vgpu_reserve(rdev, actual - est) != 0) {
            CALL_REAL(ffn, cuMemFree, *dptr);
            give_back(rdev, est);
            log_oom(rdev, actual, "cuMemAllocPitch");
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (actual < est) {
        give_back(rdev, est - actual);
    }
    vgpu_track_add(K_PTR, *dptr, rdev, actual);
    return rc;
}

/* ---------------- frees ---------------- */

static CUresult do_free_v2(uint64_t p, void *a) { (void)a; return CALL_REAL(CUresult(*)(CUdeviceptr), cuMemFree_v2, (CUdeviceptr)p); }
static CUresult do_free_v1(uint64_t p, void *a) { (void)a; return CALL_REAL(CUresult(*)(CUdeviceptr_v1_), cuMemFree, (CUdeviceptr_v1_)p); }
static CUresult do_free_async(uint64_t p, void *s) { return CALL_REAL(freeasync_t, cuMemFreeAsync, (CUdeviceptr)p, (CUstream)s); }
static CUresult do_free_async_ptsz(uint64_t p, void *s) { return CALL_REAL(freeasync_t, cuMemFreeAsync_ptsz, (CUdeviceptr)p, (CUstream)s); }

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    if (off()) return do_free_v2(p, NULL);
    return free_tracked(K_PTR, p, do_free_v2, NULL);
}
VGPU_EXPORT CUresult cuMemFree(CUdeviceptr_v1_ p) {
    if (off()) return do_free_v1(p, NULL);
    return free_tracked(K_PTR, p, do_free_v1, NULL);
}
VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    if (off()) return do_free_async(p, s);
    return free_tracked(K_PTR, p, do_free_async, s);
}
VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    if (off()) return do_free_async_ptsz(p, s);
    return free_tracked(K_PTR, p, do_free_async_ptsz, s);
}

/* arrays and mipmapped arrays: arrayhooks.c */

/* virtual memory management: vmmhooks.c */

/* ---------------- imported memory ---------------- */

VGPU_EXPORT CUresult cuImportExternalMemory(CUexternalMemory *ext, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc) {
    typedef CUresult (*fn)(CUexternalMemory *, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *);
    if (off() || !ext || !desc) return CALL_REAL(fn, cuImportExternalMemory, ext, desc);
    uint64_t bytes = desc->size;
    int rdev = reserve_current(bytes, "cuImportExternalMemory");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuImportExternalMemory, ext, desc);
    if (rc != CUDA_SUCCESS) { give_back(rdev, bytes); return rc; }
    if (rdev >= 0) vgpu_track_add(K_EXTMEM, (uint64_t)(uintptr_t)*ext, rdev, bytes);
    return rc;
}

static CUresult do_destroy_ext(uint64_t e, void *x) { (void)x; return CALL_REAL(CUresult(*)(CUexternalMemory), cuDestroyExternalMemory, (CUexternalMemory)(uintptr_t)e); }
VGPU_EXPORT CUresult cuDestroyExternalMemory(CUexternalMemory e) {
    if (off()) return do_destroy_ext((uint64_t)(uintptr_t)e, NULL);
    return free_tracked(K_EXTMEM, (uint64_t)(uintptr_t)e, do_destroy_ext, NULL);
}

/* ---------------- what the application sees ---------------- */

/* total = min(limit, physical); free = min(physical free, total - container usage), never
 * negative, never an error when usage passes the limit (HAMi#1370, core#200). */
static void virtualise(int rdev, size_t *freeb, size_t *total) {
    if (rdev < 0 || !vgpu_region) return;
    uint64_t limit = vgpu_device_limit(rdev);
    if (limit == VGPU_UNLIMITED) return;
    uint64_t t = limit < *total ? limit : *total;
    uint64_t used = vgpu_device_usage(rdev);
    uint64_t f = used >= t ? 0 : t - used;
    if (freeb && f < *freeb) *freeb = f;
    *total = t;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
    typedef CUresult (*fn)(size_t *, size_t *);
    CUresult rc = CALL_REAL(fn, cuMemGetInfo_v2, freeb, total);
    if (rc != CUDA_SUCCESS || off() || !freeb || !total) return rc;
    virtualise(vgpu_current_rdev(), freeb, total);
    return rc;
}

VGPU_EXPORT CUresult cuMemGetInfo(unsigned int *freeb, unsigned int *total) {
    typedef CUresult (*fn)(unsigned int *, unsigned int *);
    typedef CUresult (*fn2)(size_t *, size_t *);
    if (off() || !freeb || !total) return CALL_REAL(fn, cuMemGetInfo, freeb, total);
    size_t f, t;
    CUresult rc = CALL_REAL(fn2, cuMemGetInfo_v2, &f, &t);
    if (rc != CUDA_SUCCESS) return rc;
    virtualise(vgpu_current_rdev(), &f, &t);
    *freeb = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
    *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    return rc;
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    typedef CUresult (*fn)(size_t *, CUdevice);
    CUresult rc = CALL_REAL(fn, cuDeviceTotalMem_v2, bytes, dev);
    if (rc != CUDA_SUCCESS || off() || !bytes) return rc;
    virtualise(vgpu_rdev_of_cuda((int)dev), NULL, bytes);
    return rc;
}

VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    typedef CUresult (*fn)(unsigned int *, CUdevice);
    typedef CUresult (*fn2)(size_t *, CUdevice);
    if (off() || !bytes) return CALL_REAL(fn, cuDeviceTotalMem, bytes, dev);
    size_t t;
    CUresult rc = CALL_REAL(fn2, cuDeviceTotalMem_v2, &t, dev);
    if (rc != CUDA_SUCCESS) return rc;
    virtualise(vgpu_rdev_of_cuda((int)dev), NULL, &t);
    *bytes = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    return rc;
}

