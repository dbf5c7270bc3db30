/* Checkpoints of a running layout: replica 0's ranks write their stages' parts
 * in parallel (under ZeRO-1 with the optimizer state gathered from the stage's
 * replicas, exec_ckpt_gather.c) and rank 0 commits the step (src/model/checkpoint.h); a resume
 * loads every rank's ranges (and its shard of the state) from the newest
 * complete checkpoint, whatever the layout that wrote it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/file.h"
#include "model/checkpoint.h"
#include "pipeline/run/exec_internal.h"

/* The lock file of a checkpoint folder (docs/checkpoints.md, "One run per folder"). */
#define CKPT_LOCK ".cdphybrid-checkpoint.lock"

cdp_status cdp_exec_check_checkpoint_dir(const struct cdp_plan *p, const char *resume)
{
    if (!p->train.checkpoint.dir || resume) return CDP_OK;
    cdp_status st = cdp_ckpt_check_fresh(p->train.checkpoint.dir);
    return st ? cdp_error_context(st, "%s: /train/checkpoint/dir", p->source) : CDP_OK;
}

/* 32 hex digits from the kernel's random source (the time and pid where it has none). */
static void new_run_id(char out[33])
{
    unsigned char b[16] = {0};
    const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, b, sizeof b) : -1;
    if (fd >= 0) close(fd);
    if (got != (ssize_t)sizeof b) {
        const uint64_t t = cdp_time_ns() ^ ((uint64_t)getpid() << 32);
        memcpy(b, &t, sizeof t);
    }
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

cdp_status cdp_exec_hold_checkpoint_dir(struct exec *e)
{
    const struct cdp_plan *p = e->plan;
    if (!p->train.checkpoint.dir) return CDP_OK;
    char run[40] = "";
    cdp_status st = CDP_OK;
    if (e->rank == 0) {
        /* the folder exists from here on (mkdir -p): its lock file lives in it */
        char path[4096];
        snprintf(path, sizeof path, "%s", p->train.checkpoint.dir);
        for (char *c = path + 1; !st && *c; c++) {
            if (*c != '/') continue;
            *c = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                st = cdp_fail(CDP_ERR_IO, "cannot make %s: %s", path, strerror(errno));
            *c = '/';
        }
        if (!st && mkdir(path, 0755) != 0 && errno != EEXIST)
            st = cdp_fail(CDP_ERR_IO, "cannot make %s: %s", path, strerror(errno));
        if (!st) st = cdp_dir_lock(p->train.checkpoint.dir, CKPT_LOCK, "a checkpoint folder", &e->ckpt_lock);
        if (st) cdp_error_context(st, "%s: /train/checkpoint/dir", p->source);
        else new_run_id(run);
    }
    /* every rank's parts carry rank 0's run id; "" says rank 0 could not take the folder */
    cdp_status bst = e->size > 1 ? cdp_comm_bcast_bytes(e->world, run, sizeof run, 0, e->timeout) : CDP_OK;
    if (st) return st;
    if (bst) return bst;
    if (!run[0])
        return cdp_fail(CDP_ERR_INVALID, "%s: /train/checkpoint/dir: rank 0 could not take the folder (its message "
                        "says why)", p->source);
    cdp_ckpt_set_run(run);
    CDP_DEBUG(CKPT, "run %s holds %s", run, p->train.checkpoint.dir);
    return CDP_OK;
}

/* Replica 0's ranks each write the part of their stage; rank 0 commits the
 * checkpoint once every part is on disk. */
/* The models and optimizers of this rank's chunks, as the checkpoint calls
 * take them (both malloc'd; the caller frees them, also on failure). */
static cdp_status chunk_lists(const struct exec *e, struct cdp_model ***models, struct cdp_optimizer ***opts)
{
    *models = malloc((size_t)e->v * sizeof **models);
    *opts = malloc((size_t)e->v * sizeof **opts);
    if (!*models || !*opts) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < e->v; k++) {
        (*models)[k] = e->ch[k].model;
        (*opts)[k] = e->ch[k].opt;
    }
    return CDP_OK;
}

