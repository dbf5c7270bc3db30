/* hwloc v2 XML: reading (files, and live discovery through hwloc's own XML
 * export) and writing. GPUs are PCI devices of vendor 0x10de and class 0x03xx;
 * NVLinks come from the NVLinkBandwidth distances matrix (switch ports merged,
 * then GPU<->GPU through the fabric); PCIe classes from the bridge tree. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/file.h"
#include "partitioner/topology_internal.h"

enum { R_OTHER = 0, R_GPU, R_SWITCH, R_NIC };

struct hobj {
    const struct cdp_xml *x;
    const char *type;
    long gp;
    int parent;   /* index in the list, -1 for the root */
    int io;       /* Bridge, PCIDev, OSDev, Misc */
    int host;     /* a host bridge */
    unsigned cls, vendor, device;
    char ids[16]; /* "vvvv:dddd" of a bridge */
    int role;
    int slot;     /* GPU, switch or NIC number in document order */
};

struct hload {
    const char *name;
    struct hobj *o;
    int n, cap;
};

static cdp_status collect(struct hload *h, const struct cdp_xml *x, int parent)
{
    if (strcmp(x->name, "object") != 0) return CDP_OK;
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 256;
        struct hobj *o = realloc(h->o, (size_t)cap * sizeof *o);
        if (!o) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", h->name);
        h->o = o;
        h->cap = cap;
    }
    int me = h->n++;
    struct hobj *o = &h->o[me];
    memset(o, 0, sizeof *o);
    o->x = x;
    o->parent = parent;
    o->type = cdp_xml_attr(x, "type");
    if (!o->type) return cdp_fail(CDP_ERR_INVALID, "%s: line %d: <object> without a type", h->name, x->line);
    const char *gp = cdp_xml_attr(x, "gp_index");
    o->gp = gp ? strtol(gp, NULL, 10) : -1;
    o->io = !strcmp(o->type, "Bridge") || !strcmp(o->type, "PCIDev") || !strcmp(o->type, "OSDev") ||
            !strcmp(o->type, "Misc");
    const char *bt = cdp_xml_attr(x, "bridge_type");
    o->host = !strcmp(o->type, "Bridge") && bt && bt[0] == '0';
    const char *pt = cdp_xml_attr(x, "pci_type");
    if (pt) {
        unsigned sv, sd, rev;
        if (sscanf(pt, "%x [%x:%x] [%x:%x] %x", &o->cls, &o->vendor, &o->device, &sv, &sd, &rev) < 3)
            return cdp_fail(CDP_ERR_INVALID, "%s: line %d: pci_type \"%s\": expected \"CCCC [VVVV:DDDD] ...\"",
                            h->name, x->line, pt);
        snprintf(o->ids, sizeof o->ids, "%04x:%04x", o->vendor & 0xffff, o->device & 0xffff);
    }
    if (!strcmp(o->type, "PCIDev")) {
        const char *sub = cdp_xml_attr(x, "subtype");
        if (sub && !strcmp(sub, "NVSwitch")) o->role = R_SWITCH;
        else if (o->vendor == 0x10de && (o->cls >> 8) == 0x03) o->role = R_GPU;
        else if (o->vendor == 0x10de && o->cls == 0x0680) o->role = R_SWITCH;
        else if ((o->cls >> 8) == 0x02) o->role = R_NIC;
    }
    for (int i = 0; i < x->n_kids; i++) {
        cdp_status st = collect(h, x->kids[i], me);
        if (st) return st;
    }
    return CDP_OK;
}

static const char *info(const struct cdp_xml *x, const char *key)
{
    for (int i = 0; i < x->n_kids; i++) {
        const struct cdp_xml *k = x->kids[i];
        if (!strcmp(k->name, "info")) {
            const char *n = cdp_xml_attr(k, "name");
            if (n && !strcmp(n, key)) return cdp_xml_attr(k, "value");
        }
    }
    return NULL;
}

/* An info value on the object or on any of its OSDev children. */
static const char *info_deep(const struct hload *h, int i, const char *key)
{
    const char *v = info(h->o[i].x, key);
    for (int k = i + 1; !v && k < h->n; k++)
        if (h->o[k].parent == i && !strcmp(h->o[k].type, "OSDev")) v = info(h->o[k].x, key);
    return v;
}

static double info_real(const struct hload *h, int i, const char *key, double dflt)
{
    const char *v = info_deep(h, i, key);
    return v ? strtod(v, NULL) : dflt;
}

static int first_bit(const char *mask, int *count)
{
    /* nodeset "0x00000003" (words most significant first). */
    char list[CDP_TOPOLOGY_CPUSET_MAX];
    *count = 0;
    if (!mask || cdp_cpuset_from_mask(mask, list, sizeof list)) return -1;
    int *v = NULL, n = 0;
    if (cdp_cpuset_parse_list(list, &v, &n)) return -1;
    int first = n > 0 ? v[0] : -1;
    *count = n;
    free(v);
    return first;
}

