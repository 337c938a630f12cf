/*
 * lib_nextopen.c - libnextopen.so: a tenant's second preloaded library (after libvgpu, before the C
 * library in the link map), whose dlsym(RTLD_NEXT, "dlopen") finds the C library's dlopen.
 */
#include <dlfcn.h>
#include <stddef.h>

void *next_dlopen(const char *file, int mode) {
    void *(*next)(const char *, int) = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
    return next ? next(file, mode) : NULL;
}
