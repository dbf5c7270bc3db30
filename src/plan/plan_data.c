/* The plan's /data: the source (synthetic, token shards, text), its files
 * (globs and lists, relative to the plan) and their order. */
#include "cdp/plan.h"
#include "plan/plan_load_internal.h"

#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/path.h"
#include "plan/schedule_header.h"
#include "plan/schedule_kind.h"
#include "cdp/log.h"
#include "cdp/topology_spec.h"
#include "core/json_check.h"
#include "model/hf.h"
#include "model/layer_def.h"
#include "plan/plan_internal.h"

static const char *const data_keys[] = {"source", "path", "val_path", "labels", "seed", "order", NULL};

#define MAX_DATA_FILES 1000000

static cdp_status push_path(struct ld *c, const char *ptr, char ***list, int *n, char *path)
{
    if (*n >= MAX_DATA_FILES) {
        free(path);
        return cdp_json_fail(&c->in, ptr, "more than %d files", MAX_DATA_FILES);
    }
    char **nl = realloc(*list, (size_t)(*n + 1) * sizeof *nl);
    if (!nl) {
        free(path);
        return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    }
    nl[(*n)++] = path;
    *list = nl;
    return CDP_OK;
}

/* One entry of a data path list: a file, or a glob pattern (it holds * ? or [)
 * that names at least one regular file, its matches in sorted order. */
static cdp_status get_data_entry(struct ld *c, const json_t *v, const char *ptr, char ***list, int *n)
{
    cdp_status st;
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
        return cdp_json_expected(&c->in, ptr, "a file path, a glob pattern or a list of them", v);
    const char *s = json_string_value(v);
    if (!strpbrk(s, "*?[")) {
        char *one = NULL;
        if ((st = cdp_plan_get_existing_file(c, v, ptr, &one))) return st;
        return push_path(c, ptr, list, n, one);
    }
    char *joined = cdp_path_join(c->base, s);
    if (!joined) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    glob_t g;
    int rc = glob(joined, GLOB_ERR, NULL, &g);
    if (rc != 0) {
        st = rc == GLOB_NOMATCH ? cdp_json_fail(&c->in, ptr, "the pattern \"%s\" matches no file", joined)
             : rc == GLOB_NOSPACE ? cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr)
                                  : cdp_json_fail(&c->in, ptr, "cannot read the folders of \"%s\"", joined);
        if (rc != GLOB_NOMATCH) globfree(&g);
        free(joined);
        return st;
    }
    free(joined);
    st = CDP_OK;
    int regular = 0;
    for (size_t i = 0; i < g.gl_pathc && !st; i++) {
        struct stat sb;
        if (stat(g.gl_pathv[i], &sb) != 0 || !S_ISREG(sb.st_mode)) continue; /* folders a pattern also matches */
        char *abs = realpath(g.gl_pathv[i], NULL);
        if (!abs) {
            st = cdp_json_fail(&c->in, ptr, "cannot open \"%s\": %s", g.gl_pathv[i], strerror(errno));
            break;
        }
        st = push_path(c, ptr, list, n, abs);
        regular++;
    }
    if (!st && !regular) st = cdp_json_fail(&c->in, ptr, "the pattern \"%s\" matches no regular file", s);
    globfree(&g);
    return st;
}

