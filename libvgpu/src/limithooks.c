/*
 * limithooks.c - cuCtxSetLimit: the memory a context limit makes the driver reserve is charged
 * (into data[], limit checked) before the driver reserves it, and follows the limit down.
 *
 * Why: the device malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE), the printf FIFO and the per-thread
 * stack are device memory the driver takes for the context, outside every allocation call: a
 * tenant setting a 6 GiB heap held 6 GiB uncharged. What each costs:
 *   heap, printf FIFO: the value in bytes;
 *   stack: the value x multiprocessors x resident threads per multiprocessor (the driver keeps
 *          a stack for every thread that can be resident: 1 KiB is 264 MiB on an H200);
 *   device-runtime limits (sync depth, pending launch count): sized by the driver only, so
 *          measured as the growth of the device's used memory across the call.
 * The charge is the cost of the new value less the cost of the value the context had before
 * its first cuCtxSetLimit of that limit (the driver's default, already inside the measured
 * context size), never below 0. Raising it reserves the difference first and refuses with
 * CUDA_ERROR_OUT_OF_MEMORY (the error cuCtxSetLimit documents) when it does not fit; lowering
 * gives the difference back once the driver accepted it; destroying, resetting or releasing
 * the context for the last time gives it all back (owned.c, with the context's modules).
 */
#include <cuda.h>
#include "config.h"
#include "devmap.h"
#include "log.h"
#include "measure.h"
#include "owned.h"
#include "real.h"
#include "region.h"

typedef CUresult (*getlimit_t)(size_t *, CUlimit);
typedef CUresult (*setlimit_t)(CUlimit, size_t);

/* Bytes the driver reserves for `value` of a computed limit; -1 for the measured ones. */
static int cost(CUlimit l, uint64_t value, uint64_t *bytes) {
    typedef CUresult (*attr_t)(int *, CUdevice_attribute, CUdevice);
    if (l == CU_LIMIT_MALLOC_HEAP_SIZE || l == CU_LIMIT_PRINTF_FIFO_SIZE) {
        *bytes = value;
        return 0;
    }
    if (l == CU_LIMIT_STACK_SIZE) {
        CUdevice d;
        int sms = 0, threads = 0;
        if (CALL_REAL(CUresult(*)(CUdevice *), cuCtxGetDevice, &d) != CUDA_SUCCESS ||
            CALL_REAL(attr_t, cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d) != CUDA_SUCCESS ||
            CALL_REAL(attr_t, cuDeviceGetAttribute, &threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, d) !=
                CUDA_SUCCESS)
            return -1;
        *bytes = value * (uint64_t)(sms > 0 ? sms : 0) * (uint64_t)(threads > 0 ? threads : 0);
        return 0;
    }
    return -1;
}

static int takes_memory(CUlimit l) {
    return l == CU_LIMIT_STACK_SIZE || l == CU_LIMIT_PRINTF_FIFO_SIZE || l == CU_LIMIT_MALLOC_HEAP_SIZE ||
           l == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH || l == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT;
}

static void log_oom(int rdev, uint64_t bytes, CUlimit l) {
    VLOG(VLOG_WARN, "cuCtxSetLimit(%d): out of memory on %s: the limit needs %llu more bytes, %llu in use, limit %llu",
         (int)l, vgpu_region->devices[rdev].uuid, (unsigned long long)bytes,
         (unsigned long long)vgpu_device_usage(rdev), (unsigned long long)vgpu_region->devices[rdev].limit_bytes);
}

/* Measured limits: the growth of the device's used memory across the call (less what the
 * container accounted meanwhile), charged after it; a value that does not fit is set back. */
static CUresult set_measured(CUlimit l, size_t value, owned_t *o, int rdev, void *ctx, uint64_t key) {
    size_t old = 0;
    uint64_t used0 = 0, used1 = 0, cont0;
    int have_old = CALL_REAL(getlimit_t, cuCtxGetLimit, &old, l) == CUDA_SUCCESS;
    vgpu_measure_lock();
    int ok = vgpu_device_used(&used0) == 0;
    cont0 = vgpu_device_usage(rdev);
    CUresult rc = CALL_REAL(setlimit_t, cuCtxSetLimit, l, value);
    ok = ok && rc == CUDA_SUCCESS && vgpu_device_used(&used1) == 0;
    uint64_t grown = ok ? vgpu_growth(used0, used1, cont0, vgpu_device_usage(rdev)) : 0;
    uint64_t shrunk = ok ? vgpu_growth(used1, used0, vgpu_device_usage(rdev), cont0) : 0;
    vgpu_measure_unlock();
    uint64_t charged = o ? o->bytes : 0;
    if (grown && vgpu_reserve(rdev, grown) != 0) {
        log_oom(rdev, grown, l);
        if (have_old) CALL_REAL(setlimit_t, cuCtxSetLimit, l, old);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (grown) {
        charged += grown;
    } else if (shrunk) {
        uint64_t back = shrunk < charged ? shrunk : charged;
        vgpu_unreserve(rdev, back);
        charged -= back;
    }
    if (o) {
        o->bytes = charged;
        vgpu_owned_put(o);
    } else if (charged) {
        vgpu_owned_add_limit(key, ctx, rdev, charged, 0);
    }
    return rc;
}

VGPU_EXPORT CUresult cuCtxSetLimit(CUlimit l, size_t value) {
    if (vgpu_control_disabled() || !takes_memory(l)) return CALL_REAL(setlimit_t, cuCtxSetLimit, l, value);
    int rdev = vgpu_current_rdev();
    CUcontext ctx = NULL;
    if (rdev < 0 || CALL_REAL(CUresult(*)(CUcontext *), cuCtxGetCurrent, &ctx) != CUDA_SUCCESS || !ctx)
        return CALL_REAL(setlimit_t, cuCtxSetLimit, l, value);
    uint64_t key = (uint64_t)(uintptr_t)ctx ^ ((uint64_t)(l + 1) << 56);
    owned_t *o = vgpu_owned_take(O_LIMIT, key);
    uint64_t want, base;
    if (cost(l, value, &want) != 0) return set_measured(l, value, o, rdev, ctx, key);
    if (o) {
        base = o->base;
    } else {
        size_t cur = 0;
        if (CALL_REAL(getlimit_t, cuCtxGetLimit, &cur, l) != CUDA_SUCCESS || cost(l, cur, &base) != 0) base = 0;
    }
    uint64_t charged = o ? o->bytes : 0, target = want > base ? want - base : 0;
    if (target > charged && vgpu_reserve(rdev, target - charged) != 0) {
        log_oom(rdev, target - charged, l);
        if (o) vgpu_owned_put(o);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CALL_REAL(setlimit_t, cuCtxSetLimit, l, value);
    if (rc != CUDA_SUCCESS) {
        if (target > charged) vgpu_unreserve(rdev, target - charged);
        target = charged;
    } else if (target < charged) {
        vgpu_unreserve(rdev, charged - target);
    }
    if (o) {
        o->bytes = target;
        vgpu_owned_put(o);
    } else {
        vgpu_owned_add_limit(key, ctx, rdev, target, base);
    }
    return rc;
}
