/* The layout type (layout.h): allocation, checks, the slots and buffers the
 * executor sizes from it, and the memory a rank of it allocates. */
#include "pipeline/layout.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "core/hash.h"
#include "model/optim.h"
#include "pipeline/schedule.h"
#include "plan/schedule_kind.h"

cdp_status cdp_layout_create(int p, int v, int R, struct cdp_layout **out)
{
    return cdp_layout_create_tensor(p, v, R, 1, out);
}

cdp_status cdp_layout_create_tensor(int p, int v, int R, int t, struct cdp_layout **out)
{
    if (p < 1 || v < 1 || R < 1 || t < 1 || (int64_t)p * v * R * t > (1 << 24))
        return cdp_fail(CDP_ERR_INVALID, "layout: %d stages x %d chunks x %d replicas x tensor %d is not a layout",
                        p, v, R, t);
    struct cdp_layout *l = calloc(1, sizeof *l);
    if (!l) return cdp_fail(CDP_ERR_NOMEM, "layout: out of memory");
    l->stages = p;
    l->chunks = v;
    l->replicas = R;
    l->tensor = t;
    l->n_ranks = p * R * t;
    l->n_nodes = 1;
    l->shares = calloc((size_t)R, sizeof *l->shares);
    l->ranges = calloc((size_t)p * v, sizeof *l->ranges);
    l->rank = calloc((size_t)l->n_ranks, sizeof *l->rank);
    if (!l->shares || !l->ranges || !l->rank) {
        cdp_layout_free(l);
        return cdp_fail(CDP_ERR_NOMEM, "layout: out of memory");
    }
    *out = l;
    return CDP_OK;
}

void cdp_layout_free(struct cdp_layout *l)
{
    if (!l) return;
    free(l->shares);
    free(l->ranges);
    free(l->rank);
    free(l->schedule_file);
    free(l);
}

cdp_status cdp_layout_copy(const struct cdp_layout *l, struct cdp_layout **out)
{
    struct cdp_layout *c = NULL;
    cdp_status st = cdp_layout_create_tensor(l->stages, l->chunks, l->replicas, l->tensor, &c);
    if (st) return st;
    int64_t *shares = c->shares;
    int64_t(*ranges)[2] = c->ranges;
    struct cdp_layout_rank *rank = c->rank;
    *c = *l;
    c->shares = shares;
    c->ranges = ranges;
    c->rank = rank;
    c->schedule_file = NULL;
    memcpy(c->shares, l->shares, (size_t)l->replicas * sizeof *l->shares);
    memcpy(c->ranges, l->ranges, (size_t)l->stages * l->chunks * sizeof *l->ranges);
    memcpy(c->rank, l->rank, (size_t)l->n_ranks * sizeof *l->rank);
    if (l->schedule_file && !(c->schedule_file = strdup(l->schedule_file))) {
        cdp_layout_free(c);
        return cdp_fail(CDP_ERR_NOMEM, "layout: out of memory");
    }
    *out = c;
    return CDP_OK;
}

int cdp_layout_rank_of(const struct cdp_layout *l, int s, int r)
{
    return cdp_layout_rank_at(l, s, r, 0);
}

int cdp_layout_rank_at(const struct cdp_layout *l, int s, int r, int k)
{
    for (int i = 0; i < l->n_ranks; i++)
        if (l->rank[i].stage == s && l->rank[i].replica == r && l->rank[i].tensor == k) return i;
    return -1;
}