/* data.path / data.val_path: a file, a glob, or a non-empty list of either. */
static cdp_status get_data_paths(struct ld *c, const json_t *v, const char *ptr, char ***list, int *n)
{
    cdp_status st;
    if (!json_is_array(v)) return get_data_entry(c, v, ptr, list, n);
    if (json_array_size(v) == 0)
        return cdp_json_expected(&c->in, ptr, "a file path, a glob pattern or a non-empty list of them", v);
    size_t k;
    json_t *e;
    json_array_foreach(v, k, e) {
        char ep[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(ep, ptr, k);
        if ((st = get_data_entry(c, e, ep, list, n))) return st;
    }
    return CDP_OK;
}

cdp_status cdp_plan_load_data(struct ld *c, const json_t *d)
{
    struct cdp_data_desc *dd = &c->p->data;
    const struct cdp_model_desc *m = &c->p->model;
    cdp_status st;
    int src = 0;
    if ((st = cdp_json_need_object(&c->in, d, "/data"))) return st;
    if (!d) return CDP_OK;
    if ((st = cdp_json_check_keys(&c->in, d, "/data", data_keys, "/data"))) return st;
    if ((st = cdp_json_get_enum(&c->in, d, "/data", "source", cdp_plan_source_names, &src))) return st;
    dd->source = (enum cdp_data_source)src;
    if ((st = cdp_plan_get_seed(c, d, "/data", &dd->seed))) return st;
    int order = CDP_DATA_ORDER_SHUFFLE;
    if ((st = cdp_json_get_enum(&c->in, d, "/data", "order", cdp_plan_order_names, &order))) return st;
    dd->order = (enum cdp_data_order)order;
    const json_t *path = json_object_get(d, "path"), *labels = json_object_get(d, "labels");
    const json_t *val_path = json_object_get(d, "val_path");
    if (json_is_null(path)) path = NULL;
    if (json_is_null(labels)) labels = NULL;
    if (json_is_null(val_path)) val_path = NULL;
    const char *sn = cdp_plan_source_names[src];
    if (dd->source == CDP_DATA_SYNTHETIC) {
        if (path)
            return cdp_json_fail(&c->in, "/data/path", "synthetic data has no file; remove it or set /data/source");
        if (dd->order != CDP_DATA_ORDER_SHUFFLE)
            return cdp_json_fail(&c->in, "/data/order",
                                 "\"%s\" reads a file in its order; synthetic data has no file (each sample is "
                                 "drawn from its index): remove /data/order or set /data/source",
                                 cdp_plan_order_names[dd->order]);
    } else {
        if (!path) return cdp_json_fail(&c->in, "/data/path", "missing; /data/source \"%s\" needs a file", sn);
        if (dd->source == CDP_DATA_IDX) {
            if ((st = cdp_plan_get_existing_file(c, path, "/data/path", &dd->path))) return st;
        } else {
            if ((st = get_data_paths(c, path, "/data/path", &dd->paths, &dd->n_paths))) return st;
            if (!(dd->path = strdup(dd->paths[0])))
                return cdp_fail(CDP_ERR_NOMEM, "%s: /data/path: out of memory", c->in.file);
        }
    }
    if (val_path) {
        if (dd->source != CDP_DATA_TEXT && dd->source != CDP_DATA_TOKENS)
            return cdp_json_fail(&c->in, "/data/val_path",
                                 "only /data/source \"text\" and \"tokens\" take validation files, not \"%s\"", sn);
        if ((st = get_data_paths(c, val_path, "/data/val_path", &dd->val_paths, &dd->n_val_paths))) return st;
    }
    if (dd->source == CDP_DATA_IDX) {
        if (!labels)
            return cdp_json_fail(&c->in, "/data/labels",
                                 "missing; /data/source \"idx\" needs the labels file "
                                 "beside /data/path (the images)");
        if ((st = cdp_plan_get_existing_file(c, labels, "/data/labels", &dd->labels))) return st;
    } else if (labels) {
        return cdp_json_fail(&c->in, "/data/labels", "only /data/source \"idx\" has a labels file, not \"%s\"", sn);
    }
    int gpt = m->kind == CDP_MODEL_GPT;
    if (dd->source == CDP_DATA_TEXT && (!gpt || m->vocab < 256)) {
        if (!gpt)
            return cdp_json_fail(&c->in, "/data/source", "\"text\" needs a gpt model (byte tokens), not /model %s",
                                 m->kind == CDP_MODEL_LAYERS ? "with a layer list" : m->preset);
        return cdp_json_fail(&c->in, "/data/source",
                             "\"text\" reads bytes, so /model/vocab must be at least 256, "
                             "got %lld",
                             (long long)m->vocab);
    }
    if (dd->source == CDP_DATA_TOKENS && !gpt)
        return cdp_json_fail(&c->in, "/data/source",
                             "\"tokens\" needs a gpt model (/model/preset \"gpt\", \"gpt2\", ...)");
    if (dd->source == CDP_DATA_IDX && gpt)
        return cdp_json_fail(&c->in, "/data/source",
                             "\"idx\" (images and labels) needs an mlp, cnn or layer-list "
                             "model, not /model/preset \"%s\"",
                             m->preset);
    return CDP_OK;
}
