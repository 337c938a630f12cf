/* smqueue.h - when this process has work queued on a device (smqueue.c), for the compute
 * limiter (smlimit.c) and the per-card fair clock (card.c). */
#ifndef VGPU_SMQUEUE_H
#define VGPU_SMQUEUE_H

#include <stdatomic.h>
#include <stdint.h>

/* When the application last launched (any device), CLOCK_MONOTONIC ns. */
extern _Atomic uint64_t vgpu_last_launch_ns;
/* Launches that entered the limiter, and that came back from the driver: while the two differ
 * a launch is in flight (marked queued but maybe not yet in the driver's queue), so no query or
 * synchronisation can show its work drained. */
extern _Atomic uint32_t vgpu_launches_started, vgpu_launches_done;
/* A snapshot of both counters, taken before a synchronisation or query; `self` leaves out one
 * launch of the calling thread in flight (the limiter's own drain, inside a launch). */
static inline uint64_t vgpu_launch_token(int self) {
    uint32_t s = atomic_load(&vgpu_launches_started) - (self ? 1u : 0u);
    uint32_t d = atomic_load(&vgpu_launches_done);
    return (uint64_t)s << 32 | d;
}
/* When this process's work was last known drained (a synchronisation that covered all of it,
 * the limiter's drain, or the idle watcher), ns. */
extern _Atomic uint64_t vgpu_last_drain_ns;

/* A launch on `stream` of device `rdev` is about to be issued (call after vgpu_last_launch_ns
 * was set): marks the device queued and notes the stream. `per_thread` for _ptsz entry points. */
void vgpu_q_launch(int rdev, void *stream, int per_thread);
/* Kinds of synchronisation that returned. */
enum { VGPU_SYNC_CTX, VGPU_SYNC_STREAM, VGPU_SYNC_EVENT };
/* A synchronisation of `kind` (on `stream` for VGPU_SYNC_STREAM, `per_thread` for _ptsz) returned
 * successfully; `tok` is vgpu_launch_token(0) taken before it was called. Returns 1 when it
 * drained all of this process's work on the current device (no launch in flight or raced it,
 * and for a stream or event only when that stream is the only one with work). */
int vgpu_q_synced(int kind, void *stream, int per_thread, uint64_t tok);
/* The context of `rdev` was drained by the limiter (cuCtxSynchronize) with `tok` taken before. */
void vgpu_q_drained(int rdev, uint64_t tok);
/* 1 while `rdev` has work queued (as far as this process knows). */
int vgpu_q_busy(int rdev);
/* A stream is about to be destroyed: the watcher stops asking about it. */
void vgpu_q_forget_stream(void *stream);
/* At exit: stops the watcher's work (no more card updates). */
void vgpu_q_exit(void);

#endif
