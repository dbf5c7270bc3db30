/* The machine model the planner places stages on: nodes, their GPUs (or CPU
 * devices), NVSwitches, NICs, a GPU x GPU link matrix per node and the network
 * between nodes. Loaded from presets and files, or discovered live; never
 * touches a device or a communicator (docs/topology.md). */
#ifndef CDP_TOPOLOGY_H
#define CDP_TOPOLOGY_H

#include "cdp/api.h"

#include <stdint.h>
#include <stdio.h>

#include "cdp/status.h"
#include "cdp/topology_spec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_TOPOLOGY_NAME_MAX 64
#define CDP_TOPOLOGY_BUSID_MAX 32
#define CDP_TOPOLOGY_CPUSET_MAX 256
#define CDP_TOPOLOGY_PCIE_DEPTH 8

/* How two devices are connected, best first (nvidia-smi topo -m classes). */
enum cdp_link_class {
    CDP_LINK_SELF = 0,  /* "X": the device itself */
    CDP_LINK_NVLINK,    /* "NV#": direct NVLinks */
    CDP_LINK_NVSWITCH,  /* "NV#" through NVSwitches (# = links of the weaker GPU) */
    CDP_LINK_PIX,       /* one PCIe switch */
    CDP_LINK_PXB,       /* several PCIe switches, no host bridge */
    CDP_LINK_PHB,       /* through a PCIe host bridge */
    CDP_LINK_NODE,      /* between host bridges of one NUMA node */
    CDP_LINK_SYS,       /* across NUMA nodes (the CPUs' interconnect) */
    CDP_LINK_MEM,       /* CPU devices: a copy through main memory */
    CDP_LINK_NET,       /* devices on different nodes: the network */
    CDP_LINK_CLASS_COUNT
};

enum cdp_topology_kind {
    CDP_TOPOLOGY_GPU = 0, /* devices are GPUs */
    CDP_TOPOLOGY_CPU,     /* devices are CPU "devices" of the CPU backend (one per rank) */
};

/* One device: a GPU, or a CPU device when the topology's kind is CDP_TOPOLOGY_CPU. */
struct cdp_topology_gpu {
    int index;                         /* global index, 0 .. n_gpus-1, node by node */
    int node;                          /* the node it is in */
    int local;                         /* index inside its node */
    char name[CDP_TOPOLOGY_NAME_MAX];      /* "NVIDIA A100-SXM4-80GB", "cpu0" */
    char pci_bus_id[CDP_TOPOLOGY_BUSID_MAX]; /* "0000:07:00.0"; "" for CPU devices */
    uint64_t memory_bytes;             /* 0 = unknown */
    double peak_fp32, peak_tf32, peak_bf16; /* dense FLOP/s; 0 = unknown or unsupported */
    int numa;                          /* NUMA node (os index) nearest to it; -1 unknown */
    char cpuset[CDP_TOPOLOGY_CPUSET_MAX];  /* CPUs near it, Linux list format "0-23,48-71" */
    double pcie_bw;                    /* bytes/s one direction of its PCIe link; 0 unknown */
    int pcie_depth;                    /* entries of pcie_path */
    int pcie_path[CDP_TOPOLOGY_PCIE_DEPTH]; /* host bridge, then each PCIe switch down to it
                                          (node-local ids, numbered in order of first use) */
};

/* A NUMA node of a machine. */
struct cdp_topology_numa {
    int node;                         /* the machine it belongs to */
    int os_index;                     /* its number on that machine */
    char cpuset[CDP_TOPOLOGY_CPUSET_MAX]; /* Linux list format */
    uint64_t memory_bytes;            /* 0 = unknown */
};

/* An NVSwitch. All switches of a node form one fabric: GPU<->GPU through it is
 * min(links of a, links of b) x the node's per-link rate (hwloc's "merge switch
 * ports, then transitive closure"). */
struct cdp_topology_nvswitch {
    int node;
    char name[CDP_TOPOLOGY_NAME_MAX];
    char pci_bus_id[CDP_TOPOLOGY_BUSID_MAX];
    int *gpu_links; /* per local GPU of its node: NVLinks to this switch (owned) */
};

/* A network adapter. */
struct cdp_topology_nic {
    int node;
    char name[CDP_TOPOLOGY_NAME_MAX];     /* "mlx5_0" */
    char pci_bus_id[CDP_TOPOLOGY_BUSID_MAX];
    int numa;                         /* -1 unknown */
    double rate;                      /* bytes/s one direction; 0 unknown */
};

