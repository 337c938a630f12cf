/*
 * fake_cuda.c - a stand-in libcuda.so.1 for machines without a GPU (CI).
 *
 * It simulates FAKE_GPU_COUNT devices with physical capacity (fake_state.h), honours
 * CUDA_VISIBLE_DEVICES (integer or "GPU-..." entries), counts every call (fake_count),
 * returns real CUresult numbers, and resolves cuGetProcAddress by name x version x
 * per-thread-stream flag from its own table, so tests can see exactly which versioned
 * function a caller was handed. Launches model FAKE_KERNEL_US of work per kernel on a card
 * that time-slices between the processes with work queued; cuCtxSynchronize waits for this
 * process's work, and fake_busy_ns() reports the modelled busy time.
 */
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include "cuda_compat.h"
#include "fake_state.h"

#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuMemAllocPitch
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuGetProcAddress
#undef cuDeviceGetUuid
#undef cuCtxCreate
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuMemPrefetchAsync
#undef cuCtxDestroy
#undef cuIpcOpenMemHandle
#undef cuGraphUpload
#undef cuGraphLaunch

#define EXPORT __attribute__((visibility("default")))

/* defined in fake_escapes.inc.c (stream capture, graph instantiations) */
static int captured_alloc(CUstream s, uint64_t bytes, CUdeviceptr *p);
static int captured_free(CUstream s);
static uint64_t fake_exec_bytes(CUgraphExec e, int dev);
static CUarray fake_sparse_array(void);
static int fake_sparse_destroy(CUarray a);
static int ipc_exporter_frees(int i);
static int stream_dev(CUstream s);
#define FAKE_IPC_WIN 0x10000000000ull
#define FAKE_IPC_STRIDE 0x100000000ull

/* ---- call counting ---- */
#define MAXC 128
static struct { const char *name; _Atomic int n; } counters[MAXC];
static pthread_mutex_t cmu = PTHREAD_MUTEX_INITIALIZER;
static void count(const char *name) {
    for (int i = 0; i < MAXC; i++) {
        if (counters[i].name == name) { counters[i].n++; return; }
        if (!counters[i].name) {
            pthread_mutex_lock(&cmu);
            if (!counters[i].name) { counters[i].name = name; counters[i].n = 1; pthread_mutex_unlock(&cmu); return; }
            pthread_mutex_unlock(&cmu);
            if (counters[i].name == name) { counters[i].n++; return; }
        }
    }
}
EXPORT int fake_count(const char *name) {
    for (int i = 0; i < MAXC && counters[i].name; i++)
        if (!strcmp(counters[i].name, name)) return counters[i].n;
    return 0;
}
#define COUNT() count(__func__)

/* ---- devices ---- */
static int inited;
static int visible[FAKE_MAX_DEV], nvisible = -1;

static void setup_visible(void) {
    if (nvisible >= 0) return;
    int total = fake_count_env();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        for (int i = 0; i < total; i++) visible[i] = i;
        nvisible = total;
        return;
    }
    nvisible = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", cvd);
    for (char *save, *t = strtok_r(buf, ",", &save); t && nvisible < FAKE_MAX_DEV; t = strtok_r(NULL, ",", &save)) {
        int phys = -1;
        if (!strncmp(t, "GPU-", 4)) {
            for (int i = 0; i < total; i++) {
                char u[64];
                fake_uuid_string(i, u, sizeof u);
                if (!strncmp(u, t, strlen(t))) phys = i;
            }
        } else {
            char *end;
            long v = strtol(t, &end, 10);
            if (*end == 0 && v >= 0 && v < total) phys = (int)v;
        }
        if (phys < 0) break; /* the driver stops at the first invalid entry */
        visible[nvisible++] = phys;
    }
}

static __thread int cur_dev = -1;
#define NEED_INIT() do { if (!inited) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

