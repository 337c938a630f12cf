/*
 * pools.c - stream-ordered memory pools (cuMemAllocAsync, cuMemAllocFromPoolAsync) charged as
 * the driver holds their memory, not per allocation.
 *
 * Why: a pool keeps the memory of freed blocks reserved for reuse - up to its release
 * threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0) at each stream/event/context
 * synchronisation, and all of it until cuMemPoolTrimTo when the threshold is high (PyTorch's
 * cudaMallocAsync backend sets it to UINT64_MAX). Charging only live allocations would let
 * that retained memory, invisible to the counters, push the container past its limit (a
 * second process, or the same one through cuMemAlloc). So each pool is modelled:
 *   live  = bytes in live allocations from the pool;
 *   held  = bytes charged for the pool (>= live);
 *   alloc: live += n; if live > held, charge the difference (limit checked) and held = live;
 *   free:  live -= n (held unchanged: the pool keeps the memory);
 *   sync (cuCtxSynchronize, cuStreamSynchronize*, cuEventSynchronize): held = max(live,
 *          min(held, threshold)); cuMemPoolTrimTo(pool, keep): held = max(live, min(held, keep)).
 * A reuse within what the pool holds needs no new charge, as on the card. The model ignores the
 * pool's own rounding (it reserves in 2 MiB-or-larger chunks) and what the driver may release
 * without a synchronisation. The table holds POOL_MAX pools at once (a destroyed pool's entry is
 * reused once its last allocation is freed); an allocation from a pool beyond them is refused
 * (CUDA_ERROR_OUT_OF_MEMORY, one error line). Charging those per allocation instead let a tenant
 * that made enough pools keep every freed block in them uncharged: each pool retained the limit's
 * worth while the counters said 0.
 *
 * Graph memory (memory-allocation nodes, cudaMallocAsync captured into a graph) lives in a
 * per-device graph pool that the driver reserves when a graph is uploaded or launched and
 * keeps until cuDeviceGraphMemTrim. Its size is read (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
 * after cuGraphUpload, after cuGraphLaunch at most every 10 ms, and after cuDeviceGraphMemTrim,
 * and charged into data[] without a limit check (the memory exists by then); later
 * allocations see it.
 */
#include <stdatomic.h>
#include <cuda.h>
#undef cuGraphUpload
#include <pthread.h>
#include <string.h>
#include "config.h"
#include "devmap.h"
#include "forkreg.h"
#include "log.h"
#include "pools.h"
#include "real.h"
#include "region.h"
#define POOL_MAX 1024
#define DEV_MAX MAX_ORD

typedef struct {
    uint64_t handle;
    int rdev;
    uint64_t live, held, threshold;
    int destroyed; /* cuMemPoolDestroy seen: the entry is freed with the last live allocation */
} pool_t;

static pool_t pools[POOL_MAX];
static int npools;
static void *current_pool[DEV_MAX]; /* CUDA ordinal -> the pool cuMemAllocAsync uses; NULL = ask */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int pools_excess; /* some pool holds more than live + threshold: settle at sync */
static uint64_t graph_charged[DEV_MAX]; /* CUDA ordinal -> graph-pool bytes charged */
static _Atomic uint64_t graph_next_sample_ns;

static void pools_after_fork(void) {
    pthread_mutex_init(&pool_mu, NULL);
    memset(pools, 0, sizeof pools);
    memset(current_pool, 0, sizeof current_pool);
    npools = 0;
    atomic_store(&pools_excess, 0);
    memset(graph_charged, 0, sizeof graph_charged);
    atomic_store(&graph_next_sample_ns, 0);
}

/* Caller holds pool_mu. Index of `handle` (never 0); -1 if absent. */
static int pool_find(uint64_t handle) {
    for (int i = 0; i < npools; i++)
        if (pools[i].handle == handle) return i;
    return -1;
}

/* Caller holds pool_mu. Index of `handle`, recorded (device `rdev`, -1 = learnt later) when new,
 * in a freed entry or a new one; -1 when the table is full. */
