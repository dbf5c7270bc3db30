/* Checkpoints: per-stage safetensors parts, a manifest with SHA-256 checksums
 * written last as the commit point, pruning of old and incomplete folders,
 * verification on load, and export as one safetensors file. SHA-256 (FIPS
 * 180-4) lives here too: it is only used to checksum checkpoint files. */
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
#include "comm/comm.h"
#include "model/hf.h"
#include "model/hf_gpt2.h"
#include "model/safetensors.h"

#define MANIFEST "manifest.json"
/* 2: the manifest carries its own checksum (manifest_sha256); 1 (read, with a
 * warning) did not */
#define MANIFEST_VERSION 2
#define PART_SUFFIX ".safetensors"

/* The run this process's parts and commits belong to (cdp_ckpt_set_run). */
static char run_id[40];

void cdp_ckpt_set_run(const char *id) { snprintf(run_id, sizeof run_id, "%s", id ? id : ""); }

/* ---- paths and folders ------------------------------------------------------------ */

/* A copy of a path without trailing slashes (except a lone "/"). */
static char *trimmed(const char *p)
{
    char *s = strdup(p);
    if (!s) return NULL;
    size_t n = strlen(s);
    while (n > 1 && s[n - 1] == '/') s[--n] = '\0';
    return s;
}

static char *step_folder(const char *dir, int64_t step)
{
    char name[40];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    return cdp_path_join(dir, name);
}

/* Where a step's save is written until it is complete: a hidden folder,
 * renamed to step_folder's name by the commit (so a folder named step-N is
 * only ever a complete save, and a save never writes into one). */
#define PARTIAL_SUFFIX ".partial"
static char *partial_folder(const char *dir, int64_t step)
{
    char name[48];
    snprintf(name, sizeof name, ".step-%08lld" PARTIAL_SUFFIX, (long long)step);
    return cdp_path_join(dir, name);
}

/* "step-<digits>" -> step, *partial 0; ".step-<digits>.partial" -> step,
 * *partial 1; 0 when the name is anything else. */
static int parse_folder_name(const char *name, int64_t *step, int *partial)
{
    *partial = name[0] == '.';
    const char *p = name + *partial;
    if (strncmp(p, "step-", 5) || !isdigit((unsigned char)p[5])) return 0;
    int64_t v = 0;
    for (p += 5; *p && isdigit((unsigned char)*p); p++) {
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*p - '0');
    }
    if (*partial ? strcmp(p, PARTIAL_SUFFIX) : *p != '\0') return 0;
    *step = v;
    return 1;
}

static int parse_step_name(const char *name, int64_t *step)
{
    int partial = 0;
    return parse_folder_name(name, step, &partial) && !partial;
}

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* mkdir that accepts an existing folder (another rank may make it at the same time). */
static cdp_status make_dir(const char *path)
{
    if (mkdir(path, 0755) == 0 || (errno == EEXIST && is_dir(path))) return CDP_OK;
    if (errno == EEXIST) return cdp_fail(CDP_ERR_IO, "%s: exists and is not a folder", path);
    return cdp_fail(CDP_ERR_IO, "%s: cannot make the folder: %s", path, strerror(errno));
}

/* mkdir -p */
static cdp_status make_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = CDP_OK;
    for (char *q = p + 1; *q && !st; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (!is_dir(p)) st = make_dir(p);
        *q = '/';
    }
    if (!st) st = make_dir(p);
    free(p);
    return st;
}

struct step_ent {
    int64_t step;
    int partial;  /* a save not yet committed (.step-N.partial) */
    int complete; /* committed and has its manifest */
    int broken;   /* a symbolic link to nothing (or to no folder) */
    char *path;
};

