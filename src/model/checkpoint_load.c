/* Checkpoints (model/checkpoint.h): finding the newest complete checkpoint
 * and loading its tensors and optimizer state into models, onto their
 * devices piece by piece. */
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

/* ---- staging into device memory ---------------------------------------------------- */

/* A growable host buffer of floats, at most STAGE_BYTES. */
struct stage {
    float *p;
    uint64_t cap; /* floats */
};

/* A tensor read from a checkpoint holds only finite values: a NaN or an
 * infinity there is a damaged (or diverged) checkpoint, named with the
 * tensor, not a learning rate to lower. at: the element index of p[0]. */
static cdp_status check_finite(const char *fpath, const char *name, const float *p, uint64_t n, uint64_t at)
{
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return cdp_fail(CDP_ERR_INVALID, "%s: tensor %s holds %s at element %llu: the checkpoint's values are "
                            "not numbers (a diverged run or a damaged file); resume from an earlier checkpoint",
                            fpath, name, isnan(p[i]) ? "NaN" : p[i] > 0 ? "+Inf" : "-Inf",
                            (unsigned long long)(at + i));
    return CDP_OK;
}

/* Tensor `name` of a part (checked: a float tensor of numel elements) into
 * device memory dst of dev, piece by piece: F32 straight from the mapped file,
 * 16-bit types widened into the stage first. */
static cdp_status load_to_device(struct cdp_safetensors_file *f, const char *fpath, const char *name, cdp_device_t dev,
                                 float *dst, uint64_t first, uint64_t numel, struct stage *sb)
{
    const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, name);
    if (!x) return cdp_fail(CDP_ERR_INTERNAL, "%s: no tensor %s", fpath, name);
    const int f32 = !strcmp(x->dtype_name, "F32");
    const uint64_t piece = STAGE_BYTES / 4;
    for (uint64_t at = 0; at < numel;) {
        uint64_t k = numel - at < piece ? numel - at : piece;
        const void *src;
        cdp_status st;
        if (f32) {
            src = (const uint8_t *)x->data + 4 * (first + at); /* the mapped file is host memory */
        } else {
            if (sb->cap < k) {
                float *p = realloc(sb->p, (size_t)k * 4);
                if (!p)
                    return cdp_fail(CDP_ERR_NOMEM, "%s: tensor %s: out of memory for a staging buffer", fpath, name);
                sb->p = p;
                sb->cap = k;
            }
            if ((st = cdp_safetensors_read_f32_range(f, name, first + at, k, sb->p))) return st;
            src = sb->p;
        }
        if ((st = check_finite(fpath, name, src, k, first + at))) return st;
        if ((st = cdp_device_write(dev, dst + at, src, k * 4)))
            return cdp_error_context(st, "%s: tensor %s: copying it to %s", fpath, name, cdp_device_name(dev));
        at += k;
    }
    return CDP_OK;
}

/* ---- finding and loading ------------------------------------------------------------ */

void cdp_ckpt_info_free(struct cdp_ckpt_info *info)
{
    if (!info) return;
    free(info->plan_json);
    info->plan_json = NULL;
}

cdp_status cdp_ckpt_find_latest(const char *dir, char **path, struct cdp_ckpt_info *info)
{
    CDP_ASSERT(dir && path && info);
    cdp_status st = CDP_OK;
    char *root_dir = ckpt_trimmed(dir), *man = root_dir ? cdp_path_join(root_dir, MANIFEST) : NULL, *folder = NULL;
    struct ckpt_step_ent *e = NULL;
    int n = 0;
    json_t *root = NULL;
    if (!man) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const char *base = strrchr(root_dir, '/') ? strrchr(root_dir, '/') + 1 : root_dir;
    int64_t ignored;
    if (ckpt_is_file(man) || (ckpt_parse_step_name(base, &ignored) && ckpt_is_dir(root_dir))) {
        /* a checkpoint folder itself */
        folder = strdup(root_dir);
    } else {
        if (!ckpt_is_dir(root_dir)) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: no complete checkpoint (%s)", root_dir,
                          access(root_dir, F_OK) ? "no such folder" : "not a folder");
            goto fail;
        }
        if ((st = ckpt_list_steps(root_dir, &e, &n))) goto fail;
        int found = -1;
        for (int i = 0; i < n && found < 0 && !st; i++) {
            if (e[i].complete) found = i;
            else if (e[i].partial) CDP_INFO(CKPT, "skipping %s: a save that did not finish", e[i].path);
            else if (e[i].broken) {
                char to[4096] = "?";
                const ssize_t k = readlink(e[i].path, to, sizeof to - 1);
                if (k > 0) to[k] = '\0';
                st = cdp_fail(CDP_ERR_INVALID, "%s is a symbolic link to %s, which is %s: the newest checkpoint is "
                              "gone; restore it, or remove the link to resume from an earlier step", e[i].path, to,
                              access(e[i].path, F_OK) ? "not there" : "not a folder");
            } else /* committed, so its manifest was there: not a crash, a loss */
                st = cdp_fail(CDP_ERR_INVALID, "%s/" MANIFEST " is missing, though the folder was committed (a save "
                              "takes this name only once complete): restore it, or move the folder away to resume "
                              "from an earlier step", e[i].path);
        }
        if (st) goto fail;
        if (found < 0) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: no complete checkpoint%s", root_dir,
                          n ? " (only saves that did not finish)" : "");
            goto fail;
        }
        folder = strdup(e[found].path);
    }
    if (!folder) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = ckpt_read_manifest(folder, &root))) goto fail;
    if ((st = ckpt_verify_files(folder, root))) goto fail;
    json_t *plan = json_object_get(root, "plan");
    char *plan_text = NULL;
    if (json_is_object(plan) && !(plan_text = json_dumps(plan, JSON_COMPACT))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    memset(info, 0, sizeof *info);
    info->step = json_integer_value(json_object_get(root, "step"));
    info->samples_seen = json_integer_value(json_object_get(root, "samples_seen"));
    info->seed = (uint64_t)json_integer_value(json_object_get(root, "seed"));
    snprintf(info->optimizer, sizeof info->optimizer, "%s", json_string_value(json_object_get(root, "optimizer")));
    info->plan_json = plan_text;
    const char *df = json_string_value(json_object_get(root, "data_file"));
    snprintf(info->data_file, sizeof info->data_file, "%s", df ? df : "");
    *path = folder;
    folder = NULL;
    CDP_INFO(CKPT, "latest checkpoint: %s (step %lld, checksums verified)", *path, (long long)info->step);
fail:
    json_decref(root);
    ckpt_free_steps(e, n);
    free(folder);
    free(man);
    free(root_dir);
    return st;
}

