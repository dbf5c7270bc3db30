/* The schedule IR: generators of per-rank instruction lists (GPipe, 1F1B,
 * interleaved 1F1B), the validator that proves them well formed and
 * deadlock-free by running all ranks together dry, and their printed forms.
 *
 * Placement of communication (what the executor relies on): a receive sits
 * right before the instruction that needs its data (a LOAD, when there is one,
 * comes before the receive so that loading overlaps the wait), a send right
 * after the instruction that produced the data. With MPI sends never block and
 * a receive blocks until the matching send has been issued
 * (cdp_schedule_validate); every list the builder gives runs under that. With
 * NCCL each run of consecutive sends and receives is one group that blocks
 * until every transfer in it has met the other side
 * (cdp_schedule_validate_rendezvous): gpipe's and 1f1b's lists run under that
 * too, interleaved's do not, so for NCCL (cdp_schedule_build_ex with
 * rendezvous != 0) interleaved batches sends and receives after each unit of
 * work as Megatron does (gen_interleaved_batched), which costs time where
 * sends do not block. */
#include "pipeline/schedule.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "plan/schedule_kind.h"

/* Largest p * v * m a schedule may have: about 100 MB of lists. */
#define MAX_CELLS (1 << 20)

/* ---- virtual stages ------------------------------------------------------- */

int cdp_schedule_vstage(enum cdp_schedule_kind kind, int p, int v, int rank, int chunk)
{
    if (p < 1 || v < 1 || rank < 0 || rank >= p || chunk < 0 || chunk >= v) return -1;
    if (cdp_schedule_def(kind)->placement == CDP_VSTAGE_V && v == 2) return chunk == 0 ? rank : 2 * p - 1 - rank;
    return chunk * p + rank;
}

void cdp_schedule_vstage_place(enum cdp_schedule_kind kind, int p, int v, int k, int *rank, int *chunk)
{
    CDP_ASSERT(p >= 1 && v >= 1 && k >= 0 && k < p * v);
    if (cdp_schedule_def(kind)->placement == CDP_VSTAGE_V && v == 2) {
        *rank = k < p ? k : 2 * p - 1 - k;
        *chunk = k >= p;
        return;
    }
    *rank = k % p;
    *chunk = k / p;
}

int cdp_schedule_chunks_of(enum cdp_schedule_kind kind, int chunks)
{
    switch (cdp_schedule_def(kind)->chunks) {
    case CDP_CHUNKS_ONE: return 1;
    case CDP_CHUNKS_PLAN: return chunks;
    case CDP_CHUNKS_TWO: return 2;
    }
    return 1;
}

int cdp_schedule_splits_backward(enum cdp_schedule_kind kind) { return cdp_schedule_def(kind)->splits_backward; }

static int vstage(const struct cdp_schedule *s, int rank, int chunk)
{
    return cdp_schedule_vstage(s->kind, s->p, s->v, rank, chunk);
}
static int vrank(const struct cdp_schedule *s, int k)
{
    int r, c;
    cdp_schedule_vstage_place(s->kind, s->p, s->v, k, &r, &c);
    return r;
}
static int vchunk(const struct cdp_schedule *s, int k)
{
    int r, c;
    cdp_schedule_vstage_place(s->kind, s->p, s->v, k, &r, &c);
    return c;
}
static int nvstages(const struct cdp_schedule *s) { return s->p * s->v; }
/* The ranks holding the first and the last virtual stage (the same under zbv
 * and with one rank): they load, and they reduce tied gradients when they differ. */
static int last_rank(const struct cdp_schedule *s) { return vrank(s, nvstages(s) - 1); }
static int tied_other(const struct cdp_schedule *s, int r) { return r == 0 ? last_rank(s) : 0; }

static int is_send(enum cdp_op op) { return op == CDP_OP_SEND_ACT || op == CDP_OP_SEND_GRAD; }
static int per_mb_op(enum cdp_op op) { return op >= CDP_OP_LOAD && op <= CDP_OP_BACKWARD_WEIGHT; }
static int is_comm(enum cdp_op op)
{
    return op == CDP_OP_SEND_ACT || op == CDP_OP_RECV_ACT || op == CDP_OP_SEND_GRAD ||
           op == CDP_OP_RECV_GRAD;
}

/* ---- printing ------------------------------------------------------------- */

const char *cdp_instr_str(const struct cdp_instr *in, int v, char *buf, size_t cap)
{
    char pre[16] = "";
    if (!buf || cap == 0) return buf;
    if (v > 1 && (unsigned)in->op < CDP_OP_COUNT && per_mb_op(in->op) && in->op != CDP_OP_LOAD)
        snprintf(pre, sizeof pre, "%d", in->chunk);
    switch (in->op) {
    case CDP_OP_LOAD: snprintf(buf, cap, "L%d", in->mb); break;
    case CDP_OP_FORWARD: snprintf(buf, cap, "%sF%d", pre, in->mb); break;
    case CDP_OP_BACKWARD: snprintf(buf, cap, "%sB%d", pre, in->mb); break;
    case CDP_OP_BACKWARD_INPUT: snprintf(buf, cap, "%sI%d", pre, in->mb); break;
    case CDP_OP_BACKWARD_WEIGHT: snprintf(buf, cap, "%sW%d", pre, in->mb); break;
    case CDP_OP_SEND_ACT: snprintf(buf, cap, "%ssa%d>%d", pre, in->mb, in->peer); break;
    case CDP_OP_RECV_ACT: snprintf(buf, cap, "%sra%d<%d", pre, in->mb, in->peer); break;
    case CDP_OP_SEND_GRAD: snprintf(buf, cap, "%ssg%d>%d", pre, in->mb, in->peer); break;
    case CDP_OP_RECV_GRAD: snprintf(buf, cap, "%srg%d<%d", pre, in->mb, in->peer); break;
    case CDP_OP_REDUCE_TIED_GRADS: snprintf(buf, cap, "T"); break;
    case CDP_OP_ALLREDUCE_GRADS: snprintf(buf, cap, "A"); break;
    case CDP_OP_OPTIMIZER_STEP: snprintf(buf, cap, "O"); break;
    case CDP_OP_COUNT: snprintf(buf, cap, "?op%d", (int)in->op); break;
    }
    return buf;
}

cdp_status cdp_schedule_print(const struct cdp_schedule *s, FILE *f)
{
    char b[64];
    for (int r = 0; r < s->p; r++) {
        fprintf(f, "rank %d:", r);
        for (int i = 0; i < s->len[r]; i++) fprintf(f, " %s", cdp_instr_str(&s->list[r][i], s->v, b, sizeof b));
        fputc('\n', f);
    }
    if (ferror(f)) return cdp_fail(CDP_ERR_IO, "cannot write the schedule");
    return CDP_OK;
}

cdp_status cdp_schedule_print_json(const struct cdp_schedule *s, FILE *f)
{
    char b[64];
    /* Instruction strings hold only letters, digits, '<' and '>': nothing to escape. */
    fprintf(f, "{\n  \"schedule\": \"%s\",\n  \"stages\": %d,\n  \"chunks\": %d,\n"
               "  \"micro_batches\": %d,\n  \"ranks\": [\n",
            cdp_schedule_name(s->kind), s->p, s->v, s->m);
    for (int r = 0; r < s->p; r++) {
        fputs("    [", f);
        for (int i = 0; i < s->len[r]; i++)
            fprintf(f, "%s\"%s\"", i ? ", " : "", cdp_instr_str(&s->list[r][i], s->v, b, sizeof b));
        fprintf(f, "]%s\n", r + 1 < s->p ? "," : "");
    }
    fputs("  ]\n}\n", f);
    if (ferror(f)) return cdp_fail(CDP_ERR_IO, "cannot write the schedule");
    return CDP_OK;
}