cdp_status cdp_layout_check(const struct cdp_layout *l, int64_t n_units)
{
    const int p = l->stages, R = l->replicas, t = l->tensor, nv = p * l->chunks;
    if (t < 1 || l->n_ranks != p * R * t)
        return cdp_fail(CDP_ERR_INVALID, "layout: %d ranks for %d stages x %d replicas x tensor %d", l->n_ranks, p,
                        R, t);
    if (l->micro_batches < 1 || l->micro_batch < 1)
        return cdp_fail(CDP_ERR_INVALID, "layout: %d micro-batches of %d samples", l->micro_batches, l->micro_batch);
    unsigned char *seen = calloc((size_t)l->n_ranks, 1);
    if (!seen) return cdp_fail(CDP_ERR_NOMEM, "layout: out of memory");
    cdp_status st = CDP_OK;
    for (int i = 0; i < l->n_ranks && !st; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        if (k->stage < 0 || k->stage >= p || k->replica < 0 || k->replica >= R)
            st = cdp_fail(CDP_ERR_INVALID, "layout: rank %d runs stage %d of replica %d; the layout has %d x %d", i,
                          k->stage, k->replica, p, R);
        else if (k->tensor < 0 || k->tensor >= t)
            st = cdp_fail(CDP_ERR_INVALID, "layout: rank %d holds tensor slice %d; the layout's tensor groups have %d",
                          i, k->tensor, t);
        else if (seen[((size_t)k->stage * R + k->replica) * t + k->tensor]++)
            st = cdp_fail(CDP_ERR_INVALID, "layout: stage %d of replica %d%s runs on two ranks", k->stage, k->replica,
                          t > 1 ? " (one tensor slice)" : "");
        else if (k->node < 0 || k->node >= l->n_nodes || (i > 0 && k->node < l->rank[i - 1].node))
            st = cdp_fail(CDP_ERR_INVALID, "layout: rank %d is on node %d: ranks go node by node over %d nodes", i,
                          k->node, l->n_nodes);
    }
    free(seen);
    if (st) return st;
    int64_t end = 0, total = 0;
    for (int k = 0; k < nv; k++) {
        if (l->ranges[k][0] != end || l->ranges[k][1] <= l->ranges[k][0])
            return cdp_fail(CDP_ERR_INVALID, "layout: virtual stage %d holds units [%lld, %lld); it should start at "
                            "%lld and hold at least one", k, (long long)l->ranges[k][0], (long long)l->ranges[k][1],
                            (long long)end);
        end = l->ranges[k][1];
    }
    if (end != n_units)
        return cdp_fail(CDP_ERR_INVALID, "layout: the ranges end at unit %lld; the model has %lld", (long long)end,
                        (long long)n_units);
    for (int r = 0; r < R; r++) {
        if (l->shares[r] < 1)
            return cdp_fail(CDP_ERR_INVALID, "layout: replica %d has %lld micro-batches", r, (long long)l->shares[r]);
        total += l->shares[r];
    }
    if (total != (int64_t)R * l->micro_batches)
        return cdp_fail(CDP_ERR_INVALID, "layout: the shares sum to %lld micro-batches; %d replicas x %d is %lld",
                        (long long)total, R, l->micro_batches, (long long)R * l->micro_batches);
    return CDP_OK;
}

cdp_status cdp_layout_slots(const struct cdp_layout *l, int r, int *mcap, int *slots)
{
    return cdp_layout_slots_ex(l, r, mcap, slots, NULL);
}

/* Generated lists are a function of (kind, stages, chunks, micro-batches):
 * their peaks are kept for the next layout that asks (the planner asks for
 * every shape, recompute mode and ZeRO stage it tries; building and
 * validating the lists was most of its time). Enough entries for every
 * (stages, micro-batches) of one search, which plans again per t, with and
 * without sequence parallelism: a few hundred, under a lock. */
#define SLOT_MEMO 1024
static struct slot_memo {
    int kind, p, v, cap, used;
    int *slots, *wslots; /* p each (one allocation) */
} slot_memo[SLOT_MEMO];
static int slot_memo_next;
static pthread_mutex_t slot_memo_lock = PTHREAD_MUTEX_INITIALIZER;

/* Copies a kept entry's peaks; 0 when there is none. Called under the lock. */
static int slot_memo_get(const struct cdp_layout *l, int cap, int *slots, int *wslots)
{
    for (int i = 0; i < SLOT_MEMO; i++) {
        const struct slot_memo *e = &slot_memo[i];
        if (e->used && e->kind == (int)l->schedule && e->p == l->stages && e->v == l->chunks && e->cap == cap) {
            memcpy(slots, e->slots, (size_t)l->stages * sizeof *slots);
            if (wslots) memcpy(wslots, e->wslots, (size_t)l->stages * sizeof *wslots);
            return 1;
        }
    }
    return 0;
}

static void slot_memo_put(const struct cdp_layout *l, int cap, const int *slots, const int *wslots)
{
    int *buf = malloc((size_t)2 * l->stages * sizeof *buf);
    if (!buf) return; /* only a memo */
    struct slot_memo *e = &slot_memo[slot_memo_next];
    slot_memo_next = (slot_memo_next + 1) % SLOT_MEMO;
    free(e->slots);
    *e = (struct slot_memo){(int)l->schedule, l->stages, l->chunks, cap, 1, buf, buf + l->stages};
    memcpy(e->slots, slots, (size_t)l->stages * sizeof *slots);
    memcpy(e->wslots, wslots, (size_t)l->stages * sizeof *wslots);
}

