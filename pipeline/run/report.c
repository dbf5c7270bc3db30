/* What a run reports: the step lines and the summary on stdout, the records
 * of metrics.jsonl (built with jansson, one complete line each), every rank's
 * memory peak beside its prediction, and the trace, timeline and weights that
 * rank 0 gathers at the end. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/safetensors.h"
#include "pipeline/run/exec_internal.h"
#include "pipeline/run/tensorboard.h"

static void human_rate(double v, char *buf, size_t cap)
{
    if (v >= 1e9) snprintf(buf, cap, "%.1fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, cap, "%.1fk", v / 1e3);
    else if (v >= 10) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.2f", v);
}

/* "45s", "3m20s", "1h02m", "2d03h": the time left, to the unit that matters */
static void human_duration(double s, char *buf, size_t cap)
{
    const long long t = (long long)(s + 0.5);
    if (t < 60) snprintf(buf, cap, "%llds", t);
    else if (t < 3600) snprintf(buf, cap, "%lldm%02llds", t / 60, t % 60);
    else if (t < 86400) snprintf(buf, cap, "%lldh%02lldm", t / 3600, t % 3600 / 60);
    else snprintf(buf, cap, "%lldd%02lldh", t / 86400, t % 86400 / 3600);
}

/* The model FLOP/s of a step over the devices' peak, or NAN where a peak is unknown. */
static double mfu_of(const struct exec *e, const struct cdp_exec_totals *t, double time_s)
{
    return e->peak_flops > 0 && time_s > 0 ? t->flops_per_step / time_s / e->peak_flops : NAN;
}

void cdp_exec_print_shares(FILE *f, const int64_t *share, int R)
{
    for (int r = 0; r < R; r++) fprintf(f, "%s%lld", r ? " " : "", (long long)share[r]);
}

/* One record of metrics.jsonl, written whole (a line is never left cut in
 * half by a failed write: the file is flushed and checked). */
static cdp_status write_line(const struct exec *e, json_t *o, FILE *f)
{
    char *text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "out of memory writing the metrics");
    const long at = ftell(f);
    const int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0;
    const int err = errno;
    free(text);
    if (!bad) return CDP_OK;
    /* what reached the file of this line goes again: no line is left cut in half */
    if (at >= 0 && ftruncate(fileno(f), (off_t)at) != 0)
        CDP_WARN(EXEC, "%s: a cut line may remain at byte %ld", e->plan->output.metrics, at);
    return cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", e->plan->output.metrics, strerror(err));
}

/* Where metrics.jsonl is cut for a run resumed after step step0: the start
 * of the first line that records a later step (those steps run again), or of
 * a line a crash left unfinished or unreadable; the file's length if none. */
static long metrics_cut_at(const char *text, long len, int64_t step0, long *dropped)
{
    long at = 0;
    *dropped = 0;
    while (at < len) {
        const char *nl = memchr(text + at, '\n', (size_t)(len - at));
        if (!nl) break; /* an unfinished last line */
        json_error_t err;
        json_t *o = json_loadb(text + at, (size_t)(nl - (text + at)), 0, &err);
        const json_t *step = o ? json_object_get(o, "step") : NULL;
        const int later = !o || (json_is_integer(step) && json_integer_value(step) > step0);
        json_decref(o);
        if (later) break;
        at = (long)(nl - text) + 1;
    }
    for (long i = at; i < len; i++) *dropped += text[i] == '\n';
    if (at < len && text[len - 1] != '\n') ++*dropped; /* and the unfinished one */
    return at;
}

/* Reads a whole file; *len -1 when it cannot be read (NULL text). */
static char *read_all(FILE *f, long *len)
{
    char *text = NULL;
    *len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)*len + 1)) && fread(text, 1, (size_t)*len, f) != (size_t)*len)
        *len = -1;
    if (*len < 0) {
        free(text);
        return NULL;
    }
    text[*len] = '\0';
    return text;
}

