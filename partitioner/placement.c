/* Placement search: exhaustive up to symmetry on small machines, hierarchical
 * start plus local search beyond. The slots are devices, or tensor groups of
 * devices seen as one device each. The objective is the caller's. */
#include "partitioner/placement.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_AUTOS 512        /* coset representatives of automorphisms kept for pruning */
#define AUTO_NODE_BUDGET 200000

void cdp_placement_ordered_pp_inner(int p, int R, int *device)
{
    for (int s = 0; s < p; s++)
        for (int r = 0; r < R; r++) device[s * R + r] = r * p + s;
}

void cdp_placement_ordered_dp_inner(int p, int R, int *device)
{
    for (int s = 0; s < p; s++)
        for (int r = 0; r < R; r++) device[s * R + r] = s * R + r;
}

/* What the search knows of the machine: its slots (devices, or tensor
 * groups) and the links between them. */
struct machine {
    int n;            /* slots */
    int group;        /* devices per slot */
    int *dev;         /* n: each slot's (first) device */
    double *bw, *lat; /* n x n */
    int *cls;         /* n x n link class */
    int *klass;       /* slots with identical rows share a class id (its smallest member) */
    int n_autos;
    int *autos;       /* n_autos x n: class-order-preserving automorphisms other than identity */
};

static void machine_free(struct machine *m)
{
    free(m->dev);
    free(m->bw);
    free(m->lat);
    free(m->cls);
    free(m->klass);
    free(m->autos);
}

static int same_device(const struct cdp_topology *t, int a, int b)
{
    const struct cdp_topology_gpu *x = &t->gpus[a], *y = &t->gpus[b];
    return strcmp(x->name, y->name) == 0 && x->memory_bytes == y->memory_bytes && x->peak_fp32 == y->peak_fp32 &&
           x->peak_tf32 == y->peak_tf32 && x->peak_bf16 == y->peak_bf16;
}

/* Slots a and b hold alike devices, member by member. */
static int same_slot(const struct cdp_topology *t, const struct machine *m, int a, int b)
{
    for (int k = 0; k < m->group; k++)
        if (!same_device(t, m->dev[a] + k, m->dev[b] + k)) return 0;
    return 1;
}

static int same_link(const struct machine *m, int a, int b, int x, int y)
{
    const int n = m->n;
    return m->bw[a * n + b] == m->bw[x * n + y] && m->lat[a * n + b] == m->lat[x * n + y] &&
           m->cls[a * n + b] == m->cls[x * n + y];
}

/* A hash of link u -> v seen at position `at` (a row entry, col 0, or a
 * column entry, col 1): equal links at equal positions hash equal. */
static uint64_t link_hash(const struct machine *m, int u, int v, int at, int col)
{
    const int n = m->n;
    uint64_t bw, lat;
    memcpy(&bw, &m->bw[u * n + v], sizeof bw);
    memcpy(&lat, &m->lat[u * n + v], sizeof lat);
    uint64_t x = ((uint64_t)(unsigned)at << 1 | (uint64_t)col) * 0x9e3779b97f4a7c15ull;
    x ^= bw + 0x632be59bd9b4e019ull + (x << 6) + (x >> 2);
    x ^= lat + 0x85ebca6b0bd47bd1ull + (x << 6) + (x >> 2);
    x ^= (uint64_t)(unsigned)m->cls[u * n + v] * 0xc2b2ae3d27d4eb4full;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 29);
}

/* Swapping a and b maps every link onto an equal one. */
static int interchangeable(const struct cdp_topology *t, const struct machine *m, int a, int b)
{
    if (!same_slot(t, m, a, b) || !same_link(m, a, b, b, a)) return 0;
    for (int x = 0; x < m->n; x++) {
        if (x == a || x == b) continue;
        if (!same_link(m, a, x, b, x) || !same_link(m, x, a, x, b)) return 0;
    }
    return 1;
}

struct auto_search {
    struct machine *m;
    const struct cdp_topology *t;
    int n_cls, *cls_id, *members, *cls_size, *img; /* img: class -> class */
    int *perm, *used;
    long nodes;
};

