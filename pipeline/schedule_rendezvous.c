/* The schedule IR (schedule.h): rendezvous (NCCL) semantics, simulated,
 * and the fix of generator lists that would deadlock under them. */
#include "pipeline/schedule.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/schedule_internal.h"
#include "plan/schedule_kind.h"

/* ---- rendezvous (NCCL) semantics ----------------------------------------------
 *
 * NCCL's send and receive are rendezvous operations without tags: a transfer
 * completes only once both sides have posted it, and the k-th send from rank a
 * to rank b lands in the k-th receive that b posted from a. The executor posts
 * every maximal run of consecutive sends and receives of a list as one
 * ncclGroupStart/End and blocks until all of the group's transfers are done.
 * The simulation below runs exactly that; a transfer, once both of its groups
 * are posted, is done (NCCL progresses a group's operations independently). */

int cdp_schedule_p2p_group_end(const struct cdp_schedule *s, int rank, int i)
{
    CDP_ASSERT(s && rank >= 0 && rank < s->p && i >= 0 && i <= s->len[rank]);
    while (i < s->len[rank] && is_comm(s->list[rank][i].op)) i++;
    return i;
}

/* A rank's peers are its neighbours on the ring of virtual stages: side 0 is
 * rank (r + 1) % p, side 1 rank (r - 1) % p; with p == 2 both are one rank,
 * and one FIFO, so it is always side 0. */
static int side_of(const struct cdp_schedule *s, int r, int peer) { return peer == (r + 1) % s->p ? 0 : 1; }

struct wire sched_wire_of(const struct cdp_schedule *s, int r, const struct cdp_instr *in)
{
    int k = vstage(s, r, in->chunk);
    switch (in->op) {
    case CDP_OP_SEND_ACT: return (struct wire){0, in->mb, k};
    case CDP_OP_RECV_ACT: return (struct wire){0, in->mb, k - 1};
    case CDP_OP_SEND_GRAD: return (struct wire){1, in->mb, k};
    case CDP_OP_RECV_GRAD: return (struct wire){1, in->mb, k + 1};
    case CDP_OP_LOAD:
    case CDP_OP_FORWARD:
    case CDP_OP_BACKWARD:
    case CDP_OP_BACKWARD_INPUT:
    case CDP_OP_BACKWARD_WEIGHT:
    case CDP_OP_REDUCE_TIED_GRADS:
    case CDP_OP_ALLREDUCE_GRADS:
    case CDP_OP_OPTIMIZER_STEP:
    case CDP_OP_COUNT:
        break;
    }
    CDP_ASSERT(!"sched_wire_of: not a send or a receive");
    return (struct wire){0, 0, 0};
}

static const char *ordinal(int n, char *buf, size_t cap)
{
    const char *suf = n % 100 >= 11 && n % 100 <= 13 ? "th" : n % 10 == 1 ? "st" : n % 10 == 2 ? "nd"
                                                                    : n % 10 == 3 ? "rd" : "th";
    snprintf(buf, cap, "%d%s", n, suf);
    return buf;
}

struct rv_rank {
    int at;      /* next instruction; the first of the posted group while there is one */
    int end;     /* one past the posted group; == at when none is posted */
    int open;    /* transfers of the posted group not yet done */
    int at_tied; /* has reached its REDUCE_TIED_GRADS */
};

struct rv {
    const struct cdp_schedule *s;
    size_t *off;          /* off[r]: rank r's first slot in partner / done */
    int *partner;         /* index, in the peer's list, of the other side of a transfer */
    unsigned char *done;  /* transfer done */
    struct rv_rank *rank;
    int *stack, nstack;   /* ranks to run again */
    unsigned char *queued;
};

static void rv_push(struct rv *x, int r)
{
    if (x->queued[r]) return;
    x->queued[r] = 1;
    x->stack[x->nstack++] = r;
}

/* Pairs every send with the receive NCCL will deliver it to (same position
 * in the order of transfers from the sender to the receiver) and checks that
 * it is the matching one. */
