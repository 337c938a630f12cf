/*
 * lib_runpath.c - librunpath.so, linked with RUNPATH $ORIGIN/sub: it dlopen()s librpdep.so by bare
 * name, which only that RUNPATH finds. glibc searches the RUNPATH of the object that called dlopen,
 * found from dlopen's return address: a wrapper that calls instead of jumping makes itself the caller.
 */
#include <dlfcn.h>
#include <stddef.h>

/* rp_dep_value() of librpdep.so loaded with dlopen, or dlmopen(LM_ID_BASE) when `base` is set; -1
 * when it is not found. */
int rp_open(int mode, int base) {
    void *h = base ? dlmopen(LM_ID_BASE, "librpdep.so", mode) : dlopen("librpdep.so", mode);
    int (*value)(void) = h ? (int (*)(void))dlsym(h, "rp_dep_value") : NULL;
    return value ? value() : -1;
}