/* Maps classes to classes (same size, same device), each class's members in
 * index order, keeping every link: coset representatives of the automorphism
 * group modulo swaps inside classes. Stops at MAX_AUTOS or the node budget
 * (pruning with fewer automorphisms stays exact, only slower). */
static void auto_rec(struct auto_search *A, int c)
{
    struct machine *m = A->m;
    const int n = m->n;
    if (m->n_autos >= MAX_AUTOS || ++A->nodes > AUTO_NODE_BUDGET) return;
    if (c == A->n_cls) {
        int ident = 1;
        for (int i = 0; i < n; i++) ident &= A->perm[i] == i;
        if (!ident) memcpy(m->autos + (size_t)m->n_autos++ * n, A->perm, (size_t)n * sizeof *A->perm);
        return;
    }
    const int *src = A->members + (size_t)c * n;
    for (int d = 0; d < A->n_cls; d++) {
        if (A->used[d] || A->cls_size[d] != A->cls_size[c]) continue;
        const int *dst = A->members + (size_t)d * n;
        if (!same_slot(A->t, m, src[0], dst[0])) continue;
        for (int i = 0; i < A->cls_size[c]; i++) A->perm[src[i]] = dst[i];
        int ok = 1;
        for (int c2 = 0; c2 <= c && ok; c2++) /* links among classes mapped so far */
            for (int i = 0; i < A->cls_size[c2] && ok; i++)
                for (int c3 = 0; c3 <= c && ok; c3++)
                    for (int j = 0; j < A->cls_size[c3] && ok; j++) {
                        const int a = A->members[(size_t)c2 * n + i], b = A->members[(size_t)c3 * n + j];
                        if (a != b) ok = same_link(m, a, b, A->perm[a], A->perm[b]);
                    }
        if (ok) {
            A->used[d] = 1;
            auto_rec(A, c + 1);
            A->used[d] = 0;
        }
    }
}

static int grouped(const struct cdp_placement_problem *pb) { return pb->group > 1; }

static int slots_of(const struct cdp_placement_problem *pb) { return grouped(pb) ? pb->n_groups : pb->topo->n_gpus; }

/* " over 16 groups of 4 devices" for the method line; "" without groups. */
static void slots_said(const struct cdp_placement_problem *pb, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (grouped(pb)) snprintf(buf, cap, " over %d groups of %d devices", pb->n_groups, pb->group);
}