static cdp_status rv_pair(struct rv *x)
{
    const struct cdp_schedule *s = x->s;
    int p = s->p;
    cdp_status st = CDP_OK;
    /* recvq: per rank, the positions of its receives from side 0, then from side 1 */
    int *recvq = malloc((x->off[p] ? x->off[p] : 1) * sizeof *recvq);
    int *nrecv = calloc((size_t)p * 2, sizeof *nrecv), *nsend = calloc((size_t)p * 2, sizeof *nsend);
    if (!recvq || !nrecv || !nsend) {
        st = cdp_fail(CDP_ERR_NOMEM, "schedule validation: out of memory");
        goto done;
    }
    for (int b = 0; b < p; b++) {
        size_t q = x->off[b];
        for (int sd = 0; sd < 2; sd++)
            for (int j = 0; j < s->len[b]; j++) {
                const struct cdp_instr *in = &s->list[b][j];
                if (!is_comm(in->op) || is_send(in->op) || side_of(s, b, in->peer) != sd) continue;
                recvq[q++] = j;
                nrecv[b * 2 + sd]++;
            }
    }
    for (int a = 0; a < p; a++)
        for (int i = 0; i < s->len[a]; i++) {
            const struct cdp_instr *in = &s->list[a][i];
            if (!is_comm(in->op) || !is_send(in->op)) continue;
            int b = in->peer, n = nsend[a * 2 + side_of(s, a, b)]++, sdb = side_of(s, b, a);
            char o[16], bi[64], bj[64];
            if (n >= nrecv[b * 2 + sdb]) {
                st = cdp_fail(CDP_ERR_INTERNAL, "rank %d, instruction %d (%s) is the %s send from rank %d to "
                              "rank %d, but rank %d posts only %d receives from rank %d", a, i,
                              cdp_instr_str(in, s->v, bi, sizeof bi), ordinal(n + 1, o, sizeof o), a, b, b,
                              nrecv[b * 2 + sdb], a);
                goto done;
            }
            int j = recvq[x->off[b] + (sdb ? (size_t)nrecv[b * 2] : 0) + (size_t)n];
            struct wire ws = sched_wire_of(s, a, in), wr = sched_wire_of(s, b, &s->list[b][j]);
            if (ws.grad != wr.grad || ws.mb != wr.mb || ws.from != wr.from) {
                st = cdp_fail(CDP_ERR_INTERNAL, "rank %d, instruction %d (%s) and rank %d, instruction %d (%s) "
                              "are the %s transfer from rank %d to rank %d: NCCL pairs sends and receives "
                              "between two ranks in the order they are posted, so this send would land in "
                              "that receive", a, i, cdp_instr_str(in, s->v, bi, sizeof bi), b, j,
                              cdp_instr_str(&s->list[b][j], s->v, bj, sizeof bj), ordinal(n + 1, o, sizeof o),
                              a, b);
                goto done;
            }
            x->partner[x->off[a] + (size_t)i] = j;
            x->partner[x->off[b] + (size_t)j] = i;
        }
    for (int b = 0; b < p; b++)
        for (int sdb = 0; sdb < 2; sdb++) {
            if (!nrecv[b * 2 + sdb]) continue;
            int a = sdb ? (b - 1 + p) % p : (b + 1) % p, sent = nsend[a * 2 + side_of(s, a, b)];
            if (sent < nrecv[b * 2 + sdb]) {
                st = cdp_fail(CDP_ERR_INTERNAL, "rank %d posts %d receives from rank %d, which sends it only %d",
                              b, nrecv[b * 2 + sdb], a, sent);
                goto done;
            }
        }
done:
    free(recvq);
    free(nrecv);
    free(nsend);
    return st;
}