/* ---- building --------------------------------------------------------------- */

static cdp_status rendezvous_run(const struct cdp_schedule *s);
static cdp_status rendezvous_fix(struct cdp_schedule *s);

void cdp_schedule_free(struct cdp_schedule *s)
{
    if (!s) return;
    if (s->list)
        for (int r = 0; r < s->p; r++) free(s->list[r]);
    free(s->list);
    free(s->len);
    free(s);
}

struct builder {
    struct cdp_schedule *s;
    int cap;        /* instructions allocated per rank */
    int rendezvous; /* lists for NCCL's rendezvous send/receive (cdp_schedule_build_ex) */
};

static void emit(struct builder *b, int r, enum cdp_op op, int mb, int chunk, int peer)
{
    struct cdp_schedule *s = b->s;
    CDP_ASSERT(s->len[r] < b->cap);
    s->list[r][s->len[r]++] = (struct cdp_instr){.op = op, .mb = mb, .chunk = chunk, .peer = peer};
}

/* The pieces of a forward and a backward of mb through chunk c on rank r:
 * what must come before it (LOAD, RECV_*), the compute, what goes out after
 * it (SEND_*). emit_forward / emit_backward emit them together; interleaved
 * for NCCL places the communication as Megatron batches it
 * (gen_interleaved_batched). */
static void emit_forward_in(struct builder *b, int r, int mb, int c)
{
    const struct cdp_schedule *s = b->s;
    int k = vstage(s, r, c), last = nvstages(s) - 1;
    /* The first virtual stage loads inputs, the last targets; when one rank
     * holds both (p == 1, zbv) the LOAD before the first serves the last too. */
    if (k == 0 || (k == last && last_rank(s) != 0)) emit(b, r, CDP_OP_LOAD, mb, c, -1);
    if (k > 0 && vrank(s, k - 1) != r) emit(b, r, CDP_OP_RECV_ACT, mb, c, vrank(s, k - 1));
}

static void emit_forward_out(struct builder *b, int r, int mb, int c)
{
    const struct cdp_schedule *s = b->s;
    int k = vstage(s, r, c), last = nvstages(s) - 1;
    if (k < last && vrank(s, k + 1) != r) emit(b, r, CDP_OP_SEND_ACT, mb, c, vrank(s, k + 1));
}

static void emit_backward_in(struct builder *b, int r, int mb, int c)
{
    const struct cdp_schedule *s = b->s;
    int k = vstage(s, r, c), last = nvstages(s) - 1;
    if (k < last && vrank(s, k + 1) != r) emit(b, r, CDP_OP_RECV_GRAD, mb, c, vrank(s, k + 1));
}

static void emit_backward_out(struct builder *b, int r, int mb, int c)
{
    const struct cdp_schedule *s = b->s;
    int k = vstage(s, r, c);
    if (k > 0 && vrank(s, k - 1) != r) emit(b, r, CDP_OP_SEND_GRAD, mb, c, vrank(s, k - 1));
}

static void emit_forward(struct builder *b, int r, int mb, int c)
{
    emit_forward_in(b, r, mb, c);
    emit(b, r, CDP_OP_FORWARD, mb, c, -1);
    emit_forward_out(b, r, mb, c);
}

static void emit_backward(struct builder *b, int r, int mb, int c)
{
    emit_backward_in(b, r, mb, c);
    emit(b, r, CDP_OP_BACKWARD, mb, c, -1);
    emit_backward_out(b, r, mb, c);
}

/* The split backward: the input half with its communication, as
 * emit_backward; the weight half on its own (it talks to no one). */
static void emit_backward_input(struct builder *b, int r, int mb, int c)
{
    emit_backward_in(b, r, mb, c);
    emit(b, r, CDP_OP_BACKWARD_INPUT, mb, c, -1);
    emit_backward_out(b, r, mb, c);
}

static void emit_backward_weight(struct builder *b, int r, int mb, int c) { emit(b, r, CDP_OP_BACKWARD_WEIGHT, mb, c, -1); }

static void emit_step_end(struct builder *b, int r, int tied)
{
    const struct cdp_schedule *s = b->s;
    /* When one rank holds the first and the last virtual stage (p == 1, zbv)
     * the executor sums the tied embedding and head within that rank. */
    if (tied && last_rank(s) != 0 && (r == 0 || r == last_rank(s)))
        emit(b, r, CDP_OP_REDUCE_TIED_GRADS, -1, -1, -1);
    emit(b, r, CDP_OP_ALLREDUCE_GRADS, -1, -1, -1);
    emit(b, r, CDP_OP_OPTIMIZER_STEP, -1, -1, -1);
}

/* GPipe: every forward, then every backward. Backwards run in micro-batch
 * order 0..m-1 (as torch.distributed.pipelining's ScheduleGPipe) rather than
 * the paper's reverse order: both are deadlock-free when every rank uses the
 * same order, and this one accumulates gradients in the order of 1F1B and of
 * the one-rank trainer, so the schedules sum in the same order. */
static void gen_gpipe(struct builder *b, int r)
{
    for (int mb = 0; mb < b->s->m; mb++) emit_forward(b, r, mb, 0);
    for (int mb = 0; mb < b->s->m; mb++) emit_backward(b, r, mb, 0);
}

/* 1F1B (PipeDream-Flush): p - r - 1 warm-up forwards, then forward/backward
 * pairs, then the remaining backwards; rank r keeps at most p - r micro-batches
 * in flight. */
static void gen_1f1b(struct builder *b, int r)
{
    int m = b->s->m, p = b->s->p;
    int warm = p - r - 1 < m ? p - r - 1 : m, steady = m - warm;
    for (int i = 0; i < warm; i++) emit_forward(b, r, i, 0);
    for (int i = 0; i < steady; i++) {
        emit_forward(b, r, warm + i, 0);
        emit_backward(b, r, i, 0);
    }
    for (int i = steady; i < m; i++) emit_backward(b, r, i, 0);
}

/* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024; as
 * torch.distributed.pipelining's ScheduleInterleavedZeroBubble with one
 * chunk): 1F1B's order of forwards and input gradients, min(p-r-1, m) warm-up
 * forwards, then pairs of a forward and the oldest input gradient, then the
 * remaining input gradients; rank r defers its weight gradients by r: after
 * each input gradient past the r-th, the oldest pending weight gradient, and
 * the last r at the end. The weight gradients fill the cool-down's bubble.
 * Rank r keeps at most p micro-batches in flight (F until W), 1F1B's rank-0
 * peak, and r + 1 W-states. At T_F = T_B = T_W = t without communication the
 * step is (3m + p - 1) t (docs/simulator.md). */
static void gen_zb_h1(struct builder *b, int r)
{
    const int m = b->s->m, p = b->s->p;
    int warm = p - r - 1 < m ? p - r - 1 : m, nb = 0, nw = 0;
    for (int i = 0; i < warm; i++) emit_forward(b, r, i, 0);
    for (int i = 0; i < m; i++) {
        if (warm + i < m) emit_forward(b, r, warm + i, 0);
        emit_backward_input(b, r, i, 0);
        if (++nb > r) emit_backward_weight(b, r, nw++, 0);
    }
    while (nw < m) emit_backward_weight(b, r, nw++, 0);
}

