/*
 * card.c - the per-card shared region: the fair clock that lets the compute limiters of
 * several containers on one card charge only their own share of its time.
 *
 * Why a fair clock: a card without MPS time-slices between the contexts that have work, so
 * while k tenants have work queued each one's kernels progress for about 1/k of the wall
 * time. A limiter that charges itself the wall time of its slices (as it must when alone:
 * that is exact) pays for its neighbours' kernels too, and two tenants at 50 % each ended at
 * about 40 % each, 20 % of the card thrown away. Here each tenant marks itself active while a
 * slice of one of its processes is open; the clock advances by 1/k ns per ns while k tenants
 * are active (by 1 when none is), and a slice is charged the clock's advance across it. Alone,
 * k = 1 and the charge is the wall time, as before.
 *
 * A tenant is active while it has an open slice and touched its entry within STALE_NS, so a
 * tenant killed with a slice open drops out after STALE_NS; the error then is on the safe
 * side (the others are charged more, not less). Entries untouched for FREE_NS are reused.
 * The lock is a spin lock word in the file, held for a few dozen loads and stores at slice
 * boundaries (every LIBVGPU_SM_SLICE_MS per process), never on the launch path.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "card.h"
#include "config.h"
#include "forkreg.h"
#include "log.h"
#include "region.h"
#include "util.h"
#include "vgpu_card.h"

#define STALE_NS 2000000000ull
#define FREE_NS 60000000000ull
#define LOCK_BREAK_NS 10000000ull

typedef struct {
    int state; /* 0 not tried, 1 none, 2 attached */
    vgpu_card_region_t *r;
    int idx;
    _Atomic uint32_t my_open; /* slices of this process open now */
} card_ref_t;
static card_ref_t refs[VGPU_MAX_DEVICES];
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t attached_pid;

/* A process that exits inside a slice takes its open count with it, so its tenant is not
 * counted active for STALE_NS after it is gone. */
static void card_exit(void) {
    if (attached_pid != getpid()) return; /* a forked child inherited the table, not the slices */
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        card_ref_t *c = &refs[i];
        uint32_t n = atomic_exchange(&c->my_open, 0);
        if (c->state != 2 || !n) continue;
        vgpu_card_tenant_t *t = &c->r->tenants[c->idx];
        uint32_t cur = atomic_load(&t->open);
        while (cur && !atomic_compare_exchange_weak(&t->open, &cur, cur > n ? cur - n : 0)) {}
    }
}

static void card_lock(vgpu_card_region_t *r) {
    for (unsigned spins = 0;; spins++) {
        uint32_t z = 0;
        if (atomic_compare_exchange_weak(&r->lock, &z, 1)) {
            atomic_store(&r->lock_ns, vgpu_now_ns());
            return;
        }
        if ((spins & 63) == 63) {
            uint64_t t = atomic_load(&r->lock_ns), now = vgpu_now_ns();
            /* a holder that died inside the section: take the lock over */
            if (t && now - t > LOCK_BREAK_NS && atomic_compare_exchange_strong(&r->lock_ns, &t, now)) return;
            sched_yield();
        }
    }
}

static void card_unlock(vgpu_card_region_t *r) {
    atomic_store(&r->lock_ns, 0);
    atomic_store(&r->lock, 0);
}

static int tenant_active(vgpu_card_tenant_t *t, uint64_t now) {
    return atomic_load(&t->key) && atomic_load(&t->open) > 0 && now - atomic_load(&t->touch_ns) < STALE_NS;
}

/* Caller holds the lock: advances the clock to `now` at the rate of the last count, then
 * recounts the active tenants. */
static void advance(vgpu_card_region_t *r, uint64_t now) {
    if (now > r->last_ns) {
        uint64_t dt = now - r->last_ns;
        r->vclock_ns += r->active > 1 ? dt / r->active : dt;
        r->last_ns = now;
    }
    uint32_t k = 0;
    for (int i = 0; i < VGPU_CARD_MAX_TENANTS; i++) k += tenant_active(&r->tenants[i], now) ? 1 : 0;
    r->active = k;
}

static vgpu_card_region_t *map_card(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        VLOG(errno == ENOENT ? VLOG_INFO : VLOG_WARN, "card region %s: %s; the compute limiter works alone", path,
             strerror(errno));
        return NULL;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    int locked = fcntl(fd, F_OFD_SETLKW, &fl) == 0 || fcntl(fd, F_SETLKW, &fl) == 0;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && ((size_t)st.st_size >= sizeof(vgpu_card_region_t) ||
                                ftruncate(fd, sizeof(vgpu_card_region_t)) == 0))
        p = mmap(NULL, sizeof(vgpu_card_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    vgpu_card_region_t *r = p == MAP_FAILED ? NULL : p;
    if (r && atomic_load((_Atomic uint32_t *)&r->magic) == 0) {
        r->major = VGPU_CARD_MAJOR;
        r->minor = VGPU_CARD_MINOR;
        r->header_size = VGPU_CARD_HEADER_SIZE;
        r->tenant_size = VGPU_CARD_TENANT_SIZE;
        r->max_tenants = VGPU_CARD_MAX_TENANTS;
        r->last_ns = vgpu_now_ns();
        atomic_store((_Atomic uint32_t *)&r->magic, VGPU_CARD_MAGIC);
    } else if (r && (r->magic != VGPU_CARD_MAGIC || r->major != VGPU_CARD_MAJOR)) {
        VLOG(VLOG_ERROR, "card region %s: magic 0x%x major %u, expected 0x%x major %u; the compute limiter works alone",
             path, r->magic, r->major, VGPU_CARD_MAGIC, VGPU_CARD_MAJOR);
        munmap(p, sizeof(vgpu_card_region_t));
        r = NULL;
    }
    if (locked) {
        fl.l_type = F_UNLCK;
        if (fcntl(fd, F_OFD_SETLK, &fl) != 0) fcntl(fd, F_SETLK, &fl);
    }
    close(fd); /* the mapping stays */
    if (!r && p == MAP_FAILED) VLOG(VLOG_WARN, "card region %s unusable (%s)", path, strerror(errno));
    return r;
}

static void card_after_fork(void) {
    pthread_mutex_init(&attach_mu, NULL);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) atomic_store(&refs[i].my_open, 0);
}
__attribute__((constructor)) static void card_register_fork(void) { vgpu_on_fork_child(card_after_fork); }

