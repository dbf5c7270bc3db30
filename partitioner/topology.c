/* The topology model: allocation, the checks and derivations every loader
 * shares (link classes from PCIe paths and NVLinks), CPU and cluster
 * topologies, links, equality, GPU facts, and CPU-set/rate/bus-id helpers. */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "partitioner/topology_internal.h"

void cdp_topology_copy_str(char *dst, size_t cap, const char *src)
{
    if (!cap) return;
    if (!src) src = "";
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- GPU facts ------------------------------------------------------------------ */

/* Dense peaks from NVIDIA's data sheets (the starred sparse figures halved);
 * 0 = the format is not supported by the GPU. Order matters: first match wins. */
static const struct cdp_gpu_facts gpu_facts[] = {
    {"H200", 141000000000ull, 67e12, 494.5e12, 989.5e12, 25e9},
    {"H100 PCIe", 80ull << 30, 51e12, 378e12, 756e12, 25e9},
    {"H100", 80ull << 30, 67e12, 494.5e12, 989.5e12, 25e9},
    {"A100-PCIE-40GB", 40ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"A100 80GB PCIe", 80ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"A100-SXM4-40GB", 40ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"A100", 80ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"V100-SXM3", 32ull << 30, 15.7e12, 0, 0, 25e9},
    {"V100-SXM2-32GB", 32ull << 30, 15.7e12, 0, 0, 25e9},
    {"V100-SXM2", 16ull << 30, 15.7e12, 0, 0, 25e9},
    {"V100", 16ull << 30, 14e12, 0, 0, 25e9},
    {"P100-SXM2", 16ull << 30, 10.6e12, 0, 0, 20e9},
    {"P100-PCIE-12GB", 12ull << 30, 9.3e12, 0, 0, 20e9},
    {"P100", 16ull << 30, 9.3e12, 0, 0, 20e9},
    {"T4", 16ull << 30, 8.1e12, 0, 0, 25e9},
    {"L40S", 48ull << 30, 91.6e12, 183e12, 362e12, 25e9},
    {NULL, 0, 0, 0, 0, 0},
};

const struct cdp_gpu_facts *cdp_gpu_facts_find(const char *name)
{
    if (!name || !*name) return NULL;
    for (const struct cdp_gpu_facts *f = gpu_facts; f->match; f++)
        if (strstr(name, f->match)) return f;
    return NULL;
}

/* From the PCI ID database (pci-ids.ucw.cz), the data-centre GPUs the presets use. */
const char *cdp_gpu_name_by_pci_id(unsigned device)
{
    static const struct { unsigned id; const char *name; } ids[] = {
        {0x15f7, "Tesla P100-PCIE-12GB"}, {0x15f8, "Tesla P100-PCIE-16GB"},
        {0x15f9, "Tesla P100-SXM2-16GB"}, {0x1db1, "Tesla V100-SXM2-16GB"},
        {0x1db4, "Tesla V100-PCIE-16GB"}, {0x1db5, "Tesla V100-SXM2-32GB"},
        {0x1db8, "Tesla V100-SXM3-32GB"}, {0x1eb8, "Tesla T4"},
        {0x20b0, "NVIDIA A100-SXM4-40GB"}, {0x20b2, "NVIDIA A100-SXM4-80GB"},
        {0x20b5, "NVIDIA A100 80GB PCIe"}, {0x20f1, "NVIDIA A100-PCIE-40GB"},
        {0x2330, "NVIDIA H100 80GB HBM3"}, {0x2331, "NVIDIA H100 PCIe"},
        {0x2335, "NVIDIA H200"},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].id == device) return ids[i].name;
    return NULL;
}

double cdp_topology_class_latency(enum cdp_link_class c)
{
    /* Small-message one-way estimates; the planner only compares them. */
    static const double lat[] = {
        [CDP_LINK_SELF] = 0,       [CDP_LINK_NVLINK] = 2e-6, [CDP_LINK_NVSWITCH] = 2.5e-6,
        [CDP_LINK_PIX] = 4e-6,     [CDP_LINK_PXB] = 5e-6,    [CDP_LINK_PHB] = 6e-6,
        [CDP_LINK_NODE] = 7e-6,    [CDP_LINK_SYS] = 10e-6,   [CDP_LINK_MEM] = 1e-6,
        [CDP_LINK_NET] = CDP_TOPOLOGY_DEFAULT_NET_LATENCY,
    };
    CDP_TABLE_CHECK(lat, CDP_LINK_CLASS_COUNT);
    return (unsigned)c < CDP_LINK_CLASS_COUNT ? lat[c] : 0;
}

const char *cdp_link_class_name(enum cdp_link_class c)
{
    static const char *const names[] = {
        [CDP_LINK_SELF] = "X",     [CDP_LINK_NVLINK] = "NV", [CDP_LINK_NVSWITCH] = "NV",
        [CDP_LINK_PIX] = "PIX",    [CDP_LINK_PXB] = "PXB",   [CDP_LINK_PHB] = "PHB",
        [CDP_LINK_NODE] = "NODE",  [CDP_LINK_SYS] = "SYS",   [CDP_LINK_MEM] = "MEM",
        [CDP_LINK_NET] = "NET",
    };
    CDP_TABLE_CHECK(names, CDP_LINK_CLASS_COUNT);
    return (unsigned)c < CDP_LINK_CLASS_COUNT ? names[c] : "?";
}

const char *cdp_topology_link_label(const struct cdp_topology_link *l, char *buf, size_t cap)
{
    if (l->cls == CDP_LINK_NVLINK || l->cls == CDP_LINK_NVSWITCH)
        snprintf(buf, cap, "NV%d", l->nvlinks);
    else
        snprintf(buf, cap, "%s", cdp_link_class_name(l->cls));
    return buf;
}

/* ---- allocation ------------------------------------------------------------------- */

cdp_status cdp_topology_alloc(struct cdp_topology *t, int n_nodes, int n_gpus, int n_numa,
                          int n_nvswitches, int n_nics)
{
    t->n_nodes = n_nodes;
    t->n_gpus = n_gpus;
    t->n_numa = n_numa;
    t->n_nvswitches = n_nvswitches;
    t->n_nics = n_nics;
    t->nodes = calloc(n_nodes > 0 ? (size_t)n_nodes : 1, sizeof *t->nodes);
    t->gpus = calloc(n_gpus > 0 ? (size_t)n_gpus : 1, sizeof *t->gpus);
    t->numa = calloc(n_numa > 0 ? (size_t)n_numa : 1, sizeof *t->numa);
    t->nvswitches = calloc(n_nvswitches > 0 ? (size_t)n_nvswitches : 1, sizeof *t->nvswitches);
    t->nics = calloc(n_nics > 0 ? (size_t)n_nics : 1, sizeof *t->nics);
    if (!t->nodes || !t->gpus || !t->numa || !t->nvswitches || !t->nics)
        return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    for (int i = 0; i < n_gpus; i++) t->gpus[i].numa = -1;
    for (int i = 0; i < n_nics; i++) t->nics[i].numa = -1;
    return CDP_OK;
}

