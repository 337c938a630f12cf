/*
 * ipchooks.c - memory another CUDA process allocated and this one maps: legacy IPC
 * (cuIpcGetMemHandle / cuIpcOpenMemHandle) and pool pointers (cuMemPoolImportPointer).
 *
 * Legacy IPC inside one container is charged once (ipcshare.c): the exporter registers the
 * allocation at cuIpcGetMemHandle, an import of it by another process of the container joins its
 * holders and pays nothing, and the charge stays with some holder until the last one lets go.
 * Any other import (from another container, or one the table cannot vouch for) is charged to the
 * importer for as long as it keeps the mapping, at the size of the allocation it maps
 * (cuMemGetAddressRange), limit checked before the caller sees the import; a charge that does not
 * fit closes the import again and answers CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Why the importer: the exporter's charge ends when it frees, but the memory lives on while an
 * importer keeps it mapped, so charging the exporter alone let a tenant hold memory uncharged
 * (export, import in a second process, free in the first). Pool pointers are still charged to
 * every importer: a pool keeps its own charge (pools.c) that does not follow one pointer, so
 * within a container they count once per process that maps them.
 */
#include <cuda.h>
#include <stdlib.h>
#include "alloctrack.h"
#include "config.h"
#include "devmap.h"
#include "ipcshare.h"
#include "log.h"
#include "real.h"
#include "region.h"

#undef cuIpcOpenMemHandle
#undef cuMemGetAddressRange

/* Region device and size of the allocation `p` belongs to; -1 when unknown. */
static int imported(CUdeviceptr p, uint64_t *bytes) {
    typedef CUresult (*range_t)(CUdeviceptr *, size_t *, CUdeviceptr);
    typedef CUresult (*attr_t)(void *, CUpointer_attribute, CUdeviceptr);
    CUdeviceptr base = 0;
    size_t size = 0;
    int ord = -1;
    if (CALL_REAL(range_t, cuMemGetAddressRange_v2, &base, &size, p) != CUDA_SUCCESS || !size) return -1;
    *bytes = size;
    if (CALL_REAL(attr_t, cuPointerGetAttribute, &ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS && ord >= 0)
        return vgpu_rdev_of_cuda(ord);
    return vgpu_current_rdev();
}

/* After a successful import of `p`: charge it, or undo the import with `undo` and answer OOM. */
static CUresult charge_import(CUdeviceptr p, const char *api, CUresult (*undo)(CUdeviceptr)) {
    uint64_t bytes = 0;
    int rdev = imported(p, &bytes);
    if (rdev < 0) return CUDA_SUCCESS;
    if (vgpu_reserve(rdev, bytes) != 0) {
        VLOG(VLOG_WARN, "%s: out of memory on %s: the import maps %llu bytes, %llu in use, limit %llu", api,
             vgpu_region->devices[rdev].uuid, (unsigned long long)bytes, (unsigned long long)vgpu_device_usage(rdev),
             (unsigned long long)vgpu_region->devices[rdev].limit_bytes);
        undo(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgpu_track_add(K_IPC, p, rdev, bytes);
    return CUDA_SUCCESS;
}

static CUresult real_ipc_close(CUdeviceptr p) { return CALL_REAL(CUresult(*)(CUdeviceptr), cuIpcCloseMemHandle, p); }
static CUresult real_free(CUdeviceptr p) { return CALL_REAL(CUresult(*)(CUdeviceptr), cuMemFree_v2, p); }

typedef CUresult (*ipc_open_t)(CUdeviceptr *, CUipcMemHandle, unsigned int);

/* Registers an allocation this process is charged for (its base, as cuMemAlloc returned it) in
 * the container's table, so that the container's importers do not pay for it again. */
VGPU_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    typedef CUresult (*fn)(CUipcMemHandle *, CUdeviceptr);
    typedef CUresult (*range_t)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult rc = CALL_REAL(fn, cuIpcGetMemHandle, h, p);
    if (rc != CUDA_SUCCESS || !h || vgpu_control_disabled()) return rc;
    CUdeviceptr base = 0;
    size_t size = 0;
    int rdev = -1;
    uint64_t bytes = 0;
    if (CALL_REAL(range_t, cuMemGetAddressRange_v2, &base, &size, p) == CUDA_SUCCESS &&
        vgpu_track_peek(K_PTR, base, &rdev, &bytes))
        vgpu_share_export(h->reserved, rdev, bytes, base);
    return rc;
}

static CUresult ipc_opened(CUdeviceptr p, const CUipcMemHandle *h, const char *api) {
    if (vgpu_share_join(h->reserved, p)) return CUDA_SUCCESS; /* this container's: charged once already */
    return charge_import(p, api, real_ipc_close);
}

VGPU_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    CUresult rc = CALL_REAL(ipc_open_t, cuIpcOpenMemHandle_v2, p, h, flags);
    if (rc != CUDA_SUCCESS || !p || vgpu_control_disabled()) return rc;
    return ipc_opened(*p, &h, "cuIpcOpenMemHandle_v2");
}

VGPU_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    CUresult rc = CALL_REAL(ipc_open_t, cuIpcOpenMemHandle, p, h, flags);
    if (rc != CUDA_SUCCESS || !p || vgpu_control_disabled()) return rc;
    return ipc_opened(*p, &h, "cuIpcOpenMemHandle");
}

VGPU_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    track_t *t = vgpu_control_disabled() ? NULL : vgpu_track_take(K_IPC, p);
    CUresult rc = real_ipc_close(p);
    if (!t && rc == CUDA_SUCCESS && !vgpu_control_disabled()) { /* a joined import: its charge if it carried it */
        int rdev = -1;
        uint64_t bytes = vgpu_share_leave(p, &rdev);
        if (bytes) vgpu_unreserve(rdev, bytes);
    }
    if (t) {
        if (rc == CUDA_SUCCESS) {
            vgpu_unreserve(t->rdev, t->bytes);
            free(t);
        } else {
            vgpu_track_put(t);
        }
    }
    return rc;
}

/* A pool pointer imported from another process is freed with cuMemFree(Async) like any
 * allocation: tracked as one (K_PTR), so those hooks give the charge back. */
VGPU_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, CUmemPoolPtrExportData *data) {
    typedef CUresult (*fn)(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *);
    CUresult rc = CALL_REAL(fn, cuMemPoolImportPointer, p, pool, data);
    if (rc != CUDA_SUCCESS || !p || vgpu_control_disabled()) return rc;
    uint64_t bytes = 0;
    int rdev = imported(*p, &bytes);
    if (rdev < 0) return rc;
    if (vgpu_reserve(rdev, bytes) != 0) {
        VLOG(VLOG_WARN, "cuMemPoolImportPointer: out of memory on %s: the import maps %llu bytes, limit %llu",
             vgpu_region->devices[rdev].uuid, (unsigned long long)bytes,
             (unsigned long long)vgpu_region->devices[rdev].limit_bytes);
        real_free(*p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgpu_track_add(K_PTR, *p, rdev, bytes);
    return rc;
}
