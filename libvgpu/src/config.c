/*
 * config.c - the environment and config-file contract between the device plugin and libvgpu.
 *
 * Why strict parsing: HAMi-core's strtoul-based parser turned "1Gi" into 1 byte and
 * "0800m"/"" into "unlimited" (hami-core-spec §5). A limit that silently disappears is
 * worse than a job that fails, so every value we cannot read exactly fails closed
 * (memory limit 0 bytes, SM share 1 %) with one error line naming the variable.
 */
#include <stdatomic.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include "config.h"
#include "log.h"
#include "vgpu_bool.h"
#include "vgpu_region.h"

/* ---------------- the mounted config file ---------------- */

/* Why the file sits next to the library: the device plugin mounts libvgpu.so and
 * /etc/ld.so.preload into the container, so every process loads the library from a path
 * the plugin chose - whatever its environment. The file is mounted read-only beside it. */
#define CONFIG_NAME "vgpu.config"
#define CONFIG_MAGIC "vgpu-config"
#define CONFIG_MAJOR 1
#define CONFIG_MAX_BYTES 65536
#define CONFIG_MAX_ENTRIES 128
#define CONFIG_MAX_NAME 64
#define CONFIG_MAX_VALUE 512

typedef struct { char name[CONFIG_MAX_NAME]; char value[CONFIG_MAX_VALUE]; } config_entry_t;
static config_entry_t entries[CONFIG_MAX_ENTRIES];
static int nentries;
static int config_state = VGPU_CONFIG_NONE;
static char config_file[4096];
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

/* The names the file may carry: the same facts as the environment the plugin sets. */
static int known_name(const char *n) {
    static const char *const exact[] = {"CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_TASK_PRIORITY",
                                        "GPU_CORE_UTILIZATION_POLICY", "LIBVGPU_CARD_DIR",
                                        "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT",
                                        "LIBVGPU_SM_USE_IDLE", "LIBVGPU_PRIORITY_FLOOR"};
    for (unsigned i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (!strcmp(n, exact[i])) return 1;
    static const char *const indexed[] = {"CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"};
    for (unsigned i = 0; i < 2; i++) {
        size_t l = strlen(indexed[i]);
        if (strncmp(n, indexed[i], l)) continue;
        const char *d = n + l;
        if (!*d || strlen(d) > 2) return 0;
        for (; *d; d++) if (!isdigit((unsigned char)*d)) return 0;
        return 1;
    }
    return 0;
}

int vgpu_config_parse(const char *text, size_t len, char *why, size_t wn) {
    nentries = 0;
    int seen_magic = 0, lineno = 0;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        lineno++;
        size_t n = j - i;
        const char *ln = text + i;
        i = j + 1;
        if (n && ln[n - 1] == '\r') n--;
        if (memchr(ln, '\0', n)) { snprintf(why, wn, "line %d holds a NUL byte", lineno); goto bad; }
        if (n == 0 || ln[0] == '#') continue;
        if (!seen_magic) {
            /* Exactly "vgpu-config <digits>", as the device plugin's reader (device_plugin/vgpu_config.py)
             * takes it: no other white space or sign, and at most 9 significant digits so that the
             * number cannot overflow (sscanf's %d read "vgpu-config 4294967297" as version 1). */
            const size_t ml = sizeof CONFIG_MAGIC - 1;
            int major = 0, sig = 0;
            int shape = n > ml + 1 && !memcmp(ln, CONFIG_MAGIC " ", ml + 1);
            for (size_t k = ml + 1; shape && k < n; k++) {
                if (ln[k] < '0' || ln[k] > '9' || (sig && ++sig > 9)) shape = 0;
                else if (ln[k] != '0' || sig) { if (!sig) sig = 1; major = major * 10 + (ln[k] - '0'); }
            }
            if (!shape) {
                snprintf(why, wn, "line %d: expected '%s %d'", lineno, CONFIG_MAGIC, CONFIG_MAJOR);
                goto bad;
            }
            if (major != CONFIG_MAJOR) {
                snprintf(why, wn, "format version %d, this library reads %d", major, CONFIG_MAJOR);
                goto bad;
            }
            seen_magic = 1;
            continue;
        }
        const char *eq = memchr(ln, '=', n);
        if (!eq) { snprintf(why, wn, "line %d: expected NAME=VALUE", lineno); goto bad; }
        size_t kl = (size_t)(eq - ln), vl = n - kl - 1;
        if (kl == 0 || kl >= CONFIG_MAX_NAME || vl >= CONFIG_MAX_VALUE) {
            snprintf(why, wn, "line %d: name or value too long or empty", lineno);
            goto bad;
        }
        char name[CONFIG_MAX_NAME];
        memcpy(name, ln, kl);
        name[kl] = 0;
        for (size_t k = 0; k < kl; k++)
            if (!(isupper((unsigned char)name[k]) || isdigit((unsigned char)name[k]) || name[k] == '_')) {
                snprintf(why, wn, "line %d: bad variable name", lineno);
                goto bad;
            }
        if (!known_name(name)) { /* a newer plugin's fact: same major version, so safe to skip */
            VLOG(VLOG_INFO, "config file line %d: unknown name %s ignored", lineno, name);
            continue;
        }
        int slot = -1;
        for (int k = 0; k < nentries; k++) if (!strcmp(entries[k].name, name)) slot = k;
        if (slot < 0) {
            if (nentries >= CONFIG_MAX_ENTRIES) { snprintf(why, wn, "more than %d entries", CONFIG_MAX_ENTRIES); goto bad; }
            slot = nentries++;
        }
        memcpy(entries[slot].name, name, kl + 1);
        memcpy(entries[slot].value, eq + 1, vl);
        entries[slot].value[vl] = 0;
    }
    if (!seen_magic) { snprintf(why, wn, "no '%s %d' header", CONFIG_MAGIC, CONFIG_MAJOR); goto bad; }
    /* The plugin always writes both: a file without them was cut or altered. */
    static const char *const required[] = {"CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE"};
    for (unsigned q = 0; q < 2; q++) {
        int found = 0;
        for (int k = 0; k < nentries; k++) if (!strncmp(entries[k].name, required[q], strlen(required[q]))) found = 1;
        if (!found) { snprintf(why, wn, "no %s", required[q]); goto bad; }
    }
    for (int k = 0; k < nentries; k++)
        if (!strcmp(entries[k].name, "CUDA_DEVICE_MEMORY_SHARED_CACHE") && entries[k].value[0] != '/') {
            snprintf(why, wn, "CUDA_DEVICE_MEMORY_SHARED_CACHE is not an absolute path");
            goto bad;
        }
    return 0;
bad:
    nentries = 0;
    return -1;
}

