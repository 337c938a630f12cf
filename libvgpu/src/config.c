/*
 * config.c - the environment contract between the device plugin and libvgpu.
 *
 * Why strict parsing: HAMi-core's strtoul-based parser turned "1Gi" into 1 byte and
 * "0800m"/"" into "unlimited" (hami-core-spec §5). A limit that silently disappears is
 * worse than a job that fails, so every value we cannot read exactly fails closed
 * (memory limit 0 bytes, SM share 1 %) with one error line naming the variable.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "common.h"
#include "vgpu_bool.h"

int vgpu_parse_size(const char *s, uint64_t *out) {
    if (!s) return -1;
    while (*s == ' ' || *s == '\t') s++;
    if (!isdigit((unsigned char)*s)) return -1;
    uint64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
        s++;
    }
    unsigned shift = 0;
    switch (*s) {
    case 'k': case 'K': shift = 10; s++; break;
    case 'm': case 'M': shift = 20; s++; break;
    case 'g': case 'G': shift = 30; s++; break;
    case 't': case 'T': shift = 40; s++; break;
    default: break;
    }
    if (shift && *s == 'i') s++; /* Kubernetes binary suffixes Ki/Mi/Gi/Ti mean the same */
    while (*s == ' ' || *s == '\t') s++;
    if (*s != '\0') return -1;   /* "1GB", "1.5g", "8000mb": ambiguous or unknown */
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *out = v << shift;
    return 0;
}

int vgpu_parse_percent(const char *s, uint32_t *out) {
    if (!s) return -1;
    while (*s == ' ') s++;
    if (!isdigit((unsigned char)*s)) return -1;
    unsigned long v = 0;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (unsigned long)(*s - '0');
        if (v > 1000) return -1;
        s++;
    }
    if (*s == '%') s++;
    while (*s == ' ') s++;
    if (*s != '\0' || v > 100) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* Returns the value of NAME_<i>, else NAME, else NULL; *which names the variable used. */
static const char *env_for(const char *base, int phys, char *which, size_t wn) {
    char name[96];
    snprintf(name, sizeof name, "%s_%d", base, phys);
    const char *v = getenv(name);
    if (v) {
        snprintf(which, wn, "%s", name);
        return v;
    }
    snprintf(which, wn, "%s", base);
    return getenv(base);
}

uint64_t vgpu_mem_limit_for(int phys) {
    char which[96];
    const char *v = env_for("CUDA_DEVICE_MEMORY_LIMIT", phys, which, sizeof which);
    if (!v) return VGPU_UNLIMITED;
    uint64_t bytes;
    if (vgpu_parse_size(v, &bytes) != 0) {
        VLOG(VLOG_ERROR,
             "%s='%s' is malformed (accepted: <n> bytes, <n>k, <n>m, <n>g, <n>t, <n>Ki/Mi/Gi/Ti); "
             "device %d memory limit set to 0 (fail closed)", which, v, phys);
        return 0;
    }
    if (bytes == 0)
        VLOG(VLOG_ERROR, "%s='%s' is zero, which is not 'unlimited' (omit the variable for no limit); "
             "device %d memory limit set to 0 (fail closed)", which, v, phys);
    return bytes;
}

uint32_t vgpu_sm_limit_for(int phys) {
    char which[96];
    const char *v = env_for("CUDA_DEVICE_SM_LIMIT", phys, which, sizeof which);
    if (!v) return 100;
    uint32_t pct;
    if (vgpu_parse_percent(v, &pct) != 0) {
        VLOG(VLOG_ERROR, "%s='%s' is malformed (accepted: integer percent 0..100, 0 or 100 = no limit); "
             "device %d compute share set to 1%% (fail closed)", which, v, phys);
        return 1;
    }
    return pct == 0 ? 100 : pct;
}

/* The shared truth table (vgpu_bool.h): 1 true, 0 false, dflt when unset, -1 invalid. */
static int env_bool(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v) return dflt;
    return vgpu_bool_parse(v);
}

int vgpu_control_disabled(void) {
    static int cached = -2;
    if (cached != -2) return cached;
    int b = env_bool("CUDA_DISABLE_CONTROL", 0);
    if (b < 0) {
        VLOG(VLOG_ERROR, "CUDA_DISABLE_CONTROL='%s' is not true/false (valid: 1/t/true/y/yes/on, 0/f/false/n/no/off/empty); "
             "enforcement stays on",
             getenv("CUDA_DISABLE_CONTROL"));
        b = 0;
    }
    cached = b;
    return b;
}

int vgpu_sm_policy(void) {
    const char *v = getenv("GPU_CORE_UTILIZATION_POLICY");
    if (!v || !*v || !strcasecmp(v, "default")) return SM_POLICY_DEFAULT;
    if (!strcasecmp(v, "force")) return SM_POLICY_FORCE;
    if (!strcasecmp(v, "disable")) return SM_POLICY_DISABLE;
    VLOG(VLOG_ERROR, "GPU_CORE_UTILIZATION_POLICY='%s' is not default/force/disable; using force", v);
    return SM_POLICY_FORCE;
}

int vgpu_sm_idle_mode(void) {
    int b = env_bool("LIBVGPU_SM_USE_IDLE", 0);
    if (b < 0) {
        VLOG(VLOG_ERROR, "LIBVGPU_SM_USE_IDLE='%s' is not true/false; hard cap kept", getenv("LIBVGPU_SM_USE_IDLE"));
        b = 0;
    }
    return b;
}

int vgpu_task_priority(void) {
    const char *v = getenv("CUDA_TASK_PRIORITY");
    if (!v || !*v) return 1;
    if (!strcmp(v, "0")) return 0;
    if (!strcmp(v, "1")) return 1;
    VLOG(VLOG_ERROR, "CUDA_TASK_PRIORITY='%s' is not 0 (high) or 1 (low); using 1", v);
    return 1;
}
