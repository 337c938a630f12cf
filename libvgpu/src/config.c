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

/* Where the file is: beside the libvgpu.so that the preload list names. The device plugin mounts
 * libvgpu.so, the file beside it and /etc/ld.so.preload (naming that libvgpu.so) read-only into the
 * container, so every process finds the plugin's file whatever its environment. Not beside this
 * copy of the library: a tenant that copies libvgpu.so next to a file of its own and names the copy
 * in LD_PRELOAD would be read first by the loader and bring its own limits. Only where the preload
 * list names no libvgpu.so (a node without the device plugin, a test) is the library's own
 * directory used. No environment variable names the file. */
#ifndef VGPU_PRELOAD_LIST /* the test harness builds a copy that reads ./ld.so.preload (Makefile) */
#define VGPU_PRELOAD_LIST "/etc/ld.so.preload"
#endif
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

/* The names the file may carry: the same facts as the environment the plugin sets, and every knob
 * of the enforcement itself. LIBVGPU_SM_SLICE_MS is one: a slice the tenant sets to days never
 * closes, so the limiter never pauses (the plugin does not write it: libvgpu's 250 ms apply). */
static int known_name(const char *n) {
    static const char *const exact[] = {"CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_TASK_PRIORITY",
                                        "GPU_CORE_UTILIZATION_POLICY", "LIBVGPU_CARD_DIR",
                                        "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT",
                                        "LIBVGPU_SM_USE_IDLE", "LIBVGPU_PRIORITY_FLOOR", "CUDA_DISABLE_CONTROL",
                                        "LIBVGPU_SM_SLICE_MS"};
    for (unsigned i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (!strcmp(n, exact[i])) return 1;
    static const char *const indexed[] = {"CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_", "LIBVGPU_DEVICE_UUID_"};
    for (unsigned i = 0; i < 3; i++) {
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

/* The directory of the first absolute ".../libvgpu.so" in the preload list (ld.so's syntax: names
 * separated by white space or ':'); 0, or -1 when the list is absent or names none. */
static int preloaded_dir(char *out, size_t n) {
    int fd = open(VGPU_PRELOAD_LIST, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[4097];
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0) return -1;
    buf[len] = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, " \t\r\n:", &save); t; t = strtok_r(NULL, " \t\r\n:", &save)) {
        const char *slash = strrchr(t, '/');
        if (t[0] != '/' || strcmp(slash + 1, "libvgpu.so") || (size_t)(slash - t) >= n) continue;
        snprintf(out, n, "%.*s", (int)(slash - t), t);
        return 0;
    }
    return -1;
}

static void load_config(void) {
    char dir[sizeof config_file - sizeof CONFIG_NAME - 1];
    Dl_info info;
    if (preloaded_dir(dir, sizeof dir) == 0) {
        snprintf(config_file, sizeof config_file, "%s/%s", dir, CONFIG_NAME);
    } else {
        if (!dladdr((void *)vgpu_getenv, &info) || !info.dli_fname || !strchr(info.dli_fname, '/')) return;
        const char *slash = strrchr(info.dli_fname, '/');
        snprintf(config_file, sizeof config_file, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                 CONFIG_NAME);
    }
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

/* Where the file exists (read or not), it is the authority for every name it may carry: the
 * environment is the tenant's, the file the device plugin's. */
static int file_rules(const char *name) { return vgpu_config_state() != VGPU_CONFIG_NONE && known_name(name); }

/* One warning per name when the environment says something the file overrules. */
static void note_overruled(const char *name, const char *used) {
    static char warned[16][CONFIG_MAX_NAME];
    static int nwarned;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    const char *e = getenv(name);
    if (!e || (used && !strcmp(e, used))) return;
    pthread_mutex_lock(&mu);
    int seen = 0;
    for (int i = 0; i < nwarned; i++) if (!strcmp(warned[i], name)) seen = 1;
    if (!seen && nwarned < 16) snprintf(warned[nwarned++], CONFIG_MAX_NAME, "%s", name);
    pthread_mutex_unlock(&mu);
    if (!seen)
        VLOG(VLOG_WARN, "%s='%s' in the environment is ignored: the config file %s is the authority (%s%s%s)",
             name, e, config_file, used ? "it says '" : "default", used ? used : "", used ? "'" : "");
}

const char *vgpu_getenv(const char *name) {
    if (!file_rules(name)) return getenv(name);
    const char *v = file_value(name);
    note_overruled(name, v);
    return v;
}

extern char **environ;
int vgpu_config_has_prefix(const char *prefix) {
    size_t l = strlen(prefix);
    int state = vgpu_config_state();
    if (state == VGPU_CONFIG_BROKEN) return 1; /* the limits fail closed: one applies */
    if (state == VGPU_CONFIG_OK) {
        for (int i = 0; i < nentries; i++)
            if (!strncmp(entries[i].name, prefix, l)) return 1;
        return 0;
    }
    for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, prefix, l)) return 1;
    return 0;
}

