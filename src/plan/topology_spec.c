/* The topology spec of a plan's /cluster/topology (and of --topology):
 * "auto", a preset and where presets are looked for, "N x preset", "N x a +
 * M x b" joins, and files (relative to a base folder). A grammar over names
 * and paths that reads no topology: the plan loader checks a spec with it,
 * and the partitioner's loader (partitioner/topology_load.c) loads what it
 * classifies. */
#include "plan/topology_spec.h"

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
#include "core/path.h"
#include "plan/topology_paths.h"

/* ---- presets ------------------------------------------------------------------ */

/* The folders, in order; *n set. Strings are static or from the environment. */
static int preset_dirs(const char *dirs[3])
{
    int n = 0;
    const char *env = getenv("CDP_TOPOLOGY_DIR");
    if (env && *env) dirs[n++] = env;
    dirs[n++] = CDP_TOPOLOGY_SOURCE_DIR;
    dirs[n++] = CDP_TOPOLOGY_INSTALL_DIR;
    return n;
}

static int valid_preset_name(const char *name)
{
    if (!*name || strlen(name) > 64) return 0;
    for (const char *p = name; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '_' || *p == '.')) return 0;
    return name[0] != '.';
}

static int is_regular(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static char *preset_find(const char *name)
{
    const char *dirs[3];
    int n = preset_dirs(dirs);
    if (!valid_preset_name(name)) return NULL;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(dirs[i]) + strlen(name) + 8;
        char *p = malloc(len);
        if (!p) return NULL;
        snprintf(p, len, "%s/%s.json", dirs[i], name);
        if (is_regular(p)) return p;
        free(p);
    }
    return NULL;
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

cdp_status cdp_topology_preset_names(char ***names)
{
    const char *dirs[3];
    int nd = preset_dirs(dirs), n = 0, cap = 16;
    char **v = calloc((size_t)cap + 1, sizeof *v);
    if (!v) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nd; i++) {
        DIR *d = opendir(dirs[i]);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t len = strlen(e->d_name);
            if (len < 6 || strcmp(e->d_name + len - 5, ".json") || e->d_name[0] == '.') continue;
            char *nm = strndup(e->d_name, len - 5);
            int dup = 0;
            for (int k = 0; nm && k < n; k++) dup |= !strcmp(v[k], nm);
            if (!nm || dup) {
                free(nm);
                continue;
            }
            if (n == cap) {
                char **q = realloc(v, (size_t)(cap * 2 + 1) * sizeof *q);
                if (!q) {
                    free(nm);
                    break;
                }
                v = q;
                cap *= 2;
            }
            v[n++] = nm;
            v[n] = NULL;
        }
        closedir(d);
    }
    qsort(v, (size_t)n, sizeof *v, str_cmp);
    v[n] = NULL;
    *names = v;
    return CDP_OK;
}

void cdp_topology_preset_names_free(char **names)
{
    if (!names) return;
    for (char **p = names; *p; p++) free(*p);
    free(names);
}

/* " (did you mean "x"?)" or " (presets: a, b, c)" into buf. */
static void suggest(const char *name, char *buf, size_t cap)
{
    char **names = NULL;
    buf[0] = '\0';
    if (cdp_topology_preset_names(&names)) return;
    const char *near = cdp_closest_word(name, (const char *const *)names);
    if (near) {
        snprintf(buf, cap, " (did you mean \"%s\"?)", near);
    } else if (names[0]) {
        size_t len = (size_t)snprintf(buf, cap, " (presets:");
        for (char **p = names; *p && len < cap; p++)
            len += (size_t)snprintf(buf + len, cap - len, " %s", *p);
        if (len < cap) snprintf(buf + len, cap - len, ")");
    } else {
        snprintf(buf, cap, " (no presets found: set CDP_TOPOLOGY_DIR to the topologies/ folder)");
    }
    cdp_topology_preset_names_free(names);
}

cdp_status cdp_topology_preset_path(const char *name, char **path)
{
    char *p = preset_find(name);
    if (!p) {
        char hint[1024];
        suggest(name, hint, sizeof hint);
        return cdp_fail(CDP_ERR_INVALID, "unknown topology preset \"%s\"%s", name, hint);
    }
    *path = p;
    return CDP_OK;
}

/* ---- specs ------------------------------------------------------------------------- */


int cdp_topology_spec_is_path(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 4 && (!strcmp(s + n - 4, ".xml") || !strcmp(s + n - 5, ".json")));
}

