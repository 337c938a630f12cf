/*
 * ctxmod.c - memory the driver takes for contexts made with cuCtxCreate* and for module
 * images (cuModuleLoad*, cuLibraryLoad*), charged apart from allocations (region slots'
 * context[] and module[]) and given back when the context is destroyed or the module unloaded.
 *
 * Why measured and not computed: neither size is visible in the API. A context's size depends
 * on the driver and the card (518 MiB on an H200); a module's device footprint is its code
 * for this card plus its static __device__ data, which the image size does not tell (a fatbin
 * carries code for many architectures; .nv.global takes no room in the file). So both are the
 * growth of device memory across the driver call, less what we already account in the same
 * window (see vgpu_ctx_measure_end). Contexts use NVML (as the primary context does); modules
 * use the driver's own cuMemGetInfo, which is cheaper and needs the current context that a
 * module load needs anyway.
 *
 * Contexts are charged without a limit check (the context exists already, as for the primary
 * context). Modules are checked: a load whose memory does not fit is unloaded again and the
 * caller gets CUDA_ERROR_OUT_OF_MEMORY. Loads and context creations of one process are
 * serialised, so two of them never measure each other; neither is on a hot path.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include "common.h"
#include "hooks.h"

#undef cuCtxCreate
#undef cuCtxDestroy

#define CALL_REAL(T, n, ...) ({ __typeof__(T) _f = (T)REAL_PTR(n); _f ? _f(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })
/* A module needing more is rare; the cap bounds what a neighbour container allocating during
 * the load (invisible to us) can add to the measurement. */
#define MODULE_CHARGE_MAX (256ull << 20)

enum { O_CTX = 1, O_MODULE = 2, O_LIBRARY = 3 };
typedef struct owned {
    uint64_t handle;
    int kind, rdev;
    void *ctx; /* modules and libraries: the context they were loaded into */
    uint64_t bytes;
    struct owned *next;
} owned_t;

static owned_t *owned_list;
static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
/* Held across a measured driver call: one measurement at a time per process. */
static pthread_mutex_t measure_mu = PTHREAD_MUTEX_INITIALIZER;

void vgpu_ctxmod_reset_after_fork(void) {
    pthread_mutex_init(&list_mu, NULL);
    pthread_mutex_init(&measure_mu, NULL);
    while (owned_list) { owned_t *n = owned_list->next; free(owned_list); owned_list = n; }
}

static void owned_add(int kind, uint64_t handle, void *ctx, int rdev, uint64_t bytes) {
    owned_t *o = malloc(sizeof *o);
    if (!o) return;
    *o = (owned_t){handle, kind, rdev, ctx, bytes, NULL};
    pthread_mutex_lock(&list_mu);
    o->next = owned_list;
    owned_list = o;
    pthread_mutex_unlock(&list_mu);
}

static owned_t *owned_take(int kind, uint64_t handle) {
    pthread_mutex_lock(&list_mu);
    owned_t **pp = &owned_list, *o;
    while ((o = *pp) && !(o->kind == kind && o->handle == handle)) pp = &o->next;
    if (o) *pp = o->next;
    pthread_mutex_unlock(&list_mu);
    return o;
}

static void owned_put(owned_t *o) {
    pthread_mutex_lock(&list_mu);
    o->next = owned_list;
    owned_list = o;
    pthread_mutex_unlock(&list_mu);
}

static void give_back(owned_t *o) {
    if (o->kind == O_CTX) vgpu_uncharge_context(o->rdev, o->bytes);
    else vgpu_unreserve_module(o->rdev, o->bytes);
    VLOG(VLOG_DEBUG, "released %llu bytes of %s %#llx", (unsigned long long)o->bytes,
         o->kind == O_CTX ? "context" : "module", (unsigned long long)o->handle);
    free(o);
}

