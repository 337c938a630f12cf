/*
 * nvmlhooks.c - NVML memory queries report the container's limit and usage, so that
 * nvidia-smi-style tools inside the container show "used / limit" of the container.
 *
 * NVML knows devices by handle; we match them to the shared region by UUID, so the answer
 * is right whatever CUDA_VISIBLE_DEVICES says. A device no CUDA process has registered yet
 * is registered here, its limit taken from CUDA_DEVICE_MEMORY_LIMIT_<i>: the index the config file
 * gives its UUID (LIBVGPU_DEVICE_UUID_<i>), else its NVML index.
 */
#include "config.h"
#include "log.h"
#include "real.h"
#include "region.h"
#include "nvml_subset.h"

static int rdev_of_nvml(nvmlDevice_t dev) {
    typedef nvmlReturn_t (*uuid_t_)(nvmlDevice_t, char *, unsigned);
    typedef nvmlReturn_t (*index_t)(nvmlDevice_t, unsigned *);
    uuid_t_ getuuid = (uuid_t_)REAL_NVML_PTR(nvmlDeviceGetUUID);
    index_t getindex = (index_t)vgpu_real_nvml_fn[HN_nvmlDeviceGetIndex];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (!getuuid || getuuid(dev, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
    if (vgpu_region_ensure() != 0) return -1;
    int known = vgpu_device_find(uuid);
    if (vgpu_device_resolved(known)) return known;
    /* The container index: the config file's for this UUID where it lists the cards, else NVML's.
     * Registering a device the region has already only records that index for this process's cap. */
    int idx = vgpu_config_index_of_uuid(uuid);
    if (idx == -1) idx = 99; /* not one of the container's cards: no limit entry, 0 bytes */
    unsigned nidx = 0;
    if (idx < 0 && (!getindex || getindex(dev, &nidx) != NVML_SUCCESS)) return known;
    return vgpu_device_register(uuid, idx >= 0 ? idx : (int)nidx);
}

/* Returns 1 and the (total, used, free) view when the device has a limit. */
static int limited_view(nvmlDevice_t dev, unsigned long long real_total, unsigned long long *total,
                        unsigned long long *used, unsigned long long *freeb) {
    if (vgpu_control_disabled()) return 0;
    int rdev = rdev_of_nvml(dev);
    if (rdev < 0) return 0;
    uint64_t limit = vgpu_device_limit(rdev);
    if (limit == VGPU_UNLIMITED) return 0;
    uint64_t t = limit < real_total ? limit : real_total;
    uint64_t u = vgpu_device_usage(rdev);
    *total = t;
    *used = u;
    *freeb = u >= t ? 0 : t - u;
    return 1;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    typedef nvmlReturn_t (*fn)(nvmlDevice_t, nvmlMemory_t *);
    fn real = (fn)REAL_NVML_PTR(nvmlDeviceGetMemoryInfo);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real(dev, mem);
    if (rc != NVML_SUCCESS || !mem) return rc;
    limited_view(dev, mem->total, &mem->total, &mem->used, &mem->free);
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    typedef nvmlReturn_t (*fn)(nvmlDevice_t, nvmlMemory_v2_t *);
    fn real = (fn)REAL_NVML_PTR(nvmlDeviceGetMemoryInfo_v2);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real(dev, mem);
    if (rc != NVML_SUCCESS || !mem) return rc;
    if (limited_view(dev, mem->total, &mem->total, &mem->used, &mem->free)) mem->reserved = 0;
    return rc;
}
