/*
 * fake_escapes.inc.c - part of the fake libcuda.so.1 (included by fake_cuda.c, which owns the
 * physical-memory model: phys_alloc/phys_free, devices, contexts): the driver behaviour behind
 * the ways a tenant could hold memory past its limit, modelled as the real driver documents it.
 *
 *   VMM: a cuMemCreate handle's memory lives until every handle to it is released (cuMemRelease;
 *        cuMemRetainAllocationHandle returns the same handle with one more reference) AND its
 *        last mapping is unmapped. cuMemExportToShareableHandle writes an int "fd" (POSIX_FD);
 *        cuMemImportFromShareableHandle of it returns a new handle to the same memory.
 *        Memory bound to a multicast object (cuMulticastBindMem) stays until cuMulticastUnbind or
 *        until the multicast object is released and unmapped.
 *        cuMemAddressFree of a range with live mappings unmaps them, or with
 *        FAKE_VMM_ADDRFREE_KEEPS=1 leaves the memory allocated (a driver that leaks it).
 *   Graphs: cuGraphAddMemAllocNode / cuGraphAddChildGraphNode / stream capture of
 *        cuMemAllocAsync build graphs whose memory-allocation nodes take their bytes in the
 *        device's graph pool at the first cuGraphUpload / cuGraphLaunch of an instantiation
 *        (kept until cuDeviceGraphMemTrim).
 *   Limits: cuCtxSetLimit of the malloc heap and printf FIFO takes (value - default) bytes at
 *        once, of the stack size (value - default) x FAKE_SM_COUNT (4) x 2048 threads, of the
 *        device runtime's pending launch count (value - default) KiB.
 *   IPC: cuMemGetAddressRange of an imported address answers the exporter's allocation size (legacy
 *        IPC in fake_cuda.c, across processes; pool pointers within one process).
 */
#undef cuGraphInstantiate
#undef cuStreamBeginCapture
#undef cuStreamEndCapture
#undef cuMemGetAddressRange
#undef cuGraphInstantiateWithParams

/* ---------------- VMM ---------------- */
typedef struct { uint64_t key, bytes; int dev, refs, maps, live; } vrec_t;
typedef struct { uint64_t h; int rec; } vhandle_t;
typedef struct { uint64_t va, size; int rec; } vmapping_t;
static vrec_t vrecs[256];
static vhandle_t vhandles[512];
static vmapping_t vmaps[512];
static int nvrecs, nvhandles, nvmaps;
static uint64_t next_va = 0x20000000000ull, next_alias = 0x30000000000ull;

