/* devmap.h - CUDA ordinals to region devices (devmap.c). */
#ifndef VGPU_DEVMAP_H
#define VGPU_DEVMAP_H

/* CUDA ordinals tracked per process (contexts, pools, the ordinal map). */
#define MAX_ORD 64

/* Region device index of CUDA ordinal `cudev`, registering it on first use; -1 on failure. */
int vgpu_rdev_of_cuda(int cudev);
/* Region device of the calling thread's current context; -1 without one. */
int vgpu_current_rdev(void);

#endif
