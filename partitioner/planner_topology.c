/* The topology a plan is planned on (cdp_planner_topology, planner.h): the
 * plan's /cluster/topology, this host's CPUs for a cpu plan, or the GPUs
 * found live, shared by ranks when /cluster/ranks_per_device asks. */
#include "partitioner/planner.h"

#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "partitioner/host.h"
#include "partitioner/topology_internal.h" /* CDP_TOPOLOGY_MAX_DEVICES */

/* ---- the plan's topology ------------------------------------------------------- */

/* Ranks a cpu plan needs at least: its fixed stages x replicas x tensor. */
static int fixed_ranks(const struct cdp_plan *plan)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    if (pd->stages == CDP_AUTO || pd->replicas == CDP_AUTO) return 0;
    const int64_t n = pd->stages * pd->replicas * (pd->tensor == CDP_AUTO ? 1 : pd->tensor);
    return n > (1 << 20) ? 1 << 20 : (int)n;
}

/* This host as a CPU topology of `per_node` devices on each of plan's nodes. */
static cdp_status host_topology(const struct cdp_plan *plan, struct cdp_topology **t, char *note, size_t cap)
{
    const struct cdp_cluster_desc *cd = &plan->cluster;
    int *cpus = NULL, n = 0, cores = 1;
    cdp_status st = cdp_host_cpus(&cpus, NULL, &n, &cores);
    if (st) return st;
    free(cpus);
    const int64_t nodes = cd->nodes < 1 ? 1 : cd->nodes;
    int64_t per = cd->devices != CDP_AUTO ? cd->devices : cores;
    const int64_t need = (fixed_ranks(plan) + nodes - 1) / nodes;
    if (cd->devices == CDP_AUTO && need > per) per = need;
    if (per > CDP_TOPOLOGY_MAX_DEVICES || nodes > 1 << 16 || per * nodes > CDP_TOPOLOGY_MAX_DEVICES)
        return cdp_fail(CDP_ERR_INVALID, "%s: %s: %lld nodes x %lld CPU devices%s is more than this planner plans "
                        "(at most %d devices in all)", plan->source,
                        cd->devices == CDP_AUTO ? "/parallel/stages" : "/cluster/devices", (long long)nodes,
                        (long long)per, cd->devices == CDP_AUTO ? " (one for each of /parallel/stages x "
                        "/parallel/replicas)" : "", CDP_TOPOLOGY_MAX_DEVICES);
    struct cdp_discover_options o = {.cpu_devices = (int)per, .cpu_only = 1};
    struct cdp_topology *one = NULL;
    if ((st = cdp_topology_discover(&o, &one))) return st;
    /* CPU devices share the host's memory: the host check counts it per node */
    for (int i = 0; i < one->n_gpus; i++) one->gpus[i].memory_bytes = 0;
    if (nodes == 1) {
        *t = one;
        snprintf(note, cap, "auto: this host, %lld CPU device%s (%d core%s)", (long long)per, per == 1 ? "" : "s",
                 cores, cores == 1 ? "" : "s");
        return CDP_OK;
    }
    const struct cdp_topology_network net = {.name = "Ethernet 100Gb/s (assumed)", .nics_per_node = 1,
                                         .nic_rate = 12.5e9, .latency = 10e-6};
    st = cdp_topology_cluster(one, (int)nodes, &net, t);
    cdp_topology_free(one);
    if (!st)
        snprintf(note, cap, "auto: %lld nodes like this host, %lld CPU devices each, joined by an assumed 100Gb/s "
                 "network", (long long)nodes, (long long)per);
    return st;
}