/* ZB-H2: the lists of a greedy list schedule of all ranks together at unit
 * times (T_F = T_B = T_W, no communication time), the heuristic of Qi et al.
 * with a memory limit of 2p - 1 micro-batches in flight per rank: at each
 * tick a rank runs its next input gradient if its output gradient has
 * arrived, else its next forward if the input has arrived and fewer than
 * 2p - 1 micro-batches are in flight, else its oldest pending weight
 * gradient, else waits. So the warm-up runs up to 2p - 1 forwards ahead, and
 * weight gradients fill every wait. Every rank idles exactly p - 1 ticks of
 * the 3m + p - 1 (its start-up; nothing in the cool-down), at unit times;
 * unlike zb-h1 its step stays (3m + p - 1) T_F-ish when T_W is smaller than
 * T_F (docs/simulator.md). Fills all ranks' lists; CDP_ERR_NOMEM. */
static cdp_status gen_zb_h2(struct builder *b)
{
    const int m = b->s->m, p = b->s->p, lim = 2 * p - 1;
    int *nf = calloc((size_t)p * 3, sizeof *nf), *fdone = malloc((size_t)p * m * 2 * sizeof *fdone);
    if (!nf || !fdone) {
        free(nf);
        free(fdone);
        return cdp_fail(CDP_ERR_NOMEM, "schedule zb-h2: out of memory");
    }
    int *ni = nf + p, *nw = nf + 2 * p, *idone = fdone + (size_t)p * m;
    for (size_t j = 0; j < (size_t)p * m * 2; j++) fdone[j] = INT32_MAX;
    int64_t left = (int64_t)3 * m * p;
    for (int t = 0; left > 0; t++) {
        for (int r = 0; r < p; r++) {
            const int i = ni[r], f = nf[r];
            if (i < f && (r == p - 1 || idone[(size_t)(r + 1) * m + i] <= t)) {
                emit_backward_input(b, r, i, 0);
                idone[(size_t)r * m + i] = t + 1;
                ni[r]++;
            } else if (f < m && (r == 0 || fdone[(size_t)(r - 1) * m + f] <= t) && f - nw[r] < lim) {
                emit_forward(b, r, f, 0);
                fdone[(size_t)r * m + f] = t + 1;
                nf[r]++;
            } else if (nw[r] < ni[r]) {
                emit_backward_weight(b, r, nw[r]++, 0);
            } else {
                continue;
            }
            left--;
        }
        /* every tick some rank can work: a micro-batch's next step is always ready somewhere */
        CDP_ASSERT(t <= 6 * m * p + 2 * p);
    }
    free(nf);
    free(fdone);
    return CDP_OK;
}

/* ZB-V (Qi et al. 2024, as torch.distributed.pipelining's
 * ScheduleZBVZeroBubble): two chunks per rank in a V, rank r holding virtual
 * stages r (chunk 0) and 2p-1-r (chunk 1). Warm-up: 2(p-r)-1 forwards of
 * chunk 0; r pairs of a chunk-1 forward and a chunk-0 forward; p-r rounds of
 * a chunk-1 forward and a chunk-1 backward (input then weight gradient).
 * Steady: rounds of a chunk-0 forward (while any is left), a chunk-0 backward,
 * a chunk-1 forward, a chunk-1 backward, until every forward is issued. Cool-
 * down: r pairs of a chunk-0 and a chunk-1 input gradient, then input
 * gradients of chunk 1 and chunk 0 in turn (chunk 0's with its weight
 * gradient right after), then every weight gradient still pending, in the
 * order of their input gradients. Each step is skipped when its micro-batch
 * does not exist (m < 2p-1 shortens the phases). Peak 2p chunk activations
 * (half a stage each: 1F1B's rank-0 memory). At unit chunk times the step is
 * 6m + p - 1 + max(0, 2p - 2 - m) (docs/simulator.md). CDP_ERR_NOMEM. */
struct zbv_state {
    struct builder *b;
    int r, m, f0, f1, b0, b1;
    unsigned char *wdone; /* [mb * 2 + chunk]: weight gradient emitted */
};

static void zbv_f0(struct zbv_state *z)
{
    if (z->f0 < z->m) emit_forward(z->b, z->r, z->f0++, 0);
}
static void zbv_f1(struct zbv_state *z)
{
    if (z->f1 < z->m && z->f1 < z->f0) emit_forward(z->b, z->r, z->f1++, 1);
}
/* chunk c's next input gradient, and its weight gradient when w */
static void zbv_bwd(struct zbv_state *z, int c, int w)
{
    int *n = c ? &z->b1 : &z->b0, lim = c ? z->f1 : z->b1;
    if (*n >= z->m || *n >= lim) return;
    emit_backward_input(z->b, z->r, *n, c);
    if (w) {
        emit_backward_weight(z->b, z->r, *n, c);
        z->wdone[*n * 2 + c] = 1;
    }
    (*n)++;
}

static cdp_status gen_zbv(struct builder *b, int r)
{
    const int p = b->s->p;
    struct zbv_state z = {.b = b, .r = r, .m = b->s->m};
    z.wdone = calloc((size_t)z.m * 2, 1);
    if (!z.wdone) return cdp_fail(CDP_ERR_NOMEM, "schedule zbv: out of memory");
    for (int i = 0; i < 2 * (p - r) - 1; i++) zbv_f0(&z);
    for (int i = 0; i < r; i++) {
        zbv_f1(&z);
        zbv_f0(&z);
    }
    for (int i = 0; i < p - r; i++) {
        zbv_f1(&z);
        zbv_bwd(&z, 1, 1);
    }
    while (z.f0 < z.m || z.f1 < z.m) {
        zbv_f0(&z);
        zbv_bwd(&z, 0, 1);
        zbv_f1(&z);
        zbv_bwd(&z, 1, 1);
    }
    const int cool = b->s->len[r];
    for (int i = 0; i < r; i++) {
        zbv_bwd(&z, 0, 0);
        zbv_bwd(&z, 1, 0);
    }
    while (z.b0 < z.m || z.b1 < z.m) {
        zbv_bwd(&z, 1, 0);
        zbv_bwd(&z, 0, 1);
    }
    const int end = b->s->len[r];
    for (int i = cool; i < end; i++) {
        const struct cdp_instr in = b->s->list[r][i];
        if (in.op == CDP_OP_BACKWARD_INPUT && !z.wdone[in.mb * 2 + in.chunk])
            emit_backward_weight(b, r, in.mb, in.chunk);
    }
    free(z.wdone);
    return CDP_OK;
}

/* For NCCL's rendezvous send/receive, the zero-bubble lists keep their order
 * of compute and their communication but move every LOAD back over the sends
 * and receives right before it, so that the sends of one compute and the
 * receives of the next form one group: zb-h2's and zbv's warm-ups run more
 * forwards than 1F1B's, and with the LOAD between them rank 0's send of an
 * activation and rank 1's send of a gradient wait on each other (p = 2,
 * m = 3 already). A LOAD needs nothing, so it may run earlier. */
static void loads_before_exchanges(struct builder *b, int r)
{
    struct cdp_instr *l = b->s->list[r];
    for (int i = 1; i < b->s->len[r]; i++) {
        if (l[i].op != CDP_OP_LOAD) continue;
        int j = i;
        while (j > 0 && is_comm(l[j - 1].op)) j--;
        const struct cdp_instr ld = l[i];
        memmove(l + j + 1, l + j, (size_t)(i - j) * sizeof *l);
        l[j] = ld;
    }
}