/* "4 x dgx-a100", "4x dgx-a100", "4xdgx-a100": nodes and the node spec. */
static int parse_cluster(const char *spec, long *nodes, const char **rest)
{
    const char *p = spec;
    while (isspace((unsigned char)*p)) p++;
    if (!isdigit((unsigned char)*p)) return 0;
    char *end;
    long n = strtol(p, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (*end != 'x' && *end != 'X') return 0;
    end++;
    while (isspace((unsigned char)*end)) end++;
    if (!*end) return 0;
    *nodes = n;
    *rest = end;
    return 1;
}

/* Whether spec names an existing regular file (relative to base_dir). */
static int existing_file(const char *spec, const char *base_dir)
{
    char *joined = cdp_path_join(base_dir, spec);
    char *abs = joined ? realpath(joined, NULL) : NULL;
    int yes = abs && is_regular(abs);
    free(joined);
    free(abs);
    return yes;
}

/* A '+' makes a join, unless the spec (or the node of "N x node") is a file
 * whose name has the '+'. */
static int is_join(const char *spec, const char *base_dir)
{
    long n;
    const char *rest;
    if (!strchr(spec, '+') || existing_file(spec, base_dir)) return 0;
    return !(parse_cluster(spec, &n, &rest) && existing_file(rest, base_dir));
}

/* Classifies spec; *path (owned) is the preset or file path when there is one. */
cdp_status cdp_topology_spec_classify(const char *spec, const char *base_dir, enum cdp_topology_spec_kind *kind,
                                  char **path, long *nodes, const char **node_spec)
{
    *path = NULL;
    if (!spec || !*spec) return cdp_fail(CDP_ERR_INVALID, "empty topology spec");
    if (!strcmp(spec, "auto")) {
        *kind = CDP_TOPOLOGY_SPEC_AUTO;
        return CDP_OK;
    }
    if (is_join(spec, base_dir)) {
        *kind = CDP_TOPOLOGY_SPEC_JOIN;
        return CDP_OK;
    }
    if (parse_cluster(spec, nodes, node_spec)) {
        if (*nodes < 1 || *nodes > 65536)
            return cdp_fail(CDP_ERR_INVALID, "topology \"%s\": a cluster has 1 to 65536 nodes", spec);
        enum cdp_topology_spec_kind k;
        long inner_nodes;
        const char *inner;
        cdp_status st = cdp_topology_spec_classify(*node_spec, base_dir, &k, path, &inner_nodes, &inner);
        if (st) return cdp_error_context(st, "topology \"%s\"", spec);
        if (k == CDP_TOPOLOGY_SPEC_AUTO || k == CDP_TOPOLOGY_SPEC_CLUSTER || k == CDP_TOPOLOGY_SPEC_JOIN) {
            free(*path);
            *path = NULL;
            return cdp_fail(CDP_ERR_INVALID, "topology \"%s\": a cluster is N x a preset or a one-node file", spec);
        }
        *kind = CDP_TOPOLOGY_SPEC_CLUSTER;
        return CDP_OK;
    }
    if (!cdp_topology_spec_is_path(spec) && (*path = preset_find(spec))) {
        *kind = CDP_TOPOLOGY_SPEC_PRESET;
        return CDP_OK;
    }
    char *joined = cdp_path_join(base_dir, spec);
    if (!joined) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    char *abs = realpath(joined, NULL);
    if (!abs) {
        int e = errno;
        char hint[1024] = "";
        if (!cdp_topology_spec_is_path(spec)) {
            char sub[900];
            suggest(spec, sub, sizeof sub);
            snprintf(hint, sizeof hint, ", and \"%s\" is not a preset either%s", spec, sub);
        }
        cdp_status st = cdp_fail(CDP_ERR_INVALID, "cannot open \"%s\": %s%s", joined, strerror(e), hint);
        free(joined);
        return st;
    }
    free(joined);
    if (!is_regular(abs)) {
        cdp_status st = cdp_fail(CDP_ERR_INVALID, "\"%s\" is not a regular file", abs);
        free(abs);
        return st;
    }
    *path = abs;
    *kind = CDP_TOPOLOGY_SPEC_FILE;
    return CDP_OK;
}

void cdp_topology_spec_terms_free(struct cdp_topology_term *v, int n)
{
    for (int i = 0; v && i < n; i++) {
        free(v[i].text);
        free(v[i].node);
        free(v[i].path);
    }
    free(v);
}

static char *trimmed(const char *s, size_t n)
{
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    return strndup(s, n);
}

/* Splits a join at '+' and classifies each term; messages name the term. */
cdp_status cdp_topology_spec_terms(const char *spec, const char *base_dir, struct cdp_topology_term **out, int *n_out)
{
    int n = 1;
    for (const char *c = spec; *c; c++) n += *c == '+';
    if (n > CDP_TOPOLOGY_JOIN_MAX_TERMS)
        return cdp_fail(CDP_ERR_INVALID, "topology \"%s\": %d terms; a cluster joins at most %d", spec, n,
                        CDP_TOPOLOGY_JOIN_MAX_TERMS);
    struct cdp_topology_term *v = calloc((size_t)n, sizeof *v);
    if (!v) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = CDP_OK;
    long total = 0;
    const char *start = spec;
    for (int i = 0; i < n; i++) {
        const char *end = strchr(start, '+');
        if (!end) end = start + strlen(start);
        struct cdp_topology_term *tm = &v[i];
        if (!(tm->text = trimmed(start, (size_t)(end - start)))) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            goto fail;
        }
        start = *end ? end + 1 : end;
        if (!tm->text[0]) {
            st = cdp_fail(CDP_ERR_INVALID, "topology \"%s\": term %d is empty (terms are \"N x preset\", "
                          "\"N x ./node.json\" or a preset, joined by '+')", spec, i + 1);
            goto fail;
        }
        long count = 1;
        const char *rest = tm->text;
        if (parse_cluster(tm->text, &count, &rest) && (count < 1 || count > 65536)) {
            st = cdp_fail(CDP_ERR_INVALID, "topology \"%s\": term %d \"%s\": %ld nodes; a term has 1 to 65536",
                          spec, i + 1, tm->text, count);
            goto fail;
        }
        tm->count = (int)count;
        total += count;
        if (!(tm->node = trimmed(rest, strlen(rest)))) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            goto fail;
        }
        enum cdp_topology_spec_kind k;
        long inner_nodes;
        const char *inner;
        if ((st = cdp_topology_spec_classify(tm->node, base_dir, &k, &tm->path, &inner_nodes, &inner))) {
            st = cdp_error_context(st, "topology \"%s\": term %d \"%s\"", spec, i + 1, tm->text);
            goto fail;
        }
        if (k != CDP_TOPOLOGY_SPEC_PRESET && k != CDP_TOPOLOGY_SPEC_FILE) {
            st = cdp_fail(CDP_ERR_INVALID, "topology \"%s\": term %d \"%s\": a term is N x a preset or a "
                          "one-node file", spec, i + 1, tm->text);
            goto fail;
        }
        tm->is_file = k == CDP_TOPOLOGY_SPEC_FILE;
    }
    if (total > 65536) {
        st = cdp_fail(CDP_ERR_INVALID, "topology \"%s\": %ld nodes; a cluster has 1 to 65536", spec, total);
        goto fail;
    }
    *out = v;
    *n_out = n;
    return CDP_OK;
