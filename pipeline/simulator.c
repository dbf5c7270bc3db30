/* Discrete-event simulation of one step's schedule lists on the cost model.
 * A global clock advances from event to event (a rank finishing an
 * instruction, a message finishing its latency, a transfer finishing its
 * bytes). At each time every rank runs what it can: sends start transfers and
 * never block (the executor's isend), receives wait for the transfer's arrival,
 * collectives wait for every member. A directed device pair is one link; the
 * transfers moving bytes on it at once share its bandwidth equally. With
 * tensor groups the collectives also hold ports: a device's egress into its
 * node's fabric and onto the network. A tensor group's all-reduce and a
 * data-parallel collective that need the same port at the same time go one
 * after the other (port_reserve). */
#include "pipeline/simulator.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/schedule_kind.h"

enum { T_NONE = 0, T_LATENCY, T_MOVING, T_ARRIVED };

struct xfer {
    int state;
    int link;         /* index into links, -1 when unlimited */
    double enter;     /* when the latency ends */
    double remaining; /* bytes still to move */
    double arrival;
};

struct rank_state {
    int pc;
    double busy_until;
    int waiting_coll; /* 1 while at a collective that has not started */
    int done;
    int in_flight, in_flight_peak;
    int w_pending, w_pending_peak; /* split backward: W-states held (after I, until W) */
    double last_bwd_end;
    double grad_start, grad_end; /* the last BACKWARD or W: gradient buckets start during it */
    /* a rank sharing its processor: the compute it runs now, in seconds of
     * the processor to itself, done at the processor's share */
    int shared, computing;
    double work, started;
    enum cdp_event_kind kind;
    int mb, chunk;
    int rs_chunk; /* ZeRO-2: the chunk whose gradient reduce-scatter follows the backward just run; -1 none */
    int wait_pc;      /* the receive it is blocked at since wait_since; -1 none */
    double wait_since;
    double coll_since; /* when it reached the collective it waits at */
};

struct port {
    double *t0, *t1; /* held [t0[j], t1[j]) for j in [head, n) */
    int head, n, cap;
};

struct sim {
    const struct cdp_sim_config *c;
    enum cdp_schedule_kind kind; /* places the virtual stages (cdp_schedule_vstage) */
    int p, v, m, R, nv, N;
    struct rank_state *rk;
    struct xfer *x;       /* [((kind * R + r) * nv + k) * m + mb]: kind 0 act into k, 1 grad into k */
    int *active;          /* keys of transfers in T_LATENCY or T_MOVING */
    int n_active;
    /* directed device pair -> link index: an open-addressing table of the pairs
     * the ranks use (a few per rank), not a devices^2 array (10,000 devices:
     * 400 MB, set for every simulation) */
    uint64_t *lk_key;     /* a * n_devices + b + 1; 0 empty */
    int *lk_val;
    size_t lk_cap, lk_used; /* a power of two; used <= cap / 2 */
    struct cdp_sim_link_stat *links;
    int n_links, cap_links;
    int *link_users;      /* transfers moving on each link now */
    int *ar_count, *tied_count; /* arrivals per stage (all-reduce), per replica (tied) */
    int *rs_count;        /* ZeRO-2: arrivals per stage at the current reduce-scatter */
    int *proc_busy;       /* per processor: its sharing ranks computing now */
    int bucket_stage;     /* the stage whose bucketed all-reduce collective_ex runs now; -1 none */
    int any_shared;       /* some ranks share a processor */
    /* tensor groups (c->tensor >= 2): per device its two ports (2d: into its
     * node's fabric, 2d + 1: onto the network), each a list of the intervals
     * collectives hold it, by start, not overlapping; NULL without groups */
    struct port *ports;
    double now;           /* the clock: no collective starts before it, so intervals ending by then are dropped */
    struct cdp_sim_result *res;
    int64_t cap_events;
};

double cdp_sim_bubble_closed_form(int p, int v, int m)
{
    return cdp_schedule_def(CDP_SCHEDULE_1F1B)->bubble(p, v, m);
}

double cdp_sim_bubble_closed_form_kind(enum cdp_schedule_kind kind, int p, int v, int m)
{
    return cdp_schedule_def(kind)->bubble(p, v, m);
}

static int dev_of(const struct sim *S, int s, int r) { return S->c->device[s * S->R + r]; }

static double bw_of(const struct sim *S, int a, int b) { return S->c->bandwidth[a * S->c->n_devices + b]; }
static double lat_of(const struct sim *S, int a, int b)
{
    return a == b ? 0 : S->c->latency[a * S->c->n_devices + b];
}

static size_t lk_find(const struct sim *S, uint64_t key)
{
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 17) & (S->lk_cap - 1);
    while (S->lk_key[i] && S->lk_key[i] != key) i = (i + 1) & (S->lk_cap - 1);
    return i;
}

static cdp_status lk_grow(struct sim *S)
{
    const size_t old = S->lk_cap;
    uint64_t *k = S->lk_key;
    int *v = S->lk_val;
    S->lk_cap = old ? 2 * old : 64;
    S->lk_key = calloc(S->lk_cap, sizeof *S->lk_key);
    S->lk_val = malloc(S->lk_cap * sizeof *S->lk_val);
    if (!S->lk_key || !S->lk_val) {
        free(S->lk_key), free(S->lk_val);
        S->lk_key = k, S->lk_val = v, S->lk_cap = old;
        return cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory");
    }
    for (size_t i = 0; i < old; i++)
        if (k[i]) {
            const size_t j = lk_find(S, k[i]);
            S->lk_key[j] = k[i];
            S->lk_val[j] = v[i];
        }
    free(k);
    free(v);
    return CDP_OK;
}

