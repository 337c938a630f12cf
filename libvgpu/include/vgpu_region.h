/*
 * vgpu_region.h - the binary layout of the shared accounting region (version 2.1).
 *
 * Why this header exists: every process of a container maps the same file
 * (CUDA_DEVICE_MEMORY_SHARED_CACHE) and the node monitor maps it too, from another
 * language. The layout is therefore an ABI: fixed offsets, fixed-size little-endian
 * integers, no pointers, no locks inside. Readers must check magic and major version.
 * docs/libvgpu.md describes every field for the monitor; keep both in step.
 *
 * Concurrency model (why there is no mutex here): memory accounting is lock-free.
 * Each process owns one slot and only ever adds to / subtracts from its own counters
 * with atomic read-modify-write (one exception: the charge of an allocation shared by IPC
 * inside the container is added to a remaining holder's slot when its charger lets go, before
 * the charger gives its own back); a reservation adds first and then sums all slots, and
 * backs out when the sum passes the limit (so two racers can never both pass). A process
 * killed with SIGKILL therefore never leaves a lock held: its slot is simply reaped (pid
 * no longer alive) by any other process. Slot and device registration take an
 * open-file-description lock on the file (fcntl), which the kernel drops on death.
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stdint.h>

#define VGPU_REGION_MAGIC 0x55504756u /* bytes "VGPU" in file order */
#define VGPU_REGION_MAJOR 2u
#define VGPU_REGION_MINOR 2u
#define VGPU_MAX_DEVICES 16
#define VGPU_MAX_SLOTS 1024
#define VGPU_HEADER_SIZE 4096u
#define VGPU_DEVICE_SIZE 256u
#define VGPU_SLOT_SIZE 576u
#define VGPU_UNLIMITED UINT64_MAX

/* One physical device, keyed by UUID. 256 bytes. */
typedef struct {
    char uuid[96];                      /* 0   NUL-terminated, e.g. "GPU-8b0e..." */
    uint64_t limit_bytes;               /* 96  UINT64_MAX = no limit; 0 = fail closed */
    uint32_t sm_limit;                  /* 104 percent 1..100 (100 = no compute limit) */
    uint32_t phys_index;                /* 108 index in the container (CUDA_DEVICE_*_LIMIT_<i>) */
    _Atomic uint32_t state;             /* 112 0 = free entry, 2 = ready */
    uint32_t pad0;                      /* 116 */
    _Atomic uint64_t pause_until_ns;    /* 120 SM pacer: no launch before (CLOCK_MONOTONIC ns) */
    _Atomic uint64_t covered_until_ns;  /* 128 SM pacer: busy time already charged up to here */
    _Atomic uint64_t busy_ns_total;     /* 136 measured GPU busy time of the container, ns */
    _Atomic uint64_t last_kernel_time;  /* 144 unix seconds of the last launch (coarse) */
    _Atomic uint64_t throttled_ns_total;/* 152 time launches were held back by the pacer, ns */
    uint8_t reserved[96];               /* 160..256 */
} vgpu_device_t;

/* One process. 576 bytes. Counters are indexed by the region device index. */
typedef struct {
    _Atomic int32_t pid;                      /* 0   0 = free, -1 = being reaped, else container pid */
    _Atomic int32_t hostpid;                  /* 4   0 = unknown; the monitor may fill it */
    uint64_t start_time;                      /* 8   /proc/<pid>/stat starttime (clock ticks), pid-reuse guard */
    _Atomic uint64_t used[VGPU_MAX_DEVICES];  /* 16  all device bytes this process holds */
    _Atomic uint64_t data[VGPU_MAX_DEVICES];  /* 144 of which allocations (linear, managed, async, VMM, arrays) */
    _Atomic uint64_t context[VGPU_MAX_DEVICES]; /* 272 of which contexts (primary and cuCtxCreate) */
    _Atomic uint64_t module[VGPU_MAX_DEVICES];  /* 400 of which module images (since 2.1) */
    _Atomic uint64_t slice_open_ns;           /* 528 compute pacer: this process's open slice began (0 = none; since 2.2) */
    _Atomic int32_t slice_rdev;               /* 536 the device entry of that slice */
    uint32_t pad0;                            /* 540 */
    uint8_t reserved[32];                     /* 544..576 */
} vgpu_slot_t;

typedef struct {
    uint32_t magic;                 /* 0  VGPU_REGION_MAGIC, written last at creation */
    uint32_t major;                 /* 4  2 */
    uint32_t minor;                 /* 8  0 */
    uint32_t header_size;           /* 12 4096 */
    uint32_t device_size;           /* 16 256 */
    uint32_t slot_size;             /* 20 576 */
    uint32_t max_devices;           /* 24 16 */
    uint32_t max_slots;             /* 28 1024 */
    _Atomic uint32_t device_count;  /* 32 entries of devices[] in use */
    _Atomic uint32_t slot_hwm;      /* 36 slots[0..slot_hwm) may be in use */
    int32_t priority;               /* 40 CUDA_TASK_PRIORITY of the creator: 0 high, 1 low */
    _Atomic int32_t blocked;        /* 44 set non-zero by a node agent: launches wait */
    _Atomic uint64_t last_reap_ns;  /* 48 last dead-slot sweep (CLOCK_MONOTONIC ns) */
    uint8_t reserved[VGPU_HEADER_SIZE - 56];
    vgpu_device_t devices[VGPU_MAX_DEVICES]; /* 4096 */
    vgpu_slot_t slots[VGPU_MAX_SLOTS];       /* 8192 */
} vgpu_region_t;

#define VGPU_REGION_SIZE (VGPU_HEADER_SIZE + VGPU_MAX_DEVICES * VGPU_DEVICE_SIZE + VGPU_MAX_SLOTS * VGPU_SLOT_SIZE)

_Static_assert(sizeof(vgpu_device_t) == VGPU_DEVICE_SIZE, "device entry size is ABI");
_Static_assert(sizeof(vgpu_slot_t) == VGPU_SLOT_SIZE, "slot size is ABI");
_Static_assert(sizeof(vgpu_region_t) == VGPU_REGION_SIZE, "region size is ABI");

#endif
