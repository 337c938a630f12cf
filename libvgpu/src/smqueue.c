/*
 * smqueue.c - when this process has work queued on a device: from its first launch after a
 * drain until a synchronisation that covered all of it, the limiter's own drain, or the idle
 * watcher finding every stream it launched on complete.
 *
 * Why it matters: the compute limiter charges a slice's wall time less the time the GPU had
 * none of this process's work, and the per-card fair clock counts a tenant as sharing the card
 * only while it has work queued. Without the watcher, CPU time between launches without a
 * synchronisation (a framework's warm-up: library handles, lazy module loads) was charged as
 * GPU time and paid back at the limit's rate, so a tenant at 10 % did no work for its first
 * ~10 s; and a neighbour that launched a tiny kernel every 50 ms counted as sharing the card
 * all the time, so a tenant beside it charged itself half of what it used.
 *
 * The watcher is one thread per process, started at the first launch: every millisecond
 * while work is queued and no launch came for a millisecond it asks the driver whether every
 * stream launched on since the last drain is complete (cuStreamQuery, after cuStreamIsCapturing;
 * the thread's capture mode is relaxed, so it can never invalidate another thread's graph
 * capture). Up to 4 streams are followed; more, a per-thread default stream (not queryable
 * from another thread), a second context, or a destroyed stream leave the device to the
 * synchronisations and the limiter's drain (charged as busy meanwhile: the safe side).
 * A launch and a drain race through a store-then-load pair on both sides (sequentially
 * consistent), so a launch is never lost: either the drain sees it and backs out, or the
 * launch sees the device idle and marks it queued again. A launch is marked queued before the
 * driver has it, so a drain also needs every launch that entered the limiter to have come back
 * from the driver (vgpu_launches_started == vgpu_launches_done) when it began.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include "card.h"
#include "devmap.h"
#include "forkreg.h"
#include "real.h"
#include "region.h"
#include "smqueue.h"

#define MAXS 4
#define UNTRACKED (MAXS + 1)
#define PT_MARK ((uintptr_t)0x2) /* CU_STREAM_PER_THREAD */
#define POLL_NS 1000000ull
#define QUIET_NS 1000000ull  /* no launch for this long before the watcher asks */
#define TOUCH_NS 100000000ull

_Atomic uint64_t vgpu_last_launch_ns, vgpu_last_drain_ns;
_Atomic uint32_t vgpu_launches_started, vgpu_launches_done;

/* 1 when no launch was in flight at `tok` and none has started since. */
static int still_quiet(uint64_t tok) {
    uint32_t s = (uint32_t)(tok >> 32), d = (uint32_t)tok;
    return s == d && atomic_load(&vgpu_launches_started) == s;
}

typedef struct {
    _Atomic int queued;
    _Atomic int nstreams; /* 0..MAXS followed; UNTRACKED: cannot ask */
    _Atomic uintptr_t streams[MAXS];
    CUcontext ctx;
    uint64_t last_touch;
    pthread_mutex_t mu; /* slow path of launches, drains, the watcher's questions */
} devq_t;
static devq_t qs[VGPU_MAX_DEVICES];
static pthread_once_t q_once = PTHREAD_ONCE_INIT;
static _Atomic int watcher_pid, exiting;

static void q_init(void) {
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) pthread_mutex_init(&qs[i].mu, NULL);
}

static uintptr_t norm(void *stream, int per_thread) {
    uintptr_t s = (uintptr_t)stream;
    if (s == 0 && per_thread) return PT_MARK;
    if (s == 0x1) return 0; /* CU_STREAM_LEGACY is the NULL stream */
    return s;
}

static CUcontext current_ctx(void) {
    CUcontext c = NULL;
    CALL_REAL(CUresult(*)(CUcontext *), cuCtxGetCurrent, &c);
    return c;
}

