/* pools.h - stream-ordered pools and graph memory charged as the driver holds them (pools.c). */
#ifndef VGPU_POOLS_H
#define VGPU_POOLS_H

#include <stdint.h>

/* The pool cuMemAllocAsync uses on CUDA ordinal `cudev` (cached; 0 when unknown). */
uint64_t vgpu_device_pool(int cudev);
/* Charges an allocation of `bytes` from pool `handle` on `rdev` (the calling context's device;
 * a pool made by cuMemPoolCreate on a device is charged to that device instead): returns the
 * pool's index (>= 0; *grown = the bytes newly charged), -1 when charged per allocation (no pool
 * handle), -2 over the limit or the table full (nothing charged). */
int vgpu_pool_charge(int rdev, uint64_t handle, uint64_t bytes, uint64_t *grown);
void vgpu_pool_undo(int idx, uint64_t bytes, uint64_t grown); /* the driver refused the allocation */
void vgpu_pool_freed(int idx, uint64_t bytes);                 /* the pool keeps the memory */
void vgpu_pools_synced(void);                                 /* after a program synchronisation */
void vgpu_pool_trimmed(uint64_t pool, uint64_t keep);          /* cuMemPoolTrimTo succeeded */
void vgpu_pool_set_threshold(uint64_t pool, uint64_t threshold);
void vgpu_pool_set_current(int cudev, uint64_t pool);          /* cuDeviceSetMemPool succeeded */
void vgpu_pool_destroyed(uint64_t pool);
/* cuMemPoolCreate made `pool` on region device `rdev` (>= 0: a device-located pool). */
void vgpu_pool_created(uint64_t pool, int rdev);
/* Graph memory: re-reads the device's graph-pool reservation and charges the difference. */
void vgpu_graphmem_sample(int cudev);
void vgpu_graphmem_sample_current(void);
/* After a graph launch: vgpu_graphmem_sample_current at most every 10 ms. */
void vgpu_graphmem_after_launch(void);

#endif