cdp_status cdp_exec_save_checkpoint(struct exec *e, int step)
{
    const struct cdp_plan *p = e->plan;
    cdp_status st = CDP_OK;
    snprintf(cdp_exec_where_buf, sizeof cdp_exec_where_buf,
             "rank %d/%d (stage %d, replica %d), step %d: writing a checkpoint", e->rank, e->size, e->s, e->r, step);
    cdp_fault_in_save(&e->fault, e->rank, step, "part");
    /* ZeRO-1: the stage's other replicas hand replica 0 their shards of the state as it writes */
    if (e->t > 1 && (e->r == 0 || e->zero)) {
        char part[32];
        snprintf(part, sizeof part, "stage-%d", e->s);
        st = cdp_exec_ckpt_write_tensor(e, step, part);
    } else if (e->r == 0 || e->zero) {
        struct cdp_model **models = NULL;
        struct cdp_optimizer **opts = NULL;
        st = chunk_lists(e, &models, &opts);
        char part[32];
        snprintf(part, sizeof part, "stage-%d", e->s);
        if (!st && !e->zero) st = cdp_ckpt_write_part(p->train.checkpoint.dir, step, part, models, opts, e->v);
        else if (!st && e->r == 0)
            st = cdp_exec_ckpt_write_gathered(p->train.checkpoint.dir, step, part, models, opts, e->v,
                                              cdp_comm_host(e->dp), e->timeout);
        else if (!st) st = cdp_exec_ckpt_send_shards(models, opts, e->v, cdp_comm_host(e->dp), e->timeout);
        free(models);
        free(opts);
    }
    cdp_fault_in_save(&e->fault, e->rank, step, "commit");
    if (!st) st = cdp_comm_barrier(e->world, e->timeout);
    if (!st && e->rank == 0) {
        struct cdp_ckpt_info info = {.step = step, .samples_seen = e->sample_base + (int64_t)(step - e->step0) * e->G,
                                     .seed = p->train.seed};
        snprintf(info.optimizer, sizeof info.optimizer, "%s",
                 p->train.optimizer.type == CDP_OPT_SGD ? "sgd" : "adamw");
        cdp_ckpt_data_signature(p->data.path, info.data_file);
        if (!(st = cdp_plan_to_json(p, &info.plan_json)))
            st = cdp_ckpt_commit(p->train.checkpoint.dir, step, &info, (int)p->train.checkpoint.keep);
        free(info.plan_json);
    }
    return st;
}

/* ---- what a resume checks: the writer's plan against this one ------------------------ */

/* What must be the same to continue a run (the rest, steps, layout, outputs,
 * may change): the model, the data, and what makes the optimizer's state mean
 * what it meant. */
static const char *const kept[] = {"/model", "/data", "/train/seed", "/train/optimizer", NULL};

/* Whether the comma-separated list allows path (itself or a key above it). */
static int allowed(const char *list, const char *path)
{
    for (const char *c = list; c && *c;) {
        const char *end = strchr(c, ',');
        size_t n = end ? (size_t)(end - c) : strlen(c);
        while (n && c[n - 1] == '/') n--;
        if (n && !strncmp(path, c, n) && (path[n] == '\0' || path[n] == '/')) return 1;
        c += n;
        while (*c && *c != ',') c++;
        if (*c == ',') c++;
    }
    return 0;
}

static void value_text(const json_t *v, char *buf, size_t cap)
{
    char *t = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    snprintf(buf, cap, "%s", t ? t : "(none)");
    if (strlen(buf) > 60) snprintf(buf + 57, cap - 57, "...");
    free(t);
}

/* The first path under `path` where a and b differ and that list does not
 * allow: written to out (with both values), 1; else 0. */
static int first_difference(const json_t *a, const json_t *b, const char *path, const char *list, char *out,
                            size_t cap)
{
    if (json_is_object(a) && json_is_object(b)) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)a, key, v) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s", path, key);
            if (first_difference(v, json_object_get(b, key), sub, list, out, cap)) return 1;
        }
        json_object_foreach((json_t *)b, key, v) {
            if (json_object_get(a, key)) continue;
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s", path, key);
            if (first_difference(NULL, v, sub, list, out, cap)) return 1;
        }
        return 0;
    }
    if (a && b && json_equal((json_t *)a, (json_t *)b)) return 0;
    if (allowed(list, path)) return 0;
    char va[80], vb[80];
    value_text(a, va, sizeof va);
    value_text(b, vb, sizeof vb);
    snprintf(out, cap, "%s is %s in the checkpoint's plan and %s in this one", path, va, vb);
    return 1;
}

