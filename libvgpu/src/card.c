/*
 * card.c - the per-card shared region: the fair clock that lets the compute limiters of
 * several containers on one card charge only their own share of its time.
 *
 * Why a fair clock: a card without MPS time-slices between the contexts that have work, so
 * while k tenants have work queued each one's kernels progress for about 1/k of the wall
 * time. A limiter that charges itself the wall time of its slices (as it must when alone:
 * that is exact) pays for its neighbours' kernels too, and two tenants at 50 % each ended at
 * about 40 % each, 20 % of the card thrown away. Here each process marks its tenant active
 * while it has work queued on the card (from its first launch after a drain until a
 * synchronisation, the limiter's drain or its idle watcher finds the work done: smqueue.c);
 * the clock advances by 1/k ns per ns while k tenants are active (by 1 when none is), and a
 * process's active time is charged the clock's advance across it. Alone, k = 1 and the charge
 * is the wall time. Tenants without a compute limit publish too (observe mode), so a limited
 * tenant beside an unlimited one is charged only its half of the time both have work.
 *
 * Every process of every tenant on the card can write every byte of the file, so nothing read
 * from it is trusted: counts and times are range-checked, a clock that runs backwards or jumps
 * is restarted, a charge is never more than the wall time it covers, and the lock is bounded:
 * a holder stuck for LOCK_BREAK_NS (killed inside, or lock words of garbage) is broken, and a
 * waiter that cannot get it within LOCK_GIVEUP_NS stops using the region for DETACH_NS (the
 * limiter then works alone, as without a neighbour). So a tenant can at worst make its
 * neighbours charge themselves more or less than their share (their caps), never make them
 * wait or crash. A tenant is active while it has work queued and touched its entry within
 * STALE_NS (its idle watcher touches it every 100 ms while work is queued), so a killed
 * process drops out after STALE_NS. Entries untouched for FREE_NS are reused.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "card.h"
#include "config.h"
#include "forkreg.h"
#include "log.h"
#include "region.h"
#include "util.h"
#include "vgpu_card.h"

#define STALE_NS 1000000000ull
#define FREE_NS 60000000000ull
#define LOCK_BREAK_NS 10000000ull
#define LOCK_GIVEUP_NS 30000000ull
#define DETACH_NS 10000000000ull
#define CLOCK_JUMP_NS 10000000000ull /* a clock gap longer than this restarts the clock */
#define MAX_OPEN 4096u               /* more processes with work than this is garbage */

typedef struct {
    int state; /* 0 not tried, 1 none, 2 attached */
    vgpu_card_region_t *r;
    int idx;
    _Atomic uint64_t detached_until; /* lock unusable: work alone until then */
    /* This process's active interval (under the card lock) and what it accumulated. */
    int active;
    uint64_t v_act, t_act, acc_fair, acc_wall;
} card_ref_t;
static card_ref_t refs[VGPU_MAX_DEVICES];
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER; /* this process's threads, before the file lock */

static int card_lock(vgpu_card_region_t *r) {
    uint64_t t0 = vgpu_now_ns(), seen = 0, seen_at = t0;
    int looked = 0;
    for (unsigned spins = 0;; spins++) {
        uint32_t z = 0;
        if (atomic_compare_exchange_weak(&r->lock, &z, 1)) {
            atomic_store(&r->lock_ns, vgpu_now_ns());
            return 0;
        }
        if ((spins & 63) == 63) {
            uint64_t t = atomic_load(&r->lock_ns), now = vgpu_now_ns();
            if (!looked || t != seen) {
                seen = t; /* a new holder (or the first look): its 10 ms start now */
                seen_at = now;
                looked = 1;
            } else if (now - seen_at > LOCK_BREAK_NS && atomic_compare_exchange_strong(&r->lock_ns, &t, now)) {
                /* the same holder for 10 ms - killed inside, or words of garbage: take it over */
                atomic_store(&r->lock, 1);
                return 0;
            }
            if (now - t0 > LOCK_GIVEUP_NS) return -1;
            sched_yield();
        }
    }
}

static void card_unlock(vgpu_card_region_t *r) {
    atomic_store(&r->lock_ns, 0);
    atomic_store(&r->lock, 0);
}

static int tenant_active(vgpu_card_tenant_t *t, uint64_t now) {
    uint32_t open = atomic_load(&t->open);
    uint64_t touch = atomic_load(&t->touch_ns);
    return atomic_load(&t->key) && open > 0 && open <= MAX_OPEN && touch <= now && now - touch < STALE_NS;
}

/* Caller holds the lock: advances the clock to `now` at the rate of the last count (a count
 * or a time out of range restarts it), then recounts the active tenants. */