/* One machine. The matrices are n_gpus x n_gpus, row-major, local indices. */
struct cdp_topology_node {
    char name[CDP_TOPOLOGY_NAME_MAX]; /* preset or host name */
    int first_gpu, n_gpus;        /* its devices are gpus[first_gpu .. first_gpu+n_gpus-1] */
    double nvlink_bw;             /* bytes/s one direction per NVLink */
    double sys_bw;                /* bytes/s one direction across NUMA nodes (SYS); 0 = PCIe rate */
    double copy_bw;               /* CPU devices: memory-copy bytes/s between devices */
    int *nvlink_direct;           /* direct NVLinks between local GPUs (the input; owned) */
    /* Derived by the loader from the above and the GPUs' PCIe paths (owned): */
    enum cdp_link_class *link_class;
    int *nvlinks;                 /* NVLinks counted in the class ("NV12" -> 12), else 0 */
    double *bandwidth;            /* bytes/s one direction; 0 on the diagonal */
    double *latency;              /* seconds, small-message one-way estimate by class */
};

/* Between nodes. A transfer between devices on different nodes uses one NIC. */
struct cdp_topology_network {
    char name[CDP_TOPOLOGY_NAME_MAX]; /* "InfiniBand HDR" */
    int nics_per_node;
    double nic_rate;              /* bytes/s one direction per NIC */
    double latency;               /* seconds */
};

struct cdp_topology {
    enum cdp_topology_kind kind;
    char name[CDP_TOPOLOGY_NAME_MAX]; /* "dgx-a100", "4 x dgx-a100", host name */
    char *source;                 /* where it came from and what it cites (owned) */
    int n_nodes;
    struct cdp_topology_node *nodes;
    int n_gpus;                   /* devices in all nodes */
    struct cdp_topology_gpu *gpus;
    int n_numa;
    struct cdp_topology_numa *numa;
    int n_nvswitches;
    struct cdp_topology_nvswitch *nvswitches;
    int n_nics;
    struct cdp_topology_nic *nics;
    struct cdp_topology_network network; /* meaningful when n_nodes > 1 */
};

/* What connects two devices (global indices), inside a node or across nodes. */
struct cdp_topology_link {
    enum cdp_link_class cls;
    int nvlinks;      /* NV# count, else 0 */
    double bandwidth; /* bytes/s one direction */
    double latency;   /* seconds */
};

/* Loads a topology from a spec:
 *   "auto"                       live discovery (cdp_topology_discover, defaults)
 *   "dgx-a100"                   a preset (cdp_topology_preset_path says where)
 *   "4 x dgx-a100", "4xdgx-a100" a cluster of 4 such nodes with the preset's network
 *   a path                       hwloc v2 XML, NCCL topology XML or our JSON (by content)
 * A relative path is taken from base_dir (NULL: the current folder). A spec with
 * no '/' that names a preset is the preset, even if a file of that name exists.
 * Returns CDP_ERR_INVALID (unknown name, with a "did you mean"; bad file content,
 * with the file, the line or JSON path, and what was expected), CDP_ERR_IO,
 * CDP_ERR_UNSUPPORTED (hwloc 3.0 XML), CDP_ERR_NOMEM. *out is set only on success;
 * free it with cdp_topology_free. */
CDP_API cdp_status cdp_topology_load(const char *spec, const char *base_dir, struct cdp_topology **out);

/* Loads a file; the format is recognised from its content. */
CDP_API cdp_status cdp_topology_load_file(const char *path, struct cdp_topology **out);

/* Loads text in any of the file formats; name is used in messages. */
CDP_API cdp_status cdp_topology_load_text(const char *text, size_t len, const char *name,
                                  struct cdp_topology **out);

/* Optional CUDA peer query a caller that may touch devices can supply (the
 * partitioner never does): 0 on success. */
typedef int (*cdp_topology_p2p_fn)(void *ctx, int a, int b, int *can_access, int *perf_rank);

struct cdp_discover_options {
    int cpu_devices;      /* devices of a CPU-only topology; 0 = one per NUMA node */
    double cpu_copy_bw;   /* bytes/s between CPU devices; 0 = 20e9 (bench-device-copy) */
    int no_nvml;          /* do not try NVML */
    int no_hwloc;         /* do not use hwloc */
    int cpu_only;         /* a CPU topology whatever GPUs the machine has (the cpu backend); no NVML */
    cdp_topology_p2p_fn cuda_p2p; /* NULL: skip the CUDA fallback */
    void *cuda_ctx;
};

