/*
 * util.h - the few definitions every libvgpu source uses: export/visibility, branch hints, the
 * monotonic clock. Depends on nothing.
 */
#ifndef VGPU_UTIL_H
#define VGPU_UTIL_H

#include <stdint.h>
#include <time.h>

/* Only hooks marked VGPU_EXPORT leave the .so; everything else has hidden visibility. */
#define VGPU_EXPORT __attribute__((visibility("default")))
#define VGPU_LIKELY(x) __builtin_expect(!!(x), 1)
#define VGPU_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* CLOCK_MONOTONIC in ns: one clock for every process of the node (pauses, slices, card region). */
static inline uint64_t vgpu_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

#endif