/* Runs rank r until it blocks or ends; queues the ranks this lets go on. */
static void rv_advance(struct rv *x, int r)
{
    const struct cdp_schedule *s = x->s;
    struct rv_rank *me = &x->rank[r];
    for (;;) {
        if (me->end > me->at) {
            if (me->open) return;
            me->at = me->end;
        }
        if (me->at >= s->len[r]) return;
        const struct cdp_instr *in = &s->list[r][me->at];
        if (is_comm(in->op)) {
            me->end = cdp_schedule_p2p_group_end(s, r, me->at);
            me->open = me->end - me->at;
            for (int i = me->at; i < me->end; i++) {
                if (x->done[x->off[r] + (size_t)i]) { /* a group posted again after a fix */
                    me->open--;
                    continue;
                }
                int b = s->list[r][i].peer, j = x->partner[x->off[r] + (size_t)i];
                struct rv_rank *pe = &x->rank[b];
                if (j < pe->at || j >= pe->end) continue; /* the peer has not posted it yet */
                x->done[x->off[r] + (size_t)i] = x->done[x->off[b] + (size_t)j] = 1;
                me->open--;
                if (--pe->open == 0) rv_push(x, b);
            }
            continue;
        }
        if (in->op == CDP_OP_REDUCE_TIED_GRADS) {
            /* A collective of the first and the last rank: both must be there. */
            int other = tied_other(s, r);
            me->at_tied = 1;
            if (!x->rank[other].at_tied) return;
            rv_push(x, other);
        }
        /* Everything else (loading, compute, the replicas' all-reduce) does not
         * wait on this pipeline's ranks. */
        me->at++;
    }
}

struct msg {
    char s[4096];
    size_t n;
};

static void msg_add(struct msg *m, const char *fmt, ...) CDP_PRINTF(2, 3);
static void msg_add(struct msg *m, const char *fmt, ...)
{
    if (m->n + 1 >= sizeof m->s) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(m->s + m->n, sizeof m->s - m->n, fmt, ap);
    va_end(ap);
    if (k > 0) m->n = m->n + (size_t)k < sizeof m->s ? m->n + (size_t)k : sizeof m->s - 1;
}

static cdp_status rv_report(const struct rv *x)
{
    const struct cdp_schedule *s = x->s;
    struct msg m = {.n = 0};
    char b[64];
    msg_add(&m, "deadlock under rendezvous send/receive (one NCCL group per run of consecutive sends and "
                "receives): no group can complete;");
    for (int r = 0; r < s->p; r++) {
        const struct rv_rank *me = &x->rank[r];
        const char *sep = r ? "," : "";
        if (me->at >= s->len[r]) {
            msg_add(&m, "%s rank %d has finished", sep, r);
        } else if (me->end > me->at) {
            if (me->end - me->at == 1) msg_add(&m, "%s rank %d blocks in its group at instruction %d (", sep, r, me->at);
            else msg_add(&m, "%s rank %d blocks in its group at instructions %d-%d (", sep, r, me->at, me->end - 1);
            for (int i = me->at; i < me->end; i++)
                msg_add(&m, "%s%s", i > me->at ? " " : "", cdp_instr_str(&s->list[r][i], s->v, b, sizeof b));
            msg_add(&m, "), unmatched");
            for (int i = me->at; i < me->end; i++)
                if (!x->done[x->off[r] + (size_t)i])
                    msg_add(&m, " %s", cdp_instr_str(&s->list[r][i], s->v, b, sizeof b));
        } else {
            msg_add(&m, "%s rank %d waits at instruction %d (%s) for rank %d", sep, r, me->at,
                    cdp_instr_str(&s->list[r][me->at], s->v, b, sizeof b), tied_other(s, r));
        }
    }
    return cdp_fail(CDP_ERR_INTERNAL, "%s", m.s);
}

/* The fixes below edit a blocked rank's list from its posted group on, and
 * then continue the run instead of starting it again: the run's end (each
 * rank blocked in the first group it cannot complete) does not depend on the
 * order ranks are run in, every rank's list before its group is unchanged and
 * the transfers done stay paired, so every rank still reaches its group.
 * Rank r's instructions [i, to] rotate by one (dir 1: l[i] goes to to, the
 * others down; dir -1: l[to] goes to i, the others up), with their pairing
 * and done marks. */