static int pool_record(uint64_t handle, int rdev) {
    int i = pool_find(handle);
    if (i >= 0) return i;
    i = pool_find(0);
    if (i < 0 && npools < POOL_MAX) i = npools++;
    if (i >= 0) pools[i] = (pool_t){handle, rdev, 0, 0, 0, 0};
    return i;
}

/* Caller holds pool_mu. A destroyed pool's entry is freed once nothing live refers to it. */
static void maybe_forget(pool_t *p) {
    if (p->destroyed && p->live == 0) memset(p, 0, sizeof *p);
}

uint64_t vgpu_device_pool(int cudev) {
    if (cudev < 0 || cudev >= DEV_MAX) return 0;
    void *p = __atomic_load_n(&current_pool[cudev], __ATOMIC_ACQUIRE);
    if (VGPU_LIKELY(p != NULL)) return (uint64_t)(uintptr_t)p;
    CUmemoryPool pool = NULL;
    if (CALL_REAL(CUresult(*)(CUmemoryPool *, CUdevice), cuDeviceGetMemPool, &pool, cudev) != CUDA_SUCCESS)
        return 0;
    __atomic_store_n(&current_pool[cudev], (void *)pool, __ATOMIC_RELEASE);
    return (uint64_t)(uintptr_t)pool;
}

/* Caller holds pool_mu. */
static void settle(pool_t *p, uint64_t keep) {
    uint64_t target = keep < p->held ? keep : p->held;
    if (target < p->live) target = p->live;
    if (p->held > target) {
        vgpu_unreserve(p->rdev, p->held - target);
        p->held = target;
    }
}

int vgpu_pool_charge(int rdev, uint64_t handle, uint64_t bytes, uint64_t *grown) {
    *grown = 0;
    if (!handle) return vgpu_reserve(rdev, bytes) == 0 ? -1 : -2;
    pthread_mutex_lock(&pool_mu);
    int i = pool_record(handle, rdev);
    if (i < 0) {
        pthread_mutex_unlock(&pool_mu);
        static int logged;
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            VLOG(VLOG_ERROR, "more than %d memory pools in use: allocations from further pools are refused", POOL_MAX);
        return -2;
    }
    pool_t *p = &pools[i];
    if (p->rdev < 0) p->rdev = rdev; /* first seen through cuMemPoolSetAttribute */
    /* p->rdev is the pool's own device when cuMemPoolCreate told us (vgpu_pool_created): the driver
     * takes the memory there, whichever device the calling context is on. */
    uint64_t live = p->live + bytes, grow = live > p->held ? live - p->held : 0;
    if (grow && vgpu_reserve(p->rdev, grow) != 0) {
        pthread_mutex_unlock(&pool_mu);
        return -2;
    }
    p->live = live;
    p->held += grow;
    *grown = grow;
    pthread_mutex_unlock(&pool_mu);
    return i;
}

void vgpu_pool_undo(int idx, uint64_t bytes, uint64_t grown) {
    if (idx < 0 || idx >= POOL_MAX) return;
    pthread_mutex_lock(&pool_mu);
    pool_t *p = &pools[idx];
    p->live = p->live >= bytes ? p->live - bytes : 0;
    p->held = p->held >= grown ? p->held - grown : 0;
    vgpu_unreserve(p->rdev, grown);
    maybe_forget(p);
    pthread_mutex_unlock(&pool_mu);
}

void vgpu_pool_freed(int idx, uint64_t bytes) {
    if (idx < 0 || idx >= POOL_MAX) return;
    pthread_mutex_lock(&pool_mu);
    pool_t *p = &pools[idx];
    p->live = p->live >= bytes ? p->live - bytes : 0;
    if (p->destroyed) settle(p, 0); /* a destroyed pool keeps nothing beyond its live blocks */
    else if (p->held > p->live && p->held - p->live > p->threshold) atomic_store(&pools_excess, 1);
    maybe_forget(p);
    pthread_mutex_unlock(&pool_mu);
}

