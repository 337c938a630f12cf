/*
 * forkreg.h - the one fork-handler registry (forkreg.c).
 *
 * Why one registry: a forked child is a new process (own slot, no CUDA context, none of the
 * parent's allocations), so several modules must reset their state in the child. Each module
 * registers its own reset here; nothing calls into another module's reset, which keeps the
 * call graph among the sources free of cycles.
 */
#ifndef VGPU_FORKREG_H
#define VGPU_FORKREG_H

/* Runs `fn` in the child after every fork(), in registration order. Up to 16 handlers;
 * call from a constructor (registration is not thread-safe against a concurrent fork). */
void vgpu_on_fork_child(void (*fn)(void));

#endif
