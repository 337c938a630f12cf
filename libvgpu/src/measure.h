/* measure.h - driver-internal memory measured across a driver call (measure.c). */
#ifndef VGPU_MEASURE_H
#define VGPU_MEASURE_H

#include <stdint.h>

/* Context memory measured around a driver call that creates a context (NVML): begin before
 * the call, end after it; end returns the bytes to charge (0 when it cannot tell). */
typedef struct { void *h; int self_ok, dev_ok; uint64_t self0, dev0, mine0, cont0; } vgpu_measure_t;
void vgpu_ctx_measure_begin(int rdev, vgpu_measure_t *m);
uint64_t vgpu_ctx_measure_end(int rdev, vgpu_measure_t *m);
/* (after - before) - (acct_after - acct_before), signed, clamped at 0: physical growth across a
 * driver call less what we accounted meanwhile. */
uint64_t vgpu_growth(uint64_t before, uint64_t after, uint64_t acct_before, uint64_t acct_after);
/* Device bytes in use as the current context's device reports them (cuMemGetInfo); 0 ok, -1. */
int vgpu_device_used(uint64_t *used);
/* One measured driver call (context creation, module load) at a time per process. */
void vgpu_measure_lock(void);
void vgpu_measure_unlock(void);

#endif
