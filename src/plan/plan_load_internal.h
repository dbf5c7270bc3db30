/* Internal to the plan loader (src/plan/plan*.c): the loading context, the
 * limits every section checks against, and the reader of each section. */
#ifndef CDP_PLAN_LOAD_INTERNAL_H
#define CDP_PLAN_LOAD_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cdp/plan.h"
#include "core/json_check.h"

/* The largest plan file read. */
#define MAX_PLAN_BYTES (16u << 20)
/* What the planner partitions in seconds (4096 layers: about 12 s here; its
 * split is O(stages x layers^2)), named by key when passed. */
#define MAX_LAYERS 4096
#define MAX_WIDTHS 10000
#define MAX_COUNT CDP_PLAN_MAX_COUNT

/* The loading context every section reader gets. */
struct ld {
    struct cdp_json_in in; /* the file as named by the user, for messages */
    char *base;       /* absolute folder that relative paths start from (owned) */
    struct cdp_plan *p;
};

/* ---- plan.c: the entry points, the shared name tables and small rules */

cdp_status cdp_plan_get_seed(struct ld *c, const json_t *obj, const char *ptr, uint64_t *out);
cdp_status cdp_plan_int_array(struct ld *c, const json_t *v, const char *ptr, size_t min_n, size_t max_n,
                              int64_t *dst, size_t *n_out);

/* ---- plan_paths.c: paths a plan names: files that must exist, outputs that will be written */

cdp_status cdp_plan_get_existing_file(struct ld *c, const json_t *v, const char *ptr, char **out);
cdp_status cdp_plan_get_output_path(struct ld *c, const json_t *v, const char *ptr, int dir_ok, char **out);

/* ---- plan_model.c: /model: presets, layers, shapes, from a Hugging Face folder */

cdp_status cdp_plan_check_shapes(struct ld *c, const struct cdp_model_desc *m, int64_t *params);
cdp_status cdp_plan_check_sizes(struct ld *c);
cdp_status cdp_plan_load_model(struct ld *c, const json_t *m);

/* ---- plan_data.c: /data: the source, its files and their order */

cdp_status cdp_plan_load_data(struct ld *c, const json_t *d);

/* ---- plan_train.c: /train: the step, optimizer, learning-rate schedule, checkpoints and restarts */

cdp_status cdp_plan_load_train(struct ld *c, const json_t *t);

/* ---- plan_parallel.c: /parallel: shape, schedule (by name or file), partition, placement, balance */

cdp_status cdp_plan_load_parallel(struct ld *c, const json_t *v);

/* ---- plan_cluster.c: /cluster and /output, and whether the model fits the cluster */

cdp_status cdp_plan_load_cluster(struct ld *c, const json_t *v);
cdp_status cdp_plan_load_output(struct ld *c, const json_t *v);
cdp_status cdp_plan_check_fit(const char *name, const struct cdp_plan *p);

#endif