/* What travels: activation or gradient, micro-batch, and the sending virtual
 * stage. A send and a receive match when these are equal. */
struct wire {
    int grad, mb, from;
};

static struct wire wire_of(const struct cdp_schedule *s, int r, const struct cdp_instr *in);

/* NCCL has no tags: the k-th send from rank a to rank b lands in the k-th
 * receive b posts from a. zbv's V sends a rank's chunk-0 activations and its
 * chunk-1 gradients to the same neighbour in an order of its own; so, for
 * NCCL, each rank b posts its receives from each peer a in the order a sends:
 * at the place of its k-th receive from a it puts the receive that matches a's
 * k-th send, taken from where it was (always later in the list: the ones
 * before are the matches of a's earlier sends). A receive so moved earlier
 * only waits earlier. CDP_ERR_INTERNAL if a gradient would then arrive in its
 * chunk's one gradient buffer before the backward of the previous one (a
 * generator bug); CDP_ERR_NOMEM. */
static cdp_status receives_in_send_order(struct builder *b)
{
    struct cdp_schedule *s = b->s;
    const int p = s->p;
    int *sends = malloc(((size_t)b->cap + 1) * sizeof *sends);
    if (!sends) return cdp_fail(CDP_ERR_NOMEM, "schedule: out of memory");
    cdp_status st = CDP_OK;
    for (int r = 0; r < p && !st; r++)
        for (int a = 0; a < p && !st; a++) {
            if (a == r) continue;
            int ns = 0, k = 0;
            for (int i = 0; i < s->len[a]; i++)
                if (is_comm(s->list[a][i].op) && is_send(s->list[a][i].op) && s->list[a][i].peer == r) sends[ns++] = i;
            struct cdp_instr *l = s->list[r];
            for (int i = 0; i < s->len[r] && k < ns; i++) {
                if (!is_comm(l[i].op) || is_send(l[i].op) || l[i].peer != a) continue;
                const struct wire w = wire_of(s, a, &s->list[a][sends[k++]]);
                int j = i;
                for (; j < s->len[r]; j++) {
                    if (!is_comm(l[j].op) || is_send(l[j].op) || l[j].peer != a) continue;
                    const struct wire x = wire_of(s, r, &l[j]);
                    if (x.grad == w.grad && x.mb == w.mb && x.from == w.from) break;
                }
                if (j == s->len[r] || j == i) continue; /* unmatched: the validator names it */
                const struct cdp_instr rc = l[j];
                for (int q = i; q < j && rc.op == CDP_OP_RECV_GRAD; q++)
                    if ((l[q].op == CDP_OP_BACKWARD || l[q].op == CDP_OP_BACKWARD_INPUT) && l[q].chunk == rc.chunk) {
                        st = cdp_fail(CDP_ERR_INTERNAL, "schedule %s: rank %d would receive the gradient of "
                                      "micro-batch %d on chunk %d before the backward of micro-batch %d",
                                      cdp_schedule_name(s->kind), r, rc.mb, rc.chunk, l[q].mb);
                        break;
                    }
                if (st) break;
                memmove(l + i + 1, l + i, (size_t)(j - i) * sizeof *l);
                l[i] = rc;
            }
        }
    free(sends);
    return st;
}

/* Megatron's get_model_chunk_id and micro-batch of the k-th forward (or
 * backward) of a rank: virtual micro-batches go in groups of p * v, p
 * micro-batches through chunk 0, the same p through chunk 1, ...; backwards
 * visit the chunks in reverse. */
static void interleaved_map(const struct cdp_schedule *s, int k, int forward, int *mb, int *chunk)
{
    int group = k / (s->p * s->v), in_group = k % (s->p * s->v);
    int c = in_group / s->p;
    *chunk = forward ? c : s->v - 1 - c;
    *mb = group * s->p + in_group % s->p;
}

/* Interleaved 1F1B (Megatron-LM forward_backward_pipelining_with_interleaving):
 * (p - r - 1) * 2 + (v - 1) * p warm-up forwards (all m * v when that is more),
 * then pairs of the next forward and the oldest backward, then the remaining
 * backwards. Where sends do not block (MPI, the simulator) each send goes
 * right after its compute and each receive right before its use, as in gpipe
 * and 1f1b; for NCCL, gen_interleaved_batched. */
static void gen_interleaved(struct builder *b, int r)
{
    const struct cdp_schedule *s = b->s;
    int total = s->m * s->v;
    int warm = (s->p - r - 1) * 2 + (s->v - 1) * s->p;
    if (warm > total) warm = total;
    int mb, c;
    for (int k = 0; k < warm; k++) {
        interleaved_map(s, k, 1, &mb, &c);
        emit_forward(b, r, mb, c);
    }
    for (int k = 0; k < total - warm; k++) {
        interleaved_map(s, k + warm, 1, &mb, &c);
        emit_forward(b, r, mb, c);
        interleaved_map(s, k, 0, &mb, &c);
        emit_backward(b, r, mb, c);
    }
    for (int k = total - warm; k < total; k++) {
        interleaved_map(s, k, 0, &mb, &c);
        emit_backward(b, r, mb, c);
    }
}

/* Interleaved 1F1B for NCCL's rendezvous send/receive: gen_interleaved's
 * order of compute, with communication where Megatron batches it, one
 * exchange after each unit of work: after warm-up forward k, its send and the
 * receive for forward k + 1 (the last warm-up forward adds the receive for
 * backward 0); after a steady pair, both sends and the receives for the next
 * pair; after a cool-down backward, its send and the receive for the next
 * backward. With every send right after its compute and every receive right
 * before its use (gen_interleaved), virtual stages wrapping around the ranks
 * split these exchanges into groups that wait on each other in a cycle under
 * rendezvous semantics (p = 2, v = 2, m = 4 already deadlocks); batched this
 * way every list passes cdp_schedule_validate_rendezvous. Within an exchange
 * the SEND_GRAD goes before the SEND_ACT and the RECV_GRAD before the
 * RECV_ACT: with p = 2 both travel between the same two ranks, and NCCL pairs
 * them in posting order. The LOAD of the next forward stays right before its
 * RECV_ACT, after the rest of the exchange. The price where sends never block
 * (MPI, the simulator), and why cdp_schedule_build keeps gen_interleaved: an
 * activation leaves after the paired backward rather than right after its
 * forward, and the next backward's gradient is awaited before the next
 * forward. */
