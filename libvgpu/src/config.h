/*
 * config.h - the limits contract between the device plugin and libvgpu (config.c).
 *
 * Where the device plugin's read-only config file exists (vgpu.config beside the libvgpu.so that
 * /etc/ld.so.preload names), it is the authority for every control variable it may carry: limits,
 * the control switch, the region path, the priority. The environment is the tenant's and may only
 * lower this process's memory limit. Where no file exists, the environment is read as HAMi-core
 * reads it. File format and rules: docs/libvgpu.md.
 */
#ifndef VGPU_CONFIG_H
#define VGPU_CONFIG_H

#include <stddef.h>
#include <stdint.h>

/* Where the file's contents stand (read once per process). */
enum { VGPU_CONFIG_NONE = 0, VGPU_CONFIG_OK = 1, VGPU_CONFIG_BROKEN = 2 };
int vgpu_config_state(void);
const char *vgpu_config_path(void);
/* The container index (`<i>` of CUDA_DEVICE_MEMORY_LIMIT_<i>) the config file gives card `uuid`
 * (LIBVGPU_DEVICE_UUID_<i>); -1 when the file lists cards but not this one, -2 when it lists none
 * (an older device plugin) or there is no valid file. */
int vgpu_config_index_of_uuid(const char *uuid); /* "" when the library's own path is unknown */

/* The value of control variable `name`: the config file's where it exists and may carry `name`
 * (NULL when it is silent or broken; a different environment value is logged once), else the
 * environment's. */
const char *vgpu_getenv(const char *name);
/* 1 when the file (where it exists; always when broken) or else the environment sets a variable
 * whose name starts with `prefix`. */
int vgpu_config_has_prefix(const char *prefix);
/* Test hook and file parser (also used by the fuzz test): parses `text` as a config file.
 * Returns 0 and fills the table, or -1 with a reason in `why` (the table is then empty). */
int vgpu_config_parse(const char *text, size_t len, char *why, size_t whylen);

/* Parses a memory size: digits with an optional binary suffix k/m/g/t or Ki/Mi/Gi/Ti.
 * Returns 0 and the byte count in *out, or -1 when malformed or overflowing. */
int vgpu_parse_size(const char *s, uint64_t *out);
/* Parses an SM percentage 0..100 (decimal). Returns 0 or -1. */
int vgpu_parse_percent(const char *s, uint32_t *out);
/* Byte limit for the container device index `phys`: VGPU_UNLIMITED, or the limit;
 * a malformed value (or a broken config file) yields 0 (fail closed) and one error line. */
uint64_t vgpu_mem_limit_for(int phys);
/* This process's own ceiling for `phys`, bytes: where the file exists, its limit, lowered by the
 * environment's CUDA_DEVICE_MEMORY_LIMIT(_<i>) when that is smaller (a larger one is logged and
 * ignored); VGPU_UNLIMITED where no file exists (the region's limit applies, as in HAMi-core). */
uint64_t vgpu_mem_cap_for(int phys);
/* SM percent for `phys`: 100 = no limit. Malformed (or broken file) -> 1 (fail closed). */
uint32_t vgpu_sm_limit_for(int phys);
/* CUDA_DISABLE_CONTROL (vgpu_bool.h's table): 1 when enforcement is off. */
int vgpu_control_disabled(void);
enum { SM_POLICY_DEFAULT = 0, SM_POLICY_FORCE = 1, SM_POLICY_DISABLE = 2 };
int vgpu_sm_policy(void);
int vgpu_sm_idle_mode(void);
/* CUDA_TASK_PRIORITY: 0 high, 1 low (default). */
int vgpu_task_priority(void);

#endif