int vgpu_config_index_of_uuid(const char *uuid) {
    if (vgpu_config_state() != VGPU_CONFIG_OK || !uuid) return -2;
    static const char prefix[] = "LIBVGPU_DEVICE_UUID_";
    int listed = 0;
    for (int i = 0; i < nentries; i++) {
        if (strncmp(entries[i].name, prefix, sizeof prefix - 1)) continue;
        listed = 1;
        if (!strcasecmp(entries[i].value, uuid)) return atoi(entries[i].name + sizeof prefix - 1);
    }
    return listed ? -1 : -2;
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

/* Returns the value of NAME_<i>, else NAME, from the config file where it exists, else from the
 * environment, or NULL; *which names the variable used. */
static const char *source_for(const char *base, int phys, int from_file, char *which, size_t wn) {
    char name[96];
    snprintf(name, sizeof name, "%s_%d", base, phys);
    const char *(*src)(const char *) = from_file ? file_value : env_value;
    const char *v = src(name);
    if (v) { snprintf(which, wn, "%s", name); return v; }
    v = src(base);
    if (v) { snprintf(which, wn, "%s", base); return v; }
    return NULL;
}

static const char *env_for(const char *base, int phys, char *which, size_t wn) {
    return source_for(base, phys, vgpu_config_state() != VGPU_CONFIG_NONE, which, wn);
}

/* Reads a memory limit value (logging why it fails closed, unless `quiet`). */
static uint64_t size_or_zero(const char *v, const char *which, int phys, int quiet) {
    uint64_t bytes;
    if (vgpu_parse_size(v, &bytes) != 0) {
        if (!quiet)
            VLOG(VLOG_ERROR,
                 "%s='%s' is malformed (accepted: <n> bytes, <n>k, <n>m, <n>g, <n>t, <n>Ki/Mi/Gi/Ti); "
                 "device %d memory limit set to 0 (fail closed)", which, v, phys);
        return 0;
    }
    if (bytes == 0 && !quiet)
        VLOG(VLOG_ERROR, "%s='%s' is zero, which is not 'unlimited' (omit the variable for no limit); "
             "device %d memory limit set to 0 (fail closed)", which, v, phys);
    return bytes;
}

uint64_t vgpu_mem_cap_for(int phys) {
    if (vgpu_config_state() == VGPU_CONFIG_NONE) return VGPU_UNLIMITED;
    char which[96];
    const char *f = source_for("CUDA_DEVICE_MEMORY_LIMIT", phys, 1, which, sizeof which);
    uint64_t cap = f ? size_or_zero(f, which, phys, 1) : 0; /* logged by vgpu_mem_limit_for */
    const char *e = source_for("CUDA_DEVICE_MEMORY_LIMIT", phys, 0, which, sizeof which);
    if (!e) return cap;
    uint64_t mine = size_or_zero(e, which, phys, 0);
    if (mine < cap) {
        VLOG(VLOG_INFO, "%s='%s' lowers this process's device %d memory limit to %llu bytes", which, e, phys,
             (unsigned long long)mine);
        return mine;
    }
    if (mine > cap)
        VLOG(VLOG_WARN, "%s='%s' in the environment is ignored: the config file %s sets device %d's limit to "
             "%llu bytes, and the environment may only lower it", which, e, config_file, phys,
             (unsigned long long)cap);
    return cap;
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
    return size_or_zero(v, which, phys, 0);
}

uint32_t vgpu_sm_limit_for(int phys) {
    char which[96], envname[96];
    const char *v = env_for("CUDA_DEVICE_SM_LIMIT", phys, which, sizeof which);
    if (vgpu_config_state() != VGPU_CONFIG_NONE && source_for("CUDA_DEVICE_SM_LIMIT", phys, 0, envname, sizeof envname))
        note_overruled(envname, v); /* the share is the container's, paced in its region */
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