void vgpu_modules_drop_ctx(void *ctx) {
    if (!ctx) return;
    owned_t *gone = NULL;
    pthread_mutex_lock(&list_mu);
    for (owned_t **pp = &owned_list, *o; (o = *pp);) {
        if (o->kind != O_CTX && o->ctx == ctx) {
            *pp = o->next;
            o->next = gone;
            gone = o;
        } else {
            pp = &o->next;
        }
    }
    pthread_mutex_unlock(&list_mu);
    while (gone) { owned_t *n = gone->next; give_back(gone); gone = n; }
}

/* ---------------- contexts ---------------- */

void vgpu_measure_lock(void) { pthread_mutex_lock(&measure_mu); }
void vgpu_measure_unlock(void) { pthread_mutex_unlock(&measure_mu); }

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
        if (b_) {                                                                        \
            vgpu_charge_context(rdev_, b_);                                              \
            owned_add(O_CTX, (uint64_t)(uintptr_t)*(pctx), NULL, rdev_, b_);             \
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

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    typedef CUresult (*fn)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
    CTX_CREATE_BODY("cuCtxCreate_v4", pctx, dev, CALL_REAL(fn, cuCtxCreate_v4, pctx, params, flags, dev));
}

static void ctx_gone(CUcontext ctx) {
    owned_t *o = owned_take(O_CTX, (uint64_t)(uintptr_t)ctx);
    if (o) give_back(o);
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

/* ---------------- modules and libraries ---------------- */

typedef struct {
    int on, rdev;
    void *ctx;
    uint64_t used0, cont0;
} mod_measure_t;

static int device_used(uint64_t *used) {
    size_t f = 0, t = 0;
    if (CALL_REAL(CUresult(*)(size_t *, size_t *), cuMemGetInfo_v2, &f, &t) != CUDA_SUCCESS) return -1;
    *used = t > f ? t - f : 0;
    return 0;
}

/* Takes measure_mu when the load will be measured (a current context on a known device). */
static void mod_begin(mod_measure_t *m) {
    *m = (mod_measure_t){0};
    if (vgpu_control_disabled()) return;
    m->rdev = vgpu_current_rdev();
    if (m->rdev < 0) return;
    CUcontext c = NULL;
    CALL_REAL(CUresult(*)(CUcontext *), cuCtxGetCurrent, &c);
    m->ctx = c;
    pthread_mutex_lock(&measure_mu);
    if (device_used(&m->used0) != 0) { pthread_mutex_unlock(&measure_mu); return; }
    m->cont0 = vgpu_device_usage(m->rdev);
    m->on = 1;
}

/* After a successful load: charge the growth to module[], or unload again and answer OOM. */
static CUresult mod_end(mod_measure_t *m, CUresult rc, int kind, uint64_t handle, const char *api) {
    if (!m->on) return rc;
    uint64_t used1 = 0, charge = 0;
    if (rc == CUDA_SUCCESS && device_used(&used1) == 0) {
        uint64_t cont1 = vgpu_device_usage(m->rdev);
        charge = vgpu_growth(m->used0, used1, m->cont0, cont1);
        if (charge > MODULE_CHARGE_MAX) charge = MODULE_CHARGE_MAX;
    }
    pthread_mutex_unlock(&measure_mu);
    if (!charge) return rc;
    if (vgpu_reserve_module(m->rdev, charge) != 0) {
        if (kind == O_MODULE) CALL_REAL(CUresult(*)(CUmodule), cuModuleUnload, (CUmodule)(uintptr_t)handle);
        else CALL_REAL(CUresult(*)(CUlibrary), cuLibraryUnload, (CUlibrary)(uintptr_t)handle);
        VLOG(VLOG_WARN, "%s: out of memory on %s: module needs %llu bytes, %llu in use, limit %llu", api,
             vgpu_region->devices[m->rdev].uuid, (unsigned long long)charge,
             (unsigned long long)vgpu_device_usage(m->rdev),
             (unsigned long long)vgpu_region->devices[m->rdev].limit_bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    owned_add(kind, handle, m->ctx, m->rdev, charge);
    VLOG(VLOG_DEBUG, "%s: module %#llx charged %llu bytes", api, (unsigned long long)handle,
         (unsigned long long)charge);
    return rc;
}

#define MODULE_LOAD(api, kind, out, realcall)                                                      \
    do {                                                                                           \
        mod_measure_t m_;                                                                          \
        mod_begin(&m_);                                                                            \
        CUresult rc_ = (realcall);                                                                 \
        return mod_end(&m_, rc_, kind, rc_ == CUDA_SUCCESS && (out) ? (uint64_t)(uintptr_t)*(out) : 0, api); \
    } while (0)

VGPU_EXPORT CUresult cuModuleLoad(CUmodule *mod, const char *fname) {
    MODULE_LOAD("cuModuleLoad", O_MODULE, mod,
                CALL_REAL(CUresult(*)(CUmodule *, const char *), cuModuleLoad, mod, fname));
}

VGPU_EXPORT CUresult cuModuleLoadData(CUmodule *mod, const void *image) {
    MODULE_LOAD("cuModuleLoadData", O_MODULE, mod,
                CALL_REAL(CUresult(*)(CUmodule *, const void *), cuModuleLoadData, mod, image));
}

VGPU_EXPORT CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, CUjit_option *opts,
                                        void **vals) {
    typedef CUresult (*fn)(CUmodule *, const void *, unsigned int, CUjit_option *, void **);
    MODULE_LOAD("cuModuleLoadDataEx", O_MODULE, mod, CALL_REAL(fn, cuModuleLoadDataEx, mod, image, n, opts, vals));
}

VGPU_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin) {
    MODULE_LOAD("cuModuleLoadFatBinary", O_MODULE, mod,
                CALL_REAL(CUresult(*)(CUmodule *, const void *), cuModuleLoadFatBinary, mod, fatbin));
}

typedef CUresult (*libload_t)(CUlibrary *, const void *, CUjit_option *, void **, unsigned int, CUlibraryOption *,
                              void **, unsigned int);
typedef CUresult (*libfile_t)(CUlibrary *, const char *, CUjit_option *, void **, unsigned int, CUlibraryOption *,
                              void **, unsigned int);

VGPU_EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
                                       CUlibraryOption *lo, void **lv, unsigned int nl) {
    MODULE_LOAD("cuLibraryLoadData", O_LIBRARY, lib,
                CALL_REAL(libload_t, cuLibraryLoadData, lib, code, jo, jv, nj, lo, lv, nl));
}