static void rv_rotate(struct rv *x, struct cdp_schedule *s, int r, int i, int to, int dir)
{
    struct cdp_instr *l = s->list[r];
    int *pa = x->partner + x->off[r];
    unsigned char *dn = x->done + x->off[r];
    const size_t n = (size_t)(to - i);
    if (dir > 0) {
        const struct cdp_instr t = l[i];
        const int tp = pa[i];
        const unsigned char td = dn[i];
        memmove(l + i, l + i + 1, n * sizeof *l);
        memmove(pa + i, pa + i + 1, n * sizeof *pa);
        memmove(dn + i, dn + i + 1, n);
        l[to] = t, pa[to] = tp, dn[to] = td;
    } else {
        const struct cdp_instr t = l[to];
        const int tp = pa[to];
        const unsigned char td = dn[to];
        memmove(l + i + 1, l + i, n * sizeof *l);
        memmove(pa + i + 1, pa + i, n * sizeof *pa);
        memmove(dn + i + 1, dn + i, n);
        l[i] = t, pa[i] = tp, dn[i] = td;
    }
    for (int q = i; q <= to; q++)
        if (is_comm(l[q].op)) x->partner[x->off[l[q].peer] + (size_t)pa[q]] = q;
}

/* Rank r's group is posted again (its list changed from there on). */
static void rv_repost(struct rv *x, int r)
{
    x->rank[r].end = x->rank[r].at;
    x->rank[r].open = 0;
    rv_push(x, r);
}

/* Moves the sends of rank r's posted group that no receive has met yet to the
 * front of its next group, over the computes between (keeping the order of
 * every send and receive, so NCCL's pairing is unchanged): the group then
 * also waits for what the peer sends first. Not over the weight gradient or
 * backward of an activation's own micro-batch and chunk (which frees its
 * slot), nor over a backward of a gradient's own chunk (which reuses the
 * ring of gradient buffers). Returns 1 when it moved something. */
static int rv_delay_sends(struct rv *x, struct cdp_schedule *s, int r)
{
    const struct rv_rank *me = &x->rank[r];
    struct cdp_instr *l = s->list[r];
    if (me->end <= me->at) return 0;
    int next = me->end;
    while (next < s->len[r] && !is_comm(l[next].op)) next++;
    if (next == s->len[r]) return 0;
    int moved = 0;
    for (int i = me->end - 1; i >= me->at; i--) {
        if (!is_send(l[i].op) || x->done[x->off[r] + (size_t)i]) continue;
        int ok = 1;
        for (int q = me->end; q < next && ok; q++) {
            if (l[i].op == CDP_OP_SEND_ACT)
                ok = !((l[q].op == CDP_OP_BACKWARD_WEIGHT || l[q].op == CDP_OP_BACKWARD) && l[q].mb == l[i].mb &&
                       l[q].chunk == l[i].chunk);
            else
                ok = !((l[q].op == CDP_OP_BACKWARD_INPUT || l[q].op == CDP_OP_BACKWARD) && l[q].chunk == l[i].chunk);
        }
        if (!ok) continue;
        /* over the rest of its group too, to sit right before the next group
         * (the rest are done transfers or receives: their order among
         * themselves stays, and no send passes another to the same peer) */
        const struct cdp_instr t = l[i];
        int to = next - 1;
        for (int q = i + 1; q <= to; q++)
            if (is_send(l[q].op) && l[q].peer == t.peer) to = -1; /* would pass a send to the same peer */
        if (to < 0) continue;
        rv_rotate(x, s, r, i, to, 1);
        next--;
        moved = 1;
    }
    if (moved) rv_repost(x, r);
    return moved;
}

/* For an unmatched send of rank r's posted group whose receive lies beyond
 * the group the peer b is blocked in, moves that receive up into b's group
 * (b then receives it earlier, which only waits earlier): not past another
 * receive from r (NCCL pairs them in order), and a gradient not past a
 * backward of its chunk (whose one gradient buffer it would overwrite).
 * Returns 1 when it moved one. */
