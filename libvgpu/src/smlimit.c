/*
 * smlimit.c - compute share (CUDA_DEVICE_SM_LIMIT) enforced by the library alone.
 *
 * Why duty cycling instead of HAMi-core's token bucket: HAMi-core refilled tokens from
 * NVML per-process utilisation that a node agent had to map to host PIDs; without that
 * agent (or on MIG / vGPU guests) the limit silently did nothing, and with it the
 * arithmetic scaled with SM count squared (core#274, core#314). Here each process measures
 * the wall time during which the container kept the GPU busy, in slices: the first launch
 * after a pause opens a slice; the first launch after LIBVGPU_SM_SLICE_MS (250 ms) closes it
 * by draining the context (cuCtxSynchronize), so the slice's busy time is known: up to the
 * drain, or up to the program's own last synchronisation when that followed its last launch,
 * less the gaps between a synchronisation and the next launch inside the slice (the GPU had
 * none of this process's work then; gaps between launches without a synchronisation are
 * charged, since queued work may still run; gaps are not subtracted while another process of
 * the container holds memory on the device, as its kernels may fill them). Then launches wait until
 * end + busy * 100 / p - (end - start): the idle time already inside the slice counts toward
 * the pause, so a bursty program within its share is not held back (for a fully busy slice
 * this is busy * (100 - p) / p). 250 ms because a duty-cycled H200 boosts
 * its clock between pauses (more work per busy ms than at the power cap); long slices let the
 * power cap engage. The pause is kept in the shared region per device, merged over the
 * container's processes by the union of their busy intervals, so all processes of a
 * container share one budget. Hard cap by default; LIBVGPU_SM_USE_IDLE=true skips the
 * pause while NVML shows no compute process on the card outside this container.
 * The disabled path costs one load and one predictable branch per launch.
 */
#include <stdatomic.h>
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "card.h"
#include "config.h"
#include "devmap.h"
#include "log.h"
#include "real.h"
#include "region.h"
#include "smlimit.h"

int vgpu_sm_state = SM_UNKNOWN;
static uint64_t slice_ns = 250000000ull;
static int idle_mode;
static uint32_t priority_floor = 5; /* percent a low-priority tenant keeps while a high one works */
static int my_priority = 1;

#define MAX_GAPS 16
typedef struct {
    pthread_mutex_t mu;
    uint64_t slice_start; /* 0 = no slice open */
    uint64_t v_open;      /* the card region's fair clock when the slice opened */
    /* Idle gaps of the open slice: a synchronisation returned, then the next launch came. */
    int ngaps;
    uint64_t gap_start[MAX_GAPS], gap_len[MAX_GAPS];
} pacer_t;
static pacer_t pacers[VGPU_MAX_DEVICES];
/* When the application last launched, and last returned from a synchronisation. A sync that
 * returned after the last launch tells when the GPU ran out of this process's work, so time
 * the program spent idle is not charged as busy. */
static _Atomic uint64_t last_launch_ns, last_sync_ns;
static pthread_once_t sm_once = PTHREAD_ONCE_INIT;

static void sm_setup(void) {
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) pthread_mutex_init(&pacers[i].mu, NULL);
    my_priority = vgpu_task_priority();
    /* A high-priority tenant on a shared card publishes its activity even without a limit of
     * its own, so that low-priority neighbours step back while it works. */
    const char *card_dir = vgpu_getenv("LIBVGPU_CARD_DIR");
    int any = vgpu_config_has_prefix("CUDA_DEVICE_SM_LIMIT") || (my_priority == 0 && card_dir && *card_dir);
    const char *fl = vgpu_getenv("LIBVGPU_PRIORITY_FLOOR");
    uint32_t floor_pct;
    if (fl && vgpu_parse_percent(fl, &floor_pct) == 0 && floor_pct > 0) priority_floor = floor_pct;
    else if (fl) VLOG(VLOG_ERROR, "LIBVGPU_PRIORITY_FLOOR='%s' is not a percent 1..100; using 5", fl);
    int policy = vgpu_sm_policy();
    idle_mode = policy != SM_POLICY_FORCE && vgpu_sm_idle_mode();
    const char *s = vgpu_getenv("LIBVGPU_SM_SLICE_MS");
    if (s && atoi(s) > 0) slice_ns = (uint64_t)atoi(s) * 1000000ull;
    int state = (!any || policy == SM_POLICY_DISABLE || vgpu_control_disabled()) ? SM_NONE : SM_ACTIVE;
    if (state == SM_ACTIVE) VLOG(VLOG_INFO, "compute limiter on (slice %llu ms, %s)",
                                 (unsigned long long)(slice_ns / 1000000), idle_mode ? "idle-time mode" : "hard cap");
    __atomic_store_n(&vgpu_sm_state, state, __ATOMIC_RELEASE);
}

