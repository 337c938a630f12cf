/*
 * fake_nvml.c - a stand-in libnvidia-ml.so.1: devices, UUIDs, indexes and physical memory
 * of the same simulated card as fake_cuda.c (fake_state.h). NVML ignores
 * CUDA_VISIBLE_DEVICES, as the real one does.
 */
#include <dlfcn.h>
#include <string.h>
#include "fake_state.h"

#define EXPORT __attribute__((visibility("default")))
typedef int nvmlReturn_t;
typedef struct { int phys; } dev_t_;
typedef dev_t_ *nvmlDevice_t;
static dev_t_ devs[FAKE_MAX_DEV];
static int inited;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

EXPORT nvmlReturn_t nvmlInit_v2(void) { for (int i = 0; i < FAKE_MAX_DEV; i++) devs[i].phys = i; inited = 1; return 0; }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlShutdown(void) { return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { if (!inited) return 1; *n = (unsigned)fake_count_env(); return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (!inited) return 1;
    if ((int)i >= fake_count_env()) return 2;
    *d = &devs[i];
    return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *u, nvmlDevice_t *d) {
    if (!inited) return 1;
    for (int i = 0; i < fake_count_env(); i++) {
        char s[64];
        fake_uuid_string(i, s, sizeof s);
        if (!strcmp(s, u)) { *d = &devs[i]; return 0; }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned n) { fake_uuid_string(d->phys, buf, n); return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) { *i = (unsigned)d->phys; return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    uint64_t cap = fake_capacity(d->phys), used = atomic_load(&fake_phys()->used[d->phys]);
    m->total = cap; m->used = used; m->free = used > cap ? 0 : cap - used;
    return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    uint64_t cap = fake_capacity(d->phys), used = atomic_load(&fake_phys()->used[d->phys]);
    m->total = cap; m->reserved = 5 << 20; m->used = used; m->free = used + m->reserved > cap ? 0 : cap - used - m->reserved;
    return 0;
}
/* FAKE_NVML_PROCS other processes (pids 1000000+), plus this process with its context bytes
 * when FAKE_NVML_SELF=1 (a container without its own PID namespace). */
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_info_t;
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, proc_info_t *infos) {
    const char *s = getenv("FAKE_NVML_PROCS");
    const char *self = getenv("FAKE_NVML_SELF");
    unsigned others = s ? (unsigned)atoi(s) : 0, n = others + (self && *self == '1');
    if (!infos || *count < n) { *count = n; return n ? 7 : 0; }
    for (unsigned i = 0; i < others; i++) infos[i] = (proc_info_t){1000000 + i, 0, ~0u, ~0u};
    if (n > others) {
        uint64_t (*ctx)(int) = (uint64_t(*)(int))dlsym(RTLD_DEFAULT, "fake_ctx_bytes");
        infos[others] = (proc_info_t){(unsigned)getpid(), ctx ? ctx(d->phys) : 0, ~0u, ~0u};
    }
    *count = n;
    return 0;
}
