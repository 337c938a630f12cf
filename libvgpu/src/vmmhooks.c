/*
 * vmmhooks.c - the virtual memory management API (cuMemCreate, cuMemMap, ...) charged for as
 * long as the driver keeps the physical memory, not as long as the program holds the handle.
 *
 * Why: the documented idiom is create -> reserve a VA range -> map -> cuMemRelease the handle
 * at once; the memory stays allocated until its last mapping is unmapped (NCCL's cuMem path
 * and PyTorch's expandable segments do this). Giving the charge back at the release let a
 * tenant hold any amount of mapped memory uncharged. So each allocation handle carries
 *   refs: cuMemCreate / cuMemImportFromShareableHandle (1) + cuMemRetainAllocationHandle
 *         (which returns the same handle value) - cuMemRelease;
 *   maps: live cuMemMap mappings of it;
 * and its charge is given back when both reach 0, which is when the driver frees it.
 *
 * Imported handles (cuMemImportFromShareableHandle: memory another process allocated and
 * exported) are charged to the importer, at the extent it maps (offset + size; an import's size
 * is not visible before it is mapped), limit checked before the mapping is made. The exporter
 * stays charged for as long as it holds the memory itself; while both hold it the bytes count
 * twice, which is the price of not letting the exporter release its charge while an importer
 * keeps the memory alive.
 *
 * Sparse arrays: cuMemMapArrayAsync maps handles into an array's tiles, which keeps their memory
 * as a cuMemMap does; each such mapping lasts, for the accounting, until the array is destroyed
 * (an unmap operation names no handle, so it cannot be matched; the charge errs on the safe
 * side). An imported handle mapped only into arrays is not charged: the extent a tile mapping
 * reaches is not given in bytes.
 *
 * Multicast objects (NVLS): memory bound with cuMulticastBindMem / cuMulticastBindAddr stays
 * allocated while bound, so a binding counts as a mapping of its allocation until
 * cuMulticastUnbind, or until the multicast object itself is released and unmapped.
 *
 * cuMemAddressFree of a range that still holds mappings: the driver may unmap them (the memory
 * is then freed when released) or keep the memory; the device's free memory is measured across
 * the call and the charges of the mappings are given back only when the memory came back.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include "config.h"
#include "devmap.h"
#include "forkreg.h"
#include "log.h"
#include "measure.h"
#include "real.h"
#include "region.h"
#include "vmm.h"

typedef struct vmm {
    CUmemGenericAllocationHandle h;
    int rdev;
    int imported;
    uint64_t bytes; /* charged */
    int refs, maps;
    int inside; /* scratch for cuMemAddressFree */
    struct vmm *next;
    int multicast; /* a cuMulticastCreate object: memory bound to it stays until unbound or it goes */
} vmm_t;
typedef struct vmap {
    CUdeviceptr va;
    size_t size;
    vmm_t *a;
    struct vmap *next;
    uint64_t array; /* mapped into this sparse (mipmapped) array by cuMemMapArrayAsync; 0: at va */
} vmap_t;

/* Hashed by handle and by mapped address: PyTorch's expandable segments map thousands of
 * handles, and every map/unmap looks one up. Array mappings are rare and kept in a list. */
#define NB 4096
static vmm_t *allocs[NB];
static vmap_t *maps[NB];
static vmap_t *array_maps;
/* Memory bound to a multicast object (cuMulticastBindMem/BindAddr): kept, like a mapping, until
 * cuMulticastUnbind or until the multicast object is released and unmapped. */
typedef struct mbind {
    CUmemGenericAllocationHandle mc;
    size_t off;
    vmm_t *a;
    struct mbind *next;
} mbind_t;
static mbind_t *binds;
static unsigned hb(uint64_t k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 52) & (NB - 1); }
/* Held across the driver call of every hook here but cuMemCreate's: a handle value the driver
 * frees (inside cuMemRelease, under the lock until its record is gone) and hands out again cannot
 * be confused with the old one, and a map/unmap pair is never seen out of order. */
static pthread_mutex_t vmm_mu = PTHREAD_MUTEX_INITIALIZER;

static void vmm_after_fork(void) {
    pthread_mutex_init(&vmm_mu, NULL);
    for (int b = 0; b < NB; b++) {
        while (allocs[b]) { vmm_t *n = allocs[b]->next; free(allocs[b]); allocs[b] = n; }
        while (maps[b]) { vmap_t *n = maps[b]->next; free(maps[b]); maps[b] = n; }
    }
    while (array_maps) { vmap_t *n = array_maps->next; free(array_maps); array_maps = n; }
    while (binds) { mbind_t *n = binds->next; free(binds); binds = n; }
}
__attribute__((constructor)) static void vmm_register_fork(void) { vgpu_on_fork_child(vmm_after_fork); }

