/* Suite topology: presets against their published link counts, our hwloc and
 * NCCL fixtures, the public fixtures in ../shared (when present), export and
 * JSON round trips, bad files, live discovery on this (GPU-less) machine, the
 * NVML path through a stand-in library, plan specs, and `cdphybrid topo`. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cdp/core.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "cdp_config.h"
#include "harness.h"
#include "partitioner/topology_internal.h"

#if CDP_HAVE_HWLOC
#include <hwloc.h>
#endif

static struct cdp_topology *load(const char *spec)
{
    struct cdp_topology *t = NULL;
    cdp_status st = cdp_topology_load(spec, NULL, &t);
    cr_assert_eq(st, CDP_OK, "%s: %s", spec, cdp_last_error());
    cr_assert_not_null(t);
    return t;
}

static struct cdp_topology *load_fixture(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/topology/%s", name);
    return load(cdp_test_source_path(rel));
}

static struct cdp_topology_link link_of(const struct cdp_topology *t, int a, int b)
{
    struct cdp_topology_link l;
    cr_assert_eq(cdp_topology_link(t, a, b, &l), CDP_OK, "%s", cdp_last_error());
    return l;
}

static const char *label(const struct cdp_topology *t, int a, int b)
{
    static char buf[16];
    struct cdp_topology_link l = link_of(t, a, b);
    return cdp_topology_link_label(&l, buf, sizeof buf);
}

static void expect_label(const struct cdp_topology *t, int a, int b, const char *want)
{
    cr_assert_str_eq(label(t, a, b), want, "%s: GPU %d - GPU %d is %s, want %s", t->name, a, b, label(t, a, b), want);
    cr_assert_str_eq(label(t, b, a), want, "%s: GPU %d - GPU %d not symmetric", t->name, b, a);
}

/* Every pair of devices of t has the link label want. */
static void expect_all(const struct cdp_topology *t, const char *want, double gbps)
{
    for (int a = 0; a < t->n_gpus; a++)
        for (int b = 0; b < t->n_gpus; b++) {
            if (a == b) continue;
            expect_label(t, a, b, want);
            if (gbps > 0)
                cr_assert_float_eq(link_of(t, a, b).bandwidth, gbps * 1e9, 1e3, "%s: %d-%d %g bytes/s", t->name,
                                   a, b, link_of(t, a, b).bandwidth);
        }
}

static int nvlinks_of(const struct cdp_topology *t, int g)
{
    int sum = 0;
    for (int h = 0; h < t->n_gpus; h++)
        if (h != g && t->gpus[h].node == t->gpus[g].node) sum += t->nodes[0].nvlink_direct[g * t->nodes[0].n_gpus + h];
    for (int s = 0; s < t->n_nvswitches; s++) sum += t->nvswitches[s].gpu_links[t->gpus[g].local];
    return sum;
}

/* ---- presets ------------------------------------------------------------------------ */

Test(topology, every_preset_is_listed_and_loads_with_sources)
{
    static const char *const want[] = {"dgx1-p100", "dgx1-v100", "dgx2", "dgx-a100", "hgx-h100", "hgx-h200",
                                       "pcie-8gpu-2socket"};
    char **names = NULL;
    cr_assert_eq(cdp_topology_preset_names(&names), CDP_OK);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int found = 0;
        for (char **p = names; *p; p++) found |= !strcmp(*p, want[i]);
        cr_assert(found, "preset %s not listed", want[i]);
        struct cdp_topology *t = load(want[i]);
        cr_assert_eq(t->kind, CDP_TOPOLOGY_GPU);
        cr_assert_str_eq(t->name, want[i]);
        cr_assert(t->source && strlen(t->source) > 20, "%s cites nothing", want[i]);
        cr_assert_gt(t->network.nic_rate, 0, "%s: no network", want[i]);
        cr_assert_geq(t->n_numa, 2);
        for (int g = 0; g < t->n_gpus; g++) {
            cr_assert_gt(t->gpus[g].memory_bytes, 8ull << 30, "%s GPU %d memory", want[i], g);
            cr_assert_gt(t->gpus[g].peak_fp32, 1e12, "%s GPU %d FP32", want[i], g);
            cr_assert(t->gpus[g].cpuset[0], "%s GPU %d has no CPUs", want[i], g);
            cr_assert_geq(t->gpus[g].numa, 0);
        }
        cdp_topology_free(t);
    }
    cdp_topology_preset_names_free(names);
}

Test(topology, dgx1_p100_is_a_hybrid_cube_mesh_of_single_links)
{
    struct cdp_topology *t = load("dgx1-p100");
    cr_assert_eq(t->n_gpus, 8);
    int linked[8][8] = {{0}};
    for (int q = 0; q < 2; q++)
        for (int a = 4 * q; a < 4 * q + 4; a++)
            for (int b = 4 * q; b < 4 * q + 4; b++) linked[a][b] = a != b;
    for (int a = 0; a < 4; a++) linked[a][a + 4] = linked[a + 4][a] = 1;
    for (int a = 0; a < 8; a++) {
        cr_assert_eq(nvlinks_of(t, a), 4, "GPU %d has %d links", a, nvlinks_of(t, a));
        for (int b = 0; b < 8; b++)
            if (a != b) expect_label(t, a, b, linked[a][b] ? "NV1" : "SYS");
    }
    cr_assert_float_eq(link_of(t, 0, 1).bandwidth, 20e9, 1);
    cdp_topology_free(t);
}

Test(topology, dgx1_v100_pairs_match_the_published_link_counts)
{
    static const int two[][2] = {{0, 3}, {0, 4}, {1, 2}, {1, 5}, {2, 3}, {4, 7}, {5, 6}, {6, 7}};
    static const int one[][2] = {{0, 1}, {0, 2}, {1, 3}, {2, 6}, {3, 7}, {4, 5}, {4, 6}, {5, 7}};
    struct cdp_topology *t = load("dgx1-v100");
    int want[8][8] = {{0}};
    for (int i = 0; i < 8; i++) {
        want[two[i][0]][two[i][1]] = want[two[i][1]][two[i][0]] = 2;
        want[one[i][0]][one[i][1]] = want[one[i][1]][one[i][0]] = 1;
    }
    for (int a = 0; a < 8; a++) {
        cr_assert_eq(nvlinks_of(t, a), 6, "GPU %d has %d links", a, nvlinks_of(t, a));
        for (int b = 0; b < 8; b++) {
            if (a == b) continue;
            expect_label(t, a, b, want[a][b] == 2 ? "NV2" : want[a][b] == 1 ? "NV1" : "SYS");
            if (want[a][b]) cr_assert_float_eq(link_of(t, a, b).bandwidth, want[a][b] * 25e9, 1);
        }
    }
    cdp_topology_free(t);
}

Test(topology, nvswitch_presets_link_every_pair)
{
    struct {
        const char *name;
        int gpus, switches;
        const char *label;
        double gbps;
    } c[] = {
        {"dgx2", 16, 12, "NV6", 150},
        {"dgx-a100", 8, 6, "NV12", 300},
        {"hgx-h100", 8, 4, "NV18", 450},
        {"hgx-h200", 8, 4, "NV18", 450},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        struct cdp_topology *t = load(c[i].name);
        cr_assert_eq(t->n_gpus, c[i].gpus, "%s", c[i].name);
        cr_assert_eq(t->n_nvswitches, c[i].switches, "%s", c[i].name);
        expect_all(t, c[i].label, c[i].gbps);
        cr_assert_eq(link_of(t, 0, 1).cls, CDP_LINK_NVSWITCH);
        cdp_topology_free(t);
    }
    struct cdp_topology *t = load("hgx-h200");
    cr_assert_eq(t->gpus[0].memory_bytes, 141000000000ull);
    cr_assert_float_eq(t->gpus[0].peak_bf16, 989.5e12, 1e9);
    cdp_topology_free(t);
}

Test(topology, pcie_preset_has_pix_node_and_sys)
{
    struct cdp_topology *t = load("pcie-8gpu-2socket");
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 8; b++) {
            if (a == b) continue;
            const char *want = a / 2 == b / 2 ? "PIX" : a / 4 == b / 4 ? "NODE" : "SYS";
            expect_label(t, a, b, want);
        }
    cr_assert_float_eq(link_of(t, 0, 1).bandwidth, 25e9, 1);
    cr_assert_lt(link_of(t, 0, 4).bandwidth, link_of(t, 0, 2).bandwidth, "cross-socket should be slower");
    cdp_topology_free(t);
}

Test(topology, unknown_preset_suggests_the_nearest)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("dgx-a10", NULL, &t), CDP_ERR_INVALID);
    cr_assert_null(t);
    cr_assert(strstr(cdp_last_error(), "did you mean \"dgx-a100\"?"), "%s", cdp_last_error());
    char *path = NULL;
    cr_assert_eq(cdp_topology_preset_path("hgx-h10", &path), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "hgx-h100"), "%s", cdp_last_error());
}

Test(topology, topology_dir_from_the_environment_comes_first)
{
    const char *dir = cdp_test_tmpdir();
    cdp_test_write_file(dir, "my-box.json", "{\"name\": \"my-box\", \"source\": \"test\", \"gpus\": 2, "
                                            "\"gpu\": {\"name\": \"Tesla T4\"}}");
    cdp_test_write_file(dir, "dgx-a100.json", "{\"name\": \"shadowed\", \"gpus\": 1}");
    setenv("CDP_TOPOLOGY_DIR", dir, 1);
    struct cdp_topology *t = load("my-box");
    cr_assert_eq(t->n_gpus, 2);
    cr_assert_float_eq(t->gpus[0].peak_fp32, 8.1e12, 1e6, "facts by model name");
    cdp_topology_free(t);
    t = load("dgx-a100");
    cr_assert_str_eq(t->name, "shadowed");
    cdp_topology_free(t);
    unsetenv("CDP_TOPOLOGY_DIR");
}

