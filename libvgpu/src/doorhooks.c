/*
 * doorhooks.c - the three doors through which a program can reach a driver entry point, and
 * the table of our hooks they hand out instead:
 *   door B: dlsym / dlvsym (a program, cudart, PyTorch or NCCL that dlopen()s libcuda and looks
 *           an entry point up through that handle would otherwise get the driver's function);
 *   door C: cuGetProcAddress / cuGetProcAddress_v2 (how the CUDA runtime resolves nearly every
 *           entry point, by name, requested CUDA version and per-thread-stream flag).
 * (Door A is plain dynamic linking: the preloaded definitions win by symbol order.)
 *
 * dlsym/dlvsym perform the real lookup first and only swap the answer when it is libcuda's /
 * libnvidia-ml's own definition of a name we hook, so lookups of any other library, misses,
 * and prefixes like "curl_" or "cublas" behave exactly as before and trigger no
 * initialisation. RTLD_NEXT is resolved relative to the *caller's* object (not to libvgpu),
 * which other interposers rely on.
 *
 * cuGetProcAddress asks the driver first: HAMi-core answered from its own table and ignored
 * both version and flags (a v1 request got a v2 ABI; per-thread-stream requests got
 * legacy-stream functions). We let the real driver choose the exact versioned function, then
 * hand back our wrapper of *that very function* when we wrap it (matched by address against
 * the driver's exported symbols), and the driver's answer untouched otherwise. Status and
 * return code are the driver's.
 *
 * This file sits at the top of the call graph: it names every hook (hooks.h), and nothing
 * calls into it.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include "config.h"
#include "log.h"
#include "real.h"

#undef cuGetProcAddress

/* ---- the hook table ---- */

/* Declared by symbol name only (asm labels): cuda.h gives these names their real types. */
#define D(n) extern char vgpu_hook_##n[] __asm__(#n);
VGPU_CUDA_HOOKS(D)
VGPU_NVML_HOOKS(D)
#undef D

typedef struct { const char *name; void *hook; int nvml; int idx; } hook_entry_t;
static const hook_entry_t hook_table[] = {
#define C(n) {#n, (void *)vgpu_hook_##n, 0, H_##n},
#define NV(n) {#n, (void *)vgpu_hook_##n, 1, HN_##n},
    VGPU_CUDA_HOOKS(C) VGPU_NVML_HOOKS(NV)
#undef C
#undef NV
};
#define HOOK_COUNT (sizeof hook_table / sizeof hook_table[0])

static void *vgpu_hook_for(const char *name) {
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (!strcmp(hook_table[i].name, name)) return hook_table[i].hook;
    return NULL;
}

static void *vgpu_hook_for_real(void *real_fn) {
    if (!real_fn) return NULL;
    vgpu_load_real();
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (!hook_table[i].nvml && vgpu_real_fn[hook_table[i].idx] == real_fn) return hook_table[i].hook;
    return NULL;
}


/* 1 when `fn` is defined in libcuda.so* or libnvidia-ml.so*. */
static int from_driver(void *fn) {
    Dl_info info;
    if (!dladdr(fn, &info) || !info.dli_fname) return 0;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    return !strncmp(base, "libcuda.so", 10) || !strncmp(base, "libnvidia-ml.so", 15);
}

static void *lookup(void *handle, const char *name, const char *version) {
    return version ? vgpu_real_dlvsym(handle, name, version) : vgpu_real_dlsym(handle, name);
}

/* RTLD_NEXT relative to the object containing `caller`: the first object after it in the
 * link-map order whose own definition of `name` (of `version`, when given) exists. */
static void *next_after(void *caller, const char *name, const char *version) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm) return lookup(RTLD_NEXT, name, version);
    for (struct link_map *m = lm->l_next; m; m = m->l_next) {
        void *h = dlopen(m->l_name && *m->l_name ? m->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        void *sym = lookup(h, name, version);
        dlclose(h);
        if (!sym) continue;
        Dl_info si;
        struct link_map *sm = NULL;
        if (dladdr1(sym, &si, (void **)&sm, RTLD_DL_LINKMAP) && sm == m) return sym;
    }
    return NULL;
}

/* Our hook instead of the driver's own definition of a name we hook; anything else as found. */
static void *swap_for_hook(void *r, const char *name) {
    if (r && name && ((name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4))) {
        void *hook = vgpu_hook_for(name);
        if (hook && hook != r && from_driver(r) && !vgpu_control_disabled()) return hook;
    }
    return r;
}

VGPU_EXPORT void *dlsym(void *handle, const char *name) {
    void *r;
    if (handle == RTLD_NEXT) r = next_after(__builtin_return_address(0), name, NULL);
    else r = vgpu_real_dlsym(handle, name);
    return swap_for_hook(r, name);
}

/* Door B': the versioned lookup. The driver's entry points carry no symbol versions today, so
 * dlvsym(libcuda, "cuMemAlloc_v2", v) normally finds nothing; a driver that versions them one
 * day must not open a way around the hooks, so the same swap applies. */
VGPU_EXPORT void *dlvsym(void *handle, const char *name, const char *version) {
    void *r;
    if (handle == RTLD_NEXT) r = next_after(__builtin_return_address(0), name, version);
    else r = vgpu_real_dlvsym(handle, name, version);
    return swap_for_hook(r, name);
}

/* ---- door C ---- */

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