static cdp_status machine_build(const struct cdp_placement_problem *pb, int want_autos, struct machine *m)
{
    const struct cdp_topology *t = pb->topo;
    const int n = slots_of(pb);
    memset(m, 0, sizeof *m);
    m->n = n;
    m->group = grouped(pb) ? pb->group : 1;
    m->dev = calloc((size_t)n, sizeof *m->dev);
    m->bw = calloc((size_t)n * n, sizeof *m->bw);
    m->lat = calloc((size_t)n * n, sizeof *m->lat);
    m->cls = calloc((size_t)n * n, sizeof *m->cls);
    m->klass = calloc((size_t)n, sizeof *m->klass);
    if (!m->dev || !m->bw || !m->lat || !m->cls || !m->klass) goto nomem;
    for (int a = 0; a < n; a++) m->dev[a] = grouped(pb) ? pb->group_first[a] : a;
    /* a group's traffic to another runs over its t member pairs in parallel: the slowest pair's link */
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            if (a == b) continue;
            struct cdp_topology_link l;
            cdp_status st = cdp_topology_group_link(t, m->dev[a], m->dev[b], m->group, &l);
            if (st) {
                machine_free(m);
                return cdp_error_context(st, "placement: link %d -> %d", m->dev[a], m->dev[b]);
            }
            m->bw[a * n + b] = l.bandwidth;
            m->lat[a * n + b] = l.latency;
            m->cls[a * n + b] = (int)l.cls;
        }
    /* Classes. interchangeable() is O(n) a pair, and a cluster has n / 8
     * classes, so checking every representative is O(n^3) (minutes at 4096
     * GPUs). Each device's links hash to a sum over positions, so that two
     * interchangeable devices, whose rows and columns agree everywhere but
     * at each other, have equal sums once their entries at each other are
     * taken out: a cheap exact test that they are not (equal sums are then
     * checked in full). */
    uint64_t *h = calloc((size_t)n, sizeof *h);
    if (!h) goto nomem;
    /* row by row (contiguous): link a -> x is a's row entry at x and x's column entry at a */
    for (int a = 0; a < n; a++)
        for (int x = 0; x < n; x++)
            if (x != a) {
                h[a] += link_hash(m, a, x, x, 0);
                h[x] += link_hash(m, a, x, a, 1);
            }
    for (int a = 0; a < n; a++) {
        m->klass[a] = a;
        for (int b = 0; b < a; b++) {
            if (m->klass[b] != b) continue;
            const uint64_t ha = h[a] - link_hash(m, a, b, b, 0) - link_hash(m, b, a, b, 1),
                           hb = h[b] - link_hash(m, b, a, a, 0) - link_hash(m, a, b, a, 1);
            if (ha == hb && interchangeable(t, m, a, b)) {
                m->klass[a] = b;
                break;
            }
        }
    }
    free(h);
    if (!want_autos) return CDP_OK;
    struct auto_search A = {.m = m, .t = t};
    A.cls_id = calloc((size_t)n, sizeof *A.cls_id);
    A.members = calloc((size_t)n * n, sizeof *A.members);
    A.cls_size = calloc((size_t)n, sizeof *A.cls_size);
    A.perm = calloc((size_t)n, sizeof *A.perm);
    A.used = calloc((size_t)n, sizeof *A.used);
    m->autos = calloc((size_t)MAX_AUTOS * n, sizeof *m->autos);
    if (!A.cls_id || !A.members || !A.cls_size || !A.perm || !A.used || !m->autos) {
        free(A.cls_id), free(A.members), free(A.cls_size), free(A.perm), free(A.used);
        goto nomem;
    }
    for (int a = 0; a < n; a++) {
        if (m->klass[a] == a) A.cls_id[a] = A.n_cls++;
        else A.cls_id[a] = A.cls_id[m->klass[a]];
        const int c = A.cls_id[a];
        A.members[(size_t)c * n + A.cls_size[c]++] = a;
    }
    auto_rec(&A, 0);
    free(A.cls_id), free(A.members), free(A.cls_size), free(A.perm), free(A.used);
    return CDP_OK;
nomem:
    machine_free(m);
    return cdp_fail(CDP_ERR_NOMEM, "placement: out of memory for %d slots", n);
}

/* ---- exact search --------------------------------------------------------- */

struct exact {
    const struct cdp_placement_problem *pb;
    const struct machine *m;
    int N, *a, *used; /* a: slots */
    int *dv;          /* N: a's devices, for the objective */
    int evaluate;          /* 0: only count leaves */
    int64_t leaves, cap;
    int64_t work, work_cap; /* (automorphism, rotation) pairs the leader test looked at, and how many may be */
    double best;
    int *best_a;
};

/* Is the partial assignment a[0..d-1] certainly not the lexicographic leader
 * of its orbit under (automorphism pi, rotation of the replicas by t)? */
static int dominated(struct exact *E, int d)
{
    const int R = E->pb->R, n = E->m->n;
    E->work += (int64_t)(E->m->n_autos + 1) * R;
    for (int g = -1; g < E->m->n_autos; g++) {
        const int *pi = g >= 0 ? E->m->autos + (size_t)g * n : NULL;
        for (int t = 0; t < R; t++) {
            if (!pi && t == 0) continue;
            for (int pos = 0; pos < d; pos++) {
                const int src = pos - pos % R + (pos % R + t) % R;
                if (src >= d) break;
                const int v = pi ? pi[E->a[src]] : E->a[src];
                if (v < E->a[pos]) return 1;
                if (v > E->a[pos]) break;
            }
        }
    }
    return 0;
}

static void exact_rec(struct exact *E, int d)
{
    if (E->leaves > E->cap || E->work > E->work_cap) return;
    if (d == E->N) {
        E->leaves++;
        if (!E->evaluate) return;
        for (int i = 0; i < E->N; i++) E->dv[i] = E->m->dev[E->a[i]];
        double c = E->pb->cost(E->dv, E->pb->ctx);
        if (!isnan(c) && c < E->best) {
            E->best = c;
            memcpy(E->best_a, E->dv, (size_t)E->N * sizeof *E->dv);
        }
        return;
    }
    const int n = E->m->n;
    for (int dev = 0; dev < n; dev++) {
        if (E->used[dev]) continue;
        /* identical slots are taken in index order: dev must be its class's first unused member */
        int first = 1;
        for (int o = E->m->klass[dev]; o < dev && first; o++)
            if (E->m->klass[o] == E->m->klass[dev] && !E->used[o]) first = 0;
        if (!first) continue;
        E->a[d] = dev;
        E->used[dev] = 1;
        if (!dominated(E, d + 1)) exact_rec(E, d + 1);
        E->used[dev] = 0;
    }
}