/* ---- clusters and CPU topologies ------------------------------------------------------- */

Test(topology, cluster_spec_joins_nodes_with_the_network)
{
    struct cdp_topology *t = load("4 x dgx-a100");
    cr_assert_eq(t->n_nodes, 4);
    cr_assert_eq(t->n_gpus, 32);
    cr_assert_eq(t->n_nvswitches, 24);
    cr_assert_eq(t->n_nics, 32);
    cr_assert_str_eq(t->name, "4 x dgx-a100");
    cr_assert_str_eq(label(t, 8, 15), "NV12");
    struct cdp_topology_link l = link_of(t, 0, 8);
    cr_assert_eq(l.cls, CDP_LINK_NET);
    cr_assert_float_eq(l.bandwidth, 200e9 / 8, 1, "HDR 200 Gb/s per NIC");
    cr_assert_gt(l.latency, 0);
    cr_assert_eq(t->gpus[9].node, 1);
    cr_assert_eq(t->gpus[9].local, 1);
    cdp_topology_free(t);
    t = load("2xhgx-h100");
    cr_assert_eq(t->n_gpus, 16);
    cdp_topology_free(t);
    cr_assert_eq(cdp_topology_load("0 x dgx-a100", NULL, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "1 to 65536"), "%s", cdp_last_error());
}

Test(topology, cluster_file_with_its_own_node_and_network)
{
    struct cdp_topology *t = load_fixture("cluster-2x-custom.json");
    cr_assert_eq(t->n_nodes, 2);
    cr_assert_str_eq(t->name, "two boxes");
    cr_assert_str_eq(label(t, 0, 1), "NV12");
    cr_assert_str_eq(label(t, 2, 3), "NV12");
    struct cdp_topology_link l = link_of(t, 1, 2);
    cr_assert_eq(l.cls, CDP_LINK_NET);
    cr_assert_float_eq(l.bandwidth, 12.5e9, 1);
    cr_assert_float_eq(l.latency, 10e-6, 1e-12);
    cdp_topology_free(t);
}

/* ---- clusters of different nodes ("1 x dgx-a100 + 1 x dgx1-v100") ---------------------- */

Test(topology, mixed_cluster_keeps_each_nodes_gpus_and_links)
{
    struct cdp_topology *t = load("1 x dgx-a100 + 1 x dgx1-v100");
    cr_assert_str_eq(t->name, "1 x dgx-a100 + 1 x dgx1-v100");
    cr_assert_eq(t->n_nodes, 2);
    cr_assert_eq(t->n_gpus, 16);
    cr_assert_eq(t->n_nvswitches, 6, "the A100 node's switches only");
    cr_assert_eq(t->n_nics, 8 + 4);
    cr_assert_eq(t->nodes[1].first_gpu, 8);
    cr_assert_str_eq(t->nodes[0].name, "dgx-a100");
    cr_assert_str_eq(t->nodes[1].name, "dgx1-v100");
    for (int g = 0; g < 16; g++) {
        const struct cdp_topology_gpu *gp = &t->gpus[g];
        cr_assert_eq(gp->node, g / 8);
        cr_assert_eq(gp->local, g % 8);
        cr_assert_str_eq(gp->name, g < 8 ? "NVIDIA A100-SXM4-80GB" : "Tesla V100-SXM2-16GB", "GPU %d", g);
        cr_assert_float_eq(gp->peak_fp32, g < 8 ? 19.5e12 : 15.7e12, 1e6, "GPU %d", g);
        cr_assert_float_eq(gp->peak_bf16, g < 8 ? 312e12 : 0, 1e6, "GPU %d: the V100 has no BF16", g);
        cr_assert_eq(gp->memory_bytes, g < 8 ? 80ull << 30 : 16ull << 30, "GPU %d", g);
    }
    /* each node keeps its own links: NV12 through the switches, the DGX-1's cube mesh */
    expect_label(t, 0, 7, "NV12");
    expect_label(t, 8, 11, "NV2");
    expect_label(t, 8, 9, "NV1");
    expect_label(t, 8, 13, "SYS");
    cr_assert_float_eq(link_of(t, 8, 11).bandwidth, 50e9, 1);
    /* across: the slower network (EDR 100 Gb/s, not HDR 200 Gb/s), the larger latency */
    expect_label(t, 3, 12, "NET");
    cr_assert_float_eq(link_of(t, 3, 12).bandwidth, 100e9 / 8, 1);
    cr_assert_float_eq(link_of(t, 12, 3).latency, 5e-6, 1e-12);
    cr_assert_str_eq(t->network.name, "InfiniBand EDR");
    cr_assert_eq(t->network.nics_per_node, 4);
    cr_assert(strstr(t->source, "dgx-a100: ") && strstr(t->source, "; dgx1-v100: "), "%s", t->source);
    cr_assert(!cdp_topology_nodes_alike(t, 0, 1));
    cdp_topology_free(t);

    /* bare presets are one node; counts repeat a term; order is kept */
    t = load("dgx1-v100+2xdgx-a100");
    cr_assert_str_eq(t->name, "1 x dgx1-v100 + 2 x dgx-a100");
    cr_assert_eq(t->n_nodes, 3);
    cr_assert_eq(t->n_gpus, 24);
    cr_assert_str_eq(t->gpus[7].name, "Tesla V100-SXM2-16GB");
    cr_assert_str_eq(t->gpus[16].name, "NVIDIA A100-SXM4-80GB");
    cr_assert_eq(t->gpus[16].node, 2);
    cr_assert(cdp_topology_nodes_alike(t, 1, 2));
    expect_label(t, 8, 16, "NET");
    cr_assert_float_eq(link_of(t, 8, 16).bandwidth, 100e9 / 8, 1, "one network for the whole cluster");
    cdp_topology_free(t);
}