static cdp_status slots_built(const struct cdp_layout *l, int cap, int *slots, int *wslots);

cdp_status cdp_layout_slots_ex(const struct cdp_layout *l, int r, int *mcap, int *slots, int *wslots)
{
    const int R = l->replicas, unit = l->chunks > 1 ? l->stages : 1;
    int64_t cap = l->shares[r];
    if (l->rebalance_every > 0 && R > 1) cap = (int64_t)R * l->micro_batches - (int64_t)(R - 1) * unit;
    if (cap < 1 || cap > CDP_PLAN_MAX_MICRO_BATCHES)
        return cdp_fail(CDP_ERR_INVALID, "layout: replica %d may run %lld micro-batches a step%s; at most %d "
                        "(/parallel/micro_batches, /train/global_batch)", r, (long long)cap,
                        l->rebalance_every > 0 ? " (with /parallel/rebalance_every)" : "",
                        CDP_PLAN_MAX_MICRO_BATCHES);
    *mcap = (int)cap;
    if (!l->schedule_file) {
        pthread_mutex_lock(&slot_memo_lock);
        const int hit = slot_memo_get(l, (int)cap, slots, wslots);
        pthread_mutex_unlock(&slot_memo_lock);
        if (hit) return CDP_OK;
    }
    int *w = wslots ? wslots : malloc((size_t)l->stages * sizeof *w);
    if (!w) return cdp_fail(CDP_ERR_NOMEM, "layout: out of memory");
    cdp_status st = slots_built(l, (int)cap, slots, w);
    if (!st && !l->schedule_file) {
        pthread_mutex_lock(&slot_memo_lock);
        slot_memo_put(l, (int)cap, slots, w);
        pthread_mutex_unlock(&slot_memo_lock);
    }
    if (!wslots) free(w);
    return st;
}

/* The peaks of the lists of cap micro-batches, built. */
static cdp_status slots_built(const struct cdp_layout *l, int cap, int *slots, int *wslots)
{
    for (int s = 0; s < l->stages; s++) slots[s] = 1;
    for (int s = 0; s < l->stages; s++) wslots[s] = 0;
    for (int rv = 0; rv < 2; rv++) {
        struct cdp_schedule *sc = NULL;
        cdp_status st = cdp_schedule_for_layout(l, cap, 0, rv, &sc);
        if (st) return st;
        for (int s = 0; s < l->stages; s++) {
            const int k = cdp_schedule_peak_in_flight(sc, s), w = cdp_schedule_peak_w_pending(sc, s);
            if (k > slots[s]) slots[s] = k;
            if (w > wslots[s]) wslots[s] = w;
        }
        cdp_schedule_free(sc);
        /* only the interleaved and the split lists have a rendezvous order of their own; a file's
         * lists are the same for both transports (the executor proves them for NCCL where it uses it) */
        if (!cdp_schedule_def(l->schedule)->rendezvous_order || l->schedule_file)
            break;
    }
    return CDP_OK;
}

void cdp_layout_chunk_buffers(const struct cdp_unit_bytes *first, const struct cdp_unit_bytes *last, int vstage,
                              int nv, int slots, int host_visible, struct cdp_chunk_buffers *out)
{
    memset(out, 0, sizeof *out);
    if (vstage < nv - 1) out->grad_in = last->output_bytes;
    if (vstage > 0 && !first->in_tokens) {
        out->n_grad_out = slots + 1;
        out->grad_out = first->input_bytes;
    }
    if (!host_visible) /* each device buffer's host copy, each slot's output, the arriving input */
        out->host = cdp_sat_add(cdp_sat_add(out->grad_in, cdp_sat_mul((uint64_t)out->n_grad_out, out->grad_out)),
                                cdp_sat_add(cdp_sat_mul((uint64_t)slots, last->output_bytes), first->input_bytes));
}