int vgpu_card_attach(int rdev) {
    if (rdev < 0 || rdev >= VGPU_MAX_DEVICES || !vgpu_region) return -1;
    card_ref_t *c = &refs[rdev];
    if (VGPU_LIKELY(__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != 0)) return c->state == 2 ? 0 : -1;
    pthread_mutex_lock(&attach_mu);
    if (c->state == 0) {
        const char *dir = vgpu_getenv("LIBVGPU_CARD_DIR");
        vgpu_card_region_t *r = NULL;
        int idx = -1;
        if (dir && *dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.card", dir, vgpu_region->devices[rdev].uuid);
            r = map_card(path);
        }
        if (r) {
            uint64_t key = vgpu_region_key(), now = vgpu_now_ns();
            card_lock(r);
            for (int i = 0; i < VGPU_CARD_MAX_TENANTS && idx < 0; i++)
                if (atomic_load(&r->tenants[i].key) == key) idx = i;
            for (int i = 0; i < VGPU_CARD_MAX_TENANTS && idx < 0; i++) {
                vgpu_card_tenant_t *t = &r->tenants[i];
                if (!atomic_load(&t->key) || now - atomic_load(&t->touch_ns) > FREE_NS) {
                    memset((void *)t, 0, sizeof *t);
                    atomic_store(&t->key, key);
                    idx = i;
                }
            }
            if (idx >= 0) {
                vgpu_card_tenant_t *t = &r->tenants[idx];
                t->sm_limit = vgpu_region->devices[rdev].sm_limit;
                t->priority = vgpu_task_priority();
                atomic_store(&t->touch_ns, now);
            }
            card_unlock(r);
            if (idx < 0) VLOG(VLOG_WARN, "card region of %s: all %d tenant entries in use; the limiter works alone",
                              vgpu_region->devices[rdev].uuid, VGPU_CARD_MAX_TENANTS);
            else VLOG(VLOG_INFO, "card region of %s: tenant %d", vgpu_region->devices[rdev].uuid, idx);
        }
        c->r = idx >= 0 ? r : NULL;
        c->idx = idx;
        if (idx >= 0 && attached_pid != getpid()) {
            attached_pid = getpid();
            atexit(card_exit);
        }
        __atomic_store_n(&c->state, idx >= 0 ? 2 : 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&attach_mu);
    return c->state == 2 ? 0 : -1;
}

uint64_t vgpu_card_slice_open(int rdev) {
    if (vgpu_card_attach(rdev) != 0) return 0;
    vgpu_card_region_t *r = refs[rdev].r;
    vgpu_card_tenant_t *t = &r->tenants[refs[rdev].idx];
    uint64_t now = vgpu_now_ns();
    card_lock(r);
    if (now - atomic_load(&t->touch_ns) >= STALE_NS) atomic_store(&t->open, 0); /* a dead process's count */
    advance(r, now);
    atomic_fetch_add(&t->open, 1);
    atomic_fetch_add(&refs[rdev].my_open, 1);
    atomic_store(&t->touch_ns, now);
    advance(r, now);
    uint64_t v = r->vclock_ns;
    card_unlock(r);
    return v;
}

uint64_t vgpu_card_slice_close(int rdev, uint64_t v_open, uint64_t wall_busy) {
    if (vgpu_card_attach(rdev) != 0) return UINT64_MAX;
    vgpu_card_region_t *r = refs[rdev].r;
    vgpu_card_tenant_t *t = &r->tenants[refs[rdev].idx];
    uint64_t now = vgpu_now_ns();
    card_lock(r);
    advance(r, now);
    uint64_t v = r->vclock_ns;
    if (atomic_load(&t->open) > 0) atomic_fetch_sub(&t->open, 1);
    if (atomic_load(&refs[rdev].my_open) > 0) atomic_fetch_sub(&refs[rdev].my_open, 1);
    atomic_store(&t->touch_ns, now);
    advance(r, now);
    card_unlock(r);
    uint64_t fair = v > v_open ? v - v_open : 0;
    atomic_fetch_add(&t->wall_busy_ns_total, wall_busy);
    return fair;
}

int vgpu_card_high_priority_active(int rdev) {
    if (vgpu_card_attach(rdev) != 0) return 0;
    vgpu_card_region_t *r = refs[rdev].r;
    int me = refs[rdev].idx;
    if (r->tenants[me].priority == 0) return 0;
    uint64_t now = vgpu_now_ns();
    for (int i = 0; i < VGPU_CARD_MAX_TENANTS; i++)
        if (i != me && r->tenants[i].priority == 0 && tenant_active(&r->tenants[i], now)) return 1;
    return 0;
}

void vgpu_card_charge(int rdev, uint64_t fair_busy) {
    if (vgpu_card_attach(rdev) != 0) return;
    atomic_fetch_add(&refs[rdev].r->tenants[refs[rdev].idx].fair_busy_ns_total, fair_busy);
}