static cdp_status link_index(struct sim *S, int a, int b, int *out)
{
    cdp_status st;
    if (2 * (S->lk_used + 1) > S->lk_cap && (st = lk_grow(S))) return st;
    const uint64_t key = (uint64_t)a * (uint64_t)S->c->n_devices + (uint64_t)b + 1;
    const size_t at = lk_find(S, key);
    int *slot = &S->lk_val[at];
    if (!S->lk_key[at]) {
        S->lk_key[at] = key;
        S->lk_used++;
        *slot = -1;
    }
    if (*slot < 0) {
        if (S->n_links == S->cap_links) {
            int cap = S->cap_links ? 2 * S->cap_links : 16;
            struct cdp_sim_link_stat *l = realloc(S->links, (size_t)cap * sizeof *l);
            int *u = realloc(S->link_users, (size_t)cap * sizeof *u);
            if (l) S->links = l;
            if (u) S->link_users = u;
            if (!l || !u) return cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory");
            S->cap_links = cap;
        }
        S->links[S->n_links] = (struct cdp_sim_link_stat){a, b, 0, 0};
        S->link_users[S->n_links] = 0;
        *slot = S->n_links++;
    }
    *out = *slot;
    return CDP_OK;
}

static int row_of(const struct sim *S, int i)
{
    return S->c->trace_rank ? S->c->trace_rank[i] : (i % S->R) * S->p + i / S->R;
}

/* Event *e (its rank, times and duration filled here) of rank i over [t0, t1]. */
static cdp_status add_rec(struct sim *S, int i, struct cdp_event_rec e, double t0, double t1)
{
    struct cdp_sim_result *res = S->res;
    if (res->n_events == S->cap_events) {
        int64_t cap = S->cap_events ? 2 * S->cap_events : 256;
        struct cdp_event_rec *e = realloc(res->events, (size_t)cap * sizeof *e);
        if (!e) return cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory for events");
        res->events = e;
        S->cap_events = cap;
    }
    uint64_t a = (uint64_t)llround(t0 * 1e9), b = (uint64_t)llround(t1 * 1e9);
    e.rank = row_of(S, i);
    e.step = 1;
    e.start_ns = a;
    e.dur_ns = b - a;
    res->events[res->n_events++] = e;
    return CDP_OK;
}

static cdp_status add_event(struct sim *S, int i, enum cdp_event_kind k, int mb, int chunk, double t0, double t1)
{
    return add_rec(S, i, (struct cdp_event_rec){.kind = k, .mb = mb, .chunk = S->v > 1 ? chunk : -1, .peer = -1},
                   t0, t1);
}

/* A send or receive of rank i with rank peer (same replica), as the executor traces it. */
static cdp_status add_p2p(struct sim *S, int i, enum cdp_event_kind k, const struct cdp_instr *in, int peer,
                          double bytes, double t0, double t1)
{
    return add_rec(S, i, (struct cdp_event_rec){.kind = k, .mb = in->mb, .chunk = S->v > 1 ? in->chunk : -1,
                                                .peer = row_of(S, peer), .bytes = (uint64_t)llround(bytes)},
                   t0, t1);
}

static int vs_of(const struct sim *S, int s, int chunk) { return cdp_schedule_vstage(S->kind, S->p, S->v, s, chunk); }
static int rank_of_vs(const struct sim *S, int k)
{
    int r, c;
    cdp_schedule_vstage_place(S->kind, S->p, S->v, k, &r, &c);
    return r;
}

static int key_of(const struct sim *S, int kind, int r, int k, int mb)
{
    return ((kind * S->R + r) * S->nv + k) * S->m + mb;
}

/* Starts the message into virtual stage `to` of replica r from rank (s, r):
 * a send event of no time (the executor's isend returns at once). */
static cdp_status send(struct sim *S, int kind, int s, int r, const struct cdp_instr *in, int to_k, double bytes,
                       double now)
{
    const int to_rank = rank_of_vs(S, to_k), mb = in->mb;
    const int a = dev_of(S, s, r), b = dev_of(S, to_rank, r);
    struct xfer *x = &S->x[key_of(S, kind, r, to_k, mb)];
    if (x->state != T_NONE)
        return cdp_fail(CDP_ERR_INVALID, "simulator: rank (%d, %d) sends micro-batch %d twice", s, r, mb);
    cdp_status est = add_p2p(S, s * S->R + r, kind ? CDP_EV_SEND_GRAD : CDP_EV_SEND_ACT, in, to_rank * S->R + r,
                             bytes, now, now);
    if (est) return est;
    const double bw = bw_of(S, a, b), lat = lat_of(S, a, b);
    x->remaining = bytes;
    x->enter = now + lat;
    x->link = -1;
    if (a != b && bw > 0 && bytes > 0) {
        cdp_status st = link_index(S, a, b, &x->link);
        if (st) return st;
        S->links[x->link].bytes += bytes;
    }
    if (x->link < 0) {
        x->remaining = 0;
        if (lat == 0) {
            x->state = T_ARRIVED;
            x->arrival = now;
            return CDP_OK;
        }
    }
    x->state = T_LATENCY;
    if (lat == 0) {
        x->state = T_MOVING;
        S->link_users[x->link]++;
    }
    S->active[S->n_active++] = key_of(S, kind, r, to_k, mb);
    return CDP_OK;
}