static int vh_find(uint64_t h) {
    for (int i = 0; i < nvhandles; i++)
        if (vhandles[i].h == h) return i;
    return -1;
}
/* Multicast objects (key 0): memory bound to one stays allocated until unbound or the object goes. */
static struct { int mc, rec; uint64_t off; } mbinds[64];
static int nmbinds;
static void vrec_maybe_free(int r);
static void mc_unbind(int mc, uint64_t off, uint64_t size) {
    for (int i = 0; i < nmbinds;) {
        if (mbinds[i].mc == mc && mbinds[i].off >= off && mbinds[i].off - off < size) {
            int m = mbinds[i].rec;
            mbinds[i] = mbinds[--nmbinds];
            vrecs[m].maps--;
            vrec_maybe_free(m);
        } else {
            i++;
        }
    }
}
static void vrec_maybe_free(int r) {
    if (vrecs[r].live && vrecs[r].refs == 0 && vrecs[r].maps == 0) {
        vrecs[r].live = 0;
        if (vrecs[r].key) phys_free(vrecs[r].key);
        else mc_unbind(r, 0, ~0ull);
    }
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long f) {
    COUNT(); NEED_INIT(); uint64_t k;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) { *h = 0x5000000000ull + size; return CUDA_SUCCESS; }
    if (nvrecs >= 256 || nvhandles >= 512) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = phys_alloc(prop->location.id, size, &k);
    if (r) return r;
    vrecs[nvrecs] = (vrec_t){k, size, prop->location.id, 1, 0, 1};
    vhandles[nvhandles++] = (vhandle_t){k, nvrecs++};
    *h = k;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    COUNT(); NEED_INIT();
    if (h >= 0x5000000000ull && h < 0x6000000000ull) return CUDA_SUCCESS; /* host-located */
    int i = vh_find(h);
    if (i < 0 || !vrecs[vhandles[i].rec].live || vrecs[vhandles[i].rec].refs <= 0) return CUDA_ERROR_INVALID_VALUE;
    vrecs[vhandles[i].rec].refs--;
    vrec_maybe_free(vhandles[i].rec);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f) {
    COUNT(); NEED_INIT();
    *p = next_va;
    next_va += (size + 0xfffff) & ~0xfffffull;
    return CUDA_SUCCESS;
}
static void unmap_range(uint64_t ptr, uint64_t size, int free_memory) {
    for (int i = 0; i < nvmaps;) {
        if (vmaps[i].va >= ptr && vmaps[i].va - ptr < size) {
            int r = vmaps[i].rec;
            vmaps[i] = vmaps[--nvmaps];
            if (free_memory) { vrecs[r].maps--; vrec_maybe_free(r); }
        } else {
            i++;
        }
    }
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    COUNT(); NEED_INIT();
    const char *keep = getenv("FAKE_VMM_ADDRFREE_KEEPS");
    unmap_range(p, size, !(keep && *keep == '1'));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
    COUNT(); NEED_INIT();
    int i = vh_find(h);
    if (i < 0 || nvmaps >= 512) return CUDA_ERROR_INVALID_VALUE;
    vrec_t *v = &vrecs[vhandles[i].rec];
    if (!v->live || v->refs <= 0 || off + size > v->bytes) return CUDA_ERROR_INVALID_VALUE;
    v->maps++;
    vmaps[nvmaps++] = (vmapping_t){p, size, vhandles[i].rec};
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    COUNT(); NEED_INIT();
    unmap_range(p, size, 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    COUNT(); NEED_INIT();
    uint64_t a = (uint64_t)(uintptr_t)addr;
    for (int i = 0; i < nvmaps; i++)
        if (a >= vmaps[i].va && a - vmaps[i].va < vmaps[i].size) {
            int r = vmaps[i].rec;
            for (int j = 0; j < nvhandles; j++)
                if (vhandles[j].rec == r) { *h = vhandles[j].h; vrecs[r].refs++; return CUDA_SUCCESS; }
        }
    return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t, unsigned long long f) {
    COUNT(); NEED_INIT();
    int i = vh_find(h);
    if (i < 0 || t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    *(int *)out = 1000 + vhandles[i].rec; /* the "fd" names the allocation */
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, CUmemAllocationHandleType t) {
    COUNT(); NEED_INIT();
    int r = (int)(intptr_t)os - 1000;
    if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || r < 0 || r >= nvrecs || !vrecs[r].live || nvhandles >= 512)
        return CUDA_ERROR_INVALID_VALUE;
    *h = next_alias;
    next_alias += 0x100000;
    vhandles[nvhandles++] = (vhandle_t){*h, r};
    vrecs[r].refs++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    COUNT(); NEED_INIT();
    int i = vh_find(h);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = vrecs[vhandles[i].rec].dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *h, const CUmulticastObjectProp *prop) {
    COUNT(); NEED_INIT();
    if (nvrecs >= 256 || nvhandles >= 512) return CUDA_ERROR_OUT_OF_MEMORY;
    vrecs[nvrecs] = (vrec_t){0, prop->size, 0, 1, 0, 1};
    *h = next_alias;
    next_alias += 0x100000;
    vhandles[nvhandles++] = (vhandle_t){*h, nvrecs++};
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mcOff, CUmemGenericAllocationHandle mem,
                                   size_t memOff, size_t size, unsigned long long f) {
    COUNT(); NEED_INIT();
    int m = vh_find(mc), h = vh_find(mem);
    if (m < 0 || h < 0 || nmbinds >= 64 || !vrecs[vhandles[h].rec].live) return CUDA_ERROR_INVALID_VALUE;
    vrecs[vhandles[h].rec].maps++;
    mbinds[nmbinds].mc = vhandles[m].rec;
    mbinds[nmbinds].rec = vhandles[h].rec;
    mbinds[nmbinds++].off = mcOff;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mcOff, CUdeviceptr p, size_t size, unsigned long long f) {
    COUNT(); NEED_INIT();
    int m = vh_find(mc);
    for (int i = 0; m >= 0 && i < nvmaps && nmbinds < 64; i++)
        if (p >= vmaps[i].va && p - vmaps[i].va < vmaps[i].size) {
            vrecs[vmaps[i].rec].maps++;
            mbinds[nmbinds].mc = vhandles[m].rec;
            mbinds[nmbinds].rec = vmaps[i].rec;
            mbinds[nmbinds++].off = mcOff;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mcOff, size_t size) {
    COUNT(); NEED_INIT();
    int m = vh_find(mc);
    if (m < 0) return CUDA_ERROR_INVALID_VALUE;
    mc_unbind(vhandles[m].rec, mcOff, size);
    return CUDA_SUCCESS;
}

/* Sparse arrays own no memory; cuMemMapArrayAsync maps handles into them, which keeps the
 * handles' memory until the array is destroyed (tile unmaps are not modelled). */
static uint64_t next_sparse = 0x5800000000ull;
static struct { uint64_t array; int rec; } amaps[64];
static int namaps;
static CUarray fake_sparse_array(void) { next_sparse += 0x100; return (CUarray)(uintptr_t)next_sparse; }
static int fake_sparse_destroy(CUarray a) {
    uint64_t v = (uint64_t)(uintptr_t)a;
    if (v < 0x5800000000ull || v >= 0x5900000000ull) return 0;
    for (int i = 0; i < namaps;) {
        if (amaps[i].array == v) {
            int r = amaps[i].rec;
            amaps[i] = amaps[--namaps];
            vrecs[r].maps--;
            vrec_maybe_free(r);
        } else {
            i++;
        }
    }
    return 1;
}
EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned int n, CUstream s) {
    COUNT(); NEED_INIT();
    for (unsigned i = 0; i < n; i++) {
        if (list[i].memOperationType != CU_MEM_OPERATION_TYPE_MAP) continue;
        int h = vh_find(list[i].memHandle.memHandle);
        if (h < 0 || namaps >= 64 || !vrecs[vhandles[h].rec].live) return CUDA_ERROR_INVALID_VALUE;
        vrecs[vhandles[h].rec].maps++;
        amaps[namaps].array = (uint64_t)(uintptr_t)list[i].resource.array;
        amaps[namaps++].rec = vhandles[h].rec;
    }
    return CUDA_SUCCESS;
}

/* ---------------- graphs and stream capture ---------------- */
#define FG_MAX 64
#define FN_MAX 32
typedef struct { int type; uint64_t bytes; int dev, child; } fnode_t;
typedef struct { int used, n; fnode_t node[FN_MAX]; } fgraph_t;
typedef struct { int used; uint64_t bytes[FAKE_MAX_DEV]; } fexec_t;
static fgraph_t fgraphs[FG_MAX];
static fexec_t fexecs[FG_MAX];
static uint64_t next_graph_va = 0x40000000000ull;
#define G_HANDLE(i) ((uintptr_t)0x600000 + ((uintptr_t)(i) << 8))
#define N_HANDLE(g, n) ((uintptr_t)0x6000000 + ((uintptr_t)(g) << 8) + (uintptr_t)(n))
#define E_HANDLE(i) ((uintptr_t)0x700000 + ((uintptr_t)(i) << 8))
static int g_index(CUgraph g) {
    uintptr_t v = (uintptr_t)g;
    if (v < 0x600000 || v >= 0x600000 + ((uintptr_t)FG_MAX << 8) || (v & 0xff)) return -1;
    int i = (int)((v - 0x600000) >> 8);
    return fgraphs[i].used ? i : -1;
}
static fnode_t *n_of(CUgraphNode n) {
    uintptr_t v = (uintptr_t)n;
    if (v < 0x6000000) return NULL;
    int g = (int)((v - 0x6000000) >> 8), k = (int)(v & 0xff);
    if (g >= FG_MAX || !fgraphs[g].used || k >= fgraphs[g].n) return NULL;
    return &fgraphs[g].node[k];
}
static int graph_new(void) {
    for (int i = 0; i < FG_MAX; i++)
        if (!fgraphs[i].used) { fgraphs[i] = (fgraph_t){1, 0, {{0}}}; return i; }
    return -1;
}
static CUresult add_node(CUgraphNode *out, int g, fnode_t n) {
    if (g < 0 || fgraphs[g].n >= FN_MAX) return CUDA_ERROR_INVALID_VALUE;
    fgraphs[g].node[fgraphs[g].n] = n;
    if (out) *out = (CUgraphNode)N_HANDLE(g, fgraphs[g].n);
    fgraphs[g].n++;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int f) {
    COUNT(); NEED_INIT();
    int i = graph_new();
    if (i < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *g = (CUgraph)G_HANDLE(i);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphDestroy(CUgraph g) {
    COUNT(); NEED_INIT();
    int i = g_index(g);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    fgraphs[i].used = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    COUNT(); NEED_INIT();
    if (!p || !p->bytesize) return CUDA_ERROR_INVALID_VALUE;
    p->dptr = next_graph_va;
    next_graph_va += (p->bytesize + 0xfffff) & ~0xfffffull;
    return add_node(n, g_index(g), (fnode_t){CU_GRAPH_NODE_TYPE_MEM_ALLOC, p->bytesize, p->poolProps.location.id, -1});
}
EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUdeviceptr d) {
    COUNT(); NEED_INIT();
    return add_node(n, g_index(g), (fnode_t){CU_GRAPH_NODE_TYPE_MEM_FREE, 0, 0, -1});
}
/* The child graph is cloned into the node, as the driver does. */
EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraph child) {
    COUNT(); NEED_INIT();
    int c = g_index(child), k = graph_new();
    if (c < 0 || k < 0) return CUDA_ERROR_INVALID_VALUE;
    fgraphs[k] = fgraphs[c];
    return add_node(n, g_index(g), (fnode_t){CU_GRAPH_NODE_TYPE_GRAPH, 0, 0, k});
}
EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num) {
    COUNT(); NEED_INIT();
    int i = g_index(g);
    if (i < 0 || !num) return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (int k = 0; k < fgraphs[i].n && (size_t)k < *num; k++) nodes[k] = (CUgraphNode)N_HANDLE(i, k);
    if (!nodes || *num > (size_t)fgraphs[i].n) *num = (size_t)fgraphs[i].n;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *t) {
    COUNT(); NEED_INIT();
    fnode_t *x = n_of(n);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    *t = (CUgraphNodeType)x->type;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode n, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    COUNT(); NEED_INIT();
    fnode_t *x = n_of(n);
    if (!x || x->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->bytesize = x->bytes;
    p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->poolProps.location.id = x->dev;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *g) {
    COUNT(); NEED_INIT();
    fnode_t *x = n_of(n);
    if (!x || x->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *g = (CUgraph)G_HANDLE(x->child);
    return CUDA_SUCCESS;
}
static void graph_bytes(int g, uint64_t *bytes, int depth) {
    if (g < 0 || depth > 8) return;
    for (int k = 0; k < fgraphs[g].n; k++) {
        fnode_t *x = &fgraphs[g].node[k];
        if (x->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && x->dev >= 0 && x->dev < FAKE_MAX_DEV) bytes[x->dev] += x->bytes;
        if (x->type == CU_GRAPH_NODE_TYPE_GRAPH) graph_bytes(x->child, bytes, depth + 1);
    }
}
static CUresult instantiate(CUgraphExec *e, CUgraph g) {
    NEED_INIT();
    int i = g_index(g);
    if (i < 0 || !e) return CUDA_ERROR_INVALID_VALUE;
    for (int k = 0; k < FG_MAX; k++)
        if (!fexecs[k].used) {
            fexecs[k] = (fexec_t){1, {0}};
            graph_bytes(i, fexecs[k].bytes, 0);
            *e = (CUgraphExec)E_HANDLE(k);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long f) { COUNT(); return instantiate(e, g); }
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) { COUNT(); return instantiate(e, g); }
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) { COUNT(); return instantiate(e, g); }
/* The CUDA 10/11 ABI: (exec, graph, error node, log buffer, its size). */
EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *en, char *log, size_t n) { COUNT(); return instantiate(e, g); }
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *en, char *log, size_t n) { COUNT(); return instantiate(e, g); }
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    COUNT(); NEED_INIT();
    uintptr_t v = (uintptr_t)e;
    int k = (int)((v - 0x700000) >> 8);
    if (v < 0x700000 || k >= FG_MAX || !fexecs[k].used) return CUDA_ERROR_INVALID_VALUE;
    fexecs[k].used = 0;
    return CUDA_SUCCESS;
}
/* Graph-pool bytes an instantiation of `e` needs on CUDA ordinal `dev` (used by graph_reserve). */
static uint64_t fake_exec_bytes(CUgraphExec e, int dev) {
    uintptr_t v = (uintptr_t)e;
    int k = (int)((v - 0x700000) >> 8);
    if (v < 0x700000 || k >= FG_MAX || !fexecs[k].used || dev < 0 || dev >= FAKE_MAX_DEV) return 0;
    return fexecs[k].bytes[dev];
}

