/*
 * memhooks.c - device memory limits: every allocation API is checked against the shared
 * region before the driver is asked, every free gives the bytes back, and the memory
 * queries report the limit as the card's size.
 *
 * Order of operations (why): reserve -> real call -> on failure give back. An allocation
 * over the limit therefore never reaches the driver (no side effects), and two processes
 * cannot both take the last bytes (region.c). Frees remove the tracking entry before the
 * real free, so an address the driver hands out again at once is never confused with the
 * freed one. Accounting is keyed by the device UUID, so CUDA_VISIBLE_DEVICES subsets and
 * re-orderings charge the right physical device (HAMi-core indexed by ordinal: core#319).
 */
#include <cuda.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common.h"
#include "hooks.h"

/* cuda.h maps the unversioned names onto _v2; we define both spellings ourselves. */
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuMemAllocPitch
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuMemAllocAsync
#undef cuMemFreeAsync
#undef cuMemAllocFromPoolAsync
#undef cuInit
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset

#define CALL_REAL(T, n, ...) ({ __typeof__(T) _f = (T)REAL_PTR(n); _f ? _f(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

/* ---------------- device index mapping ---------------- */

#define MAX_ORD 64
static int rdev_map[MAX_ORD]; /* region device index + 1; 0 = not resolved yet */
static pthread_mutex_t map_mu = PTHREAD_MUTEX_INITIALIZER;

typedef int nvmlReturn_t_;
typedef CUresult (*devget_t)(CUdevice *, int);
typedef CUresult (*uuid_fn_t)(CUuuid *, CUdevice);
typedef CUresult (*freeasync_t)(CUdeviceptr, CUstream);
typedef void *nvmlDevice_t_;

/* The container device index ("i" of CUDA_DEVICE_MEMORY_LIMIT_<i>) of CUDA ordinal `cudev`. */
static int phys_index(int cudev, const char *uuid) {
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd || !*cvd) return cudev;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", cvd);
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    for (int i = 0; tok; i++, tok = strtok_r(NULL, ",", &save)) {
        if (i != cudev) continue;
        while (*tok == ' ') tok++;
        char *end;
        long v = strtol(tok, &end, 10);
        if (end != tok && *end == '\0' && v >= 0) return (int)v;
        break; /* a UUID entry: ask NVML below */
    }
    nvmlReturn_t_ (*init)(void) = (nvmlReturn_t_(*)(void))REAL_NVML_PTR(nvmlInit_v2);
    nvmlReturn_t_ (*byuuid)(const char *, nvmlDevice_t_ *) =
        (nvmlReturn_t_(*)(const char *, nvmlDevice_t_ *))vgpu_real_nvml_fn[HN_nvmlDeviceGetHandleByUUID];
    nvmlReturn_t_ (*index)(nvmlDevice_t_, unsigned *) =
        (nvmlReturn_t_(*)(nvmlDevice_t_, unsigned *))vgpu_real_nvml_fn[HN_nvmlDeviceGetIndex];
    nvmlDevice_t_ h;
    unsigned idx;
    if (init && byuuid && index && init() == 0 && byuuid(uuid, &h) == 0 && index(h, &idx) == 0) return (int)idx;
    VLOG(VLOG_WARN, "cannot map CUDA device %d (%s) to a container index; using %d", cudev, uuid, cudev);
    return cudev;
}