Test(topology, one_term_join_is_the_cluster)
{
    struct cdp_topology *node = load("dgx2"), *a = NULL, *b = load("3 x dgx2");
    const struct cdp_topology *nodes[1] = {node};
    const int three = 3;
    cr_assert_eq(cdp_topology_join(nodes, &three, 1, NULL, &a), CDP_OK, "%s", cdp_last_error());
    char why[256];
    cr_assert(cdp_topology_equal(a, b, why, sizeof why), "%s", why);
    cdp_topology_free(a);
    cdp_topology_free(b);
    /* the same node twice: alike nodes, named by term */
    const struct cdp_topology *two[2] = {node, node};
    const int ones[2] = {1, 1};
    cr_assert_eq(cdp_topology_join(two, ones, 2, NULL, &a), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(a->name, "1 x dgx2 + 1 x dgx2");
    cr_assert(cdp_topology_nodes_alike(a, 0, 1));
    cr_assert_float_eq(link_of(a, 0, 16).bandwidth, 100e9 / 8, 1);
    cdp_topology_free(a);
    const int zero[2] = {1, 0};
    cr_assert_eq(cdp_topology_join(two, zero, 2, NULL, &a), CDP_ERR_INVALID);
    cr_assert_eq(cdp_topology_join(two, ones, 0, NULL, &a), CDP_ERR_INVALID);
    cdp_topology_free(node);
}

#define NET_NODE(name, nics, rate, lat)                                                                       \
    "{\"name\": \"" name "\", \"gpus\": 2, \"gpu\": {\"name\": \"NVIDIA H100 80GB HBM3\"}, "                   \
    "\"network\": {\"name\": \"" name "-net\", \"nics_per_node\": " #nics ", \"nic_rate\": \"" rate "\", "      \
    "\"latency_us\": " #lat "}}"

Test(topology, mixed_network_takes_the_slower_rate_and_the_larger_latency)
{
    const char *dir = cdp_test_tmpdir();
    cdp_test_write_file(dir, "fast.json", NET_NODE("fast", 8, "400Gb/s", 2));
    cdp_test_write_file(dir, "slow.json", NET_NODE("slow", 2, "100Gb/s", 1));
    cdp_test_write_file(dir, "far.json", NET_NODE("far", 4, "200Gb/s", 9));
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("2 x fast.json + slow.json + 1 x ./far.json", dir, &t), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_str_eq(t->name, "2 x fast + 1 x slow + 1 x far");
    cr_assert_eq(t->n_gpus, 8);
    struct cdp_topology_link l = link_of(t, 0, 2); /* two "fast" nodes: still the one network */
    cr_assert_eq(l.cls, CDP_LINK_NET);
    cr_assert_float_eq(l.bandwidth, 100e9 / 8, 1, "the slowest NIC rate");
    cr_assert_float_eq(l.latency, 9e-6, 1e-12, "the largest latency");
    cr_assert_eq(t->network.nics_per_node, 2, "the fewest NICs");
    cr_assert_str_eq(t->network.name, "slow-net", "named after the network whose rate it took");
    cdp_topology_free(t);
    /* terms that agree keep their network as it is */
    cr_assert_eq(cdp_topology_load("fast.json + fast.json", dir, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_float_eq(t->network.latency, 2e-6, 1e-12);
    cr_assert_float_eq(t->network.nic_rate, 400e9 / 8, 1);
    cdp_topology_free(t);
    /* the plan keeps a join with files as absolute paths, every term counted */
    char *norm = NULL;
    cr_assert_eq(cdp_topology_check_spec("fast.json + 2 x dgx2", dir, &norm), CDP_OK, "%s", cdp_last_error());
    char want[1024];
    char *real = realpath(dir, NULL);
    snprintf(want, sizeof want, "1 x %s/fast.json + 2 x dgx2", real);
    cr_assert_str_eq(norm, want);
    free(norm);
    free(real);
    cr_assert_eq(cdp_topology_check_spec("1 x dgx-a100 + 1 x dgx1-v100", NULL, &norm), CDP_OK);
    cr_assert_str_eq(norm, "1 x dgx-a100 + 1 x dgx1-v100", "presets only: as written");
    free(norm);
    /* a file whose name has a '+' is still a file, alone or as a cluster's node */
    cdp_test_write_file(dir, "a+b.json", NET_NODE("plus", 1, "10Gb/s", 1));
    cr_assert_eq(cdp_topology_load("a+b.json", dir, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(t->name, "plus");
    cdp_topology_free(t);
    cr_assert_eq(cdp_topology_load("2 x a+b.json", dir, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(t->name, "2 x plus");
    cdp_topology_free(t);
}

struct bad_term {
    char spec[96];
    char expect[160];
};

ParameterizedTestParameters(topology, bad_terms_are_named)
{
    static struct bad_term cases[] = {
        {"1 x dgx-a100 + 1 x dgx-v100",
         "topology \"1 x dgx-a100 + 1 x dgx-v100\": term 2 \"1 x dgx-v100\": cannot open"},
        {"1 x dgx-a100 + 1 x dgx-v10",
         "term 2 \"1 x dgx-v10\": cannot open \"dgx-v10\": No such file or directory, and \"dgx-v10\" is not a "
         "preset either (did you mean"},
        {"dgx-a100 + ", "term 2 is empty"},
        {"+ dgx-a100", "term 1 is empty"},
        {"dgx-a100 ++ dgx2", "term 2 is empty"},
        {"0 x dgx2 + dgx-a100", "term 1 \"0 x dgx2\": 0 nodes; a term has 1 to 65536"},
        {"dgx2 + 70000 x dgx2", "term 2 \"70000 x dgx2\": 70000 nodes"},
        {"40000 x dgx2 + 40000 x dgx2", "80000 nodes; a cluster has 1 to 65536"},
        {"dgx-a100 + auto", "term 2 \"auto\": a term is N x a preset or a one-node file"},
        {"dgx-a100 + 2 x 3 x dgx2", "term 2 \"2 x 3 x dgx2\": a term is N x a preset or a one-node file"},
        {"dgx-a100 + /no/such/node.json", "term 2 \"/no/such/node.json\": cannot open \"/no/such/node.json\""},
    };
    return cr_make_param_array(struct bad_term, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct bad_term *c, topology, bad_terms_are_named)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load(c->spec, NULL, &t), CDP_ERR_INVALID, "%s", c->spec);
    cr_assert_null(t);
    cr_assert(strstr(cdp_last_error(), c->expect), "\"%s\": expected \"%s\" in: %s", c->spec, c->expect,
              cdp_last_error());
    /* the plan's check says the same without loading */
    char *norm = NULL;
    cr_assert_eq(cdp_topology_check_spec(c->spec, NULL, &norm), CDP_ERR_INVALID, "%s", c->spec);
    cr_assert_null(norm);
}

Test(topology, bad_term_files_are_named)
{
    const char *dir = cdp_test_tmpdir();
    cdp_test_write_file(dir, "cpus.json", "{\"name\": \"cpus\", \"kind\": \"cpu\", \"gpus\": 2}");
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("dgx-a100 + cpus.json", dir, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "term 2 (cpus) has CPU devices, term 1 (dgx-a100) GPU devices"), "%s",
              cdp_last_error());
    char spec[1024];
    snprintf(spec, sizeof spec, "dgx-a100 + 1 x %s",
             cdp_test_source_path("tests/fixtures/topology/cluster-2x-custom.json"));
    cr_assert_eq(cdp_topology_load(spec, NULL, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "term 2 \"1 x ") && strstr(cdp_last_error(), "already has 2 nodes"), "%s",
              cdp_last_error());
    cdp_test_write_file(dir, "broken.json", "{\"gpus\": -1}");
    cr_assert_eq(cdp_topology_load("dgx2 + broken.json", dir, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "term 2 \"broken.json\": ") && strstr(cdp_last_error(), "broken.json: /gpus"),
              "%s", cdp_last_error());
    cr_assert_null(t);
}

Test(topology, cpu_topology_has_memory_copy_links)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_cpu(4, 30e9, 1ull << 30, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(t->kind, CDP_TOPOLOGY_CPU);
    cr_assert_eq(t->n_gpus, 4);
    cr_assert_str_eq(label(t, 0, 3), "MEM");
    cr_assert_float_eq(link_of(t, 2, 1).bandwidth, 30e9, 1);
    cr_assert_eq(t->gpus[3].memory_bytes, 1ull << 30);
    cdp_topology_free(t);
    cr_assert_eq(cdp_topology_cpu(0, 1e9, 0, &t), CDP_ERR_INVALID);
}

/* ---- live discovery -------------------------------------------------------------------- */

static void check_cpu_only(const struct cdp_topology *t, int devices)
{
    cr_assert_eq(t->kind, CDP_TOPOLOGY_CPU, "this machine has no GPU: expected a CPU topology");
    cr_assert_eq(t->n_nodes, 1);
    if (devices) cr_assert_eq(t->n_gpus, devices);
    else cr_assert_geq(t->n_gpus, 1);
    cr_assert_geq(t->n_numa, 1);
    cr_assert(t->numa[0].cpuset[0], "NUMA 0 has no CPUs");
    cr_assert_gt(t->gpus[0].memory_bytes, 0);
    for (int a = 0; a < t->n_gpus; a++)
        for (int b = 0; b < t->n_gpus; b++)
            if (a != b) cr_assert_eq(link_of(t, a, b).cls, CDP_LINK_MEM);
}

Test(topology, live_discovery_without_gpu_is_a_cpu_topology)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_discover(NULL, &t), CDP_OK, "%s", cdp_last_error());
    check_cpu_only(t, 0);
    cdp_topology_free(t);
    struct cdp_discover_options o = {.cpu_devices = 3, .cpu_copy_bw = 17e9};
    cr_assert_eq(cdp_topology_discover(&o, &t), CDP_OK, "%s", cdp_last_error());
    check_cpu_only(t, 3);
    cr_assert_float_eq(link_of(t, 0, 2).bandwidth, 17e9, 1);
    cdp_topology_free(t);
    struct cdp_discover_options plain = {.no_hwloc = 1, .no_nvml = 1, .cpu_devices = 2};
    cr_assert_eq(cdp_topology_discover(&plain, &t), CDP_OK, "%s", cdp_last_error());
    check_cpu_only(t, 2);
    cdp_topology_free(t);
    cr_assert_eq(cdp_topology_load("auto", NULL, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(t->kind, CDP_TOPOLOGY_CPU);
    cdp_topology_free(t);
}

/* ---- NVML through a stand-in library ------------------------------------------------------ */

/* Four GPUs. Mode 0: direct NVLinks 0-1 x2, 2-3 x2, 0-2 x1, 1-3 x1 (NVLink 2.0);
 * PCIe: 0-1 and 2-3 behind one switch, the halves on two sockets. Mode 1: each GPU
 * 3 links to each of two NVSwitches (NVLink 3.x). */
static int fake_mode;
static const char fake_bus[4][32] = {"00000000:06:00.0", "00000000:07:00.0", "00000000:85:00.0", "00000000:86:00.0"};
struct cdp_nvml_device_st {
    int i;
};
static struct cdp_nvml_device_st fake_dev[4] = {{0}, {1}, {2}, {3}};
static int fake_peer(int i, unsigned l, int *type, const char **bus)
{
    static const char *const sw[2] = {"00000000:c1:00.0", "00000000:c2:00.0"};
    if (fake_mode == 1) {
        if (l >= 6) return -1;
        *type = 2;
        *bus = sw[l / 3];
        return 0;
    }
    static const int peers[4][3] = {{1, 1, 2}, {0, 0, 3}, {3, 3, 0}, {2, 2, 1}};
    if (l >= 3) return -1;
    *type = 0;
    *bus = fake_bus[peers[i][l]];
    return 0;
}
static int f_ok(void) { return 0; }
static const char *f_err(int rc) { return rc == 2 ? "Invalid Argument" : "fake error"; }
static int f_count(unsigned *n) { *n = 4; return 0; }
static int f_by_index(unsigned i, cdp_nvml_device *d) { *d = &fake_dev[i]; return 0; }
static int f_name(cdp_nvml_device d, char *s, unsigned n)
{
    snprintf(s, n, fake_mode ? "NVIDIA A100-SXM4-80GB" : "Tesla V100-SXM2-32GB");
    (void)d;
    return 0;
}
static int f_mem(cdp_nvml_device d, struct cdp_nvml_memory *m)
{
    m->total = (32ull << 30) + (unsigned long long)d->i;
    return 0;
}
static int f_pci(cdp_nvml_device d, struct cdp_nvml_pci_info *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->bus_id, sizeof p->bus_id, "%s", fake_bus[d->i]);
    return 0;
}
static int f_state(cdp_nvml_device d, unsigned l, int *active)
{
    int type;
    const char *bus;
    if (fake_peer(d->i, l, &type, &bus)) return 2; /* NVML_ERROR_INVALID_ARGUMENT past the last link */
    *active = 1;
    return 0;
}
static int f_version(cdp_nvml_device d, unsigned l, unsigned *v)
{
    (void)d, (void)l;
    *v = fake_mode ? 4 : 2;
    return 0;
}
static int f_remote_pci(cdp_nvml_device d, unsigned l, struct cdp_nvml_pci_info *p)
{
    int type;
    const char *bus;
    if (fake_peer(d->i, l, &type, &bus)) return 2;
    memset(p, 0, sizeof *p);
    snprintf(p->bus_id, sizeof p->bus_id, "%s", bus);
    return 0;
}
static int f_remote_type(cdp_nvml_device d, unsigned l, int *t)
{
    const char *bus;
    return fake_peer(d->i, l, t, &bus) ? 2 : 0;
}
static int f_ancestor(cdp_nvml_device a, cdp_nvml_device b, int *level)
{
    *level = a->i / 2 == b->i / 2 ? 10 : 50;
    return 0;
}

static const struct cdp_nvml_api fake_api = {
    .init = f_ok, .shutdown = f_ok, .error_string = f_err, .device_count = f_count,
    .device_by_index = f_by_index, .device_name = f_name, .device_memory = f_mem, .device_pci = f_pci,
    .nvlink_state = f_state, .nvlink_version = f_version, .nvlink_remote_pci = f_remote_pci,
    .nvlink_remote_type = f_remote_type, .common_ancestor = f_ancestor,
};

static struct cdp_topology *with_fake_nvml(int mode)
{
    struct cdp_topology *t = NULL;
    struct cdp_discover_options o = {.no_hwloc = 1, .no_nvml = 1};
    fake_mode = mode;
    cr_assert_eq(cdp_topology_discover(&o, &t), CDP_OK, "%s", cdp_last_error());
    /* discover() made it a CPU topology; start again from its NUMA node. */
    t->kind = CDP_TOPOLOGY_GPU;
    cr_assert_eq(cdp_topology_apply_nvml(t, &fake_api), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_topology_finalize(t, "fake NVML"), CDP_OK, "%s", cdp_last_error());
    return t;
}

Test(topology, nvml_direct_links_names_memory_and_pcie_classes)
{
    struct cdp_topology *t = with_fake_nvml(0);
    cr_assert_eq(t->n_gpus, 4);
    cr_assert_str_eq(t->gpus[2].name, "Tesla V100-SXM2-32GB");
    cr_assert_str_eq(t->gpus[2].pci_bus_id, "0000:85:00.0");
    cr_assert_eq(t->gpus[3].memory_bytes, (32ull << 30) + 3);
    cr_assert_float_eq(t->gpus[0].peak_fp32, 15.7e12, 1e6);
    expect_label(t, 0, 1, "NV2");
    expect_label(t, 2, 3, "NV2");
    expect_label(t, 0, 2, "NV1");
    expect_label(t, 1, 3, "NV1");
    expect_label(t, 0, 3, "SYS");
    expect_label(t, 1, 2, "SYS");
    cr_assert_float_eq(link_of(t, 0, 1).bandwidth, 50e9, 1);
    cr_assert_neq(t->gpus[0].numa, t->gpus[2].numa);
    cdp_topology_free(t);
}

Test(topology, nvml_nvswitch_links_are_merged)
{
    struct cdp_topology *t = with_fake_nvml(1);
    cr_assert_eq(t->n_nvswitches, 2);
    expect_all(t, "NV6", 150);
    cr_assert_eq(link_of(t, 0, 3).cls, CDP_LINK_NVSWITCH);
    cdp_topology_free(t);
}

/* ---- our fixtures ---------------------------------------------------------------------- */

Test(topology, hwloc_fixture_nvlink_matrix_and_pci_tree)
{
    struct cdp_topology *t = load_fixture("hwloc-4gpu-nvlink.xml");
    cr_assert_eq(t->n_gpus, 4);
    cr_assert_str_eq(t->name, "test-4gpu");
    cr_assert_str_eq(t->gpus[0].name, "Tesla V100-SXM2-16GB");
    cr_assert_eq(t->gpus[0].memory_bytes, 16515072ull * 1024, "CUDAGlobalMemorySize is in KiB");
    cr_assert_eq(t->gpus[1].memory_bytes, 16ull << 30, "from the model name");
    expect_label(t, 0, 1, "NV2");
    expect_label(t, 2, 3, "NV2");
    expect_label(t, 0, 2, "NV1");
    expect_label(t, 1, 3, "NV1");
    expect_label(t, 0, 3, "SYS");
    expect_label(t, 1, 2, "SYS");
    cr_assert_eq(t->gpus[0].numa, 0);
    cr_assert_eq(t->gpus[3].numa, 1);
    cr_assert_str_eq(t->gpus[3].cpuset, "2-3");
    cr_assert_float_eq(t->gpus[3].pcie_bw, 7.876923e9, 1e3);
    cr_assert_eq(t->n_nics, 1);
    cr_assert_str_eq(t->nics[0].name, "mlx5_0");
    cr_assert_eq(t->nics[0].numa, 0);
    /* The switch under a root port: GPUs 0 and 1 share one switch (PIX). */
    cr_assert_eq(t->gpus[0].pcie_depth, 2);
    cr_assert_eq(t->gpus[0].pcie_path[1], t->gpus[1].pcie_path[1]);
    cdp_topology_free(t);
}

Test(topology, hwloc_fixture_switch_ports_merge_to_nv12)
{
    struct cdp_topology *t = load_fixture("hwloc-nvswitch.xml");
    cr_assert_eq(t->n_gpus, 4);
    cr_assert_eq(t->n_nvswitches, 2);
    cr_assert_str_eq(t->gpus[0].name, "NVIDIA A100-SXM4-80GB", "named from the PCI id");
    expect_all(t, "NV12", 300);
    cdp_topology_free(t);
}

Test(topology, nccl_fixture_switches_gpus_nvlinks_nics)
{
    struct cdp_topology *t = load_fixture("nccl-4gpu.xml");
    cr_assert_eq(t->n_gpus, 4);
    cr_assert_str_eq(t->gpus[0].name, "Tesla V100-SXM2-32GB");
    expect_label(t, 0, 1, "NV2");
    expect_label(t, 0, 2, "NV1");
    expect_label(t, 2, 3, "PXB");
    expect_label(t, 1, 3, "SYS");
    cr_assert_float_eq(link_of(t, 2, 3).bandwidth, 8e9 * 16 * 128 / 130 / 8, 1e3, "8 GT/s x16");
    cr_assert_eq(t->n_nics, 1);
    cr_assert_str_eq(t->nics[0].name, "mlx5_0");
    cr_assert_float_eq(t->nics[0].rate, 25e9, 1);
    cr_assert_str_eq(t->gpus[3].cpuset, "4-7");
    cdp_topology_free(t);
    t = load_fixture("nccl-nvswitch.xml");
    cr_assert_eq(t->n_nvswitches, 4);
    expect_all(t, "NV18", 450);
    cr_assert_str_eq(t->gpus[0].name, "NVIDIA H100 80GB HBM3");
    cdp_topology_free(t);
}

/* ---- round trips ------------------------------------------------------------------------ */

static void xml_round_trip(const struct cdp_topology *t)
{
    char *xml = NULL, why[512] = "";
    struct cdp_topology *back = NULL;
    cr_assert_eq(cdp_topology_to_hwloc_xml(t, &xml), CDP_OK, "%s: %s", t->name, cdp_last_error());
    cr_assert_eq(cdp_topology_load_text(xml, strlen(xml), "export.xml", &back), CDP_OK, "%s: %s", t->name,
                 cdp_last_error());
    cr_assert(cdp_topology_equal(t, back, why, sizeof why), "%s: export -> import differs: %s", t->name, why);
    cdp_topology_free(back);
    free(xml);
}

static void json_round_trip(const struct cdp_topology *t)
{
    char *text = NULL, why[512] = "";
    struct cdp_topology *back = NULL;
    cr_assert_eq(cdp_topology_to_native_json(t, &text), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_topology_load_text(text, strlen(text), "native.json", &back), CDP_OK, "%s: %s\n%s", t->name,
                 cdp_last_error(), text);
    cr_assert(cdp_topology_equal(t, back, why, sizeof why), "%s: JSON round trip differs: %s", t->name, why);
    cdp_topology_free(back);
    free(text);
}

Test(topology, export_then_import_is_identical)
{
    static const char *const specs[] = {"dgx1-p100", "dgx1-v100", "dgx2", "dgx-a100", "hgx-h100", "hgx-h200",
                                        "pcie-8gpu-2socket", "auto"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        struct cdp_topology *t = load(specs[i]);
        xml_round_trip(t);
        json_round_trip(t);
        cdp_topology_free(t);
    }
    static const char *const fixtures[] = {"hwloc-4gpu-nvlink.xml", "hwloc-nvswitch.xml", "nccl-4gpu.xml",
                                           "nccl-nvswitch.xml"};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        struct cdp_topology *t = load_fixture(fixtures[i]);
        xml_round_trip(t);
        json_round_trip(t);
        cdp_topology_free(t);
    }
    struct cdp_topology *t = load("3 x dgx1-v100");
    json_round_trip(t);
    char *xml = NULL;
    cr_assert_eq(cdp_topology_to_hwloc_xml(t, &xml), CDP_ERR_INVALID, "hwloc XML is one machine");
    cr_assert(strstr(cdp_last_error(), "one machine"), "%s", cdp_last_error());
    cdp_topology_free(t);
}

Test(topology, export_file_is_written_whole)
{
    struct cdp_topology *t = load("dgx-a100"), *back = NULL;
    const char *dir = cdp_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/a100.xml", dir);
    cr_assert_eq(cdp_topology_export_xml(t, path), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_topology_load_file(path, &back), CDP_OK, "%s", cdp_last_error());
    cr_assert(cdp_topology_equal(t, back, NULL, 0));
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    struct stat sb;
    cr_assert_neq(stat(tmp, &sb), 0, "temporary file left behind");
    snprintf(path, sizeof path, "%s/no/such/folder/a.xml", dir);
    cr_assert_eq(cdp_topology_export_xml(t, path), CDP_ERR_IO);
    cdp_topology_free(back);
    cdp_topology_free(t);
}

#if CDP_HAVE_HWLOC
/* hwloc itself reads what we export: the GPUs stay, and its own transform of our
 * NVLinkBandwidth matrix gives the GPU<->GPU bandwidth we derive. */
static void hwloc_reads(const char *spec, int gpus, unsigned long long mbps)
{
    struct cdp_topology *t = load(spec);
    char *xml = NULL;
    cr_assert_eq(cdp_topology_to_hwloc_xml(t, &xml), CDP_OK);
    hwloc_topology_t h;
    cr_assert_eq(hwloc_topology_init(&h), 0);
    hwloc_topology_set_io_types_filter(h, HWLOC_TYPE_FILTER_KEEP_ALL);
    cr_assert_eq(hwloc_topology_set_xmlbuffer(h, xml, (int)strlen(xml) + 1), 0);
    cr_assert_eq(hwloc_topology_load(h), 0, "hwloc rejects our export of %s", spec);
    int found = 0;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(h, o));)
        found += o->attr->pcidev.vendor_id == 0x10de && (o->attr->pcidev.class_id >> 8) == 0x03;
    cr_assert_eq(found, gpus, "%s: hwloc sees %d GPUs", spec, found);
    struct hwloc_distances_s *d[1];
    unsigned nr = 1;
    cr_assert_eq(hwloc_distances_get_by_name(h, "NVLinkBandwidth", &nr, d, 0), 0);
    cr_assert_eq(nr, 1u, "%s: no NVLinkBandwidth", spec);
    cr_assert_eq(d[0]->nbobjs, (unsigned)(gpus + t->n_nvswitches));
    if (t->n_nvswitches) {
        cr_assert_eq(hwloc_distances_transform(h, d[0], HWLOC_DISTANCES_TRANSFORM_MERGE_SWITCH_PORTS, NULL, 0), 0);
        cr_assert_eq(hwloc_distances_transform(h, d[0], HWLOC_DISTANCES_TRANSFORM_TRANSITIVE_CLOSURE, NULL, 0), 0);
    }
    cr_assert_eq(d[0]->values[1], mbps, "%s: hwloc says %llu MB/s between GPU 0 and 1", spec,
                 (unsigned long long)d[0]->values[1]);
    hwloc_distances_release(h, d[0]);
    hwloc_topology_destroy(h);
    free(xml);
    cdp_topology_free(t);
}

Test(topology, hwloc_library_reads_our_export)
{
    hwloc_reads("dgx-a100", 8, 300000);
    hwloc_reads("dgx2", 16, 150000);
    hwloc_reads("dgx1-v100", 8, 25000);
    hwloc_reads("pcie-8gpu-2socket", 8, 0);
}
#endif

/* ---- public fixtures (../shared/fixtures/topologies) ---------------------------------------- */

static const char *shared(const char *name)
{
    static char path[1024];
    const char *root = getenv("CDP_SHARED_FIXTURES");
    if (!root) return NULL;
    snprintf(path, sizeof path, "%s/topologies/%s", root, name);
    struct stat sb;
    return stat(path, &sb) == 0 ? path : NULL;
}

Test(topology, public_fixtures_load_with_their_gpus_and_nvlinks)
{
    struct {
        const char *file;
        int gpus, nics;
    } c[] = {
        {"hwloc-nvidiaDGX2.v2.xml", 16, -1},   {"hwloc-power8gpudistances.xml", 4, -1},
        {"mpibind-coral-lassen.xml", 4, -1},   {"mpibind-cts1-pascal.xml", 2, -1},
        {"mpibind-g4dnmetal.xml", 8, -1},      {"azure-ndv2-topo.xml", 8, 1},
        {"azure-ndv4-topo.xml", 8, 8},         {"azure-ndv5-topo.xml", 8, 8},
        {"azure-ncv4-topo.xml", 4, 1},         {"aws-p4d-24xl-topo.xml", 8, 4},
        {"aws-p4de-24xl-topo.xml", 8, 4},      {"aws-p5.48xl-topo.xml", 0, -1},
    };
    if (!shared("README.txt"))
        cr_skip_test("../shared/fixtures/topologies not found (CDP_SHARED_FIXTURES=%s): the public fixtures are not "
                     "checked", getenv("CDP_SHARED_FIXTURES") ? getenv("CDP_SHARED_FIXTURES") : "unset");
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const char *p = shared(c[i].file);
        cr_assert_not_null(p, "%s is missing", c[i].file);
        struct cdp_topology *t = load(p);
        cr_assert_eq(t->n_gpus, c[i].gpus, "%s: %d GPUs", c[i].file, t->n_gpus);
        if (c[i].nics >= 0) cr_assert_eq(t->n_nics, c[i].nics, "%s: %d NICs", c[i].file, t->n_nics);
        /* Only the two hwloc files with an NVLinkBandwidth matrix have NVLinks. */
        int nv = strstr(c[i].file, "DGX2") || strstr(c[i].file, "power8");
        for (int a = 0; a < t->n_gpus && !nv; a++)
            for (int b = 0; b < t->n_gpus; b++)
                if (a != b) cr_assert_eq(link_of(t, a, b).nvlinks, 0, "%s: NVLink %d-%d", c[i].file, a, b);
        xml_round_trip(t);
        cdp_topology_free(t);
    }
    struct cdp_topology *t = load(shared("hwloc-nvidiaDGX2.v2.xml"));
    cr_assert_eq(t->n_nvswitches, 12);
    expect_all(t, "NV6", 150);
    cdp_topology_free(t);
    t = load(shared("hwloc-power8gpudistances.xml"));
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            if (a == b) continue;
            int pair = a / 2 == b / 2;
            cr_assert_eq(link_of(t, a, b).nvlinks, pair ? 2 : 0, "Minsky GPU %d-%d", a, b);
            if (pair) cr_assert_float_eq(link_of(t, a, b).bandwidth, 40e9, 1);
        }
    cdp_topology_free(t);
    t = load(shared("aws-p4d-24xl-topo.xml"));
    expect_label(t, 0, 1, "PIX");
    expect_label(t, 0, 2, "NODE");
    expect_label(t, 0, 4, "SYS");
    cdp_topology_free(t);
}

