/* Our JSON topology format (docs/topology.md): presets and hand-written
 * machines, one node or a cluster of equal nodes. Also the JSON that
 * `cdphybrid topo --json` prints for scripts. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/json_check.h"
#include "partitioner/topology_internal.h"

#define FORMAT_NAME "cdphybrid-topology"

struct jl {
    struct cdp_json_in in; /* the file name, for messages */
    const char *dir;  /* its folder, for a node given as a path */
    int depth;
};

/* Our words for a bounded integer: "an integer from LO to HI". */
static cdp_status get_int(const struct jl *c, const json_t *v, const char *ptr, long lo, long hi, long *out)
{
    char what[96];
    int64_t x = 0;
    snprintf(what, sizeof what, "an integer from %ld to %ld", lo, hi);
    cdp_status st = cdp_json_int(&c->in, v, ptr, lo, hi, 0, what, &x);
    if (!st) *out = (long)x;
    return st;
}

static cdp_status get_rate(const struct jl *c, const json_t *v, const char *ptr, double *out)
{
    if (json_is_number(v)) return cdp_json_number(&c->in, v, ptr, CDP_JSON_NONNEG, out);
    if (json_is_string(v)) {
        if (cdp_parse_rate(json_string_value(v), out) == CDP_OK) return CDP_OK;
        return cdp_json_context(&c->in, ptr);
    }
    return cdp_json_expected(&c->in, ptr, "a rate: bytes/s, or a string like \"25GB/s\" or \"200Gb/s\"", v);
}

static cdp_status get_size(const struct jl *c, const json_t *v, const char *ptr, uint64_t *out)
{
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return CDP_OK;
    }
    if (json_is_string(v)) {
        if (cdp_parse_size(json_string_value(v), out) == CDP_OK) return CDP_OK;
        return cdp_json_context(&c->in, ptr);
    }
    return cdp_json_expected(&c->in, ptr, "a size: bytes, or a string like \"80GiB\"", v);
}

/* ---- a GPU -------------------------------------------------------------------- */

static const char *const gpu_keys[] = {"name", "memory", "peak_flops", "numa", "cpus", "pci_bus_id", "pcie",
                                       "pcie_bandwidth", NULL};
static const char *const flops_keys[] = {"fp32", "tf32", "bf16", NULL};

struct labels {
    char **v;
    int n;
};

static int label_id(struct labels *L, const char *s)
{
    for (int i = 0; i < L->n; i++)
        if (!strcmp(L->v[i], s)) return i;
    char **p = realloc(L->v, (size_t)(L->n + 1) * sizeof *p);
    if (!p) return -1;
    L->v = p;
    if (!(p[L->n] = strdup(s))) return -1;
    return L->n++;
}

static cdp_status read_gpu(const struct jl *c, const json_t *o, const char *ptr, struct cdp_topology_gpu *g,
                           struct labels *L)
{
    cdp_status st;
    char p[256];
    const json_t *v;
    long n;
    if (!json_is_object(o)) return cdp_json_expected(&c->in, ptr, "an object", o);
    if ((st = cdp_json_check_keys(&c->in, o, ptr, gpu_keys, NULL))) return st;
#define AT(k) (snprintf(p, sizeof p, "%s/%s", ptr, k), p)
    if ((v = json_object_get(o, "name")) && (st = cdp_json_string(&c->in, v, AT("name"), g->name, sizeof g->name)))
        return st;
    if ((v = json_object_get(o, "memory")) && (st = get_size(c, v, AT("memory"), &g->memory_bytes))) return st;
    if ((v = json_object_get(o, "numa"))) {
        if ((st = get_int(c, v, AT("numa"), -1, 4095, &n))) return st;
        g->numa = (int)n;
    }
    if ((v = json_object_get(o, "cpus"))) {
        if ((st = cdp_json_string(&c->in, v, AT("cpus"), g->cpuset, sizeof g->cpuset))) return st;
        int *cpus = NULL, k = 0;
        if (cdp_cpuset_parse_list(g->cpuset, &cpus, &k))
            return cdp_json_context(&c->in, AT("cpus"));
        free(cpus);
    }
    if ((v = json_object_get(o, "pci_bus_id"))) {
        char b[CDP_TOPOLOGY_BUSID_MAX];
        unsigned d, bus, dev, fn;
        if ((st = cdp_json_string(&c->in, v, AT("pci_bus_id"), b, sizeof b))) return st;
        if (cdp_busid_parse(b, &d, &bus, &dev, &fn))
            return cdp_json_expected(&c->in, AT("pci_bus_id"), "a PCI bus id like \"0000:07:00.0\"", v);
        cdp_busid_normalize(b, g->pci_bus_id, sizeof g->pci_bus_id);
    }
    if ((v = json_object_get(o, "pcie_bandwidth")) && (st = get_rate(c, v, AT("pcie_bandwidth"), &g->pcie_bw)))
        return st;
    if ((v = json_object_get(o, "peak_flops"))) {
        const char *fp = AT("peak_flops");
        char fpb[sizeof p + 8];
        snprintf(fpb, sizeof fpb, "%s", fp);
        if (!json_is_object(v))
            return cdp_json_expected(&c->in, fpb, "an object {\"fp32\", \"tf32\", \"bf16\"} of FLOP/s", v);
        if ((st = cdp_json_check_keys(&c->in, v, fpb, flops_keys, NULL))) return st;
        double *dst[] = {&g->peak_fp32, &g->peak_tf32, &g->peak_bf16};
        for (int i = 0; i < 3; i++) {
            const json_t *x = json_object_get(v, flops_keys[i]);
            snprintf(p, sizeof p, "%s/peak_flops/%s", ptr, flops_keys[i]);
            if (x && (st = cdp_json_number(&c->in, x, p, CDP_JSON_NONNEG, dst[i]))) return st;
        }
    }
    if ((v = json_object_get(o, "pcie"))) {
        if (!json_is_array(v) || json_array_size(v) > CDP_TOPOLOGY_PCIE_DEPTH)
            return cdp_json_expected(&c->in, AT("pcie"),
                                     "an array of up to 8 names: the host bridge, then each PCIe switch", v);
        g->pcie_depth = (int)json_array_size(v);
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *x = json_array_get(v, i);
            snprintf(p, sizeof p, "%s/pcie/%zu", ptr, i);
            if (!json_is_string(x)) return cdp_json_expected(&c->in, p, "a name", x);
            int id = label_id(L, json_string_value(x));
            if (id < 0) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
            g->pcie_path[i] = id;
        }
    }