static int cmp_step_desc(const void *a, const void *b)
{
    const struct step_ent *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

static void free_steps(struct step_ent *e, int n)
{
    for (int i = 0; i < n; i++) free(e[i].path);
    free(e);
}

/* The step folders under dir, newest first. A missing dir is an empty list. */
static cdp_status list_steps(const char *dir, struct step_ent **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return CDP_OK;
        return cdp_fail(CDP_ERR_IO, "%s: cannot list the folder: %s", dir, strerror(errno));
    }
    struct step_ent *e = NULL;
    int n = 0, cap = 0;
    cdp_status st = CDP_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t step;
        int partial = 0;
        if (!parse_folder_name(de->d_name, &step, &partial)) continue;
        char *path = cdp_path_join(dir, de->d_name);
        char *man = path ? cdp_path_join(path, MANIFEST) : NULL;
        if (!man) {
            free(path);
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            break;
        }
        struct stat lsb;
        /* a step folder that is a link to nothing is listed, so that the
         * newest checkpoint gone is an error and not an older one's resume */
        const int broken = lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode) && !is_dir(path) && !partial;
        if (!broken && !is_dir(path)) {
            free(path);
            free(man);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            struct step_ent *ne = realloc(e, (size_t)cap * sizeof *e);
            if (!ne) {
                free(path);
                free(man);
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                break;
            }
            e = ne;
        }
        e[n].step = step;
        e[n].partial = partial;
        e[n].complete = !partial && !broken && is_file(man);
        e[n].broken = broken;
        e[n].path = path;
        n++;
        free(man);
    }
    closedir(d);
    if (st) {
        free_steps(e, n);
        return st;
    }
    if (n) qsort(e, (size_t)n, sizeof *e, cmp_step_desc);
    *out = e;
    *n_out = n;
    return CDP_OK;
}

/* Removes a checkpoint folder: first renamed out of sight (".removing-NAME",
 * which no listing takes for a checkpoint), so that a crash halfway leaves
 * neither a complete-looking folder with parts missing nor a committed one
 * without its manifest. Failures are warnings: the new checkpoint is in place. */
static void remove_folder(const char *path)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const size_t dl = (size_t)(base - path), n = strlen(path) + 16;
    char *gone = malloc(n);
    if (gone) snprintf(gone, n, "%.*s.removing-%s", (int)dl, path, base);
    const char *at = gone && rename(path, gone) == 0 ? gone : path;
    DIR *d = opendir(at);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char *f = cdp_path_join(at, de->d_name);
            if (f && unlink(f) != 0) CDP_WARN(CKPT, "cannot remove %s: %s", f, strerror(errno));
            free(f);
        }
        closedir(d);
    }
    if (rmdir(at) != 0) CDP_WARN(CKPT, "cannot remove the folder %s: %s", at, strerror(errno));
    free(gone);
}

/* ---- device memory ---------------------------------------------------------------------- */

/* Tensors in memory the host cannot address (a GPU's) go through host memory
 * in pieces of at most this many bytes, so that saving or loading holds one
 * piece on the host, never a copy of the parameters or the state. */
#define STAGE_BYTES ((uint64_t)8 << 20)

/* Where a model range's tensors and optimizer state live when the host cannot
 * address them: its optimizer's device (the model's own); NULL for memory the
 * host reads and writes in place (the cpu backend), and for a range given
 * without an optimizer (see checkpoint.h). */
static cdp_device_t staging_device(struct cdp_optimizer *o)
{
    cdp_device_t dev = o ? cdp_optimizer_device(o) : NULL;
    return dev && !cdp_device_host_visible(dev) ? dev : NULL;
}

/* A ZeRO-1 shard's part of one tensor's state, in host memory: where it lies
 * (a device pointer), how many floats, and the device to copy it from (NULL:
 * host visible). */
