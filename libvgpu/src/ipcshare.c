/*
 * ipcshare.c - an allocation shared by legacy IPC inside one container is charged once.
 *
 * Why: the exporter pays for its allocation; charging each importer too counted the same bytes
 * again for every process of the container that maps them (PyTorch multiprocessing sharing CUDA
 * tensors, vLLM's and NCCL's IPC all-reduce buffers), which ran into false out-of-memory answers.
 * Charging only the exporter is not enough either: the driver keeps the memory while an importer
 * maps it, so the charge must outlive the exporter's free (or death) for as long as any process of
 * the container holds the allocation.
 *
 * How: a table of the container's exported allocations lives in a side file next to the region
 * (<region>.ipc, opened O_NOFOLLOW, a regular file only). Each entry holds the IPC handle's bytes,
 * the allocation's size and device, its holders (pid, slot, start time: the exporter and every
 * open import) and which holder's slot carries the charge. An import whose handle is in the table
 * with another live holder joins it and pays nothing; when the charging holder lets go (free,
 * close, exit, or found dead by the region's reaper, which calls us before it zeroes the slot)
 * the charge is added to a remaining live holder's slot, and it is given back only when the last
 * holder goes. An import not in the table came from another container and is charged as before.
 *
 * The file is the tenant's, like the region: bytes written into it can only hurt the container
 * that wrote them. Every entry is checked before use; a table that is garbage, full, or whose
 * lock cannot be had within ~0.5 s fails closed: the import is charged as a foreign one, and an
 * exporter whose entry is unusable keeps its charge (until it exits) instead of dropping it.
 * Locks: a process mutex and an fcntl open-file-description lock on the side file, both taken
 * with a bounded wait (the kernel drops the file lock when its holder dies).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "forkreg.h"
#include "ipcshare.h"
#include "log.h"
#include "region.h"

#define SHARE_MAGIC 0x43504956u /* bytes "VIPC" in file order */
#define SHARE_MAJOR 1u
#define SHARE_MINOR 0u
#define SHARE_ENTRIES 2048
#define SHARE_HOLDERS 16
#define SHARE_HEADER 256u
#define SHARE_ENTRY 384u
#define KIND_IPC 1u
#define LOCK_TRIES 500 /* x 1 ms */

typedef struct {
    int32_t pid; /* 0 = free */
    int32_t slot;
    uint64_t start_time;
} holder_t;
typedef struct {
    uint32_t state; /* 0 free, 1 exported (imports may join), 2 retired (still held, no new joins) */
    uint32_t kind;  /* 1: legacy IPC memory handle */
    uint32_t gen;   /* bumped at each reuse: a holder's record names (entry, gen) */
    int32_t rdev;
    uint64_t bytes;
    uint8_t key[64];
    int32_t charger; /* index in holders[] of the holder whose slot carries the charge */
    uint32_t pad;
    holder_t holders[SHARE_HOLDERS];
    uint8_t reserved[32];
} entry_t;
typedef struct {
    uint32_t magic, major, minor, header_size, entry_size, max_entries, max_holders;
    uint32_t hwm; /* entries[0 .. hwm) may be in use */
    uint8_t reserved[SHARE_HEADER - 32];
    entry_t entries[SHARE_ENTRIES];
} table_t;
_Static_assert(sizeof(entry_t) == SHARE_ENTRY, "table entry size is part of the file layout");
_Static_assert(sizeof(table_t) == SHARE_HEADER + SHARE_ENTRIES * SHARE_ENTRY, "table size is part of the file layout");

/* What this process holds: (its pointer, role) -> (entry, gen). Guarded by rec_mu. */
enum { ROLE_EXPORT = 1, ROLE_IMPORT = 2 };
typedef struct rec {
    uint64_t local;
    int role, idx;
    uint32_t gen;
    struct rec *next;
} rec_t;
#define RB 256
static rec_t *recs[RB];
static _Atomic int nrecs;
static pthread_mutex_t rec_mu = PTHREAD_MUTEX_INITIALIZER;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* the table, this process's side */
static table_t *tab;
static int tfd = -1, tstate; /* 0 not open yet, 1 open, -1 unusable */
static int use_ofd = 1;

static unsigned rb(uint64_t k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 56) & (RB - 1); }

static void rec_add(uint64_t local, int role, int idx, uint32_t gen) {
    rec_t *r = malloc(sizeof *r);
    if (!r) return; /* forgotten: a charge it may carry stays until exit */
    pthread_mutex_lock(&rec_mu);
    *r = (rec_t){local, role, idx, gen, recs[rb(local)]};
    recs[rb(local)] = r;
    atomic_fetch_add(&nrecs, 1);
    pthread_mutex_unlock(&rec_mu);
}