static void format_uuid(const unsigned char *b, char *out, size_t n) {
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int vgpu_rdev_of_cuda(int cudev) {
    if (cudev < 0 || cudev >= MAX_ORD) return -1;
    int v = __atomic_load_n(&rdev_map[cudev], __ATOMIC_ACQUIRE);
    if (VGPU_LIKELY(v > 0)) return v - 1;
    pthread_mutex_lock(&map_mu);
    v = rdev_map[cudev];
    if (v == 0) {
        CUdevice dev = cudev;
        CALL_REAL(devget_t, cuDeviceGet, &dev, cudev);
        CUuuid u;
        char uuid[96];
        CUresult rc = CALL_REAL(uuid_fn_t, cuDeviceGetUuid_v2, &u, dev);
        if (rc != CUDA_SUCCESS) rc = CALL_REAL(uuid_fn_t, cuDeviceGetUuid, &u, dev);
        if (rc == CUDA_SUCCESS) format_uuid((const unsigned char *)u.bytes, uuid, sizeof uuid);
        else snprintf(uuid, sizeof uuid, "cuda-ordinal-%d", cudev);
        int idx = vgpu_device_register(uuid, phys_index(cudev, uuid));
        if (idx >= 0) __atomic_store_n(&rdev_map[cudev], idx + 1, __ATOMIC_RELEASE);
        v = idx + 1;
    }
    pthread_mutex_unlock(&map_mu);
    return v - 1;
}

int vgpu_current_rdev(void) {
    CUdevice dev;
    if (CALL_REAL(CUresult(*)(CUdevice *), cuCtxGetDevice, &dev) != CUDA_SUCCESS) return -1;
    return vgpu_rdev_of_cuda((int)dev);
}

/* ---------------- per-process allocation tracking ---------------- */

enum { K_PTR = 1, K_ARRAY = 2, K_MIPMAP = 3, K_VMM = 4 };
typedef struct track {
    uint64_t key;
    int kind, rdev;
    uint64_t bytes;
    struct track *next;
    int pool; /* pools.c index for stream-ordered allocations charged through their pool, else -1 */
} track_t;
#define NBUCKET 4096
static track_t *buckets[NBUCKET];
static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket_of(uint64_t key, int kind) {
    uint64_t h = (key ^ (uint64_t)kind) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 52) & (NBUCKET - 1);
}

static void track_add_pool(int kind, uint64_t key, int rdev, uint64_t bytes, int pool) {
    track_t *t = malloc(sizeof *t);
    if (!t) return;
    *t = (track_t){key, kind, rdev, bytes, NULL, pool};
    unsigned b = bucket_of(key, kind);
    pthread_mutex_lock(&track_mu);
    t->next = buckets[b];
    buckets[b] = t;
    pthread_mutex_unlock(&track_mu);
}

static track_t *track_take(int kind, uint64_t key) {
    unsigned b = bucket_of(key, kind);
    pthread_mutex_lock(&track_mu);
    track_t **pp = &buckets[b], *t;
    while ((t = *pp) && !(t->key == key && t->kind == kind)) pp = &t->next;
    if (t) *pp = t->next;
    pthread_mutex_unlock(&track_mu);
    return t;
}

static void track_add(int kind, uint64_t key, int rdev, uint64_t bytes) { track_add_pool(kind, key, rdev, bytes, -1); }

/* Put an entry back when the real free failed (the memory is still held). */
static void track_put(track_t *t) {
    unsigned b = bucket_of(t->key, t->kind);
    pthread_mutex_lock(&track_mu);
    t->next = buckets[b];
    buckets[b] = t;
    pthread_mutex_unlock(&track_mu);
}

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static int ctx_refs[MAX_ORD];
static uint64_t ctx_charged[MAX_ORD];
static void *primary_ctx[MAX_ORD]; /* handle of the retained primary context, for its modules */

void vgpu_track_reset_after_fork(void) {
    pthread_mutex_init(&ctx_mu, NULL);
    memset(ctx_refs, 0, sizeof ctx_refs); /* CUDA contexts do not survive fork */
    memset(ctx_charged, 0, sizeof ctx_charged);
    memset(primary_ctx, 0, sizeof primary_ctx);
    vgpu_ctxmod_reset_after_fork();
    vgpu_pools_reset_after_fork();
    pthread_mutex_init(&track_mu, NULL);
    pthread_mutex_init(&map_mu, NULL);
    for (int i = 0; i < NBUCKET; i++) {
        track_t *t = buckets[i];
        while (t) { track_t *n = t->next; free(t); t = n; }
        buckets[i] = NULL;
    }
}

