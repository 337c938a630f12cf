/*
 * doorhooks.c - the three doors through which a program can reach a driver entry point, and
 * the table of our hooks they hand out instead:
 *   door B: dlsym / dlvsym (a program, cudart, PyTorch or NCCL that dlopen()s libcuda and looks
 *           an entry point up through that handle would otherwise get the driver's function);
 *   door C: cuGetProcAddress / cuGetProcAddress_v2 (how the CUDA runtime resolves nearly every
 *           entry point, by name, requested CUDA version and per-thread-stream flag).
 * (Door A is plain dynamic linking: the preloaded definitions win by symbol order. dlopen and
 * dlmopen keep it the only order: RTLD_DEEPBIND would put a library's own dependencies, libcuda
 * among them, before the preloaded hooks.)
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


/* 1 when `fn` lies in this library (whichever copy of it the loader bound the caller to is not
 * asked: only this one's own functions). */
static int in_self(void *fn) {
    static Dl_info self;
    Dl_info info;
    if (!self.dli_fbase && !dladdr((void *)in_self, &self)) return 0;
    return dladdr(fn, &info) && info.dli_fbase == self.dli_fbase;
}

/* 1 when `fn` is defined in a CUDA driver or NVML: libcuda.so* / libnvidia-ml.so* by file name,
 * or any other object that defines cuInit or nvmlInit_v2 itself. A tenant's renamed copy of the
 * driver (cp libcuda.so.1 /tmp/x.so; dlopen; dlsym) is a second driver that never passes through
 * the hooks; a copy in a new namespace (dlmopen) is found by either rule. */
static int from_driver(void *fn) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(fn, &info, (void **)&lm, RTLD_DL_LINKMAP) || !info.dli_fname || in_self(fn)) return 0;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    if (!strncmp(base, "libcuda.so", 10) || !strncmp(base, "libnvidia-ml.so", 15)) return 1;
    return vgpu_object_symbol(lm, "cuInit") || vgpu_object_symbol(lm, "nvmlInit_v2");
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

/* ---- RTLD_DEEPBIND ---- */

/* glibc's dlopen takes the calling object (whose RUNPATH it searches, whose namespace it loads
 * into) from its own return address: the wrappers must jump to the real function, not call it. */
#if defined(__has_attribute)
#if __has_attribute(musttail)
#define VGPU_TAIL __attribute__((musttail))
#endif
#endif
#ifndef VGPU_TAIL
#ifndef __OPTIMIZE__
#error "without musttail the dlopen wrapper is a tail call only when optimised (-O2)"
#endif
#define VGPU_TAIL
#endif

/* Only a DEEPBIND request reads the configuration: dlopen runs early and often. */
static int no_deepbind(const char *file, int mode) {
    if (!(mode & RTLD_DEEPBIND) || vgpu_control_disabled()) return mode;
    VLOG(VLOG_INFO, "dlopen(%s): RTLD_DEEPBIND dropped, the library binds to the preloaded hooks",
         file ? file : "NULL");
    return mode & ~RTLD_DEEPBIND;
}

static void *own_dlopen(const char *file, int mode) {
    vgpu_dlopen_fn real = vgpu_real_dlopen();
    if (VGPU_UNLIKELY(!real)) return NULL;
    mode = no_deepbind(file, mode);
    VGPU_TAIL return real(file, mode);
}

static void *own_dlmopen(Lmid_t lmid, const char *file, int mode) {
    vgpu_dlmopen_fn real = vgpu_real_dlmopen();
    if (VGPU_UNLIKELY(!real)) return NULL;
    mode = no_deepbind(file, mode);
    VGPU_TAIL return real(lmid, file, mode);
}

/* The exported names are aliases, so the door below can hand out this library's own function even
 * where the loader bound the name dlopen to the C library's (this library dlopen()ed, not preloaded). */
VGPU_EXPORT void *dlopen(const char *file, int mode) __attribute__((alias("own_dlopen")));
VGPU_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode) __attribute__((alias("own_dlmopen")));

static void *do_dlsym(void *handle, const char *name, void *caller);
static void *do_dlvsym(void *handle, const char *name, const char *version, void *caller);
static void *own_dlsym(void *handle, const char *name) { return do_dlsym(handle, name, __builtin_return_address(0)); }
static void *own_dlvsym(void *handle, const char *name, const char *version) {
    return do_dlvsym(handle, name, version, __builtin_return_address(0));
}

/* The C library's own lookup and loading functions are doors too: dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34"),
 * dlsym of a second libc loaded with dlmopen, or glibc's private __libc_dlsym / _dl_sym (older
 * glibc exports them as GLIBC_PRIVATE) hand out a lookup that finds libcuda's functions and never
 * passes through ours, and its dlopen (dlsym(RTLD_NEXT, "dlopen") from a library after this one,
 * dlvsym(RTLD_DEFAULT, "dlopen", "GLIBC_2.34")) keeps RTLD_DEEPBIND. A lookup of one of them that
 * lands outside this library gets ours instead:
 * same leading parameters (_dl_sym's and _dl_vsym's trailing caller address is not needed, ours
 * takes its own). */
static void *own_lookup_fn(const char *name) {
    if (!strcmp(name, "dlsym") || !strcmp(name, "__libc_dlsym") || !strcmp(name, "_dl_sym")) return (void *)own_dlsym;
    if (!strcmp(name, "dlvsym") || !strcmp(name, "__libc_dlvsym") || !strcmp(name, "_dl_vsym"))
        return (void *)own_dlvsym;
    if (!strcmp(name, "dlopen")) return (void *)own_dlopen;
    if (!strcmp(name, "dlmopen")) return (void *)own_dlmopen;
    return NULL;
}

/* Our hook instead of the driver's own definition of a name we hook; anything else as found. */
static void *swap_for_hook(void *r, const char *name) {
    if (!r || !name) return r;
    if ((name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4)) {
        void *hook = vgpu_hook_for(name);
        if (hook && hook != r && from_driver(r) && !vgpu_control_disabled()) return hook;
    } else if (name[0] == 'd' || name[0] == '_') {
        void *ours = own_lookup_fn(name);
        if (ours && !in_self(r) && !vgpu_control_disabled()) return ours;
    }
    return r;
}

static void *do_dlsym(void *handle, const char *name, void *caller) {
    void *r;
    if (handle == RTLD_NEXT) r = next_after(caller, name, NULL);
    else r = vgpu_real_dlsym(handle, name);
    return swap_for_hook(r, name);
}

static void *do_dlvsym(void *handle, const char *name, const char *version, void *caller) {
    void *r;
    if (handle == RTLD_NEXT) r = next_after(caller, name, version);
    else r = vgpu_real_dlvsym(handle, name, version);
    return swap_for_hook(r, name);
}

VGPU_EXPORT void *dlsym(void *handle, const char *name) { return do_dlsym(handle, name, __builtin_return_address(0)); }

/* Door B': the versioned lookup. The driver's entry points carry no symbol versions today, so
 * dlvsym(libcuda, "cuMemAlloc_v2", v) normally finds nothing; a driver that versions them one
 * day must not open a way around the hooks, so the same swap applies. */
VGPU_EXPORT void *dlvsym(void *handle, const char *name, const char *version) {
    return do_dlvsym(handle, name, version, __builtin_return_address(0));
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