/* NUMA node and CPUs of the nearest non-I/O ancestor. */
static void locality(const struct hload *h, int i, int *numa, char *cpuset, size_t cap)
{
    int a = h->o[i].parent;
    while (a >= 0 && h->o[a].io) a = h->o[a].parent;
    *numa = -1;
    cpuset[0] = '\0';
    if (a < 0) return;
    int count;
    int first = first_bit(cdp_xml_attr(h->o[a].x, "nodeset"), &count);
    if (count == 1) *numa = first;
    const char *cs = cdp_xml_attr(h->o[a].x, "cpuset");
    if (cs && cdp_cpuset_from_mask(cs, cpuset, cap)) cpuset[0] = '\0';
}

/* Host bridge, then one entry per PCIe switch (an upstream and a downstream
 * port with the same ids; a lone bridge such as a root port is no switch). */
static int pcie_path(const struct hload *h, int i, int *path)
{
    int chain[64], n = 0;
    for (int a = h->o[i].parent; a >= 0 && h->o[a].io && n < 64; a = h->o[a].parent)
        if (!strcmp(h->o[a].type, "Bridge")) chain[n++] = a;
    int depth = 0, k = n - 1;
    if (k >= 0 && h->o[chain[k]].host) path[depth++] = chain[k--];
    while (k >= 0) {
        int g0 = k;
        while (k >= 0 && !strcmp(h->o[chain[k]].ids, h->o[chain[g0]].ids)) k--;
        int len = g0 - k;
        for (int s = 0; s + 1 < len && depth < CDP_TOPOLOGY_PCIE_DEPTH; s += 2) path[depth++] = chain[g0 - s];
    }
    return depth;
}

static int osdev_index(const struct hload *h, int i, const char *prefix)
{
    size_t n = strlen(prefix);
    for (int k = i + 1; k < h->n; k++) {
        if (h->o[k].parent != i || strcmp(h->o[k].type, "OSDev")) continue;
        const char *nm = cdp_xml_attr(h->o[k].x, "name");
        if (nm && !strncmp(nm, prefix, n) && nm[n] >= '0' && nm[n] <= '9') return atoi(nm + n);
    }
    return -1;
}

struct gpu_order {
    int obj;
    long key;
};

static int order_cmp(const void *x, const void *y)
{
    const struct gpu_order *a = x, *b = y;
    return (a->key > b->key) - (a->key < b->key);
}

/* Collects the text of the children named kid, space separated. */
static char *kid_text(const struct cdp_xml *x, const char *kid)
{
    struct cdp_buf b = {0};
    cdp_buf_printf(&b, " ");
    for (int i = 0; i < x->n_kids; i++)
        if (!strcmp(x->kids[i]->name, kid) && x->kids[i]->text) cdp_buf_printf(&b, "%s ", x->kids[i]->text);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* The attributes this reader's values come from, for finalize's messages. */
static const struct cdp_topology_attr_names hwloc_names = {
    "info CDPNVLinkBandwidth (or NVLinkBandwidth)", "info CDPSysBandwidth", "info CDPCopyBandwidth",
    "info CDPPCIeBandwidth (or pci_link_speed)", "info CDPPeakFP32/TF32/BF16", "info CDPRate", "info CDPNetworkRate",
    "info CDPNetworkLatency"};

static cdp_status read_nvlink_matrix(const struct hload *h, const struct cdp_xml *d, struct cdp_topology *t,
                                     const int *gpu_of_obj, double rate)
{
    cdp_status st = CDP_OK;
    const char *nb = cdp_xml_attr(d, "nbobjs");
    long n = nb ? strtol(nb, NULL, 10) : -1;
    int hetero = !strcmp(d->name, "distances2hetero");
    const char *type = cdp_xml_attr(d, "type");
    const char *indexing = cdp_xml_attr(d, "indexing");
    if (n <= 0 || n > 4096)
        return cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth: nbobjs \"%s\" is not a count", h->name,
                        d->line, nb ? nb : "");
    char *idx = kid_text(d, "indexes"), *val = kid_text(d, "u64values");
    int *obj = calloc((size_t)n, sizeof *obj);
    double *m = calloc((size_t)n * (size_t)n, sizeof *m);
    int *sw_of = NULL;
    if (!idx || !val || !obj || !m) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", h->name);
        goto done;
    }
    char *p = idx;
    for (long i = 0; i < n; i++) {
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        char *tok = p;
        while (*p && *p != ' ' && *p != '\n' && *p != '\t') p++;
        if (*p) *p++ = '\0';
        if (!*tok) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth: %ld objects announced, %ld listed",
                          h->name, d->line, n, i);
            goto done;
        }
        const char *want_type = type;
        char *colon = strchr(tok, ':');
        if (hetero || colon) {
            if (!colon) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth: index \"%s\": expected Type:gp_index",
                              h->name, d->line, tok);
                goto done;
            }
            *colon = '\0';
            want_type = tok;
            tok = colon + 1;
        } else if (indexing && strcmp(indexing, "gp")) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth indexed by %s: only gp indexes name "
                          "I/O objects", h->name, d->line, indexing);
            goto done;
        }
        char *end;
        long gp = strtol(tok, &end, 10);
        int found = -1;
        for (int k = 0; *end == '\0' && k < h->n && found < 0; k++)
            if (h->o[k].gp == gp && (!want_type || !strcmp(h->o[k].type, want_type))) found = k;
        if (found < 0) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth refers to %s:%s, which is not in the "
                          "file (a link to a device that does not exist)", h->name, d->line,
                          want_type ? want_type : "object", tok);
            goto done;
        }
        obj[i] = found;
    }
    p = val;
    for (long i = 0; i < n * n; i++) {
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        char *end;
        if (*p == '-') {
            st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth: negative bandwidth %.20s between "
                          "objects %ld and %ld", h->name, d->line, p, i / n, i % n);
            goto done;
        }
        double v = strtod(p, &end);
        if (end == p) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth: %ld objects need %ld values, "
                          "found %ld", h->name, d->line, n, n * n, i);
            goto done;
        }
        m[i] = v;
        p = end;
    }
    /* Roles: GPUs (their OSDevs or the PCI device itself) and NVSwitches. */
    sw_of = malloc((size_t)n * sizeof *sw_of);
    if (!sw_of) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", h->name);
        goto done;
    }
    int *gpu_at = obj; /* reused: GPU index or -1 */
    for (long i = 0; i < n; i++) {
        int o = obj[i];
        if (!strcmp(h->o[o].type, "OSDev") && h->o[o].parent >= 0) o = h->o[o].parent;
        sw_of[i] = h->o[o].role == R_SWITCH ? h->o[o].slot : -1;
        gpu_at[i] = h->o[o].role == R_GPU ? gpu_of_obj[o] : -1;
    }
    struct cdp_topology_node *nd = &t->nodes[0];
    int ng = nd->n_gpus, linked = 0;
    for (long i = 0; i < n; i++) {
        for (long j = 0; j < n; j++) {
            if (i == j || gpu_at[i] < 0) continue;
            double v = m[i * n + j], w = m[j * n + i];
            if (gpu_at[j] >= 0 && v != w) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: NVLinkBandwidth: GPU %d -> GPU %d is %.0f MB/s but "
                              "GPU %d -> GPU %d is %.0f MB/s", h->name, d->line, gpu_at[i], gpu_at[j], v,
                              gpu_at[j], gpu_at[i], w);
                goto done;
            }
            if (v <= 0) continue;
            int links = (int)lround(v * 1e6 / rate);
            if (links < 1) links = 1;
            if (fabs(links * rate - v * 1e6) > 0.01 * v * 1e6)
                CDP_INFO(TOPO, "%s: %.0f MB/s is not a whole number of %.0f MB/s NVLinks; counted as %d", h->name,
                         v, rate / 1e6, links);
            if (gpu_at[j] >= 0) {
                nd->nvlink_direct[(size_t)gpu_at[i] * ng + gpu_at[j]] = links;
                linked++;
            } else if (sw_of[j] >= 0) {
                t->nvswitches[sw_of[j]].gpu_links[gpu_at[i]] = links;
                linked++;
            }
        }
    }
    CDP_INFO(TOPO, "%s: NVLinkBandwidth: %ld objects, %d non-zero GPU entries, %.0f MB/s per NVLink", h->name, n, linked,
             rate / 1e6);
