/*
 * vgpu_bool.h - the boolean reading shared with the Python components (hami/booleans.py).
 *
 * true:  1 t true y yes on          false: 0 f false n no off ""        (any letter case)
 * anything else, white space included, is invalid. The rows live in vgpu_bool_table.txt beside
 * this header; tests check this function and the Python one against that file, so the scheduler
 * extender, the device plugin and libvgpu read CUDA_DISABLE_CONTROL and friends alike.
 */
#ifndef VGPU_BOOL_H
#define VGPU_BOOL_H

#include <strings.h>

/* 1 true, 0 false, -1 invalid (the caller chooses the safe reading and logs it). NULL is invalid. */
static inline int vgpu_bool_parse(const char *v) {
    static const char *const yes[] = {"1", "t", "true", "y", "yes", "on"};
    static const char *const no[] = {"0", "f", "false", "n", "no", "off", ""};
    if (!v) return -1;
    for (unsigned i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (!strcasecmp(v, yes[i])) return 1;
    for (unsigned i = 0; i < sizeof no / sizeof no[0]; i++)
        if (!strcasecmp(v, no[i])) return 0;
    return -1;
}

#endif
