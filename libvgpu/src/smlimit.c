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
 * the container holds memory on the device, as its kernels may fill them; the idle watcher of
 * smqueue.c also ends the busy time when it finds every stream complete, so CPU time between
 * launches - a framework's warm-up - is not charged as GPU time). Then launches wait until
 * end + busy * 100 / p - (end - start): the idle time already inside the slice counts toward
 * the pause, so a bursty program within its share is not held back (for a fully busy slice
 * this is busy * (100 - p) / p). 250 ms because a duty-cycled H200 boosts
 * its clock between pauses (more work per busy ms than at the power cap); long slices let the
 * power cap engage. The pause is kept in the shared region per device, merged over the
 * container's processes by the union of their busy intervals, so all processes of a
 * container share one budget. A process that exits with a slice open closes it at exit
 * (draining its queued work first), so its last slice is paid by the container's next launch,
 * whichever process makes it: a run of short processes cannot escape its limit. Without a
 * compute limit of its own, a process on a card with a per-card region only publishes when it
 * has work queued (observe mode), so limited neighbours charge themselves their share of the
 * card, not the time it took. Hard cap by default; LIBVGPU_SM_USE_IDLE=true skips the
 * pause while NVML shows no compute process on the card outside this container.
 * The disabled path costs two loads and two predictable branches per launch (launchhooks.c).
 */
#include <stdatomic.h>
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "card.h"
#include "config.h"
#include "devmap.h"
#include "forkreg.h"
#include "log.h"
#include "real.h"
#include "region.h"
#include "smlimit.h"
#include "smqueue.h"

int vgpu_sm_state = SM_UNKNOWN;
static uint64_t slice_ns = 250000000ull;
static int idle_mode;
static uint32_t priority_floor = 5; /* percent a low-priority tenant keeps while a high one works */
static int setup_pid;

#define MAX_GAPS 16
typedef struct {
    pthread_mutex_t mu;
    uint64_t slice_start; /* 0 = no slice open */
    /* Idle gaps of the open slice: this process's work was drained, then the next launch came. */
    int ngaps;
    uint64_t gap_start[MAX_GAPS], gap_len[MAX_GAPS];
} pacer_t;
static pacer_t pacers[VGPU_MAX_DEVICES];
static pthread_once_t sm_once = PTHREAD_ONCE_INIT;

static void close_slice(int rdev, vgpu_device_t *d, pacer_t *pc, uint64_t now, CUstream s, int force,
                        uint64_t prev_launch, int in_launch);

/* At exit: the open slices are closed (their queued work drained and charged to the
 * container's shared pause), so the container's next process pays for this one's last slice. */
static void sm_exit(void) {
    if (setup_pid != (int)getpid() || !vgpu_region) return;
    uint64_t prev = atomic_load(&vgpu_last_launch_ns);
    for (int rdev = 0; rdev < VGPU_MAX_DEVICES; rdev++) {
        pacer_t *pc = &pacers[rdev];
        if (!__atomic_load_n(&pc->slice_start, __ATOMIC_RELAXED) || pthread_mutex_trylock(&pc->mu) != 0) continue;
        pthread_mutex_unlock(&pc->mu); /* no thread is inside close_slice: it may run here */
        close_slice(rdev, &vgpu_region->devices[rdev], pc, vgpu_now_ns(), NULL, 1, prev, 0);
    }
    vgpu_q_exit();
    vgpu_card_exit();
}

static void sm_after_fork(void) {
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        pthread_mutex_init(&pacers[i].mu, NULL);
        pacers[i].slice_start = 0; /* the parent's slice is the parent's to close */
        pacers[i].ngaps = 0;
    }
}
static void charge_dead_slice(int rdev, uint64_t start);
__attribute__((constructor)) static void sm_register_fork(void) {
    vgpu_on_fork_child(sm_after_fork);
    vgpu_dead_slice_hook = charge_dead_slice;
}

