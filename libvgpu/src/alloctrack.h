/* alloctrack.h - per-process allocation table (alloctrack.c). */
#ifndef VGPU_ALLOCTRACK_H
#define VGPU_ALLOCTRACK_H

#include <stdint.h>

/* Kinds of handle: the same number may be a pointer and an array handle. */
enum { K_PTR = 1, K_ARRAY = 2, K_MIPMAP = 3, K_VMM = 4, K_EXTMEM = 5, K_IPC = 6 };
typedef struct track {
    uint64_t key;
    int kind, rdev;
    uint64_t bytes;
    struct track *next;
    int pool; /* pools.c index for stream-ordered allocations charged through their pool, else -1 */
} track_t;

void vgpu_track_add(int kind, uint64_t key, int rdev, uint64_t bytes);
void vgpu_track_add_pool(int kind, uint64_t key, int rdev, uint64_t bytes, int pool);
/* Removes and returns the entry (the caller frees it with free()), or NULL. */
track_t *vgpu_track_take(int kind, uint64_t key);
/* 1 and the entry's device and bytes when (kind, key) is tracked and charged by itself (not through
 * a pool); 0 otherwise. */
int vgpu_track_peek(int kind, uint64_t key, int *rdev, uint64_t *bytes);
/* Puts an entry back when the real free failed (the memory is still held). */
void vgpu_track_put(track_t *t);

#endif
