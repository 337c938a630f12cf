/*
 * graphmem.c - graph memory checked against the limit before the driver allocates it
 * (graphmem.h).
 *
 * Why: the memory of a graph's memory-allocation nodes (cuGraphAddMemAllocNode, cuGraphAddNode,
 * cudaMallocAsync captured during stream capture, the same nodes inside child graphs) is taken
 * by the driver in the device's graph pool at the first cuGraphUpload / cuGraphLaunch of an
 * instantiation, with no allocation call we could refuse. Sampling the pool after the launch
 * (pools.c) charges it, but only once it exists: a 6 GiB node was held under a 2 GiB limit.
 *
 * So at instantiation the graph is walked (every node; child graphs recursively) and the bytes
 * of its allocation nodes summed per device: the instantiation's footprint (an upper bound:
 * the driver may let nodes of one graph share memory). An instantiation whose footprint cannot
 * fit beside what the container holds - less what the graph pool already has free for reuse
 * (reserved - used) - is refused with CUDA_ERROR_OUT_OF_MEMORY before the driver instantiates
 * it. Each upload or launch of an instantiation with a footprint reserves what the pool may
 * have to grow by (limit checked, OOM before the driver is called), then the pool is sampled
 * (the charge follows what the driver really reserved) and the reservation is released.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "config.h"
#include "devmap.h"
#include "forkreg.h"
#include "graphmem.h"
#include "log.h"
#include "pools.h"
#include "real.h"
#include "region.h"

#define EXEC_MAX 256

typedef struct {
    uint64_t exec;
    uint64_t bytes[GRAPHMEM_DEVS]; /* by CUDA ordinal */
} gexec_t;

static gexec_t execs[EXEC_MAX];
static _Atomic int nexecs; /* entries in use: 0 keeps every launch of a graph without memory nodes at one load */
static pthread_mutex_t gm_mu = PTHREAD_MUTEX_INITIALIZER;

static void gm_after_fork(void) {
    pthread_mutex_init(&gm_mu, NULL);
    atomic_store(&nexecs, 0);
}
__attribute__((constructor)) static void gm_register_fork(void) { vgpu_on_fork_child(gm_after_fork); }

static void walk(CUgraph g, uint64_t *bytes, int depth) {
    typedef CUresult (*nodes_t)(CUgraph, CUgraphNode *, size_t *);
    typedef CUresult (*type_t)(CUgraphNode, CUgraphNodeType *);
    typedef CUresult (*params_t)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *);
    typedef CUresult (*child_t)(CUgraphNode, CUgraph *);
    size_t n = 0;
    if (!g || depth > 16 || CALL_REAL(nodes_t, cuGraphGetNodes, g, NULL, &n) != CUDA_SUCCESS || !n) return;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes) return;
    if (CALL_REAL(nodes_t, cuGraphGetNodes, g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            CUgraphNodeType t;
            if (CALL_REAL(type_t, cuGraphNodeGetType, nodes[i], &t) != CUDA_SUCCESS) continue;
            if (t == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
                CUDA_MEM_ALLOC_NODE_PARAMS p = {0};
                if (CALL_REAL(params_t, cuGraphMemAllocNodeGetParams, nodes[i], &p) == CUDA_SUCCESS &&
                    p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE && p.poolProps.location.id >= 0 &&
                    p.poolProps.location.id < GRAPHMEM_DEVS)
                    bytes[p.poolProps.location.id] += p.bytesize;
            } else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
                CUgraph child = NULL;
                if (CALL_REAL(child_t, cuGraphChildGraphNodeGetGraph, nodes[i], &child) == CUDA_SUCCESS)
                    walk(child, bytes, depth + 1);
            }
        }
    }
    free(nodes);
}