cdp_status ckpt_part_cache_init(struct ckpt_part_cache *c, const char *folder, json_t *root)
{
    json_t *files = json_object_get(root, "files"), *f;
    size_t i;
    c->folder = folder;
    c->step = json_integer_value(json_object_get(root, "step"));
    c->n = (int)json_array_size(files);
    c->names = calloc((size_t)c->n + 1, sizeof *c->names);
    c->files = calloc((size_t)c->n + 1, sizeof *c->files);
    if (!c->names || !c->files) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    json_array_foreach(files, i, f) c->names[i] = json_string_value(json_object_get(f, "name"));
    return CDP_OK;
}

void ckpt_part_cache_free(struct ckpt_part_cache *c)
{
    for (int i = 0; c->files && i < c->n; i++) cdp_safetensors_close(c->files[i]);
    free(c->names);
    free(c->files);
}

/* The open part of that name; its path (for messages) goes to buf. */
cdp_status ckpt_part_get(struct ckpt_part_cache *c, const char *name, struct cdp_safetensors_file **out, char *buf,
                           size_t cap)
{
    snprintf(buf, cap, "%s/%s", c->folder, name);
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->names[i], name)) continue;
        if (!c->files[i]) {
            cdp_status st = cdp_safetensors_open(buf, &c->files[i]);
            if (st) return st;
            /* a part of another step, its checksum fixed up, is not this step's */
            const char *ps = cdp_safetensors_metadata(c->files[i], "step");
            char want[24];
            snprintf(want, sizeof want, "%lld", (long long)c->step);
            if (!ps || strcmp(ps, want))
                return cdp_fail(CDP_ERR_INVALID, "%s: a part of step %s, not of the manifest's step %s", buf,
                                ps ? ps : "(none)", want);
        }
        *out = c->files[i];
        return CDP_OK;
    }
    return cdp_fail(CDP_ERR_INTERNAL, "%s: not in the manifest's files", buf);
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* The tensor `name` of the part is there, a float tensor of the model's shape. */
static cdp_status check_tensor(struct cdp_safetensors_file *f, const char *fpath, const char *name, const char *owner,
                               const struct cdp_model_tensor *t)
{
    const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, name);
    if (!x) {
        if (!strcmp(name, owner))
            return cdp_fail(CDP_ERR_INVALID, "%s: no tensor %s (the manifest says this part holds it)", fpath, name);
        return cdp_fail(CDP_ERR_INVALID, "%s: no tensor %s (the optimizer state of %s; was the checkpoint "
                        "written without it?)", fpath, name, owner);
    }
    int same = x->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = x->shape[d] == t->shape[d];
    if (!same) {
        char a[128], b[128];
        format_shape(a, sizeof a, x->ndim, x->shape);
        format_shape(b, sizeof b, t->ndim, t->shape);
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor %s: shape %s in the checkpoint, %s in the model", fpath, name, a,
                        b);
    }
    if (!x->dtype_name ||
        (strcmp(x->dtype_name, "F32") && strcmp(x->dtype_name, "BF16") && strcmp(x->dtype_name, "F16")))
        return cdp_fail(CDP_ERR_INVALID, "%s: tensor %s: dtype %s, expected a float type", fpath, name,
                        x->dtype_name ? x->dtype_name : "?");
    return CDP_OK;
}

