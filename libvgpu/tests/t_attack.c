/*
 * t_attack.c - a hostile tenant for the libvgpu tests: each operation tries to get device memory
 * past the limit through a door a program can open with the C library alone (no ELF parsing, no
 * ioctls), and prints "<op> <CUresult>" (0 = the door is open). tests/libvgpu/test_tenant_doors.py
 * asserts that every door stays shut.
 *   init                      cuInit + device 0's primary context, as a normal program
 *   alloc <bytes>             cuMemAlloc_v2 (the front door, for comparison)
 *   libc_dlsym <ver> <bytes>  the C library's own dlsym, fetched with dlvsym(RTLD_DEFAULT, "dlsym", ver),
 *                             asked for libcuda's cuMemAlloc_v2
 *   libc_dlvsym <ver> <bytes> the same with dlvsym itself (fetched by dlsym)
 *   nslibc_dlsym <bytes>      dlsym of a second C library loaded with dlmopen(LM_ID_NEWLM)
 *   copy <path> <bytes>       a copy of libcuda.so.1 under another name: cuInit, primary context
 *                             and cuMemAlloc_v2 of the copy, all looked up with dlsym
 *   ns <bytes>                the same with libcuda.so.1 loaded into a new namespace (dlmopen)
 *   pool_on <dev> <bytes>     cuMemPoolCreate on device <dev>, then cuMemAllocFromPoolAsync from it
 *                             with the context of device 0 current (the driver takes the memory on
 *                             <dev>); prints "pool_on <CUresult>"
 *   legacy <entry> <door>     one launch through a deprecated entry point (cuLaunch, cuLaunchGrid,
 *                             cuLaunchGridAsync on a stream, or multi: cuLaunchCooperativeKernelMultiDevice
 *                             on a stream of device 0 and one of device 1), the function found by
 *                             <door>: sym (the process's own symbol), dlsym (a libcuda handle) or
 *                             procaddr (cuGetProcAddress_v2 at CUDA 13.0); prints "legacy <CUresult>"
 *   async_on <dev> <bytes>    cuMemAllocAsync on a stream made on device <dev>, with the context of
 *                             device 0 current (the driver takes the memory on <dev>)
 *   deep <door> <path> <bytes>  loads <path>, a library linked against libcuda, with RTLD_NOW |
 *                             RTLD_DEEPBIND and calls its deep_alloc(bytes) (a cuMemAlloc_v2 of its
 *                             own); <door> is how: dlopen, dlmopen (LM_ID_BASE), next (the dlopen
 *                             that libnextopen.so, preloaded after libvgpu, finds with dlsym(RTLD_NEXT))
 *                             or a symbol version of the C library's dlopen (dlvsym)
 *   runpath <path> <how> <mode>  dlopen(<path>) of librunpath.so, whose rp_open loads a library only
 *                             its RUNPATH finds, with dlopen or dlmopen (<how>) and RTLD_NOW or, for
 *                             <mode> deep, RTLD_NOW | RTLD_DEEPBIND; prints "runpath <value>" (42
 *                             when found, -1 when not)
 *   open <name>               dlopen(<name>, RTLD_NOW) from the program; prints "open 1" when it loads
 *   exit_hold                 registers an exit handler that outlives the library's: after
 *                             "exit", the process keeps its memory and prints "held"
 *   exit                      exit(0), running the exit handlers
 *   hold                      prints "hold" and waits to be killed
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "testutil.h"

#define OUT(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
#define ARG(k) (i + (k) < argc ? argv[i + (k)] : "0")

typedef void *(*dlsym_t)(void *, const char *);
typedef void *(*dlvsym_t)(void *, const char *, const char *);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);

static CUresult call_alloc(void *fn, uint64_t bytes) {
    CUdeviceptr p;
    return fn ? ((alloc_t)fn)(&p, bytes) : CUDA_ERROR_NOT_FOUND;
}

/* The whole start-up of a program through one library handle, every entry point by dlsym. */
static CUresult through(void *h, uint64_t bytes) {
    if (!h) return CUDA_ERROR_NOT_FOUND;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    void *alloc = dlsym(h, "cuMemAlloc_v2");
    if (!init || !retain || !setcur || !alloc) return CUDA_ERROR_NOT_FOUND;
    CUcontext c;
    CUresult r = init(0);
    if (!r) r = retain(&c, 0);
    if (!r) r = setcur(c);
    return r ? r : call_alloc(alloc, bytes);
}

