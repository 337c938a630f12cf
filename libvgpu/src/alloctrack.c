/*
 * alloctrack.c - the per-process table of what each allocation charged (alloctrack.h): a hash
 * of (kind, handle) -> (region device, bytes, pool). Frees remove the entry before the real
 * free, so an address the driver hands out again at once is never confused with the freed one.
 */
#include <pthread.h>
#include <stdlib.h>
#include "alloctrack.h"
#include "forkreg.h"

#define NBUCKET 4096
static track_t *buckets[NBUCKET];
static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket_of(uint64_t key, int kind) {
    uint64_t h = (key ^ (uint64_t)kind) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 52) & (NBUCKET - 1);
}

void vgpu_track_add_pool(int kind, uint64_t key, int rdev, uint64_t bytes, int pool) {
    track_t *t = malloc(sizeof *t);
    if (!t) return;
    *t = (track_t){key, kind, rdev, bytes, NULL, pool};
    unsigned b = bucket_of(key, kind);
    pthread_mutex_lock(&track_mu);
    t->next = buckets[b];
    buckets[b] = t;
    pthread_mutex_unlock(&track_mu);
}

track_t *vgpu_track_take(int kind, uint64_t key) {
    unsigned b = bucket_of(key, kind);
    pthread_mutex_lock(&track_mu);
    track_t **pp = &buckets[b], *t;
    while ((t = *pp) && !(t->key == key && t->kind == kind)) pp = &t->next;
    if (t) *pp = t->next;
    pthread_mutex_unlock(&track_mu);
    return t;
}

int vgpu_track_peek(int kind, uint64_t key, int *rdev, uint64_t *bytes) {
    unsigned b = bucket_of(key, kind);
    int found = 0;
    pthread_mutex_lock(&track_mu);
    for (track_t *t = buckets[b]; t; t = t->next)
        if (t->key == key && t->kind == kind && t->pool < 0) {
            *rdev = t->rdev;
            *bytes = t->bytes;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&track_mu);
    return found;
}

void vgpu_track_add(int kind, uint64_t key, int rdev, uint64_t bytes) { vgpu_track_add_pool(kind, key, rdev, bytes, -1); }

/* Put an entry back when the real free failed (the memory is still held). */
void vgpu_track_put(track_t *t) {
    unsigned b = bucket_of(t->key, t->kind);
    pthread_mutex_lock(&track_mu);
    t->next = buckets[b];
    buckets[b] = t;
    pthread_mutex_unlock(&track_mu);
}

/* CUDA allocations do not survive fork: the child starts with an empty table. */
static void track_after_fork(void) {
    pthread_mutex_init(&track_mu, NULL);
    for (int i = 0; i < NBUCKET; i++) {
        track_t *t = buckets[i];
        while (t) { track_t *n = t->next; free(t); t = n; }
        buckets[i] = NULL;
    }
}
__attribute__((constructor)) static void track_register_fork(void) { vgpu_on_fork_child(track_after_fork); }