EXPORT CUresult cuInit(unsigned int flags) { COUNT(); setup_visible(); inited = 1; return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { COUNT(); *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { COUNT(); NEED_INIT(); *n = nvisible; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ord) {
    COUNT(); NEED_INIT();
    if (ord < 0 || ord >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    *d = ord;
    return CUDA_SUCCESS;
}
static CUresult uuid_of(CUuuid *u, CUdevice d) {
    NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    memset(u, 0, sizeof *u);
    u->bytes[0] = (char)0xfa; u->bytes[1] = (char)0xce; u->bytes[3] = (char)visible[d];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { COUNT(); return uuid_of(u, d); }
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { COUNT(); return uuid_of(u, d); }
/* Contexts. Handles carry the device ordinal in their low 4 bits: primary 0x1000 + d, created
 * 0x100000 + (n << 4) + d. Every context takes FAKE_CTX_MIB (default 0) of the device's
 * physical memory while it exists: a primary one from its first retain to its last release or
 * reset, a created one (cuCtxCreate*) until cuCtxDestroy. Modules loaded into a context are
 * freed with it. */
static int ctx_refs[FAKE_MAX_DEV];
static _Atomic int created_ctx[FAKE_MAX_DEV]; /* live cuCtxCreate contexts per physical device */
static _Atomic int next_ctx;
static __thread uintptr_t cur_ctx;
static uint64_t ctx_mib(void) { const char *s = getenv("FAKE_CTX_MIB"); return s ? strtoull(s, NULL, 10) : 0; }
/* What NVML lists for this process: its contexts (allocations are not modelled there). */
EXPORT uint64_t fake_ctx_bytes(int phys) {
    if (phys < 0 || phys >= FAKE_MAX_DEV) return 0;
    return ((ctx_refs[phys] ? 1u : 0u) + (uint64_t)created_ctx[phys]) * (ctx_mib() << 20);
}
static void free_owned_by(uintptr_t ctx);
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    COUNT(); NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_refs[visible[d]]++ == 0) atomic_fetch_add(&fake_phys()->used[visible[d]], ctx_mib() << 20);
    *c = (CUcontext)(uintptr_t)(0x1000 + d);
    return CUDA_SUCCESS;
}
static CUresult ctx_release(CUdevice d, int all) {
    NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    int p = visible[d];
    if (ctx_refs[p] == 0) return all ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    ctx_refs[p] = all ? 0 : ctx_refs[p] - 1;
    if (ctx_refs[p] == 0) {
        atomic_fetch_sub(&fake_phys()->used[p], ctx_mib() << 20);
        free_owned_by(0x1000 + (uintptr_t)d);
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { COUNT(); return ctx_release(d, 0); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { COUNT(); return ctx_release(d, 0); }
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { COUNT(); return ctx_release(d, 1); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    COUNT(); NEED_INIT();
    cur_ctx = (uintptr_t)c;
    cur_dev = c ? (int)((uintptr_t)c & 0xf) : -1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { COUNT(); NEED_INIT(); *c = (CUcontext)cur_ctx; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    COUNT(); NEED_INIT();
    if (cur_dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *d = cur_dev;
    return CUDA_SUCCESS;
}
static CUresult ctx_create(CUcontext *c, CUdevice d) {
    NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    int p = visible[d];
    uint64_t b = ctx_mib() << 20, cap = fake_capacity(p), cur = atomic_load(&fake_phys()->used[p]);
    do {
        if (cur + b > cap) return CUDA_ERROR_OUT_OF_MEMORY;
    } while (!atomic_compare_exchange_weak(&fake_phys()->used[p], &cur, cur + b));
    created_ctx[p]++;
    *c = (CUcontext)(0x100000 + ((uintptr_t)++next_ctx << 4) + (uintptr_t)d);
    cur_ctx = (uintptr_t)*c; /* a new context becomes current */
    cur_dev = d;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned f, CUdevice d) { COUNT(); return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned f, CUdevice d) { COUNT(); return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *pa, int n, unsigned f, CUdevice d) { COUNT(); return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *pa, unsigned f, CUdevice d) { COUNT(); return ctx_create(c, d); }
static CUresult ctx_destroy(CUcontext c) {
    NEED_INIT();
    uintptr_t h = (uintptr_t)c;
    if (h < 0x100000) return CUDA_ERROR_INVALID_CONTEXT; /* primary contexts are not destroyed */
    int p = visible[h & 0xf];
    if (created_ctx[p] <= 0) return CUDA_ERROR_INVALID_CONTEXT;
    created_ctx[p]--;
    atomic_fetch_sub(&fake_phys()->used[p], ctx_mib() << 20);
    free_owned_by(h);
    if (cur_ctx == h) { cur_ctx = 0; cur_dev = -1; }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy(CUcontext c) { COUNT(); return ctx_destroy(c); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { COUNT(); return ctx_destroy(c); }

/* ---- physical memory ---- */
typedef struct alloc { uint64_t key; uint64_t bytes; int phys; uintptr_t owner; struct alloc *next; int ipc; } alloc_t; /* ipc: export entry + 1 */
static alloc_t *allocs;
static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_addr = 0x10000000ull; /* fits the 32-bit v1 ABI */

static CUresult phys_alloc(int dev, uint64_t bytes, uint64_t *key) {
    if (dev < 0 || dev >= nvisible) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    int phys = visible[dev];
    fake_phys_t *p = fake_phys();
    uint64_t cap = fake_capacity(phys), cur = atomic_load(&p->used[phys]);
    do {
        if (cur + bytes > cap || cur + bytes < cur) return CUDA_ERROR_OUT_OF_MEMORY;
    } while (!atomic_compare_exchange_weak(&p->used[phys], &cur, cur + bytes));
    alloc_t *a = malloc(sizeof *a);
    pthread_mutex_lock(&amu);
    a->key = next_addr;
    next_addr += (bytes + 0xfffff) & ~0xfffffull;
    a->bytes = bytes; a->phys = phys; a->owner = 0; a->next = allocs; a->ipc = 0; allocs = a;
    *key = a->key;
    pthread_mutex_unlock(&amu);
    return CUDA_SUCCESS;
}
static CUresult phys_free(uint64_t key) {
    if (key >= 0x4000000000ull && key < 0x5000000000ull) return CUDA_SUCCESS; /* an imported pool pointer: unmapped */
    pthread_mutex_lock(&amu);
    alloc_t **pp = &allocs, *a;
    while ((a = *pp) && a->key != key) pp = &a->next;
    if (a) *pp = a->next;
    pthread_mutex_unlock(&amu);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    if (!a->ipc || ipc_exporter_frees(a->ipc - 1)) atomic_fetch_sub(&fake_phys()->used[a->phys], a->bytes);
    free(a);
    return CUDA_SUCCESS;
}
#define CUR() (cur_dev)

/* Memory owned by a context (module images): freed when the context goes. */
static void free_owned_by(uintptr_t ctx) {
    for (;;) {
        uint64_t key = 0;
        pthread_mutex_lock(&amu);
        for (alloc_t *a = allocs; a; a = a->next)
            if (a->owner == ctx) { key = a->key; break; }
        pthread_mutex_unlock(&amu);
        if (!key) return;
        phys_free(key);
    }
}

/* ---- modules and libraries: an image "FAKEMOD:<bytes>" (or a file holding it) takes <bytes>
 * of the current context's device until unloaded or its context goes; anything else takes 0. */
static _Atomic uint64_t next_empty_module = 0x7000000000ull;
static uint64_t image_bytes(const void *image) {
    const char *s = image;
    return s && !strncmp(s, "FAKEMOD:", 8) ? strtoull(s + 8, NULL, 10) : 0;
}
static uint64_t file_bytes(const char *path) {
    char buf[64] = {0};
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return ~0ull;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return image_bytes(buf);
}
/* CUDA_MODULE_LOADING=LAZY: a load takes nothing; the module's bytes are taken when the first
 * function handle is asked for (cuModuleGetFunction, cuLibraryGetKernel, cuLibraryGetModule). */
typedef struct { uint64_t handle, pending, key; } lazy_t;
static lazy_t lazies[64];
static int nlazy;
static int lazy_mode(void) { const char *s = getenv("CUDA_MODULE_LOADING"); return s && !strcmp(s, "LAZY"); }
static CUresult materialise(uint64_t h) {
    NEED_INIT();
    pthread_mutex_lock(&amu);
    lazy_t *z = NULL;
    for (int i = 0; i < nlazy; i++) if (lazies[i].handle == h) z = &lazies[i];
    uint64_t want = z && !z->key ? z->pending : 0;
    pthread_mutex_unlock(&amu);
    if (!want) return CUDA_SUCCESS;
    uint64_t key;
    CUresult r = phys_alloc(cur_dev, want, &key);
    if (r) return r;
    pthread_mutex_lock(&amu);
    z->key = key;
    for (alloc_t *a = allocs; a; a = a->next)
        if (a->key == key) a->owner = cur_ctx;
    pthread_mutex_unlock(&amu);
    return CUDA_SUCCESS;
}
static CUresult module_load(uint64_t *handle, uint64_t bytes) {
    NEED_INIT();
    if (bytes == ~0ull) return CUDA_ERROR_FILE_NOT_FOUND;
    if (cur_dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes && lazy_mode() && nlazy < 64) {
        *handle = atomic_fetch_add(&next_empty_module, 16);
        pthread_mutex_lock(&amu);
        lazies[nlazy++] = (lazy_t){*handle, bytes, 0};
        pthread_mutex_unlock(&amu);
        return CUDA_SUCCESS;
    }
    if (!bytes) { *handle = atomic_fetch_add(&next_empty_module, 16); return CUDA_SUCCESS; }
    CUresult r = phys_alloc(cur_dev, bytes, handle);
    if (r) return r;
    pthread_mutex_lock(&amu);
    for (alloc_t *a = allocs; a; a = a->next)
        if (a->key == *handle) a->owner = cur_ctx;
    pthread_mutex_unlock(&amu);
    return CUDA_SUCCESS;
}
static CUresult module_unload(uint64_t h) {
    NEED_INIT();
    if (h >= 0x7000000000ull) {
        uint64_t key = 0;
        pthread_mutex_lock(&amu);
        for (int i = 0; i < nlazy; i++) if (lazies[i].handle == h) { key = lazies[i].key; lazies[i] = lazies[--nlazy]; break; }
        pthread_mutex_unlock(&amu);
        if (key) phys_free(key);
        return CUDA_SUCCESS;
    }
    return phys_free(h) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoad(CUmodule *m, const char *f) { COUNT(); uint64_t h; CUresult r = module_load(&h, file_bytes(f)); if (!r) *m = (CUmodule)(uintptr_t)h; return r; }
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *i) { COUNT(); uint64_t h; CUresult r = module_load(&h, image_bytes(i)); if (!r) *m = (CUmodule)(uintptr_t)h; return r; }
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *i, unsigned n, CUjit_option *o, void **v) { COUNT(); uint64_t h; CUresult r = module_load(&h, image_bytes(i)); if (!r) *m = (CUmodule)(uintptr_t)h; return r; }
EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *i) { COUNT(); uint64_t h; CUresult r = module_load(&h, image_bytes(i)); if (!r) *m = (CUmodule)(uintptr_t)h; return r; }
EXPORT CUresult cuModuleUnload(CUmodule m) { COUNT(); return module_unload((uint64_t)(uintptr_t)m); }
EXPORT CUresult cuLibraryLoadData(CUlibrary *l, const void *c, CUjit_option *jo, void **jv, unsigned nj, CUlibraryOption *lo, void **lv, unsigned nl) {
    COUNT(); uint64_t h; CUresult r = module_load(&h, image_bytes(c)); if (!r) *l = (CUlibrary)(uintptr_t)h; return r;
}
EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *f, CUjit_option *jo, void **jv, unsigned nj, CUlibraryOption *lo, void **lv, unsigned nl) {
    COUNT(); uint64_t h; CUresult r = module_load(&h, file_bytes(f)); if (!r) *l = (CUlibrary)(uintptr_t)h; return r;
}
EXPORT CUresult cuLibraryUnload(CUlibrary l) { COUNT(); return module_unload((uint64_t)(uintptr_t)l); }
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    COUNT(); CUresult r = materialise((uint64_t)(uintptr_t)m); if (!r) *f = (CUfunction)(uintptr_t)((uint64_t)(uintptr_t)m + 1); return r;
}
EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) {
    COUNT(); CUresult r = materialise((uint64_t)(uintptr_t)l); if (!r) *k = (CUkernel)(uintptr_t)((uint64_t)(uintptr_t)l + 2); return r;
}
EXPORT CUresult cuLibraryGetModule(CUmodule *m, CUlibrary l) {
    COUNT(); CUresult r = materialise((uint64_t)(uintptr_t)l); if (!r) *m = (CUmodule)(uintptr_t)l; return r;
}
EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) { COUNT(); NEED_INIT(); *f = (CUfunction)(uintptr_t)k; return CUDA_SUCCESS; }
/* External memory: importing takes the descriptor's size of the current device (the memory
 * another API made lives on the card), until destroyed. */
EXPORT CUresult cuImportExternalMemory(CUexternalMemory *e, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *d) {
    COUNT(); NEED_INIT(); if (cur_dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t key; CUresult r = phys_alloc(cur_dev, d->size, &key); if (!r) *e = (CUexternalMemory)(uintptr_t)key; return r;
}
EXPORT CUresult cuDestroyExternalMemory(CUexternalMemory e) { COUNT(); NEED_INIT(); return phys_free((uint64_t)(uintptr_t)e) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS; }

/* ---- memory pools: handles only (allocations from them are plain allocations here); the
 * device's current pool starts as its default pool 0x9000 + d. */
static uintptr_t dev_pool[FAKE_MAX_DEV];
static _Atomic int next_pool;
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice d) {
    COUNT(); NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    *p = (CUmemoryPool)(dev_pool[d] ? dev_pool[d] : 0x9000 + (uintptr_t)d);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool p) {
    COUNT(); NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    dev_pool[d] = (uintptr_t)p;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const CUmemPoolProps *props) {
    COUNT(); NEED_INIT();
    *p = (CUmemoryPool)(0xa000 + ((uintptr_t)++next_pool << 4));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p) { COUNT(); NEED_INIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep) { COUNT(); NEED_INIT(); return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v) { COUNT(); NEED_INIT(); return p && v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* ---- IPC (fake_state.h): an import maps the exporter's memory; it takes no new physical memory,
 * and the memory lives until the exporter has freed it and the last import is closed. A handle is
 * "FIPC", the entry, its generation; an import maps at FAKE_IPC_WIN + entry * FAKE_IPC_STRIDE. */
static void ipc_lock(void) {
    fake_phys_t *f = fake_phys();
    uint32_t z = 0;
    while (!atomic_compare_exchange_weak(&f->ipc_lock, &z, 1)) { z = 0; sched_yield(); }
}
static void ipc_unlock(void) { atomic_store(&fake_phys()->ipc_lock, 0); }
/* The exporter frees entry i: 1 when the memory goes now (no import left), 0 when imports keep it. */
static int ipc_exporter_frees(int i) {
    fake_ipc_t *e = &fake_phys()->ipc[i];
    ipc_lock();
    int gone = e->opens <= 0;
    e->exporter_holds = 0;
    if (gone) e->state = 0;
    ipc_unlock();
    return gone;
}
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    COUNT(); NEED_INIT();
    pthread_mutex_lock(&amu);
    alloc_t *a = allocs;
    while (a && a->key != p) a = a->next;
    int i = a ? a->ipc - 1 : -1;
    fake_phys_t *f = fake_phys();
    if (a && i < 0) {
        ipc_lock();
        for (int k = 0; k < FAKE_MAX_IPC && i < 0; k++)
            if (!f->ipc[k].state) {
                f->ipc[k] = (fake_ipc_t){1, ++f->ipc_gen, a->phys, 0, 1, 0, a->bytes};
                i = k;
            }
        ipc_unlock();
        if (i >= 0) a->ipc = i + 1;
    }
    pthread_mutex_unlock(&amu);
    if (i < 0) return a ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, "FIPC", 4);
    memcpy(h->reserved + 4, &i, sizeof i);
    memcpy(h->reserved + 8, &f->ipc[i].gen, sizeof f->ipc[i].gen);
    return CUDA_SUCCESS;
}
static CUresult ipc_open(CUdeviceptr *p, CUipcMemHandle h) {
    NEED_INIT();
    int i;
    uint32_t gen;
    memcpy(&i, h.reserved + 4, sizeof i);
    memcpy(&gen, h.reserved + 8, sizeof gen);
    if (memcmp(h.reserved, "FIPC", 4) || i < 0 || i >= FAKE_MAX_IPC) return CUDA_ERROR_INVALID_VALUE;
    fake_ipc_t *e = &fake_phys()->ipc[i];
    ipc_lock();
    int ok = e->state == 1 && e->gen == gen;
    if (ok) e->opens++;
    ipc_unlock();
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    *p = FAKE_IPC_WIN + (uint64_t)i * FAKE_IPC_STRIDE;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned f) { COUNT(); return ipc_open(p, h); }
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned f) { COUNT(); return ipc_open(p, h); }
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    COUNT(); NEED_INIT();
    if (p < FAKE_IPC_WIN || (p - FAKE_IPC_WIN) % FAKE_IPC_STRIDE || (p - FAKE_IPC_WIN) / FAKE_IPC_STRIDE >= FAKE_MAX_IPC)
        return CUDA_ERROR_INVALID_VALUE;
    fake_phys_t *f = fake_phys();
    fake_ipc_t *e = &f->ipc[(p - FAKE_IPC_WIN) / FAKE_IPC_STRIDE];
    ipc_lock();
    int ok = e->state == 1 && e->opens > 0, gone = 0;
    if (ok && --e->opens == 0 && !e->exporter_holds) { e->state = 0; gone = 1; }
    ipc_unlock();
    if (gone) atomic_fetch_sub(&f->used[e->phys], e->bytes);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t b) { COUNT(); NEED_INIT(); uint64_t k; CUresult r = phys_alloc(CUR(), b, &k); if (!r) *p = k; return r; }
