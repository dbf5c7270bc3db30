/* What every topology loader ends with (topology_internal.h): the checks of
 * what it filled in, the defaults (GPU facts, NUMA nodes, CPU sets, PCIe
 * rates), canonical PCIe paths and the derived link matrices. */
#include "partitioner/topology_internal.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"

/* 0 (not given) or a finite value in [lo, hi]; else an error naming the
 * source, the place and the reader's attribute. */
static cdp_status check_range(const char *what, const char *place, const char *attr, double v, double lo, double hi,
                              const char *unit)
{
    if (v == 0 || (isfinite(v) && v >= lo && v <= hi)) return CDP_OK;
    return cdp_fail(CDP_ERR_INVALID, "%s: %s: %s %.17g %s: expected 0 (not given) or from %g to %g %s", what, place,
                    attr, v, unit, lo, hi, unit);
}

cdp_status cdp_topology_check_rate(const char *what, const char *place, const char *attr, double v)
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
        if ((st = cdp_topology_check_rate(what, place, nm.nvlink, nd->nvlink_bw)) ||
            (st = cdp_topology_check_rate(what, place, nm.sys, nd->sys_bw)) ||
            (st = cdp_topology_check_rate(what, place, nm.copy, nd->copy_bw)))
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
        if ((st = cdp_topology_check_rate(what, place, nm.nic, c->rate))) return st;
        if (c->node < 0 || c->node >= t->n_nodes)
            return cdp_fail(CDP_ERR_INVALID, "%s: NIC %d: no node %d", what, i, c->node);
        if (!c->name[0]) snprintf(c->name, sizeof c->name, "nic%d", i);
        if (!c->pci_bus_id[0] && t->kind == CDP_TOPOLOGY_GPU)
            snprintf(c->pci_bus_id, sizeof c->pci_bus_id, "%04x:%02x:00.0", 0x300 + i / 256, i % 256);
    }
    if ((st = cdp_topology_check_rate(what, "network", nm.net_rate, t->network.nic_rate)) ||
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
        if ((st = cdp_topology_check_rate(what, place, nm.pcie, gp->pcie_bw))) return st;
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
