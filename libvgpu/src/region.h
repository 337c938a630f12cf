/*
 * region.h - the per-container shared accounting region (region.c; layout in
 * include/vgpu_region.h): slots, devices, lock-free reservations, reaping of dead processes.
 */
#ifndef VGPU_REGION_H_INTERNAL
#define VGPU_REGION_H_INTERNAL

#include <stdint.h>
#include "vgpu_region.h"

extern vgpu_region_t *vgpu_region;
int vgpu_region_ensure(void);          /* 0 ok (shared or private fallback) */
/* (st_dev, st_ino) of the region file: the same for every process of the container, whatever
 * path it mapped it by; a random value for a private region. The card region's tenant key. */
uint64_t vgpu_region_key(void);
int vgpu_my_slot(void);                /* claims one on first use; -1 on failure */
/* Called by the reaper for a dead process's open compute slice (set by smlimit.c; may be NULL). */
extern void (*vgpu_dead_slice_hook)(int rdev, uint64_t slice_start_ns);
int vgpu_device_register(const char *uuid, int phys); /* region device index or -1 */
int vgpu_device_find(const char *uuid);
/* 1 when this process has resolved the container index of region device `rdev` (registered it). */
int vgpu_device_resolved(int rdev);
/* From now on every device memory limit of this process is 0 (one error line naming `why`): the
 * region the config file names cannot account for a device. */
void vgpu_region_fail_closed(const char *why);
/* The limit this process enforces on region device `rdev`, bytes: the region's (the container's),
 * capped by this process's own ceiling (config.h: vgpu_mem_cap_for). VGPU_UNLIMITED = none. */
uint64_t vgpu_device_limit(int rdev);
/* Reserve `bytes` on region device `rdev` for this process. 0 ok, -1 over the limit. */
int vgpu_reserve(int rdev, uint64_t bytes);
void vgpu_unreserve(int rdev, uint64_t bytes);
/* Module memory: like vgpu_reserve (limit checked) but counted in module[], not data[]. */
int vgpu_reserve_module(int rdev, uint64_t bytes);
void vgpu_unreserve_module(int rdev, uint64_t bytes);
/* Bytes this process holds on `rdev` (its own slot's used[]), 0 before it has a slot. */
uint64_t vgpu_my_usage(int rdev);
/* Context memory, kept apart in context[], limit checked: 0 ok, -1 over the limit (the caller
 * then destroys the context it just made). */
int vgpu_reserve_context(int rdev, uint64_t bytes);
void vgpu_uncharge_context(int rdev, uint64_t bytes);
/* Allocation memory that exists already (graph memory): into data[], without a limit check. */
void vgpu_charge_data(int rdev, uint64_t bytes);
uint64_t vgpu_device_usage(int rdev);  /* bytes held by all live processes */
int vgpu_reap_dead(int force);         /* number of slots reclaimed */
/* The region file's path, NULL for a private (per-process) region. */
const char *vgpu_region_file(void);
/* 1 when process `pid` (started at `start_time`, /proc/<pid>/stat field 22; 0 = unknown) is gone
 * or a zombie; never for this process. */
int vgpu_pid_dead(int32_t pid, uint64_t start_time);
/* pid in slot `slot` (0 free, -1 being reaped) and its start time. */
int32_t vgpu_slot_pid(int slot, uint64_t *start_time);
/* Adds allocation bytes to another process's slot (a shared allocation's charge moving to it),
 * without a limit check: the memory exists already. */
void vgpu_slot_charge(int slot, int rdev, uint64_t bytes);
/* The reverse: takes `bytes` out of `slot`'s used[]/data[] (clamped at 0). */
void vgpu_slot_uncharge(int slot, int rdev, uint64_t bytes);
/* `fn` is called with a slot about to be zeroed (its process exits or was found dead), once. */
void vgpu_region_on_release(void (*fn)(int slot, int32_t pid, uint64_t start_time));

#endif
