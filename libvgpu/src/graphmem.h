/* graphmem.h - graph memory nodes checked before the driver allocates them (graphmem.c). */
#ifndef VGPU_GRAPHMEM_H
#define VGPU_GRAPHMEM_H

#include <cuda.h>
#include <stdint.h>

/* CUDA ordinals whose graph memory is checked before a launch. */
#define GRAPHMEM_DEVS 16

/* Bytes of the memory-allocation nodes of `g` (child graphs included) per CUDA ordinal, into
 * bytes[GRAPHMEM_DEVS]; 1 when there are any. */
int vgpu_graph_footprint(CUgraph g, uint64_t *bytes);
/* 0 when a launch needing `bytes` fits beside what the container holds (the graph pool's spare
 * reservation counted), -1 (logged as out of memory for `api`) when not. */
int vgpu_graph_fits(const uint64_t *bytes, const char *api);
void vgpu_graph_exec_add(uint64_t exec, const uint64_t *bytes);
void vgpu_graph_exec_remove(uint64_t exec);
/* Around cuGraphUpload / cuGraphLaunch of `exec`: begin reserves what the pool may grow by into
 * pre[GRAPHMEM_DEVS]: 1 (then call end after the driver, whatever it answered: it releases the
 * reservation and samples the pool), 0 (an instantiation without allocation nodes: nothing to do,
 * pre untouched), or -1 (refuse with CUDA_ERROR_OUT_OF_MEMORY, nothing reserved). */
int vgpu_graph_begin(uint64_t exec, uint64_t *pre, const char *api);
void vgpu_graph_end(const uint64_t *pre);

#endif