static void gen_interleaved_batched(struct builder *b, int r)
{
    const struct cdp_schedule *s = b->s;
    int total = s->m * s->v;
    int warm = (s->p - r - 1) * 2 + (s->v - 1) * s->p;
    if (warm > total) warm = total;
    int mb, c, bmb, bc;
    interleaved_map(s, 0, 1, &mb, &c);
    emit_forward_in(b, r, mb, c);
    for (int k = 0; k < warm; k++) {
        interleaved_map(s, k, 1, &mb, &c);
        emit(b, r, CDP_OP_FORWARD, mb, c, -1);
        emit_forward_out(b, r, mb, c);
        if (k == warm - 1) {
            interleaved_map(s, 0, 0, &mb, &c);
            emit_backward_in(b, r, mb, c);
        }
        if (k + 1 < total) {
            interleaved_map(s, k + 1, 1, &mb, &c);
            emit_forward_in(b, r, mb, c);
        }
    }
    for (int k = 0; k < total - warm; k++) {
        interleaved_map(s, k + warm, 1, &mb, &c);
        interleaved_map(s, k, 0, &bmb, &bc);
        emit(b, r, CDP_OP_FORWARD, mb, c, -1);
        emit(b, r, CDP_OP_BACKWARD, bmb, bc, -1);
        emit_backward_out(b, r, bmb, bc);
        emit_forward_out(b, r, mb, c);
        interleaved_map(s, k + 1, 0, &bmb, &bc);
        emit_backward_in(b, r, bmb, bc);
        if (k + warm + 1 < total) {
            interleaved_map(s, k + warm + 1, 1, &mb, &c);
            emit_forward_in(b, r, mb, c);
        }
    }
    for (int k = total - warm; k < total; k++) {
        interleaved_map(s, k, 0, &mb, &c);
        emit(b, r, CDP_OP_BACKWARD, mb, c, -1);
        emit_backward_out(b, r, mb, c);
        if (k + 1 < total) {
            interleaved_map(s, k + 1, 0, &mb, &c);
            emit_backward_in(b, r, mb, c);
        }
    }
}

cdp_status cdp_schedule_build(enum cdp_schedule_kind kind, int p, int v, int m, int tied,
                              struct cdp_schedule **out)
{
    return cdp_schedule_build_ex(kind, p, v, m, tied, 0, out);
}

cdp_status cdp_schedule_build_ex(enum cdp_schedule_kind kind, int p, int v, int m, int tied, int rendezvous,
                                 struct cdp_schedule **out)
{
    cdp_status st;
    if ((unsigned)kind >= CDP_SCHEDULE_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "schedule: unknown kind %d", (int)kind);
    const char *name = cdp_schedule_name(kind);
    if (p < 1 || v < 1 || m < 1)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: stages, chunks and micro-batches must be positive, "
                        "got %d, %d, %d", name, p, v, m);
    if ((int64_t)p * v * m > MAX_CELLS)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: %d stages x %d chunks x %d micro-batches is more "
                        "than %d", name, p, v, m, MAX_CELLS);
    const struct cdp_schedule_def *def = cdp_schedule_def(kind);
    if (def->chunks == CDP_CHUNKS_TWO && v != 2)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: runs exactly 2 chunks per rank (a V), got %d", name, v);
    if (def->chunks == CDP_CHUNKS_ONE && v != 1)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: needs 1 chunk per rank, got %d (only interleaved "
                        "and zbv take several)", name, v);
    if (def->chunks == CDP_CHUNKS_PLAN && v < 2)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: needs at least 2 chunks per rank, got %d", name, v);
    if (p < def->min_stages)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: needs at least %d stages, got %d", name, def->min_stages, p);
    if (def->mb_multiple_of_stages && m % p)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: %d micro-batches is not a multiple of %d stages", name, m, p);

    struct builder b = {.s = NULL, .cap = 8 * m * v + 3, .rendezvous = rendezvous != 0};
    struct cdp_schedule *s = calloc(1, sizeof *s);
    if (!s) return cdp_fail(CDP_ERR_NOMEM, "schedule: out of memory");
    *s = (struct cdp_schedule){.kind = kind, .p = p, .v = v, .m = m};
    b.s = s;
    s->len = calloc((size_t)p, sizeof *s->len);
    s->list = calloc((size_t)p, sizeof *s->list);
    if (!s->len || !s->list) goto nomem;
    for (int r = 0; r < p; r++) {
        s->list[r] = malloc((size_t)b.cap * sizeof *s->list[r]);
        if (!s->list[r]) goto nomem;
    }
    if (kind == CDP_SCHEDULE_ZB_H2 && (st = gen_zb_h2(&b))) goto fail;
    for (int r = 0; r < p; r++) {
        switch (kind) {
        case CDP_SCHEDULE_GPIPE: gen_gpipe(&b, r); break;
        case CDP_SCHEDULE_1F1B: gen_1f1b(&b, r); break;
        case CDP_SCHEDULE_ZB_H1: gen_zb_h1(&b, r); break;
        case CDP_SCHEDULE_ZB_H2: break; /* above: all ranks together */
        case CDP_SCHEDULE_ZBV:
            if ((st = gen_zbv(&b, r))) goto fail;
            break;
        case CDP_SCHEDULE_INTERLEAVED:
        case CDP_SCHEDULE_COUNT:
            if (b.rendezvous) gen_interleaved_batched(&b, r);
            else gen_interleaved(&b, r);
            break;
        }
    }
    if (b.rendezvous && cdp_schedule_splits_backward(kind)) {
        if ((st = receives_in_send_order(&b))) goto fail;
        for (int r = 0; r < p; r++) loads_before_exchanges(&b, r);
    }
    for (int r = 0; r < p; r++) emit_step_end(&b, r, tied);
    if (b.rendezvous && cdp_schedule_splits_backward(kind) && (st = rendezvous_fix(s))) {
        st = cdp_error_context(CDP_ERR_INTERNAL, "schedule %s (p=%d, v=%d, m=%d, rendezvous) is broken: ", name, p,
                               v, m);
        goto fail;
    }
    /* Every list handed out is proven for buffered (MPI) send/receive, and
     * for rendezvous (NCCL) send/receive too when it is meant for that; a
     * failure here is a generator bug. */
    if ((st = cdp_schedule_validate(s)) || (b.rendezvous && (st = rendezvous_run(s)))) {
        st = cdp_error_context(CDP_ERR_INTERNAL, "schedule %s (p=%d, v=%d, m=%d%s) is broken: ", name, p, v, m,
                               b.rendezvous ? ", rendezvous" : "");
        goto fail;
    }
    *out = s;
    return CDP_OK;
nomem:
    st = cdp_fail(CDP_ERR_NOMEM, "schedule: out of memory for %d ranks x %d instructions", p, b.cap);
fail:
    cdp_schedule_free(s);
    return st;
}

/* ---- validation ---------------------------------------------------------------- */