static rec_t *rec_take(uint64_t local, int role) {
    if (!atomic_load(&nrecs)) return NULL;
    pthread_mutex_lock(&rec_mu);
    rec_t **pp = &recs[rb(local)], *r;
    while ((r = *pp) && !(r->local == local && r->role == role)) pp = &r->next;
    if (r) {
        *pp = r->next;
        atomic_fetch_sub(&nrecs, 1);
    }
    pthread_mutex_unlock(&rec_mu);
    return r;
}

static int file_lock(int on) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = on ? F_WRLCK : F_UNLCK;
    fl.l_whence = SEEK_SET;
    for (int i = 0; i < LOCK_TRIES; i++) {
        if (fcntl(tfd, use_ofd ? F_OFD_SETLK : F_SETLK, &fl) == 0) return 0;
        if (errno == EINVAL && use_ofd) { use_ofd = 0; i--; continue; } /* kernels without OFD locks */
        if (!on || (errno != EAGAIN && errno != EACCES && errno != EINTR)) return -1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static int header_ok(void) {
    return tab->magic == SHARE_MAGIC && tab->major == SHARE_MAJOR && tab->header_size == SHARE_HEADER &&
           tab->entry_size == SHARE_ENTRY && tab->max_entries == SHARE_ENTRIES && tab->max_holders == SHARE_HOLDERS;
}

/* Caller holds mu: maps <region>.ipc (creating it when `create`); tstate 1 on success. */
static void open_table(int create) {
    const char *region = vgpu_region_file();
    char path[4200];
    if (!region) { tstate = -1; return; } /* private accounting: every import is foreign */
    snprintf(path, sizeof path, "%s.ipc", region);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0666);
    if (fd < 0) {
        if (errno != ENOENT) { VLOG(VLOG_WARN, "IPC table %s: %s; imports are charged", path, strerror(errno)); tstate = -1; }
        return; /* not there yet: nothing was exported in this container */
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        VLOG(VLOG_WARN, "IPC table %s is not a regular file; imports are charged", path);
        close(fd);
        tstate = -1;
        return;
    }
    if ((st.st_mode & 0777) != 0666 && fchmod(fd, 0666) != 0) { /* the creator's umask: not ours to fix */ }
    tfd = fd;
    if (file_lock(1) != 0) { close(fd); tfd = -1; return; } /* busy: try again next time */
    void *p = MAP_FAILED;
    if ((size_t)st.st_size >= sizeof(table_t) || ftruncate(fd, sizeof(table_t)) == 0)
        p = mmap(NULL, sizeof(table_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        tab = p;
        if (tab->magic == 0) {
            memset(tab, 0, sizeof *tab);
            tab->major = SHARE_MAJOR;
            tab->minor = SHARE_MINOR;
            tab->header_size = SHARE_HEADER;
            tab->entry_size = SHARE_ENTRY;
            tab->max_entries = SHARE_ENTRIES;
            tab->max_holders = SHARE_HOLDERS;
            __atomic_store_n(&tab->magic, SHARE_MAGIC, __ATOMIC_RELEASE);
        }
        tstate = 1;
    }
    file_lock(0);
    if (p == MAP_FAILED) { VLOG(VLOG_WARN, "IPC table %s: cannot map it; imports are charged", path); close(fd); tfd = -1; tstate = -1; }
}

/* Takes the table (bounded): 0 with both locks held and a sane header, -1 otherwise. */
static int begin(int create) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 500000000L;
    if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    if (pthread_mutex_timedlock(&mu, &dl) != 0) return -1;
    if (tstate == 0) open_table(create);
    if (tstate == 1 && file_lock(1) == 0) {
        if (header_ok()) return 0;
        file_lock(0);
    }
    pthread_mutex_unlock(&mu);
    return -1;
}

static void end(void) {
    file_lock(0);
    pthread_mutex_unlock(&mu);
}

static uint32_t hwm(void) { return tab->hwm < SHARE_ENTRIES ? tab->hwm : SHARE_ENTRIES; }

/* Every field of an entry checked before use: the file is tenant-writable. */
static int entry_ok(const entry_t *e) {
    if ((e->state != 1 && e->state != 2) || e->kind != KIND_IPC || !e->bytes || e->bytes > (1ull << 50)) return 0;
    if (e->rdev < 0 || e->rdev >= VGPU_MAX_DEVICES || (uint32_t)e->rdev >= atomic_load(&vgpu_region->device_count)) return 0;
    if (e->charger < 0 || e->charger >= SHARE_HOLDERS || e->holders[e->charger].pid <= 0) return 0;
    for (int k = 0; k < SHARE_HOLDERS; k++)
        if (e->holders[k].pid < 0 || (e->holders[k].pid > 0 && (e->holders[k].slot < 0 || e->holders[k].slot >= VGPU_MAX_SLOTS)))
            return 0;
    return 1;
}

