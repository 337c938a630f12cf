/* Start-up probe for libvgpu_limits.py: waits for a go file, then runs cuInit, the primary
 * context and one 1 MiB allocation; prints one JSON line: when this process saw the go file
 * (`seen`) and when the allocation was done (`t1`), CLOCK_MONOTONIC seconds.
 * Build: cc -O2 libvgpu_start_probe.c -I$CUDA_HOME/include -L$CUDA_HOME/lib64/stubs -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    struct stat st;
    while (argc > 1 && stat(argv[1], &st) != 0) usleep(200);
    double t0 = now_s();
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    CUresult r = cuInit(0);
    if (!r) r = cuDeviceGet(&d, 0);
    if (!r) r = cuDevicePrimaryCtxRetain(&c, d);
    if (!r) r = cuCtxSetCurrent(c);
    if (!r) r = cuMemAlloc(&p, 1 << 20);
    double t1 = now_s();
    printf("{\"bench\":\"start\",\"rc\":%d,\"seen\":%.6f,\"t1\":%.6f}\n", (int)r, t0, t1);
    return r != CUDA_SUCCESS;
}
