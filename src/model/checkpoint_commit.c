/* Checkpoints (model/checkpoint.h): the commit of a step (checksums, the
 * manifest, the rename), pruning, the checks before a run saves into a
 * folder, and the data file's signature. */
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

/* ---- commit ---------------------------------------------------------------------------- */

struct part_ent {
    char *name;  /* file name */
    long long bytes;
    char sha[65];
};

struct tensor_ent {
    const char *name; /* points into an open part */
    int part;
    int unit;
    int order; /* position over all parts, for a stable sort */
};

static int cmp_part_name(const void *a, const void *b)
{
    return strcmp(((const struct part_ent *)a)->name, ((const struct part_ent *)b)->name);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct tensor_ent *)a)->name, ((const struct tensor_ent *)b)->name);
}

static int cmp_tensor_unit(const void *a, const void *b)
{
    const struct tensor_ent *x = a, *y = b;
    if (x->unit != y->unit) return x->unit < y->unit ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Keeps the newest `keep` complete checkpoints and the one just committed;
 * removes older complete ones and incomplete ones below `step`. */
static void prune(const char *dir, int64_t step, int keep)
{
    struct ckpt_step_ent *e = NULL;
    int n = 0;
    if (ckpt_list_steps(dir, &e, &n)) {
        CDP_WARN(CKPT, "not removing old checkpoints: %s", cdp_last_error());
        return;
    }
    int complete = 0;
    for (int i = 0; i < n; i++) {
        int remove = 0;
        if (e[i].complete) remove = ++complete > keep && keep > 0 && e[i].step != step;
        else remove = e[i].partial && e[i].step < step; /* a committed folder without manifest is left as it is */
        if (!remove) continue;
        CDP_INFO(CKPT, "removing %s checkpoint %s", e[i].complete ? "old" : "incomplete", e[i].path);
        ckpt_remove_folder(e[i].path);
    }
    ckpt_free_steps(e, n);
}

cdp_status cdp_ckpt_check_no_later(const char *dir, int64_t step)
{
    struct ckpt_step_ent *e = NULL;
    int n = 0;
    cdp_status st = ckpt_list_steps(dir, &e, &n);
    if (st) return st;
    for (int i = 0; i < n && !st; i++) /* newest first */
        if (!e[i].partial && e[i].step > step)
            st = cdp_fail(CDP_ERR_INVALID, "%s: checkpoints after step %lld are there (the newest %s): this run would "
                          "save its steps over another history; give /train/checkpoint/dir another folder, or move "
                          "the later ones away", dir, (long long)step, e[i].path);
    ckpt_free_steps(e, n);
    return st;
}

cdp_status cdp_ckpt_check_fresh(const char *dir)
{
    struct ckpt_step_ent *e = NULL;
    int n = 0;
    cdp_status st = ckpt_list_steps(dir, &e, &n);
    if (st) return st;
    for (int i = 0; i < n && !st; i++) /* newest first */
        if (!e[i].partial)
            st = cdp_fail(CDP_ERR_INVALID, "%s holds checkpoints of an earlier run (the newest %s): this run starts "
                          "from step 0 and would save its steps beside them; continue that run with --resume, or "
                          "give /train/checkpoint/dir another folder, or move them away", dir, e[i].path);
    ckpt_free_steps(e, n);
    return st;
}

void cdp_ckpt_discard_incomplete_after(const char *dir, int64_t step)
{
    struct ckpt_step_ent *e = NULL;
    int n = 0;
    if (ckpt_list_steps(dir, &e, &n)) {
        CDP_WARN(CKPT, "not removing incomplete checkpoints: %s", cdp_last_error());
        return;
    }
    for (int i = 0; i < n; i++) {
        if (!e[i].partial || e[i].step <= step) continue;
        CDP_INFO(CKPT, "removing incomplete checkpoint %s", e[i].path);
        ckpt_remove_folder(e[i].path);
    }
    ckpt_free_steps(e, n);
}

cdp_status cdp_ckpt_commit(const char *dir, int64_t step, const struct cdp_ckpt_info *info, int keep)
{
    CDP_ASSERT(dir && info);
    cdp_status st = CDP_OK;
    char *root_dir = ckpt_trimmed(dir), *folder = NULL, *final = NULL, *text = NULL;
    struct part_ent *parts = NULL;
    struct cdp_safetensors_file **open = NULL;
    struct tensor_ent *ts = NULL;
    int np = 0, cap = 0, nt = 0, tcap = 0;
    json_t *root = NULL;
    DIR *d = NULL;
    if (!root_dir || !(folder = ckpt_partial_folder(root_dir, step)) || !(final = ckpt_step_folder(root_dir, step))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (ckpt_is_dir(final) || access(final, F_OK) == 0) {
        st = cdp_fail(CDP_ERR_INVALID, "%s exists: a committed checkpoint is never written over (this run resumed "
                      "from an earlier step of the same folder?); give /train/checkpoint/dir another folder, or "
                      "move that one away", final);
        goto fail;
    }
    if (memchr(info->optimizer, '\0', sizeof info->optimizer) == NULL ||
        (strcmp(info->optimizer, "adamw") && strcmp(info->optimizer, "sgd"))) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: checkpoint optimizer \"%.16s\": expected \"adamw\" or \"sgd\"", folder,
                      info->optimizer);
        goto fail;
    }
    if (!(d = opendir(folder))) {
        st = cdp_fail(errno == ENOENT ? CDP_ERR_INVALID : CDP_ERR_IO, "%s: cannot commit: %s", folder,
                      errno == ENOENT ? "no part of this step was written" : strerror(errno));
        goto fail;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !ends_with(de->d_name, PART_SUFFIX)) continue;
        if (np == cap) {
            cap = cap ? 2 * cap : 8;
            struct part_ent *n2 = realloc(parts, (size_t)cap * sizeof *parts);
            if (!n2) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                goto fail;
            }
            parts = n2;
        }
        memset(&parts[np], 0, sizeof parts[np]);
        if (!(parts[np].name = strdup(de->d_name))) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            goto fail;
        }
        np++;
    }
    closedir(d);
    d = NULL;
    if (!np) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: cannot commit: no part of this step was written", folder);
        goto fail;
    }
    qsort(parts, (size_t)np, sizeof *parts, cmp_part_name);
    if (!(open = calloc((size_t)np, sizeof *open))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    char step_s[24];
    snprintf(step_s, sizeof step_s, "%lld", (long long)step);
    for (int p = 0; p < np; p++) {
        char *path = cdp_path_join(folder, parts[p].name);
        if (!path) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            goto fail;
        }
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            st = cdp_fail(CDP_ERR_IO, "%s: not a readable file", path);
            free(path);
            goto fail;
        }
        parts[p].bytes = (long long)sb.st_size;
        if (!(st = cdp_sha256_file(path, parts[p].sha))) st = cdp_safetensors_open(path, &open[p]);
        if (!st) {
            const char *fmt = cdp_safetensors_metadata(open[p], "format"),
                       *ps = cdp_safetensors_metadata(open[p], "step");
            if (!fmt || strcmp(fmt, "cdphybrid-checkpoint-part") || !ps || strcmp(ps, step_s))
                st = cdp_fail(CDP_ERR_INVALID,
                              "%s: not a part of checkpoint step %s (its metadata says format %s, step %s)", path,
                              step_s, fmt ? fmt : "(none)", ps ? ps : "(none)");
        }
        if (!st && ckpt_run_id[0]) {
            /* two runs saving into one folder: a step of parts from both must not commit */
            const char *pr = cdp_safetensors_metadata(open[p], "run");
            if (!pr || strcmp(pr, ckpt_run_id))
                st = cdp_fail(CDP_ERR_INVALID, "%s: written by run %s, not by this run (%s): another job saves into "
                              "%s too; not committing step %s", path, pr ? pr : "(none)", ckpt_run_id, root_dir, step_s);
        }
        free(path);
        if (st) goto fail;
        for (int i = 0; i < cdp_safetensors_count(open[p]); i++) {
            const char *name = cdp_safetensors_at(open[p], i)->name;
            if (!strncmp(name, "optim.", 6)) continue;
            if (nt == tcap) {
                tcap = tcap ? 2 * tcap : 64;
                struct tensor_ent *n2 = realloc(ts, (size_t)tcap * sizeof *ts);
                if (!n2) {
                    st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                    goto fail;
                }
                ts = n2;
            }
            ts[nt] = (struct tensor_ent){name, p, ckpt_unit_of(name), nt};
            nt++;
        }
    }
    /* A tensor in two parts: a part left over from an earlier attempt at this
     * step under another plan. Which one is current cannot be told. */
    if (nt) qsort(ts, (size_t)nt, sizeof *ts, cmp_tensor_name);
    for (int i = 1; i < nt; i++) {
        if (strcmp(ts[i - 1].name, ts[i].name)) continue;
        st = cdp_fail(CDP_ERR_INVALID, "%s: tensor %s is in both %s and %s (a part left from an earlier attempt "
                      "at step %s?); remove the folder and save again", folder, ts[i].name,
                      parts[ts[i - 1].part].name, parts[ts[i].part].name, step_s);
        goto fail;
    }
    if (nt) qsort(ts, (size_t)nt, sizeof *ts, cmp_tensor_unit);

    json_t *files = json_array(), *tensors = json_object(), *plan = json_null();
    root = json_object();
    if (info->plan_json) {
        json_error_t jerr;
        json_decref(plan);
        if (!(plan = json_loads(info->plan_json, JSON_REJECT_DUPLICATES, &jerr)) || !json_is_object(plan)) {
            json_decref(files);
            json_decref(tensors);
            json_decref(plan);
            st = cdp_fail(CDP_ERR_INVALID, "%s: the plan given for the manifest is not a JSON object (%s)", folder,
                          plan ? "another type" : jerr.text);
            goto fail;
        }
    }
    int bad = !root || !files || !tensors;
    bad |= json_object_set_new(root, "format", json_string("cdphybrid-checkpoint"));
    bad |= json_object_set_new(root, "version", json_integer(MANIFEST_VERSION));
    bad |= json_object_set_new(root, "step", json_integer(step));
    bad |= json_object_set_new(root, "samples_seen", json_integer(info->samples_seen));
    bad |= json_object_set_new(root, "seed", json_integer((json_int_t)info->seed));
    bad |= json_object_set_new(root, "optimizer", json_string(info->optimizer));
    if (ckpt_run_id[0]) bad |= json_object_set_new(root, "run", json_string(ckpt_run_id));
    if (info->data_file[0]) bad |= json_object_set_new(root, "data_file", json_string(info->data_file));
    for (int p = 0; p < np; p++) {
        json_t *f = json_object();
        bad |= !f;
        bad |= json_object_set_new(f, "name", json_string(parts[p].name));
        bad |= json_object_set_new(f, "bytes", json_integer(parts[p].bytes));
        bad |= json_object_set_new(f, "sha256", json_string(parts[p].sha));
        bad |= json_array_append_new(files, f);
    }
    for (int i = 0; i < nt; i++) bad |= json_object_set_new(tensors, ts[i].name, json_string(parts[ts[i].part].name));
    bad |= json_object_set_new(root, "files", files);
    bad |= json_object_set_new(root, "tensors", tensors);
    bad |= json_object_set_new(root, "plan", plan);
    char sum[65];
    bad |= !bad && ckpt_manifest_sum(root, sum);
    bad |= json_object_set_new(root, "manifest_sha256", json_string(sum));
    if (bad || !(text = json_dumps(root, JSON_INDENT(2)))) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory building the manifest", folder);
        goto fail;
    }
    size_t tl = strlen(text);
    char *t2 = realloc(text, tl + 2);
    if (!t2) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    text = t2;
    memcpy(text + tl, "\n", 2);
    /* the step folder's own entry must be durable before the commit point */
    cdp_sync_dir(root_dir);
    if ((st = ckpt_write_atomic(folder, MANIFEST, text))) goto fail;
    /* the commit point: the complete save takes its name */
    if (rename(folder, final) != 0) {
        st = cdp_fail(CDP_ERR_IO, "%s: cannot commit it as %s: %s", folder, final, strerror(errno));
        goto fail;
    }
    cdp_sync_dir(root_dir);
    CDP_INFO(CKPT, "committed checkpoint %s (%d parts, %d tensors)", final, np, nt);
    prune(root_dir, step, keep);
