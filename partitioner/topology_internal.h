/* Shared by the topology loaders: building a struct cdp_topology, deriving its
 * link matrices, a small XML reader, and CPU-set and rate helpers. */
#ifndef CDP_TOPOLOGY_INTERNAL_H
#define CDP_TOPOLOGY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/topology.h"
#include "plan/topology_spec.h" /* CDP_TOPOLOGY_JOIN_MAX_TERMS */

/* ---- building -------------------------------------------------------------- */

/* Allocates the arrays of t (zeroed; numa and nodes' matrices not yet). */
cdp_status cdp_topology_alloc(struct cdp_topology *t, int n_nodes, int n_gpus, int n_numa,
                          int n_nvswitches, int n_nics);
/* Allocates a node's input and derived matrices for n local GPUs. */
cdp_status cdp_topology_node_alloc(struct cdp_topology_node *nd, int n);
/* Allocates sw->gpu_links for n local GPUs. */
cdp_status cdp_topology_switch_alloc(struct cdp_topology_nvswitch *sw, int n);

/* The first n_nodes nodes of t with the first per_node devices of each (all
 * of a node that has fewer): the devices a job of that shape has, numbered
 * node by node as its ranks number them. */
cdp_status cdp_topology_first(const struct cdp_topology *t, int n_nodes, int per_node, struct cdp_topology **out);

/* Checks what a loader filled in, fills defaults (GPU facts by model name, bus
 * ids, NUMA nodes, CPU sets, PCIe rates), renumbers PCIe paths canonically and
 * derives the link matrices. what names the source in messages. */
cdp_status cdp_topology_finalize(struct cdp_topology *t, const char *what);

/* What a reader calls the values finalize checks, for its messages (NULL:
 * the model's own words). Every rate must be 0 (not given: a default or
 * none) or within the ranges below (docs/topology.md, "Ranges"). */
struct cdp_topology_attr_names {
    const char *nvlink, *sys, *copy; /* a node's bandwidths */
    const char *pcie, *flops;        /* a GPU's */
    const char *nic;                 /* a NIC's rate */
    const char *net_rate, *net_latency;
};
cdp_status cdp_topology_finalize_named(struct cdp_topology *t, const char *what, const struct cdp_topology_attr_names *names);

/* The most devices a joined cluster may have (docs/topology.md, "Limits"). */
#define CDP_TOPOLOGY_MAX_DEVICES 10240

#define CDP_TOPOLOGY_RATE_MIN 1e3      /* bytes/s: 1 kB/s */
#define CDP_TOPOLOGY_RATE_MAX 1e15     /* bytes/s: 1 PB/s */
#define CDP_TOPOLOGY_FLOPS_MIN 1e6     /* FLOP/s */
#define CDP_TOPOLOGY_FLOPS_MAX 1e18
#define CDP_TOPOLOGY_LATENCY_MIN 1e-9  /* seconds */
#define CDP_TOPOLOGY_LATENCY_MAX 10.0

/* Sets t->source (copied). */
cdp_status cdp_topology_set_source(struct cdp_topology *t, const char *fmt, ...) CDP_PRINTF(2, 3);

void cdp_topology_copy_str(char *dst, size_t cap, const char *src);

/* Facts about a GPU model, found by a substring of its name. */
struct cdp_gpu_facts {
    const char *match;        /* substring of the model name */
    uint64_t memory_bytes;    /* when the name does not say */
    double fp32, tf32, bf16;  /* dense peak FLOP/s */
    double nvlink_rate;       /* bytes/s one direction per NVLink */
};
const struct cdp_gpu_facts *cdp_gpu_facts_find(const char *name);
/* A model name for a PCI device id of vendor 0x10de, or NULL. */
const char *cdp_gpu_name_by_pci_id(unsigned device);

/* ---- clusters of different nodes ------------------------------------------------ */

/* Joins one-node topologies into one cluster: counts[i] copies of nodes[i]
 * (not owned), in term order, so node and device numbers follow the terms.
 * net NULL: the terms' network when they agree, else one network no faster
 * than its slowest part (the least NIC rate and NIC count, the largest
 * latency; docs/topology.md). Named "2 x dgx-a100 + 1 x dgx1-v100" (one term:
 * as cdp_topology_cluster names it). cdp_topology_cluster is its one-term case.
 * CDP_ERR_INVALID (a term that is not one node, CPU and GPU terms mixed, bad
 * counts, too many devices), CDP_ERR_NOMEM; *out set only on success. */
cdp_status cdp_topology_join(const struct cdp_topology *const *nodes, const int *counts, int n_terms,
                             const struct cdp_topology_network *net, struct cdp_topology **out);

/* Nonzero when nodes a and b of t have the same devices (names, memory,
 * peaks, PCIe rates), links and rates. */
int cdp_topology_nodes_alike(const struct cdp_topology *t, int a, int b);