static vmm_t *find(CUmemGenericAllocationHandle h) {
    for (vmm_t *a = allocs[hb(h)]; a; a = a->next)
        if (a->h == h) return a;
    return NULL;
}

static void add_alloc(CUmemGenericAllocationHandle h, int rdev, uint64_t bytes, int imported) {
    vmm_t *a = malloc(sizeof *a);
    if (!a) return;
    *a = (vmm_t){h, rdev, imported, bytes, 1, 0, 0, allocs[hb(h)], 0};
    allocs[hb(h)] = a;
}

static void maybe_gone(vmm_t *a);

/* Caller holds vmm_mu: drops the bindings of multicast object `mc` whose offset lies in
 * [off, off + size) and, when dev_rdev >= 0, whose memory is on that device. */
static void unbind(CUmemGenericAllocationHandle mc, size_t off, size_t size, int dev_rdev) {
    for (mbind_t **pp = &binds, *b; (b = *pp);) {
        if (b->mc == mc && b->off >= off && b->off - off < size && (dev_rdev < 0 || b->a->rdev == dev_rdev)) {
            *pp = b->next;
            b->a->maps--;
            maybe_gone(b->a);
            free(b);
        } else {
            pp = &b->next;
        }
    }
}

/* Caller holds vmm_mu: gives the charge back and forgets `a` once the driver has freed it. */
static void maybe_gone(vmm_t *a) {
    if (a->refs > 0 || a->maps > 0) return;
    if (a->multicast) unbind(a->h, 0, SIZE_MAX, -1);
    vgpu_unreserve(a->rdev, a->bytes);
    VLOG(VLOG_DEBUG, "VMM allocation %#llx freed: %llu bytes given back", (unsigned long long)a->h,
         (unsigned long long)a->bytes);
    for (vmm_t **pp = &allocs[hb(a->h)]; *pp; pp = &(*pp)->next)
        if (*pp == a) { *pp = a->next; break; }
    free(a);
}

static void log_oom(int rdev, uint64_t bytes, const char *api) {
    if (!vgpu_region) return;
    VLOG(VLOG_WARN, "%s: out of memory on %s: %llu bytes requested, %llu in use, limit %llu", api,
         vgpu_region->devices[rdev].uuid, (unsigned long long)bytes,
         (unsigned long long)vgpu_device_usage(rdev), (unsigned long long)vgpu_region->devices[rdev].limit_bytes);
}

/* Only device-located physical memory is charged, to the device named in the properties
 * (not the calling thread's context: NCCL and expandable segments create from any thread). */
VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    if (vgpu_control_disabled() || !handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CALL_REAL(fn, cuMemCreate, handle, size, prop, flags);
    int rdev = vgpu_rdev_of_cuda(prop->location.id);
    if (rdev >= 0 && vgpu_reserve(rdev, size) != 0) {
        log_oom(rdev, size, "cuMemCreate");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* The driver call runs unlocked (a large create takes milliseconds): a handle value it hands
     * out again was freed inside a cuMemRelease that held the lock until its record was gone. */
    CUresult rc = CALL_REAL(fn, cuMemCreate, handle, size, prop, flags);
    if (rc != CUDA_SUCCESS) {
        if (rdev >= 0) vgpu_unreserve(rdev, size);
    } else if (rdev >= 0) {
        pthread_mutex_lock(&vmm_mu);
        add_alloc(*handle, rdev, size, 0);
        pthread_mutex_unlock(&vmm_mu);
    }
    return rc;
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle);
    if (vgpu_control_disabled()) return CALL_REAL(fn, cuMemRelease, h);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMemRelease, h);
    vmm_t *a = rc == CUDA_SUCCESS ? find(h) : NULL;
    if (a && a->refs > 0) {
        a->refs--;
        maybe_gone(a);
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

VGPU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle *, void *);
    if (vgpu_control_disabled() || !handle) return CALL_REAL(fn, cuMemRetainAllocationHandle, handle, addr);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMemRetainAllocationHandle, handle, addr);
    vmm_t *a = rc == CUDA_SUCCESS ? find(*handle) : NULL;
    if (a) a->refs++; /* the same handle again: one more cuMemRelease to come, no new memory */
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