/* Caller holds q->mu. */
static void follow(devq_t *q, uintptr_t s) {
    int n = atomic_load(&q->nstreams);
    if (n > MAXS) return;
    for (int i = 0; i < n; i++)
        if (atomic_load(&q->streams[i]) == s) return;
    if (s == PT_MARK || n == MAXS || current_ctx() != q->ctx) { atomic_store(&q->nstreams, UNTRACKED); return; }
    atomic_store(&q->streams[n], s);
    atomic_store(&q->nstreams, n + 1);
}

static void *watch(void *arg);

static void start_watcher(void) {
    int me = (int)getpid();
    if (atomic_load(&watcher_pid) == me) return;
    atomic_store(&watcher_pid, me);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 64 * 1024);
    if (pthread_create(&t, &a, watch, NULL) != 0) atomic_store(&watcher_pid, 0);
    pthread_attr_destroy(&a);
}

void vgpu_q_launch(int rdev, void *stream, int per_thread) {
    devq_t *q = &qs[rdev];
    uintptr_t s = norm(stream, per_thread);
    if (VGPU_LIKELY(atomic_load(&q->queued))) {
        int n = atomic_load(&q->nstreams);
        if (n > MAXS) return;
        for (int i = 0; i < n; i++)
            if (atomic_load(&q->streams[i]) == s) return;
    }
    pthread_once(&q_once, q_init);
    pthread_mutex_lock(&q->mu);
    if (!atomic_load(&q->queued)) {
        q->ctx = current_ctx();
        atomic_store(&q->nstreams, 0);
        follow(q, s);
        atomic_store(&q->queued, 1);
        q->last_touch = vgpu_now_ns();
        vgpu_card_queued(rdev, 1);
    } else {
        follow(q, s);
    }
    pthread_mutex_unlock(&q->mu);
    start_watcher();
}

/* Caller holds q->mu: the work launched before `tok` is known done; 1 when that is all of it. */
static int drain_locked(devq_t *q, int rdev, uint64_t tok) {
    if (!atomic_load(&q->queued)) return 1;
    atomic_store(&q->queued, 0);
    if (!still_quiet(tok)) { /* a launch was in flight or raced the drain */
        atomic_store(&q->queued, 1);
        return 0;
    }
    atomic_store(&q->nstreams, 0);
    vgpu_card_queued(rdev, 0);
    return 1;
}

static int drain(int rdev, uint64_t tok) {
    pthread_once(&q_once, q_init);
    devq_t *q = &qs[rdev];
    pthread_mutex_lock(&q->mu);
    int ok = drain_locked(q, rdev, tok);
    pthread_mutex_unlock(&q->mu);
    if (ok) atomic_store(&vgpu_last_drain_ns, vgpu_now_ns());
    return ok;
}

void vgpu_q_drained(int rdev, uint64_t tok) {
    if (rdev >= 0 && rdev < VGPU_MAX_DEVICES) drain(rdev, tok);
}

int vgpu_q_synced(int kind, void *stream, int per_thread, uint64_t tok) {
    int rdev = vgpu_current_rdev();
    if (rdev < 0 || rdev >= VGPU_MAX_DEVICES) return 0;
    devq_t *q = &qs[rdev];
    if (!atomic_load(&q->queued)) {
        atomic_store(&vgpu_last_drain_ns, vgpu_now_ns());
        return 1;
    }
    int n = atomic_load(&q->nstreams);
    int all = kind == VGPU_SYNC_CTX ||
              (kind == VGPU_SYNC_STREAM && n == 1 && atomic_load(&q->streams[0]) == norm(stream, per_thread)) ||
              (kind == VGPU_SYNC_EVENT && n == 1);
    return all ? drain(rdev, tok) : 0;
}

int vgpu_q_busy(int rdev) { return rdev >= 0 && rdev < VGPU_MAX_DEVICES && atomic_load(&qs[rdev].queued); }

