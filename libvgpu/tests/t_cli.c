/*
 * t_cli.c - a scriptable CUDA/NVML client for the libvgpu tests.
 * Each argument group is one operation; each operation prints one line:
 *   "<op> <CUresult> [values...]". The pytest drivers assert on these lines.
 * Run under LD_PRELOAD=libvgpu.so with LD_LIBRARY_PATH at the fake libraries.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "cuda_compat.h"
#include "testutil.h"

#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuGetProcAddress
#undef cuGraphUpload
#undef cuGraphLaunch
CUresult cuGraphUpload(CUgraphExec g, CUstream s);
CUresult cuGraphLaunch(CUgraphExec g, CUstream s);

CUresult cuMemAlloc(unsigned int *p, unsigned int b);
CUresult cuMemFree(unsigned int p);
CUresult cuMemGetInfo(unsigned int *f, unsigned int *t);
CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d);
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t b, CUstream s);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t b, CUmemoryPool pl, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s);
#undef cuCtxCreate
#undef cuCtxDestroy
CUresult cuCtxCreate(CUcontext *c, unsigned f, CUdevice d);
CUresult cuCtxCreate_v2(CUcontext *c, unsigned f, CUdevice d);
CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *p, int n, unsigned f, CUdevice d);
CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned f, CUdevice d);
CUresult cuCtxDestroy(CUcontext c);
CUresult cuCtxDestroy_v2(CUcontext c);

typedef struct { void *n; } nvdev;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d);
typedef struct { unsigned long long total, free, used; } mem1_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem2_t;
int nvmlDeviceGetMemoryInfo(void *d, mem1_t *m);
int nvmlDeviceGetMemoryInfo_v2(void *d, mem2_t *m);

enum { K_PTR, K_PTR1, K_ASYNC, K_ARRAY, K_MIPMAP, K_VMM, K_CTX, K_MODULE, K_LIBRARY, K_IPC, K_POOL, K_EXT,
       K_VMAP, K_GRAPH, K_EXEC, K_STREAM };
static struct { int kind; uint64_t v, size; } ids[4096];
static int nids;
static CUstream cli_streams[8];
static int add_id(int kind, uint64_t v) { ids[nids].kind = kind; ids[nids].v = v; ids[nids].size = 0; return nids++; }
static int escape_op(int argc, char **argv, int *pi); /* cli_escapes.inc.c */

static const char *where(void *fn) {
    static char buf[256];
    Dl_info i;
    if (!fn) return "NULL";
    if (!dladdr(fn, &i) || !i.dli_fname) return "unknown";
    const char *b = strrchr(i.dli_fname, '/');
    snprintf(buf, sizeof buf, "%s:%s", b ? b + 1 : i.dli_fname, i.dli_sname ? i.dli_sname : "?");
    return buf;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int set_ctx(int ord) {
    CUdevice d;
    CUcontext c;
    CUresult r = cuDeviceGet(&d, ord);
    if (!r) r = cuDevicePrimaryCtxRetain(&c, d);
    if (!r) r = cuCtxSetCurrent(c);
    return r;
}

static CUresult free_id(int id) {
    uint64_t v = ids[id].v;
    switch (ids[id].kind) {
    case K_PTR1: return cuMemFree((unsigned)v);
    case K_ASYNC: return cuMemFreeAsync((CUdeviceptr)v, NULL);
    case K_ARRAY: return cuArrayDestroy((CUarray)(uintptr_t)v);
    case K_MIPMAP: return cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)v);
    case K_VMM: return cuMemRelease((CUmemGenericAllocationHandle)v);
    case K_CTX: return cuCtxDestroy_v2((CUcontext)(uintptr_t)v);
    case K_MODULE: return cuModuleUnload((CUmodule)(uintptr_t)v);
    case K_LIBRARY: return cuLibraryUnload((CUlibrary)(uintptr_t)v);
    case K_IPC: return cuIpcCloseMemHandle((CUdeviceptr)v);
    case K_POOL: return cuMemPoolDestroy((CUmemoryPool)(uintptr_t)v);
    case K_EXT: return cuDestroyExternalMemory((CUexternalMemory)(uintptr_t)v);
    case K_VMAP: return cuMemUnmap((CUdeviceptr)v, ids[id].size);
    case K_EXEC: return cuGraphExecDestroy((CUgraphExec)(uintptr_t)v);
    case K_GRAPH: return cuGraphDestroy((CUgraph)(uintptr_t)v);
    default: return cuMemFree_v2((CUdeviceptr)v);
    }
}