static cdp_status check_problem(const struct cdp_placement_problem *pb)
{
    if (!pb->topo || !pb->cost) return cdp_fail(CDP_ERR_INVALID, "placement: no topology or no objective");
    const struct cdp_topology *t = pb->topo;
    if (grouped(pb)) {
        if (pb->n_groups < 1 || !pb->group_first)
            return cdp_fail(CDP_ERR_INVALID, "placement: groups of %d devices, but no group", pb->group);
        for (int g = 0; g < pb->n_groups; g++) {
            const int f = pb->group_first[g];
            if (f < 0 || f + pb->group > t->n_gpus || (g > 0 && f < pb->group_first[g - 1] + pb->group))
                return cdp_fail(CDP_ERR_INVALID, "placement: group %d (devices %d to %d) is outside the %d devices "
                                "of %s or overlaps the group before it", g, f, f + pb->group - 1, t->n_gpus, t->name);
            for (int k = 1; k < pb->group; k++)
                if (t->gpus[f + k].node != t->gpus[f].node)
                    return cdp_fail(CDP_ERR_INVALID, "placement: group %d (devices %d to %d) spans nodes of %s", g,
                                    f, f + pb->group - 1, t->name);
        }
    }
    if (pb->p < 1 || pb->R < 1 || (int64_t)pb->p * pb->R > slots_of(pb))
        return cdp_fail(CDP_ERR_INVALID, "placement: %d stages x %d replicas do not fit on the %d %s of %s", pb->p,
                        pb->R, slots_of(pb), grouped(pb) ? "groups" : "devices", t->name);
    return CDP_OK;
}

cdp_status cdp_placement_exact(const struct cdp_placement_problem *pb, int *device, struct cdp_placement_info *info)
{
    cdp_status st;
    if ((st = check_problem(pb))) return st;
    const int n = slots_of(pb), N = pb->p * pb->R;
    const int64_t cap = pb->max_exact_evals > 0 ? pb->max_exact_evals : CDP_PLACEMENT_EXACT_EVALS;
    if (n > CDP_PLACEMENT_EXACT_MAX_DEVICES)
        return grouped(pb) ? cdp_fail(CDP_ERR_UNSUPPORTED, "placement: exact search is for at most %d groups",
                                      CDP_PLACEMENT_EXACT_MAX_DEVICES)
                           : cdp_fail(CDP_ERR_UNSUPPORTED, "placement: exact search is for at most %d devices; %s has %d",
                                      CDP_PLACEMENT_EXACT_MAX_DEVICES, pb->topo->name, n);
    struct machine m;
    if ((st = machine_build(pb, 1, &m))) return st;
    /* the leader test costs (automorphisms x rotations) a node: with many
     * automorphisms (16 groups, two on each of 8 nodes: 511 kept) counting
     * 50,000 leaves took 1.5 s, so the count also stops at 200 tests a leaf
     * allowed (the 8-device presets' searches need at most 4 a leaf) */
    struct exact E = {.pb = pb, .m = &m, .N = N, .cap = cap, .work_cap = 200 * cap, .best = INFINITY};
    E.a = calloc((size_t)N, sizeof *E.a);
    E.best_a = calloc((size_t)N, sizeof *E.best_a);
    E.dv = calloc((size_t)N, sizeof *E.dv);
    E.used = calloc((size_t)n, sizeof *E.used);
    if (!E.a || !E.best_a || !E.dv || !E.used) {
        st = cdp_fail(CDP_ERR_NOMEM, "placement: out of memory");
        goto done;
    }
    exact_rec(&E, 0); /* count first, so an oversized search costs no objective calls */
    if (E.leaves > cap) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "placement: exact search would evaluate more than %lld assignments",
                      (long long)cap);
        goto done;
    }
    if (E.work > E.work_cap) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "placement: exact search would take more than %lld symmetry tests",
                      (long long)E.work_cap);
        goto done;
    }
    const int64_t count = E.leaves;
    E.leaves = 0;
    E.work_cap = INT64_MAX;
    E.evaluate = 1;
    exact_rec(&E, 0);
    if (!(E.best < INFINITY)) {
        st = cdp_fail(CDP_ERR_INVALID, "placement: no assignment of %d x %d on %s has a finite cost", pb->p, pb->R,
                      pb->topo->name);
        goto done;
    }
    memcpy(device, E.best_a, (size_t)N * sizeof *device);
    if (info) {
        info->cost = E.best;
        info->exact = 1;
        info->evals = count;
        char over[64];
        slots_said(pb, over, sizeof over);
        snprintf(info->method, sizeof info->method,
                 "exact%s: %lld assignments up to symmetry (%d automorphism classes, replica rotations)", over,
                 (long long)count, m.n_autos + 1);
    }