cdp_status cdp_metrics_cut(const char *path, int64_t step0, long *dropped)
{
    *dropped = 0;
    FILE *f = fopen(path, "r+");
    if (!f) return CDP_OK;
    long len = -1;
    char *text = read_all(f, &len);
    const long at = text ? metrics_cut_at(text, len, step0, dropped) : -1;
    free(text);
    const int bad = at < 0 || (at < len && ftruncate(fileno(f), (off_t)at) != 0);
    const int err = errno;
    fclose(f);
    if (bad) return cdp_fail(CDP_ERR_IO, "%s: cannot cut it back to step %lld for the resume: %s", path,
                             (long long)step0, strerror(err));
    return CDP_OK;
}

int64_t cdp_metrics_last_step(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long len = -1;
    char *text = read_all(f, &len);
    fclose(f);
    int64_t last = -1;
    for (long at = 0; text && at < len;) {
        const char *nl = memchr(text + at, '\n', (size_t)(len - at));
        if (!nl) break;
        json_error_t err;
        json_t *o = json_loadb(text + at, (size_t)(nl - (text + at)), 0, &err);
        const json_t *step = o ? json_object_get(o, "step") : NULL;
        if (json_is_integer(step) && json_integer_value(step) > last) last = json_integer_value(step);
        json_decref(o);
        at = (long)(nl - text) + 1;
    }
    free(text);
    return last;
}

cdp_status cdp_exec_open_metrics(const struct exec *e, FILE **out)
{
    const char *path = e->plan->output.metrics;
    *out = NULL;
    if (e->step0 > 0) {
        /* a resume: the steps after the checkpoint run again, so their lines go */
        long dropped = 0;
        cdp_status st = cdp_metrics_cut(path, e->step0, &dropped);
        if (st) return st;
        if (dropped && e->out)
            fprintf(e->out, "resuming after step %lld: %s: %ld later line%s removed (those steps run again)\n",
                    (long long)e->step0, path, dropped, dropped == 1 ? "" : "s");
    }
    if (!(*out = fopen(path, e->step0 ? "a" : "w")))
        return cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return CDP_OK;
}

/* metrics.jsonl's first record of a run: the layout it runs, every rank's
 * place and predicted memory. */
cdp_status cdp_exec_write_layout_record(const struct exec *e, FILE *f)
{
    const struct cdp_layout *l = e->lay;
    json_t *ranks = cdp_layout_ranks_json(l);
    /* where each rank ran: the host it found itself on */
    for (int i = 0; ranks && e->hosts && i < e->size && i < l->n_ranks; i++)
        json_object_set_new(json_array_get(ranks, (size_t)i), "host",
                            json_string(e->hosts + (size_t)i * CDP_EXEC_HOST_MAX));
    json_t *o = ranks
                    ? json_pack("{s:{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:o}}", "layout", "topology",
                                l->topology, "schedule", cdp_schedule_name(l->schedule), "recompute",
                                cdp_recompute_name(l->recompute), "zero", l->zero, "stages", l->stages, "chunks", l->chunks, "replicas",
                                l->replicas, "tensor", l->tensor, "micro_batches", l->micro_batches, "nodes", l->n_nodes,
                                "ranks", ranks)
                    : NULL;
    if (!o) return cdp_fail(CDP_ERR_NOMEM, "out of memory writing the metrics");
    return write_line(e, o, f);
}

void cdp_exec_print_header(const struct exec *e, const struct cdp_exec_totals *t, FILE *out)
{
    const struct cdp_plan *p = e->plan;
    fprintf(out, "training %s: %.0f parameters, %lld steps of %lld samples",
            p->model.kind == CDP_MODEL_GPT ? p->model.preset : "model", t->params, (long long)p->train.steps,
            (long long)e->G);
    if (e->size == 1) {
        fprintf(out, " (%d x %d), %s\n", e->m, e->B, p->train.optimizer.type == CDP_OPT_SGD ? "sgd" : "adamw");
        return;
    }
    int equal = 1;
    for (int r = 1; r < e->R; r++) equal &= e->share[r] == e->share[0];
    fprintf(out, " on %d ranks: %d stages x %d replicas", e->size, e->p, e->R);
    if (e->t > 1) fprintf(out, " x tensor %d", e->t);
    fprintf(out, ", %s, ", cdp_schedule_name(e->lay->schedule));
    if (equal) {
        fprintf(out, "%lld micro-batches of %d per replica\n", (long long)e->share[0], e->B);
    } else {
        fprintf(out, "micro-batches of %d per replica: ", e->B);
        cdp_exec_print_shares(out, e->share, e->R);
        fputc('\n', out);
    }
}