/* The port traffic from device a to device b leaves a by: into its node's
 * fabric (an NVSwitch node's switch ports, a PCIe switch) when b is on a's
 * node, else its network link. */
static int port_of(const struct sim *S, int a, int b)
{
    const int *node = S->c->node;
    return 2 * a + (node && node[a] != node[b] ? 1 : 0);
}

static int cmp_int(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Holds ports[0..n-1] (sorted in place, duplicates dropped) for dur seconds
 * from the first time >= ready at which every one of them is free for that
 * long; that start in *start. A port held by another collective meanwhile
 * delays this one (two transfers on one port take the time of both). */
static cdp_status port_reserve(struct sim *S, int *ports, int n, double ready, double dur, double *start)
{
    *start = ready;
    if (!S->ports || dur <= 0 || n <= 0) return CDP_OK;
    qsort(ports, (size_t)n, sizeof *ports, cmp_int);
    int w = 1;
    for (int i = 1; i < n; i++)
        if (ports[i] != ports[w - 1]) ports[w++] = ports[i];
    n = w;
    double t = ready;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int i = 0; i < n; i++) {
            struct port *P = &S->ports[ports[i]];
            while (P->head < P->n && P->t1[P->head] <= S->now) P->head++;
            for (int j = P->head; j < P->n && P->t0[j] < t + dur; j++)
                if (P->t1[j] > t) t = P->t1[j], moved = 1;
        }
    }
    for (int i = 0; i < n; i++) {
        struct port *P = &S->ports[ports[i]];
        if (P->n == P->cap) {
            if (P->head > 0) { /* drop what has passed before growing */
                memmove(P->t0, P->t0 + P->head, (size_t)(P->n - P->head) * sizeof *P->t0);
                memmove(P->t1, P->t1 + P->head, (size_t)(P->n - P->head) * sizeof *P->t1);
                P->n -= P->head;
                P->head = 0;
            }
            if (P->n == P->cap) {
                const int cap = P->cap ? 2 * P->cap : 16;
                double *a = realloc(P->t0, (size_t)cap * sizeof *a);
                if (a) P->t0 = a;
                double *b = a ? realloc(P->t1, (size_t)cap * sizeof *b) : NULL;
                if (b) P->t1 = b;
                if (!a || !b) return cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory");
                P->cap = cap;
            }
        }
        int j = P->n++;
        for (; j > P->head && P->t0[j - 1] > t; j--) P->t0[j] = P->t0[j - 1], P->t1[j] = P->t1[j - 1];
        P->t0[j] = t;
        P->t1[j] = t + dur;
    }
    *start = t;
    return CDP_OK;
}

/* Of [t0, t1), the most time any of ports[0..n-1] is held. */
static double port_held(const struct sim *S, const int *ports, int n, double t0, double t1)
{
    double most = 0;
    for (int i = 0; S->ports && i < n; i++) {
        const struct port *P = &S->ports[ports[i]];
        double held = 0;
        for (int j = P->head; j < P->n && P->t0[j] < t1; j++) held += fmax(0, fmin(t1, P->t1[j]) - fmax(t0, P->t0[j]));
        most = fmax(most, held);
    }
    return most;
}

static void ports_free(struct sim *S)
{
    for (int d = 0; S->ports && d < 2 * S->c->n_devices; d++) {
        free(S->ports[d].t0);
        free(S->ports[d].t1);
    }
    free(S->ports);
    S->ports = NULL;
}

/* Ring all-reduce of bytes among ranks idx[0..n-1]: 2(n-1)/n x bytes over the
 * slowest link of the ring, plus 2(n-1) latencies of the slowest hop. */
/* A ring collective of n ranks: an all-reduce moves 2(n-1)/n of bytes
 * (rounds 2), a reduce-scatter or all-gather (n-1)/n (rounds 1). The ranks go
 * on past the instruction they wait at when next_pc, else stay where they
 * are (ZeRO-2's reduce-scatter follows a backward already counted). */
/* Gradient buckets: the end of stage s's all-reduce of dur seconds when its
 * chunks' buckets start during each replica's last backward (bucket b of a
 * chunk once bucket_ready[b] of it has passed on every replica, one bucket
 * after another, each its share of dur), and in *start the first bucket's
 * start; NAN when no chunk of s has buckets. */
static double bucketed_end(const struct sim *S, int s, double dur, double *start)
{
    double total = 0, t = -INFINITY;
    int any = 0;
    for (int j = s; j < S->nv; j += S->p) total += S->c->vstage[j].grad_bytes;
    *start = INFINITY;
    for (int j = s; j < S->nv; j += S->p) {
        const struct cdp_sim_vstage *vs = &S->c->vstage[j];
        const double part = total > 0 ? dur * vs->grad_bytes / total : 0;
        if (vs->n_buckets <= 0) continue; /* this chunk's reduction waits for ALLREDUCE_GRADS */
        any = 1;
        for (int b = 0; b < vs->n_buckets; b++) {
            double ready = -INFINITY;
            for (int r = 0; r < S->R; r++) {
                const struct rank_state *q = &S->rk[s * S->R + r];
                ready = fmax(ready, q->grad_start + vs->bucket_ready[b] * (q->grad_end - q->grad_start));
            }
            t = fmax(t, ready);
            *start = fmin(*start, t);
            t += part * vs->bucket_share[b];
        }
    }
    return any ? t : NAN;
}