/* ---------------- helpers ---------------- */

static int off(void) { return vgpu_control_disabled(); }

static void log_oom(int rdev, uint64_t bytes, const char *api) {
    if (vgpu_log_level < VLOG_WARN || !vgpu_region) return;
    vgpu_device_t *d = &vgpu_region->devices[rdev];
    VLOG(VLOG_WARN, "%s: out of memory on %s: %llu bytes requested, %llu in use, limit %llu", api, d->uuid,
         (unsigned long long)bytes, (unsigned long long)vgpu_device_usage(rdev),
         (unsigned long long)d->limit_bytes);
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
    track_t *t = key ? track_take(kind, key) : NULL;
    CUresult rc = do_free(key, arg);
    if (t) {
        if (rc == CUDA_SUCCESS) {
            if (t->pool >= 0) vgpu_pool_freed(t->pool, t->bytes);
            else vgpu_unreserve(t->rdev, t->bytes);
            free(t);
        } else {
            track_put(t);
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
        if (rdev_ >= 0) track_add(K_PTR, (uint64_t)(key), rdev_, (bytes)); \
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

/* Stream-ordered allocations are charged through their pool's model (pools.c): memory the pool
 * keeps after frees stays charged until a synchronisation or cuMemPoolTrimTo releases it. */
#define POOL_ALLOC_BODY(api, bytes, poolh, realcall)                                           \
    do {                                                                                       \
        CUdevice d_;                                                                           \
        int rdev_ = -1, pidx_ = -1;                                                            \
        uint64_t grown_ = 0;                                                                   \
        if (CALL_REAL(CUresult(*)(CUdevice *), cuCtxGetDevice, &d_) == CUDA_SUCCESS)            \
            rdev_ = vgpu_rdev_of_cuda((int)d_);                                                \
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
        if (rdev_ >= 0) track_add_pool(K_PTR, (uint64_t)*dptr, rdev_, (bytes), pidx_);         \
        return rc_;                                                                            \
    } while (0)

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t, CUstream);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAllocAsync, dptr, bytes, s);
    POOL_ALLOC_BODY("cuMemAllocAsync", bytes, vgpu_device_pool((int)d_), CALL_REAL(fn, cuMemAllocAsync, dptr, bytes, s));
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    typedef CUresult (*fn)(CUdeviceptr *, size_t, CUstream);
    if (off() || !dptr) return CALL_REAL(fn, cuMemAllocAsync_ptsz, dptr, bytes, s);
    POOL_ALLOC_BODY("cuMemAllocAsync_ptsz", bytes, vgpu_device_pool((int)d_),
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
    track_add(K_PTR, *dptr, rdev, actual);
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
    track_add(K_PTR, *dptr, rdev, actual);
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

/* ---------------- arrays ---------------- */

static uint64_t format_bytes(CUarray_format f) {
    switch ((int)f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF:
    case CU_AD_FORMAT_UNORM_INT8X2: case CU_AD_FORMAT_SNORM_INT8X2: case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT:
    case CU_AD_FORMAT_UNORM_INT8X4: case CU_AD_FORMAT_SNORM_INT8X4: case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2: return 4;
    case CU_AD_FORMAT_UNORM_INT16X4: case CU_AD_FORMAT_SNORM_INT16X4: return 8;
    default: return 4; /* block-compressed and video formats: at most 4 bytes per element */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch) {
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * format_bytes(f) * (ch ? ch : 1);
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
    typedef CUresult (*fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    if (off() || !arr || !desc) return CALL_REAL(fn, cuArrayCreate_v2, arr, desc);
    uint64_t bytes = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    int rdev = reserve_current(bytes, "cuArrayCreate_v2");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuArrayCreate_v2, arr, desc);
    if (rc != CUDA_SUCCESS) { give_back(rdev, bytes); return rc; }
    if (rdev >= 0) track_add(K_ARRAY, (uint64_t)(uintptr_t)*arr, rdev, bytes);
    return rc;
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    typedef CUresult (*fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    if (off() || !arr || !desc) return CALL_REAL(fn, cuArray3DCreate_v2, arr, desc);
    uint64_t bytes = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    int rdev = reserve_current(bytes, "cuArray3DCreate_v2");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuArray3DCreate_v2, arr, desc);
    if (rc != CUDA_SUCCESS) { give_back(rdev, bytes); return rc; }
    if (rdev >= 0) track_add(K_ARRAY, (uint64_t)(uintptr_t)*arr, rdev, bytes);
    return rc;
}

/* v1 descriptors (CUDA < 3.2): 32-bit dimensions. */
typedef struct { unsigned int Width, Height; CUarray_format Format; unsigned int NumChannels; } array_desc_v1_t;
typedef struct {
    unsigned int Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels, Flags;
} array3d_desc_v1_t;

VGPU_EXPORT CUresult cuArrayCreate(CUarray *arr, const array_desc_v1_t *desc) {
    typedef CUresult (*fn)(CUarray *, const array_desc_v1_t *);
    if (off() || !arr || !desc) return CALL_REAL(fn, cuArrayCreate, arr, desc);
    uint64_t bytes = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    int rdev = reserve_current(bytes, "cuArrayCreate");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuArrayCreate, arr, desc);
    if (rc != CUDA_SUCCESS) { give_back(rdev, bytes); return rc; }
    if (rdev >= 0) track_add(K_ARRAY, (uint64_t)(uintptr_t)*arr, rdev, bytes);
    return rc;
}

VGPU_EXPORT CUresult cuArray3DCreate(CUarray *arr, const array3d_desc_v1_t *desc) {
    typedef CUresult (*fn)(CUarray *, const array3d_desc_v1_t *);
    if (off() || !arr || !desc) return CALL_REAL(fn, cuArray3DCreate, arr, desc);
    uint64_t bytes = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    int rdev = reserve_current(bytes, "cuArray3DCreate");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuArray3DCreate, arr, desc);
    if (rc != CUDA_SUCCESS) { give_back(rdev, bytes); return rc; }
    if (rdev >= 0) track_add(K_ARRAY, (uint64_t)(uintptr_t)*arr, rdev, bytes);
    return rc;
}

static CUresult do_array_destroy(uint64_t a, void *x) { (void)x; return CALL_REAL(CUresult(*)(CUarray), cuArrayDestroy, (CUarray)(uintptr_t)a); }
VGPU_EXPORT CUresult cuArrayDestroy(CUarray a) {
    if (off()) return do_array_destroy((uint64_t)(uintptr_t)a, NULL);
    return free_tracked(K_ARRAY, (uint64_t)(uintptr_t)a, do_array_destroy, NULL);
}

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int levels) {
    typedef CUresult (*fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    if (off() || !h || !desc) return CALL_REAL(fn, cuMipmappedArrayCreate, h, desc, levels);
    uint64_t bytes = 0;
    size_t w = desc->Width, ht = desc->Height, d = desc->Depth;
    for (unsigned i = 0; i < (levels ? levels : 1); i++) {
        bytes += array_bytes(w, ht, d, desc->Format, desc->NumChannels);
        w = w > 1 ? w / 2 : 1;
        ht = ht > 1 ? ht / 2 : ht;
        d = d > 1 ? d / 2 : d;
    }
    int rdev = reserve_current(bytes, "cuMipmappedArrayCreate");
    if (rdev == -2) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(fn, cuMipmappedArrayCreate, h, desc, levels);
    if (rc != CUDA_SUCCESS) { give_back(rdev, bytes); return rc; }
    if (rdev >= 0) track_add(K_MIPMAP, (uint64_t)(uintptr_t)*h, rdev, bytes);
    return rc;
}

static CUresult do_mipmap_destroy(uint64_t a, void *x) { (void)x; return CALL_REAL(CUresult(*)(CUmipmappedArray), cuMipmappedArrayDestroy, (CUmipmappedArray)(uintptr_t)a); }
VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    if (off()) return do_mipmap_destroy((uint64_t)(uintptr_t)a, NULL);
    return free_tracked(K_MIPMAP, (uint64_t)(uintptr_t)a, do_mipmap_destroy, NULL);
}