cdp_status cdp_topology_node_alloc(struct cdp_topology_node *nd, int n)
{
    size_t nn = n > 0 ? (size_t)n * (size_t)n : 1;
    free(nd->nvlink_direct);
    free(nd->link_class);
    free(nd->nvlinks);
    free(nd->bandwidth);
    free(nd->latency);
    nd->nvlink_direct = calloc(nn, sizeof *nd->nvlink_direct);
    nd->link_class = calloc(nn, sizeof *nd->link_class);
    nd->nvlinks = calloc(nn, sizeof *nd->nvlinks);
    nd->bandwidth = calloc(nn, sizeof *nd->bandwidth);
    nd->latency = calloc(nn, sizeof *nd->latency);
    nd->n_gpus = n;
    if (!nd->nvlink_direct || !nd->link_class || !nd->nvlinks || !nd->bandwidth || !nd->latency)
        return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    return CDP_OK;
}

cdp_status cdp_topology_switch_alloc(struct cdp_topology_nvswitch *sw, int n)
{
    free(sw->gpu_links);
    sw->gpu_links = calloc(n > 0 ? (size_t)n : 1, sizeof *sw->gpu_links);
    return sw->gpu_links ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
}

cdp_status cdp_topology_set_source(struct cdp_topology *t, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    free(t->source);
    t->source = strdup(buf);
    return t->source ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
}

void cdp_topology_free(struct cdp_topology *t)
{
    if (!t) return;
    for (int i = 0; t->nodes && i < t->n_nodes; i++) {
        struct cdp_topology_node *nd = &t->nodes[i];
        free(nd->nvlink_direct);
        free(nd->link_class);
        free(nd->nvlinks);
        free(nd->bandwidth);
        free(nd->latency);
    }
    for (int i = 0; t->nvswitches && i < t->n_nvswitches; i++) free(t->nvswitches[i].gpu_links);
    free(t->nodes);
    free(t->gpus);
    free(t->numa);
    free(t->nvswitches);
    free(t->nics);
    free(t->source);
    free(t);
}

/* ---- finalize: checks, defaults, derived matrices --------------------------------------- */

/* 0 (not given) or a finite value in [lo, hi]; else an error naming the
 * source, the place and the reader's attribute. */
static cdp_status check_range(const char *what, const char *place, const char *attr, double v, double lo, double hi,
                              const char *unit)
{
    if (v == 0 || (isfinite(v) && v >= lo && v <= hi)) return CDP_OK;
    return cdp_fail(CDP_ERR_INVALID, "%s: %s: %s %.17g %s: expected 0 (not given) or from %g to %g %s", what, place,
                    attr, v, unit, lo, hi, unit);
}

static cdp_status check_rate(const char *what, const char *place, const char *attr, double v)
{
    return check_range(what, place, attr, v, CDP_TOPOLOGY_RATE_MIN, CDP_TOPOLOGY_RATE_MAX, "bytes/s");
}

static const struct cdp_topology_attr_names model_names = {"NVLink bandwidth", "SYS bandwidth", "copy bandwidth",
                                                       "PCIe bandwidth", "peak FLOP/s", "NIC rate",
                                                       "network NIC rate", "network latency"};

cdp_status cdp_topology_finalize(struct cdp_topology *t, const char *what)
{
    return cdp_topology_finalize_named(t, what, NULL);
}

static enum cdp_link_class pcie_class(const struct cdp_topology_gpu *a, const struct cdp_topology_gpu *b)
{
    int c = 0;
    while (c < a->pcie_depth && c < b->pcie_depth && a->pcie_path[c] == b->pcie_path[c]) c++;
    if (c >= 2) return (c == a->pcie_depth && c == b->pcie_depth) ? CDP_LINK_PIX : CDP_LINK_PXB;
    if (c == 1) return CDP_LINK_PHB;
    return (a->numa >= 0 && a->numa == b->numa) ? CDP_LINK_NODE : CDP_LINK_SYS;
}

static cdp_status derive_node(struct cdp_topology *t, int k)
{
    struct cdp_topology_node *nd = &t->nodes[k];
    int n = nd->n_gpus;
    int *sw_links = calloc(n > 0 ? (size_t)n : 1, sizeof *sw_links);
    if (!sw_links) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    for (int s = 0; s < t->n_nvswitches; s++)
        if (t->nvswitches[s].node == k)
            for (int i = 0; i < n; i++) sw_links[i] += t->nvswitches[s].gpu_links[i];
    for (int i = 0; i < n; i++) {
        const struct cdp_topology_gpu *a = &t->gpus[nd->first_gpu + i];
        for (int j = 0; j < n; j++) {
            const struct cdp_topology_gpu *b = &t->gpus[nd->first_gpu + j];
            size_t ij = (size_t)i * (size_t)n + (size_t)j;
            enum cdp_link_class cls;
            int links = 0;
            double bw;
            if (i == j) {
                cls = CDP_LINK_SELF;
                bw = 0;
            } else if (t->kind == CDP_TOPOLOGY_CPU) {
                cls = CDP_LINK_MEM;
                bw = nd->copy_bw;
            } else {
                int sw = sw_links[i] < sw_links[j] ? sw_links[i] : sw_links[j];
                int direct = nd->nvlink_direct[ij];
                links = sw + direct;
                if (sw > 0) {
                    cls = CDP_LINK_NVSWITCH;
                } else if (direct > 0) {
                    cls = CDP_LINK_NVLINK;
                } else {
                    cls = pcie_class(a, b);
                }
                if (links > 0) {
                    bw = links * nd->nvlink_bw;
                } else {
                    bw = a->pcie_bw < b->pcie_bw ? a->pcie_bw : b->pcie_bw;
                    if (cls == CDP_LINK_SYS && nd->sys_bw > 0 && nd->sys_bw < bw) bw = nd->sys_bw;
                }
            }
            nd->link_class[ij] = cls;
            nd->nvlinks[ij] = links;
            nd->bandwidth[ij] = bw;
            nd->latency[ij] = cdp_topology_class_latency(cls);
        }
    }
    free(sw_links);
    return CDP_OK;
}

static cdp_status ensure_numa(struct cdp_topology *t, int node, int os_index)
{
    for (int i = 0; i < t->n_numa; i++)
        if (t->numa[i].node == node && t->numa[i].os_index == os_index) return CDP_OK;
    struct cdp_topology_numa *p = realloc(t->numa, (size_t)(t->n_numa + 1) * sizeof *p);
    if (!p) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    t->numa = p;
    memset(&p[t->n_numa], 0, sizeof *p);
    p[t->n_numa].node = node;
    p[t->n_numa].os_index = os_index;
    t->n_numa++;
    return CDP_OK;
}