/* Ranks sharing GPUs (/cluster/ranks_per_device k): GPUs x k devices, device d on GPU d / k. */
static cdp_status shared_topology(const struct cdp_topology *real, int k, struct cdp_topology **t)
{
    const struct cdp_topology_gpu *g = &real->gpus[0];
    /* a rank's share of its GPU: 1/k of its memory; copies between ranks go through the host */
    cdp_status st = cdp_topology_generic_gpus(real->n_gpus * k, g->name, g->memory_bytes / (uint64_t)k,
                                              g->pcie_bw / 2, t);
    if (st) return st;
    for (int i = 0; i < (*t)->n_gpus; i++) {
        struct cdp_topology_gpu *d = &(*t)->gpus[i];
        const struct cdp_topology_gpu *r = &real->gpus[i / k];
        d->peak_fp32 = r->peak_fp32 / k;
        d->peak_tf32 = r->peak_tf32 / k;
        d->peak_bf16 = r->peak_bf16 / k;
        memcpy(d->cpuset, r->cpuset, sizeof d->cpuset);
        d->numa = r->numa;
    }
    snprintf((*t)->name, sizeof (*t)->name, "%.40s, %d ranks per GPU", real->name, k);
    return CDP_OK;
}

cdp_status cdp_planner_topology(const struct cdp_plan *plan, int live_gpus, struct cdp_topology **t, char *note,
                                size_t cap)
{
    const struct cdp_cluster_desc *cd = &plan->cluster;
    const int k = cdp_backend_is_gpu(cd->backend) && cd->ranks_per_device > 1 ? (int)cd->ranks_per_device : 1;
    struct cdp_topology *real = NULL;
    cdp_status st;
    note[0] = '\0';
    if (strcmp(cd->topology, "auto") != 0) {
        if ((st = cdp_topology_load(cd->topology, NULL, &real))) return st;
    } else if (!cdp_backend_is_gpu(cd->backend)) {
        return host_topology(plan, t, note, cap);
    } else {
        const int want = cd->devices != CDP_AUTO ? (int)(cd->devices < 65536 ? cd->devices : 65536) : live_gpus;
        struct cdp_discover_options o = {0};
        if (!cdp_topology_discover(&o, &real)) {
            if (real->kind == CDP_TOPOLOGY_GPU && real->n_gpus >= (want ? want : 1) && cd->nodes == 1) {
                snprintf(note, cap, "auto: this machine");
            } else {
                cdp_topology_free(real);
                real = NULL;
            }
        }
        if (!real && want > 0 && want <= live_gpus && cd->nodes == 1 &&
            !(st = cdp_topology_generic_gpus(want, NULL, 0, 0, &real))) {
            snprintf(note, cap, "auto: this machine's %d GPU%s, known only by their count (live discovery did not "
                     "see them: no NVML)", want, want == 1 ? "" : "s");
        }
        if (!real) {
            char spec[64];
            if (cd->nodes > 1) snprintf(spec, sizeof spec, "%lld x dgx-a100", (long long)cd->nodes);
            else snprintf(spec, sizeof spec, "dgx-a100");
            snprintf(note, cap, "auto: this machine has too few GPUs; planning for the %s preset (set "
                     "/cluster/topology to choose)", spec);
            if ((st = cdp_topology_load(spec, NULL, &real))) return st;
        }
    }
    /* /cluster/devices fewer than a node has: the job's ranks use devices 0 to
     * devices-1 of each node (as CUDA numbers them), so only those are planned on */
    int more = 0;
    for (int i = 0; cd->devices != CDP_AUTO && i < real->n_nodes; i++) more |= real->nodes[i].n_gpus > cd->devices;
    if (more) {
        struct cdp_topology *first = NULL;
        st = cdp_topology_first(real, real->n_nodes, (int)cd->devices, &first);
        cdp_topology_free(real);
        if (st) return st;
        real = first;
        size_t o = strlen(note);
        snprintf(note + o, cap - o, "%sdevices 0 to %lld of each node (/cluster/devices %lld)", o ? "; " : "",
                 (long long)cd->devices - 1, (long long)cd->devices);
    }
    if (k == 1) {
        *t = real;
        return CDP_OK;
    }
    st = shared_topology(real, k, t);
    cdp_topology_free(real);
    if (!st) {
        size_t o = strlen(note);
        snprintf(note + o, cap - o, "%s%d ranks share each GPU (/cluster/ranks_per_device)", o ? "; " : "", k);
    }
    return st;
}