static void sm_setup(void) {
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) pthread_mutex_init(&pacers[i].mu, NULL);
    /* A tenant on a card with a per-card region publishes when it has work queued even without a
     * limit of its own, so that limited neighbours charge themselves only their share of the card
     * and low-priority ones step back while a high-priority one works. */
    const char *card_dir = vgpu_getenv("LIBVGPU_CARD_DIR");
    int any = vgpu_config_has_prefix("CUDA_DEVICE_SM_LIMIT") || (card_dir && *card_dir);
    const char *fl = vgpu_getenv("LIBVGPU_PRIORITY_FLOOR");
    uint32_t floor_pct;
    if (fl && vgpu_parse_percent(fl, &floor_pct) == 0 && floor_pct > 0) priority_floor = floor_pct;
    else if (fl) VLOG(VLOG_ERROR, "LIBVGPU_PRIORITY_FLOOR='%s' is not a percent 1..100; using 5", fl);
    int policy = vgpu_sm_policy();
    idle_mode = policy != SM_POLICY_FORCE && vgpu_sm_idle_mode();
    const char *s = vgpu_getenv("LIBVGPU_SM_SLICE_MS");
    if (s && atoi(s) > 0) slice_ns = (uint64_t)atoi(s) * 1000000ull;
    int state = (!any || policy == SM_POLICY_DISABLE || vgpu_control_disabled()) ? SM_NONE : SM_ACTIVE;
    if (state == SM_ACTIVE) {
        VLOG(VLOG_INFO, "compute limiter on (slice %llu ms, %s)", (unsigned long long)(slice_ns / 1000000),
             idle_mode ? "idle-time mode" : "hard cap");
        setup_pid = (int)getpid();
        atexit(sm_exit);
    }
    __atomic_store_n(&vgpu_sm_state, state, __ATOMIC_RELEASE);
}

/* The open slice is published in this process's slot, so that if the process is killed the
 * reaper charges it to the container (vgpu_dead_slice_hook); one device at a time. */
static void publish_slice(int rdev, uint64_t start) {
    int me = vgpu_my_slot();
    if (me < 0) return;
    vgpu_slot_t *sl = &vgpu_region->slots[me];
    if (start) {
        if (atomic_load(&sl->slice_open_ns)) return; /* another device's slice is published */
        atomic_store(&sl->slice_rdev, rdev);
        atomic_store(&sl->slice_open_ns, start);
    } else if (atomic_load(&sl->slice_rdev) == rdev) {
        atomic_store(&sl->slice_open_ns, 0);
    }
}

/* Caller holds pc->mu. */
static void open_slice(int rdev, pacer_t *pc, uint64_t now) {
    pc->ngaps = 0;
    __atomic_store_n(&pc->slice_start, now, __ATOMIC_RELAXED);
    publish_slice(rdev, now);
}

/* The reaper found a dead process of the container with a slice open on `rdev` since `start`:
 * its queued work is charged up to one slice (or up to now), and the shared pause extended, as
 * close_slice would have. */