/* ---------------- virtual memory management ---------------- */

/* Only device-located physical memory is charged, to the device named in the properties
 * (not the calling thread's context: NCCL and expandable segments create from any thread). */
VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    if (off() || !handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CALL_REAL(fn, cuMemCreate, handle, size, prop, flags);
    int rdev = vgpu_rdev_of_cuda(prop->location.id);
    if (rdev >= 0 && vgpu_reserve(rdev, size) != 0) {
        log_oom(rdev, size, "cuMemCreate");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CALL_REAL(fn, cuMemCreate, handle, size, prop, flags);
    if (rc != CUDA_SUCCESS) { give_back(rdev, size); return rc; }
    if (rdev >= 0) track_add(K_VMM, (uint64_t)*handle, rdev, size);
    return rc;
}

static CUresult do_release(uint64_t h, void *x) { (void)x; return CALL_REAL(CUresult(*)(CUmemGenericAllocationHandle), cuMemRelease, (CUmemGenericAllocationHandle)h); }
VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    if (off()) return do_release(h, NULL);
    return free_tracked(K_VMM, h, do_release, NULL);
}

/* ---------------- what the application sees ---------------- */

/* total = min(limit, physical); free = min(physical free, total - container usage), never
 * negative, never an error when usage passes the limit (HAMi#1370, core#200). */