#undef AT
    return CDP_OK;
}

/* ---- a node -------------------------------------------------------------------- */

static const char *const node_keys[] = {"format", "version", "name", "source", "notes", "kind", "numa", "gpu",
                                        "gpus", "nvlink_bandwidth", "sys_bandwidth", "copy_bandwidth", "nvlinks",
                                        "nvswitches", "nics", "network", "device_memory", NULL};
static const char *const cluster_keys[] = {"format", "version", "name", "source", "notes", "nodes", "node",
                                           "network", NULL};
static const char *const numa_keys[] = {"os_index", "cpus", "memory", NULL};
static const char *const switch_keys[] = {"name", "pci_bus_id", "gpu_links", "count", NULL};
static const char *const nic_keys[] = {"name", "pci_bus_id", "numa", "rate", NULL};
static const char *const net_keys[] = {"name", "nics_per_node", "nic_rate", "latency_us", NULL};

static cdp_status read_source(const struct jl *c, const json_t *o, struct cdp_topology *t)
{
    const json_t *s = json_object_get(o, "source");
    if (!s) return cdp_topology_set_source(t, "%s", c->in.file);
    if (json_is_string(s)) return cdp_topology_set_source(t, "%s", json_string_value(s));
    if (!json_is_array(s))
        return cdp_json_expected(&c->in, "/source", "a string or an array of strings (what the file cites)", s);
    struct cdp_buf b = {0};
    for (size_t i = 0; i < json_array_size(s); i++) {
        const json_t *x = json_array_get(s, i);
        if (!json_is_string(x)) {
            free(b.p);
            char p[64];
            snprintf(p, sizeof p, "/source/%zu", i);
            return cdp_json_expected(&c->in, p, "a string", x);
        }
        cdp_buf_printf(&b, "%s%s", i ? "; " : "", json_string_value(x));
    }
    cdp_status st = b.failed ? cdp_fail(CDP_ERR_NOMEM, "out of memory") : cdp_topology_set_source(t, "%s", b.p ? b.p : "");
    free(b.p);
    return st;
}

/* The attributes this reader's values come from, for finalize's messages. */
static const struct cdp_topology_attr_names json_names = {"nvlink_bandwidth", "sys_bandwidth", "copy_bandwidth",
                                                      "pcie_bandwidth", "peak_flops", "nics[].rate",
                                                      "/network/nic_rate", "/network/latency_us (in seconds)"};

static cdp_status read_network(const struct jl *c, const json_t *o, struct cdp_topology_network *net)
{
    cdp_status st;
    const json_t *v;
    long n;
    if (!json_is_object(o)) return cdp_json_expected(&c->in, "/network", "an object", o);
    if ((st = cdp_json_check_keys(&c->in, o, "/network", net_keys, NULL))) return st;
    if ((v = json_object_get(o, "name")) &&
        (st = cdp_json_string(&c->in, v, "/network/name", net->name, sizeof net->name)))
        return st;
    if ((v = json_object_get(o, "nics_per_node"))) {
        if ((st = get_int(c, v, "/network/nics_per_node", 0, 1024, &n))) return st;
        net->nics_per_node = (int)n;
    }
    if ((v = json_object_get(o, "nic_rate")) && (st = get_rate(c, v, "/network/nic_rate", &net->nic_rate))) return st;
    if ((v = json_object_get(o, "latency_us"))) {
        if ((st = cdp_json_number(&c->in, v, "/network/latency_us", CDP_JSON_NONNEG, &net->latency))) return st;
        net->latency *= 1e-6;
    }
    return CDP_OK;
}

