/* Checkpoints (model/checkpoint.h): export of a checkpoint's weights as one
 * safetensors file, and in Hugging Face's GPT-2 layout. */
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
#include "model/hf.h"
#include "model/hf_gpt2.h"

/* ---- export ------------------------------------------------------------------------------ */

cdp_status cdp_ckpt_export(const char *path, const char *out)
{
    CDP_ASSERT(path && out);
    cdp_status st;
    json_t *root = NULL;
    struct ckpt_part_cache pc = {0};
    struct cdp_safetensors_tensor *ts = NULL;
    char *folder = ckpt_trimmed(path);
    if (!folder) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if ((st = ckpt_read_manifest(folder, &root))) goto fail;
    if ((st = ckpt_part_cache_init(&pc, folder, root))) goto fail;
    json_t *tensors = json_object_get(root, "tensors");
    size_t nt = json_object_size(tensors);
    if (!(ts = calloc(nt + 1, sizeof *ts))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach(tensors, key, v) {
        struct cdp_safetensors_file *f;
        char fpath[4096];
        /* an unreadable part is a bad checkpoint, like a corrupt one */
        if ((st = ckpt_part_get(&pc, json_string_value(v), &f, fpath, sizeof fpath))) {
            if (st == CDP_ERR_IO) st = CDP_ERR_INVALID;
            goto fail;
        }
        const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, key);
        if (!x) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: no tensor %s (the manifest says this part holds it)", fpath, key);
            goto fail;
        }
        ts[i] = *x;
        ts[i].name = key; /* lives as long as root */
        i++;
    }
    char step_s[24];
    snprintf(step_s, sizeof step_s, "%lld", (long long)json_integer_value(json_object_get(root, "step")));
    const char *meta[4] = {"format", "cdphybrid", "step", step_s};
    if ((st = cdp_safetensors_write(out, ts, (int)nt, meta, 2))) {
        /* the checkpoint was read: whatever went wrong is on the writing side */
        if (st == CDP_ERR_INVALID) st = CDP_ERR_IO;
        goto fail;
    }
    CDP_INFO(CKPT, "exported %zu tensors of %s to %s", nt, folder, out);
fail:
    free(ts);
    ckpt_part_cache_free(&pc);
    json_decref(root);
    free(folder);
    return st;
}

/* ---- export in the Hugging Face GPT-2 layout ------------------------------------------ */

/* The GPT the checkpoint's plan describes (its manifest's /plan/model): a
 * GPT preset's sizes, or CDP_ERR_INVALID naming what makes it another
 * model. */
static cdp_status hf_model_of(const char *folder, json_t *root, struct cdp_model_desc *md)
{
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/" MANIFEST, folder);
    const struct cdp_json_in in = {.file = mpath};
    const json_t *model = json_object_get(json_object_get(root, "plan"), "model");
    if (!json_is_object(model))
        return cdp_fail(CDP_ERR_INVALID, "%s: /plan: no plan in the manifest, so the model's shape (its heads) is "
                        "unknown; --format hf needs a checkpoint written by a training run", mpath);
    const json_t *preset = json_object_get(model, "preset"), *layers = json_object_get(model, "layers");
    if (!json_is_string(preset) || strncmp(json_string_value(preset), "gpt", 3) || !json_is_integer(layers)) {
        char got[64];
        return cdp_fail(CDP_ERR_INVALID, "%s: /plan/model: a %s, not a GPT preset; only a GPT (the gpt and gpt2* "
                        "presets) has a Hugging Face GPT-2 layout: export it with --format cdphybrid", mpath,
                        json_is_string(preset) ? cdp_json_got(preset, got, sizeof got) : "layer list");
    }
    memset(md, 0, sizeof *md);
    md->kind = CDP_MODEL_GPT;
    static const char *const keys[] = {"vocab", "context", "layers", "heads", "embed"};
    int64_t *dst[] = {&md->vocab, &md->context, &md->layers, &md->heads, &md->embed};
    const int64_t max[] = {CDP_PLAN_MAX_COUNT, CDP_PLAN_MAX_CONTEXT, 4096, CDP_PLAN_MAX_COUNT, CDP_PLAN_MAX_COUNT};
    for (int i = 0; i < 5; i++) {
        char p[CDP_JSON_PTR_CAP];
        cdp_json_ptr_key(p, "/plan/model", keys[i]);
        cdp_status st = cdp_json_int(&in, json_object_get(model, keys[i]), p, 1, max[i], 0, NULL, dst[i]);
        if (st) return st;
    }
    if (md->embed % md->heads)
        return cdp_json_fail(&in, "/plan/model/heads", "%lld does not divide embed %lld", (long long)md->heads,
                             (long long)md->embed);
    const json_t *tie = json_object_get(model, "tie_embeddings");
    if (!json_is_boolean(tie)) return cdp_json_expected(&in, "/plan/model/tie_embeddings", "true or false", tie);
    md->tie_embeddings = json_is_true(tie);
    return CDP_OK;
}

/* One tensor of the export: where it is in the checkpoint, and whether it
 * is written transposed (Conv1D). */
struct hf_src {
    const struct cdp_safetensors_tensor *x;
    int conv1d;
};

/* cdp_safetensors_write_staged's source: a Conv1D weight is transposed whole
 * into a host buffer when its first piece is asked for (one at a time), the
 * others are copied from the mapped part. */
struct hf_fetch {
    const struct cdp_safetensors_tensor *ts;
    const struct hf_src *src;
    float *held;
};