/* The step's record: metrics.jsonl's line, and the scalars of TensorBoard's event. */
static json_t *step_record(const struct exec *e, const struct cdp_exec_step *s, const struct cdp_exec_totals *t)
{
    const double sps = (double)e->G / s->time_s;
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "step", json_integer(s->step));
    json_object_set_new(o, "loss", json_real(s->loss));
    json_object_set_new(o, "lr", json_real(e->lr));
    json_object_set_new(o, "grad_norm", json_real(e->grad_norm));
    json_object_set_new(o, "time_s", json_real(s->time_s));
    json_object_set_new(o, "samples_per_s", json_real(sps));
    json_object_set_new(o, "tokens_per_s", json_real(t->tokens ? sps * t->sample_tokens : 0));
    json_object_set_new(o, "flops_per_s", json_real(t->flops_per_step / s->time_s));
    const double mfu = mfu_of(e, t, s->time_s);
    if (!isnan(mfu)) json_object_set_new(o, "mfu", json_real(mfu));
    json_object_set_new(o, "bubble", json_real(s->bubble));
    if (e->t > 1) json_object_set_new(o, "tensor_comm_s", json_real(s->tensor_s));
    if (!isnan(s->val_loss)) json_object_set_new(o, "val_loss", json_real(s->val_loss));
    if (e->R > 1) {
        json_t *sh = json_array();
        for (int r = 0; r < e->R; r++) json_array_append_new(sh, json_integer((json_int_t)e->share[r]));
        json_object_set_new(o, "shares", sh);
    }
    if (s->report) {
        json_object_set_new(o, "ranks", cdp_monitor_ranks_json(&s->mon, e->lay));
        json_object_set_new(o, "slowest_rank", json_integer(s->mon.slowest));
        if (s->mon.straggler >= 0) json_object_set_new(o, "straggler", json_integer(s->mon.straggler));
    }
    return o;
}

/* Every number of the record but the step itself, as TensorBoard scalars
 * named by their metrics.jsonl keys. */
static cdp_status write_tensorboard(const struct exec *e, const json_t *o, int64_t step)
{
    const char *tags[32];
    double values[32];
    int n = 0;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (n == 32 || !strcmp(key, "step") || !json_is_number(v)) continue;
        tags[n] = key;
        values[n++] = json_number_value(v);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return cdp_tb_scalars(e->tb, step, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9, tags, values, n);
}

cdp_status cdp_exec_write_step_record(const struct exec *e, const struct cdp_exec_step *s,
                                      const struct cdp_exec_totals *t, FILE *f)
{
    json_t *o = step_record(e, s, t);
    if (!o) return cdp_fail(CDP_ERR_NOMEM, "out of memory writing the metrics");
    cdp_status st = e->tb ? write_tensorboard(e, o, s->step) : CDP_OK;
    if (st || !f) {
        json_decref(o);
        return st;
    }
    return write_line(e, o, f);
}