/* What the graph pool of `dev` has reserved but not in use: room a launch reuses first. */
static uint64_t pool_spare(int dev) {
    typedef CUresult (*attr_t)(CUdevice, CUgraphMem_attribute, void *);
    cuuint64_t reserved = 0, used = 0;
    if (CALL_REAL(attr_t, cuDeviceGetGraphMemAttribute, dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
            CUDA_SUCCESS ||
        CALL_REAL(attr_t, cuDeviceGetGraphMemAttribute, dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS)
        return 0;
    return reserved > used ? reserved - used : 0;
}

/* Reserves, per device, what a launch needing `bytes` may add to the graph pool. 0, or -1
 * (nothing left reserved) when one does not fit. */
static int reserve_need(const uint64_t *bytes, uint64_t *pre, const char *api) {
    for (int d = 0; d < GRAPHMEM_DEVS; d++) {
        pre[d] = 0;
        if (!bytes[d]) continue;
        int rdev = vgpu_rdev_of_cuda(d);
        if (rdev < 0) continue;
        uint64_t spare = pool_spare(d), need = bytes[d] > spare ? bytes[d] - spare : 0;
        if (!need) continue;
        if (vgpu_reserve(rdev, need) != 0) {
            VLOG(VLOG_WARN, "%s: out of memory on %s: the graph's memory nodes need %llu bytes, %llu in use, limit %llu",
                 api, vgpu_region->devices[rdev].uuid, (unsigned long long)need,
                 (unsigned long long)vgpu_device_usage(rdev),
                 (unsigned long long)vgpu_region->devices[rdev].limit_bytes);
            for (int e = 0; e < d; e++)
                if (pre[e]) vgpu_unreserve(vgpu_rdev_of_cuda(e), pre[e]);
            return -1;
        }
        pre[d] = need;
    }
    return 0;
}

static void release_pre(const uint64_t *pre) {
    for (int d = 0; d < GRAPHMEM_DEVS; d++)
        if (pre[d]) vgpu_unreserve(vgpu_rdev_of_cuda(d), pre[d]);
}

int vgpu_graph_footprint(CUgraph g, uint64_t *bytes) {
    int any = 0;
    for (int d = 0; d < GRAPHMEM_DEVS; d++) bytes[d] = 0;
    if (vgpu_control_disabled()) return 0;
    walk(g, bytes, 0);
    for (int d = 0; d < GRAPHMEM_DEVS; d++) any |= bytes[d] != 0;
    return any;
}

int vgpu_graph_fits(const uint64_t *bytes, const char *api) {
    uint64_t pre[GRAPHMEM_DEVS];
    if (reserve_need(bytes, pre, api) != 0) return -1;
    release_pre(pre);
    return 0;
}

void vgpu_graph_exec_add(uint64_t exec, const uint64_t *bytes) {
    pthread_mutex_lock(&gm_mu);
    int n = atomic_load(&nexecs);
    if (n < EXEC_MAX) {
        execs[n].exec = exec;
        for (int d = 0; d < GRAPHMEM_DEVS; d++) execs[n].bytes[d] = bytes[d];
        atomic_store(&nexecs, n + 1);
    } else {
        VLOG(VLOG_WARN, "more than %d graph instantiations with memory nodes: the rest are charged after launch only",
             EXEC_MAX);
    }
    pthread_mutex_unlock(&gm_mu);
}

void vgpu_graph_exec_remove(uint64_t exec) {
    if (!atomic_load_explicit(&nexecs, memory_order_relaxed)) return;
    pthread_mutex_lock(&gm_mu);
    int n = atomic_load(&nexecs);
    for (int i = 0; i < n; i++)
        if (execs[i].exec == exec) {
            execs[i] = execs[n - 1];
            atomic_store(&nexecs, n - 1);
            break;
        }
    pthread_mutex_unlock(&gm_mu);
}

int vgpu_graph_begin(uint64_t exec, uint64_t *pre, const char *api) {
    uint64_t bytes[GRAPHMEM_DEVS];
    int found = 0;
    if (VGPU_LIKELY(!atomic_load_explicit(&nexecs, memory_order_relaxed))) return 0;
    pthread_mutex_lock(&gm_mu);
    int n = atomic_load(&nexecs);
    for (int i = 0; i < n && !found; i++)
        if (execs[i].exec == exec) {
            for (int d = 0; d < GRAPHMEM_DEVS; d++) bytes[d] = execs[i].bytes[d];
            found = 1;
        }
    pthread_mutex_unlock(&gm_mu);
    if (!found) return 0;
    return reserve_need(bytes, pre, api) == 0 ? 1 : -1;
}

void vgpu_graph_end(const uint64_t *pre) {
    release_pre(pre);
    for (int d = 0; d < GRAPHMEM_DEVS; d++)
        if (pre[d]) vgpu_graphmem_sample(d); /* the charge follows what the driver reserved */
}