static void load_config(void) {
    Dl_info info;
    if (!dladdr((void *)vgpu_getenv, &info) || !info.dli_fname || !strchr(info.dli_fname, '/')) return;
    const char *slash = strrchr(info.dli_fname, '/');
    snprintf(config_file, sizeof config_file, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
             CONFIG_NAME);
    int fd = open(config_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) {
            VLOG(VLOG_ERROR, "config file %s unreadable (%s): limits fail closed", config_file, strerror(errno));
            config_state = VGPU_CONFIG_BROKEN;
        }
        return;
    }
    static char buf[CONFIG_MAX_BYTES + 1];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd, buf + len, sizeof buf - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (len == sizeof buf) break;
    }
    close(fd);
    char why[160];
    if (len > CONFIG_MAX_BYTES) {
        snprintf(why, sizeof why, "larger than %d bytes", CONFIG_MAX_BYTES);
    } else if (vgpu_config_parse(buf, len, why, sizeof why) == 0) {
        config_state = VGPU_CONFIG_OK;
        VLOG(VLOG_INFO, "config file %s: %d entries", config_file, nentries);
        return;
    }
    VLOG(VLOG_ERROR, "config file %s is malformed (%s): limits fail closed (memory 0, compute 1%%)",
         config_file, why);
    config_state = VGPU_CONFIG_BROKEN;
}

int vgpu_config_state(void) {
    pthread_once(&config_once, load_config);
    return config_state;
}

const char *vgpu_config_path(void) {
    pthread_once(&config_once, load_config);
    return config_file;
}

static const char *env_value(const char *name) { return getenv(name); }