void cdp_exec_print_step(const struct exec *e, const struct cdp_exec_step *s, const struct cdp_exec_totals *t,
                         int progress, FILE *out)
{
    const struct cdp_plan *p = e->plan;
    const double sps = (double)e->G / s->time_s, tps = t->tokens ? sps * t->sample_tokens : 0,
                 fps = t->flops_per_step / s->time_s;
    const int line = s->step == e->step0 + 1 || s->step % p->train.log_every == 0 || s->step == p->train.steps ||
                     !isnan(s->val_loss);
    if (!line) {
        if (progress) {
            fprintf(out, "\r\033[Kstep %d/%lld  loss %.4f  lr %.3e", s->step, (long long)p->train.steps, s->loss,
                    e->lr);
            fflush(out);
        }
        return;
    }
    char s1[32], s2[32], s3[32];
    human_rate(sps, s1, sizeof s1);
    human_rate(tps, s2, sizeof s2);
    human_rate(fps, s3, sizeof s3);
    if (progress) fputs("\r\033[K", out);
    fprintf(out, "step %*d/%lld  loss %.4f", (int)snprintf(NULL, 0, "%lld", (long long)p->train.steps), s->step,
            (long long)p->train.steps, s->loss);
    if (!isnan(s->val_loss)) fprintf(out, "  val %.4f", s->val_loss);
    fprintf(out, "  lr %.3e", e->lr);
    fprintf(out, "  | %s samples/s", s1);
    if (tps > 0) fprintf(out, "  %s tokens/s", s2);
    fprintf(out, "  %sFLOP/s", s3);
    const double mfu = mfu_of(e, t, s->time_s);
    if (!isnan(mfu)) fprintf(out, "  MFU %.1f%%", 100.0 * mfu);
    fprintf(out, s->time_s < 0.01 ? "  %.2f ms/step" : "  %.0f ms/step", s->time_s * 1e3);
    if (e->size > 1) fprintf(out, "  bubble %.0f%%", 100.0 * s->bubble);
    if (s->step < p->train.steps) {
        /* the steps left at this run's mean pace so far, validation and checkpoints included */
        char left[32];
        const double per = (double)(cdp_time_ns() - e->t_start) / 1e9 / (s->step - e->step0);
        human_duration(per * (double)(p->train.steps - s->step), left, sizeof left);
        fprintf(out, "  eta %s", left);
    }
    if (s->report) {
        char mb[160];
        cdp_monitor_format(&s->mon, mb, sizeof mb);
        fprintf(out, "  | %s", mb);
    }
    fputc('\n', out);
    /* a whole line at once: a job cancelled or timed out (under Slurm, its
     * output a file) keeps every line it printed, none cut in the middle */
    fflush(out);
}

/* Every rank's device high-water mark, gathered on every rank (n_ranks
 * entries, malloc'd). */
cdp_status cdp_exec_gather_peaks(const struct exec *e, double **out)
{
    double *pk = calloc((size_t)e->size, sizeof *pk);
    if (!pk) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    pk[e->rank] = (double)cdp_device_mem_peak(e->dev);
    cdp_status st = cdp_comm_allreduce_f64(e->world, pk, (size_t)e->size, CDP_REDUCE_SUM, e->timeout);
    if (st) {
        free(pk);
        return st;
    }
    *out = pk;
    return CDP_OK;
}

/* "memory: peak 12.3 MiB, predicted 12.3 MiB (+0.0%)" over the ranks: the
 * one furthest from its prediction. */
static void print_memory(const struct exec *e, const double *peak, FILE *out)
{
    int worst = 0;
    double werr = -1;
    for (int r = 0; r < e->size; r++) {
        const double pred = (double)e->lay->rank[r].memory.device;
        const double err = pred > 0 ? fabs(peak[r] - pred) / pred : 0;
        if (err > werr) werr = err, worst = r;
    }
    const double pred = (double)e->lay->rank[worst].memory.device;
    char a[32], b[32];
    cdp_format_bytes((uint64_t)peak[worst], a, sizeof a);
    cdp_format_bytes((uint64_t)pred, b, sizeof b);
    if (e->size == 1)
        fprintf(out, "memory: device peak %s, predicted %s (%+.1f%%)\n", a, b,
                pred > 0 ? 100 * (peak[worst] / pred - 1) : 0.0);
    else
        fprintf(out,
                "memory: device peak per rank within %.1f%% of the prediction (furthest: rank %d, %s against %s)\n",
                100 * werr, worst, a, b);
}