static cdp_status read_node(const struct jl *c, const json_t *o, struct cdp_topology **out)
{
    cdp_status st;
    const json_t *v, *gpus = json_object_get(o, "gpus"), *defaults = json_object_get(o, "gpu");
    char p[256];
    long n;
    struct labels L = {0};
    if ((st = cdp_json_check_keys(&c->in, o, "", node_keys, NULL))) return st;
    struct cdp_topology *t = calloc(1, sizeof *t);
    if (!t) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    int cpu = 0;
    if ((v = json_object_get(o, "kind"))) {
        if (!json_is_string(v) || (strcmp(json_string_value(v), "gpu") && strcmp(json_string_value(v), "cpu"))) {
            st = cdp_json_expected(&c->in, "/kind", "\"gpu\" or \"cpu\"", v);
            goto fail;
        }
        cpu = !strcmp(json_string_value(v), "cpu");
    }
    long ng = 0;
    if (gpus && json_is_array(gpus)) ng = (long)json_array_size(gpus);
    else if (gpus && (st = get_int(c, gpus, "/gpus", 0, 4096, &ng))) goto fail;
    else if (!gpus && !cpu) {
        st = cdp_json_fail(&c->in, "/gpus", "missing: a list of GPUs, or their number");
        goto fail;
    }
    const json_t *numa = json_object_get(o, "numa"), *links = json_object_get(o, "nvlinks"),
                 *sws = json_object_get(o, "nvswitches"), *nics = json_object_get(o, "nics");
    if (numa && !json_is_array(numa)) {
        st = cdp_json_expected(&c->in, "/numa", "an array of NUMA nodes", numa);
        goto fail;
    }
    if (sws && !json_is_array(sws)) {
        st = cdp_json_expected(&c->in, "/nvswitches", "an array of NVSwitches", sws);
        goto fail;
    }
    if (nics && !json_is_array(nics)) {
        st = cdp_json_expected(&c->in, "/nics", "an array of NICs", nics);
        goto fail;
    }
    int nsw = 0;
    for (size_t i = 0; sws && i < json_array_size(sws); i++) {
        const json_t *cnt =
            json_is_object(json_array_get(sws, i)) ? json_object_get(json_array_get(sws, i), "count") : NULL;
        long k = 1;
        snprintf(p, sizeof p, "/nvswitches/%zu/count", i);
        if (cnt && (st = get_int(c, cnt, p, 1, 1024, &k))) goto fail;
        nsw += (int)k;
    }
    if ((st = cdp_topology_alloc(t, 1, cpu ? 0 : (int)ng, numa ? (int)json_array_size(numa) : 0, cpu ? 0 : nsw,
                             nics ? (int)json_array_size(nics) : 0)))
        goto fail;
    struct cdp_topology_node *nd = &t->nodes[0];
    if ((st = cdp_topology_node_alloc(nd, cpu ? 0 : (int)ng))) goto fail;
    if ((v = json_object_get(o, "name")) && (st = cdp_json_string(&c->in, v, "/name", t->name, sizeof t->name)))
        goto fail;
    if (!t->name[0]) {
        const char *base = strrchr(c->in.file, '/');
        cdp_topology_copy_str(t->name, sizeof t->name, base ? base + 1 : c->in.file);
        char *dot = strrchr(t->name, '.');
        if (dot && !strcmp(dot, ".json")) *dot = '\0';
    }
    cdp_topology_copy_str(nd->name, sizeof nd->name, t->name);
    if ((st = read_source(c, o, t))) goto fail;
    if ((v = json_object_get(o, "nvlink_bandwidth")) && (st = get_rate(c, v, "/nvlink_bandwidth", &nd->nvlink_bw)))
        goto fail;
    if ((v = json_object_get(o, "sys_bandwidth")) && (st = get_rate(c, v, "/sys_bandwidth", &nd->sys_bw))) goto fail;
    if ((v = json_object_get(o, "copy_bandwidth")) && (st = get_rate(c, v, "/copy_bandwidth", &nd->copy_bw))) goto fail;
    if ((v = json_object_get(o, "network")) && (st = read_network(c, v, &t->network))) goto fail;
    for (size_t i = 0; numa && i < json_array_size(numa); i++) {
        const json_t *x = json_array_get(numa, i);
        struct cdp_topology_numa *nm = &t->numa[i];
        snprintf(p, sizeof p, "/numa/%zu", i);
        if (!json_is_object(x)) {
            st = cdp_json_expected(&c->in, p, "an object {\"os_index\", \"cpus\", \"memory\"}", x);
            goto fail;
        }
        if ((st = cdp_json_check_keys(&c->in, x, p, numa_keys, NULL))) goto fail;
        nm->os_index = (int)i;
        if ((v = json_object_get(x, "os_index"))) {
            snprintf(p, sizeof p, "/numa/%zu/os_index", i);
            if ((st = get_int(c, v, p, 0, 4095, &n))) goto fail;
            nm->os_index = (int)n;
        }
        if ((v = json_object_get(x, "cpus"))) {
            snprintf(p, sizeof p, "/numa/%zu/cpus", i);
            if ((st = cdp_json_string(&c->in, v, p, nm->cpuset, sizeof nm->cpuset))) goto fail;
            int *cpus = NULL, k = 0;
            if (cdp_cpuset_parse_list(nm->cpuset, &cpus, &k)) {
                st = cdp_json_context(&c->in, p);
                goto fail;
            }
            free(cpus);
        }
        snprintf(p, sizeof p, "/numa/%zu/memory", i);
        if ((v = json_object_get(x, "memory")) && (st = get_size(c, v, p, &nm->memory_bytes))) goto fail;
    }
    if (cpu) {
        long devices = 0;
        if (gpus && json_is_array(gpus)) {
            st = cdp_json_fail(&c->in, "/gpus", "a CPU topology takes a number of devices");
            goto fail;
        }
        devices = ng;
        uint64_t mem = 0;
        if ((v = json_object_get(o, "device_memory")) && (st = get_size(c, v, "/device_memory", &mem))) goto fail;
        if ((st = cdp_topology_make_cpu(t, (int)devices, nd->copy_bw))) goto fail;
        if (v)
            for (int g = 0; g < t->n_gpus; g++) t->gpus[g].memory_bytes = mem;
        if (links || sws) {
            st = cdp_json_fail(&c->in, links ? "/nvlinks" : "/nvswitches", "CPU devices have no NVLinks");
            goto fail;
        }
    } else {
        if (defaults && (st = read_gpu(c, defaults, "/gpu", &t->gpus[0], &L))) goto fail;
        struct cdp_topology_gpu base = t->gpus[0];
        if (!defaults) base = (struct cdp_topology_gpu){.numa = -1};
        for (long i = 0; i < ng; i++) {
            struct cdp_topology_gpu *g = &t->gpus[i];
            *g = base;
            g->index = g->local = (int)i;
            g->node = 0;
            if (json_is_array(gpus)) {
                snprintf(p, sizeof p, "/gpus/%ld", i);
                if ((st = read_gpu(c, json_array_get(gpus, (size_t)i), p, g, &L))) goto fail;
            }
        }
        for (size_t i = 0; links && i < json_array_size(links); i++) {
            const json_t *x = json_array_get(links, i);
            long a, b, k;
            snprintf(p, sizeof p, "/nvlinks/%zu", i);
            if (!json_is_array(x) || json_array_size(x) != 3) {
                st = cdp_json_expected(&c->in, p, "[GPU, GPU, links]", x);
                goto fail;
            }
            for (int q = 0; q < 2; q++) {
                const json_t *e = json_array_get(x, (size_t)q);
                if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= ng) {
                    char g2[64];
                    snprintf(p, sizeof p, "/nvlinks/%zu/%d", i, q);
                    st = cdp_json_fail(&c->in, p, "GPU %s does not exist (the file has GPUs 0 to %ld)",
                                       cdp_json_got(e, g2, sizeof g2), ng - 1);
                    goto fail;
                }
            }
            a = (long)json_integer_value(json_array_get(x, 0));
            b = (long)json_integer_value(json_array_get(x, 1));
            snprintf(p, sizeof p, "/nvlinks/%zu/2", i);
            if ((st = get_int(c, json_array_get(x, 2), p, 1, 64, &k))) goto fail;
            snprintf(p, sizeof p, "/nvlinks/%zu", i);
            if (a == b) {
                st = cdp_json_fail(&c->in, p, "a link from GPU %ld to itself", a);
                goto fail;
            }
            if (nd->nvlink_direct[a * ng + b]) {
                st = cdp_json_fail(&c->in, p, "GPU %ld - GPU %ld is listed twice", a, b);
                goto fail;
            }
            nd->nvlink_direct[a * ng + b] = nd->nvlink_direct[b * ng + a] = (int)k;
        }
        if (links && !json_is_array(links)) {
            st = cdp_json_expected(&c->in, "/nvlinks", "an array of [GPU, GPU, links]", links);
            goto fail;
        }
        int s = 0;
        for (size_t i = 0; sws && i < json_array_size(sws); i++) {
            const json_t *x = json_array_get(sws, i);
            snprintf(p, sizeof p, "/nvswitches/%zu", i);
            if (!json_is_object(x)) {
                st = cdp_json_expected(&c->in, p, "an object {\"gpu_links\": [...]}", x);
                goto fail;
            }
            if ((st = cdp_json_check_keys(&c->in, x, p, switch_keys, NULL))) goto fail;
            const json_t *gl = json_object_get(x, "gpu_links"), *cnt = json_object_get(x, "count");
            long count = cnt ? (long)json_integer_value(cnt) : 1;
            snprintf(p, sizeof p, "/nvswitches/%zu/gpu_links", i);
            if (!json_is_array(gl) || (long)json_array_size(gl) != ng) {
                char what[96];
                snprintf(what, sizeof what, "an array of %ld link counts, one per GPU", ng);
                st = cdp_json_expected(&c->in, p, what, gl);
                goto fail;
            }
            for (long r = 0; r < count; r++, s++) {
                struct cdp_topology_nvswitch *sw = &t->nvswitches[s];
                if ((st = cdp_topology_switch_alloc(sw, (int)ng))) goto fail;
                for (long g = 0; g < ng; g++) {
                    snprintf(p, sizeof p, "/nvswitches/%zu/gpu_links/%ld", i, g);
                    if ((st = get_int(c, json_array_get(gl, (size_t)g), p, 0, 64, &n))) goto fail;
                    sw->gpu_links[g] = (int)n;
                }
                if ((v = json_object_get(x, "name"))) {
                    snprintf(p, sizeof p, "/nvswitches/%zu/name", i);
                    if ((st = cdp_json_string(&c->in, v, p, sw->name, sizeof sw->name))) goto fail;
                    if (count > 1) {
                        char nm[CDP_TOPOLOGY_NAME_MAX + 32];
                        snprintf(nm, sizeof nm, "%s%ld", sw->name, r);
                        cdp_topology_copy_str(sw->name, sizeof sw->name, nm);
                    }
                }
                if ((v = json_object_get(x, "pci_bus_id"))) {
                    snprintf(p, sizeof p, "/nvswitches/%zu/pci_bus_id", i);
                    if (count > 1) {
                        st = cdp_json_fail(&c->in, p, "one bus id cannot name %ld switches", count);
                        goto fail;
                    }
                    if ((st = cdp_json_string(&c->in, v, p, sw->pci_bus_id, sizeof sw->pci_bus_id))) goto fail;
                }
            }
        }
    }
    for (size_t i = 0; nics && i < json_array_size(nics); i++) {
        const json_t *x = json_array_get(nics, i);
        struct cdp_topology_nic *nc = &t->nics[i];
        snprintf(p, sizeof p, "/nics/%zu", i);
        if (!json_is_object(x)) {
            st = cdp_json_expected(&c->in, p, "an object {\"name\", \"numa\", \"rate\"}", x);
            goto fail;
        }
        if ((st = cdp_json_check_keys(&c->in, x, p, nic_keys, NULL))) goto fail;
        snprintf(p, sizeof p, "/nics/%zu/name", i);
        if ((v = json_object_get(x, "name")) && (st = cdp_json_string(&c->in, v, p, nc->name, sizeof nc->name)))
            goto fail;
        snprintf(p, sizeof p, "/nics/%zu/pci_bus_id", i);
        if ((v = json_object_get(x, "pci_bus_id")) &&
            (st = cdp_json_string(&c->in, v, p, nc->pci_bus_id, sizeof nc->pci_bus_id)))
            goto fail;
        snprintf(p, sizeof p, "/nics/%zu/rate", i);
        if ((v = json_object_get(x, "rate")) && (st = get_rate(c, v, p, &nc->rate))) goto fail;
        snprintf(p, sizeof p, "/nics/%zu/numa", i);
        if ((v = json_object_get(x, "numa"))) {
            if ((st = get_int(c, v, p, -1, 4095, &n))) goto fail;
            nc->numa = (int)n;
        }
    }
    for (int i = 0; i < L.n; i++) free(L.v[i]);
    free(L.v);
    L.v = NULL;
    L.n = 0;
    if ((st = cdp_topology_finalize_named(t, c->in.file, &json_names))) goto fail;
    *out = t;
    return CDP_OK;