static void charge_dead_slice(int rdev, uint64_t start) {
    pthread_once(&sm_once, sm_setup); /* the reaping process may not have launched yet */
    vgpu_device_t *d = &vgpu_region->devices[rdev];
    uint32_t p = d->sm_limit;
    uint64_t now = vgpu_now_ns();
    if (p == 0 || p >= 100 || start > now) return;
    uint64_t end = start + slice_ns < now ? start + slice_ns : now;
    uint64_t cov = atomic_load(&d->covered_until_ns), from;
    do {
        from = start > cov ? start : cov;
    } while (!atomic_compare_exchange_weak(&d->covered_until_ns, &cov, cov > end ? cov : end));
    uint64_t busy = end > from ? end - from : 0;
    uint64_t need = busy * 100 / p, window = end - start;
    uint64_t idle = need > window ? need - window : 0;
    uint64_t pu = atomic_load(&d->pause_until_ns), next;
    do {
        next = (pu > end ? pu : end) + idle;
    } while (!atomic_compare_exchange_weak(&d->pause_until_ns, &pu, next));
    atomic_fetch_add(&d->busy_ns_total, busy);
    VLOG(VLOG_INFO, "device %d: a dead process's open slice charged (%llu us busy)", rdev,
         (unsigned long long)(busy / 1000));
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
                        uint64_t prev_launch, int in_launch) {
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
    uint64_t ls = atomic_load(&vgpu_last_drain_ns); /* the program's own, before ours */
    uint64_t tok = vgpu_launch_token(in_launch);
    typedef CUresult (*sync_t)(void);
    sync_t sync = (sync_t)REAL_PTR(cuCtxSynchronize);
    if (sync && sync() == CUDA_SUCCESS) vgpu_q_drained(rdev, tok);
    uint64_t end = vgpu_now_ns();
    if (ls > prev_launch && ls > start && ls < end) end = ls; /* the program drained its work then went idle */
    uint64_t cov = atomic_load(&d->covered_until_ns), from;
    do {
        from = start > cov ? start : cov;
    } while (!atomic_compare_exchange_weak(&d->covered_until_ns, &cov, cov > end ? cov : end));
    uint64_t window = end > from ? end - from : 0;
    uint64_t gaps = pc->ngaps && only_user_of(rdev) ? gaps_within(pc, from, end) : 0;
    uint64_t busy = window > gaps ? window - gaps : 0;
    pc->ngaps = 0;
    /* On a shared card, only this tenant's share of the time it had work queued is its own. */
    uint64_t fair = 0, wall = 0;
    int shared = vgpu_card_take(rdev, &fair, &wall) == 0;
    uint32_t p = d->sm_limit == 0 ? 100 : d->sm_limit;
    /* Deferring to a high-priority neighbour: held to the floor and charged the whole slice (no
     * fair-clock discount). The equal-split model is approximate: on the H200 a low tenant held
     * to a 5 % floor with the discount got 8.7-10.8 % and its high neighbour only 89 % of what it
     * got alone (docs/benchmarks.md); charging in full errs on the high tenant's side. */
    int deferring = vgpu_card_high_priority_active(rdev);
    if (deferring && p > priority_floor) p = priority_floor;
    if (!deferring && shared && wall && fair < wall) busy = (uint64_t)((double)busy * (double)fair / (double)wall);
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
    publish_slice(rdev, 0);
    pthread_mutex_unlock(&pc->mu);
    VLOG(VLOG_DEBUG, "device %d slice: busy %llu us, pause %llu us", rdev, (unsigned long long)(busy / 1000),
         (unsigned long long)(idle / 1000));
}

void vgpu_sm_before_launch(void *stream, int per_thread) {
    if (VGPU_UNLIKELY(__atomic_load_n(&vgpu_sm_state, __ATOMIC_ACQUIRE) == SM_UNKNOWN)) pthread_once(&sm_once, sm_setup);
    if (vgpu_sm_state != SM_ACTIVE) return;
    atomic_fetch_add(&vgpu_launches_started, 1); /* the hook counts it done once the driver has it */
    int rdev = vgpu_current_rdev();
    if (rdev < 0 || !vgpu_region) return;
    vgpu_device_t *d = &vgpu_region->devices[rdev];
    uint64_t now = vgpu_now_ns();
    uint64_t prev_launch = atomic_exchange(&vgpu_last_launch_ns, now);
    if (d->sm_limit >= 100 || d->sm_limit == 0) { /* observe mode: publish queued work, never pace */
        if (vgpu_card_attach(rdev) == 0) vgpu_q_launch(rdev, stream, per_thread);
        return;
    }
    while (atomic_load(&vgpu_region->blocked)) { /* a node agent holds this container back */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    pacer_t *pc = &pacers[rdev];
    uint64_t pu = atomic_load(&d->pause_until_ns);
    uint64_t start = __atomic_load_n(&pc->slice_start, __ATOMIC_RELAXED);
    uint64_t ls = atomic_load(&vgpu_last_drain_ns);
    if (VGPU_UNLIKELY(ls > prev_launch) && ls < now && start) note_gap(pc, ls, now - ls);
    if (now < pu) {
        /* Someone (this or another process) is pausing the device: charge what we ran so far,
         * wait, and open a fresh slice afterwards. */
        if (start) close_slice(rdev, d, pc, now, (CUstream)stream, 1, prev_launch, 1);
    } else if (start == 0) {
        pthread_mutex_lock(&pc->mu);
        if (pc->slice_start == 0) open_slice(rdev, pc, now);
        pthread_mutex_unlock(&pc->mu);
        vgpu_q_launch(rdev, stream, per_thread);
        return;
    } else if (now - start < slice_ns) {
        vgpu_q_launch(rdev, stream, per_thread);
        return;
    } else {
        close_slice(rdev, d, pc, now, (CUstream)stream, 0, prev_launch, 1);
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
    vgpu_q_launch(rdev, stream, per_thread);
}

void vgpu_sm_synced(int kind, void *stream, int per_thread, uint64_t tok) { vgpu_q_synced(kind, stream, per_thread, tok); }
