/*
 * arrayhooks.c - CUDA arrays and mipmapped arrays charged their device footprint.
 *
 * What is charged: the texel footprint computed from the descriptor (width x height x depth
 * (layers, cube faces) x the format's bytes per texel - per channel for the plain and
 * normalized formats, per 4x4 block for the block-compressed ones, per plane for the YUV ones),
 * summed over the levels for a mipmapped array; reserved before the driver is called, so an
 * array over the limit never reaches it. The driver lays arrays out in tiles and rounds them to
 * its page size, so the growth of the device's used memory across the call is measured too
 * (as for module loads) and, when larger, the difference is charged as well (limit checked:
 * the array is destroyed again and CUDA_ERROR_OUT_OF_MEMORY answered when it does not fit).
 * A tenant making many tiny arrays is therefore charged what they take on the card.
 *
 * Sparse and deferred-mapping arrays (CUDA_ARRAY3D_SPARSE, CUDA_ARRAY3D_DEFERRED_MAPPING) have
 * no memory of their own: their tiles are backed by cuMemCreate handles mapped in with
 * cuMemMapArrayAsync, charged as VMM memory (vmmhooks.c). They are not charged here.
 *
 * Format values are numbers, not cuda.h names, so the file builds with the headers of every
 * CUDA 12 and 13 release (newer formats are missing from older headers).
 */
#include <cuda.h>
#include <stdlib.h>
#include "alloctrack.h"
#include "config.h"
#include "devmap.h"
#include "log.h"
#include "measure.h"
#include "real.h"
#include "region.h"
#include "vmm.h"

#undef cuArrayCreate
#undef cuArray3DCreate

#define SPARSE_FLAGS 0xc0u /* CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING */

static uint64_t mul_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
static uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

/* Bytes of one level of w x h x d texels (h, d: 0 = 1) of format `f` with `ch` channels. */
static uint64_t level_bytes(uint64_t w, uint64_t h, uint64_t d, unsigned f, unsigned ch) {
    h = h ? h : 1;
    d = d ? d : 1;
    ch = ch ? ch : 1;
    uint64_t texels = mul_sat(mul_sat(w, h), d);
    uint64_t num = 0, den = 1; /* bytes per texel = num / den */
    switch (f) {
    case 0x01: case 0x08: num = ch; break;                    /* 8-bit integers */
    case 0x02: case 0x09: case 0x10: num = 2ull * ch; break;  /* 16-bit integers, half */
    case 0x03: case 0x0a: case 0x20: num = 4ull * ch; break;  /* 32-bit integers, float */
    case 0xc0: case 0xc6: num = 1; break;                     /* normalized 8-bit x1/x2/x4 */
    case 0xc1: case 0xc7: num = 2; break;
    case 0xc2: case 0xc8: num = 4; break;
    case 0xc3: case 0xc9: num = 2; break;                     /* normalized 16-bit x1/x2/x4 */
    case 0xc4: case 0xca: num = 4; break;
    case 0xc5: case 0xcb: num = 8; break;
    case 0x50: num = 4; break;                                /* R10G10B10A2 */
    case 0x91: case 0x92: case 0x97: case 0x98:               /* BC1, BC4: 8 bytes per 4x4 block */
    case 0x93: case 0x94: case 0x95: case 0x96: case 0x99: case 0x9a:
    case 0x9b: case 0x9c: case 0x9d: case 0x9e: {             /* BC2/3/5/6H/7: 16 bytes per block */
        uint64_t blocks = mul_sat(mul_sat((w + 3) / 4, (h + 3) / 4), d);
        return mul_sat(blocks, f == 0x91 || f == 0x92 || f == 0x97 || f == 0x98 ? 8 : 16);
    }
    case 0xb0: num = 3; den = 2; break;                       /* NV12 */
    case 0x9f: case 0xa1: num = 3; break;                     /* P010, P016 */
    case 0xa2: case 0xa5: num = 2; break;                     /* NV16, YUY2 */
    case 0xa3: case 0xa4: case 0xa6: case 0xa7: num = 4; break; /* P210, P216, Y210, Y216 */
    case 0xa8: case 0xa9: num = 4; break;                     /* AYUV, Y410 */
    case 0xb1: num = 8; break;                                /* Y416 */
    case 0xb2: case 0xb4: num = 3; break;                     /* 4:4:4 8-bit planar, semi-planar */
    case 0xb3: case 0xb5: num = 6; break;                     /* 4:4:4 10/16-bit */
    default: num = 16ull * ch; break;                         /* unknown: no format is wider */
    }
    uint64_t b = mul_sat(texels, num);
    return b == UINT64_MAX ? b : (b + den - 1) / den;
}

