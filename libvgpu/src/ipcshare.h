/*
 * ipcshare.h - allocations shared by legacy IPC inside one container, charged once (ipcshare.c).
 * `key` is the 64 bytes of a CUipcMemHandle.
 */
#ifndef VGPU_IPCSHARE_H
#define VGPU_IPCSHARE_H

#include <stdint.h>

/* Exporter: the allocation at `base`, which this process is charged `bytes` for on region device
 * `rdev`, was exported as `key`; importers of this container join it instead of paying again. */
void vgpu_share_export(const void *key, int rdev, uint64_t bytes, uint64_t base);
/* Exporter: the allocation at `base` was freed. 1: give its charge back as usual (never exported,
 * the charge moved to a process still holding it, or nobody else holds it); 0: keep it (the table
 * is unusable, so an importer may still hold it uncharged: fail closed). */
int vgpu_share_freed(uint64_t base);
/* Importer: 1 when `key` names an allocation of this container that another live process holds;
 * this process joined its holders as `ptr` and is charged nothing. 0: charge it as a foreign import. */
int vgpu_share_join(const void *key, uint64_t ptr);
/* Importer: `ptr` (joined) was closed. Returns the bytes it must give back on *rdev: the charge it
 * carried (the allocation's charge comes to a holder when its charger lets go), 0 when none. */
uint64_t vgpu_share_leave(uint64_t ptr, int *rdev);

#endif