EXPORT CUresult cuMemAlloc(unsigned int *p, unsigned int b) { COUNT(); NEED_INIT(); uint64_t k; CUresult r = phys_alloc(CUR(), b, &k); if (!r) *p = (unsigned)k; return r; }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t b, unsigned f) { COUNT(); NEED_INIT(); uint64_t k; CUresult r = phys_alloc(CUR(), b, &k); if (!r) *p = k; return r; }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t b, CUstream s) { COUNT(); NEED_INIT(); if (captured_alloc(s, b, p)) return CUDA_SUCCESS; uint64_t k; CUresult r = phys_alloc(stream_dev(s), b, &k); if (!r) *p = k; return r; }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t b, CUstream s) { COUNT(); NEED_INIT(); if (captured_alloc(s, b, p)) return CUDA_SUCCESS; uint64_t k; CUresult r = phys_alloc(stream_dev(s), b, &k); if (!r) *p = k; return r; }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t b, CUmemoryPool pl, CUstream s) { COUNT(); NEED_INIT(); uint64_t k; CUresult r = phys_alloc(CUR(), b, &k); if (!r) *p = k; return r; }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t b, CUmemoryPool pl, CUstream s) { COUNT(); NEED_INIT(); uint64_t k; CUresult r = phys_alloc(CUR(), b, &k); if (!r) *p = k; return r; }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    COUNT(); NEED_INIT();
    const char *s = getenv("FAKE_PITCH_ALIGN");
    size_t al = s ? strtoul(s, NULL, 10) : 512;
    size_t pt = (w + al - 1) / al * al;
    uint64_t k;
    CUresult r = phys_alloc(CUR(), (uint64_t)pt * h, &k);
    if (!r) { *p = k; *pitch = pt; }
    return r;
}
EXPORT CUresult cuMemAllocPitch(unsigned int *p, unsigned int *pitch, unsigned w, unsigned h, unsigned e) {
    COUNT();
    CUdeviceptr q; size_t pt;
    CUresult r = cuMemAllocPitch_v2(&q, &pt, w, h, e);
    if (!r) { *p = (unsigned)q; *pitch = (unsigned)pt; }
    return r;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { COUNT(); NEED_INIT(); return p ? phys_free(p) : CUDA_SUCCESS; }
EXPORT CUresult cuMemFree(unsigned int p) { COUNT(); NEED_INIT(); return p ? phys_free(p) : CUDA_SUCCESS; }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { COUNT(); NEED_INIT(); if (captured_free(s)) return CUDA_SUCCESS; return phys_free(p); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { COUNT(); NEED_INIT(); if (captured_free(s)) return CUDA_SUCCESS; return phys_free(p); }

/* bytes per channel (the normalized x1/x2/x4 formats: per channel of NumChannels) */
static uint64_t fmt_bytes(CUarray_format f) {
    switch ((int)f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: case 0xc0: case 0xc1: case 0xc2: case 0xc6: case 0xc7: case 0xc8: return 1;
    case CU_AD_FORMAT_HALF: case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case 0xc3: case 0xc4: case 0xc5: return 2;
    default: return 4;
    }
}
/* A driver lays arrays out in tiles and pages: FAKE_ARRAY_PAD (bytes, default 1) rounds each up. */
static uint64_t array_pad(uint64_t b) {
    const char *s = getenv("FAKE_ARRAY_PAD");
    uint64_t p = s ? strtoull(s, NULL, 10) : 1;
    return p > 1 ? (b + p - 1) / p * p : b;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    COUNT(); NEED_INIT(); uint64_t k;
    CUresult r = phys_alloc(CUR(), array_pad((uint64_t)d->Width * (d->Height ? d->Height : 1) * fmt_bytes(d->Format) * d->NumChannels), &k);
    if (!r) *a = (CUarray)(uintptr_t)k;
    return r;
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    COUNT(); NEED_INIT(); uint64_t k;
    if (d->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) { *a = fake_sparse_array(); return CUDA_SUCCESS; }
    CUresult r = phys_alloc(CUR(), array_pad((uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * fmt_bytes(d->Format) * d->NumChannels), &k);
    if (!r) *a = (CUarray)(uintptr_t)k;
    return r;
}
typedef struct { unsigned int Width, Height; CUarray_format Format; unsigned int NumChannels; } desc_v1_t;
typedef struct { unsigned int Width, Height, Depth; CUarray_format Format; unsigned int NumChannels, Flags; } desc3_v1_t;
EXPORT CUresult cuArrayCreate(CUarray *a, const desc_v1_t *d) {
    COUNT();
    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = d->Width, .Height = d->Height, .Format = d->Format, .NumChannels = d->NumChannels};
    return cuArrayCreate_v2(a, &d2);
}
EXPORT CUresult cuArray3DCreate(CUarray *a, const desc3_v1_t *d) {
    COUNT();
    CUDA_ARRAY3D_DESCRIPTOR d2 = {.Width = d->Width, .Height = d->Height, .Depth = d->Depth, .Format = d->Format, .NumChannels = d->NumChannels};
    return cuArray3DCreate_v2(a, &d2);
}
EXPORT CUresult cuArrayDestroy(CUarray a) {
    COUNT(); NEED_INIT();
    if (fake_sparse_destroy(a)) return CUDA_SUCCESS;
    return phys_free((uint64_t)(uintptr_t)a);
}
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned lv) {
    COUNT(); NEED_INIT(); uint64_t k, bytes = 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned i = 0; i < (lv ? lv : 1); i++) {
        bytes += (uint64_t)w * (h ? h : 1) * (z ? z : 1) * fmt_bytes(d->Format) * d->NumChannels;
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : h; z = z > 1 ? z / 2 : z;
    }
    CUresult r = phys_alloc(CUR(), bytes, &k);
    if (!r) *m = (CUmipmappedArray)(uintptr_t)k;
    return r;
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { COUNT(); NEED_INIT(); return phys_free((uint64_t)(uintptr_t)m); }
/* cuMemCreate: fake_escapes.inc.c */
/* cuMemRelease: fake_escapes.inc.c (VMM handles live until released and unmapped) */
EXPORT CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot) {
    COUNT(); NEED_INIT();
    if (cur_dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    int phys = visible[cur_dev];
    uint64_t cap = fake_capacity(phys), used = atomic_load(&fake_phys()->used[phys]);
    *tot = cap; *fr = used > cap ? 0 : cap - used;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo(unsigned int *fr, unsigned int *tot) {
    size_t f, t; CUresult r = cuMemGetInfo_v2(&f, &t);
    if (!r) { *fr = f > 0xffffffffu ? 0xffffffffu : (unsigned)f; *tot = t > 0xffffffffu ? 0xffffffffu : (unsigned)t; }
    return r;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
    COUNT(); NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    *b = fake_capacity(visible[d]);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d) {
    size_t t; CUresult r = cuDeviceTotalMem_v2(&t, d);
    if (!r) *b = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    return r;
}
/* Two ABIs that HAMi-core confused (core#57): v1 has 4 arguments, v2 has 5. */
EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice d, CUstream s) { COUNT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation l, unsigned f, CUstream s) { COUNT(); return CUDA_SUCCESS; }

/* ---- launches: a modelled time-sliced card ----
 * Why not one first-come-first-served queue for all processes: a card without MPS time-slices
 * between the contexts that have work, in slices short against the compute limiter's (which
 * the limiter's fair clock assumes, and the H200 runs confirm). A shared FIFO instead ran each
 * process's whole batch of queued kernels in one piece: a tenant that paused for less than its
 * neighbours' queued batches lost nothing (its work would have waited anyway), and three
 * tenants at 30/30/40 could lock into an equal round robin, 1/3 each. So the fake models the
 * limit of small time slices: while k processes have kernels queued on a card, each one's
 * oldest kernel progresses at 1/k of the wall time (processor sharing); one process's kernels
 * run in launch order. */
static _Atomic uint64_t busy_total;
static uint64_t my_finish[FAKE_MAX_DEV]; /* this process's finish tag per physical card */
static uint64_t now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec; }