static int holder_live(const holder_t *h) {
    uint64_t start = 0;
    return h->pid > 0 && !vgpu_pid_dead(h->pid, h->start_time) && vgpu_slot_pid(h->slot, &start) == h->pid &&
           start == h->start_time;
}

static int is_me(const holder_t *h, const holder_t *me) {
    return h->pid == me->pid && h->slot == me->slot && h->start_time == me->start_time;
}

/* Removes holder `h` (whose slot is being given back or zeroed by the caller), and dead holders on
 * the way. When the charge was on a holder now gone, it is added to a live holder's slot; with
 * none left the entry is freed. Returns 1 when `h` carried the charge. */
static int drop_holder(entry_t *e, int h) {
    int carried = e->charger == h, next = -1;
    memset(&e->holders[h], 0, sizeof e->holders[h]);
    for (int k = 0; k < SHARE_HOLDERS; k++) {
        if (e->holders[k].pid <= 0) continue;
        if (!holder_live(&e->holders[k])) { memset(&e->holders[k], 0, sizeof e->holders[k]); continue; }
        if (next < 0 || k == e->charger) next = k; /* a live charger keeps it */
    }
    if (next < 0) {
        e->state = 0;
    } else if (e->holders[e->charger].pid <= 0) { /* the charger let go or was found dead */
        vgpu_slot_charge(e->holders[next].slot, e->rdev, e->bytes);
        e->charger = next;
    }
    return carried;
}

/* This process's holder identity; 0 ok. */
static int me_now(holder_t *me) {
    int slot = vgpu_my_slot(); /* before any table lock: claiming a slot may reap */
    if (slot < 0) return -1;
    me->slot = slot;
    me->pid = vgpu_slot_pid(slot, &me->start_time);
    return me->pid == getpid() ? 0 : -1;
}

/* One reference of this process leaves entry `r`: prefers a reference that does not carry the
 * charge. 1 carried (the caller gives it back), 0 not, -1 entry unusable. */
static int leave_entry(const rec_t *r, const holder_t *me, int *rdev, uint64_t *bytes) {
    entry_t *e = &tab->entries[r->idx];
    if (e->gen != r->gen || !entry_ok(e)) return -1;
    int pick = -1;
    for (int k = 0; k < SHARE_HOLDERS; k++)
        if (is_me(&e->holders[k], me) && (pick < 0 || pick == e->charger)) pick = k;
    if (pick < 0) return -1;
    *rdev = e->rdev;
    *bytes = e->bytes;
    return drop_holder(e, pick);
}

void vgpu_share_export(const void *key, int rdev, uint64_t bytes, uint64_t base) {
    holder_t me;
    if (rdev < 0 || !bytes || me_now(&me) != 0 || begin(1) != 0) return;
    int mine = 0, pick = -1;
    for (uint32_t i = 0; i < hwm(); i++) {
        entry_t *e = &tab->entries[i];
        if (e->state != 1 || memcmp(e->key, key, sizeof e->key)) continue;
        if (entry_ok(e) && is_me(&e->holders[e->charger], &me)) mine = 1; /* exported again */
        else e->state = 2; /* a handle value seen before: the old allocation takes no new imports */
    }
    for (uint32_t i = 0; !mine && pick < 0 && i < SHARE_ENTRIES; i++) {
        entry_t *e = &tab->entries[i];
        if (i >= hwm() || e->state == 0 || !entry_ok(e)) { pick = (int)i; break; }
    }
    for (uint32_t i = 0; !mine && pick < 0 && i < SHARE_ENTRIES; i++) { /* full: reclaim the abandoned */
        entry_t *e = &tab->entries[i];
        int live = 0;
        for (int k = 0; k < SHARE_HOLDERS && !live; k++) live = holder_live(&e->holders[k]);
        if (!live) pick = (int)i;
    }
    if (pick >= 0) {
        entry_t *e = &tab->entries[pick];
        uint32_t gen = e->gen + 1;
        memset(e, 0, sizeof *e);
        e->kind = KIND_IPC;
        e->gen = gen;
        e->rdev = rdev;
        e->bytes = bytes;
        memcpy(e->key, key, sizeof e->key);
        e->holders[0] = me;
        e->charger = 0;
        e->state = 1;
        if ((uint32_t)pick >= tab->hwm || tab->hwm > SHARE_ENTRIES) tab->hwm = (uint32_t)pick + 1;
        rec_add(base, ROLE_EXPORT, pick, gen);
    }
    end();
    if (!mine && pick < 0) VLOG(VLOG_WARN, "IPC table full: imports of this allocation are charged to each importer");
}

