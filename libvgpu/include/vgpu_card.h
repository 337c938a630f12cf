/*
 * vgpu_card.h - the binary layout of the per-card shared region (version 1.1; the layout of 1.0).
 *
 * Why a second region: the per-container region (vgpu_region.h) is private to one container,
 * so a container's compute limiter cannot tell its own kernels' time from a neighbour's on a
 * time-shared card, and charges itself for both. The device plugin keeps one file per card
 * UUID on the node (<hook>/vgpu/cards/<UUID>.card) and mounts it read-write into every
 * container it gives that card; each container's limiters (one entry per container, keyed by
 * its per-container region) publish when they have work queued, and read a common "fair
 * clock" that advances by 1/k ns per ns while k tenants have work: a tenant charges its busy
 * time at that rate, which is its share of a card that time-slices between k contexts.
 *
 * ABI rules as for vgpu_region.h: fixed offsets, little-endian fixed-size integers, no
 * pointers. Readers check magic and major version. `lock` is a spin lock word held only for a
 * few loads and stores (never across a system call); a holder seen with the same lock_ns for
 * 10 ms (dead inside, or garbage) is broken, and a waiter gives up after 30 ms. Any tenant can
 * write any byte here: readers range-check every field (card.c). docs/libvgpu.md describes
 * every field.
 */
#ifndef VGPU_CARD_H
#define VGPU_CARD_H

#include <stdint.h>

#define VGPU_CARD_MAGIC 0x44524356u /* bytes "VCRD" in file order */
#define VGPU_CARD_MAJOR 1u
#define VGPU_CARD_MINOR 1u
#define VGPU_CARD_MAX_TENANTS 64
#define VGPU_CARD_HEADER_SIZE 256u
#define VGPU_CARD_TENANT_SIZE 128u

/* One tenant (container) of the card. 128 bytes. */
typedef struct {
    _Atomic uint64_t key;                /* 0   0 = free entry; else the tenant's region key */
    uint32_t sm_limit;                   /* 8   percent 1..100 */
    int32_t priority;                    /* 12  0 high, 1 low (CUDA_TASK_PRIORITY) */
    _Atomic uint32_t open;               /* 16  processes of the tenant with work queued now */
    uint32_t pad0;                       /* 20 */
    _Atomic uint64_t touch_ns;           /* 24  last change of open, or 100 ms refresh (CLOCK_MONOTONIC ns) */
    _Atomic uint64_t fair_busy_ns_total; /* 32  time with work queued at the fair-clock rate, ns */
    _Atomic uint64_t wall_busy_ns_total; /* 40  wall time with work queued, ns */
    uint8_t reserved[80];                /* 48..128 */
} vgpu_card_tenant_t;

typedef struct {
    uint32_t magic;           /* 0  VGPU_CARD_MAGIC, written last at creation */
    uint32_t major;           /* 4  1 */
    uint32_t minor;           /* 8  1 */
    uint32_t header_size;     /* 12 256 */
    uint32_t tenant_size;     /* 16 128 */
    uint32_t max_tenants;     /* 20 64 */
    _Atomic uint32_t lock;    /* 24 0 free, 1 held */
    uint32_t pad0;            /* 28 */
    _Atomic uint64_t lock_ns; /* 32 when the lock was taken (stale-holder break) */
    uint64_t vclock_ns;       /* 40 the fair clock (under lock) */
    uint64_t last_ns;         /* 48 CLOCK_MONOTONIC ns when vclock_ns was last advanced */
    uint32_t active;          /* 56 tenants with work queued at last_ns */
    uint32_t pad1;            /* 60 */
    uint8_t reserved[VGPU_CARD_HEADER_SIZE - 64];
    vgpu_card_tenant_t tenants[VGPU_CARD_MAX_TENANTS]; /* 256 */
} vgpu_card_region_t;

#define VGPU_CARD_REGION_SIZE (VGPU_CARD_HEADER_SIZE + VGPU_CARD_MAX_TENANTS * VGPU_CARD_TENANT_SIZE)

_Static_assert(sizeof(vgpu_card_tenant_t) == VGPU_CARD_TENANT_SIZE, "tenant entry size is ABI");
_Static_assert(sizeof(vgpu_card_region_t) == VGPU_CARD_REGION_SIZE, "card region size is ABI");

#endif
