/*
 * measure.c - memory the driver takes for itself, measured across a driver call (measure.h).
 *
 * Why measured and not computed: neither a context's size nor a module's device footprint is
 * visible in the API. A context's size depends on the driver and the card (about 500 MiB on an
 * H200); a module's footprint is its code for this card plus its static __device__ data, which
 * the image size does not tell. So both are the growth of device memory across the driver
 * call, less what we already account in the same window.
 *
 * Contexts (the primary one and cuCtxCreate) are measured with NVML: this process's own entry
 * in the compute-process list when its pid is visible (no PID namespace), else the growth of
 * the device's used memory across the call (may include a neighbour's allocation made in the
 * same instant; capped at 1 GiB). Modules use the driver's own cuMemGetInfo, which is cheaper
 * and needs the current context that a module load needs anyway.
 */
#include <cuda.h>
#include <pthread.h>
#include <unistd.h>
#include "forkreg.h"
#include "measure.h"
#include "real.h"
#include "region.h"

#undef cuMemGetInfo

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

int vgpu_device_used(uint64_t *used) {
    size_t f = 0, t = 0;
    if (CALL_REAL(CUresult(*)(size_t *, size_t *), cuMemGetInfo_v2, &f, &t) != CUDA_SUCCESS) return -1;
    *used = t > f ? t - f : 0;
    return 0;
}

/* Held across a measured driver call: one measurement at a time per process. */
static pthread_mutex_t measure_mu = PTHREAD_MUTEX_INITIALIZER;
void vgpu_measure_lock(void) { pthread_mutex_lock(&measure_mu); }
void vgpu_measure_unlock(void) { pthread_mutex_unlock(&measure_mu); }
static void measure_after_fork(void) { pthread_mutex_init(&measure_mu, NULL); }
__attribute__((constructor)) static void measure_register_fork(void) { vgpu_on_fork_child(measure_after_fork); }