static int rv_hoist_receive(struct rv *x, struct cdp_schedule *s, int r)
{
    const struct rv_rank *me = &x->rank[r];
    for (int i = me->at; i < me->end; i++) {
        const struct cdp_instr *in = &s->list[r][i];
        if (!is_send(in->op) || x->done[x->off[r] + (size_t)i]) continue;
        const int b = in->peer, j = x->partner[x->off[r] + (size_t)i];
        const struct rv_rank *pe = &x->rank[b];
        if (pe->end <= pe->at || j < pe->end) continue;
        struct cdp_instr *l = s->list[b];
        int ok = 1;
        for (int q = pe->end; q < j && ok; q++) {
            if (is_comm(l[q].op) && !is_send(l[q].op) && l[q].peer == r) ok = 0;
            if (l[j].op == CDP_OP_RECV_GRAD && (l[q].op == CDP_OP_BACKWARD_INPUT || l[q].op == CDP_OP_BACKWARD) &&
                l[q].chunk == l[j].chunk)
                ok = 0;
            if (l[j].op == CDP_OP_RECV_ACT && l[q].op == CDP_OP_BACKWARD_WEIGHT) ok = 0; /* keeps the slots */
        }
        if (!ok) continue;
        rv_rotate(x, s, b, pe->end, j, -1);
        rv_repost(x, b);
        return 1;
    }
    return 0;
}

static void rv_free(struct rv *x)
{
    free(x->off);
    free(x->rank);
    free(x->stack);
    free(x->queued);
    free(x->partner);
    free(x->done);
}

/* The lists under rendezvous semantics; s has passed cdp_schedule_validate.
 * With fix (a generator's own lists), a run that deadlocks moves a receive
 * up (rv_hoist_receive) or delays the unmatched sends of the first rank that
 * can (rv_delay_sends) and goes on, until it passes or nothing can move;
 * *n_moved counts the moves. */
static cdp_status rendezvous_exec(const struct cdp_schedule *s, struct cdp_schedule *fix, int *n_moved)
{
    int p = s->p;
    cdp_status st = CDP_OK;
    struct rv x = {.s = s};
    x.off = malloc(((size_t)p + 1) * sizeof *x.off);
    x.rank = calloc((size_t)p, sizeof *x.rank);
    x.stack = malloc((size_t)p * sizeof *x.stack);
    x.queued = calloc((size_t)p, 1);
    if (!x.off || !x.rank || !x.stack || !x.queued) goto nomem;
    x.off[0] = 0;
    for (int r = 0; r < p; r++) x.off[r + 1] = x.off[r] + (size_t)s->len[r];
    x.partner = malloc((x.off[p] ? x.off[p] : 1) * sizeof *x.partner);
    x.done = calloc(x.off[p] ? x.off[p] : 1, 1);
    if (!x.partner || !x.done) goto nomem;
    if ((st = rv_pair(&x))) goto done;
    for (int r = p - 1; r >= 0; r--) rv_push(&x, r);
    for (int moved = 1; moved;) {
        while (x.nstack) {
            int r = x.stack[--x.nstack];
            x.queued[r] = 0;
            rv_advance(&x, r);
        }
        moved = 0;
        for (int r = 0; r < p; r++)
            if (x.rank[r].at < s->len[r]) {
                for (int q = 0; fix && q < p && !moved; q++) moved = rv_hoist_receive(&x, fix, q);
                for (int q = 0; fix && q < p && !moved; q++) moved = rv_delay_sends(&x, fix, q);
                if (!moved) st = rv_report(&x);
                else if (n_moved) ++*n_moved;
                break;
            }
    }
    goto done;
nomem:
    st = cdp_fail(CDP_ERR_NOMEM, "schedule validation: out of memory");
done:
    rv_free(&x);
    return st;
}

cdp_status sched_rendezvous_run(const struct cdp_schedule *s) { return rendezvous_exec(s, NULL, NULL); }

cdp_status sched_rendezvous_fix(struct cdp_schedule *s, int *moved)
{
    *moved = 0;
    cdp_status st = cdp_schedule_validate(s);
    return st ? st : rendezvous_exec(s, s, moved);
}

cdp_status cdp_schedule_validate_rendezvous(const struct cdp_schedule *s)
{
    cdp_status st;
    if ((st = cdp_schedule_validate(s))) return st;
    return sched_rendezvous_run(s);
}

