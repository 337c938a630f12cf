/*
 * t_cardmodel.c - the per-card fair clock (src/card.c) driven by a scripted clock, so a charge can
 * be checked exactly, with no timing of the machine that runs the test.
 *
 * Why compiled in, not preloaded: what is checked is the clock's arithmetic over a time-sliced
 * card's pattern (how long each tenant's work stays queued), which the fake driver's processor
 * sharing cannot produce: on a real card a tiny kernel queued beside a busy neighbour waits for
 * the neighbour's time slice. Two tenants live in this one process as two region devices that map
 * the same card file under two tenant keys; time moves only when the script moves it.
 *
 * Usage: t_cardmodel <card dir> sparse|heavy|garbage
 *   sparse:  A queued 250 ms, idle 250 ms (a 50 % tenant), for 4 s; B launches a tiny kernel every
 *            50 ms: 0.1 ms queued when A is idle, 17 ms (A's time slice, then the kernel) when A
 *            has work.
 *   heavy:   the same A; B back to back steps of 6.6 ms alone, 13.2 ms beside A.
 *   garbage: A queued 250 ms while the card's given_ns is written forward by 10 s.
 * Prints "A fair <ns> wall <ns>" and "B fair <ns> wall <ns>" (what vgpu_card_take returned).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../src/util.h"

static uint64_t fake_now = 1000000000000ull;
static uint64_t test_now(void) { return fake_now; }
#define vgpu_now_ns() test_now()

#include "../src/card.c"

vgpu_region_t *vgpu_region;
static uint64_t cur_key;
uint64_t vgpu_region_key(void) { return cur_key; }
const char *vgpu_getenv(const char *name) { return getenv(name); }
int vgpu_task_priority(void) { return 1; }
int vgpu_log_level = 0;
void vgpu_log(int level, const char *fmt, ...) {}
void vgpu_on_fork_child(void (*fn)(void)) {}

#define MS 1000000ull
#define US 1000ull

static uint64_t fair_sum[2], wall_sum[2];

static void take(int who) {
    uint64_t f, w;
    if (vgpu_card_take(who, &f, &w) != 0) { fprintf(stderr, "take failed\n"); exit(2); }
    fair_sum[who] += f;
    wall_sum[who] += w;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: t_cardmodel <card dir> sparse|heavy|garbage\n"); return 2; }
    setenv("LIBVGPU_CARD_DIR", argv[1], 1);
    vgpu_region = calloc(1, sizeof *vgpu_region);
    for (int i = 0; i < 2; i++) {
        strcpy(vgpu_region->devices[i].uuid, "GPU-model");
        vgpu_region->devices[i].sm_limit = 50;
        cur_key = 100 + i;
        if (vgpu_card_attach(i) != 0) { fprintf(stderr, "attach %d failed\n", i); return 2; }
    }
    const char *mode = argv[2];
    uint64_t t0 = fake_now, tick = 10 * US;
    int a_on = 0, b_on = 0;
    uint64_t b_next = t0, b_end = 0;
    if (!strcmp(mode, "garbage")) {
        vgpu_card_queued(0, 1);
        fake_now += 100 * MS;
        atomic_fetch_add(&refs[0].r->given_ns, 10000 * MS);
        fake_now += 150 * MS;
        vgpu_card_queued(0, 0);
        take(0);
    } else {
        int heavy = !strcmp(mode, "heavy");
        for (; fake_now < t0 + 4000 * MS; fake_now += tick) {
            int a_want = (fake_now - t0) % (500 * MS) < 250 * MS;
            if (a_want && !a_on) vgpu_card_queued(0, 1);
            if (!a_want && a_on) {
                vgpu_card_queued(0, 0);
                take(0);
            }
            a_on = a_want;
            if (b_on && fake_now >= b_end) {
                vgpu_card_queued(1, 0);
                b_on = 0;
                b_next = fake_now + (heavy ? 50 * US : 50 * MS);
            }
            if (!b_on && fake_now >= b_next) {
                vgpu_card_queued(1, 1);
                b_on = 1;
                b_end = fake_now + (heavy ? (a_on ? 13200 * US : 6600 * US) : (a_on ? 17 * MS : 100 * US));
            }
        }
        take(1);
    }
    printf("A fair %llu wall %llu\n", (unsigned long long)fair_sum[0], (unsigned long long)wall_sum[0]);
    printf("B fair %llu wall %llu\n", (unsigned long long)fair_sum[1], (unsigned long long)wall_sum[1]);
    return 0;
}