done:
    free(idx);
    free(val);
    free(obj);
    free(m);
    free(sw_of);
    return st;
}

cdp_status cdp_topology_load_hwloc_xml(const struct cdp_xml *root, const char *name, struct cdp_topology **out)
{
    cdp_status st;
    struct hload h = {.name = name};
    struct cdp_topology *t = NULL;
    int *gpu_of_obj = NULL;
    struct gpu_order *ord = NULL;
    const char *ver = cdp_xml_attr(root, "version");
    if (!ver)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: hwloc 1.x XML (<topology> without a version) is not read; "
                        "export it again with hwloc 2 (lstopo file.xml)", name);
    if (ver[0] != '2')
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: hwloc XML version \"%s\": this build reads hwloc v2 XML only "
                        "(topology version=\"2.x\"); hwloc %c.x files do not load in hwloc 2.9 either; export "
                        "it again with hwloc 2.x (lstopo-no-graphics --of xml)", name, ver, ver[0]);
    const struct cdp_xml *machine = NULL;
    for (int i = 0; i < root->n_kids; i++) {
        if (!strcmp(root->kids[i]->name, "object")) {
            if (machine)
                return cdp_fail(CDP_ERR_INVALID, "%s: line %d: a second top-level <object>", name, root->kids[i]->line);
            machine = root->kids[i];
        }
    }
    if (!machine) return cdp_fail(CDP_ERR_INVALID, "%s: no <object type=\"Machine\"> in <topology>", name);
    if ((st = collect(&h, machine, -1))) goto fail;

    int ng = 0, nsw = 0, nnic = 0, nnuma = 0;
    for (int i = 0; i < h.n; i++) {
        if (h.o[i].role == R_GPU) h.o[i].slot = ng++;
        else if (h.o[i].role == R_SWITCH) h.o[i].slot = nsw++;
        else if (h.o[i].role == R_NIC) h.o[i].slot = nnic++;
        nnuma += !strcmp(h.o[i].type, "NUMANode");
    }
    t = calloc(1, sizeof *t);
    if (!t || (st = cdp_topology_alloc(t, 1, ng, nnuma, nsw, nnic))) {
        st = t ? st : cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    struct cdp_topology_node *nd = &t->nodes[0];
    if ((st = cdp_topology_node_alloc(nd, ng))) goto fail;
    const char *v;
    if ((v = info(machine, "CDPTopologyName")) || (v = info(machine, "HostName")))
        cdp_topology_copy_str(t->name, sizeof t->name, v);
    else {
        const char *base = strrchr(name, '/');
        cdp_topology_copy_str(t->name, sizeof t->name, base ? base + 1 : name);
    }
    cdp_topology_copy_str(nd->name, sizeof nd->name, (v = info(machine, "CDPNodeName")) ? v : t->name);
    nd->sys_bw = (v = info(machine, "CDPSysBandwidth")) ? strtod(v, NULL) : 0;
    nd->copy_bw = (v = info(machine, "CDPCopyBandwidth")) ? strtod(v, NULL) : 0;
    if ((v = info(machine, "CDPNetworkName"))) cdp_topology_copy_str(t->network.name, sizeof t->network.name, v);
    if ((v = info(machine, "CDPNetworkNICs"))) t->network.nics_per_node = atoi(v);
    if ((v = info(machine, "CDPNetworkRate"))) t->network.nic_rate = strtod(v, NULL);
    if ((v = info(machine, "CDPNetworkLatency"))) t->network.latency = strtod(v, NULL);

    /* GPUs in NVML (else CUDA) index order when every GPU has one, else as listed. */
    gpu_of_obj = malloc((size_t)h.n * sizeof *gpu_of_obj);
    ord = calloc(ng > 0 ? (size_t)ng : 1, sizeof *ord);
    if (!gpu_of_obj || !ord) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    const char *prefixes[] = {"nvml", "cuda"};
    int keyed = 0;
    for (int pfx = 0; pfx < 2 && !keyed; pfx++) {
        int all = ng > 0;
        for (int i = 0; i < h.n; i++) {
            if (h.o[i].role != R_GPU) continue;
            int k = osdev_index(&h, i, prefixes[pfx]);
            ord[h.o[i].slot] = (struct gpu_order){i, k};
            if (k < 0) all = 0;
        }
        keyed = all;
    }
    if (!keyed)
        for (int i = 0; i < ng; i++) ord[i].key = i;
    qsort(ord, (size_t)ng, sizeof *ord, order_cmp);
    for (int i = 0; i < h.n; i++) gpu_of_obj[i] = -1;
    for (int g = 0; g < ng; g++) {
        int i = ord[g].obj;
        if (g > 0 && ord[g].key == ord[g - 1].key) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: two GPUs have the index %ld", name, h.o[i].x->line, ord[g].key);
            goto fail;
        }
        gpu_of_obj[i] = g;
        struct cdp_topology_gpu *gp = &t->gpus[g];
        gp->index = gp->local = g;
        const char *model = info_deep(&h, i, "GPUModel");
        if (!model) model = cdp_gpu_name_by_pci_id(h.o[i].device);
        if (model) cdp_topology_copy_str(gp->name, sizeof gp->name, model);
        else snprintf(gp->name, sizeof gp->name, "NVIDIA GPU [10de:%04x]", h.o[i].device & 0xffff);
        cdp_busid_normalize(cdp_xml_attr(h.o[i].x, "pci_busid"), gp->pci_bus_id, sizeof gp->pci_bus_id);
        if ((v = info_deep(&h, i, "CDPMemoryBytes"))) gp->memory_bytes = strtoull(v, NULL, 10);
        else if ((v = info_deep(&h, i, "CUDAGlobalMemorySize"))) gp->memory_bytes = strtoull(v, NULL, 10) * 1024;
        gp->peak_fp32 = info_real(&h, i, "CDPPeakFP32", 0);
        gp->peak_tf32 = info_real(&h, i, "CDPPeakTF32", 0);
        gp->peak_bf16 = info_real(&h, i, "CDPPeakBF16", 0);
        const char *ls = cdp_xml_attr(h.o[i].x, "pci_link_speed");
        gp->pcie_bw = info_real(&h, i, "CDPPCIeBandwidth", ls ? strtod(ls, NULL) * 1e9 : 0);
        locality(&h, i, &gp->numa, gp->cpuset, sizeof gp->cpuset);
        gp->pcie_depth = pcie_path(&h, i, gp->pcie_path);
    }
    int q = 0;
    for (int i = 0; i < h.n; i++) {
        if (strcmp(h.o[i].type, "NUMANode")) continue;
        struct cdp_topology_numa *nm = &t->numa[q++];
        const char *os = cdp_xml_attr(h.o[i].x, "os_index");
        nm->os_index = os ? atoi(os) : q - 1;
        const char *cs = cdp_xml_attr(h.o[i].x, "cpuset");
        if (cs && (st = cdp_cpuset_from_mask(cs, nm->cpuset, sizeof nm->cpuset)))
            goto fail_ctx;
        const char *mem = cdp_xml_attr(h.o[i].x, "local_memory");
        nm->memory_bytes = mem ? strtoull(mem, NULL, 10) : 0;
    }
    for (int i = 0; i < h.n; i++) {
        if (h.o[i].role == R_SWITCH) {
            struct cdp_topology_nvswitch *sw = &t->nvswitches[h.o[i].slot];
            if ((st = cdp_topology_switch_alloc(sw, ng))) goto fail;
            cdp_busid_normalize(cdp_xml_attr(h.o[i].x, "pci_busid"), sw->pci_bus_id, sizeof sw->pci_bus_id);
            if ((v = info(h.o[i].x, "CDPName"))) cdp_topology_copy_str(sw->name, sizeof sw->name, v);
            else snprintf(sw->name, sizeof sw->name, "nvswitch%d", h.o[i].slot);
        } else if (h.o[i].role == R_NIC) {
            struct cdp_topology_nic *c = &t->nics[h.o[i].slot];
            cdp_busid_normalize(cdp_xml_attr(h.o[i].x, "pci_busid"), c->pci_bus_id, sizeof c->pci_bus_id);
            const char *nm = NULL;
            for (int k = i + 1; k < h.n; k++) {
                if (h.o[k].parent != i || strcmp(h.o[k].type, "OSDev")) continue;
                const char *ot = cdp_xml_attr(h.o[k].x, "osdev_type");
                if (!nm || (ot && !strcmp(ot, "3"))) nm = cdp_xml_attr(h.o[k].x, "name");
            }
            if (nm) cdp_topology_copy_str(c->name, sizeof c->name, nm);
            else snprintf(c->name, sizeof c->name, "nic-%s", c->pci_bus_id);
            c->rate = info_real(&h, i, "CDPRate", 0);
            char cpus[CDP_TOPOLOGY_CPUSET_MAX];
            locality(&h, i, &c->numa, cpus, sizeof cpus);
        }
    }
    double rate = info_real(&h, 0, "CDPNVLinkBandwidth", 0);
    if (rate <= 0) {
        const struct cdp_gpu_facts *f = ng ? cdp_gpu_facts_find(t->gpus[0].name) : NULL;
        rate = f ? f->nvlink_rate : CDP_TOPOLOGY_DEFAULT_NVLINK_BW;
    }
    nd->nvlink_bw = rate;
    int matrices = 0;
    for (int i = 0; i < root->n_kids; i++) {
        const struct cdp_xml *d = root->kids[i];
        const char *dn = cdp_xml_attr(d, "name");
        if ((strcmp(d->name, "distances2") && strcmp(d->name, "distances2hetero")) || !dn ||
            strcmp(dn, "NVLinkBandwidth"))
            continue;
        if ((st = read_nvlink_matrix(&h, d, t, gpu_of_obj, rate))) goto fail;
        matrices++;
    }
    if (!matrices && ng > 0)
        CDP_INFO(TOPO, "%s: no NVLinkBandwidth matrix (hwloc without NVML, or before 2.5): GPU links "
                 "from the PCI tree only", name);
    if ((v = info(machine, "CDPKind")) && !strcmp(v, "cpu")) {
        const char *nd_s = info(machine, "CDPDevices");
        if ((st = cdp_topology_make_cpu(t, nd_s ? atoi(nd_s) : 0, nd->copy_bw))) goto fail;
        if ((v = info(machine, "CDPDeviceMemory")))
            for (int g = 0; g < t->n_gpus; g++) t->gpus[g].memory_bytes = strtoull(v, NULL, 10);
    }
    if ((v = info(machine, "CDPSource"))) st = cdp_topology_set_source(t, "%s", v);
    else st = cdp_topology_set_source(t, "hwloc XML %s", name);
    if (st || (st = cdp_topology_finalize_named(t, name, &hwloc_names))) goto fail;
    CDP_INFO(TOPO, "%s: hwloc XML %s: %d GPUs, %d NVSwitches, %d NICs, %d NUMA nodes", name, ver, t->kind == CDP_TOPOLOGY_GPU ? t->n_gpus : 0,
             t->n_nvswitches, t->n_nics, t->n_numa);
    free(h.o);
    free(gpu_of_obj);
    free(ord);
    *out = t;
    return CDP_OK;
