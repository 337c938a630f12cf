/*
 * real.c - finding the real driver and NVML functions, and the real dlsym/dlvsym/dlopen/dlmopen.
 *
 * Why the real dlsym/dlvsym are found by reading the C library's dynamic symbol table: this
 * library exports both names itself (doorhooks.c), so a call to "dlvsym" from here would reach
 * our own. Reading the table of libc.so.6 / libdl.so.2 (whichever defines them: glibc moved
 * them into libc in 2.34) needs only dl_iterate_phdr, which every glibc since 2.2.4 has, and
 * binds to no symbol version newer than the build's baseline (GLIBC_2.17).
 */
#include <stdatomic.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include "config.h"
#include "log.h"
#include "real.h"

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static dlsym_fn real_dlsym_fn;
static dlvsym_fn real_dlvsym_fn;
static vgpu_dlopen_fn libc_dlopen_fn;
static vgpu_dlmopen_fn libc_dlmopen_fn;

static uint32_t gnu_hash(const char *s) {
    uint32_t h = 5381;
    for (; *s; s++) h = h * 33 + (unsigned char)*s;
    return h;
}

/* Address of the defined dynamic symbol `name` in the object loaded at `base` with dynamic
 * section `dyn`, via its DT_GNU_HASH or DT_HASH table; NULL when absent. */
static void *dyn_lookup(ElfW(Addr) base, const ElfW(Dyn) *dyn, const char *name) {
    if (!dyn) return NULL;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gnu = NULL, *sysv = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        /* glibc's loader relocates these entries to absolute addresses; a few loaders do not */
        ElfW(Addr) p = dyn->d_un.d_ptr;
        if (p && p < base) p += base;
        if (dyn->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)p;
        else if (dyn->d_tag == DT_STRTAB) strtab = (const char *)p;
        else if (dyn->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)p;
        else if (dyn->d_tag == DT_HASH) sysv = (const uint32_t *)p;
    }
    if (!symtab || !strtab) return NULL;
    if (gnu) {
        uint32_t nb = gnu[0], off = gnu[1], bloom = gnu[2], h = gnu_hash(name);
        const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)&gnu[4] + bloom);
        const uint32_t *chain = buckets + nb;
        if (!nb) return NULL;
        uint32_t idx = buckets[h % nb];
        if (idx < off) return NULL;
        for (;; idx++) {
            uint32_t h2 = chain[idx - off];
            const ElfW(Sym) *s = &symtab[idx];
            if ((h | 1) == (h2 | 1) && s->st_shndx != SHN_UNDEF && s->st_value && !strcmp(strtab + s->st_name, name))
                return (void *)(base + s->st_value);
            if (h2 & 1) return NULL;
        }
    }
    if (sysv) {
        uint32_t n = sysv[1];
        for (uint32_t i = 0; i < n; i++) {
            const ElfW(Sym) *s = &symtab[i];
            if (s->st_shndx != SHN_UNDEF && s->st_value && !strcmp(strtab + s->st_name, name))
                return (void *)(base + s->st_value);
        }
    }
    return NULL;
}

static void *elf_lookup(struct dl_phdr_info *info, const char *name) {
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    return dyn_lookup(info->dlpi_addr, dyn, name);
}

void *vgpu_object_symbol(const struct link_map *lm, const char *name) {
    return lm ? dyn_lookup(lm->l_addr, lm->l_ld, name) : NULL;
}

static int find_dl(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size; (void)arg;
    const char *n = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(n, '/');
    base = base ? base + 1 : n;
    if (strncmp(base, "libc.so", 7) && strncmp(base, "libdl.so", 8)) return 0;
    if (!real_dlsym_fn) real_dlsym_fn = (dlsym_fn)elf_lookup(info, "dlsym");
    if (!real_dlvsym_fn) real_dlvsym_fn = (dlvsym_fn)elf_lookup(info, "dlvsym");
    if (!libc_dlopen_fn) libc_dlopen_fn = (vgpu_dlopen_fn)elf_lookup(info, "dlopen");
    if (!libc_dlmopen_fn) libc_dlmopen_fn = (vgpu_dlmopen_fn)elf_lookup(info, "dlmopen");
    return real_dlsym_fn && real_dlvsym_fn && libc_dlopen_fn && libc_dlmopen_fn;
}

static void resolve_real_dl(void) {
    if (!real_dlsym_fn || !real_dlvsym_fn || !libc_dlopen_fn || !libc_dlmopen_fn) dl_iterate_phdr(find_dl, NULL);
}

__attribute__((constructor)) static void vgpu_ctor(void) {
    vgpu_log_init();
    resolve_real_dl();
    if (!real_dlsym_fn) VLOG(VLOG_ERROR, "the C library's dlsym was not found; driver calls will fail");
}