/* Each member's event spans its wait at the collective and the collective:
 * kind among group, of chunk (-1: every chunk of the rank). A group of one
 * (or of no bytes) moves nothing and records nothing. */
static cdp_status collective_ex(struct sim *S, const int *idx, int n, double bytes, double rounds, int next_pc,
                                enum cdp_event_kind kind, int group, int chunk, double now)
{
    double min_bw = INFINITY, max_lat = 0;
    for (int j = 0; j < n && n > 1; j++) {
        const int a = S->c->device[idx[j]], b = S->c->device[idx[(j + 1) % n]];
        if (a == b) continue;
        if (bw_of(S, a, b) > 0) min_bw = fmin(min_bw, bw_of(S, a, b));
        max_lat = fmax(max_lat, lat_of(S, a, b));
    }
    const double moved = n > 1 ? rounds * (n - 1) / n * bytes : 0;
    const double dur = n > 1 ? (isinf(min_bw) ? 0 : moved / min_bw) + rounds * (n - 1) * max_lat : 0;
    /* with tensor groups the data-parallel collectives hold their members'
     * ports (the tied gradients' reduction does not) */
    int *ports = NULL, n_ports = 0;
    if (S->ports && n > 1 && kind != CDP_EV_TIED_REDUCE) {
        if (!(ports = malloc((size_t)n * sizeof *ports))) return cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory");
        for (int j = 0; j < n; j++) {
            const int a = S->c->device[idx[j]], b = S->c->device[idx[(j + 1) % n]];
            if (a != b) ports[n_ports++] = port_of(S, a, b);
        }
    }
    /* with buckets the all-reduce ran during the last backward: what is left
     * after now (the chunks without buckets after the bucketed ones) */
    double end = now + dur, from = INFINITY;
    int bucketed = 0;
    if (kind == CDP_EV_ALLREDUCE && S->bucket_stage >= 0 && n > 1) {
        const double e = bucketed_end(S, S->bucket_stage, dur, &from);
        if (!isnan(e)) {
            double unbucketed = 0, total = 0;
            for (int j = S->bucket_stage; j < S->nv; j += S->p) {
                total += S->c->vstage[j].grad_bytes;
                if (S->c->vstage[j].n_buckets <= 0) unbucketed += S->c->vstage[j].grad_bytes;
            }
            end = fmax(e, now) + (total > 0 ? dur * unbucketed / total : 0);
            /* the buckets shared their ports with the tensor all-reduces held
             * there meanwhile: they take that much longer (the window is not
             * held in turn: what the ports carry later this step is not delayed) */
            end += port_held(S, ports, n_ports, from, end);
            bucketed = 1;
        }
    }
    if (!bucketed && n_ports) {
        double start;
        cdp_status st = port_reserve(S, ports, n_ports, now, dur, &start);
        if (st) {
            free(ports);
            return st;
        }
        end = start + dur;
    }
    free(ports);
    for (int j = 0; j < n && n > 1; j++) {
        const int a = S->c->device[idx[j]], b = S->c->device[idx[(j + 1) % n]];
        if (a == b || bw_of(S, a, b) <= 0) continue;
        int l;
        cdp_status st = link_index(S, a, b, &l);
        if (st) return st;
        S->links[l].bytes += moved;
        S->links[l].busy_s += dur;
    }
    for (int j = 0; j < n; j++) {
        struct rank_state *q = &S->rk[idx[j]];
        q->waiting_coll = 0;
        q->busy_until = end;
        if (next_pc) q->pc++;
        cdp_status st = n > 1 && bytes > 0 ? add_rec(S, idx[j], (struct cdp_event_rec){.kind = kind, .mb = -1,
                                                                           .chunk = S->v > 1 ? chunk : -1, .peer = -1,
                                                                           .group = group, .members = n,
                                                                           .bytes = (uint64_t)llround(bytes)},
                                        fmin(q->coll_since, from), end)
                                : CDP_OK;
        if (st) return st;
    }
    return CDP_OK;
}

/* The collective of stage s's R replicas (ranks s*R .. s*R + R-1). */
static cdp_status stage_collective(struct sim *S, int s, double bytes, double rounds, int next_pc,
                                   enum cdp_event_kind kind, int chunk, double now)
{
    int *idx = malloc((size_t)S->R * sizeof *idx);
    if (!idx) return cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory");
    for (int j = 0; j < S->R; j++) idx[j] = s * S->R + j;
    cdp_status st = collective_ex(S, idx, S->R, bytes, rounds, next_pc, kind, CDP_EV_GROUP_REPLICAS, chunk, now);
    free(idx);
    return st;
}

/* A compute instruction of d seconds on rank i from now: a rank with a
 * processor of its own is busy until now + d; one sharing it runs at the
 * processor's share, finished by advance(). The event is recorded when it ends. */