static cdp_status bad_at(const struct cdp_schedule *s, int r, int i, const char *fmt, ...) CDP_PRINTF(4, 5);
static cdp_status bad_at(const struct cdp_schedule *s, int r, int i, const char *fmt, ...)
{
    char msg[512], b[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cdp_fail(CDP_ERR_INVALID, "rank %d, instruction %d (%s): %s", r, i,
                    cdp_instr_str(&s->list[r][i], s->v, b, sizeof b), msg);
}

/* "micro-batch 3" or, with chunks, "micro-batch 3 on chunk 1". */
static const char *mbname(const struct cdp_schedule *s, int mb, int c, char *buf, size_t cap)
{
    if (s->v > 1) snprintf(buf, cap, "micro-batch %d on chunk %d", mb, c);
    else snprintf(buf, cap, "micro-batch %d", mb);
    return buf;
}

/* Fields in range, and sends / receives only where the neighbouring virtual
 * stage is on another rank, addressed to that rank. */
static cdp_status check_fields(const struct cdp_schedule *s, int r, int i)
{
    const struct cdp_instr *in = &s->list[r][i];
    int last = nvstages(s) - 1;
    if ((unsigned)in->op >= CDP_OP_COUNT) return bad_at(s, r, i, "unknown operation %d", (int)in->op);
    if (!per_mb_op(in->op)) {
        if (in->mb != -1 || in->chunk != -1 || in->peer != -1)
            return bad_at(s, r, i, "a step-level instruction has micro-batch, chunk and peer -1, got %d, %d, %d",
                          in->mb, in->chunk, in->peer);
        if (in->op == CDP_OP_REDUCE_TIED_GRADS && last_rank(s) == 0)
            return bad_at(s, r, i, "one rank holds the first and the last virtual stage: there are no tied "
                          "gradients to sum");
        if (in->op == CDP_OP_REDUCE_TIED_GRADS && r != 0 && r != last_rank(s))
            return bad_at(s, r, i, "only the ranks holding the first and the last virtual stage (0 and %d) "
                          "reduce tied gradients", last_rank(s));
        return CDP_OK;
    }
    if (in->mb < 0 || in->mb >= s->m)
        return bad_at(s, r, i, "micro-batch %d out of range 0..%d", in->mb, s->m - 1);
    if (in->chunk < 0 || in->chunk >= s->v)
        return bad_at(s, r, i, "chunk %d out of range 0..%d", in->chunk, s->v - 1);
    int k = vstage(s, r, in->chunk);
    if (in->op == CDP_OP_LOAD) {
        if (r != 0 && r != last_rank(s))
            return bad_at(s, r, i, "rank %d holds neither the first nor the last virtual stage: it loads nothing", r);
        int want = r == 0 ? 0 : vchunk(s, last);
        if (in->chunk != want)
            return bad_at(s, r, i, "a LOAD on rank %d feeds chunk %d, not %d", r, want, in->chunk);
        if (in->peer != -1) return bad_at(s, r, i, "peer %d on an instruction that talks to no one", in->peer);
        return CDP_OK;
    }
    if (!is_comm(in->op)) {
        if (in->peer != -1) return bad_at(s, r, i, "peer %d on an instruction that talks to no one", in->peer);
        return CDP_OK;
    }
    /* Activations go to k + 1 and come from k - 1; gradients the other way. */
    int to_next = in->op == CDP_OP_SEND_ACT || in->op == CDP_OP_RECV_GRAD;
    int nk = to_next ? k + 1 : k - 1;
    const char *what = in->op == CDP_OP_SEND_ACT || in->op == CDP_OP_SEND_GRAD ? "send" : "receive";
    if (nk < 0 || nk > last)
        return bad_at(s, r, i, "virtual stage %d is the %s: there is no %s stage, so no matching %s", k,
                      nk < 0 ? "first" : "last", nk < 0 ? "previous" : "next",
                      what[0] == 's' ? "receive" : "send");
    if (vrank(s, nk) == r)
        return bad_at(s, r, i, "virtual stage %d is on this rank too: nothing to %s", nk, what);
    if (in->peer != vrank(s, nk))
        return bad_at(s, r, i, "the peer is rank %d, but virtual stage %d is on rank %d: no matching %s there",
                      in->peer, nk, vrank(s, nk), what[0] == 's' ? "receive" : "send");
    return CDP_OK;
}

/* Positions of each rank's instructions, per (mb, chunk); -1 = not seen. */
enum { P_LOAD, P_RA, P_F, P_SA, P_RG, P_B, P_SG, P_I, P_W, P_COUNT };

static cdp_status check_rank(const struct cdp_schedule *s, int r, int *pos /* m*v*P_COUNT */)
{
    int v = s->v, m = s->m, last = nvstages(s) - 1;
    int step_at[CDP_OP_COUNT], first_step = -1;
    char nm[64], b[64];
    for (int j = 0; j < m * v * P_COUNT; j++) pos[j] = -1;
    for (int j = 0; j < CDP_OP_COUNT; j++) step_at[j] = -1;
#define POS(mb, c, what) pos[((mb) * v + (c)) * P_COUNT + (what)]
    static const int slot[] = {
        [CDP_OP_LOAD] = P_LOAD,     [CDP_OP_FORWARD] = P_F,   [CDP_OP_SEND_ACT] = P_SA,
        [CDP_OP_RECV_ACT] = P_RA,   [CDP_OP_BACKWARD] = P_B,  [CDP_OP_SEND_GRAD] = P_SG,
        [CDP_OP_RECV_GRAD] = P_RG,  [CDP_OP_BACKWARD_INPUT] = P_I, [CDP_OP_BACKWARD_WEIGHT] = P_W,
    };
    static const char *const verb[] = {
        [P_LOAD] = "loaded", [P_RA] = "has its input received", [P_F] = "forwarded",
        [P_SA] = "has its activation sent", [P_RG] = "has its output gradient received",
        [P_B] = "backwarded", [P_SG] = "has its input gradient sent",
        [P_I] = "input-gradient backwarded (I)", [P_W] = "weight-gradient backwarded (W)",
    };

    for (int i = 0; i < s->len[r]; i++) {
        const struct cdp_instr *in = &s->list[r][i];
        if (s->forward_only && in->op != CDP_OP_LOAD && in->op != CDP_OP_RECV_ACT && in->op != CDP_OP_FORWARD &&
            in->op != CDP_OP_SEND_ACT)
            return bad_at(s, r, i, "a forward-only schedule holds only LOAD, RECV_ACT, FORWARD and SEND_ACT");
        if (!per_mb_op(in->op)) {
            if (step_at[in->op] >= 0)
                return bad_at(s, r, i, "repeated (first at instruction %d)", step_at[in->op]);
            if (in->op == CDP_OP_REDUCE_TIED_GRADS && step_at[CDP_OP_ALLREDUCE_GRADS] >= 0)
                return bad_at(s, r, i, "tied gradients reduced after the all-reduce (instruction %d)",
                              step_at[CDP_OP_ALLREDUCE_GRADS]);
            if (in->op != CDP_OP_OPTIMIZER_STEP && step_at[CDP_OP_OPTIMIZER_STEP] >= 0)
                return bad_at(s, r, i, "after the optimizer step (instruction %d)", step_at[CDP_OP_OPTIMIZER_STEP]);
            step_at[in->op] = i;
            if (first_step < 0) first_step = i;
            continue;
        }
        int mb = in->mb, c = in->chunk, k = vstage(s, r, c);
        /* the name is written only into a message (validation runs on every list built) */
#define NM mbname(s, mb, c, nm, sizeof nm)
        if (first_step >= 0)
            return bad_at(s, r, i, "%s after the step-end instructions began (instruction %d)", NM, first_step);
        int *at = &POS(mb, c, slot[in->op]);
        if (in->op == CDP_OP_LOAD) at = &POS(mb, 0, P_LOAD); /* one load per micro-batch */
        if (*at >= 0) {
            if (in->op == CDP_OP_SEND_ACT || in->op == CDP_OP_SEND_GRAD)
                return bad_at(s, r, i, "%s sent a second time (first at instruction %d): rank %d has one "
                              "receive for it, so this send has no matching receive", NM, *at, in->peer);
            return bad_at(s, r, i, "%s %s a second time (first at instruction %d)", NM,
                          verb[slot[in->op]], *at);
        }
        switch (in->op) {
        case CDP_OP_FORWARD:
            if ((k == 0 || k == last) && POS(mb, 0, P_LOAD) < 0)
                return bad_at(s, r, i, "forward of %s before its LOAD (L%d)", NM, mb);
            if (k > 0 && vrank(s, k - 1) != r && POS(mb, c, P_RA) < 0)
                return bad_at(s, r, i, "forward of %s before its input is received (no %s before it)", NM,
                              cdp_instr_str(&(struct cdp_instr){CDP_OP_RECV_ACT, mb, c, vrank(s, k - 1)}, v,
                                            b, sizeof b));
            if (k > 0 && vrank(s, k - 1) == r && POS(mb, vchunk(s, k - 1), P_F) < 0)
                return bad_at(s, r, i, "forward of %s before the forward of chunk %d that feeds it", NM,
                              vchunk(s, k - 1));
            break;
        case CDP_OP_SEND_ACT:
            if (POS(mb, c, P_F) < 0) return bad_at(s, r, i, "sends the activation of %s before its forward", NM);
            break;
        case CDP_OP_BACKWARD:
        case CDP_OP_BACKWARD_INPUT: {
            const int other = in->op == CDP_OP_BACKWARD ? P_I : P_B;
            if (POS(mb, c, other) >= 0)
                return bad_at(s, r, i, "%s has a %s backward at instruction %d too: a backward is either one B "
                              "or an I and a W", NM, other == P_I ? "split" : "combined", POS(mb, c, other));
            if (POS(mb, c, P_F) < 0) return bad_at(s, r, i, "backward of %s before its forward", NM);
            if (k < last && vrank(s, k + 1) != r && POS(mb, c, P_RG) < 0)
                return bad_at(s, r, i, "backward of %s before its output gradient is received (no %s before it)",
                              NM, cdp_instr_str(&(struct cdp_instr){CDP_OP_RECV_GRAD, mb, c, vrank(s, k + 1)},
                                                v, b, sizeof b));
            const int nc = k < last ? vchunk(s, k + 1) : 0;
            if (k < last && vrank(s, k + 1) == r && POS(mb, nc, P_B) < 0 && POS(mb, nc, P_I) < 0)
                return bad_at(s, r, i, "backward of %s before the backward of chunk %d that feeds it", NM, nc);
            break;
        }
        case CDP_OP_BACKWARD_WEIGHT:
            if (POS(mb, c, P_B) >= 0)
                return bad_at(s, r, i, "%s has a combined backward (B) at instruction %d: a backward is either one "
                              "B or an I and a W", NM, POS(mb, c, P_B));
            if (POS(mb, c, P_I) < 0)
                return bad_at(s, r, i, "weight gradient of %s before its input gradient (no %s before it)", NM,
                              cdp_instr_str(&(struct cdp_instr){CDP_OP_BACKWARD_INPUT, mb, c, -1}, v, b, sizeof b));
            break;
        case CDP_OP_SEND_GRAD:
            if (POS(mb, c, P_B) < 0 && POS(mb, c, P_I) < 0)
                return bad_at(s, r, i, "sends the input gradient of %s before its backward", NM);
            break;
        case CDP_OP_LOAD:
        case CDP_OP_RECV_ACT:
        case CDP_OP_RECV_GRAD:
        case CDP_OP_REDUCE_TIED_GRADS:
        case CDP_OP_ALLREDUCE_GRADS:
        case CDP_OP_OPTIMIZER_STEP:
        case CDP_OP_COUNT:
            break;
        }
        *at = i;
    }

    /* Everything that must be there is there. */
    for (int mb = 0; mb < m; mb++) {
        if ((r == 0 || r == last_rank(s)) && POS(mb, 0, P_LOAD) < 0)
            return cdp_fail(CDP_ERR_INVALID, "rank %d: micro-batch %d is never loaded (no L%d)", r, mb, mb);
        for (int c = 0; c < v; c++) {
            int k = vstage(s, r, c);
            if (POS(mb, c, P_F) < 0) return cdp_fail(CDP_ERR_INVALID, "rank %d: %s is never forwarded", r, NM);
            if (!s->forward_only && POS(mb, c, P_B) < 0 && POS(mb, c, P_I) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: %s is never backwarded", r, NM);
            if (POS(mb, c, P_I) >= 0 && POS(mb, c, P_W) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: %s has its input gradient (I%d at instruction %d) but "
                                "never its weight gradient (no W%d before the step-end instructions)", r, NM, mb,
                                POS(mb, c, P_I), mb);
            if (k < last && vrank(s, k + 1) != r && POS(mb, c, P_SA) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: the activation of %s is never sent to rank %d, "
                                "which receives it", r, NM, vrank(s, k + 1));
            if (!s->forward_only && k > 0 && vrank(s, k - 1) != r && POS(mb, c, P_SG) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: the input gradient of %s is never sent to rank %d, "
                                "which receives it", r, NM, vrank(s, k - 1));
        }
    }
    if (s->forward_only) return CDP_OK;
    if (step_at[CDP_OP_ALLREDUCE_GRADS] < 0)
        return cdp_fail(CDP_ERR_INVALID, "rank %d: no ALLREDUCE_GRADS (A) at the end of the list", r);
    if (step_at[CDP_OP_OPTIMIZER_STEP] < 0)
        return cdp_fail(CDP_ERR_INVALID, "rank %d: no OPTIMIZER_STEP (O) at the end of the list", r);
#undef POS
    return CDP_OK;
}
#undef NM

/* The executor's semantics, without the work: sends complete at once, a
 * receive waits until its send has been issued, REDUCE_TIED_GRADS waits for
 * the other tied rank to reach its own. */
static cdp_status dry_run(const struct cdp_schedule *s)
{
    int p = s->p, V = nvstages(s);
    cdp_status st = CDP_OK;
    int *pc = calloc((size_t)p, sizeof *pc);
    /* sent[(kind * m + mb) * V + sender virtual stage]; kind 0 = activation, 1 = gradient */
    unsigned char *sent = calloc((size_t)2 * s->m * V, 1);
    int at_tied[2] = {0, 0};
    if (!pc || !sent) {
        st = cdp_fail(CDP_ERR_NOMEM, "schedule validation: out of memory");
        goto done;
    }
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++) {
            while (pc[r] < s->len[r]) {
                const struct cdp_instr *in = &s->list[r][pc[r]];
                int k = in->chunk >= 0 ? vstage(s, r, in->chunk) : -1;
                if (in->op == CDP_OP_RECV_ACT && !sent[(size_t)in->mb * V + k - 1]) break;
                if (in->op == CDP_OP_RECV_GRAD && !sent[((size_t)s->m + in->mb) * V + k + 1]) break;
                if (in->op == CDP_OP_SEND_ACT) sent[(size_t)in->mb * V + k] = 1;
                if (in->op == CDP_OP_SEND_GRAD) sent[((size_t)s->m + in->mb) * V + k] = 1;
                if (in->op == CDP_OP_REDUCE_TIED_GRADS) {
                    at_tied[r != 0] = 1;
                    if (!at_tied[r == 0]) break;
                }
                pc[r]++;
                progress = 1;
            }
        }
    }
    int stuck = 0;
    for (int r = 0; r < p; r++) stuck |= pc[r] < s->len[r];
    if (stuck) {
        char msg[4096], b[64];
        size_t n = (size_t)snprintf(msg, sizeof msg, "deadlock: no rank can go on;");
        for (int r = 0; r < p && n < sizeof msg; r++) {
            if (pc[r] >= s->len[r]) {
                n += (size_t)snprintf(msg + n, sizeof msg - n, "%s rank %d has finished", r ? "," : "", r);
                continue;
            }
            const struct cdp_instr *in = &s->list[r][pc[r]];
            int other = in->op == CDP_OP_REDUCE_TIED_GRADS ? tied_other(s, r) : in->peer;
            n += (size_t)snprintf(msg + n, sizeof msg - n, "%s rank %d waits at instruction %d (%s) for rank %d",
                                  r ? "," : "", r, pc[r], cdp_instr_str(in, s->v, b, sizeof b), other);
        }
        st = cdp_fail(CDP_ERR_INVALID, "%s", msg);
    }
done:
    free(pc);
    free(sent);
    return st;
}