void *vgpu_real_dlsym(void *handle, const char *name) {
    if (VGPU_UNLIKELY(!real_dlsym_fn)) resolve_real_dl();
    return real_dlsym_fn ? real_dlsym_fn(handle, name) : NULL;
}

void *vgpu_real_dlvsym(void *handle, const char *name, const char *version) {
    if (VGPU_UNLIKELY(!real_dlvsym_fn)) resolve_real_dl();
    return real_dlvsym_fn ? real_dlvsym_fn(handle, name, version) : NULL;
}

/* The next dlopen after this library (another interposer's, or the C library's), so that a chain of
 * interposers stays a chain; the C library's own, found by its symbol table, where the loader knows
 * none (a loader that does not answer RTLD_NEXT for a dlopen()ed copy of this library). Looked up at
 * first use: another library's constructor may dlopen before this one's runs. */
vgpu_dlopen_fn vgpu_real_dlopen(void) {
    static vgpu_dlopen_fn next;
    vgpu_dlopen_fn f = __atomic_load_n(&next, __ATOMIC_ACQUIRE);
    if (VGPU_LIKELY(f)) return f;
    f = (vgpu_dlopen_fn)vgpu_real_dlsym(RTLD_NEXT, "dlopen");
    if (!f) f = libc_dlopen_fn;
    __atomic_store_n(&next, f, __ATOMIC_RELEASE);
    return f;
}

vgpu_dlmopen_fn vgpu_real_dlmopen(void) {
    static vgpu_dlmopen_fn next;
    vgpu_dlmopen_fn f = __atomic_load_n(&next, __ATOMIC_ACQUIRE);
    if (VGPU_LIKELY(f)) return f;
    f = (vgpu_dlmopen_fn)vgpu_real_dlsym(RTLD_NEXT, "dlmopen");
    if (!f) f = libc_dlmopen_fn;
    __atomic_store_n(&next, f, __ATOMIC_RELEASE);
    return f;
}

/* Through the real dlopen: a call by name would reach the one doorhooks.c exports, above this file. */
static void *open_lib(const char *name, int mode) {
    vgpu_dlopen_fn f = vgpu_real_dlopen();
    return f ? f(name, mode) : NULL;
}

static const char *const cuda_names[H_CUDA_END] = {
#define S(n) #n,
    VGPU_CUDA_HOOKS(S) VGPU_CUDA_REAL_ONLY(S)
#undef S
};
static const char *const nvml_names[HN_END] = {
#define S(n) #n,
    VGPU_NVML_HOOKS(S) VGPU_NVML_REAL_ONLY(S)
#undef S
};

void *vgpu_real_fn[H_CUDA_END];
void *vgpu_real_nvml_fn[HN_END];
int vgpu_real_ready;
static void *cuda_handle, *nvml_handle;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT;

static void load_cuda(void) {
    cuda_handle = open_lib("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!cuda_handle) cuda_handle = open_lib("libcuda.so.1", RTLD_LAZY);
    if (!cuda_handle) {
        VLOG(VLOG_ERROR, "cannot load libcuda.so.1: %s", dlerror());
    } else {
        for (int i = 0; i < H_CUDA_END; i++) vgpu_real_fn[i] = vgpu_real_dlsym(cuda_handle, cuda_names[i]);
    }
    __atomic_store_n(&vgpu_real_ready, 1, __ATOMIC_RELEASE);
}

static void load_nvml(void) {
    nvml_handle = open_lib("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!nvml_handle) nvml_handle = open_lib("libnvidia-ml.so.1", RTLD_LAZY);
    if (!nvml_handle) {
        VLOG(VLOG_INFO, "libnvidia-ml.so.1 not loadable: %s", dlerror());
        return;
    }
    for (int i = 0; i < HN_END; i++) vgpu_real_nvml_fn[i] = vgpu_real_dlsym(nvml_handle, nvml_names[i]);
}

void vgpu_load_real(void) { pthread_once(&cuda_once, load_cuda); }
void vgpu_load_real_nvml(void) { pthread_once(&nvml_once, load_nvml); }
void *vgpu_cuda_handle(void) { vgpu_load_real(); return cuda_handle; }
void *vgpu_nvml_handle(void) { vgpu_load_real_nvml(); return nvml_handle; }

void *vgpu_real_cuda(const char *name) {
    void *h = vgpu_cuda_handle();
    return h ? vgpu_real_dlsym(h, name) : NULL;
}
void *vgpu_real_nvml(const char *name) {
    void *h = vgpu_nvml_handle();
    return h ? vgpu_real_dlsym(h, name) : NULL;
}