Test(topology, public_dgx2_in_hwloc_3_is_refused_clearly)
{
    const char *p = shared("hwloc-nvidiaDGX2.v2.xml");
    if (!p)
        cr_skip_test("../shared/fixtures/topologies not found (CDP_SHARED_FIXTURES=%s): not checked",
                     getenv("CDP_SHARED_FIXTURES") ? getenv("CDP_SHARED_FIXTURES") : "unset");
    char *text = cdp_test_read_file(p);
    cr_assert_not_null(text);
    char *v = strstr(text, "version=\"2.0\"");
    cr_assert_not_null(v);
    v[9] = '3';
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load_text(text, strlen(text), "dgx2-v3.xml", &t), CDP_ERR_UNSUPPORTED);
    cr_assert(strstr(cdp_last_error(), "version \"3.0\""), "%s", cdp_last_error());
    free(text);
}

/* ---- bad files ------------------------------------------------------------------------- */

#define HW_HEAD "<topology version=\"2.0\"><object type=\"Machine\" os_index=\"0\" cpuset=\"0x1\" nodeset=\"0x1\" gp_index=\"1\">" \
    "<object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x1\" nodeset=\"0x1\" gp_index=\"2\"/>" \
    "<object type=\"PCIDev\" gp_index=\"3\" pci_busid=\"0000:01:00.0\" pci_type=\"0302 [10de:1db1] [0000:0000] a1\">" \
    "<object type=\"OSDev\" gp_index=\"4\" name=\"nvml0\" osdev_type=\"1\"/></object>" \
    "<object type=\"PCIDev\" gp_index=\"5\" pci_busid=\"0000:02:00.0\" pci_type=\"0302 [10de:1db1] [0000:0000] a1\">" \
    "<object type=\"OSDev\" gp_index=\"6\" name=\"nvml1\" osdev_type=\"1\"/></object></object>"