static cdp_status compute(struct sim *S, int i, enum cdp_event_kind kind, int mb, int chunk, double d, double now)
{
    struct rank_state *q = &S->rk[i];
    q->chunk = chunk;
    if (q->shared && d > 0) {
        q->computing = 1;
        q->work = d;
        q->started = now;
        q->kind = kind;
        q->mb = mb;
        q->busy_until = INFINITY;
        S->proc_busy[S->c->proc[i]]++;
        return CDP_OK;
    }
    q->busy_until = now + d;
    if (kind == CDP_EV_BACKWARD || kind == CDP_EV_BACKWARD_INPUT || kind == CDP_EV_BACKWARD_WEIGHT)
        q->last_bwd_end = now + d;
    if (kind == CDP_EV_BACKWARD || kind == CDP_EV_BACKWARD_WEIGHT) q->grad_start = now, q->grad_end = now + d;
    if (kind != CDP_EV_OPTIMIZER) S->res->busy_s[i] += d;
    const int recorded = d > 0 || kind == CDP_EV_FORWARD || kind == CDP_EV_BACKWARD || kind == CDP_EV_BACKWARD_INPUT;
    /* the tensor group's all-reduces end the compute they belong to */
    const struct cdp_sim_vstage *vs = chunk >= 0 && kind != CDP_EV_OPTIMIZER ? &S->c->vstage[vs_of(S, i / S->R, chunk)]
                                                                             : NULL;
    const int fwd = kind == CDP_EV_FORWARD, bwd = kind == CDP_EV_BACKWARD || kind == CDP_EV_BACKWARD_INPUT;
    const double tp = !vs || S->c->tensor < 2 ? 0 : fwd ? vs->tp_fwd_s : bwd ? vs->tp_bwd_s : 0;
    if (!recorded) return CDP_OK;
    if (tp <= 0 || tp > d) return add_event(S, i, kind, mb, chunk, now, now + d);
    cdp_status st = add_event(S, i, kind, mb, chunk, now, now + d - tp);
    if (st) return st;
    const int t = S->c->tensor, dev = S->c->device[i];
    const double bytes = fwd ? vs->tp_fwd_bytes : vs->tp_bwd_bytes;
    int ports[64], n_ports = 0; /* t is a power of two that divides a node's GPUs */
    for (int k = 0; k < t && dev + t <= S->c->n_devices; k++) { /* the group's ring: its devices in order */
        const int a = dev + k, b = dev + (k + 1) % t;
        if (bw_of(S, a, b) <= 0) continue;
        int l;
        if ((st = link_index(S, a, b, &l))) return st;
        S->links[l].bytes += bytes;
        S->links[l].busy_s += tp;
        if (n_ports < 64) ports[n_ports++] = port_of(S, a, b);
    }
    /* the ring's ports, after what holds them (a data-parallel collective):
     * the rank waits for them, and the event spans the wait */
    double start;
    if ((st = port_reserve(S, ports, n_ports, now + d - tp, tp, &start))) return st;
    if (start > now + d - tp) {
        q->busy_until = start + tp;
        if (bwd) q->last_bwd_end = start + tp;
        if (kind == CDP_EV_BACKWARD) q->grad_end = start + tp;
    }
    return add_rec(S, i, (struct cdp_event_rec){.kind = CDP_EV_TENSOR_REDUCE, .mb = mb, .chunk = S->v > 1 ? chunk : -1,
                                                .peer = -1, .group = CDP_EV_GROUP_TENSOR, .members = t,
                                                .bytes = (uint64_t)llround(bytes)},
                   now + d - tp, start + tp);
}

/* Runs rank i's instructions at time now until it is busy, blocked or done. */
static double reduce_scale(const struct cdp_sim_config *c) { return c->reduce_scale > 0 ? c->reduce_scale : 1; }

double cdp_sim_step_collective_bytes(double grad_bytes, int zero, double reduce_scale)
{
    const double k = reduce_scale > 0 ? reduce_scale : 1;
    return zero >= 2 ? grad_bytes : zero == 1 ? grad_bytes * (k + 1) / 2 : grad_bytes * k;
}

