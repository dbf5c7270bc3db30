/* Live discovery of this machine: hwloc (CPU, NUMA, PCI tree, GPUs, NICs),
 * read through hwloc's own XML export so files and live machines share one
 * reader; then NVML by dlopen (names, memory, NVLinks, NVSwitches, PCIe common
 * ancestors); then an optional CUDA peer query a caller supplies. Every step is
 * optional and says at -v what it used and why. No GPU: a CPU topology. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cdp_config.h"
#include "partitioner/topology_internal.h"

#if CDP_HAVE_HWLOC
#include <hwloc.h>
#endif

/* ---- hwloc ------------------------------------------------------------------------- */

static cdp_status from_hwloc(struct cdp_topology **out, char *why, size_t cap)
{
#if CDP_HAVE_HWLOC
    hwloc_topology_t topo;
    char *xml = NULL;
    int len = 0;
    unsigned v = hwloc_get_api_version();
    if (hwloc_topology_init(&topo) != 0) {
        snprintf(why, cap, "hwloc_topology_init failed");
        return CDP_ERR_UNSUPPORTED;
    }
    /* I/O objects (GPUs, NICs, bridges) are dropped unless asked for. */
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (hwloc_topology_load(topo) != 0 || hwloc_topology_export_xmlbuffer(topo, &xml, &len, 0) != 0) {
        snprintf(why, cap, "hwloc %u.%u.%u could not read this machine", v >> 16, (v >> 8) & 0xff, v & 0xff);
        hwloc_topology_destroy(topo);
        return CDP_ERR_UNSUPPORTED;
    }
    /* hwloc's PCI plugin leaves libpciaccess's state allocated and unloads it
     * with the topology; keeping the (already loaded) library mapped keeps that
     * state reachable, so LeakSanitizer does not report it as our leak. */
    static void *pciaccess_pin;
    if (!pciaccess_pin) pciaccess_pin = dlopen("libpciaccess.so.0", RTLD_LAZY | RTLD_NOLOAD);
    struct cdp_xml *root = NULL;
    char name[64];
    snprintf(name, sizeof name, "this machine (hwloc API %u.%u)", v >> 16, (v >> 8) & 0xff);
    cdp_status st = cdp_xml_parse(xml, len > 0 ? (size_t)len - 1 : 0, name, &root);
    hwloc_free_xmlbuffer(topo, xml);
    hwloc_topology_destroy(topo);
    if (!st) st = cdp_topology_load_hwloc_xml(root, name, out);
    cdp_xml_free(root);
    if (!st && (st = cdp_topology_set_source(*out, "live discovery: %s", name))) {
        cdp_topology_free(*out);
        *out = NULL;
    }
    if (st) snprintf(why, cap, "%s", cdp_last_error());
    return st;
#else
    (void)out;
    snprintf(why, cap, "this build has no hwloc (-Dhwloc=disabled or not found at configure time)");
    return CDP_ERR_UNSUPPORTED;
#endif
}

/* Without hwloc: one NUMA node with every online CPU and the physical memory. */
static cdp_status from_sysconf(struct cdp_topology **out)
{
    cdp_status st;
    struct cdp_topology *t = calloc(1, sizeof *t);
    if (!t) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if ((st = cdp_topology_alloc(t, 1, 0, 1, 0, 0)) || (st = cdp_topology_node_alloc(&t->nodes[0], 0))) goto fail;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (cpus > 1) snprintf(t->numa[0].cpuset, sizeof t->numa[0].cpuset, "0-%ld", cpus - 1);
    else snprintf(t->numa[0].cpuset, sizeof t->numa[0].cpuset, "0");
    if (pages > 0 && psize > 0) t->numa[0].memory_bytes = (uint64_t)pages * (uint64_t)psize;
    if (gethostname(t->name, sizeof t->name - 1) != 0 || !t->name[0]) cdp_topology_copy_str(t->name, sizeof t->name, "localhost");
    cdp_topology_copy_str(t->nodes[0].name, sizeof t->nodes[0].name, t->name);
    if ((st = cdp_topology_set_source(t, "live (sysconf: %ld CPUs)", cpus))) goto fail;
    if ((st = cdp_topology_finalize(t, "live discovery"))) goto fail;
    *out = t;
    return CDP_OK;
fail:
    cdp_topology_free(t);
    return st;
}

