/* testutil.h - small helpers for the libvgpu test programs. */
#ifndef TESTUTIL_H
#define TESTUTIL_H
#include <stdint.h>
#include <stdlib.h>
/* "100", "4k", "3m", "1g" -> bytes (test-side parser, binary units). */
static inline uint64_t tu_size(const char *s) {
    char *end;
    uint64_t v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': return v << 10;
    case 'm': return v << 20;
    case 'g': return v << 30;
    default: return v;
    }
}
#endif
