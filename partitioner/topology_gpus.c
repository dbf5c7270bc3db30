/* What the topology knows of a GPU by its model name or PCI id: data-sheet
 * peaks and memory (the table every loader's defaults come from). */
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

/* Dense peaks from NVIDIA's data sheets (the starred sparse figures halved);
 * 0 = the format is not supported by the GPU. Order matters: first match wins. */
static const struct cdp_gpu_facts gpu_facts[] = {
    {"H200", 141000000000ull, 67e12, 494.5e12, 989.5e12, 25e9},
    {"H100 PCIe", 80ull << 30, 51e12, 378e12, 756e12, 25e9},
    {"H100", 80ull << 30, 67e12, 494.5e12, 989.5e12, 25e9},
    {"A100-PCIE-40GB", 40ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"A100 80GB PCIe", 80ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"A100-SXM4-40GB", 40ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"A100", 80ull << 30, 19.5e12, 156e12, 312e12, 25e9},
    {"V100-SXM3", 32ull << 30, 15.7e12, 0, 0, 25e9},
    {"V100-SXM2-32GB", 32ull << 30, 15.7e12, 0, 0, 25e9},
    {"V100-SXM2", 16ull << 30, 15.7e12, 0, 0, 25e9},
    {"V100", 16ull << 30, 14e12, 0, 0, 25e9},
    {"P100-SXM2", 16ull << 30, 10.6e12, 0, 0, 20e9},
    {"P100-PCIE-12GB", 12ull << 30, 9.3e12, 0, 0, 20e9},
    {"P100", 16ull << 30, 9.3e12, 0, 0, 20e9},
    {"T4", 16ull << 30, 8.1e12, 0, 0, 25e9},
    {"L40S", 48ull << 30, 91.6e12, 183e12, 362e12, 25e9},
    {NULL, 0, 0, 0, 0, 0},
};

const struct cdp_gpu_facts *cdp_gpu_facts_find(const char *name)
{
    if (!name || !*name) return NULL;
    for (const struct cdp_gpu_facts *f = gpu_facts; f->match; f++)
        if (strstr(name, f->match)) return f;
    return NULL;
}

/* From the PCI ID database (pci-ids.ucw.cz), the data-centre GPUs the presets use. */
const char *cdp_gpu_name_by_pci_id(unsigned device)
{
    static const struct { unsigned id; const char *name; } ids[] = {
        {0x15f7, "Tesla P100-PCIE-12GB"}, {0x15f8, "Tesla P100-PCIE-16GB"},
        {0x15f9, "Tesla P100-SXM2-16GB"}, {0x1db1, "Tesla V100-SXM2-16GB"},
        {0x1db4, "Tesla V100-PCIE-16GB"}, {0x1db5, "Tesla V100-SXM2-32GB"},
        {0x1db8, "Tesla V100-SXM3-32GB"}, {0x1eb8, "Tesla T4"},
        {0x20b0, "NVIDIA A100-SXM4-40GB"}, {0x20b2, "NVIDIA A100-SXM4-80GB"},
        {0x20b5, "NVIDIA A100 80GB PCIe"}, {0x20f1, "NVIDIA A100-PCIE-40GB"},
        {0x2330, "NVIDIA H100 80GB HBM3"}, {0x2331, "NVIDIA H100 PCIe"},
        {0x2335, "NVIDIA H200"},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].id == device) return ids[i].name;
    return NULL;
}