fail:
    cdp_topology_spec_terms_free(v, n);
    return st;
}

/* The join spec to keep: files as absolute paths, every term "N x node". */
static cdp_status normalize_join(const char *spec, const char *base_dir, char **norm)
{
    struct cdp_topology_term *v = NULL;
    int n = 0, files = 0;
    cdp_status st = cdp_topology_spec_terms(spec, base_dir, &v, &n);
    if (st) return st;
    size_t cap = 1;
    for (int i = 0; i < n; i++) {
        files += v[i].is_file;
        cap += strlen(v[i].is_file ? v[i].path : v[i].node) + 32;
    }
    *norm = files ? malloc(cap) : strdup(spec);
    if (*norm && files) {
        size_t len = 0;
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(*norm + len, cap - len, "%s%d x %s", i ? " + " : "", v[i].count,
                                    v[i].is_file ? v[i].path : v[i].node);
    }
    cdp_topology_spec_terms_free(v, n);
    return *norm ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "out of memory");
}

cdp_status cdp_topology_check_spec(const char *spec, const char *base_dir, char **normalized)
{
    enum cdp_topology_spec_kind kind;
    char *path = NULL;
    long nodes = 0;
    const char *node_spec = NULL;
    cdp_status st = cdp_topology_spec_classify(spec, base_dir, &kind, &path, &nodes, &node_spec);
    if (st) return st;
    char *norm = NULL;
    if (kind == CDP_TOPOLOGY_SPEC_JOIN) {
        if ((st = normalize_join(spec, base_dir, &norm))) return st;
    } else if (kind == CDP_TOPOLOGY_SPEC_FILE) {
        norm = path;
        path = NULL;
    } else if (kind == CDP_TOPOLOGY_SPEC_CLUSTER && cdp_topology_spec_is_path(node_spec)) {
        size_t n = strlen(path) + 32;
        norm = malloc(n);
        if (norm) snprintf(norm, n, "%ld x %s", nodes, path);
    } else {
        norm = strdup(spec);
    }
    free(path);
    if (!norm) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if (normalized) *normalized = norm;
    else free(norm);
    return CDP_OK;
}