static uint64_t mipmap_bytes(uint64_t w, uint64_t h, uint64_t d, unsigned f, unsigned ch, unsigned levels) {
    uint64_t bytes = 0;
    unsigned n = levels ? levels : 1;
    for (unsigned i = 0; i < n; i++) {
        uint64_t b = level_bytes(w, h, d, f, ch);
        if (w <= 1 && h <= 1 && d <= 1) return add_sat(bytes, mul_sat(b, n - i)); /* the rest are all 1x1x1 */
        bytes = add_sat(bytes, b);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    return bytes;
}

static void log_oom(int rdev, uint64_t bytes, const char *api) {
    VLOG(VLOG_WARN, "%s: out of memory on %s: %llu bytes requested, %llu in use, limit %llu", api,
         vgpu_region->devices[rdev].uuid, (unsigned long long)bytes, (unsigned long long)vgpu_device_usage(rdev),
         (unsigned long long)vgpu_region->devices[rdev].limit_bytes);
}

typedef struct {
    int rdev, measured;
    uint64_t est, used0, cont0;
} arr_measure_t;

/* Reserves the computed footprint and starts the measurement; -1 over the limit. */
static int arr_begin(arr_measure_t *m, uint64_t est, const char *api) {
    *m = (arr_measure_t){vgpu_current_rdev(), 0, est, 0, 0};
    if (m->rdev < 0) return 0;
    if (vgpu_reserve(m->rdev, est) != 0) {
        log_oom(m->rdev, est, api);
        return -1;
    }
    vgpu_measure_lock();
    m->measured = vgpu_device_used(&m->used0) == 0;
    m->cont0 = vgpu_device_usage(m->rdev);
    return 0;
}

/* After the driver call: the charge is max(computed, measured growth). Returns the final rc. */
static CUresult arr_end(arr_measure_t *m, CUresult rc, int kind, uint64_t handle, CUresult (*destroy)(uint64_t),
                        const char *api) {
    if (m->rdev < 0) return rc;
    uint64_t used1 = 0, grown = 0;
    if (m->measured && rc == CUDA_SUCCESS && vgpu_device_used(&used1) == 0)
        grown = vgpu_growth(m->used0, used1, m->cont0, vgpu_device_usage(m->rdev));
    vgpu_measure_unlock();
    if (rc != CUDA_SUCCESS) {
        vgpu_unreserve(m->rdev, m->est);
        return rc;
    }
    uint64_t charge = m->est;
    if (grown > m->est) {
        if (vgpu_reserve(m->rdev, grown - m->est) != 0) {
            destroy(handle);
            vgpu_unreserve(m->rdev, m->est);
            log_oom(m->rdev, grown, api);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        charge = grown;
    }
    vgpu_track_add(kind, handle, m->rdev, charge);
    return rc;
}

static CUresult real_array_destroy(uint64_t a) { return CALL_REAL(CUresult(*)(CUarray), cuArrayDestroy, (CUarray)(uintptr_t)a); }
static CUresult real_mipmap_destroy(uint64_t a) {
    return CALL_REAL(CUresult(*)(CUmipmappedArray), cuMipmappedArrayDestroy, (CUmipmappedArray)(uintptr_t)a);
}

#define ARRAY_CREATE(api, out, bytes, realcall, kind, destroy)                                  \
    do {                                                                                        \
        arr_measure_t m_;                                                                       \
        if (arr_begin(&m_, (bytes), api) != 0) return CUDA_ERROR_OUT_OF_MEMORY;                 \
        CUresult rc_ = (realcall);                                                              \
        return arr_end(&m_, rc_, kind, rc_ == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*(out) : 0, destroy, api); \
    } while (0)

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
    typedef CUresult (*fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    if (vgpu_control_disabled() || !arr || !desc) return CALL_REAL(fn, cuArrayCreate_v2, arr, desc);
    ARRAY_CREATE("cuArrayCreate_v2", arr, level_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                 CALL_REAL(fn, cuArrayCreate_v2, arr, desc), K_ARRAY, real_array_destroy);
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    typedef CUresult (*fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    if (vgpu_control_disabled() || !arr || !desc || (desc->Flags & SPARSE_FLAGS))
        return CALL_REAL(fn, cuArray3DCreate_v2, arr, desc);
    ARRAY_CREATE("cuArray3DCreate_v2", arr,
                 level_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels),
                 CALL_REAL(fn, cuArray3DCreate_v2, arr, desc), K_ARRAY, real_array_destroy);
}

/* v1 descriptors (CUDA < 3.2): 32-bit dimensions. */
typedef struct { unsigned int Width, Height; CUarray_format Format; unsigned int NumChannels; } array_desc_v1_t;
typedef struct {
    unsigned int Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels, Flags;
} array3d_desc_v1_t;

VGPU_EXPORT CUresult cuArrayCreate(CUarray *arr, const array_desc_v1_t *desc) {
    typedef CUresult (*fn)(CUarray *, const array_desc_v1_t *);
    if (vgpu_control_disabled() || !arr || !desc) return CALL_REAL(fn, cuArrayCreate, arr, desc);
    ARRAY_CREATE("cuArrayCreate", arr, level_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                 CALL_REAL(fn, cuArrayCreate, arr, desc), K_ARRAY, real_array_destroy);
}

VGPU_EXPORT CUresult cuArray3DCreate(CUarray *arr, const array3d_desc_v1_t *desc) {
    typedef CUresult (*fn)(CUarray *, const array3d_desc_v1_t *);
    if (vgpu_control_disabled() || !arr || !desc || (desc->Flags & SPARSE_FLAGS))
        return CALL_REAL(fn, cuArray3DCreate, arr, desc);
    ARRAY_CREATE("cuArray3DCreate", arr,
                 level_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels),
                 CALL_REAL(fn, cuArray3DCreate, arr, desc), K_ARRAY, real_array_destroy);
}

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int levels) {
    typedef CUresult (*fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    if (vgpu_control_disabled() || !h || !desc || (desc->Flags & SPARSE_FLAGS))
        return CALL_REAL(fn, cuMipmappedArrayCreate, h, desc, levels);
    ARRAY_CREATE("cuMipmappedArrayCreate", h,
                 mipmap_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, levels),
                 CALL_REAL(fn, cuMipmappedArrayCreate, h, desc, levels), K_MIPMAP, real_mipmap_destroy);
}

static CUresult destroy_tracked(int kind, uint64_t key, CUresult (*destroy)(uint64_t)) {
    track_t *t = vgpu_track_take(kind, key);
    CUresult rc = destroy(key);
    if (rc == CUDA_SUCCESS) vgpu_vmm_array_gone(key); /* VMM memory mapped into a sparse array */
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

VGPU_EXPORT CUresult cuArrayDestroy(CUarray a) {
    if (vgpu_control_disabled()) return real_array_destroy((uint64_t)(uintptr_t)a);
    return destroy_tracked(K_ARRAY, (uint64_t)(uintptr_t)a, real_array_destroy);
}

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    if (vgpu_control_disabled()) return real_mipmap_destroy((uint64_t)(uintptr_t)a);
    return destroy_tracked(K_MIPMAP, (uint64_t)(uintptr_t)a, real_mipmap_destroy);
}