static cdp_status step_rank(struct sim *S, int i, double now, int *progressed)
{
    const struct cdp_sim_config *c = S->c;
    struct rank_state *q = &S->rk[i];
    const int s = i / S->R, r = i % S->R;
    const struct cdp_instr *list = c->sched->list[s];
    const int len = c->sched->len[s];
    cdp_status st = CDP_OK;
    while (!q->done && !q->waiting_coll && q->busy_until <= now) {
        if (q->rs_chunk >= 0) { /* ZeRO-2: the backward's gradient, reduce-scattered */
            const double bytes = c->vstage[vs_of(S, s, q->rs_chunk)].grad_bytes * reduce_scale(c);
            const int chunk = q->rs_chunk;
            q->rs_chunk = -1;
            q->waiting_coll = 1;
            q->coll_since = now;
            *progressed = 1;
            if (++S->rs_count[s] == S->R) {
                S->rs_count[s] = 0;
                if ((st = stage_collective(S, s, bytes, 1, 0, CDP_EV_REDUCE_SCATTER, chunk, now))) return st;
            }
            continue;
        }
        if (q->pc == len) {
            q->done = 1;
            *progressed = 1;
            break;
        }
        const struct cdp_instr *in = &list[q->pc];
        const int k = in->chunk >= 0 ? vs_of(S, s, in->chunk) : -1;
        const struct cdp_sim_vstage *vs = k >= 0 ? &c->vstage[k] : NULL;
        double d = 0;
        int computes = 0;
        switch (in->op) {
        case CDP_OP_LOAD:
            if ((st = compute(S, i, CDP_EV_LOAD, in->mb, -1, c->load_s, now))) return st;
            computes = 1;
            break;
        case CDP_OP_FORWARD:
            if (++q->in_flight > q->in_flight_peak) q->in_flight_peak = q->in_flight;
            if ((st = compute(S, i, CDP_EV_FORWARD, in->mb, in->chunk, vs->fwd_s, now))) return st;
            computes = 1;
            break;
        case CDP_OP_BACKWARD:
            q->in_flight--;
            if ((st = compute(S, i, CDP_EV_BACKWARD, in->mb, in->chunk, vs->bwd_s, now))) return st;
            computes = 1;
            if (c->zero >= 2 && S->R > 1) q->rs_chunk = in->chunk;
            break;
        case CDP_OP_BACKWARD_INPUT:
            /* the activations stay until the W; the W-state is held from here */
            if (++q->w_pending > q->w_pending_peak) q->w_pending_peak = q->w_pending;
            if ((st = compute(S, i, CDP_EV_BACKWARD_INPUT, in->mb, in->chunk, fmax(vs->bwd_s - vs->bwd_w_s, 0), now)))
                return st;
            computes = 1;
            break;
        case CDP_OP_BACKWARD_WEIGHT:
            q->in_flight--;
            q->w_pending--;
            if ((st = compute(S, i, CDP_EV_BACKWARD_WEIGHT, in->mb, in->chunk, vs->bwd_w_s, now))) return st;
            computes = 1;
            /* the chunk's gradient of this micro-batch is complete only now */
            if (c->zero >= 2 && S->R > 1) q->rs_chunk = in->chunk;
            break;
        case CDP_OP_SEND_ACT:
            if ((st = send(S, 0, s, r, in, k + 1, vs->out_bytes, now))) return st;
            break;
        case CDP_OP_SEND_GRAD: /* the gradient of this stage's input: the previous stage's output size */
            if ((st = send(S, 1, s, r, in, k - 1, c->vstage[k - 1].out_bytes, now))) return st;
            break;
        case CDP_OP_RECV_ACT:
        case CDP_OP_RECV_GRAD: {
            const int grad = in->op == CDP_OP_RECV_GRAD;
            const struct xfer *x = &S->x[key_of(S, grad, r, k, in->mb)];
            if (x->state != T_ARRIVED || x->arrival > now) { /* blocked */
                if (q->wait_pc != q->pc) {
                    q->wait_pc = q->pc;
                    q->wait_since = now;
                }
                return CDP_OK;
            }
            /* from reaching it to the message's arrival, as the executor's receive */
            const double since = q->wait_pc == q->pc ? q->wait_since : now;
            q->wait_pc = -1;
            const int from = rank_of_vs(S, grad ? k + 1 : k - 1);
            const double bytes = grad ? vs->out_bytes : c->vstage[k - 1].out_bytes;
            if ((st = add_p2p(S, i, grad ? CDP_EV_RECV_GRAD : CDP_EV_RECV_ACT, in, from * S->R + r, bytes, since, now)))
                return st;
            break;
        }
        case CDP_OP_ALLREDUCE_GRADS: {
            q->waiting_coll = 1;
            q->coll_since = now;
            *progressed = 1;
            if (++S->ar_count[s] == S->R) {
                double bytes = 0;
                for (int ch = 0; ch < S->v; ch++) bytes += c->vstage[vs_of(S, s, ch)].grad_bytes;
                /* ZeRO-2: only the parameters' all-gather is left; ZeRO-1's
                 * reduce-scatter and all-gather move an all-reduce's bytes */
                S->bucket_stage = c->zero >= 2 ? -1 : s;
                bytes = cdp_sim_step_collective_bytes(bytes, c->zero, c->reduce_scale);
                st = stage_collective(S, s, bytes, c->zero >= 2 ? 1 : 2, 1,
                                      c->zero >= 2 ? CDP_EV_ALLGATHER : CDP_EV_ALLREDUCE, -1, now);
                S->bucket_stage = -1;
                if (st) return st;
            }
            continue;
        }
        case CDP_OP_REDUCE_TIED_GRADS: {
            q->waiting_coll = 1;
            q->coll_since = now;
            *progressed = 1;
            const int lr = rank_of_vs(S, S->nv - 1);
            if (++S->tied_count[r] == (lr > 0 ? 2 : 1)) {
                int idx[2] = {0 * S->R + r, lr * S->R + r};
                if ((st = collective_ex(S, idx, lr > 0 ? 2 : 1, c->tied_bytes, 2, 1, CDP_EV_TIED_REDUCE,
                                        CDP_EV_GROUP_TIED, -1, now)))
                    return st;
            }
            continue;
        }
        case CDP_OP_OPTIMIZER_STEP:
            for (int ch = 0; ch < S->v; ch++) d += c->vstage[vs_of(S, s, ch)].opt_s;
            if ((st = compute(S, i, CDP_EV_OPTIMIZER, -1, -1, d, now))) return st;
            computes = 1;
            break;
        case CDP_OP_COUNT:
            return cdp_fail(CDP_ERR_INVALID, "simulator: unknown instruction %d", (int)in->op);
        }
        q->pc++;
        if (!computes) q->busy_until = now + d;
        *progressed = 1;
    }
    return CDP_OK;
}

/* Moves the clock to the next event and the transfers with it. Returns 0 when
 * there is none. */