fail:
    for (int i = 0; i < L.n; i++) free(L.v[i]);
    free(L.v);
    cdp_topology_free(t);
    return st;
}

static cdp_status read_cluster(const struct jl *c, const json_t *o, struct cdp_topology **out)
{
    cdp_status st;
    long nodes;
    if ((st = cdp_json_check_keys(&c->in, o, "", cluster_keys, NULL))) return st;
    if ((st = get_int(c, json_object_get(o, "nodes"), "/nodes", 1, 65536, &nodes))) return st;
    const json_t *nv = json_object_get(o, "node");
    struct cdp_topology *node = NULL, *t = NULL;
    if (json_is_string(nv)) {
        if (c->depth > 4) return cdp_json_fail(&c->in, "/node", "nodes nest too deep");
        if ((st = cdp_topology_load(json_string_value(nv), c->dir, &node)))
            return cdp_error_context(st, "%s: /node", c->in.file);
    } else if (json_is_object(nv)) {
        struct jl sub = *c;
        sub.depth++;
        if ((st = read_node(&sub, nv, &node))) return st;
    } else {
        return cdp_json_expected(&c->in, "/node", "a preset name, a file, or a node object", nv);
    }
    if (node->n_nodes != 1) {
        cdp_topology_free(node);
        return cdp_json_fail(&c->in, "/node", "must describe one machine");
    }
    struct cdp_topology_network net = node->network;
    const json_t *v;
    if ((v = json_object_get(o, "network")) && (st = read_network(c, v, &net))) goto done;
    if ((st = cdp_topology_cluster(node, (int)nodes, &net, &t))) goto done;
    if ((v = json_object_get(o, "name")) && (st = cdp_json_string(&c->in, v, "/name", t->name, sizeof t->name)))
        goto done;
    if (json_object_get(o, "source") && (st = read_source(c, o, t))) goto done;
    *out = t;
    t = NULL;
done:
    cdp_topology_free(node);
    cdp_topology_free(t);
    return st;
}