static void advance(vgpu_card_region_t *r, uint64_t now) {
    uint64_t last = r->last_ns;
    uint32_t k = r->active;
    if (last > now || now - last > CLOCK_JUMP_NS || k > VGPU_CARD_MAX_TENANTS) {
        r->last_ns = now; /* garbage or a long idle: no advance */
    } else if (now > last) {
        uint64_t dt = now - last;
        r->vclock_ns += k > 1 ? dt / k : dt;
        r->last_ns = now;
    }
    k = 0;
    for (int i = 0; i < VGPU_CARD_MAX_TENANTS; i++) k += tenant_active(&r->tenants[i], now) ? 1 : 0;
    r->active = k;
}

/* A tenant can truncate the card file: the pages of a shared mapping past its end then fault
 * (SIGBUS) in every process that touches them. A fault inside a card mapping is answered by
 * putting zeroed private memory in its place (mmap is async-signal-safe), so the access is
 * retried there and the process goes on working alone on that device; any other SIGBUS goes to
 * the handler that was there before. */
static _Atomic(void *) mapped[VGPU_MAX_DEVICES];
static _Atomic int lost[VGPU_MAX_DEVICES];
static struct sigaction prev_bus;

static void on_bus(int sig, siginfo_t *si, void *uc) {
    char *a = si ? (char *)si->si_addr : NULL;
    for (int i = 0; i < VGPU_MAX_DEVICES && a; i++) {
        char *m = atomic_load(&mapped[i]);
        if (m && a >= m && a < m + sizeof(vgpu_card_region_t)) {
            mmap(m, sizeof(vgpu_card_region_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            atomic_store(&lost[i], 1);
            return;
        }
    }
    if (prev_bus.sa_flags & SA_SIGINFO) {
        if (prev_bus.sa_sigaction) prev_bus.sa_sigaction(sig, si, uc);
        return;
    }
    if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN && prev_bus.sa_handler) {
        prev_bus.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL); /* the default action: returning re-raises the fault */
}

static void guard_mapping(int rdev, vgpu_card_region_t *r) {
    static int installed;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_bus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &prev_bus) == 0) installed = 1;
    }
    atomic_store(&mapped[rdev], (void *)r);
}

static vgpu_card_region_t *map_card(const char *path, int guard_rdev) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        VLOG(errno == ENOENT ? VLOG_INFO : VLOG_WARN, "card region %s: %s; the compute limiter works alone", path,
             strerror(errno));
        return NULL;
    }
    /* The lock orders the first formatting of the file. Any tenant can hold it forever, so it
     * is asked for without blocking, for at most 50 ms; without it the header is still written
     * only over a zero magic, and every writer writes the same values. */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    int locked = 0;
    for (int i = 0; i < 50 && !locked; i++) {
        locked = fcntl(fd, F_OFD_SETLK, &fl) == 0 || (errno == EINVAL && fcntl(fd, F_SETLK, &fl) == 0);
        if (!locked) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        ((size_t)st.st_size >= sizeof(vgpu_card_region_t) || ftruncate(fd, sizeof(vgpu_card_region_t)) == 0))
        p = mmap(NULL, sizeof(vgpu_card_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    vgpu_card_region_t *r = p == MAP_FAILED ? NULL : p;
    if (r) guard_mapping(guard_rdev, r);
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
        atomic_store(&mapped[guard_rdev], NULL);
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
    pthread_mutex_init(&local_mu, NULL);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) { /* the parent's intervals are not the child's */
        refs[i].active = 0;
        refs[i].acc_fair = refs[i].acc_wall = 0;
    }
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
            r = map_card(path, rdev);
        }
        if (r && card_lock(r) != 0) {
            VLOG(VLOG_WARN, "card region of %s: its lock stays held; the compute limiter works alone",
                 vgpu_region->devices[rdev].uuid);
        } else if (r) {
            uint64_t key = vgpu_region_key(), now = vgpu_now_ns();
            for (int i = 0; i < VGPU_CARD_MAX_TENANTS && idx < 0; i++)
                if (atomic_load(&r->tenants[i].key) == key) idx = i;
            for (int i = 0; i < VGPU_CARD_MAX_TENANTS && idx < 0; i++) {
                vgpu_card_tenant_t *t = &r->tenants[i];
                uint64_t touch = atomic_load(&t->touch_ns);
                if (!atomic_load(&t->key) || touch > now || now - touch > FREE_NS) {
                    memset((void *)t, 0, sizeof *t);
                    atomic_store(&t->key, key);
                    idx = i;
                }
            }
            if (idx >= 0) {
                vgpu_card_tenant_t *t = &r->tenants[idx];
                t->sm_limit = vgpu_region->devices[rdev].sm_limit;
                t->priority = vgpu_task_priority();
                if (atomic_load(&t->open) > MAX_OPEN) atomic_store(&t->open, 0);
                atomic_store(&t->touch_ns, now);
            }
            card_unlock(r);
            if (idx < 0) VLOG(VLOG_WARN, "card region of %s: all %d tenant entries in use; the limiter works alone",
                              vgpu_region->devices[rdev].uuid, VGPU_CARD_MAX_TENANTS);
            else VLOG(VLOG_INFO, "card region of %s: tenant %d", vgpu_region->devices[rdev].uuid, idx);
        }
        if (r && idx < 0) {
            atomic_store(&mapped[rdev], NULL);
            munmap(r, sizeof(vgpu_card_region_t));
        }
        c->r = idx >= 0 ? r : NULL;
        if (idx >= 0) guard_mapping(rdev, r);
        c->idx = idx;
        __atomic_store_n(&c->state, idx >= 0 ? 2 : 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&attach_mu);
    return c->state == 2 ? 0 : -1;
}