int vgpu_share_freed(uint64_t base) {
    rec_t *r = rec_take(base, ROLE_EXPORT);
    if (!r) return 1;
    int give = 1;
    for (; r; r = rec_take(base, ROLE_EXPORT)) {
        holder_t me;
        int rdev;
        uint64_t bytes;
        if (me_now(&me) != 0 || begin(0) != 0) {
            give = 0;
        } else {
            if (leave_entry(r, &me, &rdev, &bytes) < 0) give = 0;
            end();
        }
        free(r);
    }
    if (!give) VLOG(VLOG_WARN, "freed allocation %#llx was exported but the IPC table is unusable: its charge stays "
                    "until this process exits", (unsigned long long)base);
    return give;
}

int vgpu_share_join(const void *key, uint64_t ptr) {
    holder_t me;
    if (me_now(&me) != 0 || begin(0) != 0) return 0;
    int joined = 0;
    for (uint32_t i = 0; i < hwm(); i++) {
        entry_t *e = &tab->entries[i];
        if (e->state != 1 || memcmp(e->key, key, sizeof e->key)) continue;
        if (!entry_ok(e)) break;
        int other = -1, room = -1;
        for (int k = 0; k < SHARE_HOLDERS; k++) {
            if (e->holders[k].pid == 0 && room < 0) room = k;
            else if (e->holders[k].pid > 0 && e->holders[k].pid != me.pid && holder_live(&e->holders[k])) other = k;
        }
        if (other < 0 || room < 0) break; /* nobody else holds it (or no room): charged as foreign */
        if (!holder_live(&e->holders[e->charger])) { /* its charger died unseen: the charge comes back */
            memset(&e->holders[e->charger], 0, sizeof e->holders[e->charger]);
            vgpu_slot_charge(e->holders[other].slot, e->rdev, e->bytes);
            e->charger = other;
        }
        e->holders[room] = me;
        rec_add(ptr, ROLE_IMPORT, (int)i, e->gen);
        joined = 1;
        break;
    }
    end();
    return joined;
}

uint64_t vgpu_share_leave(uint64_t ptr, int *rdev) {
    rec_t *r = rec_take(ptr, ROLE_IMPORT);
    if (!r) return 0;
    holder_t me;
    uint64_t bytes = 0, give = 0;
    if (me_now(&me) == 0 && begin(0) == 0) {
        if (leave_entry(r, &me, rdev, &bytes) == 1) give = bytes;
        end();
    }
    free(r);
    return give;
}

/* The region is about to zero `slot` (its process exits or died): what it carries moves on. */
static void on_release(int slot, int32_t pid, uint64_t start_time) {
    if (pid == getpid() && !atomic_load(&nrecs)) return; /* this process holds nothing shared */
    if (begin(0) != 0) return;
    holder_t gone = {pid, slot, start_time};
    for (uint32_t i = 0; i < hwm(); i++) {
        entry_t *e = &tab->entries[i];
        if (!entry_ok(e)) continue;
        for (int k = 0; k < SHARE_HOLDERS && e->state; k++) {
            if (!is_me(&e->holders[k], &gone)) continue;
            /* A charge moved to another holder leaves the gone slot: an exiting process keeps its
             * other counters until it is reaped (region.c), so they are not zeroed for it. */
            if (drop_holder(e, k) && e->state) vgpu_slot_uncharge(slot, e->rdev, e->bytes);
        }
    }
    end();
}

static void share_after_fork(void) {
    /* The child holds none of the parent's CUDA memory, and needs its own file description for
     * the lock (an OFD lock belongs to the description). */
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&rec_mu, NULL);
    for (int b = 0; b < RB; b++)
        while (recs[b]) { rec_t *n = recs[b]->next; free(recs[b]); recs[b] = n; }
    atomic_store(&nrecs, 0);
    if (tab) munmap(tab, sizeof(table_t));
    if (tfd >= 0) close(tfd);
    tab = NULL;
    tfd = -1;
    tstate = 0;
}

__attribute__((constructor)) static void share_register(void) {
    vgpu_on_fork_child(share_after_fork);
    vgpu_region_on_release(on_release);
}