fail_ctx:
    st = cdp_error_context(st, "%s", name);
fail:
    free(h.o);
    free(gpu_of_obj);
    free(ord);
    cdp_topology_free(t);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------ */

struct hw {
    struct cdp_buf b;
    const struct cdp_topology *t;
    int gp;      /* next gp_index */
    int bus;     /* next synthetic bridge bus */
    int *gpu_gp; /* gp_index of each GPU's OSDev */
    int *sw_gp;
    cdp_status st;
};

static void indent(struct hw *w, int d)
{
    for (int i = 0; i < d; i++) cdp_buf_printf(&w->b, "  ");
}

static void info_line(struct hw *w, int d, const char *k, const char *fmt, ...) CDP_PRINTF(4, 5);
static void info_line(struct hw *w, int d, const char *k, const char *fmt, ...)
{
    char v[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    indent(w, d);
    cdp_buf_printf(&w->b, "<info name=\"%s\" value=\"", k);
    cdp_buf_escaped(&w->b, v);
    cdp_buf_printf(&w->b, "\"/>\n");
}

static void sets(struct hw *w, const char *cpumask, const char *nodemask)
{
    cdp_buf_printf(&w->b, " cpuset=\"%s\" complete_cpuset=\"%s\" nodeset=\"%s\" complete_nodeset=\"%s\"", cpumask,
                   cpumask, nodemask, nodemask);
}

static void bridge_open(struct hw *w, int d, int depth)
{
    int bus = w->bus++;
    indent(w, d);
    cdp_buf_printf(&w->b, "<object type=\"Bridge\" gp_index=\"%d\" bridge_type=\"1-1\" depth=\"%d\" "
                   "bridge_pci=\"%04x:[%02x-%02x]\" pci_busid=\"%04x:%02x:00.0\" "
                   "pci_type=\"0604 [10b5:c010] [10b5:c010] 00\" pci_link_speed=\"0.000000\">\n",
                   w->gp++, depth, 0x8000 | (bus >> 8), bus & 0xff, bus & 0xff, 0x8000 | (bus >> 8), bus & 0xff);
}

static void gpu_obj(struct hw *w, int d, int g)
{
    const struct cdp_topology_gpu *gp = &w->t->gpus[g];
    indent(w, d);
    cdp_buf_printf(&w->b, "<object type=\"PCIDev\" gp_index=\"%d\" pci_busid=\"%s\" pci_type=\"0302 [10de:0000] "
                   "[10de:0000] a1\" pci_link_speed=\"%.17g\">\n", w->gp++, gp->pci_bus_id, gp->pcie_bw / 1e9);
    indent(w, d + 1);
    w->gpu_gp[g] = w->gp;
    cdp_buf_printf(&w->b, "<object type=\"OSDev\" gp_index=\"%d\" name=\"nvml%d\" subtype=\"NVML\" osdev_type=\"1\">\n",
                   w->gp++, gp->local);
    info_line(w, d + 2, "Backend", "NVML");
    info_line(w, d + 2, "GPUVendor", "NVIDIA Corporation");
    info_line(w, d + 2, "GPUModel", "%s", gp->name);
    info_line(w, d + 2, "CDPMemoryBytes", "%llu", (unsigned long long)gp->memory_bytes);
    info_line(w, d + 2, "CDPPeakFP32", "%.17g", gp->peak_fp32);
    info_line(w, d + 2, "CDPPeakTF32", "%.17g", gp->peak_tf32);
    info_line(w, d + 2, "CDPPeakBF16", "%.17g", gp->peak_bf16);
    info_line(w, d + 2, "CDPPCIeBandwidth", "%.17g", gp->pcie_bw);
    indent(w, d + 1);
    cdp_buf_printf(&w->b, "</object>\n");
    indent(w, d);
    cdp_buf_printf(&w->b, "</object>\n");
}

/* Emits the subtree of the GPUs whose path starts with prefix[0..level-1]:
 * GPUs that end at this level, then a switch per distinct next id. */
static void emit_level(struct hw *w, int d, const int *prefix, int level, int numa)
{
    const struct cdp_topology *t = w->t;
    int n = t->nodes[0].n_gpus;
    for (int g = 0; g < n; g++) {
        const struct cdp_topology_gpu *gp = &t->gpus[g];
        if (gp->pcie_depth != level || memcmp(gp->pcie_path, prefix, (size_t)level * sizeof *prefix)) continue;
        if (level == 0 && gp->numa != numa) continue;
        if (level > 1) bridge_open(w, d, level); /* the switch's downstream port */
        gpu_obj(w, level > 1 ? d + 1 : d, g);
        if (level > 1) {
            indent(w, d);
            cdp_buf_printf(&w->b, "</object>\n");
        }
    }
    for (int g = 0; g < n; g++) {
        const struct cdp_topology_gpu *gp = &t->gpus[g];
        if (gp->pcie_depth <= level || memcmp(gp->pcie_path, prefix, (size_t)level * sizeof *prefix)) continue;
        int id = gp->pcie_path[level], first = 1;
        for (int h = 0; h < g; h++)
            if (t->gpus[h].pcie_depth > level && !memcmp(t->gpus[h].pcie_path, prefix, (size_t)level * sizeof *prefix) &&
                t->gpus[h].pcie_path[level] == id)
                first = 0;
        if (!first) continue;
        int sub[CDP_TOPOLOGY_PCIE_DEPTH];
        memcpy(sub, prefix, (size_t)level * sizeof *sub);
        sub[level] = id;
        if (level == 0) {
            /* A host bridge goes under the NUMA node of the first GPU behind it. */
            if (gp->numa != numa) continue;
            indent(w, d);
            cdp_buf_printf(&w->b, "<object type=\"Bridge\" gp_index=\"%d\" bridge_type=\"0-1\" depth=\"0\" "
                           "bridge_pci=\"%04x:[00-ff]\">\n", w->gp++, id);
            emit_level(w, d + 1, sub, level + 1, numa);
        } else {
            if (level > 1) bridge_open(w, d, level); /* downstream port of the parent switch */
            int dd = level > 1 ? d + 1 : d;
            bridge_open(w, dd, level);               /* this switch's upstream port */
            emit_level(w, dd + 1, sub, level + 1, numa);
            indent(w, dd);
            cdp_buf_printf(&w->b, "</object>\n");
            if (level > 1) {
                indent(w, d);
                cdp_buf_printf(&w->b, "</object>\n");
            }
            continue;
        }
        indent(w, d);
        cdp_buf_printf(&w->b, "</object>\n");
    }
}

static void matrix(struct hw *w, int ng, int nsw)
{
    const struct cdp_topology *t = w->t;
    const struct cdp_topology_node *nd = &t->nodes[0];
    int n = ng + nsw;
    struct cdp_buf line = {0};
    if (nsw)
        cdp_buf_printf(&w->b, "  <distances2hetero nbobjs=\"%d\" kind=\"25\" name=\"NVLinkBandwidth\">\n", n);
    else
        cdp_buf_printf(&w->b, "  <distances2 type=\"OSDev\" nbobjs=\"%d\" kind=\"9\" indexing=\"gp\" "
                       "name=\"NVLinkBandwidth\">\n", n);
    for (int i = 0; i < n; i++) {
        if (nsw) cdp_buf_printf(&line, "%s:%d ", i < ng ? "OSDev" : "PCIDev", i < ng ? w->gpu_gp[i] : w->sw_gp[i - ng]);
        else cdp_buf_printf(&line, "%d ", w->gpu_gp[i]);
    }
    cdp_buf_printf(&w->b, "    <indexes length=\"%zu\">%s</indexes>\n", line.n, line.p ? line.p : "");
    for (int i = 0; i < n; i++) {
        line.n = 0;
        for (int j = 0; j < n; j++) {
            long long mb = 0;
            if (i == j) mb = 1000000;
            else if (i < ng && j < ng) mb = llround(nd->nvlink_direct[(size_t)i * ng + j] * nd->nvlink_bw / 1e6);
            else if (i < ng) mb = llround(t->nvswitches[j - ng].gpu_links[i] * nd->nvlink_bw / 1e6);
            else if (j < ng) mb = llround(t->nvswitches[i - ng].gpu_links[j] * nd->nvlink_bw / 1e6);
            cdp_buf_printf(&line, "%lld ", mb);
        }
        cdp_buf_printf(&w->b, "    <u64values length=\"%zu\">%s</u64values>\n", line.n, line.p ? line.p : "");
    }
    if (line.failed) w->b.failed = 1;
    free(line.p);
    cdp_buf_printf(&w->b, nsw ? "  </distances2hetero>\n" : "  </distances2>\n");
}

cdp_status cdp_topology_to_hwloc_xml(const struct cdp_topology *t, char **text)
{
    if (t->n_nodes != 1)
        return cdp_fail(CDP_ERR_INVALID, "topology %s: hwloc XML describes one machine, and this has %d nodes; "
                        "export the node preset instead", t->name, t->n_nodes);
    cdp_status st = CDP_OK;
    const struct cdp_topology_node *nd = &t->nodes[0];
    int ng = t->kind == CDP_TOPOLOGY_GPU ? nd->n_gpus : 0;
    struct hw w = {.t = t, .gp = 2, .bus = 1};
    w.gpu_gp = calloc((size_t)ng + 1, sizeof *w.gpu_gp);
    w.sw_gp = calloc((size_t)t->n_nvswitches + 1, sizeof *w.sw_gp);
    char *all_cpus = NULL, *all_nodes = NULL;
    struct cdp_buf lists = {0}, nodes = {0};
    if (!w.gpu_gp || !w.sw_gp) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < t->n_numa; i++) {
        if (t->numa[i].cpuset[0]) cdp_buf_printf(&lists, "%s%s", lists.n ? "," : "", t->numa[i].cpuset);
        cdp_buf_printf(&nodes, "%s%d", nodes.n ? "," : "", t->numa[i].os_index);
    }
    if ((st = cdp_cpuset_to_mask(lists.p ? lists.p : "", &all_cpus)) ||
        (st = cdp_cpuset_to_mask(nodes.p ? nodes.p : "", &all_nodes)))
        goto done;
    cdp_buf_printf(&w.b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
                   "<!-- written by cdphybrid from topology \"");
    cdp_buf_escaped(&w.b, t->name);
    cdp_buf_printf(&w.b, "\"; CDP* info attributes carry what hwloc has no field for -->\n"
                   "<topology version=\"2.0\">\n  <object type=\"Machine\" os_index=\"0\"");
    sets(&w, all_cpus, all_nodes);
    cdp_buf_printf(&w.b, " allowed_cpuset=\"%s\" allowed_nodeset=\"%s\" gp_index=\"1\">\n", all_cpus, all_nodes);
    info_line(&w, 2, "CDPTopologyName", "%s", t->name);
    info_line(&w, 2, "CDPNodeName", "%s", nd->name);
    if (t->source) info_line(&w, 2, "CDPSource", "%s", t->source);
    info_line(&w, 2, "CDPNVLinkBandwidth", "%.17g", nd->nvlink_bw);
    info_line(&w, 2, "CDPSysBandwidth", "%.17g", nd->sys_bw);
    info_line(&w, 2, "CDPCopyBandwidth", "%.17g", nd->copy_bw);
    info_line(&w, 2, "CDPNetworkName", "%s", t->network.name);
    info_line(&w, 2, "CDPNetworkNICs", "%d", t->network.nics_per_node);
    info_line(&w, 2, "CDPNetworkRate", "%.17g", t->network.nic_rate);
    info_line(&w, 2, "CDPNetworkLatency", "%.17g", t->network.latency);
    if (t->kind == CDP_TOPOLOGY_CPU) {
        info_line(&w, 2, "CDPKind", "cpu");
        info_line(&w, 2, "CDPDevices", "%d", t->n_gpus);
        info_line(&w, 2, "CDPDeviceMemory", "%llu", (unsigned long long)(t->n_gpus ? t->gpus[0].memory_bytes : 0));
    }
    for (int i = 0; i < t->n_numa; i++) {
        const struct cdp_topology_numa *nm = &t->numa[i];
        char *cm = NULL, *nmk = NULL, idx[16];
        snprintf(idx, sizeof idx, "%d", nm->os_index);
        if ((st = cdp_cpuset_to_mask(nm->cpuset, &cm)) || (st = cdp_cpuset_to_mask(idx, &nmk))) {
            free(cm);
            goto done;
        }
        cdp_buf_printf(&w.b, "    <object type=\"Package\" os_index=\"%d\"", nm->os_index);
        sets(&w, cm, nmk);
        cdp_buf_printf(&w.b, " gp_index=\"%d\">\n", w.gp++);
        cdp_buf_printf(&w.b, "      <object type=\"NUMANode\" os_index=\"%d\"", nm->os_index);
        sets(&w, cm, nmk);
        cdp_buf_printf(&w.b, " gp_index=\"%d\" local_memory=\"%llu\"/>\n", w.gp++,
                       (unsigned long long)nm->memory_bytes);
        int *cpus = NULL, nc = 0;
        if ((st = cdp_cpuset_parse_list(nm->cpuset, &cpus, &nc))) {
            free(cm);
            free(nmk);
            goto done;
        }
        for (int c = 0; c < nc; c++) {
            char one[16], *om = NULL;
            snprintf(one, sizeof one, "%d", cpus[c]);
            if ((st = cdp_cpuset_to_mask(one, &om))) break;
            cdp_buf_printf(&w.b, "      <object type=\"Core\" os_index=\"%d\"", cpus[c]);
            sets(&w, om, nmk);
            cdp_buf_printf(&w.b, " gp_index=\"%d\">\n        <object type=\"PU\" os_index=\"%d\"", w.gp++, cpus[c]);
            sets(&w, om, nmk);
            cdp_buf_printf(&w.b, " gp_index=\"%d\"/>\n      </object>\n", w.gp++);
            free(om);
        }
        free(cpus);
        free(cm);
        free(nmk);
        if (st) goto done;
        if (ng) {
            int none[1] = {0};
            emit_level(&w, 3, none, 0, nm->os_index);
        }
        if (i == 0 && t->n_nvswitches) {
            cdp_buf_printf(&w.b, "      <object type=\"Bridge\" gp_index=\"%d\" bridge_type=\"0-1\" depth=\"0\" "
                           "bridge_pci=\"ff00:[00-ff]\">\n", w.gp++);
            for (int s = 0; s < t->n_nvswitches; s++) {
                w.sw_gp[s] = w.gp;
                cdp_buf_printf(&w.b, "        <object type=\"PCIDev\" gp_index=\"%d\" subtype=\"NVSwitch\" "
                               "pci_busid=\"%s\" pci_type=\"0680 [10de:1af1] [0000:0000] a1\" "
                               "pci_link_speed=\"0.000000\">\n", w.gp++, t->nvswitches[s].pci_bus_id);
                info_line(&w, 5, "CDPName", "%s", t->nvswitches[s].name);
                cdp_buf_printf(&w.b, "        </object>\n");
            }
            cdp_buf_printf(&w.b, "      </object>\n");
        }
        for (int k = 0; k < t->n_nics; k++) {
            const struct cdp_topology_nic *c = &t->nics[k];
            if (c->numa != nm->os_index) continue;
            cdp_buf_printf(&w.b, "      <object type=\"Bridge\" gp_index=\"%d\" bridge_type=\"0-1\" depth=\"0\" "
                           "bridge_pci=\"fe%02x:[00-ff]\">\n", w.gp++, k & 0xff);
            cdp_buf_printf(&w.b, "        <object type=\"PCIDev\" gp_index=\"%d\" pci_busid=\"%s\" "
                           "pci_type=\"0207 [15b3:0000] [0000:0000] 00\" pci_link_speed=\"0.000000\">\n", w.gp++,
                           c->pci_bus_id);
            cdp_buf_printf(&w.b, "          <object type=\"OSDev\" gp_index=\"%d\" name=\"", w.gp++);
            cdp_buf_escaped(&w.b, c->name);
            cdp_buf_printf(&w.b, "\" osdev_type=\"3\">\n");
            info_line(&w, 6, "CDPRate", "%.17g", c->rate);
            cdp_buf_printf(&w.b, "          </object>\n        </object>\n      </object>\n");
        }
        cdp_buf_printf(&w.b, "    </object>\n");
    }
    cdp_buf_printf(&w.b, "  </object>\n");
    if (ng) matrix(&w, ng, t->n_nvswitches);
    cdp_buf_printf(&w.b, "</topology>\n");
    if (w.b.failed || lists.failed || nodes.failed) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
done:
    free(w.gpu_gp);
    free(w.sw_gp);
    free(all_cpus);
    free(all_nodes);
    free(lists.p);
    free(nodes.p);
    if (st) {
        free(w.b.p);
        return st;
    }
    *text = w.b.p;
    return CDP_OK;
}

cdp_status cdp_topology_export_xml(const struct cdp_topology *t, const char *path)
{
    char *text = NULL;
    cdp_status st = cdp_topology_to_hwloc_xml(t, &text);
    if (st) return st;
    /* never a half-written file */
    st = cdp_write_file_atomic(path, text, strlen(text));
    free(text);
    return st;
}