static void virtualise(int rdev, size_t *freeb, size_t *total) {
    if (rdev < 0 || !vgpu_region) return;
    uint64_t limit = vgpu_region->devices[rdev].limit_bytes;
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

/* ---------------- context memory ---------------- */

/* The primary context's memory (about 500 MiB on an H200) is charged to the device when this
 * process first retains it, and given back when the last reference is released or the context
 * is reset. Measured with NVML: this process's own entry in the compute-process list when its
 * pid is visible (no PID namespace), else the growth of the device's used memory across the
 * retain (may include a neighbour's allocation made in the same instant; capped at 1 GiB). */
#define CTX_CHARGE_MAX (1ull << 30)

typedef struct { unsigned long long total, free, used; } nvml_mem_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } nvml_proc_t;

static void *nvml_handle_of(int rdev) {
    typedef int (*init_t)(void);
    typedef int (*byuuid_t)(const char *, void **);
    init_t init = (init_t)REAL_NVML_PTR(nvmlInit_v2);
    byuuid_t byuuid = (byuuid_t)vgpu_real_nvml_fn[HN_nvmlDeviceGetHandleByUUID];
    void *h = NULL;
    if (!init || !byuuid || !vgpu_region || init() != 0) return NULL;
    return byuuid(vgpu_region->devices[rdev].uuid, &h) == 0 ? h : NULL;
}

static int nvml_used(void *h, uint64_t *used) {
    typedef int (*mem_t)(void *, nvml_mem_t *);
    mem_t mem = (mem_t)vgpu_real_nvml_fn[HN_nvmlDeviceGetMemoryInfo];
    nvml_mem_t m;
    if (!h || !mem || mem(h, &m) != 0) return -1;
    *used = m.used;
    return 0;
}

static int nvml_self_used(void *h, uint64_t *used) {
    typedef int (*procs_t)(void *, unsigned *, nvml_proc_t *);
    procs_t procs = (procs_t)vgpu_real_nvml_fn[HN_nvmlDeviceGetComputeRunningProcesses_v3];
    nvml_proc_t list[64];
    unsigned n = 64;
    if (!h || !procs || procs(h, &n, list) != 0) return -1;
    for (unsigned i = 0; i < n && i < 64; i++)
        if (list[i].pid == (unsigned)getpid() && list[i].used != ~0ull) { *used = list[i].used; return 0; }
    return -1;
}

