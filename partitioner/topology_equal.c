/* Whether two topologies describe the same machine (cdp_topology_equal). */
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
