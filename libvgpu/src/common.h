/*
 * common.h - internal declarations shared by the libvgpu sources.
 * Everything here has hidden visibility; only hooks marked VGPU_EXPORT leave the .so.
 */
#ifndef VGPU_COMMON_H
#define VGPU_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include "vgpu_region.h"

#define VGPU_EXPORT __attribute__((visibility("default")))
#define VGPU_LIKELY(x) __builtin_expect(!!(x), 1)
#define VGPU_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- log.c ---- */
enum { VLOG_ERROR = 1, VLOG_WARN = 2, VLOG_INFO = 3, VLOG_DEBUG = 4 };
extern int vgpu_log_level;
void vgpu_log_init(void);
void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define VLOG(lvl, ...) do { if (VGPU_UNLIKELY(vgpu_log_level >= (lvl))) vgpu_log((lvl), __VA_ARGS__); } while (0)

/* ---- config.c ---- */
/* Parses a memory size: digits with an optional binary suffix k/m/g/t or Ki/Mi/Gi/Ti.
 * Returns 0 and the byte count in *out, or -1 when malformed or overflowing. */
int vgpu_parse_size(const char *s, uint64_t *out);
/* Parses an SM percentage 0..100 (decimal). Returns 0 or -1. */
int vgpu_parse_percent(const char *s, uint32_t *out);
/* Byte limit for the container device index `phys`: VGPU_UNLIMITED, or the limit;
 * a malformed value yields 0 (fail closed) and one error line. */
uint64_t vgpu_mem_limit_for(int phys);
/* SM percent for `phys`: 100 = no limit. Malformed -> 1 (fail closed). */
uint32_t vgpu_sm_limit_for(int phys);
/* CUDA_DISABLE_CONTROL: 1 when enforcement is off. */
int vgpu_control_disabled(void);
enum { SM_POLICY_DEFAULT = 0, SM_POLICY_FORCE = 1, SM_POLICY_DISABLE = 2 };
int vgpu_sm_policy(void);
int vgpu_sm_idle_mode(void);
int vgpu_task_priority(void);

/* ---- real.c: the real driver and NVML ---- */
void *vgpu_real_dlsym(void *handle, const char *name);
void *vgpu_cuda_handle(void);
void *vgpu_nvml_handle(void); /* NULL when libnvidia-ml.so.1 is absent */
/* Real function of libcuda/libnvidia-ml by exact symbol name, cached; NULL if absent. */
void *vgpu_real_cuda(const char *name);
void *vgpu_real_nvml(const char *name);
/* The hook exported under `name` (CUDA or NVML), or NULL when we do not hook it. */
void *vgpu_hook_for(const char *name);
/* The hook that wraps exactly the real function `real_fn`, or NULL. */
void *vgpu_hook_for_real(void *real_fn);

/* ---- region.c ---- */
extern vgpu_region_t *vgpu_region;
int vgpu_region_ensure(void);          /* 0 ok (shared or private fallback) */
int vgpu_my_slot(void);                /* claims one on first use; -1 on failure */
int vgpu_device_register(const char *uuid, int phys); /* region device index or -1 */
int vgpu_device_find(const char *uuid);
/* Reserve `bytes` on region device `rdev` for this process. 0 ok, -1 over the limit. */
int vgpu_reserve(int rdev, uint64_t bytes);
void vgpu_unreserve(int rdev, uint64_t bytes);
/* Module memory: like vgpu_reserve (limit checked) but counted in module[], not data[]. */
int vgpu_reserve_module(int rdev, uint64_t bytes);
void vgpu_unreserve_module(int rdev, uint64_t bytes);
/* Bytes this process holds on `rdev` (its own slot's used[]), 0 before it has a slot. */
uint64_t vgpu_my_usage(int rdev);
/* Context memory: charged without a limit check (the context exists already), kept apart. */
void vgpu_charge_context(int rdev, uint64_t bytes);
void vgpu_uncharge_context(int rdev, uint64_t bytes);
/* Allocation memory that exists already (graph memory): into data[], without a limit check. */
void vgpu_charge_data(int rdev, uint64_t bytes);
uint64_t vgpu_device_usage(int rdev);  /* bytes held by all live processes */
int vgpu_reap_dead(int force);         /* number of slots reclaimed */
uint64_t vgpu_now_ns(void);

/* ---- memhooks.c ---- */
/* Region device index of CUDA ordinal `cudev`, registering it on first use; -1 on failure. */
int vgpu_rdev_of_cuda(int cudev);
int vgpu_current_rdev(void);
void vgpu_track_reset_after_fork(void);
/* Context memory measured around a driver call that creates a context (NVML): begin before
 * the call, end after it; end returns the bytes to charge (0 when it cannot tell). */
typedef struct { void *h; int self_ok, dev_ok; uint64_t self0, dev0, mine0, cont0; } vgpu_measure_t;
void vgpu_ctx_measure_begin(int rdev, vgpu_measure_t *m);
uint64_t vgpu_ctx_measure_end(int rdev, vgpu_measure_t *m);
/* (after - before) - (acct_after - acct_before), signed, clamped at 0: physical growth across a
 * driver call less what we accounted meanwhile. */
uint64_t vgpu_growth(uint64_t before, uint64_t after, uint64_t acct_before, uint64_t acct_after);

/* ---- ctxmod.c: cuCtxCreate contexts and module images ---- */
/* A context went away (destroyed, or the primary context released/reset): the driver freed
 * its modules, so their charges are given back. */
void vgpu_modules_drop_ctx(void *ctx);
/* One measured driver call (context creation, module load) at a time per process. */
void vgpu_measure_lock(void);
void vgpu_measure_unlock(void);
void vgpu_ctxmod_reset_after_fork(void);

/* ---- pools.c: stream-ordered pools charged as the driver holds their memory ---- */
/* The pool cuMemAllocAsync uses on CUDA ordinal `cudev` (cached; 0 when unknown). */
uint64_t vgpu_device_pool(int cudev);
/* Charges an allocation of `bytes` from pool `handle` on `rdev`: returns the pool's index
 * (>= 0; *grown = the bytes newly charged), -1 when charged per allocation (no pool handle,
 * table full), -2 over the limit (nothing charged). */
int vgpu_pool_charge(int rdev, uint64_t handle, uint64_t bytes, uint64_t *grown);
void vgpu_pool_undo(int idx, uint64_t bytes, uint64_t grown); /* the driver refused the allocation */
void vgpu_pool_freed(int idx, uint64_t bytes);                 /* the pool keeps the memory */
void vgpu_pools_synced(void);                                 /* after a program synchronisation */
void vgpu_pools_reset_after_fork(void);
/* After a graph launch: re-reads the device's graph-memory reservation (at most every 10 ms). */
void vgpu_graphmem_after_launch(void);

/* ---- smlimit.c ---- */
void vgpu_sm_before_launch(void *stream);

#endif