#define OUT(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
#define ARG(k) (i + (k) < argc ? argv[i + (k)] : "0")

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        CUresult r = CUDA_SUCCESS;
        CUdeviceptr p = 0;
        if (!strcmp(op, "init")) {
            r = cuInit(0);
            if (!r) r = set_ctx(0);
            OUT("init %d", r);
        } else if (!strcmp(op, "cuinit")) {
            OUT("cuinit %d", cuInit(0));
        } else if (!strcmp(op, "ctx")) {
            OUT("ctx %d", set_ctx(atoi(ARG(1)))); i++;
        } else if (!strcmp(op, "ctxrelease")) {
            OUT("ctxrelease %d", cuDevicePrimaryCtxRelease_v2(atoi(ARG(1)))); i++;
        } else if (!strcmp(op, "ctxreset")) {
            OUT("ctxreset %d", cuDevicePrimaryCtxReset_v2(atoi(ARG(1)))); i++;
        } else if (!strcmp(op, "count")) {
            int n = -1; r = cuDeviceGetCount(&n); OUT("count %d %d", r, n);
        } else if (!strcmp(op, "alloc") || !strcmp(op, "managed") || !strcmp(op, "async") ||
                   !strcmp(op, "async_ptsz") || !strcmp(op, "pool") || !strcmp(op, "pool_ptsz")) {
            uint64_t b = tu_size(ARG(1)); i++;
            int kind = K_PTR;
            if (!strcmp(op, "alloc")) r = cuMemAlloc_v2(&p, b);
            else if (!strcmp(op, "managed")) r = cuMemAllocManaged(&p, b, CU_MEM_ATTACH_GLOBAL);
            else if (!strcmp(op, "async")) { r = cuMemAllocAsync(&p, b, NULL); kind = K_ASYNC; }
            else if (!strcmp(op, "async_ptsz")) { r = cuMemAllocAsync_ptsz(&p, b, NULL); kind = K_ASYNC; }
            else if (!strcmp(op, "pool")) { r = cuMemAllocFromPoolAsync(&p, b, NULL, NULL); kind = K_ASYNC; }
            else { r = cuMemAllocFromPoolAsync_ptsz(&p, b, NULL, NULL); kind = K_ASYNC; }
            OUT("%s %d %d", op, r, r ? -1 : add_id(kind, p));
        } else if (!strcmp(op, "alloc1")) {
            unsigned int q = 0;
            r = cuMemAlloc(&q, (unsigned)tu_size(ARG(1))); i++;
            OUT("alloc1 %d %d", r, r ? -1 : add_id(K_PTR1, q));
        } else if (!strcmp(op, "pitch")) {
            size_t pitch = 0;
            r = cuMemAllocPitch_v2(&p, &pitch, tu_size(ARG(1)), tu_size(ARG(2)), 4); i += 2;
            OUT("pitch %d %d %zu", r, r ? -1 : add_id(K_PTR, p), pitch);
        } else if (!strcmp(op, "pitch1")) {
            unsigned int q = 0, pitch = 0;
            CUresult (*fn)(unsigned int *, unsigned int *, unsigned, unsigned, unsigned) =
                (CUresult(*)(unsigned int *, unsigned int *, unsigned, unsigned, unsigned))dlsym(RTLD_DEFAULT, "cuMemAllocPitch");
            r = fn(&q, &pitch, (unsigned)tu_size(ARG(1)), (unsigned)tu_size(ARG(2)), 4); i += 2;
            OUT("pitch1 %d %d %u", r, r ? -1 : add_id(K_PTR1, q), pitch);
        } else if (!strcmp(op, "array1") || !strcmp(op, "array3d1")) {
            /* the v1 ABI (32-bit descriptors), reached by symbol name as a CUDA < 3.2 program would */
            struct { unsigned int w, h, d; CUarray_format f; unsigned int ch, flags; } d3 = {0};
            struct { unsigned int w, h; CUarray_format f; unsigned int ch; } d2 = {0};
            CUarray a = 0;
            if (!strcmp(op, "array1")) {
                d2.w = (unsigned)tu_size(ARG(1)); d2.h = (unsigned)tu_size(ARG(2)); d2.f = CU_AD_FORMAT_FLOAT; d2.ch = 1; i += 2;
                r = ((CUresult(*)(CUarray *, void *))dlsym(RTLD_DEFAULT, "cuArrayCreate"))(&a, &d2);
            } else {
                d3.w = (unsigned)tu_size(ARG(1)); d3.h = (unsigned)tu_size(ARG(2)); d3.d = (unsigned)tu_size(ARG(3));
                d3.f = CU_AD_FORMAT_FLOAT; d3.ch = 1; i += 3;
                r = ((CUresult(*)(CUarray *, void *))dlsym(RTLD_DEFAULT, "cuArray3DCreate"))(&a, &d3);
            }
            OUT("%s %d %d", op, r, r ? -1 : add_id(K_ARRAY, (uintptr_t)a));
        } else if (!strcmp(op, "array") || !strcmp(op, "array3d") || !strcmp(op, "mipmap")) {
            CUDA_ARRAY3D_DESCRIPTOR d3 = {0};
            d3.Format = CU_AD_FORMAT_FLOAT; d3.NumChannels = 1;
            d3.Width = tu_size(ARG(1)); d3.Height = tu_size(ARG(2));
            if (!strcmp(op, "array")) {
                CUDA_ARRAY_DESCRIPTOR d = {.Width = d3.Width, .Height = d3.Height, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
                CUarray a = 0; r = cuArrayCreate_v2(&a, &d); i += 2;
                OUT("array %d %d", r, r ? -1 : add_id(K_ARRAY, (uintptr_t)a));
            } else if (!strcmp(op, "array3d")) {
                d3.Depth = tu_size(ARG(3));
                CUarray a = 0; r = cuArray3DCreate_v2(&a, &d3); i += 3;
                OUT("array3d %d %d", r, r ? -1 : add_id(K_ARRAY, (uintptr_t)a));
            } else {
                CUmipmappedArray m = 0; r = cuMipmappedArrayCreate(&m, &d3, (unsigned)atoi(ARG(3))); i += 3;
                OUT("mipmap %d %d", r, r ? -1 : add_id(K_MIPMAP, (uintptr_t)m));
            }
        } else if (!strcmp(op, "vmm") || !strcmp(op, "vmmhost")) {
            CUmemAllocationProp prop = {0};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = !strcmp(op, "vmm") ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST_NUMA;
            prop.location.id = atoi(ARG(1));
            CUmemGenericAllocationHandle h = 0;
            uint64_t sz = tu_size(ARG(2));
            r = cuMemCreate(&h, sz, &prop, 0); i += 2;
            int id = r ? -1 : add_id(K_VMM, h);
            if (id >= 0) ids[id].size = sz;
            OUT("%s %d %d", op, r, id);
        } else if (!strcmp(op, "ctxcreate")) {
            /* ctxcreate <dev> <1|2|3|4>: the cuCtxCreate of that ABI version */
            CUcontext c = NULL;
            CUdevice d = atoi(ARG(1));
            int v = atoi(ARG(2)); i += 2;
            if (v == 1) r = cuCtxCreate(&c, 0, d);
            else if (v == 2) r = cuCtxCreate_v2(&c, 0, d);
            else if (v == 3) r = cuCtxCreate_v3(&c, NULL, 0, 0, d);
            else { CUctxCreateParams prm = {0}; r = cuCtxCreate_v4(&c, &prm, 0, d); }
            OUT("ctxcreate %d %d", r, r ? -1 : add_id(K_CTX, (uintptr_t)c));
        } else if (!strcmp(op, "ctxdestroy1")) {
            int id = atoi(ARG(1)); i++;
            OUT("ctxdestroy1 %d", cuCtxDestroy((CUcontext)(uintptr_t)ids[id].v));
        } else if (!strcmp(op, "setctx")) {
            int id = atoi(ARG(1)); i++;
            OUT("setctx %d", cuCtxSetCurrent((CUcontext)(uintptr_t)ids[id].v));
        } else if (!strcmp(op, "modload")) {
            /* modload <file|data|dataex|fatbin|lib|libfile> <bytes>: an image the fake sizes */
            const char *how = ARG(1);
            char image[64], path[256];
            snprintf(image, sizeof image, "FAKEMOD:%llu", (unsigned long long)tu_size(ARG(2)));
            i += 2;
            snprintf(path, sizeof path, "/tmp/t_cli_mod.%d", (int)getpid());
            if (!strcmp(how, "file") || !strcmp(how, "libfile")) {
                FILE *f = fopen(path, "w");
                fputs(image, f);
                fclose(f);
            }
            CUmodule m = NULL;
            CUlibrary l = NULL;
            int kind = K_MODULE;
            if (!strcmp(how, "file")) r = cuModuleLoad(&m, path);
            else if (!strcmp(how, "data")) r = cuModuleLoadData(&m, image);
            else if (!strcmp(how, "dataex")) r = cuModuleLoadDataEx(&m, image, 0, NULL, NULL);
            else if (!strcmp(how, "fatbin")) r = cuModuleLoadFatBinary(&m, image);
            else if (!strcmp(how, "lib")) { r = cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0); kind = K_LIBRARY; }
            else { r = cuLibraryLoadFromFile(&l, path, NULL, NULL, 0, NULL, NULL, 0); kind = K_LIBRARY; }
            unlink(path);
            OUT("modload %d %d", r, r ? -1 : add_id(kind, kind == K_MODULE ? (uintptr_t)m : (uintptr_t)l));
        } else if (!strcmp(op, "getfunc")) {
            /* getfunc <id>: a function handle of a loaded module (cuModuleGetFunction) or library
             * (cuLibraryGetKernel) - where lazily loaded code materialises */
            int id = atoi(ARG(1)); i++;
            if (ids[id].kind == K_MODULE) {
                CUfunction f;
                r = cuModuleGetFunction(&f, (CUmodule)(uintptr_t)ids[id].v, "k");
            } else {
                CUkernel k;
                r = cuLibraryGetKernel(&k, (CUlibrary)(uintptr_t)ids[id].v, "k");
            }
            OUT("getfunc %d", r);
        } else if (!strcmp(op, "extmem")) {
            /* extmem <bytes>: import memory another API made (an opaque fd the fake ignores) */
            CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
            memset(&d, 0, sizeof d);
            d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
            d.handle.fd = -1;
            d.size = tu_size(ARG(1)); i++;
            CUexternalMemory e = NULL;
            r = cuImportExternalMemory(&e, &d);
            OUT("extmem %d %d", r, r ? -1 : add_id(K_EXT, (uintptr_t)e));
        } else if (!strcmp(op, "graphlaunch")) {
            OUT("graphlaunch %d", cuGraphLaunch(NULL, NULL));
        } else if (!strcmp(op, "graphupload")) {
            OUT("graphupload %d", cuGraphUpload(NULL, NULL));
        } else if (!strcmp(op, "graphtrim")) {
            OUT("graphtrim %d", cuDeviceGraphMemTrim(0));
        } else if (!strcmp(op, "sync")) {
            OUT("sync %d", cuCtxSynchronize());
        } else if (!strcmp(op, "streamsync")) {
            OUT("streamsync %d", cuStreamSynchronize(NULL));
        } else if (!strcmp(op, "streams")) { /* streams <k>: creates streams 0..k-1 (at most 8) */
            int k = atoi(ARG(1)); i++;
            r = CUDA_SUCCESS;
            for (int j = 0; j < k && j < 8 && !r; j++) r = cuStreamCreate(&cli_streams[j], 0);
            OUT("streams %d", r);
        } else if (!strcmp(op, "slaunch")) { /* slaunch <stream> <n>: n kernels on one of them */
            int j = atoi(ARG(1)) & 7, n = atoi(ARG(2)); i += 2;
            r = CUDA_SUCCESS;
            for (int k = 0; k < n && !r; k++) r = cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, cli_streams[j], NULL, NULL);
            OUT("slaunch %d", r);
        } else if (!strcmp(op, "ssync")) { /* ssync <stream> */
            int j = atoi(ARG(1)) & 7; i++;
            OUT("ssync %d", cuStreamSynchronize(cli_streams[j]));
        } else if (!strcmp(op, "poolcreate")) {
            /* poolcreate: a new pool on device 0; "setpool <id>" makes it the device's current pool */
            CUmemPoolProps props = {0};
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            CUmemoryPool pl = NULL;
            r = cuMemPoolCreate(&pl, &props);
            OUT("poolcreate %d %d", r, r ? -1 : add_id(K_POOL, (uintptr_t)pl));
        } else if (!strcmp(op, "setpool")) {
            int id = atoi(ARG(1)); i++;
            OUT("setpool %d", cuDeviceSetMemPool(0, (CUmemoryPool)(uintptr_t)ids[id].v));
        } else if (!strcmp(op, "poolalloc")) {
            /* poolalloc <pool id> <bytes>: cuMemAllocFromPoolAsync from that pool */
            int id = atoi(ARG(1));
            uint64_t b = tu_size(ARG(2)); i += 2;
            r = cuMemAllocFromPoolAsync(&p, b, (CUmemoryPool)(uintptr_t)ids[id].v, NULL);
            OUT("poolalloc %d %d", r, r ? -1 : add_id(K_ASYNC, p));
        } else if (!strcmp(op, "trim") || !strcmp(op, "threshold")) {
            /* trim|threshold <pool id or -1 for device 0's current pool> <bytes> */
            int id = atoi(ARG(1));
            cuuint64_t b = tu_size(ARG(2)); i += 2;
            CUmemoryPool pl = NULL;
            if (id < 0) r = cuDeviceGetMemPool(&pl, 0);
            else pl = (CUmemoryPool)(uintptr_t)ids[id].v;
            if (!r && !strcmp(op, "trim")) r = cuMemPoolTrimTo(pl, (size_t)b);
            else if (!r) r = cuMemPoolSetAttribute(pl, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &b);
            OUT("%s %d", op, r);
        } else if (!strcmp(op, "ipcopen")) {
            /* ipcopen <id>: export allocation <id> and import it again (the fake allows it in-process) */
            int id = atoi(ARG(1)); i++;
            CUipcMemHandle h;
            r = cuIpcGetMemHandle(&h, (CUdeviceptr)ids[id].v);
            if (!r) r = cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
            OUT("ipcopen %d %d", r, r ? -1 : add_id(K_IPC, p));
        } else if (!strcmp(op, "free")) {
            int id = atoi(ARG(1)); i++;
            OUT("free %d", id >= 0 && id < nids ? free_id(id) : -1);
        } else if (!strcmp(op, "freeptr")) {
            OUT("freeptr %d", cuMemFree_v2((CUdeviceptr)strtoull(ARG(1), NULL, 0))); i++;
        } else if (!strcmp(op, "meminfo")) {
            size_t f = 0, t = 0; r = cuMemGetInfo_v2(&f, &t); OUT("meminfo %d %zu %zu", r, f, t);
        } else if (!strcmp(op, "meminfo1")) {
            unsigned f = 0, t = 0; r = cuMemGetInfo(&f, &t); OUT("meminfo1 %d %u %u", r, f, t);
        } else if (!strcmp(op, "totalmem")) {
            size_t t = 0; r = cuDeviceTotalMem_v2(&t, atoi(ARG(1))); i++; OUT("totalmem %d %zu", r, t);
        } else if (!strcmp(op, "totalmem1")) {
            unsigned t = 0; r = cuDeviceTotalMem(&t, atoi(ARG(1))); i++; OUT("totalmem1 %d %u", r, t);
        } else if (!strcmp(op, "nvmlmem") || !strcmp(op, "nvmlmem2")) {
            void *d = NULL;
            int rc = nvmlInit_v2();
            if (!rc) rc = nvmlDeviceGetHandleByIndex_v2((unsigned)atoi(ARG(1)), &d);
            i++;
            if (!strcmp(op, "nvmlmem")) {
                mem1_t m = {0}; if (!rc) rc = nvmlDeviceGetMemoryInfo(d, &m);
                OUT("nvmlmem %d %llu %llu %llu", rc, m.total, m.used, m.free);
            } else {
                mem2_t m = {0}; if (!rc) rc = nvmlDeviceGetMemoryInfo_v2(d, &m);
                OUT("nvmlmem2 %d %llu %llu %llu %llu", rc, m.total, m.used, m.free, m.reserved);
            }
        } else if (!strcmp(op, "procaddr") || !strcmp(op, "procaddr1")) {
            void *fn = NULL;
            CUdriverProcAddressQueryResult st = -1;
            if (!strcmp(op, "procaddr")) r = cuGetProcAddress_v2(ARG(1), &fn, atoi(ARG(2)), strtoull(ARG(3), NULL, 0), &st);
            else r = cuGetProcAddress(ARG(1), &fn, atoi(ARG(2)), strtoull(ARG(3), NULL, 0));
            i += 3;
            OUT("%s %d %d %s", op, r, (int)st, where(fn));
        } else if (!strcmp(op, "procaddr_alloc")) {
            /* resolve cuMemAlloc by version through door C and call it */
            void *fn = NULL;
            r = cuGetProcAddress_v2("cuMemAlloc", &fn, atoi(ARG(1)), 0, NULL);
            uint64_t b = tu_size(ARG(2)); i += 2;
            if (!r) r = ((CUresult(*)(CUdeviceptr *, size_t))fn)(&p, b);
            OUT("procaddr_alloc %d %d", r, r ? -1 : add_id(K_PTR, p));
        } else if (!strcmp(op, "dlsym") || !strcmp(op, "dlsym_nvml")) {
            void *h = dlopen(!strcmp(op, "dlsym") ? "libcuda.so.1" : "libnvidia-ml.so.1", RTLD_NOW);
            void *fn = h ? dlsym(h, ARG(1)) : NULL; i++;
            OUT("%s %s", op, where(fn));
        } else if (!strcmp(op, "dlvsym")) {
            /* dlvsym <name> <version>: the versioned lookup door through a libcuda handle */
            void *h = dlopen("libcuda.so.1", RTLD_NOW);
            void *fn = h ? dlvsym(h, ARG(1), ARG(2)) : NULL; i += 2;
            OUT("dlvsym %s", where(fn));
        } else if (!strcmp(op, "dlsym_default")) {
            OUT("dlsym_default %s", where(dlsym(RTLD_DEFAULT, ARG(1)))); i++;
        } else if (!strcmp(op, "dlsym_next")) {
            OUT("dlsym_next %s", where(dlsym(RTLD_NEXT, ARG(1)))); i++;
        } else if (!strcmp(op, "dlsym_alloc")) {
            void *h = dlopen("libcuda.so.1", RTLD_NOW);
            CUresult (*fn)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
            r = fn(&p, tu_size(ARG(1))); i++;
            OUT("dlsym_alloc %d %d", r, r ? -1 : add_id(K_PTR, p));
        } else if (!strcmp(op, "launch")) {
            int n = atoi(ARG(1)); i++;
            r = CUDA_SUCCESS;
            for (int k = 0; k < n && !r; k++) r = cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            OUT("launch %d", r);
        } else if (!strcmp(op, "timed_launch")) {
            uint64_t t0 = now_ns();
            r = cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            OUT("timed_launch %d %llu", r, (unsigned long long)(now_ns() - t0));
        } else if (!strcmp(op, "burn")) {
            /* launch modelled kernels for <ms> of wall time, syncing every 4 like the torch probe */
            uint64_t (*busy)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "fake_busy_ns");
            uint64_t dur = (uint64_t)atoi(ARG(1)) * 1000000ull; i++;
            uint64_t b0 = busy(), t0 = now_ns();
            while (now_ns() - t0 < dur) {
                for (int k = 0; k < 4; k++) cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                cuCtxSynchronize();
            }
            OUT("burn 0 %llu %llu", (unsigned long long)(busy() - b0), (unsigned long long)(now_ns() - t0));
        } else if (!strcmp(op, "queued")) {
            /* ns this process has had work queued on the fake card (fake_queued_ns) */
            uint64_t (*queued)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "fake_queued_ns");
            OUT("queued 0 %llu", (unsigned long long)queued());
        } else if (!strcmp(op, "bursty")) {
            /* bursty <ms> <kernels> <gap us>: bursts of <kernels> modelled kernels, a synchronise,
             * then <gap us> of CPU time without GPU work, for <ms> of wall time */
            uint64_t (*busy)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "fake_busy_ns");
            uint64_t dur = (uint64_t)atoi(ARG(1)) * 1000000ull;
            int k = atoi(ARG(2)), gap = atoi(ARG(3)); i += 3;
            uint64_t b0 = busy(), t0 = now_ns();
            while (now_ns() - t0 < dur) {
                for (int j = 0; j < k; j++) cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                cuCtxSynchronize();
                usleep((useconds_t)gap);
            }
            OUT("bursty 0 %llu %llu", (unsigned long long)(busy() - b0), (unsigned long long)(now_ns() - t0));
        } else if (!strcmp(op, "calls")) {
            int (*cnt)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "fake_count");
            OUT("calls 0 %d", cnt(ARG(1))); i++;
        } else if (!strcmp(op, "waitfile")) {
            OUT("waiting 0"); /* the test waits for this line, then creates the file */
            struct stat st;
            while (stat(ARG(1), &st) != 0) usleep(200);
            i++;
            OUT("waitfile 0");
        } else if (!strcmp(op, "sleep")) {
            usleep((useconds_t)atoi(ARG(1)) * 1000); i++;
        } else if (!strcmp(op, "hold")) {
            OUT("hold 0");
            for (;;) pause();
        } else if (!strcmp(op, "loop")) {
            int n = atoi(ARG(1)), ooms = 0; uint64_t b = tu_size(ARG(2)); i += 2;
            for (int k = 0; k < n; k++) {
                r = cuMemAlloc_v2(&p, b);
                if (r == CUDA_ERROR_OUT_OF_MEMORY) { ooms++; continue; }
                if (r) break;
                cuMemFree_v2(p);
            }
            OUT("loop %d %d", r == CUDA_ERROR_OUT_OF_MEMORY ? 0 : r, ooms);
        } else if (!strcmp(op, "fork_alloc")) {
            uint64_t b = tu_size(ARG(1)); i++;
            pid_t c = fork();
            if (c == 0) {
                set_ctx(0);
                r = cuMemAlloc_v2(&p, b);
                printf("child %d\n", r);
                fflush(stdout);
                _exit(0);
            }
            int st; waitpid(c, &st, 0);
            OUT("fork_alloc 0");
        } else if (!strcmp(op, "exit")) {
            _exit(atoi(ARG(1)));
        } else if (escape_op(argc, argv, &i)) {
            /* VMM mappings, graphs, stream capture, context limits: cli_escapes.inc.c */
        } else {
            OUT("unknown-op %s", op);
            return 2;
        }
    }
    return 0;
}

#include "cli_escapes.inc.c"