/* Streams: handles, each in the context current when it was made (its work and its
 * cuMemAllocAsync memory go to that context's device); a capturing stream records
 * cuMemAllocAsync as allocation nodes. */
static _Atomic int next_stream;
static struct { uintptr_t s; int graph; } captures[16];
static struct { uintptr_t s, ctx; } stream_ctx[64];
static pthread_mutex_t smu = PTHREAD_MUTEX_INITIALIZER;
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int f) {
    COUNT(); NEED_INIT();
    if (!cur_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *s = (CUstream)(0x800000 + ((uintptr_t)++next_stream << 4));
    pthread_mutex_lock(&smu);
    for (int i = 0; i < 64; i++)
        if (!stream_ctx[i].s) { stream_ctx[i].s = (uintptr_t)*s; stream_ctx[i].ctx = cur_ctx; break; }
    pthread_mutex_unlock(&smu);
    return CUDA_SUCCESS;
}
/* The context of an explicit stream (0 when unknown); the NULL, legacy and per-thread streams
 * are the current context's. */
static uintptr_t ctx_of_stream(CUstream s) {
    uintptr_t v = (uintptr_t)s, c = 0;
    if (v == 0 || v == 0x1 || v == 0x2) return cur_ctx;
    pthread_mutex_lock(&smu);
    for (int i = 0; i < 64; i++)
        if (stream_ctx[i].s == v) c = stream_ctx[i].ctx;
    pthread_mutex_unlock(&smu);
    return c;
}
static int stream_dev(CUstream s) {
    uintptr_t c = ctx_of_stream(s);
    return c ? (int)(c & 0xf) : cur_dev;
}
EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *c) {
    COUNT(); NEED_INIT();
    uintptr_t v = ctx_of_stream(s);
    if (!v) return (uintptr_t)s > 0x2 ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_CONTEXT;
    *c = (CUcontext)v;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    COUNT(); NEED_INIT();
    pthread_mutex_lock(&smu);
    for (int i = 0; i < 64; i++)
        if (s && stream_ctx[i].s == (uintptr_t)s) stream_ctx[i].s = 0;
    pthread_mutex_unlock(&smu);
    return CUDA_SUCCESS;
}
static int capture_of(CUstream s) {
    for (int i = 0; i < 16; i++)
        if (s && captures[i].s == (uintptr_t)s) return i;
    return -1;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) {
    COUNT(); NEED_INIT();
    if (!s || capture_of(s) >= 0) return CUDA_ERROR_ILLEGAL_STATE; /* the legacy stream cannot capture */
    for (int i = 0; i < 16; i++)
        if (!captures[i].s) {
            int g = graph_new();
            if (g < 0) return CUDA_ERROR_OUT_OF_MEMORY;
            captures[i].s = (uintptr_t)s;
            captures[i].graph = g;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    COUNT(); NEED_INIT();
    int c = capture_of(s);
    if (c < 0) return CUDA_ERROR_ILLEGAL_STATE;
    *g = (CUgraph)G_HANDLE(captures[c].graph);
    captures[c].s = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) {
    COUNT();
    *st = capture_of(s) >= 0 ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
/* cuMemAllocAsync / cuMemFreeAsync on a capturing stream add nodes and take no memory: 1 when
 * `s` captures (then *p is the node's address). */
static int captured_alloc(CUstream s, uint64_t bytes, CUdeviceptr *p) {
    int c = capture_of(s);
    if (c < 0) return 0;
    CUDA_MEM_ALLOC_NODE_PARAMS prm;
    memset(&prm, 0, sizeof prm);
    prm.bytesize = bytes;
    prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prm.poolProps.location.id = cur_dev;
    prm.dptr = next_graph_va;
    next_graph_va += (bytes + 0xfffff) & ~0xfffffull;
    add_node(NULL, captures[c].graph, (fnode_t){CU_GRAPH_NODE_TYPE_MEM_ALLOC, bytes, cur_dev, -1});
    *p = prm.dptr;
    return 1;
}
static int captured_free(CUstream s) {
    int c = capture_of(s);
    if (c < 0) return 0;
    add_node(NULL, captures[c].graph, (fnode_t){CU_GRAPH_NODE_TYPE_MEM_FREE, 0, 0, -1});
    return 1;
}

/* ---------------- context limits ---------------- */
/* stack, printf FIFO, malloc heap, device-runtime sync depth, pending launch count */
static const uint64_t limit_default[5] = {1024, 1u << 20, 8u << 20, 2, 2048};
static uint64_t limit_val[5] = {1024, 1u << 20, 8u << 20, 2, 2048};
static uint64_t fake_sms(void) { const char *s = getenv("FAKE_SM_COUNT"); return s ? strtoull(s, NULL, 10) : 4; }
static uint64_t limit_bytes(int l, uint64_t v) {
    return l == CU_LIMIT_STACK_SIZE ? v * fake_sms() * 2048 : l == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT ? v << 10
           : l == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH ? 0 : v;
}
static uint64_t limit_taken[FAKE_MAX_DEV][5];
EXPORT CUresult cuCtxSetLimit(CUlimit l, size_t v) {
    COUNT(); NEED_INIT();
    if (cur_dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if ((int)l > 4) return CUDA_SUCCESS; /* other limits take no memory here */
    int p = visible[cur_dev];
    uint64_t def = limit_bytes(l, limit_default[l]), want = limit_bytes(l, v);
    uint64_t extra = want > def ? want - def : 0, have = limit_taken[p][l];
    if (extra > have) {
        uint64_t cap = fake_capacity(p), cur = atomic_load(&fake_phys()->used[p]);
        do {
            if (cur + extra - have > cap) return CUDA_ERROR_OUT_OF_MEMORY;
        } while (!atomic_compare_exchange_weak(&fake_phys()->used[p], &cur, cur + extra - have));
    } else {
        atomic_fetch_sub(&fake_phys()->used[p], have - extra);
    }
    limit_taken[p][l] = extra;
    limit_val[l] = v;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetLimit(size_t *v, CUlimit l) {
    COUNT(); NEED_INIT();
    *v = (int)l > 4 ? 0 : limit_val[l];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    COUNT(); NEED_INIT();
    if (d < 0 || d >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    *v = a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? (int)fake_sms()
         : a == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR ? 2048 : 0;
    return CUDA_SUCCESS;
}

/* ---------------- sizes of what an address belongs to ---------------- */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    COUNT(); NEED_INIT();
    if (p >= FAKE_IPC_WIN && (p - FAKE_IPC_WIN) / FAKE_IPC_STRIDE < FAKE_MAX_IPC) { /* an IPC import */
        uint64_t i = (p - FAKE_IPC_WIN) / FAKE_IPC_STRIDE;
        fake_ipc_t *e = &fake_phys()->ipc[i];
        if (e->state != 1 || p - FAKE_IPC_WIN - i * FAKE_IPC_STRIDE >= e->bytes) return CUDA_ERROR_NOT_FOUND;
        if (base) *base = FAKE_IPC_WIN + i * FAKE_IPC_STRIDE;
        if (size) *size = e->bytes;
        return CUDA_SUCCESS;
    }
    uint64_t key = p >= 0x4000000000ull && p < 0x5000000000ull ? p - 0x4000000000ull : p; /* a pool import */
    pthread_mutex_lock(&amu);
    for (alloc_t *a = allocs; a; a = a->next)
        if (key >= a->key && key - a->key < a->bytes) {
            if (base) *base = p - (key - a->key);
            if (size) *size = a->bytes;
            pthread_mutex_unlock(&amu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&amu);
    return CUDA_ERROR_NOT_FOUND;
}

/* Pool pointers shared between processes: the import maps the exporter's memory (no new memory),
 * at the address an IPC import would get; freeing it (cuMemFree*) unmaps it (phys_free). */
EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *d, CUdeviceptr p) {
    COUNT(); NEED_INIT();
    memset(d, 0, sizeof *d);
    memcpy(d->reserved, &p, sizeof p);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, CUmemPoolPtrExportData *d) {
    COUNT(); NEED_INIT();
    CUdeviceptr base;
    memcpy(&base, d->reserved, sizeof base);
    *p = base + 0x4000000000ull;
    return CUDA_SUCCESS;
}

#define FAKE_ESCAPE_PROCS \
    P(cuMemAddressReserve, 10020), P(cuMemAddressFree, 10020), P(cuMemMap, 10020), P(cuMemUnmap, 10020), \
    P(cuMemRetainAllocationHandle, 11000), P(cuMemExportToShareableHandle, 10020), \
    P(cuMemImportFromShareableHandle, 10020), P(cuMemGetAllocationPropertiesFromHandle, 10020), \
    P(cuGraphCreate, 10000), P(cuGraphDestroy, 10000), P(cuGraphAddMemAllocNode, 11040), \
    P(cuGraphAddMemFreeNode, 11040), P(cuGraphAddChildGraphNode, 10000), P(cuGraphGetNodes, 10000), \
    P(cuGraphNodeGetType, 10000), P(cuGraphMemAllocNodeGetParams, 11040), P(cuGraphChildGraphNodeGetGraph, 10000), \
    P(cuGraphInstantiate, 10000), P(cuGraphInstantiate_v2, 11000), P(cuGraphInstantiateWithFlags, 11040), \
    P(cuGraphInstantiateWithParams, 12000), P(cuGraphInstantiateWithParams_ptsz, 12000), \
    P(cuGraphExecDestroy, 10000), P(cuStreamCreate, 2000), P(cuStreamGetCtx, 9020), P(cuStreamBeginCapture_v2, 10010), \
    P(cuStreamEndCapture, 10000), P(cuStreamIsCapturing, 10000), P(cuCtxSetLimit, 3010), P(cuCtxGetLimit, 3010), \
    P(cuDeviceGetAttribute, 2000), P(cuMemGetAddressRange_v2, 3020), P(cuMemPoolExportPointer, 11020), \
    P(cuMemPoolImportPointer, 11020), P(cuMemMapArrayAsync, 11010), \
    P(cuMulticastCreate, 12010), P(cuMulticastBindMem, 12010), P(cuMulticastBindAddr, 12010), \
    P(cuMulticastUnbind, 12010),
