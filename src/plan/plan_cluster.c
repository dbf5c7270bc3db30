/* The plan's /cluster (backend, nodes, devices, memory, topology) and
 * /output, and the check that the model's size fits what the cluster has. */
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

static const char *const cluster_keys[] = {"backend", "topology", "nodes", "devices", "device_memory", "host_memory",
                                           "ranks_per_device", NULL};

static const char *const output_keys[] = {"metrics", "trace", "timeline", "weights", "tensorboard", NULL};

/* /cluster/KEY: a size ("16GiB", "512MB"), a number of bytes, or "auto" (0). */
static cdp_status get_size(struct ld *c, const json_t *v, const char *key, uint64_t *out)
{
    const json_t *mem = json_object_get(v, key);
    if (!mem) return CDP_OK;
    char MP[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(MP, "/cluster", key);
    const char *what = "a size like \"16GiB\" or \"512MB\", a number of bytes, or \"auto\"";
    if (json_is_integer(mem)) {
        if (json_integer_value(mem) < 0) return cdp_json_expected(&c->in, MP, what, mem);
        *out = (uint64_t)json_integer_value(mem);
    } else if (json_is_string(mem)) {
        const char *s = json_string_value(mem);
        if (strcmp(s, "auto") == 0) {
            *out = 0;
        } else if (strlen(s) != json_string_length(mem) || cdp_parse_size(s, out)) {
            char why[512], g[CDP_JSON_GOT_CAP];
            snprintf(why, sizeof why, "%s", cdp_last_error());
            return cdp_json_fail(&c->in, MP, "expected %s, got %s: %s", what, cdp_json_got(mem, g, sizeof g), why);
        }
    } else {
        return cdp_json_expected(&c->in, MP, what, mem);
    }
    return CDP_OK;
}

cdp_status cdp_plan_load_cluster(struct ld *c, const json_t *v)
{
    struct cdp_cluster_desc *cd = &c->p->cluster;
    cdp_status st;
    int be = 0;
    const char *P = "/cluster";
    if ((st = cdp_json_need_object(&c->in, v, P))) return st;
    if (!v) return CDP_OK;
    if ((st = cdp_json_check_keys(&c->in, v, P, cluster_keys, "/cluster"))) return st;
    /* "auto", then the backends in enum order (cdp_backend_name) */
    const char *backends[CDP_BACKEND_COUNT + 2] = {"auto"};
    for (int k = 0; k < CDP_BACKEND_COUNT; k++) backends[k + 1] = cdp_backend_name((enum cdp_backend)k);
    if ((st = cdp_json_get_enum(&c->in, v, P, "backend", backends, &be))) return st;
    cd->backend_auto = be == 0;
    cd->backend = be == 0 ? CDP_BACKEND_CPU : (enum cdp_backend)(be - 1);
    const json_t *topo = json_object_get(v, "topology");
    if (topo && !(json_is_string(topo) && strcmp(json_string_value(topo), "auto") == 0)) {
        char *spec = NULL;
        if (!json_is_string(topo) || json_string_length(topo) == 0 ||
            strlen(json_string_value(topo)) != json_string_length(topo))
            return cdp_json_expected(&c->in, "/cluster/topology",
                                     "\"auto\", a preset name, \"N x preset\" or a topology "
                                     "file path",
                                     topo);
        /* Presets and "N x preset" are kept as written, files become absolute;
         * the file itself is read by the planner. */
        if (cdp_topology_check_spec(json_string_value(topo), c->base, &spec))
            return cdp_json_context(&c->in, "/cluster/topology");
        free(cd->topology);
        cd->topology = spec;
    }
    if ((st = cdp_json_get_int(&c->in, v, P, "nodes", 1, MAX_COUNT, 0, &cd->nodes))) return st;
    cd->nodes_given = json_object_get(v, "nodes") != NULL;
    if ((st = cdp_json_get_int(&c->in, v, P, "devices", 1, MAX_COUNT, 1, &cd->devices))) return st;
    if ((st = cdp_json_get_int(&c->in, v, P, "ranks_per_device", 1, 64, 0, &cd->ranks_per_device))) return st;
    if ((st = get_size(c, v, "device_memory", &cd->device_memory))) return st;
    if ((st = get_size(c, v, "host_memory", &cd->host_memory))) return st;
    return CDP_OK;
}

cdp_status cdp_plan_load_output(struct ld *c, const json_t *v)
{
    struct cdp_output_desc *od = &c->p->output;
    char **slots[] = {&od->metrics, &od->trace, &od->timeline, &od->weights, &od->tensorboard};
    const int folder[] = {0, 0, 0, 0, 1}; /* tensorboard: a folder of event files */
    cdp_status st;
    if ((st = cdp_json_need_object(&c->in, v, "/output"))) return st;
    if (!v) return CDP_OK;
    if ((st = cdp_json_check_keys(&c->in, v, "/output", output_keys, "/output"))) return st;
    for (int i = 0; output_keys[i]; i++) {
        const json_t *e = json_object_get(v, output_keys[i]);
        char kp[CDP_JSON_PTR_CAP];
        if (!e || json_is_null(e)) continue;
        cdp_json_ptr_key(kp, "/output", output_keys[i]);
        if (!json_is_string(e)) return cdp_json_expected(&c->in, kp, folder[i] ? "a folder path or null"
                                                                                   : "a file path or null", e);
        if ((st = cdp_plan_get_output_path(c, e, kp, folder[i], slots[i]))) return st;
    }
    return CDP_OK;
}

/* Stages x replicas must fit the devices, when both are known. */
cdp_status cdp_plan_check_fit(const char *name, const struct cdp_plan *p)
{
    const struct cdp_parallel_desc *pd = &p->parallel;
    const struct cdp_cluster_desc *cd = &p->cluster;
    if (cd->devices == CDP_AUTO) return CDP_OK;
    int64_t total; /* more than any stages x replicas when it overflows */
    if (__builtin_mul_overflow(cd->nodes, cd->devices, &total) ||
        __builtin_mul_overflow(total, cd->ranks_per_device, &total))
        total = INT64_MAX;
    const int64_t t = pd->tensor == CDP_AUTO ? 1 : pd->tensor;
    if (pd->stages != CDP_AUTO && pd->replicas != CDP_AUTO && pd->stages * pd->replicas * t > total)
        return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/stages: %lld stages x /parallel/replicas %lld%s = %lld "
                        "devices, but /cluster/nodes %lld x /cluster/devices %lld%s gives only %lld",
                        name, (long long)pd->stages, (long long)pd->replicas, t > 1 ? " x /parallel/tensor" : "",
                        (long long)(pd->stages * pd->replicas * t), (long long)cd->nodes,
                        (long long)cd->devices, cd->ranks_per_device > 1 ? " x /cluster/ranks_per_device" : "",
                        (long long)total);
    if (pd->placement == CDP_PLACEMENT_EXPLICIT) {
        for (int64_t i = 0; i < pd->stages * pd->replicas; i++)
            if (pd->placement_map[i] + t - 1 >= total)
                return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/placement/%lld/%lld: device %lld does not "
                                "exist; /cluster/nodes %lld x /cluster/devices %lld gives devices 0 to %lld",
                                name, (long long)(i / pd->replicas), (long long)(i % pd->replicas),
                                (long long)pd->placement_map[i], (long long)cd->nodes,
                                (long long)cd->devices, (long long)(total - 1));
    }
    return CDP_OK;
}
