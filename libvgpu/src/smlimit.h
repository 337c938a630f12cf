/* smlimit.h - the compute-share limiter (smlimit.c), called by launchhooks.c. */
#ifndef VGPU_SMLIMIT_H
#define VGPU_SMLIMIT_H

#include "util.h"

enum { SM_UNKNOWN = 0, SM_NONE = 1, SM_ACTIVE = 2 };
/* SM_UNKNOWN until the first launch decides; read on every launch (one load). */
extern int vgpu_sm_state;
/* Paces a launch on `stream` (may sleep until the device's pause ends); `per_thread` for the
 * _ptsz entry points (a NULL stream is then the calling thread's own default stream). */
void vgpu_sm_before_launch(void *stream, int per_thread);
/* A synchronisation of kind VGPU_SYNC_* (smqueue.h) returned successfully; `tok` is
 * vgpu_launch_token(0) taken before it was called (only called while the limiter is active). */
void vgpu_sm_synced(int kind, void *stream, int per_thread, uint64_t tok);

#endif
