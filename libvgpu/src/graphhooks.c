/*
 * graphhooks.c - graph instantiation: the graph's memory-allocation nodes are summed
 * (graphmem.c) and an instantiation whose memory cannot fit under the limit is refused with
 * CUDA_ERROR_OUT_OF_MEMORY before the driver instantiates it; the footprint of the others is
 * kept for the checks at upload and launch (poolhooks.c, launchhooks.c).
 */
#include <cuda.h>
#include "config.h"
#include "graphmem.h"
#include "real.h"

#undef cuGraphInstantiate
#undef cuGraphInstantiateWithParams

#define INSTANTIATE(api, pexec, graph, realcall)                                      \
    do {                                                                              \
        uint64_t b_[GRAPHMEM_DEVS];                                                   \
        int mem_ = vgpu_graph_footprint((graph), b_);                                 \
        if (mem_ && vgpu_graph_fits(b_, api) != 0) return CUDA_ERROR_OUT_OF_MEMORY;   \
        CUresult rc_ = (realcall);                                                    \
        if (rc_ == CUDA_SUCCESS && mem_ && (pexec))                                   \
            vgpu_graph_exec_add((uint64_t)(uintptr_t)*(pexec), b_);                   \
        return rc_;                                                                   \
    } while (0)

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    INSTANTIATE("cuGraphInstantiateWithFlags", e, g,
                CALL_REAL(CUresult(*)(CUgraphExec *, CUgraph, unsigned long long), cuGraphInstantiateWithFlags, e, g,
                          flags));
}

typedef CUresult (*inst_params_t)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    INSTANTIATE("cuGraphInstantiateWithParams", e, g, CALL_REAL(inst_params_t, cuGraphInstantiateWithParams, e, g, p));
}
VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    INSTANTIATE("cuGraphInstantiateWithParams_ptsz", e, g,
                CALL_REAL(inst_params_t, cuGraphInstantiateWithParams_ptsz, e, g, p));
}

/* The CUDA 10/11 ABI (exec, graph, error node, log buffer, its size), kept by the driver for old
 * programs under both names. */
typedef CUresult (*inst_old_t)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
VGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n) {
    INSTANTIATE("cuGraphInstantiate", e, g, CALL_REAL(inst_old_t, cuGraphInstantiate, e, g, err, log, n));
}
VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n) {
    INSTANTIATE("cuGraphInstantiate_v2", e, g, CALL_REAL(inst_old_t, cuGraphInstantiate_v2, e, g, err, log, n));
}

VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    CUresult rc = CALL_REAL(CUresult(*)(CUgraphExec), cuGraphExecDestroy, e);
    if (rc == CUDA_SUCCESS) vgpu_graph_exec_remove((uint64_t)(uintptr_t)e);
    return rc;
}
