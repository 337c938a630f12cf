/*
 * cli_escapes.inc.c - part of t_cli (included by t_cli.c): the operations that walk the ways a
 * tenant could hold memory past its limit. Each prints one line "<op> <CUresult> [values]".
 *   vmmmap <vmm id> <bytes|0>   reserve a VA range and cuMemMap the handle (0: its whole size)
 *   vmmunmap <map id>           cuMemUnmap that mapping (also: free <map id>)
 *   vaddrfree <map id>          cuMemAddressFree the mapping's VA range (mappings left in place)
 *   vmmretain <map id>          cuMemRetainAllocationHandle at the mapping -> a vmm id
 *   vmmexport <vmm id>          cuMemExportToShareableHandle (POSIX fd) -> prints the fd
 *   vmmimport <fd>              cuMemImportFromShareableHandle -> a vmm id
 *   graphcreate                 -> graph id;  graphalloc <graph id> <bytes> (cuGraphAddMemAllocNode)
 *   graphchild <graph id> <child graph id>   cuGraphAddChildGraphNode
 *   instantiate <graph id> <flags|params|params_ptsz|v2|v1>   -> exec id
 *   execlaunch|execupload <exec id>;  execdestroy <exec id>
 *   streamcreate -> stream id; capture <stream id>; capalloc <stream id> <bytes> -> ptr id;
 *   capfree <stream id> <ptr id>; capend <stream id> -> graph id
 *   ipcexport <ptr id> <file>   cuIpcGetMemHandle; the handle's 64 bytes go to <file> (written, then renamed)
 *   ipcimport <file>            waits for <file>, cuIpcOpenMemHandle_v2 of the handle in it -> ptr id (free closes it)
 *   poolimport <ptr id>         cuMemPoolExportPointer + cuMemPoolImportPointer -> ptr id (cuMemFreeAsync frees it)
 *   sparse <w> <h> <d>          a sparse 3D float array -> array id (free <id> destroys it)
 *   arraymap <array id> <vmm id>   cuMemMapArrayAsync the handle into the array's mip tail
 *   arrayfmt <format> <channels> <w> <h>   cuArray3DCreate of any format (number) -> array id
 *   mccreate <bytes>            cuMulticastCreate -> vmm id (free <id> releases it)
 *   mcbind|mcunbind <mc id> <vmm id>   cuMulticastBindMem / cuMulticastUnbind of the whole handle
 *   mcbindaddr <mc id> <map id> cuMulticastBindAddr of a mapping
 *   setlimit <stack|printf|heap|pending> <value>   cuCtxSetLimit; prints the limit's value after it
 */
#undef cuStreamBeginCapture
#undef cuStreamEndCapture
#undef cuGraphInstantiate
#undef cuGraphInstantiateWithParams

