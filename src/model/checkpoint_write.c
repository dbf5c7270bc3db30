/* Checkpoints (model/checkpoint.h): writing one part, from host memory in
 * place or staged through host memory from a device; a sharded optimizer's
 * state comes from the caller's gather (cdp_ckpt_write_part_sharded). */
#include "model/checkpoint.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/path.h"
#include "core/file.h"
#include "core/hash.h"
#include "core/json_check.h"
#include "model/checkpoint_internal.h"

/* ---- device memory ---------------------------------------------------------------------- */

/* Where a model range's tensors and optimizer state live when the host cannot
 * address them: its optimizer's device (the model's own); NULL for memory the
 * host reads and writes in place (the cpu backend), and for a range given
 * without an optimizer (see checkpoint.h). */
cdp_device_t ckpt_staging_device(struct cdp_optimizer *o)
{
    cdp_device_t dev = o ? cdp_optimizer_device(o) : NULL;
    return dev && !cdp_device_host_visible(dev) ? dev : NULL;
}

cdp_status cdp_ckpt_shard_piece(struct cdp_optimizer *o, struct cdp_model *m, int i, int s, float **host,
                                uint64_t *count)
{
    float *a, *b;
    uint64_t from;
    cdp_optimizer_state_range(o, m, i, &a, &b, &from, count);
    const float *src = s == 0 ? a : b;
    *host = malloc((size_t)*count * 4 + 1);
    if (!*host) return cdp_fail(CDP_ERR_NOMEM, "out of memory gathering optimizer state");
    if (!*count) return CDP_OK;
    cdp_device_t dev = ckpt_staging_device(o);
    if (!dev) {
        memcpy(*host, src, (size_t)*count * 4);
        return CDP_OK;
    }
    return cdp_device_read(dev, *host, src, *count * 4);
}

/* What a sharded state tensor of a part is: the optimizer, model, tensor and
 * state (0: m or velocity, 1: v) whose pieces the caller's gather collects. */
struct gathered {
    struct cdp_optimizer *o;
    struct cdp_model *m;
    int i, s;
};

/* cdp_safetensors_write_staged's source: tensor i of ts is on devs[i] (NULL:
 * host memory), or, where g[i].o is set, put together by gather (one tensor
 * at a time, when its first piece is asked for). */
struct fetch_ctx {
    const struct cdp_safetensors_tensor *ts;
    const cdp_device_t *devs;
    const struct gathered *g;
    const struct cdp_ckpt_gather *gather;
    uint8_t *held; /* the tensor being written, gathered */
};

static cdp_status fetch_tensor(void *ctx, const struct cdp_safetensors_tensor *t, uint64_t offset, void *dst,
                               uint64_t n)
{
    struct fetch_ctx *c = ctx;
    const struct gathered *g = c->g ? &c->g[t - c->ts] : NULL;
    if (g && g->o) {
        if (offset == 0) {
            free(c->held);
            c->held = NULL;
            cdp_status st = c->gather->state(c->gather->ctx, g->o, g->m, g->i, g->s, t->nbytes, &c->held);
            if (st) return cdp_error_context(st, "gathering its shards");
        }
        memcpy(dst, c->held + offset, (size_t)n);
        if (offset + n >= t->nbytes) {
            free(c->held);
            c->held = NULL;
        }
        return CDP_OK;
    }
    cdp_device_t dev = c->devs[t - c->ts];
    const uint8_t *src = (const uint8_t *)t->data + offset;
    if (!dev) {
        memcpy(dst, src, (size_t)n);
        return CDP_OK;
    }
    cdp_status st = cdp_device_read(dev, dst, src, n);
    return st ? cdp_error_context(st, "copying it from %s", cdp_device_name(dev)) : CDP_OK;
}

/* ---- writing a part ------------------------------------------------------------------ */

int ckpt_valid_part_name(const char *part)
{
    return part && *part && part[0] != '.' && !strchr(part, '/') && strlen(part) < 200;
}

int cdp_ckpt_sharded(struct cdp_optimizer *o, struct cdp_model *m)
{
    uint64_t off, len;
    if (!o) return 0;
    cdp_optimizer_shard(o, &off, &len);
    return len != (uint64_t)cdp_model_param_floats(m);
}

static cdp_status write_part(const char *dir, int64_t step, const char *part, struct cdp_model *const *models,
                             struct cdp_optimizer *const *opts, int n, const struct cdp_ckpt_gather *gather);

cdp_status cdp_ckpt_write_part(const char *dir, int64_t step, const char *part, struct cdp_model *const *models,
                               struct cdp_optimizer *const *opts, int n)
{
    return write_part(dir, step, part, models, opts, n, NULL);
}

cdp_status cdp_ckpt_write_part_sharded(const char *dir, int64_t step, const char *part,
                                       struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                       const struct cdp_ckpt_gather *gather)
{
    CDP_ASSERT(gather && gather->state);
    return write_part(dir, step, part, models, opts, n, gather);
}