static cdp_status hf_fetch_tensor(void *ctx, const struct cdp_safetensors_tensor *t, uint64_t offset, void *dst,
                                  uint64_t n)
{
    struct hf_fetch *c = ctx;
    const struct hf_src *s = &c->src[t - c->ts];
    if (!s->conv1d) {
        memcpy(dst, (const uint8_t *)s->x->data + offset, (size_t)n);
        return CDP_OK;
    }
    if (offset == 0) {
        /* ours [out, in] -> theirs [in, out] */
        const int64_t rows = s->x->shape[0], cols = s->x->shape[1];
        free(c->held);
        if (!(c->held = malloc((size_t)(rows * cols) * 4 + 1)))
            return cdp_fail(CDP_ERR_NOMEM, "out of memory transposing %s", t->name);
        const float *from = s->x->data;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t k = 0; k < cols; k++) {
                float v;
                memcpy(&v, from + r * cols + k, 4); /* the mapped data may be unaligned */
                c->held[k * rows + r] = v;
            }
    }
    memcpy(dst, (const uint8_t *)c->held + offset, (size_t)n);
    return CDP_OK;
}

cdp_status cdp_ckpt_export_hf(const char *path, const char *dir, uint64_t shard_bytes)
{
    CDP_ASSERT(path && dir);
    cdp_status st;
    json_t *root = NULL;
    struct ckpt_part_cache pc = {0};
    struct cdp_unit *units = NULL;
    struct cdp_safetensors_tensor *ts = NULL;
    struct hf_src *src = NULL;
    char *names = NULL;
    struct hf_fetch fc = {0};
    char *folder = ckpt_trimmed(path);
    if (!folder) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    struct cdp_model_desc md;
    int n_units = 0;
    if ((st = ckpt_read_manifest(folder, &root))) goto fail;
    if ((st = hf_model_of(folder, root, &md))) goto fail;
    if ((st = ckpt_part_cache_init(&pc, folder, root))) goto fail;
    if ((st = cdp_units_build(&md, &units, &n_units))) goto fail;
    json_t *tensors = json_object_get(root, "tensors");
    const size_t cap = (size_t)n_units * CDP_UNIT_MAX_PARAMS;
    ts = calloc(cap + 1, sizeof *ts);
    src = calloc(cap + 1, sizeof *src);
    names = calloc(cap + 1, 96);
    if (!ts || !src || !names) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* every tensor of the plan's model, from the part the manifest names, by the one name table */
    int n = 0;
    for (int u = 0; u < n_units; u++) {
        const struct cdp_unit *un = &units[u];
        for (int p = 0; p < un->n_params; p++) {
            const struct cdp_param_desc *pd = &un->params[p];
            if (pd->tied_unit >= 0) continue; /* a tied head is the embedding */
            char ours[96], fpath[4200];
            snprintf(ours, sizeof ours, "layers.%d.%s", un->index, pd->name);
            const enum cdp_hf_part part = u == 0 ? CDP_HF_EMBED : u == n_units - 1 ? CDP_HF_HEAD : CDP_HF_BLOCK;
            char *hf = names + (size_t)n * 96;
            if (!cdp_hf_gpt2_name(part, u - 1, pd->name, "transformer.", hf, 96, &src[n].conv1d)) {
                st = cdp_fail(CDP_ERR_INTERNAL, "%s: no Hugging Face GPT-2 name", ours);
                goto fail;
            }
            const json_t *part_name = json_object_get(tensors, ours);
            struct cdp_safetensors_file *f;
            if (!json_is_string(part_name)) {
                st = cdp_fail(CDP_ERR_INVALID, "%s/" MANIFEST ": /tensors: no %s, which the plan's model has",
                              folder, ours);
                goto fail;
            }
            if ((st = ckpt_part_get(&pc, json_string_value(part_name), &f, fpath, sizeof fpath))) {
                if (st == CDP_ERR_IO) st = CDP_ERR_INVALID;
                goto fail;
            }
            const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, ours);
            int same = x && x->ndim == pd->ndim && !strcmp(x->dtype_name, "F32");
            for (int d = 0; same && d < pd->ndim; d++) same = x->shape[d] == pd->shape[d];
            if (!same) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: tensor %s: %s, the plan's model has an F32 tensor of %lld "
                              "elements there", fpath, ours, x ? "another shape or dtype" : "missing",
                              (long long)pd->numel);
                goto fail;
            }
            src[n].x = x;
            ts[n] = *x;
            ts[n].name = hf;
            if (src[n].conv1d) {
                ts[n].shape[0] = x->shape[1];
                ts[n].shape[1] = x->shape[0];
            }
            n++;
        }
    }
    if ((size_t)n != json_object_size(tensors)) {
        st = cdp_fail(CDP_ERR_INVALID, "%s/" MANIFEST ": /tensors: %zu tensors, the plan's model %d", folder,
                      json_object_size(tensors), n);
        goto fail;
    }
    char step_s[24];
    snprintf(step_s, sizeof step_s, "%lld", (long long)pc.step);
    /* transformers refuses a safetensors file whose format is not "pt" */
    const char *meta[4] = {"format", "pt", "cdphybrid_step", step_s};
    fc.ts = ts;
    fc.src = src;
    if ((st = cdp_hf_write_folder(dir, &md, ts, n, meta, 2, hf_fetch_tensor, &fc, shard_bytes))) {
        if (st == CDP_ERR_INVALID) st = CDP_ERR_IO;
        goto fail;
    }
    CDP_INFO(CKPT, "exported %d tensors of %s to %s (Hugging Face %s)", n, folder, dir, cdp_hf_family(&md));
fail:
    free(fc.held);
    free(names);
    free(src);
    free(ts);
    free(units);
    ckpt_part_cache_free(&pc);
    json_decref(root);
    free(folder);
    return st;
}