static cdp_status advance(struct sim *S, double now, double *next_out, int *moved)
{
    double next = INFINITY;
    *moved = 0;
    for (int i = 0; i < S->N; i++) {
        const struct rank_state *q = &S->rk[i];
        if (q->computing) next = fmin(next, now + q->work * S->proc_busy[S->c->proc[i]]);
        else if (!q->done && !q->waiting_coll && q->busy_until > now) next = fmin(next, q->busy_until);
    }
    for (int j = 0; j < S->n_active; j++) {
        const struct xfer *x = &S->x[S->active[j]];
        if (x->state == T_LATENCY) next = fmin(next, x->enter);
        else next = fmin(next, now + x->remaining / (bw_of(S, S->links[x->link].src, S->links[x->link].dst) /
                                                     S->link_users[x->link]));
    }
    if (isinf(next)) return CDP_OK;
    *moved = 1;
    const double dt = next - now;
    /* shared processors: each computing rank got 1/k of its processor; the
     * counts change only after every rank has moved */
    int ended = 0;
    for (int i = 0; i < S->N && S->any_shared; i++) {
        struct rank_state *q = &S->rk[i];
        if (!q->computing) continue;
        const int k = S->proc_busy[S->c->proc[i]];
        if (now + q->work * k <= next) {
            q->work = 0;
            ended = 1;
        } else {
            q->work -= dt / k;
        }
    }
    for (int i = 0; i < S->N && ended; i++) {
        struct rank_state *q = &S->rk[i];
        if (!q->computing || q->work > 0) continue;
        q->computing = 0;
        q->busy_until = next;
        S->proc_busy[S->c->proc[i]]--;
        if (q->kind == CDP_EV_BACKWARD || q->kind == CDP_EV_BACKWARD_INPUT || q->kind == CDP_EV_BACKWARD_WEIGHT)
            q->last_bwd_end = next;
        if (q->kind == CDP_EV_BACKWARD || q->kind == CDP_EV_BACKWARD_WEIGHT) q->grad_start = q->started, q->grad_end = next;
        if (q->kind != CDP_EV_OPTIMIZER) S->res->busy_s[i] += next - q->started;
        cdp_status st = add_event(S, i, q->kind, q->mb, q->chunk, q->started, next);
        if (st) return st;
    }
    for (int l = 0; l < S->n_links; l++)
        if (S->link_users[l] > 0) S->links[l].busy_s += dt;
    /* bytes moved at the shares of [now, next): counts change only after this loop */
    for (int j = 0; j < S->n_active; j++) {
        struct xfer *x = &S->x[S->active[j]];
        if (x->state != T_MOVING) continue;
        const double rate = bw_of(S, S->links[x->link].src, S->links[x->link].dst) / S->link_users[x->link];
        if (now + x->remaining / rate <= next) x->remaining = 0;
        else x->remaining -= rate * dt;
    }
    int w = 0;
    for (int j = 0; j < S->n_active; j++) {
        struct xfer *x = &S->x[S->active[j]];
        if (x->state == T_MOVING && x->remaining <= 0) {
            S->link_users[x->link]--;
            x->state = T_ARRIVED;
            x->arrival = next;
            continue;
        }
        S->active[w++] = S->active[j];
    }
    S->n_active = w;
    for (int j = 0; j < S->n_active; j++) {
        struct xfer *x = &S->x[S->active[j]];
        if (x->state == T_LATENCY && x->enter <= next) {
            if (x->link < 0 || x->remaining <= 0) {
                x->state = T_ARRIVED;
                x->arrival = next;
            } else {
                x->state = T_MOVING;
                S->link_users[x->link]++;
            }
        }
    }
    w = 0;
    for (int j = 0; j < S->n_active; j++)
        if (S->x[S->active[j]].state != T_ARRIVED) S->active[w++] = S->active[j];
    S->n_active = w;
    *next_out = next;
    return CDP_OK;
}

static int cmp_links(const void *a, const void *b)
{
    const struct cdp_sim_link_stat *x = a, *y = b;
    if (x->busy_s != y->busy_s) return x->busy_s < y->busy_s ? 1 : -1;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    if (x->src != y->src) return x->src - y->src;
    return x->dst - y->dst;
}

void cdp_sim_result_free(struct cdp_sim_result *r)
{
    if (!r) return;
    free(r->busy_s);
    free(r->finish_s);
    free(r->peak_in_flight);
    free(r->peak_w_pending);
    free(r->links);
    free(r->events);
    free(r);
}

static cdp_status check(const struct cdp_sim_config *c)
{
    if (!c->sched || !c->vstage || !c->device || c->replicas < 1 || c->n_devices < 1 || !c->bandwidth ||
        !c->latency)
        return cdp_fail(CDP_ERR_INVALID, "simulator: incomplete configuration");
    const int N = c->sched->p * c->replicas;
    for (int i = 0; c->proc && i < N; i++)
        if (c->proc[i] < 0 || c->proc[i] >= N)
            return cdp_fail(CDP_ERR_INVALID, "simulator: stage %d replica %d runs on processor %d of %d",
                            i / c->replicas, i % c->replicas, c->proc[i], N);
    for (int i = 0; i < N; i++)
        if (c->device[i] < 0 || c->device[i] >= c->n_devices)
            return cdp_fail(CDP_ERR_INVALID, "simulator: stage %d replica %d is placed on device %d; the "
                            "topology has devices 0..%d", i / c->replicas, i % c->replicas, c->device[i],
                            c->n_devices - 1);
    return CDP_OK;
}