static cdp_status write_part(const char *dir, int64_t step, const char *part, struct cdp_model *const *models,
                             struct cdp_optimizer *const *opts, int n, const struct cdp_ckpt_gather *gather)
{
    CDP_ASSERT(dir && (n == 0 || models) && n >= 0);
    if (!ckpt_valid_part_name(part))
        return cdp_fail(CDP_ERR_INVALID, "checkpoint part name \"%s\": expected a plain file name", part ? part : "");
    if (step < 0) return cdp_fail(CDP_ERR_INVALID, "checkpoint step %lld: expected >= 0", (long long)step);
    cdp_status st;
    struct cdp_safetensors_tensor *ts = NULL;
    cdp_device_t *devs = NULL;
    struct gathered *gs = NULL;
    char (*names)[96] = NULL;
    char *root = ckpt_trimmed(dir), *folder = NULL, *path = NULL;
    if (!root) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if ((st = ckpt_make_dirs(root))) goto fail;
    if (!(folder = ckpt_partial_folder(root, step))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = ckpt_make_dir(folder))) goto fail;

    int total = 0;
    for (int k = 0; k < n; k++) total += cdp_model_tensor_count(models[k]) * 3;
    ts = calloc((size_t)total + 1, sizeof *ts);
    devs = calloc((size_t)total + 1, sizeof *devs);
    gs = calloc((size_t)total + 1, sizeof *gs);
    names = calloc((size_t)total + 1, sizeof *names);
    size_t plen = strlen(folder) + strlen(part) + sizeof PART_SUFFIX + 2;
    path = malloc(plen);
    if (!ts || !devs || !gs || !names || !path) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory writing checkpoint part %s", part);
        goto fail;
    }
    snprintf(path, plen, "%s/%s%s", folder, part, PART_SUFFIX);
    int nt = 0, staged = 0;
    for (int k = 0; k < n; k++) {
        struct cdp_model *m = models[k];
        struct cdp_optimizer *o = opts ? opts[k] : NULL;
        cdp_device_t dev = ckpt_staging_device(o);
        staged |= dev != NULL;
        const int first = cdp_model_unit(m, 0)->index;
        for (int i = 0; i < cdp_model_tensor_count(m); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(m, i);
            if (t->unit < first) continue; /* a tied copy: its owner's part holds it */
            float *state[2] = {NULL, NULL};
            static const char *const adam_names[2] = {"optim.m.", "optim.v."};
            static const char *const sgd_names[2] = {"optim.velocity.", NULL};
            const char *const *snames = NULL;
            const int shards = o && cdp_ckpt_sharded(o, m);
            if (shards && !gather) {
                st = cdp_fail(CDP_ERR_INTERNAL, "checkpoint part %s: a sharded optimizer without its group", part);
                goto fail;
            }
            if (o) {
                snames = cdp_optimizer_type_of(o) == CDP_OPT_ADAMW ? adam_names : sgd_names;
                /* ZeRO-1: no local copy; gathered from the replicas as the part is written */
                if (!shards) cdp_optimizer_state(o, m, i, &state[0], &state[1]);
            }
            for (int s = -1; s < 2; s++) {
                if (s >= 0 && (!snames || !snames[s] || (!shards && !state[s]))) continue;
                struct cdp_safetensors_tensor *x = &ts[nt];
                snprintf(names[nt], sizeof names[nt], "%s%s", s < 0 ? "" : snames[s], t->name);
                x->name = names[nt];
                x->dtype = CDP_DTYPE_F32;
                x->dtype_name = "F32";
                x->ndim = t->ndim;
                for (int d = 0; d < t->ndim; d++) x->shape[d] = t->shape[d];
                x->data = s < 0 ? t->data : state[s]; /* device memory: read in place only where host visible */
                /* a gathered state's bytes come from fetch_tensor; the writer only asks that a source be named */
                if (s >= 0 && shards) x->data = t->data;
                x->nbytes = (uint64_t)t->numel * 4;
                devs[nt] = dev;
                if (s >= 0 && shards) {
                    gs[nt] = (struct gathered){o, m, i, s};
                    staged = 1;
                }
                nt++;
            }
        }
    }
    char step_s[24];
    snprintf(step_s, sizeof step_s, "%lld", (long long)step);
    const char *meta[6] = {"format", "cdphybrid-checkpoint-part", "step", step_s, "run", ckpt_run_id};
    const int n_meta = ckpt_run_id[0] ? 3 : 2;
    /* Host-visible memory is written from where it lies; a device's is copied
     * out piece by piece into one bounded host buffer. */
    struct fetch_ctx fc = {ts, devs, gs, gather, NULL};
    if (staged)
        st = cdp_safetensors_write_staged(path, ts, nt, meta, n_meta, fetch_tensor, &fc, STAGE_BYTES);
    else
        st = cdp_safetensors_write(path, ts, nt, meta, n_meta);
    free(fc.held);
    if (st) goto fail;
    CDP_INFO(CKPT, "wrote %s (%d tensors%s)", path, nt, staged ? ", staged through host memory" : "");
fail:
    free(ts);
    free(devs);
    free(gs);
    free(names);
    free(path);
    free(folder);
    free(root);
    return st;
}