static void engine_lock(fake_engine_t *e) {
    for (unsigned spins = 0;; spins++) {
        uint32_t z = 0;
        if (atomic_compare_exchange_weak(&e->lock, &z, 1)) { atomic_store(&e->lock_ns, now_ns()); return; }
        if ((spins & 63) == 63) {
            uint64_t t = atomic_load(&e->lock_ns), now = now_ns();
            if (t && now - t > 100000000ull && atomic_compare_exchange_strong(&e->lock_ns, &t, now)) return;
            sched_yield();
        }
    }
}
static void engine_unlock(fake_engine_t *e) { atomic_store(&e->lock_ns, 0); atomic_store(&e->lock, 0); }

/* Contexts with work at service level v, and the smallest finish tag above v. */
static uint32_t backlog(fake_engine_t *e, uint64_t v, uint64_t *next) {
    uint32_t n = 0;
    *next = UINT64_MAX;
    for (int i = 0; i < FAKE_MAX_CTX; i++) {
        if (!atomic_load(&e->q[i].pid) || e->q[i].finish <= v) continue;
        n++;
        if (e->q[i].finish < *next) *next = e->q[i].finish;
    }
    return n;
}

/* Caller holds the lock: the contexts with work at vt have had `wall` more ns of it. */
static void charge_queued(fake_engine_t *e, uint64_t wall) {
    for (int i = 0; i < FAKE_MAX_CTX; i++)
        if (atomic_load(&e->q[i].pid) && e->q[i].finish > e->vt) e->q[i].queued_ns += wall;
}

