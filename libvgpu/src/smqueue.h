/* smqueue.h - when this process has work queued on a device (smqueue.c), for the compute
 * limiter (smlimit.c) and the per-card fair clock (card.c). */
#ifndef VGPU_SMQUEUE_H
#define VGPU_SMQUEUE_H

#include <stdint.h>

/* When the application last launched (any device), CLOCK_MONOTONIC ns. */
extern _Atomic uint64_t vgpu_last_launch_ns;
/* When this process's work was last known drained (a synchronisation that covered all of it,
 * the limiter's drain, or the idle watcher), ns. */
extern _Atomic uint64_t vgpu_last_drain_ns;

/* A launch on `stream` of device `rdev` is about to be issued (call after vgpu_last_launch_ns
 * was set): marks the device queued and notes the stream. `per_thread` for _ptsz entry points. */
void vgpu_q_launch(int rdev, void *stream, int per_thread);
/* Kinds of synchronisation that returned. */
enum { VGPU_SYNC_CTX, VGPU_SYNC_STREAM, VGPU_SYNC_EVENT };
/* A synchronisation of `kind` (on `stream` for VGPU_SYNC_STREAM, `per_thread` for _ptsz) returned
 * successfully; `ll` is vgpu_last_launch_ns read before it was called. Returns 1 when it drained
 * all of this process's work on the current device (no launch raced it, and for a stream or
 * event only when that stream is the only one with work). */
int vgpu_q_synced(int kind, void *stream, int per_thread, uint64_t ll);
/* The context of `rdev` was drained by the limiter (cuCtxSynchronize) with `ll` read before. */
void vgpu_q_drained(int rdev, uint64_t ll);
/* 1 while `rdev` has work queued (as far as this process knows). */
int vgpu_q_busy(int rdev);
/* A stream is about to be destroyed: the watcher stops asking about it. */
void vgpu_q_forget_stream(void *stream);
/* At exit: stops the watcher's work (no more card updates). */
void vgpu_q_exit(void);

#endif