#define NCCL_GPU(bus, dev, links) "<pci busid=\"" bus "\" class=\"0x030200\" vendor=\"0x10de\"><gpu dev=\"" dev "\" sm=\"70\">" links "</gpu></pci>"

struct bad_case {
    char name[40];
    char text[900];
    int status;
    char expect[120];
};

ParameterizedTestParameters(topology, bad_files_give_clear_errors)
{
    static struct bad_case cases[] = {
        {"empty", "   \n", CDP_ERR_INVALID, "bad.txt: the file is empty"},
        {"not a topology", "hello", CDP_ERR_INVALID, "not a topology file"},
        {"other xml root", "<html></html>", CDP_ERR_INVALID, "root element <html>"},
        {"truncated xml", "<topology version=\"2.0\">\n  <object type=\"Machine\" gp_index=\"1\">\n    <object type=\"NUMA",
         CDP_ERR_INVALID, "line 3: the file ends inside an attribute value of <object>"},
        {"truncated after a tag", "<system version=\"1\">\n<cpu numaid=\"0\">\n", CDP_ERR_INVALID,
         "before <cpu> (opened at line 2) is closed: truncated?"},
        {"mismatched tags", "<system>\n<cpu></pci>\n</system>", CDP_ERR_INVALID,
         "line 2: closing tag </pci> does not match <cpu> opened at line 2"},
        {"hwloc 3.0", "<topology version=\"3.0\"><object type=\"Machine\"/></topology>", CDP_ERR_UNSUPPORTED,
         "hwloc XML version \"3.0\": this build reads hwloc v2 XML only"},
        {"hwloc 1.x", "<topology><object type=\"Machine\"/></topology>", CDP_ERR_UNSUPPORTED, "hwloc 1.x XML"},
        {"hwloc link to a missing gpu",
         HW_HEAD "<distances2 type=\"OSDev\" nbobjs=\"2\" kind=\"9\" indexing=\"gp\" name=\"NVLinkBandwidth\">"
                 "<indexes length=\"5\">4 99 </indexes><u64values length=\"10\">1 25000 25000 1 </u64values>"
                 "</distances2></topology>",
         CDP_ERR_INVALID, "NVLinkBandwidth refers to OSDev:99, which is not in the file"},
        {"hwloc negative bandwidth",
         HW_HEAD "<distances2 type=\"OSDev\" nbobjs=\"2\" kind=\"9\" indexing=\"gp\" name=\"NVLinkBandwidth\">"
                 "<indexes length=\"4\">4 6 </indexes><u64values length=\"10\">1 -25000 -25000 1 </u64values>"
                 "</distances2></topology>",
         CDP_ERR_INVALID, "NVLinkBandwidth: negative bandwidth -25000"},
        {"hwloc short matrix",
         HW_HEAD "<distances2 type=\"OSDev\" nbobjs=\"2\" kind=\"9\" indexing=\"gp\" name=\"NVLinkBandwidth\">"
                 "<indexes length=\"4\">4 6 </indexes><u64values length=\"4\">1 0 </u64values>"
                 "</distances2></topology>",
         CDP_ERR_INVALID, "2 objects need 4 values, found 2"},
        {"hwloc asymmetric",
         HW_HEAD "<distances2 type=\"OSDev\" nbobjs=\"2\" kind=\"9\" indexing=\"gp\" name=\"NVLinkBandwidth\">"
                 "<indexes length=\"4\">4 6 </indexes><u64values length=\"10\">1 25000 50000 1 </u64values>"
                 "</distances2></topology>",
         CDP_ERR_INVALID, "GPU 0 -> GPU 1 is 25000 MB/s but GPU 1 -> GPU 0 is 50000 MB/s"},
        {"nccl link to a missing gpu",
         "<system version=\"1\"><cpu numaid=\"0\">" NCCL_GPU("0000:01:00.0", "0", "<nvlink target=\"0000:99:00.0\" count=\"2\" tclass=\"0x030200\"/>")
         "</cpu></system>", CDP_ERR_INVALID, "has an NVLink to 0000:99:00.0, and no GPU in the file has that bus id"},
        {"nccl contradictory counts",
         "<system version=\"1\"><cpu numaid=\"0\">"
         NCCL_GPU("0000:01:00.0", "0", "<nvlink target=\"0000:02:00.0\" count=\"2\" tclass=\"0x030200\"/>")
         NCCL_GPU("0000:02:00.0", "1", "<nvlink target=\"0000:01:00.0\" count=\"1\" tclass=\"0x030200\"/>")
         "</cpu></system>", CDP_ERR_INVALID, "GPU 0 lists 2 NVLinks to GPU 1, which lists 1 back"},
        {"nccl bad count",
         "<system version=\"1\"><cpu numaid=\"0\">" NCCL_GPU("0000:01:00.0", "0", "<nvlink target=\"0000:02:00.0\" count=\"-1\"/>")
         "</cpu></system>", CDP_ERR_INVALID, "expected target=\"BUSID\" and a positive count, got count=\"-1\""},
        {"nccl negative nic speed",
         "<system version=\"1\"><cpu numaid=\"0\"><nic><net name=\"ib0\" speed=\"-100\"/></nic></cpu></system>",
         CDP_ERR_INVALID, "<net name=\"ib0\">: negative speed -100"},
        {"nccl without cpu", "<system version=\"1\"></system>", CDP_ERR_INVALID, "no <cpu> element"},
        {"json syntax", "{\"gpus\": 2,", CDP_ERR_INVALID, "bad.txt: line 1"},
        {"json link to a missing gpu", "{\"gpus\": 2, \"nvlinks\": [[0, 5, 1]]}", CDP_ERR_INVALID,
         "/nvlinks/0/1: GPU 5 does not exist (the file has GPUs 0 to 1)"},
        {"json negative bandwidth", "{\"gpus\": 2, \"nvlink_bandwidth\": -25e9}", CDP_ERR_INVALID,
         "/nvlink_bandwidth: expected a non-negative number, got -2.5e+10"},
        {"json negative rate string", "{\"gpus\": 2, \"nics\": [{\"rate\": \"-5Gb/s\"}]}", CDP_ERR_INVALID,
         "/nics/0/rate: expected a non-negative rate"},
        {"json unknown key", "{\"gpus\": 2, \"nvlink\": []}", CDP_ERR_INVALID,
         "/nvlink: unknown key (did you mean \"nvlinks\"?)"},
        {"json duplicate link", "{\"gpus\": 2, \"nvlinks\": [[0, 1, 1], [1, 0, 2]]}", CDP_ERR_INVALID,
         "/nvlinks/1: GPU 1 - GPU 0 is listed twice"},
        {"json self link", "{\"gpus\": 2, \"nvlinks\": [[1, 1, 1]]}", CDP_ERR_INVALID, "a link from GPU 1 to itself"},
        {"json switch links", "{\"gpus\": 2, \"nvswitches\": [{\"gpu_links\": [1]}]}", CDP_ERR_INVALID,
         "/nvswitches/0/gpu_links: expected an array of 2 link counts"},
        {"json gpu numa", "{\"gpus\": [{\"numa\": \"zero\"}]}", CDP_ERR_INVALID,
         "/gpus/0/numa: expected an integer from -1 to 4095, got \"zero\""},
        {"json bad cpus", "{\"numa\": [{\"cpus\": \"0-x\"}], \"gpus\": 1}", CDP_ERR_INVALID,
         "/numa/0/cpus: CPU list \"0-x\""},
        {"json wrong format", "{\"format\": \"other\", \"gpus\": 1}", CDP_ERR_INVALID,
         "/format: expected \"cdphybrid-topology\""},
        {"json no gpus", "{\"name\": \"x\"}", CDP_ERR_INVALID, "/gpus: missing"},
        {"json duplicate numa", "{\"numa\": [{\"os_index\": 0}, {\"os_index\": 0}], \"gpus\": 1}", CDP_ERR_INVALID,
         "NUMA node 0 is described twice"},
    };
    return cr_make_param_array(struct bad_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct bad_case *c, topology, bad_files_give_clear_errors)
{
    struct cdp_topology *t = NULL;
    cdp_status st = cdp_topology_load_text(c->text, strlen(c->text), "bad.txt", &t);
    cr_assert_eq((int)st, c->status, "%s: status %d (%s), want %d", c->name, st, cdp_last_error(), c->status);
    cr_assert_null(t);
    cr_assert(strncmp(cdp_last_error(), "bad.txt", 7) == 0, "%s: message does not name the file: %s", c->name,
              cdp_last_error());
    cr_assert(strstr(cdp_last_error(), c->expect), "%s: expected \"%s\" in: %s", c->name, c->expect, cdp_last_error());
}

Test(topology, missing_file_and_folder_are_refused)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("/no/such/file.xml", NULL, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "cannot open \"/no/such/file.xml\""), "%s", cdp_last_error());
    cr_assert_eq(cdp_topology_load(cdp_test_tmpdir(), NULL, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "not a regular file"), "%s", cdp_last_error());
    const char *dir = cdp_test_tmpdir();
    cdp_test_write_file(dir, "rel.json", "{\"gpus\": 3}");
    cr_assert_eq(cdp_topology_load("rel.json", dir, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(t->n_gpus, 3);
    cdp_topology_free(t);
}

/* ---- helpers ---------------------------------------------------------------------------- */

Test(topology, cpu_masks_and_rates)
{
    char out[128];
    cr_assert_eq(cdp_cpuset_from_mask("0x00000303,0x03030000,,0x03030303", out, sizeof out), CDP_OK);
    cr_assert_str_eq(out, "0-1,8-9,16-17,24-25,80-81,88-89,96-97,104-105");
    cr_assert_eq(cdp_cpuset_from_mask("000000ff,ffff0000,00ffffff", out, sizeof out), CDP_OK);
    cr_assert_str_eq(out, "0-23,48-71");
    char *mask = NULL;
    cr_assert_eq(cdp_cpuset_to_mask("0-23,48-71", &mask), CDP_OK);
    cr_assert_str_eq(mask, "0x000000ff,0xffff0000,0x00ffffff");
    free(mask);
    double r;
    cr_assert_eq(cdp_parse_rate("200Gb/s", &r), CDP_OK);
    cr_assert_float_eq(r, 25e9, 1);
    cr_assert_eq(cdp_parse_rate("25 GB/s", &r), CDP_OK);
    cr_assert_float_eq(r, 25e9, 1);
    cr_assert_eq(cdp_parse_rate("fast", &r), CDP_ERR_INVALID);
}

/* ---- plans name topologies -------------------------------------------------------------- */

#define PLAN(topo) "{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"topology\": " topo "}}"

Test(topology, plan_accepts_presets_clusters_and_files)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(PLAN("\"dgx-a100\""), "p.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(p->cluster.topology, "dgx-a100");
    cdp_plan_free(p);
    cr_assert_eq(cdp_plan_load_string(PLAN("\"4 x hgx-h100\""), "p.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(p->cluster.topology, "4 x hgx-h100");
    struct cdp_topology *t = load(p->cluster.topology);
    cr_assert_eq(t->n_gpus, 32);
    cdp_topology_free(t);
    cdp_plan_free(p);
    const char *dir = cdp_test_tmpdir();
    cdp_test_write_file(dir, "box.json", "{\"gpus\": 2}");
    const char *plan = cdp_test_write_file(dir, "plan.json", PLAN("\"box.json\""));
    cr_assert_eq(cdp_plan_load(plan, &p), CDP_OK, "%s", cdp_last_error());
    cr_assert(p->cluster.topology[0] == '/' && strstr(p->cluster.topology, "box.json"), "%s", p->cluster.topology);
    cdp_plan_free(p);
}

Test(topology, plan_with_a_misspelt_preset_suggests_one)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(PLAN("\"dgx-a10\""), "p.json", NULL, &p), CDP_ERR_INVALID);
    const char *e = cdp_last_error();
    cr_assert(strstr(e, "p.json: /cluster/topology: cannot open"), "%s", e);
    cr_assert(strstr(e, "not a preset either (did you mean \"dgx-a100\"?)"), "%s", e);
    cr_assert_eq(cdp_plan_load_string(PLAN("\"0 x dgx-a100\""), "p.json", NULL, &p), CDP_ERR_INVALID);
    cr_assert_eq(cdp_plan_load_string(PLAN("7"), "p.json", NULL, &p), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "a preset name"), "%s", cdp_last_error());
}

