/*
 * region.c - the shared accounting region: creation, slots, devices, reservations, reaping.
 *
 * Why lock-free reservations: HAMi-core guarded its region with a process-shared semaphore
 * that a SIGKILLed holder left taken forever (hami-core-spec §3.6, core#86, HAMi#2500).
 * Here the only cross-process lock is an fcntl open-file-description lock, taken for slot
 * and device registration only; the kernel drops it when its holder dies. Reservations use
 * add-then-check on the caller's own slot with sequentially consistent atomics: of two
 * processes racing for the last byte, at least one sees the other's addition, so both can
 * never pass. Dead processes are found with kill(pid, 0) plus /proc/<pid>/stat (zombie
 * state, start time against pid reuse) and their slots are zeroed by whoever notices,
 * at most every 500 ms on the hot path and always before an out-of-memory answer. A process
 * that exits normally is reaped the same way, never by itself: it holds its memory until it is
 * gone.
 */
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "config.h"
#include "forkreg.h"
#include "log.h"
#include "region.h"

#define REAP_INTERVAL_NS 500000000ull
#define DEFAULT_CACHE "/tmp/cudevshr.cache"

vgpu_region_t *vgpu_region;
static int region_fd = -1;
static char region_path[4096];
static uint64_t region_key;
static int my_slot = -1;
static pid_t my_pid;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t region_once = PTHREAD_ONCE_INIT;
/* This process's own ceiling per region device (vgpu_mem_cap_for), read at first use: the region's
 * limit is the container's, written by its first process, and the region file is the tenant's. */
static uint64_t my_cap[VGPU_MAX_DEVICES];
static _Atomic int my_cap_known[VGPU_MAX_DEVICES];
/* The container index this process resolved for each region device (+1; 0 = none yet): the cap is
 * read for it, not for the entry's phys_index, which a tenant can rewrite to a card with a larger
 * limit. */
static _Atomic int my_phys[VGPU_MAX_DEVICES];
static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
/* Told about a slot just before it is zeroed (its process exited or died): ipcshare.c moves the
 * charges of shared allocations that slot carries to another holder. A pointer, not a call, so
 * that the region stays at the bottom of the call graph. */
static void (*release_hook)(int slot, int32_t pid, uint64_t start_time);

void vgpu_region_on_release(void (*fn)(int slot, int32_t pid, uint64_t start_time)) { release_hook = fn; }

static void file_lock(int on) {
    if (region_fd < 0) return;
    struct flock fl = {.l_type = on ? F_WRLCK : F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    int rc;
    do rc = fcntl(region_fd, on ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
    while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno == EINVAL) { /* kernels without OFD locks */
        do rc = fcntl(region_fd, on ? F_SETLKW : F_SETLK, &fl);
        while (rc < 0 && errno == EINTR);
    }
}

static void lock_region(void) { pthread_mutex_lock(&reg_mu); file_lock(1); }
static void unlock_region(void) { file_lock(0); pthread_mutex_unlock(&reg_mu); }

/* starttime (field 22) and state of /proc/<pid>/stat; returns -1 when unreadable. */
static int proc_stat(pid_t pid, uint64_t *start, char *state) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return -1;
    *state = p[2];
    p += 2; /* at state, which is field 3 */
    for (int field = 3; field < 22 && *p; p++)
        if (*p == ' ') field++;
    *start = strtoull(p, NULL, 10);
    return 0;
}

static void init_header(vgpu_region_t *r) {
    r->major = VGPU_REGION_MAJOR;
    r->minor = VGPU_REGION_MINOR;
    r->header_size = VGPU_HEADER_SIZE;
    r->device_size = VGPU_DEVICE_SIZE;
    r->slot_size = VGPU_SLOT_SIZE;
    r->max_devices = VGPU_MAX_DEVICES;
    r->max_slots = VGPU_MAX_SLOTS;
    r->priority = vgpu_task_priority();
    __atomic_store_n(&r->magic, VGPU_REGION_MAGIC, __ATOMIC_RELEASE);
}

/* Where the config file rules, the region it names is the container's one budget: a process
 * that cannot use it must not get a budget of its own. A tenant can make it unusable at will (the
 * file is in its writable directory: garbage in it, a FIFO, a directory or a chmod 000 file in its
 * place), and per-process accounting then gave every process of the container the whole limit. */
static int region_closed;

void vgpu_region_fail_closed(const char *why) {
    if (!__atomic_exchange_n(&region_closed, 1, __ATOMIC_RELAXED))
        VLOG(VLOG_ERROR, "shared region '%s': %s; the config file %s rules this container: device memory "
             "limits fail closed (0 bytes)", region_path, why, vgpu_config_path());
}