void vgpu_pools_synced(void) {
    if (VGPU_LIKELY(!atomic_load_explicit(&pools_excess, memory_order_relaxed))) return;
    pthread_mutex_lock(&pool_mu);
    atomic_store(&pools_excess, 0);
    for (int i = 0; i < npools; i++) settle(&pools[i], pools[i].live + pools[i].threshold);
    pthread_mutex_unlock(&pool_mu);
}

void vgpu_pool_trimmed(uint64_t pool, uint64_t keep) {
    pthread_mutex_lock(&pool_mu);
    int i = pool ? pool_find(pool) : -1;
    if (i >= 0) settle(&pools[i], keep);
    pthread_mutex_unlock(&pool_mu);
}

void vgpu_pool_set_threshold(uint64_t pool, uint64_t threshold) {
    pthread_mutex_lock(&pool_mu);
    /* A pool we have not seen yet is recorded now; its device is learnt at the first allocation. */
    int i = pool ? pool_record(pool, -1) : -1;
    if (i >= 0) pools[i].threshold = threshold;
    pthread_mutex_unlock(&pool_mu);
}

void vgpu_pool_set_current(int cudev, uint64_t pool) {
    if (cudev >= 0 && cudev < DEV_MAX) __atomic_store_n(&current_pool[cudev], (void *)(uintptr_t)pool, __ATOMIC_RELEASE);
}

void vgpu_pool_created(uint64_t pool, int rdev) {
    if (!pool || rdev < 0) return;
    pthread_mutex_lock(&pool_mu);
    int i = pool_record(pool, rdev);
    if (i >= 0 && pools[i].live == 0 && pools[i].held == 0) pools[i].rdev = rdev;
    pthread_mutex_unlock(&pool_mu);
}

/* A destroyed pool gives back what it held beyond its live allocations (which stay valid
 * until freed, and are still counted). */
void vgpu_pool_destroyed(uint64_t pool) {
    pthread_mutex_lock(&pool_mu);
    int i = pool ? pool_find(pool) : -1;
    if (i >= 0) {
        settle(&pools[i], 0);
        pools[i].threshold = 0;
        pools[i].destroyed = 1;
        maybe_forget(&pools[i]);
    }
    pthread_mutex_unlock(&pool_mu);
}

/* ---------------- graph memory ---------------- */

void vgpu_graphmem_sample(int dev) {
    typedef CUresult (*attr_t)(CUdevice, CUgraphMem_attribute, void *);
    cuuint64_t v = 0;
    if (dev < 0 || dev >= DEV_MAX || vgpu_control_disabled()) return;
    if (CALL_REAL(attr_t, cuDeviceGetGraphMemAttribute, dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v) !=
        CUDA_SUCCESS)
        return;
    pthread_mutex_lock(&pool_mu);
    uint64_t old = graph_charged[dev];
    if (v != old) {
        int rdev = vgpu_rdev_of_cuda((int)dev);
        if (rdev >= 0) {
            if (v > old) vgpu_charge_data(rdev, v - old);
            else vgpu_unreserve(rdev, old - v);
            graph_charged[dev] = v;
            VLOG(VLOG_DEBUG, "graph memory on device %d: %llu bytes", (int)dev, (unsigned long long)v);
        }
    }
    pthread_mutex_unlock(&pool_mu);
}

void vgpu_graphmem_sample_current(void) {
    CUdevice d;
    if (CALL_REAL(CUresult(*)(CUdevice *), cuCtxGetDevice, &d) == CUDA_SUCCESS) vgpu_graphmem_sample((int)d);
}

void vgpu_graphmem_after_launch(void) {
    uint64_t now = vgpu_now_ns(), next = atomic_load_explicit(&graph_next_sample_ns, memory_order_relaxed);
    if (VGPU_LIKELY(now < next)) return;
    atomic_store_explicit(&graph_next_sample_ns, now + 10000000ull, memory_order_relaxed);
    vgpu_graphmem_sample_current();
}

__attribute__((constructor)) static void pools_register_fork(void) { vgpu_on_fork_child(pools_after_fork); }