void cdp_exec_print_summary(const struct exec *e, const struct cdp_train_summary *sum, const double *peaks,
                            FILE *out)
{
    const struct cdp_plan *p = e->plan;
    char s3[32];
    human_rate(sum->flops_per_s, s3, sizeof s3);
    fprintf(out, "done: %lld steps in %.1f s, loss %.4f -> %.4f, validation loss %.4f, %sFLOP/s\n",
            (long long)(sum->steps - e->step0), sum->seconds, sum->first_loss, sum->last_loss, sum->val_loss, s3);
    if (e->size > 1)
        fprintf(out, "per step (mean over ranks): %.1f ms compute, %.1f ms communication, %.1f ms waiting on "
                "peers, %.2f ms executor overhead; bubble %.1f%%\n", sum->compute_s * 1e3, sum->comm_s * 1e3,
                sum->idle_s * 1e3, sum->overhead_s * 1e3, 100 * sum->bubble);
    print_memory(e, peaks, out);
    if (p->output.trace) fprintf(out, "trace written to %s\n", p->output.trace);
    if (p->output.timeline) fprintf(out, "timeline written to %s\n", p->output.timeline);
    if (e->replicas_same > 0)
        fprintf(out, "replicas: the same weights on all %d, bit for bit (digests compared after the last step)\n",
                e->R);
    else if (e->replicas_same < 0)
        fprintf(out, "replicas: stage %d's replica %d ends with weights that differ from replica 0's\n",
                e->drift_stage, e->drift_replica);
    if (p->output.weights) fprintf(out, "weights written to %s\n", p->output.weights);
    if (p->train.checkpoint.dir) fprintf(out, "checkpoints in %s\n", p->train.checkpoint.dir);
}

/* Rank 0 receives every rank's trace events and writes the files. */
cdp_status cdp_exec_write_traces(struct exec *e)
{
    const struct cdp_plan *p = e->plan;
    if (!e->trace) return CDP_OK;
    int64_t n = 0;
    struct cdp_event_rec *mine = cdp_trace_events(e->trace, &n);
    void *all = NULL;
    size_t *lens = NULL;
    cdp_status st = cdp_comm_gather_bytes(e->world, mine, (size_t)n * sizeof *mine, &all, &lens, e->timeout);
    if (st || e->rank != 0) {
        free(all);
        free(lens);
        return st;
    }
    struct cdp_trace *t = NULL;
    size_t total = 0;
    for (int r = 0; r < e->size; r++) total += lens[r] / sizeof *mine;
    if (!(st = cdp_trace_create(e->size, (int64_t)total + 1, &t))) {
        const struct cdp_event_rec *ev = all;
        cdp_trace_set_origin(t, 0);
        st = cdp_trace_set_layout(t, e->lay);
        for (size_t i = 0; i < total; i++) cdp_trace_add_event(t, &ev[i]);
        if (!st && p->output.trace) st = cdp_trace_write_chrome(t, p->output.trace);
        if (!st && p->output.timeline)
            st = cdp_trace_write_svg(t, p->train.steps > 1 ? 2 : 1, p->output.timeline);
    }
    cdp_trace_destroy(t);
    free(all);
    free(lens);
    return st;
}

/* Replica 0's stages send their tensors to rank 0, which writes one file named
 * by global unit, as one-rank training does. Record: name[64], ndim, shape[4], numel, data. */
struct wrec {
    char name[64];
    int64_t ndim, shape[CDP_SHAPE_MAX], numel;
    int64_t shard_dim, shard_parts, shard_full, shard_off; /* a tensor group's slice (cdp_param_desc), shard_dim -1: whole */
};

/* Doubles the tensor list and its list of owned buffers (the new entries
 * NULL); nonzero when out of memory (what was there stays valid). */
static int grow(struct cdp_safetensors_tensor **ts, void ***owned, size_t *cap)
{
    struct cdp_safetensors_tensor *nt = realloc(*ts, 2 * *cap * sizeof **ts);
    if (!nt) return 1;
    *ts = nt;
    void **no = realloc(*owned, 2 * *cap * sizeof **owned);
    if (!no) return 1;
    *owned = no;
    memset(no + *cap, 0, *cap * sizeof *no);
    *cap *= 2;
    return 0;
}

/* The whole tensor of a slice's record, made (zeroed) the first time one of
 * its slices comes, in ts[*n] (its storage in owned[*n]); -1: out of memory. */
static int whole_of(struct cdp_safetensors_tensor *ts, void **owned, size_t *n, const char *name,
                    const struct wrec *w)
{
    for (size_t j = 0; j < *n; j++)
        if (!strcmp(ts[j].name, name)) return (int)j;
    const int64_t numel = w->numel / w->shape[w->shard_dim] * w->shard_full;
    if (!(owned[*n] = calloc((size_t)numel, 4))) return -1;
    ts[*n] = (struct cdp_safetensors_tensor){.name = name, .dtype = CDP_DTYPE_F32, .dtype_name = "F32",
                                             .ndim = (int)w->ndim, .data = owned[*n], .nbytes = (uint64_t)numel * 4};
    for (int d = 0; d < (int)w->ndim; d++) ts[*n].shape[d] = d == w->shard_dim ? w->shard_full : w->shape[d];
    return (int)(*n)++;
}