static void use_private(const char *why, const char *path) {
    region_closed = vgpu_config_state() == VGPU_CONFIG_OK;
    if (region_closed)
        VLOG(VLOG_ERROR, "shared region '%s' unusable (%s); the config file %s names it as the container's: "
             "device memory limits fail closed (0 bytes)", path, why, vgpu_config_path());
    else
        VLOG(VLOG_ERROR, "shared region '%s' unusable (%s); accounting is per process from now on", path, why);
    if (region_fd >= 0) close(region_fd);
    region_fd = -1;
    void *p = mmap(NULL, sizeof(vgpu_region_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    vgpu_region = p;
    init_header(vgpu_region);
    region_key = (vgpu_now_ns() << 20) ^ (uint64_t)getpid() ^ 0x8000000000000000ull;
}

/* At exit the slot keeps its counters: the process still holds its device memory until the
 * kernel tears it down, and code may run after this handler (exit handlers registered before
 * ours, library destructors, other threads) with that memory - or block there for ever. Zeroing
 * here let such a process keep its memory uncharged and the container allocate it again. The
 * slot is reaped once the pid is gone (a zombie counts as gone): by the next process that claims
 * a slot, before any out-of-memory answer, and on the query paths; clearing last_reap_ns lets the
 * next sweep run at once instead of waiting out the 500 ms interval. */
static void exit_handler(void) {
    vgpu_region_t *r = vgpu_region;
    if (!r || my_slot < 0 || my_pid != getpid()) return;
    /* Shared allocations other live holders keep open move to one of them now (ipcshare.c takes
     * them out of this slot); the memory this process holds alone stays charged here. */
    if (release_hook) release_hook(my_slot, my_pid, r->slots[my_slot].start_time);
    atomic_store(&r->last_reap_ns, 0);
}

static void open_region(void) {
    const char *path = vgpu_getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if ((!path || !*path) && vgpu_config_state() == VGPU_CONFIG_BROKEN) {
        /* not the node-wide default file: its devices may carry another process's (or no) limit */
        use_private("the config file is malformed", DEFAULT_CACHE);
        return;
    }
    if (!path || !*path) path = DEFAULT_CACHE;
    snprintf(region_path, sizeof region_path, "%s", path);
    mode_t old = umask(0);
    region_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    umask(old);
    if (region_fd < 0) { use_private(strerror(errno), path); return; }
    lock_region();
    struct stat st;
    if (fstat(region_fd, &st) != 0) { unlock_region(); use_private(strerror(errno), path); return; }
    region_key = ((uint64_t)st.st_dev << 40) ^ (uint64_t)st.st_ino;
    if ((size_t)st.st_size < sizeof(vgpu_region_t) && ftruncate(region_fd, sizeof(vgpu_region_t)) != 0) {
        unlock_region(); use_private(strerror(errno), path); return;
    }
    void *p = mmap(NULL, sizeof(vgpu_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, region_fd, 0);
    if (p == MAP_FAILED) { unlock_region(); use_private(strerror(errno), path); return; }
    vgpu_region_t *r = p;
    uint32_t magic = __atomic_load_n(&r->magic, __ATOMIC_ACQUIRE);
    if (magic == 0) {
        init_header(r);
    } else if (magic != VGPU_REGION_MAGIC || r->major != VGPU_REGION_MAJOR) {
        char why[96];
        snprintf(why, sizeof why, "magic 0x%x major %u, expected 0x%x major %u", magic, r->major,
                 VGPU_REGION_MAGIC, VGPU_REGION_MAJOR);
        unlock_region();
        munmap(p, sizeof(vgpu_region_t));
        use_private(why, path);
        return;
    }
    vgpu_region = r;
    unlock_region();
    VLOG(VLOG_INFO, "shared region %s mapped", path);
}

static void after_fork_child(void) {
    /* The child is a new process: it must get its own slot and forget the parent's allocations.
     * It also needs its own open file description: OFD locks are owned by the description, so
     * a shared one would let parent and child hold the registration lock at the same time. */
    my_slot = -1;
    my_pid = getpid();
    pthread_mutex_init(&reg_mu, NULL);
    if (region_fd >= 0) {
        int fd = open(region_path, O_RDWR | O_CLOEXEC);
        close(region_fd);
        region_fd = fd;
    }
}

static void region_init_once(void) {
    my_pid = getpid();
    open_region();
    atexit(exit_handler);
}

__attribute__((constructor)) static void region_register_fork(void) { vgpu_on_fork_child(after_fork_child); }

uint64_t vgpu_region_key(void) {
    vgpu_region_ensure();
    return region_key;
}

int vgpu_region_ensure(void) {
    if (VGPU_LIKELY(vgpu_region != NULL)) return 0;
    pthread_once(&region_once, region_init_once);
    return vgpu_region ? 0 : -1;
}

int vgpu_pid_dead(int32_t pid, uint64_t start_time) {
    if (pid <= 0 || pid == my_pid) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    uint64_t start;
    char state;
    if (proc_stat(pid, &start, &state) != 0) return 0; /* no /proc view: trust kill() */
    if (state == 'Z' || state == 'X' || state == 'x') return 1;
    return start_time && start != start_time;
}

static int slot_dead(vgpu_slot_t *s, int32_t pid) { return vgpu_pid_dead(pid, s->start_time); }

const char *vgpu_region_file(void) { return vgpu_region_ensure() == 0 && region_fd >= 0 ? region_path : NULL; }

int32_t vgpu_slot_pid(int slot, uint64_t *start_time) {
    if (!vgpu_region || slot < 0 || slot >= VGPU_MAX_SLOTS) return 0;
    vgpu_slot_t *s = &vgpu_region->slots[slot];
    if (start_time) *start_time = s->start_time;
    return atomic_load(&s->pid);
}

void vgpu_slot_charge(int slot, int rdev, uint64_t bytes) {
    if (!vgpu_region || slot < 0 || slot >= VGPU_MAX_SLOTS || rdev < 0 || rdev >= VGPU_MAX_DEVICES) return;
    vgpu_slot_t *s = &vgpu_region->slots[slot];
    atomic_fetch_add(&s->used[rdev], bytes);
    atomic_fetch_add(&s->data[rdev], bytes);
}

static void sub_clamped(_Atomic uint64_t *c, uint64_t bytes);

void vgpu_slot_uncharge(int slot, int rdev, uint64_t bytes) {
    if (!vgpu_region || slot < 0 || slot >= VGPU_MAX_SLOTS || rdev < 0 || rdev >= VGPU_MAX_DEVICES) return;
    vgpu_slot_t *s = &vgpu_region->slots[slot];
    sub_clamped(&s->used[rdev], bytes);
    sub_clamped(&s->data[rdev], bytes);
}

void (*vgpu_dead_slice_hook)(int rdev, uint64_t slice_start_ns);

int vgpu_reap_dead(int force) {
    vgpu_region_t *r = vgpu_region;
    if (!r) return 0;
    uint64_t now = vgpu_now_ns(), last = atomic_load(&r->last_reap_ns);
    if (!force && now - last < REAP_INTERVAL_NS) return 0;
    if (!force && !atomic_compare_exchange_strong(&r->last_reap_ns, &last, now)) return 0;
    if (force) atomic_store(&r->last_reap_ns, now);
    int n = 0;
    uint32_t hwm = atomic_load(&r->slot_hwm);
    for (uint32_t i = 0; i < hwm && i < VGPU_MAX_SLOTS; i++) {
        vgpu_slot_t *s = &r->slots[i];
        int32_t pid = atomic_load(&s->pid);
        if (!slot_dead(s, pid)) continue;
        if (!atomic_compare_exchange_strong(&s->pid, &pid, -1)) continue;
        if (release_hook) release_hook((int)i, pid, s->start_time);
        uint64_t slice = atomic_exchange(&s->slice_open_ns, 0); /* killed inside a compute slice */
        int32_t srdev = atomic_load(&s->slice_rdev);
        if (slice && vgpu_dead_slice_hook && srdev >= 0 && srdev < VGPU_MAX_DEVICES) vgpu_dead_slice_hook(srdev, slice);
        for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
            atomic_store(&s->used[d], 0);
            atomic_store(&s->data[d], 0);
            atomic_store(&s->context[d], 0);
            atomic_store(&s->module[d], 0);
        }
        s->start_time = 0;
        atomic_store(&s->hostpid, 0);
        atomic_store(&s->pid, 0);
        VLOG(VLOG_INFO, "released slot %u of dead process %d", i, (int)pid);
        n++;
    }
    return n;
}

int vgpu_my_slot(void) {
    if (VGPU_LIKELY(my_slot >= 0)) return my_slot;
    if (vgpu_region_ensure() != 0) return -1;
    vgpu_region_t *r = vgpu_region;
    lock_region();
    if (my_slot >= 0) { unlock_region(); return my_slot; }
    vgpu_reap_dead(1);
    uint64_t start = 0;
    char state;
    proc_stat(my_pid, &start, &state);
    for (int i = 0; i < VGPU_MAX_SLOTS; i++) {
        vgpu_slot_t *s = &r->slots[i];
        int32_t expect = 0;
        if (atomic_load(&s->pid) != 0 || !atomic_compare_exchange_strong(&s->pid, &expect, my_pid)) continue;
        s->start_time = start;
        uint32_t hwm = atomic_load(&r->slot_hwm);
        while (hwm < (uint32_t)i + 1 && !atomic_compare_exchange_weak(&r->slot_hwm, &hwm, (uint32_t)i + 1)) {}
        my_slot = i;
        break;
    }
    unlock_region();
    if (my_slot < 0) VLOG(VLOG_ERROR, "all %d process slots are taken; allocations will fail", VGPU_MAX_SLOTS);
    return my_slot;
}

int vgpu_device_resolved(int rdev) { return rdev >= 0 && rdev < VGPU_MAX_DEVICES && atomic_load(&my_phys[rdev]) > 0; }

uint64_t vgpu_device_limit(int rdev) {
    if (VGPU_UNLIKELY(region_closed)) return 0;
    vgpu_device_t *d = &vgpu_region->devices[rdev];
    if (VGPU_UNLIKELY(!atomic_load(&my_cap_known[rdev]))) {
        pthread_mutex_lock(&cap_mu);
        if (!atomic_load(&my_cap_known[rdev])) {
            int phys = atomic_load(&my_phys[rdev]);
            my_cap[rdev] = vgpu_mem_cap_for(phys > 0 ? phys - 1 : (int)d->phys_index);
            atomic_store(&my_cap_known[rdev], 1);
        }
        pthread_mutex_unlock(&cap_mu);
    }
    uint64_t cap = my_cap[rdev], limit = d->limit_bytes;
    return cap < limit ? cap : limit;
}

int vgpu_device_find(const char *uuid) {
    vgpu_region_t *r = vgpu_region;
    if (!r) return -1;
    uint32_t n = atomic_load(&r->device_count);
    for (uint32_t i = 0; i < n && i < VGPU_MAX_DEVICES; i++)
        if (atomic_load(&r->devices[i].state) == 2 && !strncmp(r->devices[i].uuid, uuid, sizeof r->devices[i].uuid))
            return (int)i;
    return -1;
}

int vgpu_device_register(const char *uuid, int phys) {
    if (vgpu_region_ensure() != 0) return -1;
    int idx = vgpu_device_find(uuid);
    if (idx >= 0) {
        vgpu_device_t *d = &vgpu_region->devices[idx];
        int none = 0;
        if (phys >= 0) atomic_compare_exchange_strong(&my_phys[idx], &none, phys + 1);
        uint64_t mine = vgpu_mem_limit_for(phys);
        if (mine != d->limit_bytes && vgpu_config_state() == VGPU_CONFIG_NONE)
            VLOG(VLOG_WARN, "device %s: this process asks for limit %llu bytes, the region holds %llu; "
                 "the region's value applies to the whole container", uuid, (unsigned long long)mine,
                 (unsigned long long)d->limit_bytes);
        else if (mine != d->limit_bytes)
            VLOG(VLOG_WARN, "device %s: the region holds limit %llu bytes, the config file %llu; the lower "
                 "applies to this process", uuid, (unsigned long long)d->limit_bytes, (unsigned long long)mine);
        return idx;
    }
    vgpu_region_t *r = vgpu_region;
    lock_region();
    idx = vgpu_device_find(uuid);
    if (idx < 0) {
        uint32_t n = atomic_load(&r->device_count);
        if (n < VGPU_MAX_DEVICES) {
            vgpu_device_t *d = &r->devices[n];
            memset(d->uuid, 0, sizeof d->uuid);
            snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
            d->limit_bytes = vgpu_mem_limit_for(phys);
            d->sm_limit = vgpu_sm_limit_for(phys);
            d->phys_index = (uint32_t)phys;
            atomic_store(&d->state, 2);
            atomic_store(&r->device_count, n + 1);
            idx = (int)n;
            VLOG(VLOG_INFO, "device %s (index %d): limit %llu bytes, sm %u%%", uuid, phys,
                 (unsigned long long)d->limit_bytes, d->sm_limit);
        } else {
            VLOG(VLOG_ERROR, "more than %d devices; %s is not accounted", VGPU_MAX_DEVICES, uuid);
        }
    }
    unlock_region();
    int none = 0;
    if (idx >= 0 && phys >= 0) atomic_compare_exchange_strong(&my_phys[idx], &none, phys + 1);
    return idx;
}

static uint64_t sum_usage(vgpu_region_t *r, int rdev) {
    uint64_t total = 0;
    uint32_t hwm = atomic_load(&r->slot_hwm);
    for (uint32_t i = 0; i < hwm && i < VGPU_MAX_SLOTS; i++) {
        uint64_t u = atomic_load(&r->slots[i].used[rdev]);
        total = (total + u < total) ? UINT64_MAX : total + u;
    }
    return total;
}

uint64_t vgpu_device_usage(int rdev) {
    vgpu_region_t *r = vgpu_region;
    if (!r || rdev < 0) return 0;
    vgpu_reap_dead(0);
    return sum_usage(r, rdev);
}

enum { KIND_DATA, KIND_MODULE, KIND_CONTEXT };

/* Adds `bytes` to this process's `used` and to the kind counter `kind` (data[], module[] or
 * context[]), backing out when the container's sum passes the limit. 0 ok, -1 over the limit. */
static int reserve_kind(int rdev, uint64_t bytes, int kind) {
    int slot = vgpu_my_slot();
    vgpu_region_t *r = vgpu_region;
    if (slot < 0 || rdev < 0) return -1;
    vgpu_slot_t *s = &r->slots[slot];
    uint64_t limit = vgpu_device_limit(rdev);
    if (limit != VGPU_UNLIMITED && bytes > limit) return -1;
    vgpu_reap_dead(0);
    for (int attempt = 0; attempt < 4; attempt++) {
        atomic_fetch_add(&s->used[rdev], bytes);
        if (limit == VGPU_UNLIMITED || sum_usage(r, rdev) <= limit) {
            atomic_fetch_add(kind == KIND_MODULE ? &s->module[rdev] : kind == KIND_CONTEXT ? &s->context[rdev]
                                                                                      : &s->data[rdev],
                             bytes);
            return 0;
        }
        atomic_fetch_sub(&s->used[rdev], bytes);
        /* Over the limit: reclaim dead processes first; otherwise another reservation may
         * be in flight and about to back out, so retry after a short random pause. */
        if (vgpu_reap_dead(1) == 0) {
            struct timespec ts = {0, 20000 + (long)(((unsigned)rand() ^ (unsigned)my_pid) % 80000)};
            if (attempt == 3) break;
            nanosleep(&ts, NULL);
        }
    }
    return -1;
}

int vgpu_reserve(int rdev, uint64_t bytes) { return reserve_kind(rdev, bytes, KIND_DATA); }
int vgpu_reserve_module(int rdev, uint64_t bytes) { return reserve_kind(rdev, bytes, KIND_MODULE); }
int vgpu_reserve_context(int rdev, uint64_t bytes) { return reserve_kind(rdev, bytes, KIND_CONTEXT); }

uint64_t vgpu_my_usage(int rdev) {
    if (my_slot < 0 || rdev < 0 || !vgpu_region) return 0;
    return atomic_load(&vgpu_region->slots[my_slot].used[rdev]);
}

static void sub_clamped(_Atomic uint64_t *c, uint64_t bytes) {
    uint64_t cur = atomic_load(c), next;
    do {
        next = cur >= bytes ? cur - bytes : 0;
    } while (!atomic_compare_exchange_weak(c, &cur, next));
    if (cur < bytes) VLOG(VLOG_WARN, "counter underflow avoided (had %llu, freeing %llu)",
                          (unsigned long long)cur, (unsigned long long)bytes);
}

void vgpu_unreserve(int rdev, uint64_t bytes) {
    if (my_slot < 0 || rdev < 0 || !vgpu_region) return;
    vgpu_slot_t *s = &vgpu_region->slots[my_slot];
    sub_clamped(&s->used[rdev], bytes);
    sub_clamped(&s->data[rdev], bytes);
}


void vgpu_charge_data(int rdev, uint64_t bytes) {
    int slot = vgpu_my_slot();
    if (slot < 0 || rdev < 0) return;
    vgpu_slot_t *s = &vgpu_region->slots[slot];
    atomic_fetch_add(&s->used[rdev], bytes);
    atomic_fetch_add(&s->data[rdev], bytes);
}

void vgpu_uncharge_context(int rdev, uint64_t bytes) {
    if (my_slot < 0 || rdev < 0 || !vgpu_region) return;
    vgpu_slot_t *s = &vgpu_region->slots[my_slot];
    sub_clamped(&s->used[rdev], bytes);
    sub_clamped(&s->context[rdev], bytes);
}

void vgpu_unreserve_module(int rdev, uint64_t bytes) {
    if (my_slot < 0 || rdev < 0 || !vgpu_region) return;
    vgpu_slot_t *s = &vgpu_region->slots[my_slot];
    sub_clamped(&s->used[rdev], bytes);
    sub_clamped(&s->module[rdev], bytes);
}