/* Discovers this machine: hwloc (CPU, NUMA, PCI tree, GPUs by vendor 0x10de and
 * class 0x03xx, NICs), then NVML by dlopen (names, memory, NVLinks, PCIe common
 * ancestors), then the caller's CUDA peer query, each step optional and logged
 * at -v (subsystem TOPO). With no GPU found the result is a CPU topology
 * (kind CDP_TOPOLOGY_CPU). opts may be NULL. */
CDP_API cdp_status cdp_topology_discover(const struct cdp_discover_options *opts, struct cdp_topology **out);

/* A one-node CPU topology: n devices spread over the NUMA nodes given (n_numa
 * may be 0 for one unnamed node), copy_bw bytes/s between any two, memory per
 * device (0 = unknown). */
CDP_API cdp_status cdp_topology_cpu(int n_devices, double copy_bw, uint64_t memory_per_device,
                            struct cdp_topology **out);

/* A one-node GPU topology of n_gpus GPUs known only by their count (and a
 * name and memory, 0 = unknown): PCIe through one host bridge between any two
 * at pcie_bw bytes/s (0: the default rate). For machines whose GPUs the
 * discovery could not see, and for ranks that share GPUs. */
CDP_API cdp_status cdp_topology_generic_gpus(int n_gpus, const char *name, uint64_t memory, double pcie_bw,
                                     struct cdp_topology **out);

/* n_nodes copies of a one-node topology joined by net. */
CDP_API cdp_status cdp_topology_cluster(const struct cdp_topology *node, int n_nodes,
                                const struct cdp_topology_network *net, struct cdp_topology **out);

/* The link between two devices (global indices). Across nodes: the network
 * (one NIC's rate, the network's latency). CDP_ERR_INVALID for a bad index. */
CDP_API cdp_status cdp_topology_link(const struct cdp_topology *t, int a, int b, struct cdp_topology_link *out);

/* The link between two groups of n devices, a..a+n-1 and b..b+n-1, whose
 * traffic runs over the n member pairs a+k -> b+k in parallel: the slowest
 * pair's (the least bandwidth and NVLink count, the largest latency, the
 * worst class). n = 1 is cdp_topology_link. CDP_ERR_INVALID for a bad index. */
CDP_API cdp_status cdp_topology_group_link(const struct cdp_topology *t, int a, int b, int n,
                                           struct cdp_topology_link *out);

/* Writes hwloc v2 XML of a one-node topology: the machine, NUMA nodes and PUs,
 * a PCI tree (host bridges, switches, GPUs, NVSwitches, NICs) and an
 * NVLinkBandwidth distances matrix (MB/s), plus cdphybrid's own values as info
 * attributes so the file loads back identically. *text owned by the caller. */
CDP_API cdp_status cdp_topology_to_hwloc_xml(const struct cdp_topology *t, char **text);
CDP_API cdp_status cdp_topology_export_xml(const struct cdp_topology *t, const char *path);

/* JSON for scripts: {"name", "kind", "nodes": [...], "gpus": [...], "links":
 * [[class, ...]], "bandwidth_gbps": [[...]], "latency_us", "nvswitches", "nics",
 * "network"}; GPU order as listed, GB/s one direction. Owned by the caller. */
CDP_API cdp_status cdp_topology_to_json(const struct cdp_topology *t, char **text);

/* Our own file format (docs/topology.md): loads back to an equal topology. */
CDP_API cdp_status cdp_topology_to_native_json(const struct cdp_topology *t, char **text);

/* nvidia-smi topo -m style: link classes, then GB/s, then NUMA/CPU affinity,
 * NVSwitches, NICs and the network. */
CDP_API cdp_status cdp_topology_print(const struct cdp_topology *t, FILE *f);

/* Nonzero when a and b describe the same machine (every field); otherwise 0 and
 * the first difference written to why (may be NULL). */
CDP_API int cdp_topology_equal(const struct cdp_topology *a, const struct cdp_topology *b, char *why,
                       size_t cap);

/* NULL is a no-op. */
CDP_API void cdp_topology_free(struct cdp_topology *t);

/* "NV", "PIX", ... (NVLINK and NVSWITCH are both "NV"); "?" when out of range. */
CDP_API const char *cdp_link_class_name(enum cdp_link_class c);

/* The matrix label of a link: "X", "NV12", "PIX", "SYS", "MEM", "NET". */
CDP_API const char *cdp_topology_link_label(const struct cdp_topology_link *l, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