VGPU_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *file, CUjit_option *jo, void **jv,
                                           unsigned int nj, CUlibraryOption *lo, void **lv, unsigned int nl) {
    MODULE_LOAD("cuLibraryLoadFromFile", O_LIBRARY, lib,
                CALL_REAL(libfile_t, cuLibraryLoadFromFile, lib, file, jo, jv, nj, lo, lv, nl));
}

static CUresult unload(int kind, uint64_t handle, CUresult (*real)(uint64_t)) {
    owned_t *o = vgpu_control_disabled() ? NULL : owned_take(kind, handle);
    CUresult rc = real(handle);
    if (o) {
        if (rc == CUDA_SUCCESS) give_back(o);
        else owned_put(o);
    }
    return rc;
}

static CUresult real_module_unload(uint64_t h) {
    return CALL_REAL(CUresult(*)(CUmodule), cuModuleUnload, (CUmodule)(uintptr_t)h);
}
static CUresult real_library_unload(uint64_t h) {
    return CALL_REAL(CUresult(*)(CUlibrary), cuLibraryUnload, (CUlibrary)(uintptr_t)h);
}

VGPU_EXPORT CUresult cuModuleUnload(CUmodule mod) {
    return unload(O_MODULE, (uint64_t)(uintptr_t)mod, real_module_unload);
}

VGPU_EXPORT CUresult cuLibraryUnload(CUlibrary lib) {
    return unload(O_LIBRARY, (uint64_t)(uintptr_t)lib, real_library_unload);
}