cdp_status cdp_schedule_validate(const struct cdp_schedule *s)
{
    cdp_status st;
    if (!s) return cdp_fail(CDP_ERR_INVALID, "schedule: none given");
    if (s->p < 1 || s->v < 1 || s->m < 1)
        return cdp_fail(CDP_ERR_INVALID, "schedule: stages, chunks and micro-batches must be positive, got %d, %d, %d",
                        s->p, s->v, s->m);
    if ((int64_t)s->p * s->v * s->m > MAX_CELLS)
        return cdp_fail(CDP_ERR_INVALID, "schedule: %d stages x %d chunks x %d micro-batches is more than %d",
                        s->p, s->v, s->m, MAX_CELLS);
    if (!s->len || !s->list) return cdp_fail(CDP_ERR_INVALID, "schedule: no lists");
    for (int r = 0; r < s->p; r++) {
        if (s->len[r] < 0 || (s->len[r] > 0 && !s->list[r]))
            return cdp_fail(CDP_ERR_INVALID, "rank %d: no list (length %d)", r, s->len[r]);
        for (int i = 0; i < s->len[r]; i++)
            if ((st = check_fields(s, r, i))) return st;
    }
    int *pos = malloc((size_t)s->m * s->v * P_COUNT * sizeof *pos);
    if (!pos) return cdp_fail(CDP_ERR_NOMEM, "schedule validation: out of memory");
    for (int r = 0; r < s->p; r++)
        if ((st = check_rank(s, r, pos))) break;
    free(pos);
    if (st) return st;
    /* Tied gradients are summed by the first and the last rank together. */
    if (last_rank(s) != 0) {
        int has[2] = {0, 0}, lr = last_rank(s);
        for (int e = 0; e < 2; e++) {
            int r = e ? lr : 0;
            for (int i = 0; i < s->len[r]; i++) has[e] |= s->list[r][i].op == CDP_OP_REDUCE_TIED_GRADS;
        }
        if (has[0] != has[1])
            return cdp_fail(CDP_ERR_INVALID, "rank %d reduces tied gradients (T) but rank %d does not",
                            has[0] ? 0 : lr, has[0] ? lr : 0);
    }
    return dry_run(s);
}

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