cdp_status cdp_ckpt_load(const char *path, const struct cdp_ckpt_info *info, struct cdp_model *const *models,
                         struct cdp_optimizer *const *opts, int n)
{
    CDP_ASSERT(path && info && (n == 0 || models) && n >= 0);
    cdp_status st;
    json_t *root = NULL;
    struct ckpt_part_cache pc = {0};
    struct stage sb = {NULL, 0};
    char *folder = ckpt_trimmed(path), *man = folder ? cdp_path_join(folder, MANIFEST) : NULL;
    if (!man) {
        free(folder);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    if ((st = ckpt_read_manifest(folder, &root))) goto fail;
    if ((st = ckpt_part_cache_init(&pc, folder, root))) goto fail;
    if (opts) {
        for (int k = 0; k < n; k++) {
            if (!opts[k]) continue;
            const char *mine = ckpt_optimizer_name(cdp_optimizer_type_of(opts[k]));
            if (strcmp(mine, info->optimizer)) {
                st = cdp_fail(CDP_ERR_INVALID, "%s: /train/optimizer/type is \"%s\", and the checkpoint holds the "
                              "state of \"%s\": it cannot continue this run's optimizer", man, mine, info->optimizer);
                goto fail;
            }
        }
    }
    if (info->step > INT_MAX) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: step %lld is beyond what the optimizer counts", man, (long long)info->step);
        goto fail;
    }
    json_t *tensors = json_object_get(root, "tensors");
    int lo = INT_MAX, hi = -1;
    const char *key;
    json_t *v;
    json_object_foreach(tensors, key, v) {
        int u = ckpt_unit_of(key);
        if (u >= 0 && u < lo) lo = u;
        if (u > hi) hi = u;
    }
    /* Everything is checked before anything is read, so that a failed load
     * leaves the models and optimizers as they were. */
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < n; k++) {
            struct cdp_model *m = models[k];
            struct cdp_optimizer *o = opts ? opts[k] : NULL;
            cdp_device_t dev = ckpt_staging_device(o);
            for (int i = 0; i < cdp_model_tensor_count(m); i++) {
                struct cdp_model_tensor *t = cdp_model_tensor(m, i);
                const char *part = json_string_value(json_object_get(tensors, t->name));
                if (!part) {
                    if (hi < 0)
                        st = cdp_fail(CDP_ERR_INVALID, "%s: no tensor %s (the checkpoint holds no weights)", man,
                                      t->name);
                    else
                        st = cdp_fail(CDP_ERR_INVALID, "%s: no tensor %s (the checkpoint's model has units %d..%d)",
                                      man, t->name, lo, hi);
                    goto fail;
                }
                struct cdp_safetensors_file *f;
                char fpath[4096], sname[128];
                if ((st = ckpt_part_get(&pc, part, &f, fpath, sizeof fpath))) goto fail;
                float *state[2] = {NULL, NULL};
                const char *prefix[2] = {NULL, NULL};
                uint64_t from = 0, count = 0; /* the state's part this optimizer holds */
                if (o) {
                    cdp_optimizer_state_range(o, m, i, &state[0], &state[1], &from, &count);
                    prefix[0] = cdp_optimizer_type_of(o) == CDP_OPT_ADAMW ? "optim.m." : "optim.velocity.";
                    prefix[1] = cdp_optimizer_type_of(o) == CDP_OPT_ADAMW ? "optim.v." : NULL;
                }
                for (int s = -1; s < 2; s++) {
                    if (s >= 0 && !prefix[s]) continue;
                    snprintf(sname, sizeof sname, "%s%s", s < 0 ? "" : prefix[s], t->name);
                    float *dst = s < 0 ? t->data : state[s]; /* device memory */
                    const uint64_t at = s < 0 ? 0 : from, k = s < 0 ? (uint64_t)t->numel : count;
                    if (pass == 0) st = check_tensor(f, fpath, sname, t->name, t);
                    else if (!k) st = CDP_OK;
                    else if (dev) st = load_to_device(f, fpath, sname, dev, dst, at, k, &sb);
                    else if (k == (uint64_t)t->numel)
                        st = cdp_safetensors_read_f32(f, sname, t->ndim, t->shape, dst); /* host visible: in place */
                    else st = cdp_safetensors_read_f32_range(f, sname, at, k, dst);
                    if (!st && pass == 1 && k && !dev) st = check_finite(fpath, sname, dst, k, at);
                    if (st) goto fail;
                }
            }
        }
    }
    if (opts)
        for (int k = 0; k < n; k++)
            if (opts[k]) cdp_optimizer_set_steps(opts[k], (int)info->step);
    CDP_INFO(CKPT, "loaded %s (step %lld) into %d model range%s", folder, (long long)info->step, n, n == 1 ? "" : "s");
fail:
    free(sb.p);
    ckpt_part_cache_free(&pc);
    json_decref(root);
    free(man);
    free(folder);
    return st;
}