static int numa_cmp(const void *x, const void *y)
{
    const struct cdp_topology_numa *a = x, *b = y;
    if (a->node != b->node) return a->node < b->node ? -1 : 1;
    return (a->os_index > b->os_index) - (a->os_index < b->os_index);
}

static const struct cdp_topology_numa *find_numa(const struct cdp_topology *t, int node, int os_index)
{
    for (int i = 0; i < t->n_numa; i++)
        if (t->numa[i].node == node && t->numa[i].os_index == os_index) return &t->numa[i];
    return NULL;
}

cdp_status cdp_topology_finalize_named(struct cdp_topology *t, const char *what, const struct cdp_topology_attr_names *an)
{
    cdp_status st;
    char place[96];
    struct cdp_topology_attr_names nm = model_names;
    if (an) {
        if (an->nvlink) nm.nvlink = an->nvlink;
        if (an->sys) nm.sys = an->sys;
        if (an->copy) nm.copy = an->copy;
        if (an->pcie) nm.pcie = an->pcie;
        if (an->flops) nm.flops = an->flops;
        if (an->nic) nm.nic = an->nic;
        if (an->net_rate) nm.net_rate = an->net_rate;
        if (an->net_latency) nm.net_latency = an->net_latency;
    }
    if (t->n_nodes < 1) return cdp_fail(CDP_ERR_INVALID, "%s: no machine described", what);
    int seen = 0;
    for (int k = 0; k < t->n_nodes; k++) {
        struct cdp_topology_node *nd = &t->nodes[k];
        if (nd->first_gpu != seen || nd->n_gpus < 0)
            return cdp_fail(CDP_ERR_INTERNAL, "%s: node %d: device range broken", what, k);
        seen += nd->n_gpus;
        snprintf(place, sizeof place, "node %d (%s)", k, nd->name);
        if ((st = check_rate(what, place, nm.nvlink, nd->nvlink_bw)) || (st = check_rate(what, place, nm.sys, nd->sys_bw)) ||
            (st = check_rate(what, place, nm.copy, nd->copy_bw)))
            return st;
        if (nd->nvlink_bw == 0) nd->nvlink_bw = CDP_TOPOLOGY_DEFAULT_NVLINK_BW;
        if (t->kind == CDP_TOPOLOGY_CPU && nd->copy_bw == 0) nd->copy_bw = CDP_TOPOLOGY_DEFAULT_COPY_BW;
        int n = nd->n_gpus;
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) {
                int v = nd->nvlink_direct[(size_t)i * n + j], w = nd->nvlink_direct[(size_t)j * n + i];
                if (v < 0)
                    return cdp_fail(CDP_ERR_INVALID, "%s: GPU %d - GPU %d: negative NVLink count %d", what,
                                    nd->first_gpu + i, nd->first_gpu + j, v);
                if (i == j && v)
                    return cdp_fail(CDP_ERR_INVALID, "%s: GPU %d has NVLinks to itself", what, nd->first_gpu + i);
                if (v != w)
                    return cdp_fail(CDP_ERR_INVALID, "%s: GPU %d - GPU %d: %d NVLinks one way but %d the other",
                                    what, nd->first_gpu + i, nd->first_gpu + j, v, w);
            }
        }
    }
    if (seen != t->n_gpus) return cdp_fail(CDP_ERR_INTERNAL, "%s: devices and nodes disagree", what);
    for (int s = 0; s < t->n_nvswitches; s++) {
        struct cdp_topology_nvswitch *sw = &t->nvswitches[s];
        if (sw->node < 0 || sw->node >= t->n_nodes)
            return cdp_fail(CDP_ERR_INVALID, "%s: NVSwitch %d: no node %d", what, s, sw->node);
        for (int i = 0; i < t->nodes[sw->node].n_gpus; i++)
            if (sw->gpu_links[i] < 0)
                return cdp_fail(CDP_ERR_INVALID, "%s: NVSwitch %d: negative link count %d to GPU %d", what, s,
                                sw->gpu_links[i], t->nodes[sw->node].first_gpu + i);
        if (!sw->name[0]) snprintf(sw->name, sizeof sw->name, "nvswitch%d", s);
        if (!sw->pci_bus_id[0]) snprintf(sw->pci_bus_id, sizeof sw->pci_bus_id, "%04x:%02x:00.0", 0x200 + s / 256, s % 256);
    }
    for (int i = 0; i < t->n_nics; i++) {
        struct cdp_topology_nic *c = &t->nics[i];
        snprintf(place, sizeof place, "NIC %d (%s)", i, c->name);
        if ((st = check_rate(what, place, nm.nic, c->rate))) return st;
        if (c->node < 0 || c->node >= t->n_nodes)
            return cdp_fail(CDP_ERR_INVALID, "%s: NIC %d: no node %d", what, i, c->node);
        if (!c->name[0]) snprintf(c->name, sizeof c->name, "nic%d", i);
        if (!c->pci_bus_id[0] && t->kind == CDP_TOPOLOGY_GPU)
            snprintf(c->pci_bus_id, sizeof c->pci_bus_id, "%04x:%02x:00.0", 0x300 + i / 256, i % 256);
    }
    if ((st = check_rate(what, "network", nm.net_rate, t->network.nic_rate)) ||
        (st = check_range(what, "network", nm.net_latency, t->network.latency, CDP_TOPOLOGY_LATENCY_MIN,
                          CDP_TOPOLOGY_LATENCY_MAX, "s")))
        return st;
    if (t->network.nics_per_node < 0)
        return cdp_fail(CDP_ERR_INVALID, "%s: network: NIC count %d must be non-negative", what,
                        t->network.nics_per_node);
    if (t->n_nodes > 1 && t->network.latency == 0) t->network.latency = CDP_TOPOLOGY_DEFAULT_NET_LATENCY;

    for (int g = 0; g < t->n_gpus; g++) {
        struct cdp_topology_gpu *gp = &t->gpus[g];
        if (gp->index != g || gp->node < 0 || gp->node >= t->n_nodes ||
            gp->local != g - t->nodes[gp->node].first_gpu)
            return cdp_fail(CDP_ERR_INTERNAL, "%s: device %d: numbering broken", what, g);
        snprintf(place, sizeof place, "GPU %d (%s)", g, gp->name[0] ? gp->name : "unnamed");
        if ((st = check_rate(what, place, nm.pcie, gp->pcie_bw))) return st;
        const double fl[3] = {gp->peak_fp32, gp->peak_tf32, gp->peak_bf16};
        for (int q = 0; q < 3; q++)
            if ((st = check_range(what, place, nm.flops, fl[q], CDP_TOPOLOGY_FLOPS_MIN, CDP_TOPOLOGY_FLOPS_MAX, "FLOP/s")))
                return st;
        if (t->kind == CDP_TOPOLOGY_GPU) {
            const struct cdp_gpu_facts *f = cdp_gpu_facts_find(gp->name);
            if (f && gp->peak_fp32 == 0 && gp->peak_tf32 == 0 && gp->peak_bf16 == 0) {
                gp->peak_fp32 = f->fp32;
                gp->peak_tf32 = f->tf32;
                gp->peak_bf16 = f->bf16;
            }
            if (f && gp->memory_bytes == 0) gp->memory_bytes = f->memory_bytes;
            if (!gp->name[0]) cdp_topology_copy_str(gp->name, sizeof gp->name, "NVIDIA GPU");
            if (!gp->pci_bus_id[0])
                snprintf(gp->pci_bus_id, sizeof gp->pci_bus_id, "%04x:%02x:00.0", 0x100 + gp->local / 256,
                         gp->local % 256);
            if (gp->pcie_bw == 0) gp->pcie_bw = CDP_TOPOLOGY_DEFAULT_PCIE_BW;
        }
        if (gp->pcie_depth < 0 || gp->pcie_depth > CDP_TOPOLOGY_PCIE_DEPTH)
            return cdp_fail(CDP_ERR_INVALID, "%s: GPU %d: PCIe path deeper than %d", what, g, CDP_TOPOLOGY_PCIE_DEPTH);
    }
    /* Every machine has NUMA nodes; a GPU with none on a one-NUMA machine is on it. */
    for (int k = 0; k < t->n_nodes; k++) {
        for (int g = t->nodes[k].first_gpu; g < t->nodes[k].first_gpu + t->nodes[k].n_gpus; g++)
            if (t->gpus[g].numa >= 0 && (st = ensure_numa(t, k, t->gpus[g].numa))) return st;
        for (int i = 0; i < t->n_nics; i++)
            if (t->nics[i].node == k && t->nics[i].numa >= 0 && (st = ensure_numa(t, k, t->nics[i].numa))) return st;
        int count = 0, only = 0;
        for (int i = 0; i < t->n_numa; i++)
            if (t->numa[i].node == k) count++, only = t->numa[i].os_index;
        if (count == 0) {
            if ((st = ensure_numa(t, k, 0))) return st;
            count = 1;
            only = 0;
        }
        if (count == 1) {
            for (int g = t->nodes[k].first_gpu; g < t->nodes[k].first_gpu + t->nodes[k].n_gpus; g++)
                if (t->gpus[g].numa < 0) t->gpus[g].numa = only;
            for (int i = 0; i < t->n_nics; i++)
                if (t->nics[i].node == k && t->nics[i].numa < 0) t->nics[i].numa = only;
        }
    }
    qsort(t->numa, (size_t)t->n_numa, sizeof *t->numa, numa_cmp);
    for (int i = 0; i + 1 < t->n_numa; i++)
        if (t->numa[i].node == t->numa[i + 1].node && t->numa[i].os_index == t->numa[i + 1].os_index)
            return cdp_fail(CDP_ERR_INVALID, "%s: NUMA node %d is described twice", what, t->numa[i].os_index);
    for (int i = 0; i < t->n_numa; i++) {
        if (t->numa[i].cpuset[0]) {
            int *cpus = NULL, n = 0;
            if ((st = cdp_cpuset_parse_list(t->numa[i].cpuset, &cpus, &n)))
                return cdp_error_context(st, "%s: NUMA node %d", what, t->numa[i].os_index);
            free(cpus);
        }
    }
    for (int g = 0; g < t->n_gpus; g++) {
        struct cdp_topology_gpu *gp = &t->gpus[g];
        const struct cdp_topology_numa *nm = gp->numa >= 0 ? find_numa(t, gp->node, gp->numa) : NULL;
        if (!gp->cpuset[0] && nm) cdp_topology_copy_str(gp->cpuset, sizeof gp->cpuset, nm->cpuset);
    }
    /* PCIe path ids renumbered in order of first use, so equal trees compare equal. */
    for (int k = 0; k < t->n_nodes; k++) {
        const struct cdp_topology_node *nd = &t->nodes[k];
        int map_from[CDP_TOPOLOGY_PCIE_DEPTH * 64], map_to[CDP_TOPOLOGY_PCIE_DEPTH * 64], used = 0, next = 0;
        for (int g = nd->first_gpu; g < nd->first_gpu + nd->n_gpus; g++) {
            struct cdp_topology_gpu *gp = &t->gpus[g];
            for (int d = 0; d < gp->pcie_depth; d++) {
                int v = gp->pcie_path[d], m = -1;
                for (int q = 0; q < used; q++)
                    if (map_from[q] == v) m = map_to[q];
                if (m < 0) {
                    if (used == (int)(sizeof map_from / sizeof map_from[0]))
                        return cdp_fail(CDP_ERR_INVALID, "%s: too many PCIe switches", what);
                    map_from[used] = v;
                    map_to[used++] = m = next++;
                }
                gp->pcie_path[d] = m;
            }
            for (int d = gp->pcie_depth; d < CDP_TOPOLOGY_PCIE_DEPTH; d++) gp->pcie_path[d] = 0;
        }
    }
    for (int k = 0; k < t->n_nodes; k++)
        if ((st = derive_node(t, k))) return st;
    if (!t->source && (st = cdp_topology_set_source(t, "%s", what))) return st;
    return CDP_OK;
}