/* The primary context of device `ord` made current. */
static CUresult use_device(int ord) {
    CUcontext c;
    CUresult r = cuDevicePrimaryCtxRetain(&c, ord);
    return r ? r : cuCtxSetCurrent(c);
}

/* A stream made on device `ord`; device 0's context is current afterwards. */
static CUresult stream_on(int ord, CUstream *s) {
    CUresult r = use_device(ord);
    if (!r) r = cuStreamCreate(s, 0);
    return r ? r : use_device(0);
}

static void *find_entry(const char *name, const char *door) {
    void *fn = NULL;
    if (!strcmp(door, "sym")) fn = dlsym(RTLD_DEFAULT, name);
    else if (!strcmp(door, "dlsym")) fn = dlsym(dlopen("libcuda.so.1", RTLD_NOW), name);
    else if (cuGetProcAddress_v2(name, &fn, 13000, 0, NULL) != CUDA_SUCCESS) fn = NULL;
    return fn;
}

static CUresult legacy_launch(const char *entry, const char *door) {
    const char *name = !strcmp(entry, "multi") ? "cuLaunchCooperativeKernelMultiDevice" : entry;
    void *fn = find_entry(name, door);
    CUstream s[2] = {NULL, NULL};
    CUresult r = CUDA_SUCCESS;
    if (!strcmp(entry, "cuLaunchGridAsync") || !strcmp(entry, "multi")) r = stream_on(0, &s[0]);
    if (!r && !strcmp(entry, "multi")) r = stream_on(1, &s[1]);
    if (r || !fn) return r ? r : CUDA_ERROR_NOT_FOUND;
    if (!strcmp(entry, "cuLaunch")) return ((CUresult(*)(CUfunction))fn)(NULL);
    if (!strcmp(entry, "cuLaunchGrid")) return ((CUresult(*)(CUfunction, int, int))fn)(NULL, 1, 1);
    if (!strcmp(entry, "cuLaunchGridAsync")) return ((CUresult(*)(CUfunction, int, int, CUstream))fn)(NULL, 1, 1, s[0]);
    CUDA_LAUNCH_PARAMS l[2];
    memset(l, 0, sizeof l);
    for (int k = 0; k < 2; k++) {
        l[k].gridDimX = l[k].gridDimY = l[k].gridDimZ = l[k].blockDimX = l[k].blockDimY = l[k].blockDimZ = 1;
        l[k].hStream = s[k];
    }
    return ((CUresult(*)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned))fn)(l, 2, 0);
}

typedef void *(*dlopen_t)(const char *, int);

static void *open_deep(const char *door, const char *path) {
    int mode = RTLD_NOW | RTLD_DEEPBIND;
    if (!strcmp(door, "dlopen")) return dlopen(path, mode);
    if (!strcmp(door, "dlmopen")) return dlmopen(LM_ID_BASE, path, mode);
    dlopen_t open = !strcmp(door, "next") ? (dlopen_t)dlsym(RTLD_DEFAULT, "next_dlopen")
                                          : (dlopen_t)dlvsym(RTLD_DEFAULT, "dlopen", door);
    return open ? open(path, mode) : NULL;
}