/* Caller holds pc->mu. */
static void open_slice(int rdev, pacer_t *pc, uint64_t now) {
    pc->v_open = vgpu_card_slice_open(rdev);
    __atomic_store_n(&pc->slice_start, now, __ATOMIC_RELAXED);
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

/* 1 when NVML lists no more compute processes on the device than this container has. */
static int alone_on_device(vgpu_device_t *d) {
    typedef int (*byuuid_t)(const char *, void **);
    typedef int (*procs_t)(void *, unsigned *, void *);
    typedef int (*init_t)(void);
    init_t init = (init_t)REAL_NVML_PTR(nvmlInit_v2);
    byuuid_t byuuid = (byuuid_t)vgpu_real_nvml_fn[HN_nvmlDeviceGetHandleByUUID];
    procs_t procs = (procs_t)vgpu_real_nvml_fn[HN_nvmlDeviceGetComputeRunningProcesses_v3];
    if (!procs) procs = (procs_t)vgpu_real_nvml_fn[HN_nvmlDeviceGetComputeRunningProcesses];
    void *h;
    unsigned count = 0;
    if (!init || !byuuid || !procs || init() != 0 || byuuid(d->uuid, &h) != 0) return 0;
    int rc = procs(h, &count, NULL);
    if (rc != 0 && rc != 7 /* NVML_ERROR_INSUFFICIENT_SIZE */) return 0;
    unsigned mine = 0;
    uint32_t hwm = atomic_load(&vgpu_region->slot_hwm);
    for (uint32_t i = 0; i < hwm && i < VGPU_MAX_SLOTS; i++)
        if (atomic_load(&vgpu_region->slots[i].pid) > 0) mine++;
    return count <= mine;
}

static void note_gap(pacer_t *pc, uint64_t from, uint64_t len) {
    pthread_mutex_lock(&pc->mu);
    if (pc->slice_start && from >= pc->slice_start) {
        if (pc->ngaps < MAX_GAPS) {
            pc->gap_start[pc->ngaps] = from;
            pc->gap_len[pc->ngaps++] = len;
        } else {
            pc->gap_len[MAX_GAPS - 1] += len; /* merged: only its position is approximate */
        }
    }
    pthread_mutex_unlock(&pc->mu);
}

/* 1 when no other process of the container holds memory on region device `rdev` (so none can
 * have kernels on it). Gaps are subtracted only then: this process's idle gap may be another
 * process's busy time, which the union of intervals would otherwise never charge. */
static int only_user_of(int rdev) {
    int me = vgpu_my_slot();
    uint32_t hwm = atomic_load(&vgpu_region->slot_hwm);
    for (uint32_t i = 0; i < hwm && i < VGPU_MAX_SLOTS; i++)
        if ((int)i != me && atomic_load(&vgpu_region->slots[i].pid) > 0 && atomic_load(&vgpu_region->slots[i].used[rdev]))
            return 0;
    return 1;
}

/* Caller holds pc->mu. Idle time of the slice's gaps that lies inside [from, end). */
static uint64_t gaps_within(pacer_t *pc, uint64_t from, uint64_t end) {
    uint64_t sum = 0;
    for (int i = 0; i < pc->ngaps; i++) {
        uint64_t a = pc->gap_start[i], b = a + pc->gap_len[i];
        if (a < from) a = from;
        if (b > end) b = end;
        if (b > a) sum += b - a;
    }
    return sum;
}

/* Closes this process's open slice on device `d`: drains the context, charges the busy time
 * not already charged by another process (union of intervals) and extends the shared pause.
 * `force` closes a slice shorter than slice_ns (before waiting for someone else's pause, so
 * the pause itself is never charged as busy time). */
static void close_slice(int rdev, vgpu_device_t *d, pacer_t *pc, uint64_t now, CUstream s, int force,
                        uint64_t prev_launch) {
    pthread_mutex_lock(&pc->mu);
    uint64_t start = pc->slice_start;
    if (!start || (!force && now - start < slice_ns)) { pthread_mutex_unlock(&pc->mu); return; }
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    typedef CUresult (*cap_t)(CUstream, CUstreamCaptureStatus *);
    cap_t iscap = (cap_t)REAL_PTR(cuStreamIsCapturing);
    if (iscap && iscap(s, &cap) == CUDA_SUCCESS && cap != CU_STREAM_CAPTURE_STATUS_NONE) {
        pthread_mutex_unlock(&pc->mu); /* never synchronise inside a stream capture */
        return;
    }
    typedef CUresult (*sync_t)(void);
    sync_t sync = (sync_t)REAL_PTR(cuCtxSynchronize);
    if (sync) sync();
    uint64_t end = vgpu_now_ns();
    uint64_t ls = atomic_load(&last_sync_ns);
    if (ls > prev_launch && ls > start && ls < end) end = ls; /* the program drained its work then went idle */
    uint64_t cov = atomic_load(&d->covered_until_ns), from;
    do {
        from = start > cov ? start : cov;
    } while (!atomic_compare_exchange_weak(&d->covered_until_ns, &cov, cov > end ? cov : end));
    uint64_t window = end > from ? end - from : 0;
    uint64_t gaps = pc->ngaps && only_user_of(rdev) ? gaps_within(pc, from, end) : 0;
    uint64_t busy = window > gaps ? window - gaps : 0;
    pc->ngaps = 0;
    /* On a shared card, only this tenant's share of the slice's time is its own busy time. */
    uint64_t closed = vgpu_now_ns(), wall = closed > start ? closed - start : 0;
    uint64_t fair = vgpu_card_slice_close(rdev, pc->v_open, busy);
    uint32_t p = d->sm_limit == 0 ? 100 : d->sm_limit;
    /* Deferring to a high-priority neighbour: held to the floor and charged the whole slice (no
     * fair-clock discount). The equal-split model is approximate: on the H200 a low tenant held
     * to a 5 % floor with the discount got 8.7-10.8 % and its high neighbour only 89 % of what it
     * got alone (docs/benchmarks.md); charging in full errs on the high tenant's side. */
    int deferring = vgpu_card_high_priority_active(rdev);
    if (deferring && p > priority_floor) p = priority_floor;
    if (!deferring && fair != UINT64_MAX && wall && fair < wall)
        busy = (uint64_t)((double)busy * (double)fair / (double)wall);
    vgpu_card_charge(rdev, busy);
    uint64_t need = busy * 100 / p; /* wall time this busy time may span */
    uint64_t idle = need > window ? need - window : 0;
    if (idle_mode && idle && alone_on_device(d)) idle = 0;
    uint64_t pu = atomic_load(&d->pause_until_ns), next;
    do {
        next = (pu > end ? pu : end) + idle;
    } while (!atomic_compare_exchange_weak(&d->pause_until_ns, &pu, next));
    atomic_fetch_add(&d->busy_ns_total, busy);
    atomic_store(&d->last_kernel_time, (uint64_t)time(NULL));
    __atomic_store_n(&pc->slice_start, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pc->mu);
    VLOG(VLOG_DEBUG, "device %d slice: busy %llu us, pause %llu us", rdev, (unsigned long long)(busy / 1000),
         (unsigned long long)(idle / 1000));
}

void vgpu_sm_before_launch(void *stream) {
    if (VGPU_UNLIKELY(__atomic_load_n(&vgpu_sm_state, __ATOMIC_ACQUIRE) == SM_UNKNOWN)) pthread_once(&sm_once, sm_setup);
    if (vgpu_sm_state != SM_ACTIVE) return;
    int rdev = vgpu_current_rdev();
    if (rdev < 0 || !vgpu_region) return;
    vgpu_device_t *d = &vgpu_region->devices[rdev];
    if ((d->sm_limit >= 100 || d->sm_limit == 0) && !(my_priority == 0 && vgpu_card_attach(rdev) == 0)) return;
    while (atomic_load(&vgpu_region->blocked)) { /* a node agent holds this container back */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    pacer_t *pc = &pacers[rdev];
    uint64_t now = vgpu_now_ns();
    uint64_t pu = atomic_load(&d->pause_until_ns);
    uint64_t start = __atomic_load_n(&pc->slice_start, __ATOMIC_RELAXED);
    uint64_t prev_launch = atomic_exchange(&last_launch_ns, now);
    uint64_t ls = atomic_load(&last_sync_ns);
    if (VGPU_UNLIKELY(ls > prev_launch) && ls < now && start) note_gap(pc, ls, now - ls);
    if (now < pu) {
        /* Someone (this or another process) is pausing the device: charge what we ran so far,
         * wait, and open a fresh slice afterwards. */
        if (start) close_slice(rdev, d, pc, now, (CUstream)stream, 1, prev_launch);
    } else if (start == 0) {
        pthread_mutex_lock(&pc->mu);
        if (pc->slice_start == 0) open_slice(rdev, pc, now);
        pthread_mutex_unlock(&pc->mu);
        return;
    } else if (now - start < slice_ns) {
        return;
    } else {
        close_slice(rdev, d, pc, now, (CUstream)stream, 0, prev_launch);
    }
    pu = atomic_load(&d->pause_until_ns);
    now = vgpu_now_ns();
    if (now < pu) {
        sleep_until(pu);
        atomic_fetch_add(&d->throttled_ns_total, pu - now);
        now = vgpu_now_ns();
    }
    pthread_mutex_lock(&pc->mu);
    if (pc->slice_start == 0) open_slice(rdev, pc, now);
    pthread_mutex_unlock(&pc->mu);
}

void vgpu_sm_synced(void) { atomic_store(&last_sync_ns, vgpu_now_ns()); }
