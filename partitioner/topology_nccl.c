/* NCCL topology XML (NCCL_TOPO_FILE, <system version="1">): <cpu> elements are
 * NUMA nodes, nested <pci> elements PCIe switches and devices (class 0x03xxxx a
 * GPU, 0x02xxxx a NIC), <gpu><nvlink target count tclass/></gpu> the NVLinks
 * (tclass 0x030200 a GPU peer, 0x068000 an NVSwitch), <nic><net speed/></nic>
 * the network ports (speed in Mb/s). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "partitioner/topology_internal.h"

struct ngpu {
    const struct cdp_xml *pci, *gpu;
    char busid[CDP_TOPOLOGY_BUSID_MAX];
    unsigned device;
    int sm, dev, numa;
    char cpuset[CDP_TOPOLOGY_CPUSET_MAX];
    double pcie_bw;
    int depth, path[CDP_TOPOLOGY_PCIE_DEPTH];
};

struct nnic {
    char name[CDP_TOPOLOGY_NAME_MAX], busid[CDP_TOPOLOGY_BUSID_MAX];
    int numa;
    double rate;
};

struct nload {
    const char *name;
    struct ngpu *g;
    int ng, capg;
    struct nnic *c;
    int nc, capc;
    struct cdp_topology_numa *numa;
    int nn, capn;
    int next_id;
};

static unsigned long hexattr(const struct cdp_xml *x, const char *k, int *ok)
{
    const char *v = cdp_xml_attr(x, k);
    *ok = v && *v;
    return *ok ? strtoul(v, NULL, 16) : 0;
}

static double pcie_rate(const struct cdp_xml *x)
{
    const char *sp = cdp_xml_attr(x, "link_speed"), *wd = cdp_xml_attr(x, "link_width");
    if (!sp || !wd) return 0;
    double gt = strtod(sp, NULL);
    int width = atoi(wd);
    if (gt <= 0 || width <= 0) return 0;
    double enc = gt >= 8 ? 128.0 / 130.0 : 0.8;
    return gt * 1e9 * width * enc / 8;
}

#define GROW(arr, n, cap)                                                                  \
    do {                                                                                   \
        if ((n) == (cap)) {                                                                \
            int c_ = (cap) ? (cap) * 2 : 16;                                               \
            void *p_ = realloc((arr), (size_t)c_ * sizeof *(arr));                         \
            if (!p_) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", L->name);         \
            (arr) = p_;                                                                    \
            (cap) = c_;                                                                    \
        }                                                                                  \
    } while (0)

static cdp_status add_nets(struct nload *L, const struct cdp_xml *nic, const char *busid, int numa)
{
    int found = 0;
    for (int i = 0; i < nic->n_kids; i++) {
        const struct cdp_xml *net = nic->kids[i];
        if (strcmp(net->name, "net")) continue;
        GROW(L->c, L->nc, L->capc);
        struct nnic *c = &L->c[L->nc++];
        memset(c, 0, sizeof *c);
        const char *nm = cdp_xml_attr(net, "name"), *sp = cdp_xml_attr(net, "speed");
        cdp_topology_copy_str(c->name, sizeof c->name, nm ? nm : "net");
        if (busid) cdp_busid_normalize(busid, c->busid, sizeof c->busid);
        c->numa = numa;
        if (sp) {
            double v = strtod(sp, NULL);
            if (v < 0)
                return cdp_fail(CDP_ERR_INVALID, "%s: line %d: <net name=\"%s\">: negative speed %s", L->name,
                                net->line, c->name, sp);
            c->rate = v * 1e6 / 8;
        }
        found++;
    }
    (void)found;
    return CDP_OK;
}

static cdp_status walk_pci(struct nload *L, const struct cdp_xml *x, int numa, const char *cpuset, int depth,
                           const int *path)
{
    cdp_status st;
    int ok, okv;
    unsigned long cls = hexattr(x, "class", &ok);
    unsigned long vendor = hexattr(x, "vendor", &okv);
    const struct cdp_xml *gpu = NULL, *nic = NULL;
    int pci_kids = 0;
    for (int i = 0; i < x->n_kids; i++) {
        if (!strcmp(x->kids[i]->name, "gpu")) gpu = x->kids[i];
        else if (!strcmp(x->kids[i]->name, "nic")) nic = x->kids[i];
        else if (!strcmp(x->kids[i]->name, "pci")) pci_kids++;
    }
    const char *busid = cdp_xml_attr(x, "busid");
    int here[CDP_TOPOLOGY_PCIE_DEPTH];
    memcpy(here, path, (size_t)depth * sizeof *here);
    /* A device directly under a CPU sits on its own host bridge. */
    if (depth == 0) here[depth++] = L->next_id++;
    if (gpu || (ok && (cls >> 16) == 0x03 && (!okv || vendor == 0x10de))) {
        GROW(L->g, L->ng, L->capg);
        struct ngpu *g = &L->g[L->ng++];
        memset(g, 0, sizeof *g);
        g->pci = x;
        g->gpu = gpu;
        if (!busid) return cdp_fail(CDP_ERR_INVALID, "%s: line %d: a GPU <pci> without busid", L->name, x->line);
        cdp_busid_normalize(busid, g->busid, sizeof g->busid);
        int okd;
        g->device = (unsigned)hexattr(x, "device", &okd);
        g->sm = gpu && cdp_xml_attr(gpu, "sm") ? atoi(cdp_xml_attr(gpu, "sm")) : 0;
        g->dev = gpu && cdp_xml_attr(gpu, "dev") ? atoi(cdp_xml_attr(gpu, "dev")) : -1;
        g->numa = numa;
        cdp_topology_copy_str(g->cpuset, sizeof g->cpuset, cpuset);
        g->pcie_bw = pcie_rate(x);
        g->depth = depth;
        memcpy(g->path, here, sizeof g->path);
        return CDP_OK;
    }
    if (nic || (ok && (cls >> 16) == 0x02)) {
        if (nic) return add_nets(L, nic, busid, numa);
        GROW(L->c, L->nc, L->capc);
        struct nnic *c = &L->c[L->nc++];
        memset(c, 0, sizeof *c);
        cdp_busid_normalize(busid ? busid : "", c->busid, sizeof c->busid);
        snprintf(c->name, sizeof c->name, "nic-%s", c->busid);
        c->numa = numa;
        return CDP_OK;
    }
    if (pci_kids || (ok && cls == 0x060400)) {
        if (depth < CDP_TOPOLOGY_PCIE_DEPTH) here[depth++] = L->next_id++;
        for (int i = 0; i < x->n_kids; i++)
            if (!strcmp(x->kids[i]->name, "pci") && (st = walk_pci(L, x->kids[i], numa, cpuset, depth, here)))
                return st;
        return CDP_OK;
    }
    CDP_DEBUG(TOPO, "%s: line %d: <pci busid=\"%s\"> is neither a GPU, a NIC nor a switch; skipped", L->name,
              x->line, busid ? busid : "?");
    return CDP_OK;
}

