/*
 * card.h - the per-card shared region (card.c; layout in include/vgpu_card.h): tenants of one
 * card publish when they have work queued and charge their busy time by the fair clock.
 */
#ifndef VGPU_CARD_H_INTERNAL
#define VGPU_CARD_H_INTERNAL

#include <stdint.h>

/* Joins the card region of region device `rdev` (LIBVGPU_CARD_DIR/<UUID>.card), once per
 * process and device. Returns 0, or -1 when there is none (no directory configured, no file,
 * foreign layout, a lock that stays held): the limiter then works alone, as without a neighbour. */
int vgpu_card_attach(int rdev);
/* This process now has work queued on `rdev` (on = 1) or none (on = 0). Idempotent per state. */
void vgpu_card_queued(int rdev, int on);
/* The fair-clock time (`fair`, ns, <= `wall`) and the wall time this process had work queued
 * since the last take; returns -1 (both 0) without a usable region. */
int vgpu_card_take(int rdev, uint64_t *fair, uint64_t *wall);
/* Keeps this tenant's entry fresh while work stays queued (no lock). */
void vgpu_card_touch(int rdev);
/* 1 when this tenant has priority 1 (low) and a priority-0 tenant has work on the card now. */
int vgpu_card_high_priority_active(int rdev);
/* At exit: this process has no work queued any more. */
void vgpu_card_exit(void);

#endif