void cdp_layout_chunk_memory(const struct cdp_plan *plan, const struct cdp_range_terms *t, uint64_t shared_floats,
                             const struct cdp_unit_bytes *first, const struct cdp_unit_bytes *last, int ends_model,
                             int vstage, int nv, int slots, uint64_t wstate_sum, int wslots, int host_visible, int zero,
                             int shards, int shard, struct cdp_rank_memory *out)
{
    struct cdp_model_bytes mb;
    struct cdp_chunk_buffers cb;
    if (zero < 1) shards = 1;
    cdp_model_bytes_of(t, shared_floats, first, last, ends_model, slots, zero >= 2 ? shards : 1, shard, &mb);
    cdp_model_bytes_add_wstate(&mb, wstate_sum, wslots);
    cdp_layout_chunk_buffers(first, last, vstage, nv, slots, host_visible, &cb);
    memset(out, 0, sizeof *out);
    out->params = mb.params;
    out->grads = mb.grads;
    uint64_t off = 0, len = mb.params / 4;
    if (shards > 1) cdp_shard(mb.params / 4, shards, shard, &off, &len);
    out->optimizer = cdp_optimizer_state_bytes(&plan->train.optimizer, (int64_t)len);
    out->activations = cdp_sat_add(cdp_sat_add(cdp_sat_add(mb.activations, mb.inputs), mb.targets), mb.wstate);
    out->buffers = cdp_sat_add(mb.scratch + mb.grad_buffers + mb.recompute + mb.losses + cb.grad_in,
                               cdp_sat_mul((uint64_t)cb.n_grad_out, cb.grad_out));
    out->device = cdp_sat_add(cdp_sat_add(out->params + out->grads + out->optimizer, out->activations), out->buffers);
    /* the losses are read back into a host copy */
    out->host = cdp_sat_add(cb.host, ends_model ? last->loss_bytes : 0);
}

static void add_memory(struct cdp_rank_memory *a, const struct cdp_rank_memory *b)
{
    a->params += b->params;
    a->grads = cdp_sat_add(a->grads, b->grads);
    a->optimizer = cdp_sat_add(a->optimizer, b->optimizer);
    a->activations = cdp_sat_add(a->activations, b->activations);
    a->buffers = cdp_sat_add(a->buffers, b->buffers);
    a->device = cdp_sat_add(a->device, b->device);
    a->host = cdp_sat_add(a->host, b->host);
}

/* Rank `rank`'s memory, given its replica's micro-batch cap and slots per stage. */
static cdp_status rank_memory(const struct cdp_plan *plan, struct cdp_layout *l, const struct cdp_unit *units, int n,
                              int rank, int mcap, int slots, int wslots)
{
    struct cdp_layout_rank *k = &l->rank[rank];
    const int p = l->stages, nv = p * l->chunks, B = l->micro_batch;
    const int hv = cdp_backend_host_visible(l->backend);
    const enum cdp_loss loss = cdp_model_loss_of(&plan->model);
    struct cdp_rank_memory sum = {0};
    uint64_t largest_grad = 0;
    for (int c = 0; c < l->chunks; c++) {
        const int vs = cdp_schedule_vstage(l->schedule, p, l->chunks, k->stage, c), first = (int)l->ranges[vs][0], end = (int)l->ranges[vs][1];
        if (first < 0 || end > n || first >= end)
            return cdp_fail(CDP_ERR_INVALID, "layout: virtual stage %d holds units [%d, %d) of %d", vs, first, end, n);
        struct cdp_range_terms t = {0};
        struct cdp_unit_bytes ub, u0, ul;
        uint64_t shared = 0, wstate = 0;
        for (int i = first; i < end; i++) {
            cdp_unit_bytes(&units[i], B, loss, &ub);
            cdp_range_terms_add(&t, &ub);
            wstate = cdp_sat_add(wstate, ub.wstate_bytes);
            if (ub.tied_owner >= first && ub.tied_owner < end) shared += ub.tied_floats;
            if (i == first) u0 = ub;
            ul = ub;
        }
        struct cdp_rank_memory cm;
        cdp_layout_chunk_memory(plan, &t, shared, &u0, &ul, end == n, vs, nv, slots, wstate, wslots, hv, l->zero,
                                l->replicas,
                                k->replica, &cm);
        add_memory(&sum, &cm);
        if (cm.params > largest_grad) largest_grad = cm.params;
    }
    /* the first and the last stage read samples: targets of every micro-batch
     * it may run, and one micro-batch's inputs */
    if (k->stage == 0 || k->stage == p - 1) {
        struct cdp_unit_bytes u0, ul;
        cdp_unit_bytes(&units[0], B, loss, &u0);
        cdp_unit_bytes(&units[n - 1], B, loss, &ul);
        sum.host = cdp_sat_add(sum.host, cdp_sat_add(cdp_sat_mul((uint64_t)mcap, ul.target_bytes), u0.input_bytes));
    }
    /* device gradients all-reduced through the host (ranks sharing a GPU) */
    if (!hv && l->shared_devices && l->replicas > 1) sum.host = cdp_sat_add(sum.host, largest_grad);
    sum.host = cdp_sat_add(sum.host, CDP_LAYOUT_PROCESS_BYTES);
    k->memory = sum;
    return CDP_OK;
}