static int gpu_by_busid(const struct nload *L, const char *busid)
{
    char b[CDP_TOPOLOGY_BUSID_MAX];
    cdp_busid_normalize(busid, b, sizeof b);
    for (int i = 0; i < L->ng; i++)
        if (!strcasecmp(L->g[i].busid, b)) return i;
    return -1;
}

/* The attributes this reader's values come from, for finalize's messages. */
static const struct cdp_topology_attr_names nccl_names = {"NVLink rate (of the GPU's sm)", NULL, NULL,
                                                      "<pci link_speed x link_width>", NULL, "<net speed>", NULL,
                                                      NULL};

static int dev_cmp(const void *x, const void *y)
{
    const struct ngpu *a = x, *b = y;
    return (a->dev > b->dev) - (a->dev < b->dev);
}

cdp_status cdp_topology_load_nccl_xml(const struct cdp_xml *root, const char *name, struct cdp_topology **out)
{
    cdp_status st = CDP_OK;
    struct nload Lv = {.name = name}, *L = &Lv;
    struct cdp_topology *t = NULL;
    char (*sw_bus)[CDP_TOPOLOGY_BUSID_MAX] = NULL;
    const char *ver = cdp_xml_attr(root, "version");
    if (ver && strcmp(ver, "1"))
        CDP_WARN(TOPO, "%s: NCCL topology version \"%s\" (version 1 expected); reading it anyway", name, ver);
    for (int i = 0; i < root->n_kids; i++) {
        const struct cdp_xml *cpu = root->kids[i];
        if (strcmp(cpu->name, "cpu")) continue;
        const char *nid = cdp_xml_attr(cpu, "numaid");
        int numa = nid ? atoi(nid) : L->nn;
        if (numa < 0) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: <cpu numaid=\"%s\">: expected a NUMA node number", name,
                          cpu->line, nid);
            goto fail;
        }
        if (L->nn == L->capn) {
            int c = L->capn ? L->capn * 2 : 8;
            struct cdp_topology_numa *p = realloc(L->numa, (size_t)c * sizeof *p);
            if (!p) {
                st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
                goto fail;
            }
            L->numa = p;
            L->capn = c;
        }
        struct cdp_topology_numa *nm = &L->numa[L->nn++];
        memset(nm, 0, sizeof *nm);
        nm->os_index = numa;
        const char *aff = cdp_xml_attr(cpu, "affinity");
        if (aff && *aff && (st = cdp_cpuset_from_mask(aff, nm->cpuset, sizeof nm->cpuset))) {
            st = cdp_error_context(st, "%s: line %d: <cpu affinity>", name, cpu->line);
            goto fail;
        }
        for (int k = 0; k < cpu->n_kids; k++) {
            const struct cdp_xml *x = cpu->kids[k];
            if (!strcmp(x->name, "pci")) st = walk_pci(L, x, numa, nm->cpuset, 0, (int[CDP_TOPOLOGY_PCIE_DEPTH]){0});
            else if (!strcmp(x->name, "nic")) st = add_nets(L, x, NULL, numa);
            if (st) goto fail;
        }
    }
    if (L->nn == 0) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: no <cpu> element in <system>: not an NCCL topology", name);
        goto fail;
    }
    /* CUDA order when every GPU names its dev, else as listed. */
    int keyed = L->ng > 0;
    for (int i = 0; i < L->ng; i++) keyed &= L->g[i].dev >= 0;
    if (keyed) {
        qsort(L->g, (size_t)L->ng, sizeof *L->g, dev_cmp);
        for (int i = 1; i < L->ng; i++)
            if (L->g[i].dev == L->g[i - 1].dev) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: two GPUs have dev=\"%d\"", name, L->g[i].gpu->line,
                              L->g[i].dev);
                goto fail;
            }
    }
    for (int i = 0; i < L->ng; i++)
        for (int j = 0; j < i; j++)
            if (!strcasecmp(L->g[i].busid, L->g[j].busid)) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: two GPUs have the bus id %s", name, L->g[i].pci->line,
                              L->g[i].busid);
                goto fail;
            }
    int ng = L->ng, nsw = 0;
    t = calloc(1, sizeof *t);
    if (!t || (st = cdp_topology_alloc(t, 1, ng, L->nn, 0, L->nc))) {
        st = t ? st : cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    memcpy(t->numa, L->numa, (size_t)L->nn * sizeof *L->numa);
    struct cdp_topology_node *nd = &t->nodes[0];
    if ((st = cdp_topology_node_alloc(nd, ng))) goto fail;
    const char *base = strrchr(name, '/');
    cdp_topology_copy_str(t->name, sizeof t->name, base ? base + 1 : name);
    cdp_topology_copy_str(nd->name, sizeof nd->name, t->name);
    for (int i = 0; i < ng; i++) {
        struct cdp_topology_gpu *g = &t->gpus[i];
        const struct ngpu *s = &L->g[i];
        g->index = g->local = i;
        const char *model = cdp_gpu_name_by_pci_id(s->device);
        if (model) cdp_topology_copy_str(g->name, sizeof g->name, model);
        else if (s->sm) snprintf(g->name, sizeof g->name, "NVIDIA GPU (sm_%d)", s->sm);
        cdp_topology_copy_str(g->pci_bus_id, sizeof g->pci_bus_id, s->busid);
        g->numa = s->numa;
        cdp_topology_copy_str(g->cpuset, sizeof g->cpuset, s->cpuset);
        g->pcie_bw = s->pcie_bw;
        g->pcie_depth = s->depth;
        memcpy(g->pcie_path, s->path, sizeof g->pcie_path);
    }
    int sm = ng ? L->g[0].sm : 0;
    const struct cdp_gpu_facts *f = ng ? cdp_gpu_facts_find(t->gpus[0].name) : NULL;
    nd->nvlink_bw = f ? f->nvlink_rate : sm >= 100 ? 50e9 : (sm >= 60 && sm < 70) ? 20e9 : 25e9;
    /* NVLinks as each side lists them; the two sides must agree. */
    int *seen = calloc((size_t)ng * (size_t)ng + 1, sizeof *seen);
    if (!seen) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    for (int a = 0; a < ng; a++) {
        const struct cdp_xml *gx = L->g[a].gpu;
        for (int k = 0; gx && k < gx->n_kids; k++) {
            const struct cdp_xml *nv = gx->kids[k];
            if (strcmp(nv->name, "nvlink")) continue;
            const char *target = cdp_xml_attr(nv, "target"), *cnt = cdp_xml_attr(nv, "count");
            int okc;
            unsigned long tclass = hexattr(nv, "tclass", &okc);
            int count = cnt ? atoi(cnt) : 0;
            if (!target || !cnt || count <= 0) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: <nvlink>: expected target=\"BUSID\" and a positive "
                              "count, got count=\"%s\"", name, nv->line, cnt ? cnt : "");
                goto fail_seen;
            }
            char tb[CDP_TOPOLOGY_BUSID_MAX];
            cdp_busid_normalize(target, tb, sizeof tb);
            if (!strcasecmp(tb, L->g[a].busid)) {
                CDP_DEBUG(TOPO, "%s: line %d: GPU %s lists an NVLink to itself (a placeholder some cloud files "
                          "use); ignored", name, nv->line, tb);
                continue;
            }
            if (okc && tclass == 0x068000) {
                int s = -1;
                for (int q = 0; q < nsw; q++)
                    if (!strcasecmp(sw_bus[q], tb)) s = q;
                if (s < 0) {
                    void *p = realloc(sw_bus, (size_t)(nsw + 1) * sizeof *sw_bus);
                    if (p) sw_bus = p;
                    struct cdp_topology_nvswitch *ps = p ? realloc(t->nvswitches, (size_t)(nsw + 1) * sizeof *ps) : NULL;
                    if (ps) t->nvswitches = ps;
                    if (!p || !ps) {
                        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
                        goto fail_seen;
                    }
                    memset(&ps[nsw], 0, sizeof *ps);
                    cdp_topology_copy_str(sw_bus[nsw], sizeof sw_bus[nsw], tb);
                    cdp_topology_copy_str(ps[nsw].pci_bus_id, sizeof ps[nsw].pci_bus_id, tb);
                    snprintf(ps[nsw].name, sizeof ps[nsw].name, "nvswitch%d", nsw);
                    t->n_nvswitches = ++nsw;
                    if ((st = cdp_topology_switch_alloc(&ps[nsw - 1], ng))) goto fail_seen;
                    s = nsw - 1;
                }
                t->nvswitches[s].gpu_links[a] += count;
                continue;
            }
            if (okc && tclass != 0x030200) {
                CDP_INFO(TOPO, "%s: line %d: NVLink of GPU %d to class 0x%06lx (a CPU?) is not a GPU link; ignored",
                         name, nv->line, a, tclass);
                continue;
            }
            int b = gpu_by_busid(L, tb);
            if (b < 0) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: GPU %d (%s) has an NVLink to %s, and no GPU in the file "
                              "has that bus id", name, nv->line, a, L->g[a].busid, tb);
                goto fail_seen;
            }
            seen[(size_t)a * ng + b] += count;
        }
    }
    for (int a = 0; a < ng; a++) {
        for (int b = 0; b < ng; b++) {
            int x = seen[(size_t)a * ng + b], y = seen[(size_t)b * ng + a];
            if (x && y && x != y) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: GPU %d lists %d NVLinks to GPU %d, which lists %d back", name, a,
                              x, b, y);
                goto fail_seen;
            }
            nd->nvlink_direct[(size_t)a * ng + b] = x ? x : y;
        }
    }
    free(seen);
    for (int i = 0; i < L->nc; i++) {
        struct cdp_topology_nic *c = &t->nics[i];
        cdp_topology_copy_str(c->name, sizeof c->name, L->c[i].name);
        cdp_topology_copy_str(c->pci_bus_id, sizeof c->pci_bus_id, L->c[i].busid);
        c->numa = L->c[i].numa;
        c->rate = L->c[i].rate;
    }
    if ((st = cdp_topology_set_source(t, "NCCL topology XML %s", name))) goto fail;
    if ((st = cdp_topology_finalize_named(t, name, &nccl_names))) goto fail;
    CDP_INFO(TOPO, "%s: NCCL XML: %d GPUs, %d NVSwitches, %d NICs, %d NUMA nodes", name, t->n_gpus,
             t->n_nvswitches, t->n_nics, t->n_numa);
    free(L->g);
    free(L->c);
    free(L->numa);
    free(sw_bus);
    *out = t;
    return CDP_OK;
fail_seen:
    free(seen);
fail:
    free(L->g);
    free(L->c);
    free(L->numa);
    free(sw_bus);
    cdp_topology_free(t);
    return st;
}
