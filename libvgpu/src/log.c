/*
 * log.c - stderr logging gated by LIBCUDA_LOG_LEVEL (HAMi-core's variable).
 * Levels: 0 silent, 1 errors, 2 + warnings (default), 3 + info, 4 + debug.
 * One write(2) per line so lines from concurrent processes do not interleave.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "log.h"

int vgpu_log_level = VLOG_WARN;

void vgpu_log_init(void) {
    const char *s = getenv("LIBCUDA_LOG_LEVEL");
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 9) vgpu_log_level = (int)v;
    }
}

void vgpu_log(int level, const char *fmt, ...) {
    static const char *names[] = {"", "ERROR", "WARN", "INFO", "DEBUG"};
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "[libvgpu %d] %s: ", (int)getpid(), names[level < 5 ? level : 4]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof buf) n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf - 1) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}