static int escape_op(int argc, char **argv, int *pi) {
    int i = *pi;
    const char *op = argv[i];
    CUresult r = CUDA_SUCCESS;
    if (!strcmp(op, "vmmmap")) {
        int id = atoi(ARG(1));
        uint64_t sz = tu_size(ARG(2));
        i += 2;
        if (!sz) sz = ids[id].size;
        CUdeviceptr va = 0;
        r = cuMemAddressReserve(&va, sz, 0, 0, 0);
        if (!r) r = cuMemMap(va, sz, 0, (CUmemGenericAllocationHandle)ids[id].v, 0);
        int m = r ? -1 : add_id(K_VMAP, va);
        if (m >= 0) ids[m].size = sz;
        OUT("vmmmap %d %d", r, m);
    } else if (!strcmp(op, "vmmunmap")) {
        int id = atoi(ARG(1)); i++;
        OUT("vmmunmap %d", cuMemUnmap((CUdeviceptr)ids[id].v, ids[id].size));
    } else if (!strcmp(op, "vaddrfree")) {
        int id = atoi(ARG(1)); i++;
        OUT("vaddrfree %d", cuMemAddressFree((CUdeviceptr)ids[id].v, ids[id].size));
    } else if (!strcmp(op, "vmmretain")) {
        int id = atoi(ARG(1)); i++;
        CUmemGenericAllocationHandle h = 0;
        r = cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)(ids[id].v + 4096));
        OUT("vmmretain %d %d", r, r ? -1 : add_id(K_VMM, h));
    } else if (!strcmp(op, "vmmexport")) {
        int id = atoi(ARG(1)), fd = -1; i++;
        r = cuMemExportToShareableHandle(&fd, (CUmemGenericAllocationHandle)ids[id].v,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        OUT("vmmexport %d %d", r, fd);
    } else if (!strcmp(op, "vmmimport")) {
        int fd = atoi(ARG(1)); i++;
        CUmemGenericAllocationHandle h = 0;
        r = cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        OUT("vmmimport %d %d", r, r ? -1 : add_id(K_VMM, h));
    } else if (!strcmp(op, "graphcreate")) {
        CUgraph g = NULL;
        r = cuGraphCreate(&g, 0);
        OUT("graphcreate %d %d", r, r ? -1 : add_id(K_GRAPH, (uintptr_t)g));
    } else if (!strcmp(op, "graphalloc")) {
        int id = atoi(ARG(1));
        CUDA_MEM_ALLOC_NODE_PARAMS prm;
        memset(&prm, 0, sizeof prm);
        prm.bytesize = tu_size(ARG(2));
        prm.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prm.poolProps.location.id = 0;
        i += 2;
        CUgraphNode n;
        r = cuGraphAddMemAllocNode(&n, (CUgraph)(uintptr_t)ids[id].v, NULL, 0, &prm);
        OUT("graphalloc %d", r);
    } else if (!strcmp(op, "graphchild")) {
        int id = atoi(ARG(1)), child = atoi(ARG(2)); i += 2;
        CUgraphNode n;
        r = cuGraphAddChildGraphNode(&n, (CUgraph)(uintptr_t)ids[id].v, NULL, 0, (CUgraph)(uintptr_t)ids[child].v);
        OUT("graphchild %d", r);
    } else if (!strcmp(op, "instantiate")) {
        int id = atoi(ARG(1));
        const char *how = ARG(2);
        i += 2;
        CUgraph g = (CUgraph)(uintptr_t)ids[id].v;
        CUgraphExec e = NULL;
        typedef CUresult (*old_t)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
        if (!strcmp(how, "flags")) r = cuGraphInstantiateWithFlags(&e, g, 0);
        else if (!strcmp(how, "params") || !strcmp(how, "params_ptsz")) {
            CUDA_GRAPH_INSTANTIATE_PARAMS prm;
            memset(&prm, 0, sizeof prm);
            CUresult (*fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *) =
                (CUresult(*)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *))dlsym(
                    RTLD_DEFAULT, !strcmp(how, "params") ? "cuGraphInstantiateWithParams" : "cuGraphInstantiateWithParams_ptsz");
            r = fn(&e, g, &prm);
        } else {
            /* the CUDA 10/11 ABIs, by symbol name as an old program reaches them */
            old_t fn = (old_t)dlsym(RTLD_DEFAULT, !strcmp(how, "v2") ? "cuGraphInstantiate_v2" : "cuGraphInstantiate");
            r = fn(&e, g, NULL, NULL, 0);
        }
        OUT("instantiate %d %d", r, r ? -1 : add_id(K_EXEC, (uintptr_t)e));
    } else if (!strcmp(op, "execlaunch") || !strcmp(op, "execupload")) {
        int id = atoi(ARG(1)); i++;
        CUgraphExec e = (CUgraphExec)(uintptr_t)ids[id].v;
        r = !strcmp(op, "execlaunch") ? cuGraphLaunch(e, NULL) : cuGraphUpload(e, NULL);
        OUT("%s %d", op, r);
    } else if (!strcmp(op, "execdestroy")) {
        int id = atoi(ARG(1)); i++;
        OUT("execdestroy %d", cuGraphExecDestroy((CUgraphExec)(uintptr_t)ids[id].v));
    } else if (!strcmp(op, "streamcreate")) {
        CUstream s = NULL;
        r = cuStreamCreate(&s, 0);
        OUT("streamcreate %d %d", r, r ? -1 : add_id(K_STREAM, (uintptr_t)s));
    } else if (!strcmp(op, "capture")) {
        int id = atoi(ARG(1)); i++;
        OUT("capture %d", cuStreamBeginCapture_v2((CUstream)(uintptr_t)ids[id].v, CU_STREAM_CAPTURE_MODE_GLOBAL));
    } else if (!strcmp(op, "capalloc")) {
        int id = atoi(ARG(1));
        uint64_t b = tu_size(ARG(2));
        i += 2;
        CUdeviceptr p = 0;
        r = cuMemAllocAsync(&p, b, (CUstream)(uintptr_t)ids[id].v);
        OUT("capalloc %d %d", r, r ? -1 : add_id(K_ASYNC, p));
    } else if (!strcmp(op, "capfree")) {
        int id = atoi(ARG(1)), pid = atoi(ARG(2));
        i += 2;
        OUT("capfree %d", cuMemFreeAsync((CUdeviceptr)ids[pid].v, (CUstream)(uintptr_t)ids[id].v));
    } else if (!strcmp(op, "capend")) {
        int id = atoi(ARG(1)); i++;
        CUgraph g = NULL;
        r = cuStreamEndCapture((CUstream)(uintptr_t)ids[id].v, &g);
        OUT("capend %d %d", r, r ? -1 : add_id(K_GRAPH, (uintptr_t)g));
    } else if (!strcmp(op, "ipcexport")) {
        int id = atoi(ARG(1));
        const char *path = ARG(2);
        i += 2;
        CUipcMemHandle h;
        r = cuIpcGetMemHandle(&h, (CUdeviceptr)ids[id].v);
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = r ? NULL : fopen(tmp, "wb");
        if (f) {
            fwrite(&h, sizeof h, 1, f);
            fclose(f);
            rename(tmp, path);
        }
        OUT("ipcexport %d", r);
    } else if (!strcmp(op, "ipcimport")) {
        const char *path = ARG(1);
        i++;
        CUipcMemHandle h;
        FILE *f;
        while (!(f = fopen(path, "rb"))) usleep(200);
        size_t n = fread(&h, sizeof h, 1, f);
        fclose(f);
        CUdeviceptr p = 0;
        r = n == 1 ? cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) : CUDA_ERROR_INVALID_VALUE;
        OUT("ipcimport %d %d", r, r ? -1 : add_id(K_IPC, p));
    } else if (!strcmp(op, "poolimport")) {
        int id = atoi(ARG(1)); i++;
        CUmemPoolPtrExportData d;
        CUdeviceptr p = 0;
        r = cuMemPoolExportPointer(&d, (CUdeviceptr)ids[id].v);
        if (!r) r = cuMemPoolImportPointer(&p, NULL, &d);
        OUT("poolimport %d %d", r, r ? -1 : add_id(K_ASYNC, p));
    } else if (!strcmp(op, "sparse") || !strcmp(op, "arrayfmt")) {
        CUDA_ARRAY3D_DESCRIPTOR d;
        memset(&d, 0, sizeof d);
        if (!strcmp(op, "sparse")) {
            d.Format = CU_AD_FORMAT_FLOAT; d.NumChannels = 1; d.Flags = CUDA_ARRAY3D_SPARSE;
            d.Width = tu_size(ARG(1)); d.Height = tu_size(ARG(2)); d.Depth = tu_size(ARG(3));
        } else {
            d.Format = (CUarray_format)strtoul(ARG(1), NULL, 0); d.NumChannels = (unsigned)atoi(ARG(2));
            d.Width = tu_size(ARG(3)); d.Height = tu_size(ARG(4));
        }
        i += !strcmp(op, "sparse") ? 3 : 4;
        CUarray a = 0;
        r = cuArray3DCreate_v2(&a, &d);
        OUT("%s %d %d", op, r, r ? -1 : add_id(K_ARRAY, (uintptr_t)a));
    } else if (!strcmp(op, "arraymap")) {
        int id = atoi(ARG(1)), h = atoi(ARG(2));
        i += 2;
        CUarrayMapInfo mi;
        memset(&mi, 0, sizeof mi);
        mi.resourceType = CU_RESOURCE_TYPE_ARRAY;
        mi.resource.array = (CUarray)(uintptr_t)ids[id].v;
        mi.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL;
        mi.subresource.miptail.size = ids[h].size;
        mi.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
        mi.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
        mi.memHandle.memHandle = (CUmemGenericAllocationHandle)ids[h].v;
        OUT("arraymap %d", cuMemMapArrayAsync(&mi, 1, NULL));
    } else if (!strcmp(op, "mccreate")) {
        CUmulticastObjectProp prop;
        memset(&prop, 0, sizeof prop);
        prop.numDevices = 1;
        prop.size = tu_size(ARG(1)); i++;
        CUmemGenericAllocationHandle h = 0;
        r = cuMulticastCreate(&h, &prop);
        OUT("mccreate %d %d", r, r ? -1 : add_id(K_VMM, h));
    } else if (!strcmp(op, "mcbindaddr")) {
        int mc = atoi(ARG(1)), m = atoi(ARG(2));
        i += 2;
        OUT("mcbindaddr %d", cuMulticastBindAddr((CUmemGenericAllocationHandle)ids[mc].v, 0, (CUdeviceptr)ids[m].v,
                                                 ids[m].size, 0));
    } else if (!strcmp(op, "mcbind") || !strcmp(op, "mcunbind")) {
        int mc = atoi(ARG(1)), h = atoi(ARG(2));
        i += 2;
        if (!strcmp(op, "mcbind"))
            r = cuMulticastBindMem((CUmemGenericAllocationHandle)ids[mc].v, 0, (CUmemGenericAllocationHandle)ids[h].v, 0,
                                   ids[h].size, 0);
        else r = cuMulticastUnbind((CUmemGenericAllocationHandle)ids[mc].v, 0, 0, ids[h].size);
        OUT("%s %d", op, r);
    } else if (!strcmp(op, "setlimit")) {
        const char *which = ARG(1);
        CUlimit l = !strcmp(which, "stack") ? CU_LIMIT_STACK_SIZE
                    : !strcmp(which, "printf") ? CU_LIMIT_PRINTF_FIFO_SIZE
                    : !strcmp(which, "pending") ? CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT : CU_LIMIT_MALLOC_HEAP_SIZE;
        r = cuCtxSetLimit(l, tu_size(ARG(2)));
        i += 2;
        size_t now = 0;
        cuCtxGetLimit(&now, l);
        OUT("setlimit %d %zu", r, now);
    } else {
        return 0;
    }
    *pi = i;
    return 1;
}