Test(topology, plan_accepts_a_mixed_cluster)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(PLAN("\"1 x dgx-a100 + 1 x dgx1-v100\""), "p.json", NULL, &p), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_str_eq(p->cluster.topology, "1 x dgx-a100 + 1 x dgx1-v100");
    cdp_plan_free(p);
    cr_assert_eq(cdp_plan_load_string(PLAN("\"dgx-a100 + dgx-v100\""), "p.json", NULL, &p), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "p.json: /cluster/topology: ") &&
              strstr(cdp_last_error(), "term 2 \"dgx-v100\""), "%s", cdp_last_error());
}

/* ---- the command ------------------------------------------------------------------------ */

static struct cdp_run run(const char *const *argv)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, argv), 0, "could not start the binary");
    return r;
}

Test(topology, cli_prints_a_preset_matrix)
{
    struct cdp_run r = run((const char *[]){"topo", "--topology", "dgx1-v100", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "GPU0   X      NV1    NV1    NV2    NV2    SYS"), "%s", r.out);
    cr_assert(strstr(r.out, "CPU Affinity"), "%s", r.out);
    cr_assert(strstr(r.out, "GB/s one direction"), "%s", r.out);
    cr_assert(strstr(r.out, "mlx5_0"), "%s", r.out);
    cr_assert(strstr(r.out, "Legend"), "%s", r.out);
    cdp_test_run_free(&r);
}

