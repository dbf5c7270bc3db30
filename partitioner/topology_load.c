/* Loading by spec (the grammar: src/plan/topology_spec.h): presets, "N x
 * preset" clusters, "N x a + M x b" clusters of different nodes, and files
 * recognised by content (hwloc XML, NCCL XML, our JSON). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "partitioner/topology_internal.h"
#include "plan/topology_spec.h"

/* ---- files ---------------------------------------------------------------------- */

cdp_status cdp_topology_load_text(const char *text, size_t len, const char *name, struct cdp_topology **out)
{
    size_t i = 0;
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) i = 3;
    while (i < len && isspace((unsigned char)text[i])) i++;
    if (i == len) return cdp_fail(CDP_ERR_INVALID, "%s: the file is empty", name);
    if (text[i] == '{') return cdp_topology_load_native_json(text, len, name, out);
    if (text[i] != '<')
        return cdp_fail(CDP_ERR_INVALID, "%s: not a topology file: expected hwloc XML, NCCL topology XML or "
                        "cdphybrid JSON (docs/topology.md)", name);
    struct cdp_xml *root = NULL;
    cdp_status st = cdp_xml_parse(text, len, name, &root);
    if (st) return st;
    if (!strcmp(root->name, "topology")) st = cdp_topology_load_hwloc_xml(root, name, out);
    else if (!strcmp(root->name, "system")) st = cdp_topology_load_nccl_xml(root, name, out);
    else
        st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: root element <%s>: expected <topology> (hwloc XML) or "
                      "<system> (NCCL topology XML)", name, root->line, root->name);
    cdp_xml_free(root);
    return st;
}

cdp_status cdp_topology_load_file(const char *path, struct cdp_topology **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return cdp_fail(CDP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return cdp_fail(CDP_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size > (64 << 20)) {
        fclose(f);
        return cdp_fail(CDP_ERR_INVALID, "%s: %lld bytes is too large for a topology file (64 MiB at most)", path,
                        (long long)sb.st_size);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != n) {
        free(buf);
        return cdp_fail(CDP_ERR_IO, "cannot read %s", path);
    }
    buf[n] = '\0';
    cdp_status st = cdp_topology_load_text(buf, n, path, out);
    free(buf);
    return st;
}

/* Loads each term's node and joins them. */
static cdp_status load_join(const char *spec, const char *base_dir, struct cdp_topology **out)
{
    struct cdp_topology_term *v = NULL;
    int n = 0;
    cdp_status st = cdp_topology_spec_terms(spec, base_dir, &v, &n);
    if (st) return st;
    struct cdp_topology **nodes = calloc((size_t)n, sizeof *nodes);
    int *counts = calloc((size_t)n, sizeof *counts);
    if (!nodes || !counts) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        CDP_INFO(TOPO, "topology \"%s\": term %d: %d node%s of %s", spec, i + 1, v[i].count,
                 v[i].count == 1 ? "" : "s", v[i].path);
        counts[i] = v[i].count;
        if ((st = cdp_topology_load_file(v[i].path, &nodes[i]))) {
            st = cdp_error_context(st, "topology \"%s\": term %d \"%s\"", spec, i + 1, v[i].text);
            goto done;
        }
        if (nodes[i]->n_nodes != 1) {
            st = cdp_fail(CDP_ERR_INVALID, "topology \"%s\": term %d \"%s\": %s already has %d nodes (a term "
                          "is N x one node)", spec, i + 1, v[i].text, v[i].path, nodes[i]->n_nodes);
            goto done;
        }
    }
    st = cdp_topology_join((const struct cdp_topology *const *)nodes, counts, n, NULL, out);
done:
    for (int i = 0; nodes && i < n; i++) cdp_topology_free(nodes[i]);
    free(nodes);
    free(counts);
    cdp_topology_spec_terms_free(v, n);
    return st;
}

/* Files that name other files (a cluster's "node", a join's terms): how deep
 * the loads are now, so that a file that names itself, or two that name each
 * other, is an error instead of a stack overflow. */
#define MAX_FILE_DEPTH 8
static _Thread_local int load_depth;

static cdp_status load_spec(const char *spec, const char *base_dir, struct cdp_topology **out);

cdp_status cdp_topology_load(const char *spec, const char *base_dir, struct cdp_topology **out)
{
    if (load_depth >= MAX_FILE_DEPTH)
        return cdp_fail(CDP_ERR_INVALID, "topology \"%s\": topology files name each other more than %d deep (does "
                        "one name itself?)", spec, MAX_FILE_DEPTH);
    load_depth++;
    cdp_status st = load_spec(spec, base_dir, out);
    load_depth--;
    return st;
}

static cdp_status load_spec(const char *spec, const char *base_dir, struct cdp_topology **out)
{
    enum cdp_topology_spec_kind kind;
    char *path = NULL;
    long nodes = 0;
    const char *node_spec = NULL;
    cdp_status st = cdp_topology_spec_classify(spec, base_dir, &kind, &path, &nodes, &node_spec);
    if (st) return st;
    struct cdp_topology *t = NULL;
    switch (kind) {
    case CDP_TOPOLOGY_SPEC_AUTO:
        st = cdp_topology_discover(NULL, &t);
        break;
    case CDP_TOPOLOGY_SPEC_PRESET:
    case CDP_TOPOLOGY_SPEC_FILE:
        CDP_INFO(TOPO, "topology \"%s\": %s %s", spec, kind == CDP_TOPOLOGY_SPEC_PRESET ? "preset" : "file", path);
        st = cdp_topology_load_file(path, &t);
        if (st && kind == CDP_TOPOLOGY_SPEC_PRESET) st = cdp_error_context(st, "preset \"%s\"", spec);
        break;
    case CDP_TOPOLOGY_SPEC_JOIN:
        st = load_join(spec, base_dir, &t);
        break;
    case CDP_TOPOLOGY_SPEC_CLUSTER: {
        struct cdp_topology *node = NULL;
        CDP_INFO(TOPO, "topology \"%s\": %ld nodes of %s", spec, nodes, path);
        if (!(st = cdp_topology_load_file(path, &node))) {
            if (node->n_nodes != 1)
                st = cdp_fail(CDP_ERR_INVALID, "topology \"%s\": %s already has %d nodes", spec, path, node->n_nodes);
            else
                st = cdp_topology_cluster(node, (int)nodes, NULL, &t);
        }
        cdp_topology_free(node);
        break;
    }
    }
    free(path);
    if (st) return st;
    *out = t;
    return CDP_OK;
}
