/* owned.h - charges for contexts, modules and context limits, by handle (owned.c). */
#ifndef VGPU_OWNED_H
#define VGPU_OWNED_H

#include <stdint.h>

/* O_LIMIT: memory a cuCtxSetLimit made the driver reserve for context `ctx` (limithooks.c). */
enum { O_CTX = 1, O_MODULE = 2, O_LIBRARY = 3, O_LIMIT = 4 };
typedef struct owned {
    uint64_t handle;
    int kind, rdev;
    void *ctx; /* modules and libraries: the context they were loaded into */
    uint64_t bytes;
    struct owned *next;
    uint64_t base; /* O_LIMIT: the driver's bytes for the limit's value before the first set */
} owned_t;

void vgpu_owned_add(int kind, uint64_t handle, void *ctx, int rdev, uint64_t bytes);
void vgpu_owned_add_limit(uint64_t handle, void *ctx, int rdev, uint64_t bytes, uint64_t base);
owned_t *vgpu_owned_take(int kind, uint64_t handle); /* NULL when not charged */
void vgpu_owned_put(owned_t *o);                      /* back, when the real release failed */
void vgpu_owned_release(owned_t *o);                  /* gives the charge back and frees o */
/* Adds bytes to an existing record (module memory that materialised later); 1 when found. */
int vgpu_owned_grow(int kind, uint64_t handle, uint64_t bytes);
/* A context went away (destroyed, or the primary context released/reset): the driver freed
 * its modules, so their charges are given back. */
void vgpu_modules_drop_ctx(void *ctx);

#endif