/* Caller holds the lock: brings vt to wall time `now`, one drained context at a time. */
static void advance(fake_engine_t *e, uint64_t now) {
    while (now > e->last) {
        uint64_t next;
        uint32_t n = backlog(e, e->vt, &next);
        if (!n) { e->last = now; return; }
        uint64_t span = (next - e->vt) * n; /* wall time until the first backlog drains */
        if (e->last + span <= now) {
            charge_queued(e, span);
            e->vt = next;
            e->last += span;
            continue;
        }
        uint64_t q = (now - e->last) / n;
        charge_queued(e, q * n);
        e->vt += q;
        e->last += q * n; /* the remainder (< n ns) counts at the next advance */
        return;
    }
}

/* Streams: a process's kernels run in launch order whatever their stream (each kernel fills the
 * card, as the benchmarks' matmuls do), but each stream is complete when its own last kernel is:
 * cuStreamQuery and cuStreamSynchronize on a stream answer for that stream alone, on the NULL
 * stream (or one never launched on) for all of the process's work. */
#define FAKE_MAX_STREAMS 16
static struct { uintptr_t s; uint64_t finish; } stream_tag[FAKE_MAX_DEV][FAKE_MAX_STREAMS];
static int stream_slot(int phys, uintptr_t s, int add) {
    if (!s || s == 0x1 || s == 0x2) return -1; /* NULL, legacy, per-thread: the whole process */
    for (int i = 0; i < FAKE_MAX_STREAMS; i++)
        if (stream_tag[phys][i].s == s) return i;
    for (int i = 0; i < FAKE_MAX_STREAMS && add; i++)
        if (!stream_tag[phys][i].s) { stream_tag[phys][i].s = s; return i; }
    return -1;
}
static void enqueue_on(int dev, CUstream stream) {
    const char *s = getenv("FAKE_KERNEL_US");
    uint64_t d = s ? strtoull(s, NULL, 10) * 1000 : 0;
    if (!d || dev < 0 || dev >= nvisible) return;
    int phys = visible[dev];
    fake_engine_t *e = &fake_phys()->engine[phys];
    int32_t me = (int32_t)getpid();
    engine_lock(e);
    advance(e, now_ns());
    int slot = -1;
    for (int i = 0; i < FAKE_MAX_CTX && slot < 0; i++)
        if (atomic_load(&e->q[i].pid) == me) slot = i;
    for (int i = 0; i < FAKE_MAX_CTX && slot < 0; i++)
        if (!atomic_load(&e->q[i].pid) || e->q[i].finish <= e->vt) {
            atomic_store(&e->q[i].pid, me);
            e->q[i].finish = e->vt;
            e->q[i].queued_ns = 0;
            slot = i;
        }
    if (slot < 0) slot = 0; /* more processes than slots: share the first one's queue */
    fake_ctxq_t *q = &e->q[slot];
    q->finish = (q->finish > e->vt ? q->finish : e->vt) + d;
    my_finish[phys] = q->finish;
    int k = stream_slot(phys, (uintptr_t)stream, 1);
    if (k >= 0) stream_tag[phys][k].finish = q->finish;
    engine_unlock(e);
    atomic_fetch_add(&busy_total, d);
}
static void enqueue(void) { enqueue_on(cur_dev, NULL); }
EXPORT uint64_t fake_busy_ns(void) { return atomic_load(&busy_total); }
/* Wall time this process has had work queued, summed over the cards, ns: the time in which it
 * fed the card (its busy time is the card's time it got meanwhile). */