/* Refuses a resume under another model, other data or another optimizer
 * setting than the checkpoint's writer had, naming the key, unless
 * --resume-allow lists it. */
static cdp_status check_same_run(const struct exec *e, const char *path, const struct cdp_ckpt_info *info)
{
    const struct cdp_plan *p = e->plan;
    if (!info->plan_json) return CDP_OK; /* a checkpoint written without its plan: nothing to compare */
    char *text = NULL;
    cdp_status st = cdp_plan_to_json(p, &text);
    if (st) return st;
    json_t *was = json_loads(info->plan_json, 0, NULL), *now = json_loads(text, 0, NULL);
    free(text);
    char diff[400] = "";
    int differs = 0;
    for (int i = 0; was && now && kept[i] && !differs; i++) {
        const json_t *a = was, *b = now;
        char key[64];
        snprintf(key, sizeof key, "%s", kept[i]);
        for (char *tok = strtok(key, "/"); tok; tok = strtok(NULL, "/")) {
            a = json_object_get(a, tok);
            b = json_object_get(b, tok);
        }
        if (!a && !b) continue;
        differs = first_difference(a, b, kept[i], e->resume_allow, diff, sizeof diff);
    }
    json_decref(was);
    json_decref(now);
    if (!differs && info->data_file[0] && !allowed(e->resume_allow, "/data/path")) {
        char sig[160];
        cdp_ckpt_data_signature(p->data.path, sig);
        if (strcmp(sig, info->data_file)) {
            snprintf(diff, sizeof diff, "/data/path: %s is not the file the checkpoint was trained on (then %s, now "
                     "%s)", p->data.path ? p->data.path : "(none)", info->data_file, sig[0] ? sig : "not a file");
            differs = 1;
        }
    }
    if (!differs) return CDP_OK;
    return cdp_fail(CDP_ERR_INVALID, "%s: %s: resuming would train another run on this one's weights; resume under "
                    "the checkpoint's plan, or give --resume-allow %.*s to resume anyway", path, diff,
                    (int)strcspn(diff, " :"), diff);
}

/* Every rank loads its ranges' tensors and optimizer state from the newest
 * complete checkpoint; training continues at the step after it. */
cdp_status cdp_exec_resume(struct exec *e, const char *dir)
{
    char *path = NULL;
    struct cdp_ckpt_info info = {0};
    cdp_status st = cdp_ckpt_find_latest(dir, &path, &info);
    if (st) return st;
    struct cdp_model **models = NULL;
    struct cdp_optimizer **opts = NULL;
    st = check_same_run(e, path, &info);
    if (!st) st = chunk_lists(e, &models, &opts);
    if (!st && e->t > 1) st = cdp_exec_ckpt_load_tensor(e, path, &info);
    else if (!st) st = cdp_ckpt_load(path, &info, models, opts, e->v);
    if (!st && info.step >= e->plan->train.steps)
        st = cdp_fail(CDP_ERR_INVALID, "%s: the checkpoint is at step %lld and /train/steps is %lld: nothing "
                      "left to train", path, (long long)info.step, (long long)e->plan->train.steps);
    /* every rank has read its tensors before rank 0 tidies the folder */
    if (!st) st = cdp_comm_barrier(e->world, e->timeout);
    if (!st && e->plan->train.checkpoint.dir) st = cdp_ckpt_check_no_later(e->plan->train.checkpoint.dir, info.step);
    if (!st && e->rank == 0 && e->plan->train.checkpoint.dir)
        cdp_ckpt_discard_incomplete_after(e->plan->train.checkpoint.dir, info.step);
    if (!st) {
        e->step0 = (int)info.step;
        e->sample_base = info.samples_seen;
        CDP_INFO(CKPT, "resuming from %s (step %lld, %lld samples seen)", path, (long long)info.step,
                 (long long)info.samples_seen);
        if (e->rank == 0 && e->out)
            fprintf(e->out, "resuming from %s at step %lld\n", path, (long long)info.step);
    }
    free(models);
    free(opts);
    free(path);
    cdp_ckpt_info_free(&info);
    return st;
}