/* ---- NVML ------------------------------------------------------------------------------ */

enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3 };
enum { NVML_DEV_GPU = 0, NVML_DEV_IBMNPU = 1, NVML_DEV_SWITCH = 2 };
#define NVML_NVLINK_MAX_LINKS 18

static const char *nvml_err(const struct cdp_nvml_api *api, int rc)
{
    const char *s = api->error_string ? api->error_string(rc) : NULL;
    return s ? s : "unknown NVML error";
}

/* bytes/s one direction per link for nvmlDeviceGetNvLinkVersion's value
 * (NVML_NVLINK_VERSION_1_0 = 1 ... 4_0 = 6, 5_0 = 7). */
static double nvlink_rate(unsigned version)
{
    if (version <= 1) return 20e9;
    if (version >= 7) return 50e9;
    return 25e9;
}

static int busid_eq(const char *a, const char *b)
{
    unsigned d1, b1, v1, f1, d2, b2, v2, f2;
    if (cdp_busid_parse(a, &d1, &b1, &v1, &f1) || cdp_busid_parse(b, &d2, &b2, &v2, &f2)) return 0;
    return d1 == d2 && b1 == b2 && v1 == v2 && f1 == f2;
}

static enum cdp_link_class ancestor_class(int level)
{
    switch (level) {
    case 0: /* INTERNAL: one board */
    case 10: return CDP_LINK_PIX;
    case 20: return CDP_LINK_PXB;
    case 30: return CDP_LINK_PHB;
    case 40: return CDP_LINK_NODE;
    default: return CDP_LINK_SYS;
    }
}

/* Builds PCIe paths and NUMA groups that reproduce NVML's common-ancestor
 * classes: [host bridge group, switch group, leaf switch group]. */
static void paths_from_classes(struct cdp_topology *t, const enum cdp_link_class *cls, int n)
{
    int *grp = malloc((size_t)n * 4 * sizeof *grp);
    if (!grp) return;
    enum cdp_link_class level[4] = {CDP_LINK_NODE, CDP_LINK_PHB, CDP_LINK_PXB, CDP_LINK_PIX};
    for (int l = 0; l < 4; l++) {
        for (int i = 0; i < n; i++) {
            grp[l * n + i] = i;
            for (int j = 0; j < i; j++)
                if (cls[(size_t)i * n + j] <= level[l] && cls[(size_t)i * n + j] >= CDP_LINK_PIX) {
                    grp[l * n + i] = grp[l * n + j];
                    break;
                }
        }
    }
    for (int i = 0; i < n; i++) {
        struct cdp_topology_gpu *g = &t->gpus[i];
        int pxb_size = 0;
        for (int j = 0; j < n; j++) pxb_size += grp[2 * n + j] == grp[2 * n + i];
        g->numa = grp[0 * n + i];
        g->cpuset[0] = '\0';
        g->pcie_depth = 0;
        g->pcie_path[g->pcie_depth++] = 1000 + grp[1 * n + i];
        if (pxb_size > 1) {
            g->pcie_path[g->pcie_depth++] = 2000 + grp[2 * n + i];
            g->pcie_path[g->pcie_depth++] = 3000 + grp[3 * n + i];
        }
    }
    free(grp);
}

