/*
 * lib_deep.c - libdeep.so for tests/libvgpu/test_tenant_doors.py: a tenant's library linked against
 * libcuda.so.1 that a program loads with RTLD_DEEPBIND, so that, were the flag kept, its calls would
 * bind to the driver's definitions before the preloaded ones.
 */
#include <cuda.h>

/* cuInit, device 0's primary context made current (for a caller that has none: Python's ctypes). */
CUresult deep_init(void) {
    CUcontext c;
    CUresult r = cuInit(0);
    if (!r) r = cuDevicePrimaryCtxRetain(&c, 0);
    return r ? r : cuCtxSetCurrent(c);
}

CUresult deep_alloc(size_t bytes) {
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, bytes);
}