/* ---- links --------------------------------------------------------------------------- */

cdp_status cdp_topology_link(const struct cdp_topology *t, int a, int b, struct cdp_topology_link *out)
{
    if (!t || a < 0 || b < 0 || a >= t->n_gpus || b >= t->n_gpus)
        return cdp_fail(CDP_ERR_INVALID, "topology: no device pair (%d, %d) among %d devices", a, b,
                        t ? t->n_gpus : 0);
    const struct cdp_topology_gpu *x = &t->gpus[a], *y = &t->gpus[b];
    if (x->node != y->node) {
        out->cls = CDP_LINK_NET;
        out->nvlinks = 0;
        out->bandwidth = t->network.nic_rate;
        out->latency = t->network.latency;
        return CDP_OK;
    }
    const struct cdp_topology_node *nd = &t->nodes[x->node];
    size_t ij = (size_t)x->local * (size_t)nd->n_gpus + (size_t)y->local;
    out->cls = nd->link_class[ij];
    out->nvlinks = nd->nvlinks[ij];
    out->bandwidth = nd->bandwidth[ij];
    out->latency = nd->latency[ij];
    return CDP_OK;
}

/* ---- CPU and cluster topologies ---------------------------------------------------------- */

cdp_status cdp_topology_make_cpu(struct cdp_topology *t, int n_devices, double copy_bw)
{
    cdp_status st;
    if (t->n_nodes != 1) return cdp_fail(CDP_ERR_INVALID, "topology: a CPU topology has one node");
    int numa_here = 0;
    for (int i = 0; i < t->n_numa; i++) numa_here += t->numa[i].node == 0;
    if (n_devices <= 0) n_devices = numa_here > 0 ? numa_here : 1;
    uint64_t total = 0;
    for (int i = 0; i < t->n_numa; i++) total += t->numa[i].memory_bytes;
    free(t->gpus);
    t->gpus = calloc((size_t)n_devices, sizeof *t->gpus);
    if (!t->gpus) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    t->n_gpus = n_devices;
    t->kind = CDP_TOPOLOGY_CPU;
    for (int s = 0; s < t->n_nvswitches; s++) free(t->nvswitches[s].gpu_links);
    t->n_nvswitches = 0;
    struct cdp_topology_node *nd = &t->nodes[0];
    nd->first_gpu = 0;
    if ((st = cdp_topology_node_alloc(nd, n_devices))) return st;
    nd->copy_bw = copy_bw > 0 ? copy_bw : CDP_TOPOLOGY_DEFAULT_COPY_BW;
    for (int i = 0; i < n_devices; i++) {
        struct cdp_topology_gpu *g = &t->gpus[i];
        g->index = g->local = i;
        g->node = 0;
        snprintf(g->name, sizeof g->name, "cpu%d", i);
        g->memory_bytes = total / (uint64_t)n_devices;
        g->numa = -1;
        if (numa_here > 0) {
            int q = 0;
            for (int k = 0; k < t->n_numa; k++) {
                if (t->numa[k].node != 0) continue;
                if (q == i % numa_here) {
                    g->numa = t->numa[k].os_index;
                    cdp_topology_copy_str(g->cpuset, sizeof g->cpuset, t->numa[k].cpuset);
                }
                q++;
            }
        }
    }
    return CDP_OK;
}