done:
    free(E.a);
    free(E.best_a);
    free(E.dv);
    free(E.used);
    machine_free(&m);
    return st;
}

/* ---- heuristic ------------------------------------------------------------ */

/* Node by node; inside a node a chain from its first slot, each next slot
 * the unused one with the fastest link from the previous (lowest index on
 * ties). Slots follow devices, so a node's slots are a run of indices. */
static void locality_order(const struct cdp_topology *t, const struct machine *m, int *order, int *used)
{
    const int n = m->n;
    int k = 0;
    memset(used, 0, (size_t)n * sizeof *used);
    for (int f = 0, c; f < n; f += c) {
        const int node = t->gpus[m->dev[f]].node;
        for (c = 1; f + c < n && t->gpus[m->dev[f + c]].node == node;) c++;
        int prev = f;
        order[k++] = prev;
        used[prev] = 1;
        for (int i = 1; i < c; i++) {
            int nx = -1;
            for (int d = f; d < f + c; d++)
                if (!used[d] && (nx < 0 || m->bw[prev * n + d] > m->bw[prev * n + nx])) nx = d;
            order[k++] = nx;
            used[nx] = 1;
            prev = nx;
        }
    }
}

struct local {
    const struct cdp_placement_problem *pb;
    const struct machine *m;
    int *dv; /* p*R: the slots' devices, for the objective */
    int64_t evals, cap;
};

static double eval(struct local *L, const int *a)
{
    L->evals++;
    for (int i = 0; i < L->pb->p * L->pb->R; i++) L->dv[i] = L->m->dev[a[i]];
    const double c = L->pb->cost(L->dv, L->pb->ctx);
    return isnan(c) ? INFINITY : c;
}

static int improves(double c, double best)
{
    return c < best && (isinf(best) || best - c > 1e-12 * fabs(best));
}

