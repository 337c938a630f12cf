/*
 * poolhooks.c - the pool and graph-memory entry points that make a pool or change what a pool or
 * the graph pool holds; the model lives in pools.c.
 */
#include <cuda.h>
#undef cuGraphUpload
#include "config.h"
#include "devmap.h"
#include "graphmem.h"
#include "pools.h"
#include "real.h"

/* A pool made on a device takes its memory there: remember which, so that an allocation from it
 * made while another device's context is current is charged to the pool's device (charged to the
 * caller's, a container with two cards could fill one card past its limit from the other's). */
VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CUresult rc = CALL_REAL(CUresult(*)(CUmemoryPool *, const CUmemPoolProps *), cuMemPoolCreate, pool, props);
    if (rc == CUDA_SUCCESS && pool && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        !vgpu_control_disabled())
        vgpu_pool_created((uint64_t)(uintptr_t)*pool, vgpu_rdev_of_cuda(props->location.id));
    return rc;
}

VGPU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    CUresult rc = CALL_REAL(CUresult(*)(CUmemoryPool, size_t), cuMemPoolTrimTo, pool, keep);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) vgpu_pool_trimmed((uint64_t)(uintptr_t)pool, keep);
    return rc;
}

VGPU_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult rc = CALL_REAL(CUresult(*)(CUmemoryPool, CUmemPool_attribute, void *), cuMemPoolSetAttribute, pool,
                            attr, value);
    if (rc == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && value && !vgpu_control_disabled())
        vgpu_pool_set_threshold((uint64_t)(uintptr_t)pool, *(cuuint64_t *)value);
    return rc;
}

VGPU_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice, CUmemoryPool), cuDeviceSetMemPool, dev, pool);
    if (rc == CUDA_SUCCESS) vgpu_pool_set_current((int)dev, (uint64_t)(uintptr_t)pool);
    return rc;
}

VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CUresult rc = CALL_REAL(CUresult(*)(CUmemoryPool), cuMemPoolDestroy, pool);
    if (rc == CUDA_SUCCESS && !vgpu_control_disabled()) vgpu_pool_destroyed((uint64_t)(uintptr_t)pool);
    return rc;
}

VGPU_EXPORT CUresult cuGraphUpload(CUgraphExec g, CUstream s) {
    uint64_t pre[GRAPHMEM_DEVS];
    int mem = vgpu_graph_begin((uint64_t)(uintptr_t)g, pre, "cuGraphUpload");
    if (mem < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(CUresult(*)(CUgraphExec, CUstream), cuGraphUpload, g, s);
    if (mem) vgpu_graph_end(pre);
    if (rc == CUDA_SUCCESS) vgpu_graphmem_sample_current();
    return rc;
}

VGPU_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec g, CUstream s) {
    uint64_t pre[GRAPHMEM_DEVS];
    int mem = vgpu_graph_begin((uint64_t)(uintptr_t)g, pre, "cuGraphUpload_ptsz");
    if (mem < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL_REAL(CUresult(*)(CUgraphExec, CUstream), cuGraphUpload_ptsz, g, s);
    if (mem) vgpu_graph_end(pre);
    if (rc == CUDA_SUCCESS) vgpu_graphmem_sample_current();
    return rc;
}

VGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    CUresult rc = CALL_REAL(CUresult(*)(CUdevice), cuDeviceGraphMemTrim, dev);
    if (rc == CUDA_SUCCESS) vgpu_graphmem_sample((int)dev);
    return rc;
}