/* Caller holds q->mu: 1 when every followed stream is complete. */
static int all_done(devq_t *q, CUcontext *cur) {
    typedef CUresult (*query_t)(CUstream);
    typedef CUresult (*cap_t)(CUstream, CUstreamCaptureStatus *);
    query_t query = (query_t)REAL_PTR(cuStreamQuery);
    cap_t iscap = (cap_t)REAL_PTR(cuStreamIsCapturing);
    int n = atomic_load(&q->nstreams);
    if (!query || !iscap || n < 1 || n > MAXS || !q->ctx) return 0;
    if (*cur != q->ctx) {
        if (CALL_REAL(CUresult(*)(CUcontext), cuCtxSetCurrent, q->ctx) != CUDA_SUCCESS) return 0;
        *cur = q->ctx;
    }
    for (int i = 0; i < n; i++) {
        CUstream s = (CUstream)atomic_load(&q->streams[i]);
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        if (iscap(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE) return 0;
        if (query(s) != CUDA_SUCCESS) return 0;
    }
    return 1;
}

static void *watch(void *arg) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CALL_REAL(CUresult(*)(CUstreamCaptureMode *), cuThreadExchangeStreamCaptureMode, &mode);
    CUcontext cur = NULL;
    while (!atomic_load(&exiting) && atomic_load(&watcher_pid) == (int)getpid()) {
        int any = 0;
        for (int rdev = 0; rdev < VGPU_MAX_DEVICES; rdev++) {
            devq_t *q = &qs[rdev];
            if (!atomic_load(&q->queued)) continue;
            any = 1;
            uint64_t now = vgpu_now_ns(), ll = atomic_load(&vgpu_last_launch_ns);
            if (now - q->last_touch >= TOUCH_NS) {
                vgpu_card_touch(rdev);
                q->last_touch = now;
            }
            if (now < ll + QUIET_NS) continue; /* launches are flowing: ask in a pause */
            uint64_t tok = vgpu_launch_token(0);
            if ((uint32_t)(tok >> 32) != (uint32_t)tok) continue; /* a launch is in flight */
            pthread_mutex_lock(&q->mu);
            int done = !atomic_load(&exiting) && atomic_load(&q->queued) && all_done(q, &cur);
            int ok = done && drain_locked(q, rdev, tok);
            pthread_mutex_unlock(&q->mu);
            if (ok) atomic_store(&vgpu_last_drain_ns, vgpu_now_ns());
        }
        struct timespec ts = {0, (long)(any ? POLL_NS : 20 * POLL_NS)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

void vgpu_q_forget_stream(void *stream) {
    uintptr_t s = norm(stream, 0);
    pthread_once(&q_once, q_init);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        devq_t *q = &qs[i];
        if (!atomic_load(&q->queued)) continue;
        pthread_mutex_lock(&q->mu);
        int n = atomic_load(&q->nstreams);
        for (int k = 0; k < n && n <= MAXS; k++)
            if (atomic_load(&q->streams[k]) == s) atomic_store(&q->nstreams, UNTRACKED);
        pthread_mutex_unlock(&q->mu);
    }
}

void vgpu_q_exit(void) {
    atomic_store(&exiting, 1);
    pthread_once(&q_once, q_init);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) { /* wait for a question in flight (bounded: ~1 us each) */
        for (int k = 0; k < 1000; k++) {
            if (pthread_mutex_trylock(&qs[i].mu) == 0) {
                pthread_mutex_unlock(&qs[i].mu);
                break;
            }
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

static void q_after_fork(void) {
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        pthread_mutex_init(&qs[i].mu, NULL);
        atomic_store(&qs[i].queued, 0); /* the parent's work is not the child's */
        atomic_store(&qs[i].nstreams, 0);
    }
    atomic_store(&watcher_pid, 0);
    atomic_store(&vgpu_launches_started, 0); /* a launch in flight in another thread of the parent */
    atomic_store(&vgpu_launches_done, 0);
}
__attribute__((constructor)) static void q_register_fork(void) { vgpu_on_fork_child(q_after_fork); }