cdp_status cdp_layout_memory(const struct cdp_plan *plan, struct cdp_layout *l, const struct cdp_unit *units, int n)
{
    const int p = l->stages, N = l->n_ranks;
    int *slots = malloc((size_t)p * 2 * sizeof *slots), *first_of = malloc((size_t)p * sizeof *first_of);
    int *wslots = slots ? slots + p : NULL;
    unsigned char *done = calloc((size_t)N, 1);
    cdp_status st = !slots || !first_of || !done ? cdp_fail(CDP_ERR_NOMEM, "layout: out of memory") : CDP_OK;
    /* replicas with the same share have the same slots, and their ranks of one stage the same memory */
    for (int i = 0; i < N && !st; i++) {
        if (done[i]) continue;
        const int64_t share = l->shares[l->rank[i].replica];
        int mcap = 0;
        if ((st = cdp_layout_slots_ex(l, l->rank[i].replica, &mcap, slots, wslots))) break;
        for (int s = 0; s < p; s++) first_of[s] = -1;
        for (int j = i; j < N && !st; j++) {
            if (done[j] || l->shares[l->rank[j].replica] != share) continue;
            const int s = l->rank[j].stage;
            /* ZeRO-1 shards may differ by a float: each rank its own */
            if (first_of[s] >= 0 && !l->zero) l->rank[j].memory = l->rank[first_of[s]].memory;
            else if (!(st = rank_memory(plan, l, units, n, j, mcap, slots[s], wslots[s]))) first_of[s] = j;
            done[j] = 1;
        }
    }
    free(slots);
    free(first_of);
    free(done);
    return st;
}

void cdp_layout_device_name(const struct cdp_layout *l, int rank, char *buf, size_t cap)
{
    if (cdp_backend_is_gpu(l->backend)) snprintf(buf, cap, "%s:%d", cdp_backend_name(l->backend), l->rank[rank].gpu);
    else snprintf(buf, cap, "%s", cdp_backend_name(l->backend));
}

json_t *cdp_layout_ranks_json(const struct cdp_layout *l)
{
    json_t *a = json_array();
    for (int i = 0; a && i < l->n_ranks; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        json_t *o = json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:I,s:I}", "rank", i, "node", k->node, "device",
                              k->device, "gpu", k->gpu, "stage", k->stage, "replica", k->replica, "tensor",
                              k->tensor, "cpuset",
                              k->cpuset, "memory_bytes", (json_int_t)k->memory.device, "host_bytes",
                              (json_int_t)k->memory.host);
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* The public accessors (cdp/layout.h). */
int cdp_layout_stages(const struct cdp_layout *l) { return l->stages; }
int cdp_layout_chunks(const struct cdp_layout *l) { return l->chunks; }
int cdp_layout_replicas(const struct cdp_layout *l) { return l->replicas; }
int cdp_layout_micro_batches(const struct cdp_layout *l) { return l->micro_batches; }
int cdp_layout_micro_batch(const struct cdp_layout *l) { return l->micro_batch; }
int cdp_layout_ranks(const struct cdp_layout *l) { return l->n_ranks; }
int cdp_layout_tensor(const struct cdp_layout *l) { return l->tensor; }
enum cdp_schedule_kind cdp_layout_schedule(const struct cdp_layout *l) { return l->schedule; }

int cdp_layout_rank_stage(const struct cdp_layout *l, int r)
{
    return r >= 0 && r < l->n_ranks ? l->rank[r].stage : -1;
}

int cdp_layout_rank_replica(const struct cdp_layout *l, int r)
{
    return r >= 0 && r < l->n_ranks ? l->rank[r].replica : -1;
}

int cdp_layout_rank_tensor(const struct cdp_layout *l, int r)
{
    return r >= 0 && r < l->n_ranks ? l->rank[r].tensor : -1;
}

uint64_t cdp_layout_rank_memory(const struct cdp_layout *l, int r)
{
    return r >= 0 && r < l->n_ranks ? l->rank[r].memory.device : 0;
}

