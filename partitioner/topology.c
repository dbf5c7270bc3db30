/* The topology model itself: allocating and freeing one, its name and
 * source, and its links (a pair's class, bandwidth and latency). The checks
 * every loader shares are topology_finalize.c; CPU and cluster topologies
 * topology_cluster.c. */
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

void cdp_topology_copy_str(char *dst, size_t cap, const char *src)
{
    if (!cap) return;
    if (!src) src = "";
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
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

cdp_status cdp_topology_group_link(const struct cdp_topology *t, int a, int b, int n, struct cdp_topology_link *out)
{
    if (n < 1) return cdp_fail(CDP_ERR_INVALID, "topology: a group of %d devices", n);
    for (int k = 0; k < n; k++) {
        struct cdp_topology_link l;
        cdp_status st = cdp_topology_link(t, a + k, b + k, &l);
        if (st) return st;
        if (k == 0) {
            *out = l;
            continue;
        }
        if (l.bandwidth < out->bandwidth) out->bandwidth = l.bandwidth;
        if (l.latency > out->latency) out->latency = l.latency;
        if (l.nvlinks < out->nvlinks) out->nvlinks = l.nvlinks;
        if (l.cls > out->cls) out->cls = l.cls;
    }
    return CDP_OK;
}