cdp_status cdp_topology_apply_nvml(struct cdp_topology *t, const struct cdp_nvml_api *api)
{
    cdp_status st = CDP_OK;
    unsigned n = 0;
    int rc;
    if ((rc = api->init()) != NVML_SUCCESS)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "nvmlInit_v2: %s", nvml_err(api, rc));
    cdp_nvml_device *dev = NULL;
    struct cdp_topology_gpu *gpus = NULL;
    struct cdp_topology_nvswitch *sws = NULL;
    int nsw = 0, have_paths = 1;
    enum cdp_link_class *cls = NULL;
    if ((rc = api->device_count(&n)) != NVML_SUCCESS) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "nvmlDeviceGetCount_v2: %s", nvml_err(api, rc));
        goto done;
    }
    if (n == 0 || n > 1024) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "NVML sees %u GPUs", n);
        goto done;
    }
    dev = calloc(n, sizeof *dev);
    gpus = calloc(n, sizeof *gpus);
    cls = calloc((size_t)n * n, sizeof *cls);
    if (!dev || !gpus || !cls) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    double rate = 0;
    for (unsigned i = 0; i < n; i++) {
        struct cdp_nvml_pci_info pci;
        struct cdp_nvml_memory mem;
        if ((rc = api->device_by_index(i, &dev[i])) != NVML_SUCCESS ||
            (rc = api->device_pci(dev[i], &pci)) != NVML_SUCCESS) {
            st = cdp_fail(CDP_ERR_UNSUPPORTED, "NVML GPU %u: %s", i, nvml_err(api, rc));
            goto done;
        }
        struct cdp_topology_gpu *g = &gpus[i];
        g->numa = -1;
        for (int k = 0; k < t->n_gpus; k++)
            if (busid_eq(t->gpus[k].pci_bus_id, pci.bus_id)) *g = t->gpus[k];
        if (!g->pcie_depth) have_paths = 0;
        g->index = g->local = (int)i;
        g->node = 0;
        cdp_busid_normalize(pci.bus_id, g->pci_bus_id, sizeof g->pci_bus_id);
        char name[96];
        if (api->device_name(dev[i], name, sizeof name) == NVML_SUCCESS) {
            name[sizeof name - 1] = '\0';
            cdp_topology_copy_str(g->name, sizeof g->name, name);
            g->peak_fp32 = g->peak_tf32 = g->peak_bf16 = 0; /* refilled from the real name */
        }
        if (api->device_memory && api->device_memory(dev[i], &mem) == NVML_SUCCESS) g->memory_bytes = mem.total;
    }
    for (unsigned i = 0; i < n; i++) {
        for (unsigned j = 0; j < n; j++) {
            int level = 50;
            cls[(size_t)i * n + j] = CDP_LINK_SYS;
            if (i != j && api->common_ancestor && api->common_ancestor(dev[i], dev[j], &level) == NVML_SUCCESS)
                cls[(size_t)i * n + j] = ancestor_class(level);
        }
    }
    struct cdp_topology_node *nd = &t->nodes[0];
    if ((st = cdp_topology_node_alloc(nd, (int)n))) goto done;
    int links_total = 0;
    for (unsigned i = 0; i < n; i++) {
        for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
            int active = 0;
            rc = api->nvlink_state(dev[i], l, &active);
            if (rc == NVML_ERROR_INVALID_ARGUMENT || rc == NVML_ERROR_NOT_SUPPORTED) break; /* past the last link */
            if (rc != NVML_SUCCESS || !active) continue;
            unsigned ver = 0;
            if (api->nvlink_version && api->nvlink_version(dev[i], l, &ver) == NVML_SUCCESS && rate == 0)
                rate = nvlink_rate(ver);
            struct cdp_nvml_pci_info rp;
            if (api->nvlink_remote_pci(dev[i], l, &rp) != NVML_SUCCESS) continue;
            int type = -1;
            if (api->nvlink_remote_type && api->nvlink_remote_type(dev[i], l, &type) != NVML_SUCCESS) type = -1;
            int peer = -1;
            for (unsigned j = 0; j < n; j++)
                if (j != i && busid_eq(gpus[j].pci_bus_id, rp.bus_id)) peer = (int)j;
            if (type == NVML_DEV_IBMNPU) continue; /* an NVLink to a POWER CPU */
            if (peer >= 0 && type != NVML_DEV_SWITCH) {
                nd->nvlink_direct[(size_t)i * n + peer]++;
                links_total++;
                continue;
            }
            if (type == NVML_DEV_SWITCH || (type < 0 && peer < 0)) {
                char b[CDP_TOPOLOGY_BUSID_MAX];
                cdp_busid_normalize(rp.bus_id, b, sizeof b);
                int s = -1;
                for (int q = 0; q < nsw; q++)
                    if (!strcmp(sws[q].pci_bus_id, b)) s = q;
                if (s < 0) {
                    struct cdp_topology_nvswitch *p = realloc(sws, (size_t)(nsw + 1) * sizeof *p);
                    if (!p) {
                        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                        goto done;
                    }
                    sws = p;
                    memset(&sws[nsw], 0, sizeof *sws);
                    cdp_topology_copy_str(sws[nsw].pci_bus_id, sizeof sws[nsw].pci_bus_id, b);
                    snprintf(sws[nsw].name, sizeof sws[nsw].name, "nvswitch%d", nsw);
                    if ((st = cdp_topology_switch_alloc(&sws[nsw], (int)n))) {
                        nsw++;
                        goto done;
                    }
                    s = nsw++;
                }
                sws[s].gpu_links[i]++;
                links_total++;
            }
        }
    }
    /* Each side counts its own links; keep the matrix symmetric. */
    for (unsigned i = 0; i < n; i++)
        for (unsigned j = i + 1; j < n; j++) {
            int a = nd->nvlink_direct[(size_t)i * n + j], b = nd->nvlink_direct[(size_t)j * n + i];
            if (a != b) CDP_INFO(TOPO, "NVML: GPU %u counts %d NVLinks to GPU %u, which counts %d back", i, a, j, b);
            nd->nvlink_direct[(size_t)i * n + j] = nd->nvlink_direct[(size_t)j * n + i] = a > b ? a : b;
        }
    if (rate > 0) nd->nvlink_bw = rate;
    for (int q = 0; q < t->n_nvswitches; q++) free(t->nvswitches[q].gpu_links);
    free(t->nvswitches);
    t->nvswitches = sws;
    t->n_nvswitches = nsw;
    sws = NULL;
    nsw = 0;
    free(t->gpus);
    t->gpus = gpus;
    t->n_gpus = (int)n;
    gpus = NULL;
    if (!have_paths) paths_from_classes(t, cls, (int)n);
    CDP_INFO(TOPO, "NVML: %u GPUs, %d active NVLinks at %.0f GB/s, %d NVSwitches; PCIe classes from %s", n,
             links_total, nd->nvlink_bw / 1e9, t->n_nvswitches,
             have_paths ? "hwloc's PCI tree" : "nvmlDeviceGetTopologyCommonAncestor");