static const char *file_value(const char *name) {
    if (vgpu_config_state() != VGPU_CONFIG_OK) return NULL;
    for (int i = 0; i < nentries; i++)
        if (!strcmp(entries[i].name, name)) return entries[i].value;
    return NULL;
}

const char *vgpu_getenv(const char *name) {
    const char *v = getenv(name);
    return v ? v : file_value(name);
}

extern char **environ;
int vgpu_config_has_prefix(const char *prefix) {
    size_t l = strlen(prefix);
    for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, prefix, l)) return 1;
    if (vgpu_config_state() != VGPU_CONFIG_OK) return 0;
    for (int i = 0; i < nentries; i++)
        if (!strncmp(entries[i].name, prefix, l)) return 1;
    return 0;
}

/* ---------------- values ---------------- */

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

/* Returns the value of NAME_<i>, else NAME - from the environment, else from the config file -
 * or NULL; *which names the variable used. The environment as a whole comes first, so a
 * container's own NAME is not overridden by the file's NAME_<i>. */
static const char *env_for(const char *base, int phys, char *which, size_t wn) {
    char name[96];
    snprintf(name, sizeof name, "%s_%d", base, phys);
    const char *(*const sources[2])(const char *) = {env_value, file_value};
    for (int src = 0; src < 2; src++) {
        const char *v = sources[src](name);
        if (v) { snprintf(which, wn, "%s", name); return v; }
        v = sources[src](base);
        if (v) { snprintf(which, wn, "%s", base); return v; }
    }
    return NULL;
}

uint64_t vgpu_mem_limit_for(int phys) {
    char which[96];
    const char *v = env_for("CUDA_DEVICE_MEMORY_LIMIT", phys, which, sizeof which);
    if (!v && vgpu_config_state() == VGPU_CONFIG_BROKEN) return 0; /* logged when the file was read */
    if (!v && vgpu_config_state() == VGPU_CONFIG_OK) {
        VLOG(VLOG_ERROR, "no memory limit for device %d in config file %s; device %d memory limit set to 0 "
             "(fail closed)", phys, config_file, phys);
        return 0;
    }
    if (!v) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED) && vgpu_config_state() == VGPU_CONFIG_NONE)
            VLOG(VLOG_WARN, "no CUDA_DEVICE_MEMORY_LIMIT in the environment and no config file%s%s: "
                 "device memory is NOT limited for this process", *config_file ? " at " : "", config_file);
        return VGPU_UNLIMITED;
    }
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
    if (!v && vgpu_config_state() == VGPU_CONFIG_BROKEN) return 1;
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
    const char *v = vgpu_getenv(name);
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
             vgpu_getenv("CUDA_DISABLE_CONTROL"));
        b = 0;
    }
    cached = b;
    return b;
}

int vgpu_sm_policy(void) {
    const char *v = vgpu_getenv("GPU_CORE_UTILIZATION_POLICY");
    if (!v || !*v || !strcasecmp(v, "default")) return SM_POLICY_DEFAULT;
    if (!strcasecmp(v, "force")) return SM_POLICY_FORCE;
    if (!strcasecmp(v, "disable")) return SM_POLICY_DISABLE;
    VLOG(VLOG_ERROR, "GPU_CORE_UTILIZATION_POLICY='%s' is not default/force/disable; using force", v);
    return SM_POLICY_FORCE;
}

int vgpu_sm_idle_mode(void) {
    int b = env_bool("LIBVGPU_SM_USE_IDLE", 0);
    if (b < 0) {
        VLOG(VLOG_ERROR, "LIBVGPU_SM_USE_IDLE='%s' is not true/false; hard cap kept", vgpu_getenv("LIBVGPU_SM_USE_IDLE"));
        b = 0;
    }
    return b;
}

int vgpu_task_priority(void) {
    const char *v = vgpu_getenv("CUDA_TASK_PRIORITY");
    if (!v || !*v) return 1;
    if (!strcmp(v, "0")) return 0;
    if (!strcmp(v, "1")) return 1;
    VLOG(VLOG_ERROR, "CUDA_TASK_PRIORITY='%s' is not 0 (high) or 1 (low); using 1", v);
    return 1;
}