static cdp_status shard_piece(struct cdp_optimizer *o, struct cdp_model *m, int i, int s, float **host,
                              uint64_t *count)
{
    float *a, *b;
    uint64_t from;
    cdp_optimizer_state_range(o, m, i, &a, &b, &from, count);
    const float *src = s == 0 ? a : b;
    *host = malloc((size_t)*count * 4 + 1);
    if (!*host) return cdp_fail(CDP_ERR_NOMEM, "out of memory gathering optimizer state");
    if (!*count) return CDP_OK;
    cdp_device_t dev = staging_device(o);
    if (!dev) {
        memcpy(*host, src, (size_t)*count * 4);
        return CDP_OK;
    }
    return cdp_device_read(dev, *host, src, *count * 4);
}

/* What a sharded state tensor of a part is: the optimizer, model, tensor and
 * state (0: m or velocity, 1: v) whose pieces the stage's replicas gather. */
struct gathered {
    struct cdp_optimizer *o;
    struct cdp_model *m;
    int i, s;
};

/* cdp_safetensors_write_staged's source: tensor i of ts is on devs[i] (NULL:
 * host memory), or, where g[i].o is set, gathered from the replicas of group
 * (one tensor at a time, when its first piece is asked for). */
struct fetch_ctx {
    const struct cdp_safetensors_tensor *ts;
    const cdp_device_t *devs;
    const struct gathered *g;
    cdp_comm_t group;
    double timeout;
    uint8_t *held; /* the tensor being written, gathered */
};

/* Every replica's piece of state tensor g, in rank order (the shards are in
 * rank order, so the pieces make the tensor): at rank 0 into *out (malloc'd,
 * the tensor's bytes); the others send theirs. */
static cdp_status gather_state(const struct gathered *g, cdp_comm_t group, double timeout, uint64_t nbytes,
                               uint8_t **out)
{
    float *mine = NULL;
    uint64_t count = 0;
    cdp_status st = shard_piece(g->o, g->m, g->i, g->s, &mine, &count);
    void *all = NULL;
    size_t *lens = NULL;
    if (!st) st = cdp_comm_gather_bytes(group, mine, (size_t)count * 4, &all, &lens, timeout);
    free(mine);
    if (!st && out) {
        uint64_t total = 0;
        for (int r = 0; r < cdp_comm_size(group); r++) total += lens[r];
        if (total != nbytes)
            st = cdp_fail(CDP_ERR_INTERNAL, "the replicas' shards hold %llu bytes of a %llu-byte tensor",
                          (unsigned long long)total, (unsigned long long)nbytes);
        else *out = all, all = NULL;
    }
    free(lens);
    free(all);
    return st;
}

