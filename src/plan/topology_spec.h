/* Internal: the spec grammar's helpers for the plan loader and the
 * partitioner; the public part is cdp/topology_spec.h.
 *
 * The grammar of a topology spec (src/plan/topology_spec.c): what a string
 * names, without reading any topology. Shared by the plan loader (which
 * checks /cluster/topology) and the partitioner's loader (which loads what a
 * spec names). The public part is cdp/topology_spec.h. */
#ifndef CDP_PLAN_TOPOLOGY_SPEC_H
#define CDP_PLAN_TOPOLOGY_SPEC_H

#include "cdp/status.h"
#include "cdp/topology_spec.h"

#ifdef __cplusplus
extern "C" {
#endif

enum cdp_topology_spec_kind {
    CDP_TOPOLOGY_SPEC_AUTO,    /* "auto": live discovery */
    CDP_TOPOLOGY_SPEC_PRESET,  /* a preset name */
    CDP_TOPOLOGY_SPEC_CLUSTER, /* "N x preset" or "N x file" */
    CDP_TOPOLOGY_SPEC_FILE,    /* a file */
    CDP_TOPOLOGY_SPEC_JOIN     /* "N x a + M x b" */
};

/* What spec names (relative paths from base_dir, NULL: the current folder).
 * *path (owned, NULL when none) is the preset's or the file's absolute path;
 * for a cluster, *nodes and *node_spec (a pointer into spec) are its count and
 * node. CDP_ERR_INVALID with what was tried ("did you mean" for a name close
 * to a preset). */
cdp_status cdp_topology_spec_classify(const char *spec, const char *base_dir, enum cdp_topology_spec_kind *kind,
                                  char **path, long *nodes, const char **node_spec);

/* Whether s reads as a path rather than a preset name (a '/', .xml, .json). */
int cdp_topology_spec_is_path(const char *s);

/* The most terms a join has. */
#define CDP_TOPOLOGY_JOIN_MAX_TERMS 64

/* One term of "1 x dgx-a100 + 1 x dgx1-v100": "N x node" or a bare node (1 x). */
struct cdp_topology_term {
    int count;
    char *text; /* the term as written, trimmed (owned) */
    char *node; /* its node spec, trimmed (owned) */
    char *path; /* the preset's or file's path (owned) */
    int is_file;
};

/* Splits a join at '+' and classifies each term; messages name the term.
 * Free the terms with cdp_topology_spec_terms_free. */
cdp_status cdp_topology_spec_terms(const char *spec, const char *base_dir, struct cdp_topology_term **out, int *n_out);
void cdp_topology_spec_terms_free(struct cdp_topology_term *v, int n);

#ifdef __cplusplus
}
#endif

#endif