cdp_status cdp_topology_cpu(int n_devices, double copy_bw, uint64_t memory_per_device,
                            struct cdp_topology **out)
{
    cdp_status st;
    if (n_devices < 1) return cdp_fail(CDP_ERR_INVALID, "topology: a CPU topology needs at least one device, got %d", n_devices);
    cdp_status cst = check_rate("topology", "cpu devices", "copy bandwidth", copy_bw);
    if (cst) return cst;
    struct cdp_topology *t = calloc(1, sizeof *t);
    if (!t) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    if ((st = cdp_topology_alloc(t, 1, 0, 0, 0, 0))) goto fail;
    if ((st = cdp_topology_make_cpu(t, n_devices, copy_bw))) goto fail;
    for (int i = 0; i < n_devices; i++) t->gpus[i].memory_bytes = memory_per_device;
    snprintf(t->name, sizeof t->name, "cpu x %d", n_devices);
    cdp_topology_copy_str(t->nodes[0].name, sizeof t->nodes[0].name, "cpu");
    if ((st = cdp_topology_set_source(t, "%d CPU devices, %.3g GB/s copies between them", n_devices,
                                  t->nodes[0].copy_bw / 1e9)))
        goto fail;
    if ((st = cdp_topology_finalize(t, "cpu topology"))) goto fail;
    *out = t;
    return CDP_OK;
fail:
    cdp_topology_free(t);
    return st;
}

cdp_status cdp_topology_generic_gpus(int n_gpus, const char *name, uint64_t memory, double pcie_bw,
                                     struct cdp_topology **out)
{
    cdp_status st;
    if (n_gpus < 1 || n_gpus > 65536)
        return cdp_fail(CDP_ERR_INVALID, "topology: a GPU topology needs 1 to 65536 GPUs, got %d", n_gpus);
    if ((st = check_rate("topology", "generic GPUs", "PCIe bandwidth", pcie_bw))) return st;
    struct cdp_topology *t = calloc(1, sizeof *t);
    if (!t) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    if ((st = cdp_topology_alloc(t, 1, n_gpus, 0, 0, 0)) || (st = cdp_topology_node_alloc(&t->nodes[0], n_gpus))) goto fail;
    t->kind = CDP_TOPOLOGY_GPU;
    snprintf(t->name, sizeof t->name, "%d x %s", n_gpus, name && *name ? name : "GPU");
    cdp_topology_copy_str(t->nodes[0].name, sizeof t->nodes[0].name, "this machine");
    for (int i = 0; i < n_gpus; i++) {
        struct cdp_topology_gpu *g = &t->gpus[i];
        g->index = g->local = i;
        cdp_topology_copy_str(g->name, sizeof g->name, name && *name ? name : "NVIDIA GPU");
        g->memory_bytes = memory;
        g->pcie_bw = pcie_bw;
        g->pcie_depth = 1; /* every GPU under one host bridge: PHB between any two */
    }
    if ((st = cdp_topology_set_source(t, "%d GPUs known only by their count: PCIe (PHB) between any two at %.3g GB/s",
                                  n_gpus, (pcie_bw > 0 ? pcie_bw : CDP_TOPOLOGY_DEFAULT_PCIE_BW) / 1e9)))
        goto fail;
    if ((st = cdp_topology_finalize(t, "generic GPU topology"))) goto fail;
    *out = t;
    return CDP_OK;
fail:
    cdp_topology_free(t);
    return st;
}

/* The network of a join (docs/topology.md, "Mixed clusters"): the terms' own
 * when they agree; else one network for every pair of nodes, no faster than
 * its slowest part: the least NIC rate and NIC count, the largest latency,
 * named after the network whose rate it took. */
static struct cdp_topology_network join_network(const struct cdp_topology *const *nodes, int n_terms)
{
    struct cdp_topology_network net = nodes[0]->network;
    int same = 1;
    for (int i = 1; i < n_terms; i++) {
        const struct cdp_topology_network *x = &nodes[i]->network;
        same &= !strcmp(x->name, net.name) && x->nics_per_node == net.nics_per_node && x->nic_rate == net.nic_rate &&
                x->latency == net.latency;
    }
    if (same) return net;
    for (int i = 0; i < n_terms; i++) {
        const struct cdp_topology_network *x = &nodes[i]->network;
        const double lat = x->latency > 0 ? x->latency : CDP_TOPOLOGY_DEFAULT_NET_LATENCY;
        if (i == 0 || lat > net.latency) net.latency = lat;
        if (x->nics_per_node > 0 && (net.nics_per_node <= 0 || x->nics_per_node < net.nics_per_node))
            net.nics_per_node = x->nics_per_node;
        if (x->nic_rate > 0 && (net.nic_rate <= 0 || x->nic_rate < net.nic_rate)) {
            net.nic_rate = x->nic_rate;
            memcpy(net.name, x->name, sizeof net.name);
        }
    }
    return net;
}

