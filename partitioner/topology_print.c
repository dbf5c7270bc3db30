/* The topology for people: an nvidia-smi topo -m style class matrix, a GB/s
 * matrix, then devices, NUMA nodes, NVSwitches, NICs and the network. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "partitioner/topology_internal.h"

static void dev_label(const struct cdp_topology *t, int g, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%d", t->kind == CDP_TOPOLOGY_CPU ? "CPU" : "GPU", g);
}

static int node_same(const struct cdp_topology *t, int k)
{
    const struct cdp_topology_node *a = &t->nodes[0], *b = &t->nodes[k];
    if (a->n_gpus != b->n_gpus) return 0;
    size_t n = (size_t)a->n_gpus * (size_t)a->n_gpus;
    return !memcmp(a->link_class, b->link_class, n * sizeof *a->link_class) &&
           !memcmp(a->bandwidth, b->bandwidth, n * sizeof *a->bandwidth);
}

/* rep[k]: the first node alike to node k (k itself when none before it is);
 * compared with each distinct node only, so large clusters stay cheap. */
static void node_kinds(const struct cdp_topology *t, int *rep)
{
    for (int k = 0; k < t->n_nodes; k++) {
        rep[k] = k;
        for (int j = 0; j < k; j++)
            if (rep[j] == j && cdp_topology_nodes_alike(t, j, k)) {
                rep[k] = j;
                break;
            }
    }
}

/* Nodes of the kind of node k (rep from node_kinds). */
static int node_count(const struct cdp_topology *t, const int *rep, int k)
{
    int n = 0;
    for (int j = 0; j < t->n_nodes; j++) n += rep[j] == rep[k];
    return n;
}

static void print_node(const struct cdp_topology *t, int k, FILE *f)
{
    const struct cdp_topology_node *nd = &t->nodes[k];
    int n = nd->n_gpus, w = 7;
    char lab[32];
    if (n == 0) {
        fprintf(f, "no %s found\n", t->kind == CDP_TOPOLOGY_CPU ? "devices" : "GPUs");
        return;
    }
    fprintf(f, "%-*s", w, "");
    for (int j = 0; j < n; j++) {
        dev_label(t, nd->first_gpu + j, lab, sizeof lab);
        fprintf(f, "%-*s", w, lab);
    }
    int cw = 20;
    for (int i = 0; i < n; i++) {
        int len = (int)strlen(t->gpus[nd->first_gpu + i].cpuset) + 2;
        if (len > cw) cw = len;
    }
    fprintf(f, "%-*s%s\n", cw, "CPU Affinity", "NUMA Affinity");
    for (int i = 0; i < n; i++) {
        const struct cdp_topology_gpu *g = &t->gpus[nd->first_gpu + i];
        dev_label(t, g->index, lab, sizeof lab);
        fprintf(f, "%-*s", w, lab);
        for (int j = 0; j < n; j++) {
            struct cdp_topology_link l;
            cdp_topology_link(t, nd->first_gpu + i, nd->first_gpu + j, &l);
            fprintf(f, "%-*s", w, cdp_topology_link_label(&l, lab, sizeof lab));
        }
        char numa[16];
        if (g->numa >= 0) snprintf(numa, sizeof numa, "%d", g->numa);
        else snprintf(numa, sizeof numa, "N/A");
        fprintf(f, "%-*s%s\n", cw, g->cpuset[0] ? g->cpuset : "N/A", numa);
    }
    fprintf(f, "\nbandwidth, GB/s one direction:\n%-*s", w, "");
    for (int j = 0; j < n; j++) {
        dev_label(t, nd->first_gpu + j, lab, sizeof lab);
        fprintf(f, "%-*s", w, lab);
    }
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        dev_label(t, nd->first_gpu + i, lab, sizeof lab);
        fprintf(f, "%-*s", w, lab);
        for (int j = 0; j < n; j++) {
            double bw = nd->bandwidth[(size_t)i * n + j];
            if (i == j) fprintf(f, "%-*s", w, "-");
            else fprintf(f, "%-*.1f", w, bw / 1e9);
        }
        fputc('\n', f);
    }
}