/* Latency estimate of a link class (seconds). */
double cdp_topology_class_latency(enum cdp_link_class c);
#define CDP_TOPOLOGY_DEFAULT_PCIE_BW 12e9   /* PCIe Gen3 x16, achievable */
#define CDP_TOPOLOGY_DEFAULT_NVLINK_BW 25e9
#define CDP_TOPOLOGY_DEFAULT_COPY_BW 20e9
#define CDP_TOPOLOGY_DEFAULT_NET_LATENCY 5e-6

/* ---- rates ------------------------------------------------------------------- */

/* "25GB/s", "200Gb/s", "25 GiB/s", "1.5e10" (bytes/s) to bytes/s. */
cdp_status cdp_parse_rate(const char *s, double *out);

/* ---- PCI bus ids --------------------------------------------------------------- */

/* "0000:07:00.0" or "00000000:07:00.0" to numbers; 0 on success. */
int cdp_busid_parse(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn);
/* Canonical "dddd:bb:dd.f" (lower case); copies s when it does not parse. */
void cdp_busid_normalize(const char *s, char *out, size_t cap);

/* ---- XML --------------------------------------------------------------------- */

struct cdp_xml {
    char *name;
    char **attrs;           /* name, value, name, value, ... */
    int n_attrs;            /* pairs */
    struct cdp_xml **kids;
    int n_kids, cap_kids;
    char *text;             /* character data directly inside, concatenated */
    size_t text_len, text_cap;
    int line;
    struct cdp_xml *parent;
};

/* Parses a whole document; messages name the file and line. */
cdp_status cdp_xml_parse(const char *text, size_t len, const char *name, struct cdp_xml **root);
void cdp_xml_free(struct cdp_xml *x);
const char *cdp_xml_attr(const struct cdp_xml *x, const char *name);

/* Appends XML-escaped s to a growing buffer. */
struct cdp_buf {
    char *p;
    size_t n, cap;
    int failed;
};
void cdp_buf_printf(struct cdp_buf *b, const char *fmt, ...) CDP_PRINTF(2, 3);
void cdp_buf_escaped(struct cdp_buf *b, const char *s);

/* ---- loaders --------------------------------------------------------------------- */

cdp_status cdp_topology_load_native_json(const char *text, size_t len, const char *name,
                                     struct cdp_topology **out);
cdp_status cdp_topology_load_hwloc_xml(const struct cdp_xml *root, const char *name,
                                   struct cdp_topology **out);
cdp_status cdp_topology_load_nccl_xml(const struct cdp_xml *root, const char *name,
                                  struct cdp_topology **out);

/* Turns a GPU topology with no GPUs into a CPU topology on the same NUMA nodes. */
cdp_status cdp_topology_make_cpu(struct cdp_topology *t, int n_devices, double copy_bw);

/* ---- NVML (live discovery), a table so tests can stand in for the library ---------- */

typedef struct cdp_nvml_device_st *cdp_nvml_device;

struct cdp_nvml_pci_info { /* nvmlPciInfo_t (v3), 68 bytes */
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};

struct cdp_nvml_memory { /* nvmlMemory_t (v1) */
    unsigned long long total, free, used;
};

struct cdp_nvml_api {
    int (*init)(void);
    int (*shutdown)(void);
    const char *(*error_string)(int);
    int (*device_count)(unsigned *);
    int (*device_by_index)(unsigned, cdp_nvml_device *);
    int (*device_name)(cdp_nvml_device, char *, unsigned);
    int (*device_memory)(cdp_nvml_device, struct cdp_nvml_memory *);
    int (*device_pci)(cdp_nvml_device, struct cdp_nvml_pci_info *);
    int (*nvlink_state)(cdp_nvml_device, unsigned, int *);
    int (*nvlink_version)(cdp_nvml_device, unsigned, unsigned *);
    int (*nvlink_remote_pci)(cdp_nvml_device, unsigned, struct cdp_nvml_pci_info *);
    int (*nvlink_remote_type)(cdp_nvml_device, unsigned, int *); /* may be NULL */
    int (*common_ancestor)(cdp_nvml_device, cdp_nvml_device, int *); /* may be NULL */
};

/* Adds what NVML knows to t (from hwloc, possibly without GPUs): GPUs, names,
 * memory, NVLinks, NVSwitches, PCIe classes where hwloc gave none. t must not
 * be finalized yet. Logs what it used. */
cdp_status cdp_topology_apply_nvml(struct cdp_topology *t, const struct cdp_nvml_api *api);

/* ---- topology_finalize.c: checks, defaults and derived matrices of a loaded topology */

/* 0 (not given) or a rate in bytes/s within docs/topology.md's "Ranges"; else
 * an error naming what (the source), the place and the reader's attribute. */
cdp_status cdp_topology_check_rate(const char *what, const char *place, const char *attr, double v);

#endif