cdp_status cdp_topology_join(const struct cdp_topology *const *nodes, const int *counts, int n_terms,
                             const struct cdp_topology_network *net, struct cdp_topology **out)
{
    cdp_status st;
    if (n_terms < 1 || n_terms > CDP_TOPOLOGY_JOIN_MAX_TERMS)
        return cdp_fail(CDP_ERR_INVALID, "topology: a join has 1 to %d terms, got %d", CDP_TOPOLOGY_JOIN_MAX_TERMS,
                        n_terms);
    long long n_nodes = 0, n_gpus = 0, n_numa = 0, n_sw = 0, n_nics = 0;
    for (int i = 0; i < n_terms; i++) {
        const struct cdp_topology *nd = nodes[i];
        if (!nd || nd->n_nodes != 1)
            return cdp_fail(CDP_ERR_INVALID, "topology: term %d: a cluster is built from one-node topologies",
                            i + 1);
        if (nd->kind != nodes[0]->kind)
            return cdp_fail(CDP_ERR_INVALID, "topology: term %d (%s) has %s devices, term 1 (%s) %s devices",
                            i + 1, nd->name, nd->kind == CDP_TOPOLOGY_CPU ? "CPU" : "GPU", nodes[0]->name,
                            nodes[0]->kind == CDP_TOPOLOGY_CPU ? "CPU" : "GPU");
        if (counts[i] < 1 || counts[i] > 65536)
            return cdp_fail(CDP_ERR_INVALID, "topology: a cluster needs 1 to 65536 nodes, got %d", counts[i]);
        n_nodes += counts[i];
        n_gpus += (long long)counts[i] * nd->n_gpus;
        n_numa += (long long)counts[i] * nd->n_numa;
        n_sw += (long long)counts[i] * nd->n_nvswitches;
        n_nics += (long long)counts[i] * nd->n_nics;
    }
    if (n_nodes > 65536)
        return cdp_fail(CDP_ERR_INVALID, "topology: a cluster needs 1 to 65536 nodes, got %lld", n_nodes);
    if (n_gpus > CDP_TOPOLOGY_MAX_DEVICES)
        return cdp_fail(CDP_ERR_INVALID, "topology: %lld nodes with %lld devices: at most %d (the planner keeps "
                        "devices x devices link matrices: 10,000 GPUs plan in about 8 s and 3.7 GB here)", n_nodes,
                        n_gpus, CDP_TOPOLOGY_MAX_DEVICES);
    if (n_numa > INT_MAX || n_sw > INT_MAX || n_nics > INT_MAX)
        return cdp_fail(CDP_ERR_INVALID, "topology: %lld nodes: too many NUMA nodes, switches or NICs", n_nodes);
    struct cdp_topology *t = calloc(1, sizeof *t);
    if (!t) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    if ((st = cdp_topology_alloc(t, (int)n_nodes, (int)n_gpus, (int)n_numa, (int)n_sw, (int)n_nics))) goto fail;
    t->kind = nodes[0]->kind;
    if (n_terms == 1 && counts[0] == 1) {
        cdp_topology_copy_str(t->name, sizeof t->name, nodes[0]->name);
    } else if (n_terms == 1) {
        snprintf(t->name, sizeof t->name, "%d x %.50s", counts[0], nodes[0]->name);
    } else {
        size_t len = 0;
        for (int i = 0; i < n_terms && len < sizeof t->name; i++)
            len += (size_t)snprintf(t->name + len, sizeof t->name - len, "%s%d x %s", i ? " + " : "", counts[i],
                                    nodes[i]->name);
    }
    t->network = net ? *net : join_network(nodes, n_terms);
    int k = 0, g0 = 0, q_numa = 0, q_sw = 0, q_nic = 0;
    for (int term = 0; term < n_terms; term++) {
        const struct cdp_topology *node = nodes[term];
        const struct cdp_topology_node *src = &node->nodes[0];
        const int g1 = node->n_gpus;
        for (int c = 0; c < counts[term]; c++, k++, g0 += g1) {
            struct cdp_topology_node *nd = &t->nodes[k];
            *nd = (struct cdp_topology_node){0};
            memcpy(nd->name, src->name, sizeof nd->name);
            nd->nvlink_bw = src->nvlink_bw;
            nd->sys_bw = src->sys_bw;
            nd->copy_bw = src->copy_bw;
            nd->first_gpu = g0;
            if ((st = cdp_topology_node_alloc(nd, g1))) goto fail;
            memcpy(nd->nvlink_direct, src->nvlink_direct, (size_t)g1 * g1 * sizeof *nd->nvlink_direct);
            for (int i = 0; i < g1; i++) {
                struct cdp_topology_gpu *g = &t->gpus[g0 + i];
                *g = node->gpus[i];
                g->index = g0 + i;
                g->node = k;
            }
            for (int i = 0; i < node->n_numa; i++, q_numa++) {
                t->numa[q_numa] = node->numa[i];
                t->numa[q_numa].node = k;
            }
            for (int i = 0; i < node->n_nics; i++, q_nic++) {
                t->nics[q_nic] = node->nics[i];
                t->nics[q_nic].node = k;
            }
            for (int s = 0; s < node->n_nvswitches; s++, q_sw++) {
                struct cdp_topology_nvswitch *sw = &t->nvswitches[q_sw];
                *sw = node->nvswitches[s];
                sw->gpu_links = NULL;
                sw->node = k;
                if ((st = cdp_topology_switch_alloc(sw, g1))) goto fail;
                memcpy(sw->gpu_links, node->nvswitches[s].gpu_links, (size_t)g1 * sizeof *sw->gpu_links);
            }
        }
    }
    if (n_nodes > 1 && t->network.nic_rate <= 0)
        CDP_WARN(TOPO, "%s: no network rate known between the nodes; inter-node links get 0 bytes/s", t->name);
    if (n_terms == 1) {
        st = cdp_topology_set_source(t, "%s", nodes[0]->source ? nodes[0]->source : nodes[0]->name);
    } else {
        char src[4096];
        size_t len = 0;
        for (int i = 0; i < n_terms && len < sizeof src; i++)
            len += (size_t)snprintf(src + len, sizeof src - len, "%s%s: %s", i ? "; " : "", nodes[i]->name,
                                    nodes[i]->source ? nodes[i]->source : "(no source)");
        st = cdp_topology_set_source(t, "%s", src);
    }
    if (st || (st = cdp_topology_finalize(t, t->name))) goto fail;
    *out = t;
    return CDP_OK;
fail:
    cdp_topology_free(t);
    return st;
}