/* 64 bits of this rank's weights, every chunk's parameter buffer in order,
 * read from the device in pieces (a mix of splitmix64 over 8-byte words). */
static cdp_status weights_digest(const struct exec *e, uint64_t *out)
{
    enum { PIECE = 1 << 22 }; /* floats at the most */
    int64_t most = 1; /* the largest chunk's floats, up to PIECE: a small model reads through a small buffer */
    for (int k = 0; k < e->v; k++) {
        const int64_t n = cdp_model_param_floats(e->ch[k].model);
        if (n > most) most = n;
    }
    if (most > PIECE) most = PIECE;
    float *host = malloc((size_t)most * sizeof *host);
    if (!host) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    uint64_t h = 0x6364706879627269u;
    cdp_status st = CDP_OK;
    for (int k = 0; k < e->v && !st; k++) {
        struct cdp_model *mdl = e->ch[k].model;
        if (cdp_model_tensor_count(mdl) == 0) continue;
        const float *w = cdp_model_tensor(mdl, 0)->data;
        const int64_t n = cdp_model_param_floats(mdl);
        for (int64_t at = 0; at < n && !st; at += most) {
            const size_t len = (size_t)(n - at < most ? n - at : most);
            if ((st = cdp_device_read(e->dev, host, w + at, (uint64_t)len * sizeof *host))) break;
            const uint32_t *u = (const uint32_t *)(const void *)host;
            for (size_t i = 0; i < len; i += 2) {
                uint64_t s = h ^ ((uint64_t)u[i] << 32 | (i + 1 < len ? u[i + 1] : 0u));
                h = cdp_splitmix64(&s);
            }
        }
    }
    free(host);
    *out = h;
    return st;
}

cdp_status cdp_exec_check_replicas(struct exec *e)
{
    if (e->R <= 1) return CDP_OK;
    uint64_t mine = 0, first = 0;
    cdp_status st = weights_digest(e, &mine);
    first = mine;
    cdp_comm_t dp = cdp_comm_host(e->dp);
    if (!st) st = cdp_comm_bcast_bytes(dp, &first, sizeof first, 0, e->timeout);
    if (st) return cdp_error_context(st, "comparing the replicas' weights");
    /* the first stage, then its first replica, whose weights differ from replica 0's: told to every rank */
    double s0 = first != mine ? -(double)e->s : -INFINITY;
    if ((st = cdp_comm_allreduce_f64(e->world, &s0, 1, CDP_REDUCE_MAX, e->timeout))) return st;
    if (isfinite(s0)) {
        double r0 = first != mine && -s0 == (double)e->s ? -(double)e->r : -INFINITY;
        if ((st = cdp_comm_allreduce_f64(e->world, &r0, 1, CDP_REDUCE_MAX, e->timeout))) return st;
        e->replicas_same = -1;
        e->drift_stage = (int)-s0;
        e->drift_replica = (int)-r0;
        if (e->rank == 0)
            CDP_WARN(EXEC, "after the last step, stage %d's replica %d holds weights that differ from replica 0's: "
                     "the replicas drifted apart (their gradient reduction did not give every replica the same "
                     "bits)", e->drift_stage, e->drift_replica);
        return CDP_OK;
    }
    e->replicas_same = 1;
    return CDP_OK;
}

