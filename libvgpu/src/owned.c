/*
 * owned.c - what this process was charged for driver-owned memory: contexts made with
 * cuCtxCreate* (slots' context[]) and module images (module[]), keyed by handle, with the
 * context each module was loaded into, so destroying a context gives its modules back; and the
 * memory context limits (cuCtxSetLimit) made the driver reserve, given back with the context.
 */
#include <pthread.h>
#include <stdlib.h>
#include "forkreg.h"
#include "log.h"
#include "owned.h"
#include "region.h"


static owned_t *owned_list;
static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
/* Contexts and modules do not survive fork. */
static void owned_after_fork(void) {
    pthread_mutex_init(&list_mu, NULL);
    while (owned_list) { owned_t *n = owned_list->next; free(owned_list); owned_list = n; }
}
__attribute__((constructor)) static void owned_register_fork(void) { vgpu_on_fork_child(owned_after_fork); }

void vgpu_owned_add(int kind, uint64_t handle, void *ctx, int rdev, uint64_t bytes) {
    owned_t *o = malloc(sizeof *o);
    if (!o) return;
    *o = (owned_t){handle, kind, rdev, ctx, bytes, NULL, 0};
    pthread_mutex_lock(&list_mu);
    o->next = owned_list;
    owned_list = o;
    pthread_mutex_unlock(&list_mu);
}

void vgpu_owned_add_limit(uint64_t handle, void *ctx, int rdev, uint64_t bytes, uint64_t base) {
    owned_t *o = malloc(sizeof *o);
    if (!o) return;
    *o = (owned_t){handle, O_LIMIT, rdev, ctx, bytes, NULL, base};
    vgpu_owned_put(o);
}

owned_t *vgpu_owned_take(int kind, uint64_t handle) {
    pthread_mutex_lock(&list_mu);
    owned_t **pp = &owned_list, *o;
    while ((o = *pp) && !(o->kind == kind && o->handle == handle)) pp = &o->next;
    if (o) *pp = o->next;
    pthread_mutex_unlock(&list_mu);
    return o;
}

void vgpu_owned_put(owned_t *o) {
    pthread_mutex_lock(&list_mu);
    o->next = owned_list;
    owned_list = o;
    pthread_mutex_unlock(&list_mu);
}

void vgpu_owned_release(owned_t *o) {
    if (o->kind == O_CTX) vgpu_uncharge_context(o->rdev, o->bytes);
    else if (o->kind == O_LIMIT) vgpu_unreserve(o->rdev, o->bytes);
    else vgpu_unreserve_module(o->rdev, o->bytes);
    VLOG(VLOG_DEBUG, "released %llu bytes of %s %#llx", (unsigned long long)o->bytes,
         o->kind == O_CTX ? "context" : o->kind == O_LIMIT ? "context limit" : "module", (unsigned long long)o->handle);
    free(o);
}

void vgpu_modules_drop_ctx(void *ctx) {
    if (!ctx) return;
    owned_t *gone = NULL;
    pthread_mutex_lock(&list_mu);
    for (owned_t **pp = &owned_list, *o; (o = *pp);) {
        if (o->kind != O_CTX && o->ctx == ctx) {
            *pp = o->next;
            o->next = gone;
            gone = o;
        } else {
            pp = &o->next;
        }
    }
    pthread_mutex_unlock(&list_mu);
    while (gone) { owned_t *n = gone->next; vgpu_owned_release(gone); gone = n; }
}

/* Adds `bytes` to the module record of `handle` (lazily loaded kernels materialising later). */
int vgpu_owned_grow(int kind, uint64_t handle, uint64_t bytes) {
    int found = 0;
    pthread_mutex_lock(&list_mu);
    for (owned_t *o = owned_list; o; o = o->next)
        if (o->kind == kind && o->handle == handle) { o->bytes += bytes; found = 1; break; }
    pthread_mutex_unlock(&list_mu);
    return found;
}