done:
    for (int q = 0; q < nsw; q++) free(sws[q].gpu_links);
    free(sws);
    free(gpus);
    free(dev);
    free(cls);
    api->shutdown();
    return st;
}

struct nvml_lib {
    void *h;
    struct cdp_nvml_api api;
};

static int load_nvml(struct nvml_lib *L, char *why, size_t cap)
{
    const char *lib = "libnvidia-ml.so.1";
    L->h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!L->h) {
        const char *e = dlerror();
        snprintf(why, cap, "%s", e ? e : lib);
        return -1;
    }
    struct {
        void **slot;
        const char *sym;
        int required;
    } syms[] = {
        {(void **)&L->api.init, "nvmlInit_v2", 1},
        {(void **)&L->api.shutdown, "nvmlShutdown", 1},
        {(void **)&L->api.error_string, "nvmlErrorString", 0},
        {(void **)&L->api.device_count, "nvmlDeviceGetCount_v2", 1},
        {(void **)&L->api.device_by_index, "nvmlDeviceGetHandleByIndex_v2", 1},
        {(void **)&L->api.device_name, "nvmlDeviceGetName", 1},
        {(void **)&L->api.device_memory, "nvmlDeviceGetMemoryInfo", 0},
        {(void **)&L->api.device_pci, "nvmlDeviceGetPciInfo_v3", 1},
        {(void **)&L->api.nvlink_state, "nvmlDeviceGetNvLinkState", 1},
        {(void **)&L->api.nvlink_version, "nvmlDeviceGetNvLinkVersion", 0},
        {(void **)&L->api.nvlink_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2", 1},
        {(void **)&L->api.nvlink_remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType", 0},
        {(void **)&L->api.common_ancestor, "nvmlDeviceGetTopologyCommonAncestor", 0},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(L->h, syms[i].sym);
        if (!*syms[i].slot && syms[i].required) {
            snprintf(why, cap, "%s has no %s (driver too old?)", lib, syms[i].sym);
            dlclose(L->h);
            L->h = NULL;
            return -1;
        }
    }
    return 0;
}

/* ---- the whole discovery ----------------------------------------------------------------- */

cdp_status cdp_topology_discover(const struct cdp_discover_options *opts, struct cdp_topology **out)
{
    struct cdp_discover_options o = {0};
    if (opts) o = *opts;
    struct cdp_topology *t = NULL;
    char why[1024] = "";
    cdp_status st;
    if (o.no_hwloc) {
        snprintf(why, sizeof why, "not asked for");
        st = CDP_ERR_UNSUPPORTED;
    } else {
        st = from_hwloc(&t, why, sizeof why);
    }
    if (st == CDP_ERR_NOMEM) return st;
    if (st) {
        CDP_INFO(TOPO, "live discovery: hwloc not used (%s); one NUMA node with every online CPU", why);
        if ((st = from_sysconf(&t))) return st;
    } else {
        int ng = t->n_gpus;
        CDP_INFO(TOPO, "live discovery: hwloc: %d NUMA node%s, %d NVIDIA GPU%s (vendor 0x10de, class 0x03xx), "
                 "%d NIC%s on the PCI bus", t->n_numa, t->n_numa == 1 ? "" : "s", ng, ng == 1 ? "" : "s",
                 t->n_nics, t->n_nics == 1 ? "" : "s");
    }
    if (o.cpu_only && t->n_gpus > 0) { /* their PCI devices stay out of a CPU topology */
        CDP_INFO(TOPO, "live discovery: %d GPU%s left out (a CPU topology was asked for)", t->n_gpus,
                 t->n_gpus == 1 ? "" : "s");
        t->n_gpus = 0;
    }
    if (o.no_nvml || o.cpu_only) {
        CDP_INFO(TOPO, "live discovery: NVML not tried (%s)", o.no_nvml ? "asked not to" : "a CPU topology");
    } else {
        struct nvml_lib L = {0};
        if (load_nvml(&L, why, sizeof why) != 0) {
            CDP_INFO(TOPO, "live discovery: NVML not loaded (%s): no NVLink information%s", why,
                     t->n_gpus ? "; GPU links from the PCI tree" : "");
        } else {
            cdp_status nst = cdp_topology_apply_nvml(t, &L.api);
            if (nst == CDP_ERR_NOMEM) {
                dlclose(L.h);
                cdp_topology_free(t);
                return nst;
            }
            if (nst) CDP_INFO(TOPO, "live discovery: NVML loaded but not used: %s", cdp_last_error());
            dlclose(L.h);
            if ((st = cdp_topology_finalize(t, "live discovery"))) {
                cdp_topology_free(t);
                return st;
            }
        }
    }
    if (t->n_gpus > 0 && o.cuda_p2p) {
        int peers = 0;
        for (int a = 0; a < t->n_gpus; a++)
            for (int b = 0; b < t->n_gpus; b++) {
                int can = 0, rank = 0;
                if (a != b && o.cuda_p2p(o.cuda_ctx, a, b, &can, &rank) == 0 && can) peers++;
            }
        CDP_INFO(TOPO, "live discovery: CUDA reports %d peer-capable GPU pairs (used as a check only: "
                 "classes come from hwloc and NVML)", peers / 2);
    } else if (t->n_gpus > 0) {
        CDP_INFO(TOPO, "live discovery: no CUDA peer query supplied (the planner never opens a device)");
    }
    if (t->n_gpus == 0) {
        double bw = o.cpu_copy_bw > 0 ? o.cpu_copy_bw : CDP_TOPOLOGY_DEFAULT_COPY_BW;
        if ((st = cdp_topology_make_cpu(t, o.cpu_devices, bw)) || (st = cdp_topology_finalize(t, "live discovery"))) {
            cdp_topology_free(t);
            return st;
        }
        CDP_INFO(TOPO, "live discovery: no GPU found; a CPU topology of %d device%s (%s), %.0f GB/s copies "
                 "between them", t->n_gpus, t->n_gpus == 1 ? "" : "s",
                 o.cpu_devices > 0 ? "as asked" : "one per NUMA node", bw / 1e9);
    }
    *out = t;
    return CDP_OK;
}