cdp_status cdp_sim_run(const struct cdp_sim_config *c, struct cdp_sim_result **out)
{
    cdp_status st = check(c);
    if (st) return st;
    struct sim S = {.c = c, .kind = c->sched->kind, .p = c->sched->p, .v = c->sched->v, .m = c->sched->m, .R = c->replicas,
                    .bucket_stage = -1};
    S.nv = S.p * S.v;
    S.N = S.p * S.R;
    const size_t nx = (size_t)2 * S.R * S.nv * S.m;
    struct cdp_sim_result *res = calloc(1, sizeof *res);
    S.res = res;
    S.rk = calloc((size_t)S.N, sizeof *S.rk);
    S.x = calloc(nx, sizeof *S.x);
    S.active = malloc(nx * sizeof *S.active);
    S.ar_count = calloc((size_t)S.p, sizeof *S.ar_count);
    S.tied_count = calloc((size_t)S.R, sizeof *S.tied_count);
    S.rs_count = calloc((size_t)S.p, sizeof *S.rs_count);
    S.proc_busy = calloc(c->proc ? (size_t)S.N : 1, sizeof *S.proc_busy);
    if (res) {
        res->ranks = S.N;
        res->busy_s = calloc((size_t)S.N, sizeof *res->busy_s);
        res->finish_s = calloc((size_t)S.N, sizeof *res->finish_s);
        res->peak_in_flight = calloc((size_t)S.N, sizeof *res->peak_in_flight);
        res->peak_w_pending = calloc((size_t)S.N, sizeof *res->peak_w_pending);
    }
    if (!res || !S.rk || !S.x || !S.active || !S.ar_count || !S.tied_count || !S.rs_count ||
        !S.proc_busy || !res->busy_s || !res->finish_s || !res->peak_in_flight ||
        !res->peak_w_pending) {
        st = cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory for %d ranks", S.N);
        goto fail;
    }
    if (c->tensor >= 2 && !(S.ports = calloc((size_t)2 * c->n_devices, sizeof *S.ports))) {
        st = cdp_fail(CDP_ERR_NOMEM, "simulator: out of memory for %d devices' ports", c->n_devices);
        goto fail;
    }
    for (int i = 0; i < S.N; i++) S.rk[i].rs_chunk = S.rk[i].wait_pc = -1;
    /* ranks whose processor others share too run at its share when they compute together */
    for (int i = 0; c->proc && i < S.N; i++)
        for (int j = 0; j < S.N; j++)
            if (j != i && c->proc[j] == c->proc[i]) S.rk[i].shared = S.any_shared = 1;

    double now = 0;
    for (;;) {
        S.now = now;
        int progressed = 1;
        while (progressed) {
            progressed = 0;
            for (int i = 0; i < S.N; i++)
                if ((st = step_rank(&S, i, now, &progressed))) goto fail;
        }
        int all = 1;
        for (int i = 0; i < S.N; i++) all &= S.rk[i].done;
        if (all) break;
        double next;
        int moved = 0;
        if ((st = advance(&S, now, &next, &moved))) goto fail;
        if (!moved) {
            char buf[32];
            int i = 0;
            while (S.rk[i].done) i++;
            const struct cdp_instr *in = &c->sched->list[i / S.R][S.rk[i].pc];
            st = cdp_fail(CDP_ERR_INTERNAL, "simulator: the lists deadlock: stage %d replica %d waits at "
                          "instruction %d (%s)", i / S.R, i % S.R, S.rk[i].pc,
                          cdp_instr_str(in, S.v, buf, sizeof buf));
            goto fail;
        }
        now = next;
    }
    double busy = 0;
    for (int i = 0; i < S.N; i++) {
        res->finish_s[i] = S.rk[i].busy_until;
        res->step_s = fmax(res->step_s, S.rk[i].busy_until);
        res->phase_s = fmax(res->phase_s, S.rk[i].last_bwd_end);
        res->peak_in_flight[i] = S.rk[i].in_flight_peak;
        res->peak_w_pending[i] = S.rk[i].w_pending_peak;
        busy += res->busy_s[i];
    }
    res->bubble = res->phase_s > 0 ? fmax(0.0, 1.0 - busy / (S.N * res->phase_s)) : 0;
    res->samples_per_s = res->step_s > 0 ? (double)S.R * S.m * c->samples_per_mb / res->step_s : 0;
    if (S.n_links > 1) qsort(S.links, (size_t)S.n_links, sizeof *S.links, cmp_links);
    res->links = S.links;
    res->n_links = S.n_links;
    S.links = NULL;
    free(S.rk);
    free(S.x);
    free(S.active);
    free(S.lk_key);
    free(S.lk_val);
    free(S.link_users);
    free(S.ar_count);
    free(S.tied_count);
    free(S.rs_count);
    free(S.proc_busy);
    ports_free(&S);
    *out = res;
    return CDP_OK;
fail:
    free(S.rk);
    free(S.x);
    free(S.active);
    free(S.lk_key);
    free(S.lk_val);
    free(S.links);
    free(S.link_users);
    free(S.ar_count);
    free(S.tied_count);
    free(S.rs_count);
    free(S.proc_busy);
    ports_free(&S);
    cdp_sim_result_free(res);
    return st;
}

cdp_status cdp_sim_trace(const struct cdp_sim_result *r, int trace_ranks, struct cdp_trace **out)
{
    struct cdp_trace *t = NULL;
    cdp_status st = cdp_trace_create(trace_ranks, r->n_events > 0 ? r->n_events : 1, &t);
    if (st) return st;
    cdp_trace_set_origin(t, 0);
    for (int64_t i = 0; i < r->n_events; i++) {
        const struct cdp_event_rec *e = &r->events[i];
        cdp_trace_add_event(t, e);
    }
    *out = t;
    return CDP_OK;
}