static cdp_status fetch_tensor(void *ctx, const struct cdp_safetensors_tensor *t, uint64_t offset, void *dst,
                               uint64_t n)
{
    struct fetch_ctx *c = ctx;
    const struct gathered *g = c->g ? &c->g[t - c->ts] : NULL;
    if (g && g->o) {
        if (offset == 0) {
            free(c->held);
            c->held = NULL;
            cdp_status st = gather_state(g, c->group, c->timeout, t->nbytes, &c->held);
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

/* ---- writing a part ------------------------------------------------------------------ */

static int valid_part_name(const char *part)
{
    return part && *part && part[0] != '.' && !strchr(part, '/') && strlen(part) < 200;
}

/* Whether o holds only a shard of its model's state (ZeRO-1). */
static int sharded(struct cdp_optimizer *o, struct cdp_model *m)
{
    uint64_t off, len;
    if (!o) return 0;
    cdp_optimizer_shard(o, &off, &len);
    return len != (uint64_t)cdp_model_param_floats(m);
}

static cdp_status write_part(const char *dir, int64_t step, const char *part, struct cdp_model *const *models,
                             struct cdp_optimizer *const *opts, int n, cdp_comm_t group, double timeout);

cdp_status cdp_ckpt_write_part(const char *dir, int64_t step, const char *part, struct cdp_model *const *models,
                               struct cdp_optimizer *const *opts, int n)
{
    return write_part(dir, step, part, models, opts, n, NULL, 0);
}

cdp_status cdp_ckpt_write_part_gathered(const char *dir, int64_t step, const char *part,
                                        struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                        cdp_comm_t group, double timeout_s)
{
    return write_part(dir, step, part, models, opts, n, group, timeout_s);
}

cdp_status cdp_ckpt_send_shards(struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                cdp_comm_t group, double timeout_s)
{
    cdp_status st = CDP_OK;
    for (int k = 0; k < n && !st; k++) {
        struct cdp_model *m = models[k];
        struct cdp_optimizer *o = opts[k];
        if (!sharded(o, m)) continue;
        const int first = cdp_model_unit(m, 0)->index, states = cdp_optimizer_type_of(o) == CDP_OPT_ADAMW ? 2 : 1;
        for (int i = 0; i < cdp_model_tensor_count(m) && !st; i++) {
            if (cdp_model_tensor(m, i)->unit < first) continue; /* as write_part: a tied copy is not written */
            for (int s = 0; s < states && !st; s++) {
                const struct gathered g = {o, m, i, s};
                st = gather_state(&g, group, timeout_s, 0, NULL);
            }
        }
    }
    return st;
}

static cdp_status write_part(const char *dir, int64_t step, const char *part, struct cdp_model *const *models,
                             struct cdp_optimizer *const *opts, int n, cdp_comm_t group, double timeout)
{
    CDP_ASSERT(dir && (n == 0 || models) && n >= 0);
    if (!valid_part_name(part))
        return cdp_fail(CDP_ERR_INVALID, "checkpoint part name \"%s\": expected a plain file name", part ? part : "");
    if (step < 0) return cdp_fail(CDP_ERR_INVALID, "checkpoint step %lld: expected >= 0", (long long)step);
    cdp_status st;
    struct cdp_safetensors_tensor *ts = NULL;
    cdp_device_t *devs = NULL;
    struct gathered *gs = NULL;
    char (*names)[96] = NULL;
    char *root = trimmed(dir), *folder = NULL, *path = NULL;
    if (!root) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if ((st = make_dirs(root))) goto fail;
    if (!(folder = partial_folder(root, step))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = make_dir(folder))) goto fail;

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
        cdp_device_t dev = staging_device(o);
        staged |= dev != NULL;
        const int first = cdp_model_unit(m, 0)->index;
        for (int i = 0; i < cdp_model_tensor_count(m); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(m, i);
            if (t->unit < first) continue; /* a tied copy: its owner's part holds it */
            float *state[2] = {NULL, NULL};
            static const char *const adam_names[2] = {"optim.m.", "optim.v."};
            static const char *const sgd_names[2] = {"optim.velocity.", NULL};
            const char *const *snames = NULL;
            const int shards = o && sharded(o, m);
            if (shards && !group) {
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
    const char *meta[6] = {"format", "cdphybrid-checkpoint-part", "step", step_s, "run", run_id};
    const int n_meta = run_id[0] ? 3 : 2;
    /* Host-visible memory is written from where it lies; a device's is copied
     * out piece by piece into one bounded host buffer. */
    struct fetch_ctx fc = {ts, devs, gs, group, timeout, NULL};
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

/* ---- the manifest -------------------------------------------------------------------- */

/* Writes text to folder/name atomically (core/file.h). */
static cdp_status write_atomic(const char *folder, const char *name, const char *text)
{
    char *path = cdp_path_join(folder, name);
    if (!path) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = cdp_write_file_atomic(path, text, strlen(text));
    free(path);
    return st;
}

/* "layers.<N>.<param>" -> N; -1 otherwise. */
static int unit_of(const char *name)
{
    if (strncmp(name, "layers.", 7) || !isdigit((unsigned char)name[7])) return -1;
    char *end;
    long v = strtol(name + 7, &end, 10);
    return *end == '.' && v <= INT_MAX ? (int)v : -1;
}

static int is_hex64(const char *s)
{
    if (strlen(s) != 64) return 0;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p) && !(*p >= 'a' && *p <= 'f')) return 0;
    return 1;
}

static const char *optimizer_name(enum cdp_optimizer_type t) { return t == CDP_OPT_ADAMW ? "adamw" : "sgd"; }

/* The manifest's own checksum: SHA-256 of root without manifest_sha256, as
 * compact JSON with sorted keys (what is read back dumps the same: jansson
 * writes reals with 17 digits). Nonzero when out of memory. */
static int manifest_sum(const json_t *root, char hex[65])
{
    json_t *copy = json_copy((json_t *)root);
    if (!copy) return 1;
    json_object_del(copy, "manifest_sha256");
    char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(copy);
    if (!text) return 1;
    struct cdp_sha256 h;
    cdp_sha256_init(&h);
    cdp_sha256_update(&h, text, strlen(text));
    cdp_sha256_final(&h, hex);
    free(text);
    return 0;
}

/* Reads folder/manifest.json and checks every key and its type, and (version
 * 2) its own checksum; *root on success. */
static cdp_status read_manifest(const char *folder, json_t **root_out)
{
    char *path = cdp_path_join(folder, MANIFEST);
    if (!path) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cdp_status st = CDP_OK;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (!is_file(path)) st = cdp_fail(CDP_ERR_INVALID, "%s: missing: the checkpoint is incomplete", path);
        else st = cdp_fail(CDP_ERR_INVALID, "%s: not valid JSON (line %d: %s)", path, jerr.line, jerr.text);
        goto fail;
    }
    const struct cdp_json_in in = {.file = path};
    static const char *const optimizers[] = {"adamw", "sgd", NULL};
    int64_t x = 0;
    int which = 0;
    char p[CDP_JSON_PTR_CAP], fp[CDP_JSON_PTR_CAP];
#define CHECK(call)                                 \
    do {                                            \
        if ((st = (call))) goto fail;               \
    } while (0)
    if (!json_is_object(root)) CHECK(cdp_json_expected(&in, "(top)", "a JSON object", root));
    static const char *const keys[] = {"format", "version", "step", "samples_seen", "seed",
                                       "optimizer", "files", "tensors", "plan", NULL};
    for (int i = 0; keys[i]; i++) {
        cdp_json_ptr_key(p, "", keys[i]);
        if (!json_object_get(root, keys[i])) CHECK(cdp_json_fail(&in, p, "missing"));
    }
    json_t *v = json_object_get(root, "format");
    if (!json_is_string(v) || strcmp(json_string_value(v), "cdphybrid-checkpoint"))
        CHECK(cdp_json_expected(&in, "/format", "\"cdphybrid-checkpoint\"", v));
    v = json_object_get(root, "version");
    CHECK(cdp_json_int(&in, v, "/version", 1, INT64_MAX, 0, NULL, &x));
    if (x > MANIFEST_VERSION)
        CHECK(cdp_json_fail(&in, "/version", "%lld is newer than this cdphybrid reads (%d)", (long long)x,
                            MANIFEST_VERSION));
    v = json_object_get(root, "manifest_sha256");
    if (x >= 2) {
        char have[65];
        if (!json_is_string(v) || !is_hex64(json_string_value(v)))
            CHECK(cdp_json_expected(&in, "/manifest_sha256", "64 lowercase hex digits", v));
        if (manifest_sum(root, have)) CHECK(cdp_fail(CDP_ERR_NOMEM, "out of memory"));
        if (strcmp(have, json_string_value(v)))
            CHECK(cdp_json_fail(&in, "/manifest_sha256", "%s does not match the manifest's contents (%s): it was "
                                "edited or is corrupt", json_string_value(v), have));
    } else {
        CDP_WARN(CKPT, "%s: version 1 has no checksum of its own: its step and position are not verified", path);
    }
    CHECK(cdp_json_int(&in, json_object_get(root, "step"), "/step", 0, INT64_MAX, 0, NULL, &x));
    CHECK(cdp_json_int(&in, json_object_get(root, "samples_seen"), "/samples_seen", 0, INT64_MAX, 0, NULL, &x));
    CHECK(cdp_json_int(&in, json_object_get(root, "seed"), "/seed", INT64_MIN, INT64_MAX, 0, "an integer", &x));
    CHECK(cdp_json_enum(&in, json_object_get(root, "optimizer"), "/optimizer", optimizers, &which));
    v = json_object_get(root, "plan");
    if (!json_is_object(v) && !json_is_null(v)) CHECK(cdp_json_expected(&in, "/plan", "an object or null", v));
    json_t *files = json_object_get(root, "files");
    if (!json_is_array(files)) CHECK(cdp_json_expected(&in, "/files", "an array", files));
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        cdp_json_ptr_index(fp, "/files", i);
        if (!json_is_object(f)) CHECK(cdp_json_expected(&in, fp, "an object", f));
        json_t *name = json_object_get(f, "name"), *sha = json_object_get(f, "sha256");
        cdp_json_ptr_key(p, fp, "name");
        if (!json_is_string(name) || !valid_part_name(json_string_value(name)))
            CHECK(cdp_json_expected(&in, p, "a file name", name));
        cdp_json_ptr_key(p, fp, "bytes");
        CHECK(cdp_json_int(&in, json_object_get(f, "bytes"), p, 0, INT64_MAX, 0, NULL, &x));
        cdp_json_ptr_key(p, fp, "sha256");
        if (!json_is_string(sha) || !is_hex64(json_string_value(sha)))
            CHECK(cdp_json_expected(&in, p, "64 lowercase hex digits", sha));
    }
    json_t *tensors = json_object_get(root, "tensors");
    if (!json_is_object(tensors)) CHECK(cdp_json_expected(&in, "/tensors", "an object", tensors));
    const char *key;
    json_object_foreach(tensors, key, v) {
        int listed = 0;
        if (json_is_string(v)) {
            json_array_foreach(files, i, f) {
                if (!strcmp(json_string_value(json_object_get(f, "name")), json_string_value(v))) listed = 1;
            }
        }
        cdp_json_ptr_key(p, "/tensors", key);
        if (!listed) CHECK(cdp_json_expected(&in, p, "the name of a file in /files", v));
    }
#undef CHECK
    free(path);
    *root_out = root;
    return CDP_OK;
fail:
    json_decref(root);
    free(path);
    return st;
}

/* Every file of the manifest has its size and checksum. */
static cdp_status verify_files(const char *folder, json_t *root)
{
    json_t *files = json_object_get(root, "files"), *f;
    size_t i;
    json_array_foreach(files, i, f) {
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *want = json_string_value(json_object_get(f, "sha256"));
        long long bytes = (long long)json_integer_value(json_object_get(f, "bytes"));
        char *path = cdp_path_join(folder, name);
        if (!path) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        struct stat sb;
        if (stat(path, &sb) != 0) {
            cdp_status st = errno == ENOENT
                                ? cdp_fail(CDP_ERR_INVALID, "%s is missing (the manifest lists it)", path)
                                : cdp_fail(CDP_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
            free(path);
            return st;
        }
        if ((long long)sb.st_size != bytes) {
            cdp_status st = cdp_fail(CDP_ERR_INVALID, "%s: %s: %lld bytes, the manifest says %lld", path,
                                     (long long)sb.st_size < bytes ? "truncated" : "size mismatch",
                                     (long long)sb.st_size, bytes);
            free(path);
            return st;
        }
        char have[65];
        cdp_status st = cdp_sha256_file(path, have);
        if (!st && strcmp(have, want))
            st = cdp_fail(CDP_ERR_INVALID, "%s: checksum mismatch (manifest says %s, file has %s)", path, want, have);
        free(path);
        if (st) return st;
    }
    return CDP_OK;
}

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
    struct step_ent *e = NULL;
    int n = 0;
    if (list_steps(dir, &e, &n)) {
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
        remove_folder(e[i].path);
    }
    free_steps(e, n);
}

cdp_status cdp_ckpt_check_no_later(const char *dir, int64_t step)
{
    struct step_ent *e = NULL;
    int n = 0;
    cdp_status st = list_steps(dir, &e, &n);
    if (st) return st;
    for (int i = 0; i < n && !st; i++) /* newest first */
        if (!e[i].partial && e[i].step > step)
            st = cdp_fail(CDP_ERR_INVALID, "%s: checkpoints after step %lld are there (the newest %s): this run would "
                          "save its steps over another history; give /train/checkpoint/dir another folder, or move "
                          "the later ones away", dir, (long long)step, e[i].path);
    free_steps(e, n);
    return st;
}

cdp_status cdp_ckpt_check_fresh(const char *dir)
{
    struct step_ent *e = NULL;
    int n = 0;
    cdp_status st = list_steps(dir, &e, &n);
    if (st) return st;
    for (int i = 0; i < n && !st; i++) /* newest first */
        if (!e[i].partial)
            st = cdp_fail(CDP_ERR_INVALID, "%s holds checkpoints of an earlier run (the newest %s): this run starts "
                          "from step 0 and would save its steps beside them; continue that run with --resume, or "
                          "give /train/checkpoint/dir another folder, or move them away", dir, e[i].path);
    free_steps(e, n);
    return st;
}

void cdp_ckpt_discard_incomplete_after(const char *dir, int64_t step)
{
    struct step_ent *e = NULL;
    int n = 0;
    if (list_steps(dir, &e, &n)) {
        CDP_WARN(CKPT, "not removing incomplete checkpoints: %s", cdp_last_error());
        return;
    }
    for (int i = 0; i < n; i++) {
        if (!e[i].partial || e[i].step <= step) continue;
        CDP_INFO(CKPT, "removing incomplete checkpoint %s", e[i].path);
        remove_folder(e[i].path);
    }
    free_steps(e, n);
}

cdp_status cdp_ckpt_commit(const char *dir, int64_t step, const struct cdp_ckpt_info *info, int keep)
{
    CDP_ASSERT(dir && info);
    cdp_status st = CDP_OK;
    char *root_dir = trimmed(dir), *folder = NULL, *final = NULL, *text = NULL;
    struct part_ent *parts = NULL;
    struct cdp_safetensors_file **open = NULL;
    struct tensor_ent *ts = NULL;
    int np = 0, cap = 0, nt = 0, tcap = 0;
    json_t *root = NULL;
    DIR *d = NULL;
    if (!root_dir || !(folder = partial_folder(root_dir, step)) || !(final = step_folder(root_dir, step))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (is_dir(final) || access(final, F_OK) == 0) {
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
        if (!st && run_id[0]) {
            /* two runs saving into one folder: a step of parts from both must not commit */
            const char *pr = cdp_safetensors_metadata(open[p], "run");
            if (!pr || strcmp(pr, run_id))
                st = cdp_fail(CDP_ERR_INVALID, "%s: written by run %s, not by this run (%s): another job saves into "
                              "%s too; not committing step %s", path, pr ? pr : "(none)", run_id, root_dir, step_s);
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
            ts[nt] = (struct tensor_ent){name, p, unit_of(name), nt};
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
    if (run_id[0]) bad |= json_object_set_new(root, "run", json_string(run_id));
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
    bad |= !bad && manifest_sum(root, sum);
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
    if ((st = write_atomic(folder, MANIFEST, text))) goto fail;
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
    char *root_dir = trimmed(dir), *man = root_dir ? cdp_path_join(root_dir, MANIFEST) : NULL, *folder = NULL;
    struct step_ent *e = NULL;
    int n = 0;
    json_t *root = NULL;
    if (!man) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const char *base = strrchr(root_dir, '/') ? strrchr(root_dir, '/') + 1 : root_dir;
    int64_t ignored;
    if (is_file(man) || (parse_step_name(base, &ignored) && is_dir(root_dir))) {
        /* a checkpoint folder itself */
        folder = strdup(root_dir);
    } else {
        if (!is_dir(root_dir)) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: no complete checkpoint (%s)", root_dir,
                          access(root_dir, F_OK) ? "no such folder" : "not a folder");
            goto fail;
        }
        if ((st = list_steps(root_dir, &e, &n))) goto fail;
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
    if ((st = read_manifest(folder, &root))) goto fail;
    if ((st = verify_files(folder, root))) goto fail;
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
    free_steps(e, n);
    free(folder);
    free(man);
    free(root_dir);
    return st;
}

/* The parts of a checkpoint folder, opened on first use. */
struct part_cache {
    const char *folder;
    int n;
    const char **names;
    struct cdp_safetensors_file **files;
    int64_t step; /* the manifest's */
};

static cdp_status part_cache_init(struct part_cache *c, const char *folder, json_t *root)
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

static void part_cache_free(struct part_cache *c)
{
    for (int i = 0; c->files && i < c->n; i++) cdp_safetensors_close(c->files[i]);
    free(c->names);
    free(c->files);
}

/* The open part of that name; its path (for messages) goes to buf. */
static cdp_status part_get(struct part_cache *c, const char *name, struct cdp_safetensors_file **out, char *buf,
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
    struct part_cache pc = {0};
    struct stage sb = {NULL, 0};
    char *folder = trimmed(path), *man = folder ? cdp_path_join(folder, MANIFEST) : NULL;
    if (!man) {
        free(folder);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    if ((st = read_manifest(folder, &root))) goto fail;
    if ((st = part_cache_init(&pc, folder, root))) goto fail;
    if (opts) {
        for (int k = 0; k < n; k++) {
            if (!opts[k]) continue;
            const char *mine = optimizer_name(cdp_optimizer_type_of(opts[k]));
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
        int u = unit_of(key);
        if (u >= 0 && u < lo) lo = u;
        if (u > hi) hi = u;
    }
    /* Everything is checked before anything is read, so that a failed load
     * leaves the models and optimizers as they were. */
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < n; k++) {
            struct cdp_model *m = models[k];
            struct cdp_optimizer *o = opts ? opts[k] : NULL;
            cdp_device_t dev = staging_device(o);
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
                if ((st = part_get(&pc, part, &f, fpath, sizeof fpath))) goto fail;
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
    part_cache_free(&pc);
    json_decref(root);
    free(man);
    free(folder);
    return st;
}

/* ---- export ------------------------------------------------------------------------------ */

cdp_status cdp_ckpt_export(const char *path, const char *out)
{
    CDP_ASSERT(path && out);
    cdp_status st;
    json_t *root = NULL;
    struct part_cache pc = {0};
    struct cdp_safetensors_tensor *ts = NULL;
    char *folder = trimmed(path);
    if (!folder) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if ((st = read_manifest(folder, &root))) goto fail;
    if ((st = part_cache_init(&pc, folder, root))) goto fail;
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
        if ((st = part_get(&pc, json_string_value(v), &f, fpath, sizeof fpath))) {
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
    part_cache_free(&pc);
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
    struct part_cache pc = {0};
    struct cdp_unit *units = NULL;
    struct cdp_safetensors_tensor *ts = NULL;
    struct hf_src *src = NULL;
    char *names = NULL;
    struct hf_fetch fc = {0};
    char *folder = trimmed(path);
    if (!folder) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    struct cdp_model_desc md;
    int n_units = 0;
    if ((st = read_manifest(folder, &root))) goto fail;
    if ((st = hf_model_of(folder, root, &md))) goto fail;
    if ((st = part_cache_init(&pc, folder, root))) goto fail;
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
            if ((st = part_get(&pc, json_string_value(part_name), &f, fpath, sizeof fpath))) {
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
    part_cache_free(&pc);
    json_decref(root);
    free(folder);
    return st;
}
