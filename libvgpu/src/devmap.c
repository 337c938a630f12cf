/*
 * devmap.c - CUDA ordinals to region devices. Accounting is keyed by the device UUID, so
 * CUDA_VISIBLE_DEVICES subsets and re-orderings charge the right physical device (HAMi-core
 * indexed by ordinal and charged the wrong card).
 */
#include <stdatomic.h>
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "devmap.h"
#include "forkreg.h"
#include "log.h"
#include "real.h"
#include "region.h"

static int rdev_map[MAX_ORD]; /* region device index + 1; 0 = not resolved yet */
static pthread_mutex_t map_mu = PTHREAD_MUTEX_INITIALIZER;

typedef int nvmlReturn_t_;
typedef CUresult (*devget_t)(CUdevice *, int);
typedef CUresult (*uuid_fn_t)(CUuuid *, CUdevice);
typedef void *nvmlDevice_t_;

/* Index for a card the config file does not list: no CUDA_DEVICE_MEMORY_LIMIT_<i> names it, so its
 * limit is 0 (fail closed). */
#define UNLISTED_INDEX 99

/* The container device index ("i" of CUDA_DEVICE_MEMORY_LIMIT_<i>) of CUDA ordinal `cudev`: the
 * config file's LIBVGPU_DEVICE_UUID_<i> for its UUID where the file lists the cards (the tenant's
 * CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER, and the node's PCI order, cannot shift it); else from
 * CUDA_VISIBLE_DEVICES and NVML. */
static int phys_index(int cudev, const char *uuid) {
    int listed = vgpu_config_index_of_uuid(uuid);
    if (listed >= 0) return listed;
    if (listed == -1) {
        VLOG(VLOG_ERROR, "CUDA device %d (%s) is not one of the container's cards in config file %s; its "
             "memory limit is 0 (fail closed)", cudev, uuid, vgpu_config_path());
        return UNLISTED_INDEX;
    }
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES"); /* the driver reads the environment alone */
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
        if (idx < 0 && vgpu_region && vgpu_config_state() != VGPU_CONFIG_NONE) {
            /* No entry for the card (the region's device table reads full - the file is the
             * tenant's to write): an unknown device would go unaccounted and unlimited, so this
             * process accounts against entry 0 with every limit at 0 instead. */
            vgpu_region_fail_closed("no room for the card in its device table");
            idx = 0;
        }
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

CUcontext vgpu_stream_other_ctx(void *stream, CUcontext *cur) {
    uintptr_t s = (uintptr_t)stream;
    CUcontext c = NULL;
    *cur = NULL;
    CALL_REAL(CUresult(*)(CUcontext *), cuCtxGetCurrent, cur);
    if (s == 0 || s == 0x1 || s == 0x2) return NULL; /* CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
    if (CALL_REAL(CUresult(*)(CUstream, CUcontext *), cuStreamGetCtx, (CUstream)stream, &c) != CUDA_SUCCESS) return NULL;
    return c && c != *cur ? c : NULL;
}

int vgpu_stream_cudev(void *stream) {
    typedef CUresult (*getdev_t)(CUdevice *);
    CUcontext cur, other = vgpu_stream_other_ctx(stream, &cur);
    CUdevice dev = -1;
    if (other) { /* the other context's device: made current for one question, then given back */
        CALL_REAL(CUresult(*)(CUcontext), cuCtxSetCurrent, other);
        CUresult rc = CALL_REAL(getdev_t, cuCtxGetDevice, &dev);
        CALL_REAL(CUresult(*)(CUcontext), cuCtxSetCurrent, cur);
        if (rc == CUDA_SUCCESS) return (int)dev;
    }
    return CALL_REAL(getdev_t, cuCtxGetDevice, &dev) == CUDA_SUCCESS ? (int)dev : -1;
}

static void devmap_after_fork(void) { pthread_mutex_init(&map_mu, NULL); }
__attribute__((constructor)) static void devmap_register_fork(void) { vgpu_on_fork_child(devmap_after_fork); }