cdp_status cdp_exec_write_weights(struct exec *e)
{
    const char *path = e->plan->output.weights;
    if (!path) return CDP_OK;
    size_t bytes = 0;
    for (int k = 0; k < e->v && e->r == 0; k++)
        for (int i = 0; i < cdp_model_tensor_count(e->ch[k].model); i++)
            bytes += sizeof(struct wrec) + (size_t)cdp_model_tensor(e->ch[k].model, i)->numel * 4;
    char *buf = malloc(bytes ? bytes : 1), *q = buf;
    if (!buf) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < e->v && e->r == 0; k++)
        for (int i = 0; i < cdp_model_tensor_count(e->ch[k].model); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(e->ch[k].model, i);
            const struct cdp_param_desc *pd = &cdp_model_unit(e->ch[k].model, t->unit_local)->params[t->param_local];
            struct wrec w = {.ndim = t->ndim, .numel = t->numel, .shard_dim = pd->shard_dim,
                             .shard_parts = pd->shard_parts, .shard_full = pd->shard_full,
                             .shard_off = pd->shard_off};
            snprintf(w.name, sizeof w.name, "%s", t->name);
            memcpy(w.shape, t->shape, sizeof w.shape);
            memcpy(q, &w, sizeof w);
            cdp_status rs = cdp_device_read(e->dev, q + sizeof w, t->data, (uint64_t)t->numel * 4);
            if (rs) {
                free(buf);
                return rs;
            }
            q += sizeof w + (size_t)t->numel * 4;
        }
    void *all = NULL;
    size_t *lens = NULL;
    cdp_status st = cdp_comm_gather_bytes(e->world, buf, bytes, &all, &lens, e->timeout);
    free(buf);
    if (!st && e->rank == 0) {
        size_t total = 0, n = 0, cap = 64;
        for (int r = 0; r < e->size; r++) total += lens[r];
        struct cdp_safetensors_tensor *ts = calloc(cap, sizeof *ts);
        void **owned = calloc(cap, sizeof *owned); /* the wholes assembled from tensor groups' slices */
        int oom = 0;
        for (char *c = all; ts && owned && c < (char *)all + total;) {
            struct wrec w;
            memcpy(&w, c, sizeof w);
            if (w.shard_dim >= 0) { /* a slice: its place in the whole (the group's ranks send them all) */
                if (n == cap && grow(&ts, &owned, &cap)) {
                    oom = 1;
                    break;
                }
                const int j = whole_of(ts, owned, &n, c, &w);
                if (j < 0) {
                    oom = 1;
                    break;
                }
                struct cdp_param_desc pd = {.ndim = (int)w.ndim, .shard_dim = (int)w.shard_dim,
                                            .shard_parts = (int)w.shard_parts, .shard_full = w.shard_full,
                                            .shard_off = w.shard_off};
                for (int d = 0; d < (int)w.ndim; d++) pd.shape[d] = w.shape[d];
                cdp_param_slice_copy(&pd, (void *)ts[j].data, c + sizeof w, 1);
                c += sizeof w + (size_t)w.numel * 4;
                continue;
            }
            int dup = 0;
            for (size_t j = 0; j < n; j++) dup |= !strcmp(ts[j].name, c);
            if (!dup) {
                if (n == cap && grow(&ts, &owned, &cap)) {
                    oom = 1;
                    break;
                }
                /* the name stays inside `all` (name[] is the record's first field: read through c, as a
                 * record after a tensor of an odd count of floats is not 8-byte aligned); the header
                 * copy keeps shape and count */
                ts[n] = (struct cdp_safetensors_tensor){.name = c,
                                                        .dtype = CDP_DTYPE_F32,
                                                        .dtype_name = "F32",
                                                        .ndim = (int)w.ndim,
                                                        .data = c + sizeof w,
                                                        .nbytes = (uint64_t)w.numel * 4};
                for (int d = 0; d < (int)w.ndim; d++) ts[n].shape[d] = w.shape[d];
                n++;
            }
            c += sizeof w + (size_t)w.numel * 4;
        }
        if (!ts || !owned || oom) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        else {
            /* the metadata export writes too (docs/training.md#weights): the optimizer
             * steps done, which is train.steps once training has ended */
            char step[32];
            snprintf(step, sizeof step, "%lld", (long long)e->plan->train.steps);
            const char *meta[] = {"format", "cdphybrid", "step", step};
            st = cdp_safetensors_write(path, ts, (int)n, meta, 2);
        }
        for (size_t j = 0; owned && j < cap; j++) free(owned[j]);
        free(owned);
        free(ts);
    }
    free(all);
    free(lens);
    return st;
}
