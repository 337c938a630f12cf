/* devmap.h - CUDA ordinals to region devices (devmap.c). */
#ifndef VGPU_DEVMAP_H
#define VGPU_DEVMAP_H

#include <cuda.h>

/* CUDA ordinals tracked per process (contexts, pools, the ordinal map). */
#define MAX_ORD 64

/* Region device index of CUDA ordinal `cudev`, registering it on first use; -1 on failure. */
int vgpu_rdev_of_cuda(int cudev);
/* Region device of the calling thread's current context; -1 without one. */
int vgpu_current_rdev(void);
/* The context of `stream` when it is an explicit stream of a context other than the calling
 * thread's current one (a stream made on another card), else NULL: the NULL, legacy and
 * per-thread streams run in the current context, and so is taken a stream the driver cannot
 * place. `*cur` gets the current context. */
CUcontext vgpu_stream_other_ctx(void *stream, CUcontext *cur);
/* CUDA ordinal of the device `stream`'s work runs on (its context's device); -1 without one. */
int vgpu_stream_cudev(void *stream);

#endif