/* Measured as a difference across the call, so it stays right when the process already holds
 * memory (another context, allocations): this process's own NVML entry when its pid is
 * visible after the call (an entry missing before the call counts as 0: a process without a
 * context is not listed), else the device's used memory. From either difference the growth
 * of what we already account in the same window is taken off (this process's slot for the
 * own entry, the whole container for the device figure), so allocations made by other threads
 * or neighbours of the container meanwhile are not charged twice. */
void vgpu_ctx_measure_begin(int rdev, vgpu_measure_t *m) {
    *m = (vgpu_measure_t){0};
    m->h = rdev >= 0 ? nvml_handle_of(rdev) : NULL;
    if (!m->h) return;
    m->self_ok = nvml_self_used(m->h, &m->self0) == 0;
    if (!m->self_ok) m->self0 = 0;
    m->dev_ok = nvml_used(m->h, &m->dev0) == 0;
    m->mine0 = vgpu_my_usage(rdev);
    m->cont0 = vgpu_device_usage(rdev);
}

uint64_t vgpu_growth(uint64_t before, uint64_t after, uint64_t acct_before, uint64_t acct_after) {
    /* signed: a neighbour's free inside the window lowers both figures alike */
    int64_t g = (int64_t)(after - before) - (int64_t)(acct_after - acct_before);
    return g > 0 ? (uint64_t)g : 0;
}

uint64_t vgpu_ctx_measure_end(int rdev, vgpu_measure_t *m) {
    uint64_t after, charge = 0;
    if (!m->h) return 0;
    if (nvml_self_used(m->h, &after) == 0) charge = vgpu_growth(m->self0, after, m->mine0, vgpu_my_usage(rdev));
    else if (m->dev_ok && nvml_used(m->h, &after) == 0)
        charge = vgpu_growth(m->dev0, after, m->cont0, vgpu_device_usage(rdev));
    return charge > CTX_CHARGE_MAX ? CTX_CHARGE_MAX : charge;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    typedef CUresult (*fn)(CUcontext *, CUdevice);
    if (off() || dev < 0 || dev >= MAX_ORD) return CALL_REAL(fn, cuDevicePrimaryCtxRetain, pctx, dev);
    pthread_mutex_lock(&ctx_mu);
    int first = ctx_refs[dev] == 0;
    int rdev = first ? vgpu_rdev_of_cuda((int)dev) : -1;
    vgpu_measure_t m;
    if (rdev >= 0) vgpu_measure_lock();
    vgpu_ctx_measure_begin(rdev, &m);
    CUresult rc = CALL_REAL(fn, cuDevicePrimaryCtxRetain, pctx, dev);
    uint64_t charge = rc == CUDA_SUCCESS ? vgpu_ctx_measure_end(rdev, &m) : 0;
    if (rdev >= 0) vgpu_measure_unlock();
    if (rc == CUDA_SUCCESS) {
        ctx_refs[dev]++;
        if (pctx) primary_ctx[dev] = *pctx;
        if (charge) {
            vgpu_charge_context(rdev, charge);
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
    if (rc == CUDA_SUCCESS && !off()) ctx_drop(dev, 0);
    return rc;
}
VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease, dev);
    if (rc == CUDA_SUCCESS && !off()) ctx_drop(dev, 0);
    return rc;
}
VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxReset_v2, dev);
    if (rc == CUDA_SUCCESS && !off()) ctx_drop(dev, 1);
    return rc;
}
VGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDevicePrimaryCtxReset, dev);
    if (rc == CUDA_SUCCESS && !off()) ctx_drop(dev, 1);
    return rc;
}