Test(topology, cli_json_parses_with_the_documented_keys)
{
    struct cdp_run r = run((const char *[]){"topo", "--topology", "2 x dgx-a100", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_error_t err;
    json_t *j = json_loads(r.out, 0, &err);
    cr_assert_not_null(j, "not JSON: %s\n%s", err.text, r.out);
    json_t *gpus = json_object_get(j, "gpus"), *links = json_object_get(j, "links"),
           *bw = json_object_get(j, "bandwidth_gbps");
    cr_assert_eq(json_array_size(gpus), 16);
    cr_assert_eq(json_array_size(json_object_get(j, "nodes")), 2);
    json_t *g9 = json_array_get(gpus, 9);
    cr_assert_eq(json_integer_value(json_object_get(g9, "index")), 9);
    cr_assert_eq(json_integer_value(json_object_get(g9, "node")), 1);
    cr_assert(json_is_string(json_object_get(g9, "name")));
    cr_assert_gt(json_integer_value(json_object_get(g9, "memory_bytes")), 0);
    cr_assert(json_is_integer(json_object_get(g9, "numa")));
    cr_assert_str_eq(json_string_value(json_array_get(json_array_get(links, 0), 1)), "NV12");
    cr_assert_str_eq(json_string_value(json_array_get(json_array_get(links, 0), 8)), "NET");
    cr_assert_float_eq(json_number_value(json_array_get(json_array_get(bw, 0), 1)), 300.0, 1e-9);
    cr_assert_float_eq(json_number_value(json_array_get(json_array_get(bw, 0), 8)), 25.0, 1e-9);
    json_decref(j);
    cdp_test_run_free(&r);
}

Test(topology, cli_live_discovery_here_is_cpu_only)
{
    struct cdp_run r = run((const char *[]){"topo", "-v", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "CPU0   X"), "%s", r.out);
    cr_assert(strstr(r.err, "INFO TOPO: live discovery"), "-v says what was used: %s", r.err);
    cr_assert(strstr(r.err, "NVML"), "%s", r.err);
    cr_assert(strstr(r.err, "no GPU found"), "%s", r.err);
    cdp_test_run_free(&r);
    r = run((const char *[]){"topo", "--cpu-devices", "4", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j);
    cr_assert_str_eq(json_string_value(json_object_get(j, "kind")), "cpu");
    cr_assert_eq(json_array_size(json_object_get(j, "gpus")), 4);
    cr_assert_str_eq(json_string_value(json_array_get(json_array_get(json_object_get(j, "links"), 0), 1)), "MEM");
    json_decref(j);
    cdp_test_run_free(&r);
}

Test(topology, cli_export_reads_back_identically)
{
    const char *dir = cdp_test_tmpdir();
    char xml[512], json[512];
    snprintf(xml, sizeof xml, "%s/h100.xml", dir);
    snprintf(json, sizeof json, "%s/h100.json", dir);
    struct cdp_run a = run((const char *[]){"topo", "--topology", "hgx-h100", "--json", "--export", xml, NULL});
    cr_assert_eq(a.exit_code, 0, "%s", a.err);
    struct cdp_run e = run((const char *[]){"topo", "--topology", xml, "--export", json, "-q", NULL});
    cr_assert_eq(e.exit_code, 0, "%s", e.err);
    cr_assert(strstr(e.out, "wrote "), "%s", e.out);
    struct cdp_run b = run((const char *[]){"topo", "--topology", json, "--json", NULL});
    cr_assert_eq(b.exit_code, 0, "%s", b.err);
    json_t *ja = json_loads(a.out, 0, NULL), *jb = json_loads(b.out, 0, NULL);
    cr_assert(ja && jb);
    json_object_del(ja, "source");
    json_object_del(jb, "source");
    cr_assert(json_equal(ja, jb), "preset -> XML -> JSON file -> JSON output changed the topology");
    json_decref(ja);
    json_decref(jb);
    cdp_test_run_free(&a);
    cdp_test_run_free(&e);
    cdp_test_run_free(&b);
}

Test(topology, cli_prints_each_kind_of_node_of_a_mixed_cluster)
{
    struct cdp_run r = run((const char *[]){"topo", "--topology", "1 x dgx-a100 + 2 x dgx1-v100", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "topology 1 x dgx-a100 + 2 x dgx1-v100: 3 nodes, 24 GPUs"), "%s", r.out);
    const char *a = strstr(r.out, "== node 0 (dgx-a100): GPU0 to 7 ==");
    const char *v = strstr(r.out, "== node 1 (dgx1-v100): GPU8 to 15; 2 nodes like it ==");
    cr_assert(a && v && a < v, "%s", r.out);
    cr_assert(strstr(a, "GPU0   NVIDIA A100-SXM4-80GB") && strstr(a, "GPU1   NV12"), "%s", r.out);
    cr_assert(strstr(v, "GPU8   X      NV1    NV1    NV2    NV2    SYS"), "%s", r.out);
    cr_assert(strstr(v, "GPU8   Tesla V100-SXM2-16GB") && strstr(v, "(x 2 nodes)"), "%s", r.out);
    cr_assert(!strstr(r.out, "== node 2"), "node 2 is like node 1: %s", r.out);
    cr_assert(strstr(r.out, "network: InfiniBand EDR, 4 NICs per node at 100 Gb/s"), "%s", r.out);
    cr_assert(strstr(r.out, "the least NIC rate and count and the largest latency"), "%s", r.out);
    cdp_test_run_free(&r);
    r = run((const char *[]){"topo", "--topology", "dgx-a100 + dgx1-v100", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "%s", r.out);
    json_t *gpus = json_object_get(j, "gpus");
    cr_assert_eq(json_array_size(gpus), 16);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(gpus, 8), "name")), "Tesla V100-SXM2-16GB");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(gpus, 7), "name")), "NVIDIA A100-SXM4-80GB");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "nodes"), 1), "name")),
                     "dgx1-v100");
    cr_assert_float_eq(json_number_value(json_array_get(json_array_get(json_object_get(j, "bandwidth_gbps"), 0), 8)),
                       12.5, 1e-9);
    json_decref(j);
    cdp_test_run_free(&r);
    /* our JSON describes one kind of node: a mixed cluster is not written as a wrong one */
    char out[512];
    snprintf(out, sizeof out, "%s/mixed.json", cdp_test_tmpdir());
    r = run((const char *[]){"topo", "--topology", "dgx-a100 + dgx1-v100", "--export", out, NULL});
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_assert(strstr(r.err, "node 1 (dgx1-v100) differs from node 0 (dgx-a100)"), "%s", r.err);
    cdp_test_run_free(&r);
    r = run((const char *[]){"topo", "--topology", "dgx-a100 + dgx-v100", NULL});
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_assert(strstr(r.err, "term 2 \"dgx-v100\"") && strstr(r.err, "did you mean \""), "%s", r.err);
    cdp_test_run_free(&r);
}