static void outlive(void) {
    OUT("held 0");
    for (;;) pause();
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        CUresult r = CUDA_SUCCESS;
        if (!strcmp(op, "init")) {
            CUcontext c;
            r = cuInit(0);
            if (!r) r = cuDevicePrimaryCtxRetain(&c, 0);
            if (!r) r = cuCtxSetCurrent(c);
            OUT("init %d", r);
        } else if (!strcmp(op, "alloc")) {
            OUT("alloc %d", call_alloc((void *)cuMemAlloc_v2, tu_size(ARG(1)))); i++;
        } else if (!strcmp(op, "libc_dlsym") || !strcmp(op, "libc_dlvsym")) {
            void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
            void *fn = NULL;
            if (!strcmp(op, "libc_dlsym")) {
                dlsym_t real = (dlsym_t)dlvsym(RTLD_DEFAULT, "dlsym", ARG(1));
                fn = real && cuda ? real(cuda, "cuMemAlloc_v2") : NULL;
            } else {
                dlvsym_t real = (dlvsym_t)dlvsym(RTLD_DEFAULT, "dlvsym", ARG(1));
                fn = real && cuda ? real(cuda, "cuMemAlloc_v2", "FAKE_CUDA_1") : NULL;
            }
            OUT("%s %d", op, call_alloc(fn, tu_size(ARG(2)))); i += 2;
        } else if (!strcmp(op, "nslibc_dlsym")) {
            void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
            void *libc = dlmopen(LM_ID_NEWLM, "libc.so.6", RTLD_NOW);
            dlsym_t real = libc ? (dlsym_t)dlsym(libc, "dlsym") : NULL;
            void *fn = real && cuda ? real(cuda, "cuMemAlloc_v2") : NULL;
            OUT("nslibc_dlsym %d", call_alloc(fn, tu_size(ARG(1)))); i++;
        } else if (!strcmp(op, "copy")) {
            OUT("copy %d", through(dlopen(ARG(1), RTLD_NOW | RTLD_LOCAL), tu_size(ARG(2)))); i += 2;
        } else if (!strcmp(op, "ns")) {
            OUT("ns %d", through(dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW), tu_size(ARG(1)))); i++;
        } else if (!strcmp(op, "pool_on")) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = atoi(ARG(1));
            CUmemoryPool pool = NULL;
            CUdeviceptr p;
            r = cuMemPoolCreate(&pool, &props);
            if (!r) r = cuMemAllocFromPoolAsync(&p, tu_size(ARG(2)), pool, NULL);
            OUT("pool_on %d", r); i += 2;
        } else if (!strcmp(op, "legacy")) {
            OUT("legacy %d", legacy_launch(ARG(1), ARG(2))); i += 2;
        } else if (!strcmp(op, "async_on")) {
            CUstream s = NULL;
            CUdeviceptr p;
            r = stream_on(atoi(ARG(1)), &s);
            if (!r) r = cuMemAllocAsync(&p, tu_size(ARG(2)), s);
            OUT("async_on %d", r); i += 2;
        } else if (!strcmp(op, "deep")) {
            void *h = open_deep(ARG(1), ARG(2));
            CUresult (*fn)(size_t) = h ? (CUresult(*)(size_t))dlsym(h, "deep_alloc") : NULL;
            OUT("deep %d", fn ? fn(tu_size(ARG(3))) : CUDA_ERROR_NOT_FOUND); i += 3;
        } else if (!strcmp(op, "runpath")) {
            void *h = dlopen(ARG(1), RTLD_NOW);
            int (*rp_open)(int, int) = h ? (int (*)(int, int))dlsym(h, "rp_open") : NULL;
            int mode = RTLD_NOW | (!strcmp(ARG(3), "deep") ? RTLD_DEEPBIND : 0);
            OUT("runpath %d", rp_open ? rp_open(mode, !strcmp(ARG(2), "dlmopen")) : -2); i += 3;
        } else if (!strcmp(op, "open")) {
            OUT("open %d", dlopen(ARG(1), RTLD_NOW) != NULL); i++;
        } else if (!strcmp(op, "exit_hold")) {
            atexit(outlive);
            OUT("exit_hold 0");
        } else if (!strcmp(op, "exit")) {
            exit(0);
        } else if (!strcmp(op, "hold")) {
            OUT("hold 0");
            for (;;) pause();
        } else {
            OUT("unknown-op %s", op);
            return 2;
        }
    }
    return 0;
}
