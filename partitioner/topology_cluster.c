/* Topologies built rather than read: this host's CPUs, N generic GPUs, the
 * join of machines into a cluster over a network, and the first nodes and
 * devices of one (the shape of a job). */
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
    cdp_status cst = cdp_topology_check_rate("topology", "cpu devices", "copy bandwidth", copy_bw);
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
    if ((st = cdp_topology_check_rate("topology", "generic GPUs", "PCIe bandwidth", pcie_bw))) return st;
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