struct cli_bad {
    char args[4][48];
    int code;
    char expect[96];
};

ParameterizedTestParameters(topology, cli_bad_input_exits_2)
{
    static struct cli_bad cases[] = {
        {{"topo", "--topology", "dgx-a10"}, 2, "did you mean \"dgx-a100\"?"},
        {{"topo", "--topology", "/no/such.xml"}, 2, "cannot open \"/no/such.xml\""},
        {{"topo", "--topolgy", "dgx2"}, 2, "unknown option --topolgy (did you mean --topology?)"},
        {{"topo", "--topology"}, 2, "--topology needs a value"},
        {{"topo", "stray"}, 2, "unexpected argument \"stray\""},
        {{"topo", "--cpu-devices", "0"}, 2, "--cpu-devices needs a number"},
        {{"topo", "--topology", "dgx2", "--cpu-devices"}, 2, "--cpu-devices needs a number"},
        {{"topo", "--topology", "3 x dgx2", "--export"}, 2, "--export needs a value"},
    };
    return cr_make_param_array(struct cli_bad, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct cli_bad *c, topology, cli_bad_input_exits_2)
{
    const char *argv[5] = {NULL};
    int n = 0;
    for (int i = 0; i < 4 && c->args[i][0]; i++) argv[n++] = c->args[i];
    struct cdp_run r = run(argv);
    cr_assert_eq(r.exit_code, c->code, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, c->expect), "expected \"%s\" in: %s", c->expect, r.err);
    cr_assert(strncmp(r.err, "cdphybrid topo: ", 16) == 0, "%s", r.err);
    cr_assert_str_empty(r.out);
    cdp_test_run_free(&r);
}

Test(topology, cli_bad_files_and_multi_node_export)
{
    const char *dir = cdp_test_tmpdir();
    const char *bad = cdp_test_write_file(dir, "cut.xml", "<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=");
    struct cdp_run r = run((const char *[]){"topo", "--topology", bad, NULL});
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_assert(strstr(r.err, "cut.xml: line 3"), "%s", r.err);
    cdp_test_run_free(&r);
    char out[512];
    snprintf(out, sizeof out, "%s/cluster.xml", dir);
    r = run((const char *[]){"topo", "--topology", "2 x dgx2", "--export", out, NULL});
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_assert(strstr(r.err, "hwloc XML describes one machine"), "%s", r.err);
    cdp_test_run_free(&r);
    r = run((const char *[]){"topo", "--help", NULL});
    cr_assert_eq(r.exit_code, 0);
    cr_assert(strstr(r.out, "presets: dgx-a100 dgx1-p100 dgx1-v100 dgx2 hgx-h100 hgx-h200 pcie-8gpu-2socket"), "%s",
              r.out);
    cdp_test_run_free(&r);
}

/* ---- rates out of range ------------------------------------------------------------------ */

/* text with the first occurrence of `from` replaced by `to` (owned). */
static char *replaced(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    cr_assert_not_null(at, "no %s in the text", from);
    char *out = malloc(strlen(text) + strlen(to) + 1);
    cr_assert_not_null(out);
    memcpy(out, text, (size_t)(at - text));
    strcpy(out + (at - text), to);
    strcat(out, at + strlen(from));
    return out;
}

static void refused(const char *text, const char *file, const char *want)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load_text(text, strlen(text), file, &t), CDP_ERR_INVALID, "%s: accepted (%s)", file,
                 want);
    cr_assert(strstr(cdp_last_error(), file) && strstr(cdp_last_error(), want), "%s: %s", want, cdp_last_error());
    cr_assert(strstr(cdp_last_error(), "expected 0 (not given) or from") || strstr(cdp_last_error(), "expected a"),
              "what is expected is named: %s", cdp_last_error());
}

/* inf, 1e308, 2^64 and 5e-324 bytes/s are refused from each reader, naming
 * the file and the attribute (docs/topology.md, "Ranges"). */
Test(topology, absurd_rates_are_refused_naming_file_and_attribute)
{
    static const char *const bad[] = {"inf", "1e308", "18446744073709551616", "5e-324", "nan"};
    struct cdp_topology *t = load("dgx1-v100");
    char *json = NULL, *xml = NULL;
    cr_assert_eq(cdp_topology_to_native_json(t, &json), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_topology_to_hwloc_xml(t, &xml), CDP_OK, "%s", cdp_last_error());
    char *nccl = cdp_test_read_file(cdp_test_source_path("tests/fixtures/topology/nccl-4gpu.xml"));
    cr_assert_not_null(nccl);
    char from[128], to[128];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        /* JSON has no inf or nan numbers: as strings they are not rates */
        const int number = strcmp(bad[i], "inf") && strcmp(bad[i], "nan");
        /* (2^64 as an integer is beyond jansson's: "too big integer" at its line; as a real it reaches the check) */
        const char *v = strcmp(bad[i], "18446744073709551616") ? bad[i] : "1.8446744073709552e19";
        snprintf(to, sizeof to, number ? "\"nvlink_bandwidth\": %s," : "\"nvlink_bandwidth\": \"%sGB/s\",", v);
        char *a = strstr(json, "\"nvlink_bandwidth\": ");
        cr_assert_not_null(a);
        const char *comma = strchr(a, ',');
        snprintf(from, sizeof from, "%.*s", (int)(comma - a + 1), a);
        char *x = replaced(json, from, to);
        refused(x, "bad.json", number ? "nvlink_bandwidth" : "/nvlink_bandwidth");
        free(x);
        /* hwloc XML: the machine's SYS rate */
        const char *s = strstr(xml, "name=\"CDPSysBandwidth\" value=\"");
        cr_assert_not_null(s);
        s += strlen("name=\"CDPSysBandwidth\" value=\"");
        snprintf(from, sizeof from, "name=\"CDPSysBandwidth\" value=\"%.*s\"", (int)(strchr(s, '"') - s), s);
        snprintf(to, sizeof to, "name=\"CDPSysBandwidth\" value=\"%s\"", bad[i]);
        x = replaced(xml, from, to);
        refused(x, "bad-hwloc.xml", "CDPSysBandwidth");
        free(x);
        /* NCCL XML: a NIC's speed in Mb/s (x 1e6 / 8 bytes/s: 5e-324 becomes 6e-319) */
        snprintf(to, sizeof to, "speed=\"%s\"", bad[i]);
        x = replaced(nccl, "speed=\"200000\"", to);
        refused(x, "bad-nccl.xml", "<net speed>");
        free(x);
    }
    free(json);
    free(xml);
    free(nccl);
    cdp_topology_free(t);
}

/* A cluster file whose node is itself (or two that name each other) is an
 * error naming the chain, not a stack overflow. */
Test(topology, a_file_that_names_itself_is_refused)
{
    const char *dir = cdp_test_tmpdir();
    char self[4200];
    snprintf(self, sizeof self, "%s", cdp_test_write_file(dir, "self.json", "{\"nodes\": 2, \"node\": \"self.json\"}"));
    cdp_test_write_file(dir, "a.json", "{\"nodes\": 2, \"node\": \"b.json\"}");
    cdp_test_write_file(dir, "b.json", "{\"nodes\": 2, \"node\": \"a.json\"}");
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load(self, NULL, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "self.json: /node: ") &&
                  strstr(cdp_last_error(), "topology files name each other more than 8 deep"),
              "%s", cdp_last_error());
    char a[4200];
    snprintf(a, sizeof a, "%s/a.json", dir);
    cr_assert_eq(cdp_topology_load(a, NULL, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "b.json: /node: ") && strstr(cdp_last_error(), "name each other"), "%s",
              cdp_last_error());
    cr_assert_null(t);
}

/* The documented maximum: 10,240 devices; beyond it an error, not minutes. */
Test(topology, clusters_beyond_the_device_limit_are_refused)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("65536 x dgx-a100", NULL, &t), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "65536 nodes with 524288 devices: at most 10240"), "%s", cdp_last_error());
    cr_assert_eq(cdp_topology_load("1280 x dgx-a100", NULL, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(t->n_gpus, 10240);
    cdp_topology_free(t);
}