EXPORT uint64_t fake_queued_ns(void) {
    uint64_t sum = 0;
    int32_t me = (int32_t)getpid();
    for (int p = 0; p < FAKE_MAX_DEV; p++) {
        if (!my_finish[p]) continue;
        fake_engine_t *e = &fake_phys()->engine[p];
        engine_lock(e);
        advance(e, now_ns());
        for (int i = 0; i < FAKE_MAX_CTX; i++)
            if (atomic_load(&e->q[i].pid) == me) sum += e->q[i].queued_ns;
        engine_unlock(e);
    }
    return sum;
}

/* Sleeps until this process's kernels on card `phys` are done: until the time they would finish
 * with the work queued now, again if others queued more meanwhile (which can only delay it). */
static void drain_to(int phys, uint64_t target) {
    fake_engine_t *e = &fake_phys()->engine[phys];
    for (;;) {
        engine_lock(e);
        uint64_t now = now_ns();
        advance(e, now);
        uint64_t v = e->vt, at = e->last;
        if (v >= target) { engine_unlock(e); return; }
        for (;;) {
            uint64_t next;
            uint32_t n = backlog(e, v, &next); /* >= 1: our own slot is above v */
            if (next >= target) { at += (target - v) * n; break; }
            at += (next - v) * n;
            v = next;
        }
        engine_unlock(e);
        if (at > now) {
            struct timespec ts = {(time_t)((at - now) / 1000000000ull), (long)((at - now) % 1000000000ull)};
            nanosleep(&ts, NULL);
        }
    }
}
static void drain(int phys) { drain_to(phys, my_finish[phys]); }
EXPORT CUresult cuCtxSynchronize(void) {
    COUNT(); NEED_INIT();
    for (int p = 0; p < FAKE_MAX_DEV; p++)
        if (my_finish[p]) drain(p);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    COUNT(); NEED_INIT();
    for (int p = 0; p < FAKE_MAX_DEV; p++) {
        if (!my_finish[p]) continue;
        int k = stream_slot(p, (uintptr_t)s, 0);
        if (k < 0 && s && s != (CUstream)0x1 && s != (CUstream)0x2) continue; /* nothing launched on it here */
        drain_to(p, k >= 0 ? stream_tag[p][k].finish : my_finish[p]);
    }
    return CUDA_SUCCESS;
}
/* ---- compute limiter's idle watcher (smqueue.c): stream queries, capture mode ----
 * cuStreamQuery answers for the stream's own last kernel (for the NULL stream: all of this
 * process's work on its cards). */
