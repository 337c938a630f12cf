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
#include "testutil.h"

#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuGetProcAddress

CUresult cuMemAlloc(unsigned int *p, unsigned int b);
CUresult cuMemFree(unsigned int p);
CUresult cuMemGetInfo(unsigned int *f, unsigned int *t);
CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d);
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t b, CUstream s);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t b, CUmemoryPool pl, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s);

typedef struct { void *n; } nvdev;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d);
typedef struct { unsigned long long total, free, used; } mem1_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem2_t;
int nvmlDeviceGetMemoryInfo(void *d, mem1_t *m);
int nvmlDeviceGetMemoryInfo_v2(void *d, mem2_t *m);

enum { K_PTR, K_PTR1, K_ASYNC, K_ARRAY, K_MIPMAP, K_VMM };
static struct { int kind; uint64_t v; } ids[4096];
static int nids;
static int add_id(int kind, uint64_t v) { ids[nids].kind = kind; ids[nids].v = v; return nids++; }

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
            r = cuMemCreate(&h, tu_size(ARG(2)), &prop, 0); i += 2;
            OUT("%s %d %d", op, r, r ? -1 : add_id(K_VMM, h));
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
        } else if (!strcmp(op, "calls")) {
            int (*cnt)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "fake_count");
            OUT("calls 0 %d", cnt(ARG(1))); i++;
        } else if (!strcmp(op, "waitfile")) {
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
        } else {
            OUT("unknown-op %s", op);
            return 2;
        }
    }
    return 0;
}