fail:
    if (d) closedir(d);
    for (int p = 0; p < np; p++) {
        free(parts[p].name);
        if (open) cdp_safetensors_close(open[p]);
    }
    free(parts);
    free(open);
    free(ts);
    json_decref(root);
    free(text);
    free(folder);
    free(final);
    free(root_dir);
    return st;
}

void cdp_ckpt_data_signature(const char *path, char out[160])
{
    out[0] = '\0';
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    struct cdp_sha256 h;
    cdp_sha256_init(&h);
    unsigned char *buf = malloc(1 << 16);
    if (!buf) {
        fclose(f);
        return;
    }
    const long long mib = 1 << 20, size = (long long)sb.st_size;
    /* the first MiB, and the last (they overlap in a small file) */
    for (int part = 0; part < 2; part++) {
        const long long from = part == 0 ? 0 : (size > mib ? size - mib : 0);
        long long left = size - from < mib ? size - from : mib;
        if (fseeko(f, (off_t)from, SEEK_SET) != 0) break;
        while (left > 0) {
            const size_t got = fread(buf, 1, (size_t)(left < (1 << 16) ? left : (1 << 16)), f);
            if (!got) break;
            cdp_sha256_update(&h, buf, got);
            left -= (long long)got;
        }
    }
    fclose(f);
    free(buf);
    char hex[65];
    cdp_sha256_final(&h, hex);
    snprintf(out, 160, "bytes %lld sha256 %.16s", size, hex);
}