VGPU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                              unsigned long long flags) {
    typedef CUresult (*fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    if (vgpu_control_disabled()) return CALL_REAL(fn, cuMemMap, ptr, size, offset, h, flags);
    pthread_mutex_lock(&vmm_mu);
    vmm_t *a = find(h);
    uint64_t grow = 0;
    if (a && a->imported && (uint64_t)offset + size > a->bytes) {
        /* an import is charged at the extent mapped, before the mapping exists */
        grow = (uint64_t)offset + size - a->bytes;
        if (vgpu_reserve(a->rdev, grow) != 0) {
            log_oom(a->rdev, grow, "cuMemMap");
            pthread_mutex_unlock(&vmm_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    CUresult rc = CALL_REAL(fn, cuMemMap, ptr, size, offset, h, flags);
    if (a) {
        vmap_t *m = rc == CUDA_SUCCESS ? malloc(sizeof *m) : NULL;
        if (rc != CUDA_SUCCESS) {
            if (grow) vgpu_unreserve(a->rdev, grow);
        } else {
            a->bytes += grow;
            a->maps++;
            if (m) {
                *m = (vmap_t){ptr, size, a, maps[hb(ptr)], 0};
                maps[hb(ptr)] = m;
            }
        }
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

/* Caller holds vmm_mu: forgets the mappings inside [ptr, ptr + size); their allocations lose a
 * mapping each (and their charge once the driver frees them) when `unmapped`, else they keep it
 * (the memory is still held: the charge stays until the process exits). */
static void drop_one(vmap_t **pp, int unmapped) {
    vmap_t *m = *pp;
    *pp = m->next;
    if (unmapped) {
        m->a->maps--;
        maybe_gone(m->a);
    }
    free(m);
}

static void drop_maps(CUdeviceptr ptr, size_t size, int unmapped) {
    /* mappings never overlap: one at ptr reaching past the range is the only one inside */
    for (vmap_t **pp = &maps[hb(ptr)]; *pp; pp = &(*pp)->next)
        if ((*pp)->va == ptr && (*pp)->size >= size) { drop_one(pp, unmapped); return; }
    for (int b = 0; b < NB; b++)
        for (vmap_t **pp = &maps[b]; *pp;) {
            if ((*pp)->va >= ptr && (*pp)->va - ptr < size) drop_one(pp, unmapped);
            else pp = &(*pp)->next;
        }
}

VGPU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    typedef CUresult (*fn)(CUdeviceptr, size_t);
    if (vgpu_control_disabled()) return CALL_REAL(fn, cuMemUnmap, ptr, size);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMemUnmap, ptr, size);
    if (rc == CUDA_SUCCESS) drop_maps(ptr, size, 1);
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

/* Bytes the driver would free if the mappings inside the range went away now. */
static uint64_t freed_by_unmapping(CUdeviceptr ptr, size_t size, int *any) {
    uint64_t bytes = 0;
    *any = 0;
    for (int pass = 0; pass < 3; pass++)
        for (int b = 0; b < NB; b++)
            for (vmap_t *m = maps[b]; m; m = m->next) {
                if (!(m->va >= ptr && m->va - ptr < size)) continue;
                *any = 1;
                if (pass == 0) m->a->inside++;
                else if (pass == 1 && m->a->inside == m->a->maps && m->a->refs == 0) {
                    bytes += m->a->bytes;
                    m->a->inside = -1; /* counted */
                } else if (pass == 2) m->a->inside = 0;
            }
    return bytes;
}

VGPU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    typedef CUresult (*fn)(CUdeviceptr, size_t);
    if (vgpu_control_disabled()) return CALL_REAL(fn, cuMemAddressFree, ptr, size);
    pthread_mutex_lock(&vmm_mu);
    int any = 0;
    uint64_t expect = freed_by_unmapping(ptr, size, &any), used0 = 0, used1 = 0;
    int measured = 0;
    if (any) {
        vgpu_measure_lock();
        measured = vgpu_device_used(&used0) == 0;
    }
    CUresult rc = CALL_REAL(fn, cuMemAddressFree, ptr, size);
    if (any) {
        measured = measured && vgpu_device_used(&used1) == 0;
        vgpu_measure_unlock();
        if (rc == CUDA_SUCCESS) {
            /* given back only when the card got the memory back; a VA range freed under live
             * mappings whose memory the driver keeps stays charged */
            int gave_back = measured && used0 >= used1 && used0 - used1 >= expect;
            if (!gave_back)
                VLOG(VLOG_WARN, "cuMemAddressFree of %#llx with live mappings: the memory stays charged",
                     (unsigned long long)ptr);
            drop_maps(ptr, size, gave_back);
        }
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

VGPU_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os,
                                                    CUmemAllocationHandleType type) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    typedef CUresult (*props_t)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
    if (vgpu_control_disabled() || !handle) return CALL_REAL(fn, cuMemImportFromShareableHandle, handle, os, type);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMemImportFromShareableHandle, handle, os, type);
    if (rc == CUDA_SUCCESS) {
        vmm_t *a = find(*handle);
        CUmemAllocationProp prop = {0};
        if (a) {
            a->refs++; /* our own export imported again: the same allocation */
        } else if (CALL_REAL(props_t, cuMemGetAllocationPropertiesFromHandle, &prop, *handle) == CUDA_SUCCESS &&
                   prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
            int rdev = vgpu_rdev_of_cuda(prop.location.id);
            if (rdev >= 0) add_alloc(*handle, rdev, 0, 1);
        }
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

VGPU_EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned int count, CUstream s) {
    typedef CUresult (*fn)(CUarrayMapInfo *, unsigned int, CUstream);
    if (vgpu_control_disabled() || !list) return CALL_REAL(fn, cuMemMapArrayAsync, list, count, s);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMemMapArrayAsync, list, count, s);
    if (rc == CUDA_SUCCESS) {
        for (unsigned i = 0; i < count; i++) {
            CUarrayMapInfo *mi = &list[i];
            if (mi->memOperationType != CU_MEM_OPERATION_TYPE_MAP || mi->memHandleType != CU_MEM_HANDLE_TYPE_GENERIC)
                continue;
            vmm_t *a = find(mi->memHandle.memHandle);
            vmap_t *m = a ? malloc(sizeof *m) : NULL;
            if (!m) continue;
            uint64_t arr = mi->resourceType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY ? (uint64_t)(uintptr_t)mi->resource.mipmap
                                                                                : (uint64_t)(uintptr_t)mi->resource.array;
            a->maps++;
            *m = (vmap_t){0, 0, a, array_maps, arr ? arr : 1};
            array_maps = m;
        }
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

void vgpu_vmm_array_gone(uint64_t array) {
    if (!array || !__atomic_load_n(&array_maps, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&vmm_mu);
    for (vmap_t **pp = &array_maps, *m; (m = *pp);) {
        if (m->array == array) {
            *pp = m->next;
            m->a->maps--;
            maybe_gone(m->a);
            free(m);
        } else {
            pp = &m->next;
        }
    }
    pthread_mutex_unlock(&vmm_mu);
}

/* ---------------- multicast objects (NVLS) ---------------- */

VGPU_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle *, const CUmulticastObjectProp *);
    CUresult rc = CALL_REAL(fn, cuMulticastCreate, mc, prop);
    if (rc != CUDA_SUCCESS || !mc || vgpu_control_disabled()) return rc;
    pthread_mutex_lock(&vmm_mu);
    add_alloc(*mc, -1, 0, 0); /* owns no memory of its own: what is bound to it is charged */
    vmm_t *a = find(*mc);
    if (a) a->multicast = 1;
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

static void add_bind(CUmemGenericAllocationHandle mc, size_t off, vmm_t *a) {
    mbind_t *b = a ? malloc(sizeof *b) : NULL;
    if (!b) return;
    a->maps++;
    *b = (mbind_t){mc, off, a, binds};
    binds = b;
}

VGPU_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mcOffset, CUmemGenericAllocationHandle mem,
                                        size_t memOffset, size_t size, unsigned long long flags) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle, size_t, CUmemGenericAllocationHandle, size_t, size_t,
                           unsigned long long);
    if (vgpu_control_disabled()) return CALL_REAL(fn, cuMulticastBindMem, mc, mcOffset, mem, memOffset, size, flags);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMulticastBindMem, mc, mcOffset, mem, memOffset, size, flags);
    if (rc == CUDA_SUCCESS) add_bind(mc, mcOffset, find(mem));
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

VGPU_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mcOffset, CUdeviceptr memptr, size_t size,
                                         unsigned long long flags) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t, unsigned long long);
    if (vgpu_control_disabled()) return CALL_REAL(fn, cuMulticastBindAddr, mc, mcOffset, memptr, size, flags);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMulticastBindAddr, mc, mcOffset, memptr, size, flags);
    if (rc == CUDA_SUCCESS) {
        vmm_t *a = NULL; /* the VMM allocation mapped at memptr (plain allocations keep their own charge) */
        for (int b = 0; b < NB && !a; b++)
            for (vmap_t *m = maps[b]; m && !a; m = m->next)
                if (memptr >= m->va && memptr - m->va < m->size) a = m->a;
        add_bind(mc, mcOffset, a);
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

VGPU_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mcOffset, size_t size) {
    typedef CUresult (*fn)(CUmemGenericAllocationHandle, CUdevice, size_t, size_t);
    if (vgpu_control_disabled()) return CALL_REAL(fn, cuMulticastUnbind, mc, dev, mcOffset, size);
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = CALL_REAL(fn, cuMulticastUnbind, mc, dev, mcOffset, size);
    if (rc == CUDA_SUCCESS) unbind(mc, mcOffset, size, vgpu_rdev_of_cuda((int)dev));
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}