/* The GPUs, NUMA nodes, NVSwitches and NICs of node k. */
static void print_node_parts(const struct cdp_topology *t, const int *rep, int k, FILE *f)
{
    char b1[32];
    const struct cdp_topology_node *nd = &t->nodes[k];
    fprintf(f, "\n%s:\n", t->kind == CDP_TOPOLOGY_CPU ? "devices" : "GPUs");
    for (int g = nd->first_gpu; g < nd->first_gpu + nd->n_gpus; g++) {
        const struct cdp_topology_gpu *gp = &t->gpus[g];
        char lab[16];
        dev_label(t, g, lab, sizeof lab);
        fprintf(f, "  %-6s %-28s %10s", lab, gp->name,
                gp->memory_bytes ? cdp_format_bytes(gp->memory_bytes, b1, sizeof b1) : "memory ?");
        if (t->kind == CDP_TOPOLOGY_GPU) {
            fprintf(f, "  %s  PCIe %.1f GB/s", gp->pci_bus_id, gp->pcie_bw / 1e9);
            if (gp->peak_fp32 > 0) fprintf(f, "  FP32 %.1f", gp->peak_fp32 / 1e12);
            if (gp->peak_tf32 > 0) fprintf(f, "  TF32 %.1f", gp->peak_tf32 / 1e12);
            if (gp->peak_bf16 > 0) fprintf(f, "  BF16 %.1f", gp->peak_bf16 / 1e12);
            if (gp->peak_fp32 > 0) fprintf(f, " TFLOP/s");
        }
        fputc('\n', f);
    }
    if (node_count(t, rep, k) > 1) fprintf(f, "  (x %d nodes)\n", node_count(t, rep, k));
    fprintf(f, "\nNUMA nodes:\n");
    for (int i = 0; i < t->n_numa; i++) {
        if (t->numa[i].node != k) continue;
        fprintf(f, "  NUMA %d: CPUs %s", t->numa[i].os_index, t->numa[i].cpuset[0] ? t->numa[i].cpuset : "?");
        if (t->numa[i].memory_bytes)
            fprintf(f, ", %s", cdp_format_bytes(t->numa[i].memory_bytes, b1, sizeof b1));
        fputc('\n', f);
    }
    int nsw = 0;
    for (int s = 0; s < t->n_nvswitches; s++) nsw += t->nvswitches[s].node == k;
    if (nsw) {
        fprintf(f, "\nNVSwitches: %d per node, %.1f GB/s per NVLink; links per GPU:", nsw, nd->nvlink_bw / 1e9);
        for (int i = 0; i < nd->n_gpus; i++) {
            int sum = 0;
            for (int s = 0; s < t->n_nvswitches; s++)
                if (t->nvswitches[s].node == k) sum += t->nvswitches[s].gpu_links[i];
            fprintf(f, " %d", sum);
        }
        fputc('\n', f);
    }
    int nn = 0;
    for (int i = 0; i < t->n_nics; i++) nn += t->nics[i].node == k;
    if (nn) {
        fprintf(f, "\nNICs:\n");
        for (int i = 0; i < t->n_nics; i++) {
            const struct cdp_topology_nic *c = &t->nics[i];
            if (c->node != k) continue;
            fprintf(f, "  %-12s %-14s NUMA %-3d", c->name, c->pci_bus_id, c->numa);
            if (c->rate > 0) fprintf(f, " %.0f Gb/s", c->rate * 8 / 1e9);
            fputc('\n', f);
        }
    }
}

cdp_status cdp_topology_print(const struct cdp_topology *t, FILE *f)
{
    fprintf(f, "topology %s: %d node%s, %d %s%s\n", t->name, t->n_nodes, t->n_nodes == 1 ? "" : "s", t->n_gpus,
            t->kind == CDP_TOPOLOGY_CPU ? "CPU device" : "GPU", t->n_gpus == 1 ? "" : "s");
    if (t->source) fprintf(f, "source: %s\n", t->source);
    int *rep = malloc((size_t)t->n_nodes * sizeof *rep), kinds = 0;
    if (!rep) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory");
    node_kinds(t, rep);
    for (int k = 0; k < t->n_nodes; k++) kinds += rep[k] == k;
    if (kinds > 1) {
        /* a cluster of different nodes: each kind of node once, with its devices */
        for (int k = 0; k < t->n_nodes; k++) {
            if (rep[k] != k) continue;
            const int last = t->nodes[k].first_gpu + t->nodes[k].n_gpus - 1;
            fprintf(f, "\n== node %d (%s): %s%d to %d", k, t->nodes[k].name,
                    t->kind == CDP_TOPOLOGY_CPU ? "CPU" : "GPU", t->nodes[k].first_gpu, last);
            if (node_count(t, rep, k) > 1) fprintf(f, "; %d nodes like it", node_count(t, rep, k));
            fprintf(f, " ==\n\n");
            print_node(t, k, f);
            print_node_parts(t, rep, k, f);
        }
        fprintf(f, "\n(devices on different nodes: NET)\n");
    } else {
        fputc('\n', f);
        print_node(t, 0, f);
        for (int k = 1; k < t->n_nodes; k++) {
            if (node_same(t, k)) continue;
            fprintf(f, "\nnode %d (%s):\n", k, t->nodes[k].name);
            print_node(t, k, f);
        }
        if (t->n_nodes > 1) fprintf(f, "\n(nodes not shown have node 0's links; devices on different nodes: NET)\n");
        print_node_parts(t, rep, 0, f);
    }
    free(rep);
    if (t->n_nodes > 1 || t->network.nic_rate > 0) {
        fprintf(f, "\nnetwork%s: %s, %d NIC%s per node at %.0f Gb/s (%.1f GB/s), latency %.1f us\n",
                t->n_nodes > 1 ? "" : " (for clusters of this node)", t->network.name[0] ? t->network.name : "?",
                t->network.nics_per_node, t->network.nics_per_node == 1 ? "" : "s", t->network.nic_rate * 8 / 1e9,
                t->network.nic_rate / 1e9, t->network.latency * 1e6);
        if (kinds > 1)
            fprintf(f, "  (between any two nodes: the least NIC rate and count and the largest latency of the "
                       "node kinds' networks)\n");
    }
    fprintf(f, "\nLegend:\n"
               "  X    = self\n"
               "  NV#  = # NVLinks (direct, or through NVSwitches)\n"
               "  PIX  = at most one PCIe switch\n"
               "  PXB  = several PCIe switches, no host bridge\n"
               "  PHB  = a PCIe host bridge\n"
               "  NODE = between PCIe host bridges of one NUMA node\n"
               "  SYS  = across NUMA nodes (SMP interconnect)\n"
               "  MEM  = CPU devices: copies through main memory\n"
               "  NET  = devices on different nodes\n");
    return ferror(f) ? cdp_fail(CDP_ERR_IO, "cannot write the topology") : CDP_OK;
}
