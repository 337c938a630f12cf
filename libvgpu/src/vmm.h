/* vmm.h - what other hooks tell the VMM accounting (vmmhooks.c). */
#ifndef VGPU_VMM_H
#define VGPU_VMM_H

#include <stdint.h>

/* A sparse (mipmapped) array was destroyed: the VMM memory cuMemMapArrayAsync mapped into it is
 * no longer mapped there. */
void vgpu_vmm_array_gone(uint64_t array);

#endif
