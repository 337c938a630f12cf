/*
 * nvml_subset.h - the few NVML types libvgpu needs, declared here so the build needs no
 * nvml.h. Layouts follow NVIDIA's nvml.h (nvmlMemory_t, nvmlMemory_v2_t).
 */
#ifndef VGPU_NVML_SUBSET_H
#define VGPU_NVML_SUBSET_H
#include <stdint.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#endif