EXPORT CUresult cuStreamQuery(CUstream s) {
    COUNT(); NEED_INIT();
    for (int p = 0; p < FAKE_MAX_DEV; p++) {
        if (!my_finish[p]) continue;
        fake_engine_t *e = &fake_phys()->engine[p];
        int k = stream_slot(p, (uintptr_t)s, 0);
        if (k < 0 && s && s != (CUstream)0x1 && s != (CUstream)0x2) continue; /* nothing launched on it here */
        uint64_t target = k >= 0 ? stream_tag[p][k].finish : my_finish[p];
        engine_lock(e);
        advance(e, now_ns());
        int busy = e->vt < target;
        engine_unlock(e);
        if (busy) return CUDA_ERROR_NOT_READY;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *m) { COUNT(); *m = CU_STREAM_CAPTURE_MODE_GLOBAL; return CUDA_SUCCESS; }
/* ---- end of the idle watcher's section ---- */
#define LAUNCH_ARGS CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s
EXPORT CUresult cuLaunchKernel(LAUNCH_ARGS, void **p, void **e) { COUNT(); NEED_INIT(); enqueue_on(cur_dev, s); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS, void **p, void **e) { COUNT(); NEED_INIT(); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { COUNT(); NEED_INIT(); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { COUNT(); NEED_INIT(); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchCooperativeKernel(LAUNCH_ARGS, void **p) { COUNT(); NEED_INIT(); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_ARGS, void **p) { COUNT(); NEED_INIT(); enqueue(); return CUDA_SUCCESS; }
/* The deprecated entry points: cuLaunch and cuLaunchGrid on the legacy stream; the multi-device
 * launch queues one kernel on each listed stream's device. */
EXPORT CUresult cuLaunch(CUfunction f) { COUNT(); NEED_INIT(); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) { COUNT(); NEED_INIT(); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) { COUNT(); NEED_INIT(); enqueue_on(stream_dev(s), s); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned n, unsigned f) {
    COUNT(); NEED_INIT();
    if (!l || !n) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) enqueue_on(stream_dev(l[i].hStream), l[i].hStream);
    return CUDA_SUCCESS;
}
/* Graph memory: launching or uploading a graph reserves FAKE_GRAPH_MIB (default 0) in the
 * device's graph pool, kept until cuDeviceGraphMemTrim. */
static uint64_t graph_reserved[FAKE_MAX_DEV];
static void graph_reserve(CUgraphExec g) {
    const char *s = getenv("FAKE_GRAPH_MIB");
    uint64_t want = (s ? strtoull(s, NULL, 10) : 0) << 20, need = fake_exec_bytes(g, cur_dev);
    if (need > want) want = need; /* the instantiation's allocation nodes */
    if (cur_dev < 0 || graph_reserved[cur_dev] >= want) return;
    atomic_fetch_add(&fake_phys()->used[visible[cur_dev]], want - graph_reserved[cur_dev]);
    graph_reserved[cur_dev] = want;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { COUNT(); NEED_INIT(); graph_reserve(g); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { COUNT(); NEED_INIT(); graph_reserve(g); enqueue(); return CUDA_SUCCESS; }
EXPORT CUresult cuGraphUpload(CUgraphExec g, CUstream s) { COUNT(); NEED_INIT(); graph_reserve(g); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute a, void *v) {
    COUNT(); NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    *(cuuint64_t *)v = a == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT ? graph_reserved[d] : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d) {
    COUNT(); NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    atomic_fetch_sub(&fake_phys()->used[visible[d]], graph_reserved[d]);
    graph_reserved[d] = 0;
    return CUDA_SUCCESS;
}

/* ---- VMM, graph memory nodes, stream capture, context limits, IPC sizes: a file of its own ---- */
#include "fake_escapes.inc.c"

/* ---- cuGetProcAddress: name x version x flags, from our own table ---- */
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st);
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
typedef struct { const char *name; void *fn; int min_ver; } proc_t;
#define P(n, v) {#n, (void *)n, v}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* the deprecated launches are entries too */
static const proc_t procs[] = {
    P(cuInit, 2000), P(cuDriverGetVersion, 2020), P(cuDeviceGetCount, 2000), P(cuDeviceGet, 2000),
    P(cuDeviceGetUuid, 9020), P(cuDeviceGetUuid_v2, 11040), P(cuCtxGetDevice, 2000), P(cuCtxSetCurrent, 4000),
    P(cuDevicePrimaryCtxRetain, 7000), P(cuDevicePrimaryCtxRelease, 7000), P(cuDevicePrimaryCtxRelease_v2, 11000), P(cuCtxSynchronize, 2000),
    P(cuMemAlloc, 2000), P(cuMemAlloc_v2, 3020), P(cuMemFree, 2000), P(cuMemFree_v2, 3020),
    P(cuMemAllocPitch, 2000), P(cuMemAllocPitch_v2, 3020), P(cuArrayCreate, 2000), P(cuArray3DCreate, 2000), P(cuMemAllocManaged, 6000), P(cuMemAllocAsync, 11020), P(cuMemAllocAsync_ptsz, 11020),
    P(cuMemAllocFromPoolAsync, 11020), P(cuMemAllocFromPoolAsync_ptsz, 11020), P(cuMemFreeAsync, 11020),
    P(cuMemFreeAsync_ptsz, 11020), P(cuArrayCreate_v2, 3020), P(cuArray3DCreate_v2, 3020), P(cuArrayDestroy, 2000),
    P(cuMipmappedArrayCreate, 5000), P(cuMipmappedArrayDestroy, 5000), P(cuMemCreate, 10020), P(cuMemRelease, 10020),
    P(cuMemGetInfo, 2000), P(cuMemGetInfo_v2, 3020), P(cuDeviceTotalMem, 2000), P(cuDeviceTotalMem_v2, 3020),
    P(cuMemPrefetchAsync, 8000), P(cuMemPrefetchAsync_v2, 12020),
    P(cuLaunchKernel, 4000), P(cuLaunchKernel_ptsz, 7000), P(cuLaunchKernelEx, 11060), P(cuLaunchKernelEx_ptsz, 11060),
    P(cuLaunchCooperativeKernel, 9000), P(cuLaunchCooperativeKernel_ptsz, 9000), P(cuGraphLaunch, 10000),
    P(cuLaunch, 2000), P(cuLaunchGrid, 2000), P(cuLaunchGridAsync, 2000), P(cuLaunchCooperativeKernelMultiDevice, 9000),
    P(cuGraphLaunch_ptsz, 10000), P(cuGraphUpload, 11010), P(cuDeviceGetGraphMemAttribute, 11040),
    P(cuDeviceGraphMemTrim, 11040), P(cuGetProcAddress, 11030), P(cuGetProcAddress_v2, 12000),
    P(cuCtxCreate, 2000), P(cuCtxCreate_v2, 3020), P(cuCtxCreate_v3, 11040), P(cuCtxCreate_v4, 12050),
    P(cuCtxDestroy, 2000), P(cuCtxDestroy_v2, 4000), P(cuCtxGetCurrent, 2000),
    P(cuStreamQuery, 2000), P(cuThreadExchangeStreamCaptureMode, 10010), P(cuStreamDestroy_v2, 4000), /* idle watcher */
    P(cuModuleLoad, 2000), P(cuModuleLoadData, 2000), P(cuModuleLoadDataEx, 2010), P(cuModuleLoadFatBinary, 2000),
    P(cuModuleUnload, 2000), P(cuLibraryLoadData, 12000), P(cuLibraryLoadFromFile, 12000), P(cuLibraryUnload, 12000),
    P(cuModuleGetFunction, 2000), P(cuLibraryGetKernel, 12000), P(cuLibraryGetModule, 12000), P(cuKernelGetFunction, 12000),
    P(cuImportExternalMemory, 10000), P(cuDestroyExternalMemory, 10000),
    P(cuIpcGetMemHandle, 4010), P(cuIpcOpenMemHandle, 4010), P(cuIpcOpenMemHandle_v2, 11000),
    P(cuIpcCloseMemHandle, 4010), P(cuDeviceGetMemPool, 11020), P(cuDeviceSetMemPool, 11020),
    P(cuMemPoolCreate, 11020), P(cuMemPoolDestroy, 11020), P(cuMemPoolTrimTo, 11020), P(cuMemPoolSetAttribute, 11020),
    FAKE_ESCAPE_PROCS
};
#pragma GCC diagnostic pop
static const proc_t *find_proc(const char *name) {
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (!strcmp(procs[i].name, name)) return &procs[i];
    return NULL;
}
EXPORT const char *fake_proc_name(void *fn) {
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (procs[i].fn == fn) return procs[i].name;
    return NULL;
}
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st) {
    COUNT();
    char name[128];
    const proc_t *best = NULL, *any = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", sym);
        const proc_t *p = find_proc(name);
        if (p && p->min_ver <= ver) best = p;
    }
    for (int v = 4; v >= 1 && !best; v--) {
        if (v > 1) snprintf(name, sizeof name, "%s_v%d", sym, v);
        else snprintf(name, sizeof name, "%s", sym);
        const proc_t *p = find_proc(name);
        if (p && !any) any = p;
        if (p && p->min_ver <= ver) best = p;
    }
    if (!best) {
        *pfn = NULL;
        if (st) *st = any ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    COUNT();
    return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