cdp_status cdp_topology_cluster(const struct cdp_topology *node, int n_nodes,
                                const struct cdp_topology_network *net, struct cdp_topology **out)
{
    if (!node || node->n_nodes != 1)
        return cdp_fail(CDP_ERR_INVALID, "topology: a cluster is built from a one-node topology");
    if (n_nodes < 1 || n_nodes > 65536)
        return cdp_fail(CDP_ERR_INVALID, "topology: a cluster needs 1 to 65536 nodes, got %d", n_nodes);
    const struct cdp_topology *const nodes[1] = {node};
    return cdp_topology_join(nodes, &n_nodes, 1, net, out);
}

cdp_status cdp_topology_first(const struct cdp_topology *t, int n_nodes, int per_node, struct cdp_topology **out)
{
    if (n_nodes < 1 || n_nodes > t->n_nodes || per_node < 1)
        return cdp_fail(CDP_ERR_INVALID, "topology: %s: the first %d node%s x %d device%s: it has %d node%s",
                        t->name, n_nodes, n_nodes == 1 ? "" : "s", per_node, per_node == 1 ? "" : "s", t->n_nodes,
                        t->n_nodes == 1 ? "" : "s");
    int n_gpus = 0, n_numa = 0, n_sw = 0, n_nics = 0;
    for (int k = 0; k < n_nodes; k++) n_gpus += t->nodes[k].n_gpus < per_node ? t->nodes[k].n_gpus : per_node;
    for (int i = 0; i < t->n_numa; i++) n_numa += t->numa[i].node < n_nodes;
    for (int i = 0; i < t->n_nvswitches; i++) n_sw += t->nvswitches[i].node < n_nodes;
    for (int i = 0; i < t->n_nics; i++) n_nics += t->nics[i].node < n_nodes;
    struct cdp_topology *x = calloc(1, sizeof *x);
    if (!x) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    cdp_status st = cdp_topology_alloc(x, n_nodes, n_gpus, n_numa, n_sw, n_nics);
    if (st) goto fail;
    x->kind = t->kind;
    memcpy(x->name, t->name, sizeof x->name);
    x->network = t->network;
    int g0 = 0, q = 0;
    for (int k = 0; k < n_nodes; k++) {
        const struct cdp_topology_node *src = &t->nodes[k];
        struct cdp_topology_node *nd = &x->nodes[k];
        const int n = src->n_gpus < per_node ? src->n_gpus : per_node;
        memcpy(nd->name, src->name, sizeof nd->name);
        nd->nvlink_bw = src->nvlink_bw;
        nd->sys_bw = src->sys_bw;
        nd->copy_bw = src->copy_bw;
        nd->first_gpu = g0;
        if ((st = cdp_topology_node_alloc(nd, n))) goto fail;
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) nd->nvlink_direct[i * n + j] = src->nvlink_direct[i * src->n_gpus + j];
            struct cdp_topology_gpu *g = &x->gpus[g0 + i];
            *g = t->gpus[src->first_gpu + i];
            g->index = g0 + i;
        }
        g0 += n;
        for (int s = 0; s < t->n_nvswitches; s++) {
            if (t->nvswitches[s].node != k) continue;
            struct cdp_topology_nvswitch *sw = &x->nvswitches[q++];
            *sw = t->nvswitches[s];
            sw->gpu_links = NULL;
            if ((st = cdp_topology_switch_alloc(sw, n))) goto fail;
            memcpy(sw->gpu_links, t->nvswitches[s].gpu_links, (size_t)n * sizeof *sw->gpu_links);
        }
    }
    for (int i = 0, k = 0; i < t->n_numa; i++)
        if (t->numa[i].node < n_nodes) x->numa[k++] = t->numa[i];
    for (int i = 0, k = 0; i < t->n_nics; i++)
        if (t->nics[i].node < n_nodes) x->nics[k++] = t->nics[i];
    if ((st = cdp_topology_set_source(x, "%s", t->source ? t->source : t->name)) ||
        (st = cdp_topology_finalize(x, x->name)))
        goto fail;
    *out = x;
    return CDP_OK;
fail:
    cdp_topology_free(x);
    return st;
}

/* Two nodes of t alike: the same devices (names, memory, peaks), links and rates. */
int cdp_topology_nodes_alike(const struct cdp_topology *t, int a, int b)
{
    const struct cdp_topology_node *x = &t->nodes[a], *y = &t->nodes[b];
    if (x->n_gpus != y->n_gpus || x->nvlink_bw != y->nvlink_bw || x->sys_bw != y->sys_bw || x->copy_bw != y->copy_bw ||
        strcmp(x->name, y->name))
        return 0;
    const size_t n = (size_t)x->n_gpus * (size_t)x->n_gpus;
    if (memcmp(x->link_class, y->link_class, n * sizeof *x->link_class) ||
        memcmp(x->bandwidth, y->bandwidth, n * sizeof *x->bandwidth) ||
        memcmp(x->latency, y->latency, n * sizeof *x->latency))
        return 0;
    for (int i = 0; i < x->n_gpus; i++) {
        const struct cdp_topology_gpu *g = &t->gpus[x->first_gpu + i], *h = &t->gpus[y->first_gpu + i];
        if (strcmp(g->name, h->name) || g->memory_bytes != h->memory_bytes || g->peak_fp32 != h->peak_fp32 ||
            g->peak_tf32 != h->peak_tf32 || g->peak_bf16 != h->peak_bf16 || g->pcie_bw != h->pcie_bw)
            return 0;
    }
    return 1;
}

/* ---- equality ------------------------------------------------------------------------ */

static int same_real(double a, double b) { return a == b || fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)); }

#define DIFF(...) do { if (why) snprintf(why, cap, __VA_ARGS__); return 0; } while (0)

