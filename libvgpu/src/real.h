/*
 * real.h - the real driver and NVML functions (real.c), and the one call-the-real-function macro.
 */
#ifndef VGPU_REAL_H
#define VGPU_REAL_H

#include <dlfcn.h>
#include "hooks.h"
#include "util.h"

enum {
#define E(n) H_##n,
    VGPU_CUDA_HOOKS(E) VGPU_CUDA_REAL_ONLY(E) H_CUDA_END,
#undef E
};
enum {
#define E(n) HN_##n,
    VGPU_NVML_HOOKS(E) VGPU_NVML_REAL_ONLY(E) HN_END,
#undef E
};

extern void *vgpu_real_fn[H_CUDA_END];
extern void *vgpu_real_nvml_fn[HN_END];
extern int vgpu_real_ready;
void vgpu_load_real(void);
void vgpu_load_real_nvml(void);

/* REAL(cuMemAlloc_v2) -> the driver's function pointer, typed by the caller's cast. */
#define REAL_PTR(n) (VGPU_LIKELY(vgpu_real_ready) ? vgpu_real_fn[H_##n] : (vgpu_load_real(), vgpu_real_fn[H_##n]))
#define REAL_NVML_PTR(n) (vgpu_load_real_nvml(), vgpu_real_nvml_fn[HN_##n])

/* The real dlsym (ours is exported by doorhooks.c), resolved by version. */
void *vgpu_real_dlsym(void *handle, const char *name);
/* The real dlvsym. */
void *vgpu_real_dlvsym(void *handle, const char *name, const char *version);
/* The dlopen and dlmopen that libvgpu's (doorhooks.c) hand on to: the next definition after this
 * library; never NULL once the C library is found. */
typedef void *(*vgpu_dlopen_fn)(const char *, int);
typedef void *(*vgpu_dlmopen_fn)(Lmid_t, const char *, int);
vgpu_dlopen_fn vgpu_real_dlopen(void);
vgpu_dlmopen_fn vgpu_real_dlmopen(void);
/* The object's own definition of the dynamic symbol `name` (its hash table, no search scope, any
 * namespace), or NULL. */
struct link_map;
void *vgpu_object_symbol(const struct link_map *lm, const char *name);
void *vgpu_cuda_handle(void);
void *vgpu_nvml_handle(void); /* NULL when libnvidia-ml.so.1 is absent */
/* Real function of libcuda/libnvidia-ml by exact symbol name; NULL if absent. */
void *vgpu_real_cuda(const char *name);
void *vgpu_real_nvml(const char *name);

/* CALL_REAL(type, name, args...): calls the driver's `name` through a pointer of `type`, or
 * answers CUDA_ERROR_NOT_FOUND when the driver lacks it. The one definition, for every hook. */
#define CALL_REAL(T, n, ...) ({ __typeof__(T) _f = (T)REAL_PTR(n); _f ? _f(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

#endif