cdp_status cdp_topology_load_native_json(const char *text, size_t len, const char *name, struct cdp_topology **out)
{
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return cdp_fail(CDP_ERR_INVALID, "%s: line %d, column %d: %s", name, err.line, err.column, err.text);
    char *dir = strdup(name);
    cdp_status st = CDP_OK;
    if (!dir) {
        json_decref(root);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    struct jl c = {.in = {.file = name}, .dir = slash ? dir : ".", .depth = 0};
    const json_t *v;
    if (!json_is_object(root)) {
        st = cdp_json_expected(&c.in, "(top)", "an object", root);
        goto done;
    }
    if ((v = json_object_get(root, "format")) &&
        (!json_is_string(v) || strcmp(json_string_value(v), FORMAT_NAME))) {
        st = cdp_json_expected(&c.in, "/format", "\"" FORMAT_NAME "\"", v);
        goto done;
    }
    if ((v = json_object_get(root, "version")) && !(json_is_integer(v) && json_integer_value(v) == 1)) {
        st = cdp_json_expected(&c.in, "/version", "1", v);
        goto done;
    }
    if (json_object_get(root, "nodes")) st = read_cluster(&c, root, out);
    else st = read_node(&c, root, out);
done:
    free(dir);
    json_decref(root);
    return st;
}

/* ---- writing ------------------------------------------------------------------------- */

struct jw {
    int ok;
};

static void put(struct jw *w, json_t *o, const char *k, json_t *v)
{
    if (!v || json_object_set_new(o, k, v)) w->ok = 0;
}

static void push(struct jw *w, json_t *a, json_t *v)
{
    if (!v || json_array_append_new(a, v)) w->ok = 0;
}

static json_t *node_json(struct jw *w, const struct cdp_topology *t, int k)
{
    const struct cdp_topology_node *nd = &t->nodes[k];
    json_t *o = json_object();
    if (!o) {
        w->ok = 0;
        return NULL;
    }
    put(w, o, "name", json_string(t->n_nodes > 1 ? nd->name : t->name));
    put(w, o, "kind", json_string(t->kind == CDP_TOPOLOGY_CPU ? "cpu" : "gpu"));
    if (t->source) put(w, o, "source", json_string(t->source));
    json_t *numa = json_array();
    for (int i = 0; i < t->n_numa; i++) {
        if (t->numa[i].node != k) continue;
        json_t *x = json_object();
        put(w, x, "os_index", json_integer(t->numa[i].os_index));
        put(w, x, "cpus", json_string(t->numa[i].cpuset));
        put(w, x, "memory", json_integer((json_int_t)t->numa[i].memory_bytes));
        push(w, numa, x);
    }
    put(w, o, "numa", numa);
    if (t->kind == CDP_TOPOLOGY_CPU) {
        put(w, o, "gpus", json_integer(nd->n_gpus));
        put(w, o, "copy_bandwidth", json_real(nd->copy_bw));
        put(w, o, "device_memory", json_integer(nd->n_gpus ? (json_int_t)t->gpus[nd->first_gpu].memory_bytes : 0));
    } else {
        put(w, o, "nvlink_bandwidth", json_real(nd->nvlink_bw));
        put(w, o, "sys_bandwidth", json_real(nd->sys_bw));
        json_t *gpus = json_array();
        for (int i = 0; i < nd->n_gpus; i++) {
            const struct cdp_topology_gpu *g = &t->gpus[nd->first_gpu + i];
            json_t *x = json_object(), *f = json_object(), *path = json_array();
            put(w, x, "name", json_string(g->name));
            put(w, x, "memory", json_integer((json_int_t)g->memory_bytes));
            put(w, f, "fp32", json_real(g->peak_fp32));
            put(w, f, "tf32", json_real(g->peak_tf32));
            put(w, f, "bf16", json_real(g->peak_bf16));
            put(w, x, "peak_flops", f);
            put(w, x, "numa", json_integer(g->numa));
            put(w, x, "cpus", json_string(g->cpuset));
            put(w, x, "pci_bus_id", json_string(g->pci_bus_id));
            for (int d = 0; d < g->pcie_depth; d++) {
                char lab[16];
                snprintf(lab, sizeof lab, "%s%d", d == 0 ? "hb" : "sw", g->pcie_path[d]);
                push(w, path, json_string(lab));
            }
            put(w, x, "pcie", path);
            put(w, x, "pcie_bandwidth", json_real(g->pcie_bw));
            push(w, gpus, x);
        }
        put(w, o, "gpus", gpus);
        json_t *links = json_array();
        for (int i = 0; i < nd->n_gpus; i++)
            for (int j = i + 1; j < nd->n_gpus; j++) {
                int c = nd->nvlink_direct[(size_t)i * nd->n_gpus + j];
                if (c) push(w, links, json_pack("[iii]", i, j, c));
            }
        put(w, o, "nvlinks", links);
        json_t *sws = json_array();
        for (int s = 0; s < t->n_nvswitches; s++) {
            const struct cdp_topology_nvswitch *sw = &t->nvswitches[s];
            if (sw->node != k) continue;
            json_t *x = json_object(), *gl = json_array();
            put(w, x, "name", json_string(sw->name));
            put(w, x, "pci_bus_id", json_string(sw->pci_bus_id));
            for (int i = 0; i < nd->n_gpus; i++) push(w, gl, json_integer(sw->gpu_links[i]));
            put(w, x, "gpu_links", gl);
            push(w, sws, x);
        }
        put(w, o, "nvswitches", sws);
    }
    json_t *nics = json_array();
    for (int i = 0; i < t->n_nics; i++) {
        const struct cdp_topology_nic *c = &t->nics[i];
        if (c->node != k) continue;
        json_t *x = json_object();
        put(w, x, "name", json_string(c->name));
        put(w, x, "pci_bus_id", json_string(c->pci_bus_id));
        put(w, x, "numa", json_integer(c->numa));
        put(w, x, "rate", json_real(c->rate));
        push(w, nics, x);
    }
    put(w, o, "nics", nics);
    return o;
}

static json_t *network_json(struct jw *w, const struct cdp_topology_network *n)
{
    json_t *o = json_object();
    put(w, o, "name", json_string(n->name));
    put(w, o, "nics_per_node", json_integer(n->nics_per_node));
    put(w, o, "nic_rate", json_real(n->nic_rate));
    put(w, o, "latency_us", json_real(n->latency * 1e6));
    return o;
}

static cdp_status dump(struct jw *w, json_t *root, char **text)
{
    char *s = w->ok && root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    if (!s) return cdp_fail(CDP_ERR_NOMEM, "topology: out of memory writing JSON");
    *text = s;
    return CDP_OK;
}

cdp_status cdp_topology_to_native_json(const struct cdp_topology *t, char **text)
{
    struct jw w = {1};
    json_t *root;
    for (int k = 1; k < t->n_nodes; k++)
        if (!cdp_topology_nodes_alike(t, 0, k))
            return cdp_fail(CDP_ERR_INVALID, "%s: node %d (%s) differs from node 0 (%s): our JSON describes a "
                            "cluster of one kind of node; export each node and join them in a spec "
                            "(\"1 x a.json + 1 x b.json\")", t->name, k, t->nodes[k].name, t->nodes[0].name);
    if (t->n_nodes == 1) {
        root = node_json(&w, t, 0);
        if (root) {
            json_t *full = json_object();
            put(&w, full, "format", json_string(FORMAT_NAME));
            put(&w, full, "version", json_integer(1));
            json_object_update(full, root);
            json_decref(root);
            root = full;
            put(&w, root, "network", network_json(&w, &t->network));
        }
    } else {
        root = json_object();
        put(&w, root, "format", json_string(FORMAT_NAME));
        put(&w, root, "version", json_integer(1));
        put(&w, root, "name", json_string(t->name));
        if (t->source) put(&w, root, "source", json_string(t->source));
        put(&w, root, "nodes", json_integer(t->n_nodes));
        put(&w, root, "node", node_json(&w, t, 0));
        put(&w, root, "network", network_json(&w, &t->network));
    }
    return dump(&w, root, text);
}

cdp_status cdp_topology_to_json(const struct cdp_topology *t, char **text)
{
    struct jw w = {1};
    json_t *root = json_object(), *nodes = json_array(), *gpus = json_array(), *links = json_array(),
           *bw = json_array(), *lat = json_array(), *sws = json_array(), *nics = json_array();
    put(&w, root, "name", json_string(t->name));
    put(&w, root, "kind", json_string(t->kind == CDP_TOPOLOGY_CPU ? "cpu" : "gpu"));
    put(&w, root, "source", json_string(t->source ? t->source : ""));
    for (int k = 0; k < t->n_nodes; k++) {
        const struct cdp_topology_node *nd = &t->nodes[k];
        json_t *x = json_object(), *numa = json_array();
        put(&w, x, "name", json_string(nd->name));
        put(&w, x, "first_gpu", json_integer(nd->first_gpu));
        put(&w, x, "gpus", json_integer(nd->n_gpus));
        put(&w, x, "nvlink_gbps", json_real(nd->nvlink_bw / 1e9));
        if (t->kind == CDP_TOPOLOGY_CPU) put(&w, x, "copy_gbps", json_real(nd->copy_bw / 1e9));
        for (int i = 0; i < t->n_numa; i++) {
            if (t->numa[i].node != k) continue;
            push(&w, numa, json_pack("{s:i, s:s, s:I}", "os_index", t->numa[i].os_index, "cpus", t->numa[i].cpuset,
                                     "memory_bytes", (json_int_t)t->numa[i].memory_bytes));
        }
        put(&w, x, "numa", numa);
        push(&w, nodes, x);
    }
    for (int g = 0; g < t->n_gpus; g++) {
        const struct cdp_topology_gpu *gp = &t->gpus[g];
        json_t *x = json_object();
        put(&w, x, "index", json_integer(gp->index));
        put(&w, x, "node", json_integer(gp->node));
        put(&w, x, "local", json_integer(gp->local));
        put(&w, x, "name", json_string(gp->name));
        put(&w, x, "pci_bus_id", json_string(gp->pci_bus_id));
        put(&w, x, "memory_bytes", json_integer((json_int_t)gp->memory_bytes));
        put(&w, x, "peak_flops", json_pack("{s:f, s:f, s:f}", "fp32", gp->peak_fp32, "tf32", gp->peak_tf32, "bf16",
                                           gp->peak_bf16));
        put(&w, x, "numa", json_integer(gp->numa));
        put(&w, x, "cpuset", json_string(gp->cpuset));
        put(&w, x, "pcie_gbps", json_real(gp->pcie_bw / 1e9));
        push(&w, gpus, x);
        json_t *lr = json_array(), *br = json_array(), *tr = json_array();
        for (int h = 0; h < t->n_gpus; h++) {
            struct cdp_topology_link l;
            char lab[16];
            cdp_topology_link(t, g, h, &l);
            push(&w, lr, json_string(cdp_topology_link_label(&l, lab, sizeof lab)));
            push(&w, br, json_real(l.bandwidth / 1e9));
            push(&w, tr, json_real(l.latency * 1e6));
        }
        push(&w, links, lr);
        push(&w, bw, br);
        push(&w, lat, tr);
    }
    for (int s = 0; s < t->n_nvswitches; s++) {
        const struct cdp_topology_nvswitch *sw = &t->nvswitches[s];
        json_t *x = json_object(), *gl = json_array();
        put(&w, x, "node", json_integer(sw->node));
        put(&w, x, "name", json_string(sw->name));
        put(&w, x, "pci_bus_id", json_string(sw->pci_bus_id));
        for (int i = 0; i < t->nodes[sw->node].n_gpus; i++) push(&w, gl, json_integer(sw->gpu_links[i]));
        put(&w, x, "gpu_links", gl);
        push(&w, sws, x);
    }
    for (int i = 0; i < t->n_nics; i++) {
        const struct cdp_topology_nic *c = &t->nics[i];
        push(&w, nics, json_pack("{s:i, s:s, s:s, s:i, s:f}", "node", c->node, "name", c->name, "pci_bus_id",
                                 c->pci_bus_id, "numa", c->numa, "rate_gbps", c->rate / 1e9));
    }
    put(&w, root, "nodes", nodes);
    put(&w, root, "gpus", gpus);
    put(&w, root, "links", links);
    put(&w, root, "bandwidth_gbps", bw);
    put(&w, root, "latency_us", lat);
    put(&w, root, "nvswitches", sws);
    put(&w, root, "nics", nics);
    put(&w, root, "network", json_pack("{s:s, s:i, s:f, s:f}", "name", t->network.name, "nics_per_node",
                                       t->network.nics_per_node, "nic_gbps", t->network.nic_rate / 1e9,
                                       "latency_us", t->network.latency * 1e6));
    return dump(&w, root, text);
}
