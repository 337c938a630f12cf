/*
 * card.h - the per-card shared region (card.c; layout in include/vgpu_card.h): tenants of one
 * card publish when they have work queued and charge their busy time by the fair clock.
 */
#ifndef VGPU_CARD_H_INTERNAL
#define VGPU_CARD_H_INTERNAL

#include <stdint.h>

/* Joins the card region of region device `rdev` (LIBVGPU_CARD_DIR/<UUID>.card), once per
 * process and device. Returns 0, or -1 when there is none (no directory configured, no file,
 * foreign layout): the limiter then works alone, as without a neighbour. */
int vgpu_card_attach(int rdev);
/* A slice of this process opened: returns the fair clock now. */
uint64_t vgpu_card_slice_open(int rdev);
/* The slice closed after `wall_busy` ns of queued work: returns the fair-clock time elapsed
 * since `v_open` (<= the wall time: this tenant's share of the card meanwhile); UINT64_MAX
 * without a card region (the whole wall time is then this tenant's). */
uint64_t vgpu_card_slice_close(int rdev, uint64_t v_open, uint64_t wall_busy);
/* Adds the busy time charged for a slice to this tenant's entry (for the node monitor). */
void vgpu_card_charge(int rdev, uint64_t fair_busy);
/* 1 when this tenant has priority 1 (low) and a priority-0 tenant has work on the card now. */
int vgpu_card_high_priority_active(int rdev);

#endif