void cdp_layout_digest(const struct cdp_layout *l, char hex[65])
{
    struct cdp_sha256 h;
    cdp_sha256_init(&h);
    const int64_t head[] = {l->backend,     l->stages,   l->chunks,    l->replicas, l->micro_batches,
                            l->micro_batch, l->schedule, l->recompute, l->zero,     l->n_ranks,
                            l->rebalance_every, l->tensor};
    cdp_sha256_update(&h, head, sizeof head);
    if (l->schedule_file) cdp_sha256_update(&h, l->schedule_file, strlen(l->schedule_file) + 1);
    cdp_sha256_update(&h, l->shares, (size_t)l->replicas * sizeof *l->shares);
    cdp_sha256_update(&h, l->ranges, (size_t)l->stages * l->chunks * sizeof *l->ranges);
    for (int i = 0; i < l->n_ranks; i++) {
        const int32_t r[] = {l->rank[i].stage, l->rank[i].replica, l->rank[i].node, l->rank[i].device,
                             l->rank[i].tensor};
        cdp_sha256_update(&h, r, sizeof r);
    }
    cdp_sha256_final(&h, hex);
}

int cdp_layout_diff(const struct cdp_layout *a, const struct cdp_layout *b, char *buf, size_t cap)
{
    buf[0] = '\0';
#define DIFF(cond, ...)                                                                                          \
    do {                                                                                                         \
        if (cond) {                                                                                              \
            snprintf(buf, cap, __VA_ARGS__);                                                                     \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)
#define DIFF_INT(field, key) DIFF(a->field != b->field, "/%s: %lld here, %lld there", key, (long long)a->field, \
                                  (long long)b->field)
    DIFF(a->backend != b->backend, "/backend: \"%s\" here, \"%s\" there", cdp_backend_name(a->backend),
         cdp_backend_name(b->backend));
    DIFF_INT(stages, "stages");
    DIFF_INT(chunks, "chunks");
    DIFF_INT(replicas, "replicas");
    DIFF_INT(tensor, "tensor");
    DIFF_INT(micro_batches, "micro_batches");
    DIFF_INT(micro_batch, "micro_batch");
    DIFF(a->schedule != b->schedule, "/schedule: \"%s\" here, \"%s\" there", cdp_schedule_name(a->schedule),
         cdp_schedule_name(b->schedule));
    DIFF(!a->schedule_file != !b->schedule_file || (a->schedule_file && strcmp(a->schedule_file, b->schedule_file)),
         "/schedule_file: %s here, %s there", a->schedule_file ? a->schedule_file : "none",
         b->schedule_file ? b->schedule_file : "none");
    DIFF(a->recompute != b->recompute, "/recompute: \"%s\" here, \"%s\" there", cdp_recompute_name(a->recompute),
         cdp_recompute_name(b->recompute));
    DIFF_INT(zero, "zero");
    DIFF_INT(rebalance_every, "rebalance_every");
    for (int r = 0; r < a->replicas; r++)
        DIFF(a->shares[r] != b->shares[r], "/shares/%d: %lld here, %lld there", r, (long long)a->shares[r],
             (long long)b->shares[r]);
    for (int k = 0; k < a->stages * a->chunks; k++)
        DIFF(a->ranges[k][0] != b->ranges[k][0] || a->ranges[k][1] != b->ranges[k][1],
             "/ranges/%d: [%lld, %lld] here, [%lld, %lld] there", k, (long long)a->ranges[k][0],
             (long long)a->ranges[k][1], (long long)b->ranges[k][0], (long long)b->ranges[k][1]);
    for (int i = 0; i < a->n_ranks; i++) {
        const struct cdp_layout_rank *x = &a->rank[i], *y = &b->rank[i];
        DIFF(x->stage != y->stage || x->replica != y->replica,
             "/ranks/%d: stage %d of replica %d here, stage %d of replica %d there", i, x->stage, x->replica,
             y->stage, y->replica);
        DIFF(x->tensor != y->tensor, "/ranks/%d/tensor: %d here, %d there", i, x->tensor, y->tensor);
        DIFF(x->node != y->node, "/ranks/%d/node: %d here, %d there", i, x->node, y->node);
        DIFF(x->device != y->device, "/ranks/%d/device: %d here, %d there", i, x->device, y->device);
    }
#undef DIFF_INT
#undef DIFF
    return 0;
}