int cdp_topology_equal(const struct cdp_topology *a, const struct cdp_topology *b, char *why, size_t cap)
{
    if (a->kind != b->kind) DIFF("kind %d vs %d", a->kind, b->kind);
    if (strcmp(a->name, b->name)) DIFF("name \"%s\" vs \"%s\"", a->name, b->name);
    if (a->n_nodes != b->n_nodes) DIFF("%d vs %d nodes", a->n_nodes, b->n_nodes);
    if (a->n_gpus != b->n_gpus) DIFF("%d vs %d devices", a->n_gpus, b->n_gpus);
    if (a->n_numa != b->n_numa) DIFF("%d vs %d NUMA nodes", a->n_numa, b->n_numa);
    if (a->n_nvswitches != b->n_nvswitches) DIFF("%d vs %d NVSwitches", a->n_nvswitches, b->n_nvswitches);
    if (a->n_nics != b->n_nics) DIFF("%d vs %d NICs", a->n_nics, b->n_nics);
    for (int k = 0; k < a->n_nodes; k++) {
        const struct cdp_topology_node *x = &a->nodes[k], *y = &b->nodes[k];
        if (strcmp(x->name, y->name)) DIFF("node %d: name \"%s\" vs \"%s\"", k, x->name, y->name);
        if (x->n_gpus != y->n_gpus || x->first_gpu != y->first_gpu) DIFF("node %d: devices differ", k);
        if (!same_real(x->nvlink_bw, y->nvlink_bw)) DIFF("node %d: NVLink rate %g vs %g", k, x->nvlink_bw, y->nvlink_bw);
        if (!same_real(x->sys_bw, y->sys_bw)) DIFF("node %d: SYS rate %g vs %g", k, x->sys_bw, y->sys_bw);
        if (!same_real(x->copy_bw, y->copy_bw)) DIFF("node %d: copy rate %g vs %g", k, x->copy_bw, y->copy_bw);
        int n = x->n_gpus;
        for (int i = 0; i < n * n; i++) {
            if (x->nvlink_direct[i] != y->nvlink_direct[i] || x->link_class[i] != y->link_class[i] ||
                x->nvlinks[i] != y->nvlinks[i] || !same_real(x->bandwidth[i], y->bandwidth[i]) ||
                !same_real(x->latency[i], y->latency[i]))
                DIFF("node %d: link GPU %d - GPU %d differs (class %s/%s, NV %d/%d, %g/%g bytes/s)", k, i / n,
                     i % n, cdp_link_class_name(x->link_class[i]), cdp_link_class_name(y->link_class[i]),
                     x->nvlinks[i], y->nvlinks[i], x->bandwidth[i], y->bandwidth[i]);
        }
    }
    for (int g = 0; g < a->n_gpus; g++) {
        const struct cdp_topology_gpu *x = &a->gpus[g], *y = &b->gpus[g];
        if (strcmp(x->name, y->name)) DIFF("GPU %d: name \"%s\" vs \"%s\"", g, x->name, y->name);
        if (strcmp(x->pci_bus_id, y->pci_bus_id)) DIFF("GPU %d: bus id %s vs %s", g, x->pci_bus_id, y->pci_bus_id);
        if (x->memory_bytes != y->memory_bytes)
            DIFF("GPU %d: memory %llu vs %llu", g, (unsigned long long)x->memory_bytes, (unsigned long long)y->memory_bytes);
        if (!same_real(x->peak_fp32, y->peak_fp32) || !same_real(x->peak_tf32, y->peak_tf32) ||
            !same_real(x->peak_bf16, y->peak_bf16))
            DIFF("GPU %d: peak FLOP/s differ", g);
        if (x->numa != y->numa) DIFF("GPU %d: NUMA %d vs %d", g, x->numa, y->numa);
        if (strcmp(x->cpuset, y->cpuset)) DIFF("GPU %d: CPUs %s vs %s", g, x->cpuset, y->cpuset);
        if (!same_real(x->pcie_bw, y->pcie_bw)) DIFF("GPU %d: PCIe rate %g vs %g", g, x->pcie_bw, y->pcie_bw);
        if (x->pcie_depth != y->pcie_depth || memcmp(x->pcie_path, y->pcie_path, sizeof x->pcie_path))
            DIFF("GPU %d: PCIe path differs (depth %d vs %d)", g, x->pcie_depth, y->pcie_depth);
    }
    for (int i = 0; i < a->n_numa; i++) {
        const struct cdp_topology_numa *x = &a->numa[i], *y = &b->numa[i];
        if (x->node != y->node || x->os_index != y->os_index || strcmp(x->cpuset, y->cpuset) ||
            x->memory_bytes != y->memory_bytes)
            DIFF("NUMA entry %d differs (node %d/%d, #%d/#%d, CPUs %s/%s)", i, x->node, y->node, x->os_index,
                 y->os_index, x->cpuset, y->cpuset);
    }
    for (int s = 0; s < a->n_nvswitches; s++) {
        const struct cdp_topology_nvswitch *x = &a->nvswitches[s], *y = &b->nvswitches[s];
        if (x->node != y->node || strcmp(x->name, y->name) || strcmp(x->pci_bus_id, y->pci_bus_id))
            DIFF("NVSwitch %d: %s %s vs %s %s", s, x->name, x->pci_bus_id, y->name, y->pci_bus_id);
        for (int i = 0; i < a->nodes[x->node].n_gpus; i++)
            if (x->gpu_links[i] != y->gpu_links[i]) DIFF("NVSwitch %d: links to GPU %d differ", s, i);
    }
    for (int i = 0; i < a->n_nics; i++) {
        const struct cdp_topology_nic *x = &a->nics[i], *y = &b->nics[i];
        if (x->node != y->node || strcmp(x->name, y->name) || strcmp(x->pci_bus_id, y->pci_bus_id) ||
            x->numa != y->numa || !same_real(x->rate, y->rate))
            DIFF("NIC %d: %s vs %s", i, x->name, y->name);
    }
    if (strcmp(a->network.name, b->network.name) || a->network.nics_per_node != b->network.nics_per_node ||
        !same_real(a->network.nic_rate, b->network.nic_rate) || !same_real(a->network.latency, b->network.latency))
        DIFF("network differs");
    return 1;
}

/* ---- rates ------------------------------------------------------------------------------- */

cdp_status cdp_parse_rate(const char *s, double *out)
{
    static const struct { const char *unit; double mul; } units[] = {
        {"TB/s", 1e12}, {"GB/s", 1e9}, {"MB/s", 1e6}, {"KB/s", 1e3}, {"kB/s", 1e3}, {"B/s", 1},
        {"TiB/s", 1099511627776.0}, {"GiB/s", 1073741824.0}, {"MiB/s", 1048576.0},
        {"Tb/s", 1e12 / 8}, {"Gb/s", 1e9 / 8}, {"Mb/s", 1e6 / 8}, {"Gbps", 1e9 / 8}, {"Mbps", 1e6 / 8},
    };
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || isinf(v)) goto bad;
    while (*end == ' ') end++;
    if (!*end) {
        *out = v;
        return CDP_OK;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) == 0) {
            *out = v * units[i].mul;
            return CDP_OK;
        }
    }
bad:
    return cdp_fail(CDP_ERR_INVALID, "expected a non-negative rate like \"25GB/s\" (bytes) or \"200Gb/s\" "
                    "(bits), got \"%.40s\"", s);
}

/* ---- bus ids ------------------------------------------------------------------------------ */

int cdp_busid_parse(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    char tail;
    if (!s) return -1;
    if (sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, fn, &tail) == 4) return 0;
    *dom = 0;
    if (sscanf(s, "%x:%x.%x%c", bus, dev, fn, &tail) == 3) return 0;
    return -1;
}

void cdp_busid_normalize(const char *s, char *out, size_t cap)
{
    unsigned d, b, v, f;
    if (cdp_busid_parse(s, &d, &b, &v, &f) == 0) snprintf(out, cap, "%04x:%02x:%02x.%x", d, b, v, f);
    else cdp_topology_copy_str(out, cap, s);
}