/* The region of `rdev` locked, or NULL (none, or its lock unusable: then detached a while).
 * Holds local_mu as well on success. */
static vgpu_card_region_t *lock_of(int rdev, uint64_t now) {
    if (vgpu_card_attach(rdev) != 0) return NULL;
    card_ref_t *c = &refs[rdev];
    if (now < atomic_load(&c->detached_until) || atomic_load(&lost[rdev])) return NULL;
    pthread_mutex_lock(&local_mu);
    if (card_lock(c->r) == 0) return c->r;
    pthread_mutex_unlock(&local_mu);
    atomic_store(&c->detached_until, now + DETACH_NS);
    VLOG(VLOG_WARN, "card region of device %d: lock held past %llu ms; working alone for %llu s", rdev,
         (unsigned long long)(LOCK_GIVEUP_NS / 1000000), (unsigned long long)(DETACH_NS / 1000000000ull));
    return NULL;
}

static void unlock_of(vgpu_card_region_t *r) {
    card_unlock(r);
    pthread_mutex_unlock(&local_mu);
}

/* Caller holds the lock: closes this process's active interval at `now`. */
static void close_interval(card_ref_t *c, vgpu_card_tenant_t *t, uint64_t now) {
    if (!c->active) return;
    uint64_t v = c->r->vclock_ns;
    uint64_t wall = now > c->t_act ? now - c->t_act : 0;
    uint64_t fair = v > c->v_act ? v - c->v_act : 0;
    if (fair > wall) fair = wall; /* a clock written forward: never charge more than the wall time */
    c->acc_fair += fair;
    c->acc_wall += wall;
    atomic_fetch_add(&t->fair_busy_ns_total, fair);
    atomic_fetch_add(&t->wall_busy_ns_total, wall);
    c->active = 0;
}

void vgpu_card_queued(int rdev, int on) {
    uint64_t now = vgpu_now_ns();
    vgpu_card_region_t *r = lock_of(rdev, now);
    if (!r) return;
    card_ref_t *c = &refs[rdev];
    vgpu_card_tenant_t *t = &r->tenants[c->idx];
    advance(r, now);
    uint32_t open = atomic_load(&t->open);
    if (open > MAX_OPEN) open = 0;
    if (on && !c->active) {
        open++;
        c->active = 1;
        c->v_act = r->vclock_ns;
        c->t_act = now;
    } else if (!on && c->active) {
        close_interval(c, t, now);
        if (open) open--;
    }
    atomic_store(&t->open, open);
    atomic_store(&t->touch_ns, now);
    advance(r, now);
    if (on && c->active) c->v_act = r->vclock_ns; /* the recount may have restarted the clock */
    unlock_of(r);
}

int vgpu_card_take(int rdev, uint64_t *fair, uint64_t *wall) {
    uint64_t now = vgpu_now_ns();
    *fair = *wall = 0;
    vgpu_card_region_t *r = lock_of(rdev, now);
    if (!r) return -1;
    card_ref_t *c = &refs[rdev];
    advance(r, now);
    if (c->active) { /* split the open interval at now */
        close_interval(c, &r->tenants[c->idx], now);
        c->active = 1;
        c->v_act = r->vclock_ns;
        c->t_act = now;
    }
    *fair = c->acc_fair;
    *wall = c->acc_wall;
    c->acc_fair = c->acc_wall = 0;
    unlock_of(r);
    return 0;
}

void vgpu_card_touch(int rdev) {
    if (vgpu_card_attach(rdev) != 0) return;
    atomic_store(&refs[rdev].r->tenants[refs[rdev].idx].touch_ns, vgpu_now_ns());
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

void vgpu_card_exit(void) {
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        if (__atomic_load_n(&refs[i].state, __ATOMIC_ACQUIRE) == 2 && refs[i].active) vgpu_card_queued(i, 0);
}
