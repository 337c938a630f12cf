/*
 * fake_state.h - the "physical GPU" shared by the fake libcuda.so.1 and libnvidia-ml.so.1.
 *
 * Why a file: tests run several processes against one card; the physical truth (bytes in
 * use per device) must be common to all of them, as on real hardware. FAKE_GPU_STATE names
 * the file; without it each process has its own card.
 * Environment: FAKE_GPU_COUNT (default 1), FAKE_GPU_MIB / FAKE_GPU_MIB_<i> (default 1024),
 * FAKE_KERNEL_US (modelled duration of every launch, default 0), FAKE_PITCH_ALIGN (512),
 * FAKE_NVML_PROCS (compute processes NVML reports, default 0).
 */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_MAX_DEV 8
#define FAKE_MAX_CTX 32
/* The modelled time-sliced engine of one card (fake_cuda.c): each process (context) with work
 * queued progresses at 1/k of the wall time while k processes have work, its own kernels in
 * order. `vt` is the service every backlogged context has received since the card was created
 * (ns); a context's work is done when vt reaches its `finish` tag. */
typedef struct {
    _Atomic int32_t pid; /* 0 = free; a slot whose finish <= vt may be taken by another process */
    uint32_t pad;
    uint64_t finish;
    uint64_t queued_ns; /* wall time this process had work queued on the card (fake_queued_ns) */
} fake_ctxq_t;
typedef struct {
    _Atomic uint32_t lock; /* spin lock over vt, last and the slots; held for a few dozen loads */
    uint32_t pad;
    _Atomic uint64_t lock_ns; /* when it was taken: a holder killed inside is broken after 100 ms */
    uint64_t vt, last;        /* service per backlogged context (ns); wall ns when vt was advanced */
    fake_ctxq_t q[FAKE_MAX_CTX];
} fake_engine_t;
/* Legacy IPC exports (cuIpcGetMemHandle), shared by every process of the card: an exported
 * allocation's memory lives until its exporter has freed it and every import is closed, as the
 * driver keeps memory an importer still maps. A handle names the entry and its generation. */
#define FAKE_MAX_IPC 64
typedef struct {
    uint32_t state; /* 0 free, 1 exported */
    uint32_t gen;
    int32_t phys;
    int32_t opens;          /* live imports, all processes */
    int32_t exporter_holds; /* the exporter has not freed it yet */
    uint32_t pad;
    uint64_t bytes;
} fake_ipc_t;
typedef struct {
    _Atomic uint64_t used[FAKE_MAX_DEV];
    fake_engine_t engine[FAKE_MAX_DEV];
    _Atomic uint32_t ipc_lock; /* spin lock over ipc[] and ipc_gen */
    uint32_t ipc_gen;
    fake_ipc_t ipc[FAKE_MAX_IPC];
} fake_phys_t;

static fake_phys_t *fake_phys(void) {
    static fake_phys_t *p, local;
    if (p) return p;
    const char *path = getenv("FAKE_GPU_STATE");
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CREAT, 0666);
        if (fd >= 0 && ftruncate(fd, sizeof(fake_phys_t)) == 0) {
            void *m = mmap(NULL, sizeof(fake_phys_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) p = m;
        }
        if (fd >= 0) close(fd);
    }
    if (!p) p = &local;
    return p;
}

static int fake_count_env(void) {
    const char *s = getenv("FAKE_GPU_COUNT");
    int n = s ? atoi(s) : 1;
    return n < 1 ? 1 : n > FAKE_MAX_DEV ? FAKE_MAX_DEV : n;
}

static uint64_t fake_capacity(int phys) {
    char name[64];
    snprintf(name, sizeof name, "FAKE_GPU_MIB_%d", phys);
    const char *s = getenv(name);
    if (!s) s = getenv("FAKE_GPU_MIB");
    return (uint64_t)(s ? strtoull(s, NULL, 10) : 1024) << 20;
}

static void fake_uuid_string(int phys, char *out, size_t n) {
    snprintf(out, n, "GPU-face00%02x-0000-0000-0000-000000000000", phys);
}
#endif
