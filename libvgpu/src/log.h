/* log.h - stderr logging gated by LIBCUDA_LOG_LEVEL (log.c). */
#ifndef VGPU_LOG_H
#define VGPU_LOG_H

#include "util.h"

enum { VLOG_ERROR = 1, VLOG_WARN = 2, VLOG_INFO = 3, VLOG_DEBUG = 4 };
extern int vgpu_log_level;
void vgpu_log_init(void);
void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define VLOG(lvl, ...) do { if (VGPU_UNLIKELY(vgpu_log_level >= (lvl))) vgpu_log((lvl), __VA_ARGS__); } while (0)

#endif