static struct wire wire_of(const struct cdp_schedule *s, int r, const struct cdp_instr *in)
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
    CDP_ASSERT(!"wire_of: not a send or a receive");
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
            struct wire ws = wire_of(s, a, in), wr = wire_of(s, b, &s->list[b][j]);
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

/* Moves the sends of rank r's posted group that no receive has met yet to the
 * front of its next group, over the computes between (keeping the order of
 * every send and receive, so NCCL's pairing is unchanged): the group then
 * also waits for what the peer sends first. Not over the weight gradient or
 * backward of an activation's own micro-batch and chunk (which frees its
 * slot), nor over a backward of a gradient's own chunk (which reuses the
 * ring of gradient buffers). Returns 1 when it moved something. */
static int rv_delay_sends(const struct rv *x, struct cdp_schedule *s, int r)
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
        memmove(l + i, l + i + 1, (size_t)(to - i) * sizeof *l);
        l[to] = t;
        next--;
        moved = 1;
    }
    return moved;
}

/* For an unmatched send of rank r's posted group whose receive lies beyond
 * the group the peer b is blocked in, moves that receive up into b's group
 * (b then receives it earlier, which only waits earlier): not past another
 * receive from r (NCCL pairs them in order), and a gradient not past a
 * backward of its chunk (whose one gradient buffer it would overwrite).
 * Returns 1 when it moved one. */
static int rv_hoist_receive(const struct rv *x, struct cdp_schedule *s, int r)
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
        const struct cdp_instr t = l[j];
        memmove(l + pe->end + 1, l + pe->end, (size_t)(j - pe->end) * sizeof *l);
        l[pe->end] = t;
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
 * With fix (a generator's own lists), a run that deadlocks delays the
 * unmatched sends of the first rank that can (rv_delay_sends) and runs again,
 * until it passes or nothing can move. */
static cdp_status rendezvous_exec(const struct cdp_schedule *s, struct cdp_schedule *fix)
{
    int p = s->p;
    cdp_status st = CDP_OK;
again:;
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
    while (x.nstack) {
        int r = x.stack[--x.nstack];
        x.queued[r] = 0;
        rv_advance(&x, r);
    }
    for (int r = 0; r < p; r++)
        if (x.rank[r].at < s->len[r]) {
            int moved = 0;
            for (int q = 0; fix && q < p && !moved; q++) moved = rv_hoist_receive(&x, fix, q);
            for (int q = 0; fix && q < p && !moved; q++) moved = rv_delay_sends(&x, fix, q);
            if (moved) {
                rv_free(&x);
                goto again;
            }
            st = rv_report(&x);
            break;
        }
    goto done;
nomem:
    st = cdp_fail(CDP_ERR_NOMEM, "schedule validation: out of memory");
done:
    rv_free(&x);
    return st;
}

static cdp_status rendezvous_run(const struct cdp_schedule *s) { return rendezvous_exec(s, NULL); }

/* Generator lists for NCCL: every deadlock under rendezvous semantics
 * resolved by delaying sends into the next group (rendezvous_exec). */
static cdp_status rendezvous_fix(struct cdp_schedule *s)
{
    cdp_status st = cdp_schedule_validate(s);
    return st ? st : rendezvous_exec(s, s);
}

cdp_status cdp_schedule_validate_rendezvous(const struct cdp_schedule *s)
{
    cdp_status st;
    if ((st = cdp_schedule_validate(s))) return st;
    return rendezvous_run(s);
}

int cdp_schedule_peak_in_flight(const struct cdp_schedule *s, int rank)
{
    CDP_ASSERT(s && rank >= 0 && rank < s->p);
    int now = 0, peak = 0;
    for (int i = 0; i < s->len[rank]; i++) {
        const struct cdp_instr *in = &s->list[rank][i];
        /* a slot is taken by the receive of the input when there is one (lists
         * for NCCL may receive it ahead of the forward), else by the forward */
        int takes = in->op == CDP_OP_RECV_ACT;
        if (in->op == CDP_OP_FORWARD) {
            const int k = vstage(s, rank, in->chunk);
            takes = k == 0 || vrank(s, k - 1) == rank;
        }
        if (takes && ++now > peak) peak = now;
        if (in->op == CDP_OP_BACKWARD || in->op == CDP_OP_BACKWARD_WEIGHT) now--;
    }
    return peak;
}

int cdp_schedule_peak_w_pending(const struct cdp_schedule *s, int rank)
{
    CDP_ASSERT(s && rank >= 0 && rank < s->p);
    int now = 0, peak = 0;
    for (int i = 0; i < s->len[rank]; i++) {
        if (s->list[rank][i].op == CDP_OP_BACKWARD_INPUT && ++now > peak) peak = now;
        if (s->list[rank][i].op == CDP_OP_BACKWARD_WEIGHT) now--;
    }
    return peak;
}
