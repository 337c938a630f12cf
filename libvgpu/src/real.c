/*
 * real.c - finding the real driver and NVML, and door B (our exported dlsym).
 *
 * Why dlsym is replaced: a program (or cudart, PyTorch, NCCL) that dlopen()s libcuda and
 * dlsym()s an entry point through that handle would otherwise get the driver's function
 * and bypass the preloaded hooks. Our dlsym performs the real lookup first and only swaps
 * the answer when it is libcuda's / libnvidia-ml's own definition of a name we hook, so
 * lookups of any other library, misses, and prefixes like "curl_" or "cublas" behave
 * exactly as before and trigger no initialisation. RTLD_NEXT is resolved relative to the
 * *caller's* object (not to libvgpu), which other interposers rely on.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include "common.h"
#include "hooks.h"

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_fn;

static void resolve_real_dlsym(void) {
    static const char *vers[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; vers[i] && !real_dlsym_fn; i++) real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", vers[i]);
}

__attribute__((constructor)) static void vgpu_ctor(void) {
    vgpu_log_init();
    resolve_real_dlsym();
}

void *vgpu_real_dlsym(void *handle, const char *name) {
    if (VGPU_UNLIKELY(!real_dlsym_fn)) resolve_real_dlsym();
    return real_dlsym_fn ? real_dlsym_fn(handle, name) : NULL;
}

/* ---- the hook table ---- */
#define D(n) extern void n(void);
VGPU_CUDA_HOOKS(D)
VGPU_NVML_HOOKS(D)
#undef D

typedef struct { const char *name; void *hook; int nvml; int idx; } hook_entry_t;
static const hook_entry_t hook_table[] = {
#define C(n) {#n, (void *)n, 0, H_##n},
#define NV(n) {#n, (void *)n, 1, HN_##n},
    VGPU_CUDA_HOOKS(C) VGPU_NVML_HOOKS(NV)
#undef C
#undef NV
};
#define HOOK_COUNT (sizeof hook_table / sizeof hook_table[0])

static const char *const cuda_names[H_CUDA_END] = {
#define S(n) #n,
    VGPU_CUDA_HOOKS(S) VGPU_CUDA_REAL_ONLY(S)
#undef S
};
static const char *const nvml_names[HN_END] = {
#define S(n) #n,
    VGPU_NVML_HOOKS(S) VGPU_NVML_REAL_ONLY(S)
#undef S
};

void *vgpu_real_fn[H_CUDA_END];
void *vgpu_real_nvml_fn[HN_END];
int vgpu_real_ready;
static void *cuda_handle, *nvml_handle;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT;

static void load_cuda(void) {
    cuda_handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!cuda_handle) cuda_handle = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!cuda_handle) {
        VLOG(VLOG_ERROR, "cannot load libcuda.so.1: %s", dlerror());
    } else {
        for (int i = 0; i < H_CUDA_END; i++) vgpu_real_fn[i] = vgpu_real_dlsym(cuda_handle, cuda_names[i]);
    }
    __atomic_store_n(&vgpu_real_ready, 1, __ATOMIC_RELEASE);
}

static void load_nvml(void) {
    nvml_handle = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!nvml_handle) nvml_handle = dlopen("libnvidia-ml.so.1", RTLD_LAZY);
    if (!nvml_handle) {
        VLOG(VLOG_INFO, "libnvidia-ml.so.1 not loadable: %s", dlerror());
        return;
    }
    for (int i = 0; i < HN_END; i++) vgpu_real_nvml_fn[i] = vgpu_real_dlsym(nvml_handle, nvml_names[i]);
}

void vgpu_load_real(void) { pthread_once(&cuda_once, load_cuda); }
void vgpu_load_real_nvml(void) { pthread_once(&nvml_once, load_nvml); }
void *vgpu_cuda_handle(void) { vgpu_load_real(); return cuda_handle; }
void *vgpu_nvml_handle(void) { vgpu_load_real_nvml(); return nvml_handle; }

void *vgpu_real_cuda(const char *name) {
    void *h = vgpu_cuda_handle();
    return h ? vgpu_real_dlsym(h, name) : NULL;
}
void *vgpu_real_nvml(const char *name) {
    void *h = vgpu_nvml_handle();
    return h ? vgpu_real_dlsym(h, name) : NULL;
}

void *vgpu_hook_for(const char *name) {
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (!strcmp(hook_table[i].name, name)) return hook_table[i].hook;
    return NULL;
}

void *vgpu_hook_for_real(void *real_fn) {
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

/* RTLD_NEXT relative to the object containing `caller`: the first object after it in the
 * link-map order whose own definition of `name` exists. */
static void *next_after(void *caller, const char *name) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
        return vgpu_real_dlsym(RTLD_NEXT, name);
    for (struct link_map *m = lm->l_next; m; m = m->l_next) {
        void *h = dlopen(m->l_name && *m->l_name ? m->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        void *sym = vgpu_real_dlsym(h, name);
        dlclose(h);
        if (!sym) continue;
        Dl_info si;
        struct link_map *sm = NULL;
        if (dladdr1(sym, &si, (void **)&sm, RTLD_DL_LINKMAP) && sm == m) return sym;
    }
    return NULL;
}

VGPU_EXPORT void *dlsym(void *handle, const char *name) {
    void *r;
    if (handle == RTLD_NEXT) r = next_after(__builtin_return_address(0), name);
    else r = vgpu_real_dlsym(handle, name);
    if (r && ((name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4))) {
        void *hook = vgpu_hook_for(name);
        if (hook && hook != r && from_driver(r) && !vgpu_control_disabled()) return hook;
    }
    return r;
}