cdp_status cdp_placement_heuristic(const struct cdp_placement_problem *pb, int *device,
                                   struct cdp_placement_info *info)
{
    cdp_status st;
    if ((st = check_problem(pb))) return st;
    const int n = slots_of(pb), p = pb->p, R = pb->R, N = p * R;
    struct machine m;
    if ((st = machine_build(pb, 0, &m))) return st;
    struct local L = {.pb = pb, .m = &m,
                      .cap = pb->max_local_evals > 0 ? pb->max_local_evals : CDP_PLACEMENT_LOCAL_EVALS};
    int *order = calloc((size_t)n, sizeof *order), *used = calloc((size_t)n, sizeof *used);
    int *cur = calloc((size_t)N, sizeof *cur), *cand = calloc((size_t)N, sizeof *cand);
    L.dv = calloc((size_t)N, sizeof *L.dv);
    if (!order || !used || !cur || !cand || !L.dv) {
        st = cdp_fail(CDP_ERR_NOMEM, "placement: out of memory");
        goto done;
    }
    locality_order(pb->topo, &m, order, used);
    static const char *start_name[] = {"ordered-pp-inner", "ordered-dp-inner", "pipelines on islands",
                                       "replica groups on islands"};
    double best = INFINITY;
    int start = 0;
    /* every slot alike: any two differ by swaps of alike slots, so every
     * assignment is the same and one evaluation is the search */
    int alike = 1;
    for (int i = 1; i < n && alike; i++) alike = m.klass[i] == m.klass[0];
    for (int k = 0; k < (alike ? 1 : 4); k++) {
        if (k % 2 == 0) cdp_placement_ordered_pp_inner(p, R, cand);
        else cdp_placement_ordered_dp_inner(p, R, cand);
        if (k >= 2)
            for (int i = 0; i < N; i++) cand[i] = order[cand[i]];
        const double c = eval(&L, cand);
        if (improves(c, best)) {
            best = c;
            start = k;
            memcpy(cur, cand, (size_t)N * sizeof *cur);
        }
    }
    /* local search: swap two slots, or move a slot to an unused slot */
    int moves = 0, improved = 1;
    while (improved && L.evals < L.cap) {
        improved = 0;
        memset(used, 0, (size_t)n * sizeof *used);
        for (int i = 0; i < N; i++) used[cur[i]] = 1;
        for (int i = 0; i < N && L.evals < L.cap; i++) {
            for (int j = i + 1; j < N && L.evals < L.cap; j++) {
                if (m.klass[cur[i]] == m.klass[cur[j]]) continue; /* the same assignment up to symmetry */
                memcpy(cand, cur, (size_t)N * sizeof *cand);
                cand[i] = cur[j];
                cand[j] = cur[i];
                const double c = eval(&L, cand);
                if (improves(c, best)) {
                    best = c;
                    memcpy(cur, cand, (size_t)N * sizeof *cur);
                    improved = 1;
                    moves++;
                }
            }
            for (int u = 0; u < n && L.evals < L.cap; u++) {
                if (used[u] || m.klass[u] == m.klass[cur[i]]) continue;
                int first = 1; /* one unused slot per class */
                for (int o = 0; o < u && first; o++)
                    if (!used[o] && m.klass[o] == m.klass[u]) first = 0;
                if (!first) continue;
                memcpy(cand, cur, (size_t)N * sizeof *cand);
                cand[i] = u;
                const double c = eval(&L, cand);
                if (improves(c, best)) {
                    best = c;
                    used[cur[i]] = 0;
                    used[u] = 1;
                    memcpy(cur, cand, (size_t)N * sizeof *cur);
                    improved = 1;
                    moves++;
                }
            }
        }
    }
    if (!(best < INFINITY)) {
        st = cdp_fail(CDP_ERR_INVALID, "placement: no assignment of %d x %d on %s has a finite cost", p, R,
                      pb->topo->name);
        goto done;
    }
    for (int i = 0; i < N; i++) device[i] = m.dev[cur[i]];
    if (info) {
        info->cost = best;
        info->exact = 0;
        info->evals = L.evals;
        char over[64];
        slots_said(pb, over, sizeof over);
        if (alike)
            snprintf(info->method, sizeof info->method, "heuristic%s: every slot alike, one assignment evaluated",
                     over);
        else
            snprintf(info->method, sizeof info->method,
                     "heuristic%s: start %s, %d improving swaps/moves, %lld evaluations%s", over, start_name[start],
                     moves, (long long)L.evals, L.evals >= L.cap ? " (cap reached)" : "");
    }
done:
    free(order);
    free(used);
    free(cur);
    free(cand);
    free(L.dv);
    machine_free(&m);
    return st;
}

cdp_status cdp_placement_search(const struct cdp_placement_problem *pb, int *device, struct cdp_placement_info *info)
{
    cdp_status st;
    if ((st = check_problem(pb))) return st;
    st = cdp_placement_exact(pb, device, info);
    if (st != CDP_ERR_UNSUPPORTED) return st;
    char why[160];
    const char *e = cdp_last_error();
    snprintf(why, sizeof why, "%s", strncmp(e, "placement: ", 11) ? e : e + 11);
    if ((st = cdp_placement_heuristic(pb, device, info))) return st;
    if (info) {
        const size_t l = strlen(info->method);
        if (l + 4 < sizeof info->method) snprintf(info->method + l, sizeof info->method - l, " (%.*s)",
                                                  (int)(sizeof info->method - l - 4), why);
    }
    return CDP_OK;
}
