/*
 * modhooks.c - module images (cuModuleLoad*, cuLibraryLoad*) charged to the slot's module[]
 * as the growth of device memory across the load (measure.c), and given back at unload or when
 * their context goes away (owned.c).
 *
 * Modules are checked against the limit: a load whose memory does not fit is unloaded again
 * and the caller gets CUDA_ERROR_OUT_OF_MEMORY. With lazy loading (CUDA_MODULE_LOADING=LAZY,
 * the default since CUDA 12.2) the load itself takes little and each kernel's code is loaded
 * when a function handle is first taken (cuModuleGetFunction, cuLibraryGetKernel,
 * cuKernelGetFunction, cuLibraryGetModule): those calls are measured the same way and the
 * growth is added to the module's charge (limit checked; a function that does not fit is
 * refused with CUDA_ERROR_OUT_OF_MEMORY, the module stays loaded). Kernels the driver
 * materialises inside a launch (a runtime CUkernel handle launched directly) are not measured
 * there, because a measurement per launch would cost the launch path two driver queries; they
 * appear in the next measured call's growth only as far as that call's window sees them.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include "config.h"
#include "devmap.h"
#include "log.h"
#include "measure.h"
#include "owned.h"
#include "real.h"
#include "region.h"

/* No cap on the measured growth: a module's static __device__ data can be any size, and a cap
 * let a tenant load past its limit. A neighbour container allocating on the card during the
 * load (invisible to us) is charged to the module: an overcharge, never an escape. */

/* ---------------- modules and libraries ---------------- */

typedef struct {
    int on, rdev;
    void *ctx;
    uint64_t used0, cont0;
} mod_measure_t;

/* Takes the measure lock when the load will be measured (a current context on a known device). */
static void mod_begin(mod_measure_t *m) {
    *m = (mod_measure_t){0};
    if (vgpu_control_disabled()) return;
    m->rdev = vgpu_current_rdev();
    if (m->rdev < 0) return;
    CUcontext c = NULL;
    CALL_REAL(CUresult(*)(CUcontext *), cuCtxGetCurrent, &c);
    m->ctx = c;
    vgpu_measure_lock();
    if (vgpu_device_used(&m->used0) != 0) { vgpu_measure_unlock(); return; }
    m->cont0 = vgpu_device_usage(m->rdev);
    m->on = 1;
}

/* After a successful load: charge the growth to module[], or unload again and answer OOM. */
static CUresult mod_end(mod_measure_t *m, CUresult rc, int kind, uint64_t handle, const char *api) {
    if (!m->on) return rc;
    uint64_t used1 = 0, charge = 0;
    if (rc == CUDA_SUCCESS && vgpu_device_used(&used1) == 0) {
        uint64_t cont1 = vgpu_device_usage(m->rdev);
        charge = vgpu_growth(m->used0, used1, m->cont0, cont1);
    }
    vgpu_measure_unlock();
    if (rc != CUDA_SUCCESS) return rc;
    /* recorded even when nothing was measured: a lazily loaded module grows later */
    if (!charge) { vgpu_owned_add(kind, handle, m->ctx, m->rdev, 0); return rc; }
    if (vgpu_reserve_module(m->rdev, charge) != 0) {
        if (kind == O_MODULE) CALL_REAL(CUresult(*)(CUmodule), cuModuleUnload, (CUmodule)(uintptr_t)handle);
        else CALL_REAL(CUresult(*)(CUlibrary), cuLibraryUnload, (CUlibrary)(uintptr_t)handle);
        VLOG(VLOG_WARN, "%s: out of memory on %s: module needs %llu bytes, %llu in use, limit %llu", api,
             vgpu_region->devices[m->rdev].uuid, (unsigned long long)charge,
             (unsigned long long)vgpu_device_usage(m->rdev),
             (unsigned long long)vgpu_region->devices[m->rdev].limit_bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgpu_owned_add(kind, handle, m->ctx, m->rdev, charge);
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
    owned_t *o = vgpu_control_disabled() ? NULL : vgpu_owned_take(kind, handle);
    CUresult rc = real(handle);
    if (o) {
        if (rc == CUDA_SUCCESS) vgpu_owned_release(o);
        else vgpu_owned_put(o);
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

/* ---------------- lazily loaded kernels ---------------- */

/* After a measured call that may have materialised kernels of module/library `owner` (kind):
 * charges the growth to that module's record (limit checked), or, when the owner is not known
 * (cuKernelGetFunction), to a record of its own keyed by `self` in the current context. */
static CUresult lazy_end(mod_measure_t *m, CUresult rc, int kind, uint64_t owner, uint64_t self, const char *api) {
    if (!m->on) return rc;
    uint64_t used1 = 0, charge = 0;
    if (rc == CUDA_SUCCESS && vgpu_device_used(&used1) == 0) {
        charge = vgpu_growth(m->used0, used1, m->cont0, vgpu_device_usage(m->rdev));
    }
    vgpu_measure_unlock();
    if (!charge) return rc;
    if (vgpu_reserve_module(m->rdev, charge) != 0) {
        VLOG(VLOG_WARN, "%s: out of memory on %s: kernels need %llu bytes, %llu in use, limit %llu", api,
             vgpu_region->devices[m->rdev].uuid, (unsigned long long)charge,
             (unsigned long long)vgpu_device_usage(m->rdev),
             (unsigned long long)vgpu_region->devices[m->rdev].limit_bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!owner || !vgpu_owned_grow(kind, owner, charge)) vgpu_owned_add(O_MODULE, self, m->ctx, m->rdev, charge);
    VLOG(VLOG_DEBUG, "%s: lazily loaded kernels charged %llu bytes", api, (unsigned long long)charge);
    return rc;
}

VGPU_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name) {
    mod_measure_t m;
    mod_begin(&m);
    CUresult rc = CALL_REAL(CUresult(*)(CUfunction *, CUmodule, const char *), cuModuleGetFunction, f, mod, name);
    return lazy_end(&m, rc, O_MODULE, (uint64_t)(uintptr_t)mod, f && rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*f : 0,
                    "cuModuleGetFunction");
}

VGPU_EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name) {
    mod_measure_t m;
    mod_begin(&m);
    CUresult rc = CALL_REAL(CUresult(*)(CUkernel *, CUlibrary, const char *), cuLibraryGetKernel, k, lib, name);
    return lazy_end(&m, rc, O_LIBRARY, (uint64_t)(uintptr_t)lib, k && rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*k : 0,
                    "cuLibraryGetKernel");
}

VGPU_EXPORT CUresult cuLibraryGetModule(CUmodule *mod, CUlibrary lib) {
    mod_measure_t m;
    mod_begin(&m);
    CUresult rc = CALL_REAL(CUresult(*)(CUmodule *, CUlibrary), cuLibraryGetModule, mod, lib);
    return lazy_end(&m, rc, O_LIBRARY, (uint64_t)(uintptr_t)lib, mod && rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*mod : 0,
                    "cuLibraryGetModule");
}

VGPU_EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
    mod_measure_t m;
    mod_begin(&m);
    CUresult rc = CALL_REAL(CUresult(*)(CUfunction *, CUkernel), cuKernelGetFunction, f, k);
    return lazy_end(&m, rc, O_LIBRARY, 0, f && rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*f : 0, "cuKernelGetFunction");
}
