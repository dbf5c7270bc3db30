/* The schedule IR: generators of per-rank instruction lists (GPipe, 1F1B,
 * interleaved 1F1B), the validator that proves them well formed and
 * deadlock-free by running all ranks together dry, and their printed forms.
 *
 * Placement of communication (what the executor relies on): a receive sits
 * right before the instruction that needs its data (a LOAD, when there is one,
 * comes before the receive so that loading overlaps the wait), a send right
 * after the instruction that produced the data. Sends never block; a receive
 * blocks until the matching send has been issued. */
#include "pipeline/schedule.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"

/* Largest p * v * m a schedule may have: about 100 MB of lists. */
#define MAX_CELLS (1 << 20)

/* ---- virtual stages ------------------------------------------------------- */

static int vstage(const struct cdp_schedule *s, int rank, int chunk) { return chunk * s->p + rank; }
static int vrank(const struct cdp_schedule *s, int k) { return k % s->p; }
static int nvstages(const struct cdp_schedule *s) { return s->p * s->v; }

static int per_mb_op(enum cdp_op op) { return op >= CDP_OP_LOAD && op <= CDP_OP_RECV_GRAD; }
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
    case CDP_OP_SEND_ACT: snprintf(buf, cap, "%ssa%d>%d", pre, in->mb, in->peer); break;
    case CDP_OP_RECV_ACT: snprintf(buf, cap, "%sra%d<%d", pre, in->mb, in->peer); break;
    case CDP_OP_SEND_GRAD: snprintf(buf, cap, "%ssg%d>%d", pre, in->mb, in->peer); break;
    case CDP_OP_RECV_GRAD: snprintf(buf, cap, "%srg%d<%d", pre, in->mb, in->peer); break;
    case CDP_OP_REDUCE_TIED_GRADS: snprintf(buf, cap, "T"); break;
    case CDP_OP_ALLREDUCE_GRADS: snprintf(buf, cap, "A"); break;
    case CDP_OP_OPTIMIZER_STEP: snprintf(buf, cap, "O"); break;
    default: snprintf(buf, cap, "?op%d", (int)in->op); break;
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
    int cap; /* instructions allocated per rank */
};

static void emit(struct builder *b, int r, enum cdp_op op, int mb, int chunk, int peer)
{
    struct cdp_schedule *s = b->s;
    CDP_ASSERT(s->len[r] < b->cap);
    s->list[r][s->len[r]++] = (struct cdp_instr){.op = op, .mb = mb, .chunk = chunk, .peer = peer};
}

/* FORWARD of mb through chunk c on rank r, with its load and communication. */
static void emit_forward(struct builder *b, int r, int mb, int c)
{
    const struct cdp_schedule *s = b->s;
    int k = vstage(s, r, c), last = nvstages(s) - 1;
    /* The first virtual stage loads inputs, the last targets; when one rank
     * holds both (p == 1) the LOAD before the first serves the last too. */
    if (k == 0 || (k == last && s->p > 1)) emit(b, r, CDP_OP_LOAD, mb, c, -1);
    if (k > 0 && vrank(s, k - 1) != r) emit(b, r, CDP_OP_RECV_ACT, mb, c, vrank(s, k - 1));
    emit(b, r, CDP_OP_FORWARD, mb, c, -1);
    if (k < last && vrank(s, k + 1) != r) emit(b, r, CDP_OP_SEND_ACT, mb, c, vrank(s, k + 1));
}

static void emit_backward(struct builder *b, int r, int mb, int c)
{
    const struct cdp_schedule *s = b->s;
    int k = vstage(s, r, c), last = nvstages(s) - 1;
    if (k < last && vrank(s, k + 1) != r) emit(b, r, CDP_OP_RECV_GRAD, mb, c, vrank(s, k + 1));
    emit(b, r, CDP_OP_BACKWARD, mb, c, -1);
    if (k > 0 && vrank(s, k - 1) != r) emit(b, r, CDP_OP_SEND_GRAD, mb, c, vrank(s, k - 1));
}

static void emit_step_end(struct builder *b, int r, int tied)
{
    const struct cdp_schedule *s = b->s;
    /* With one rank the tied embedding and head share one tensor: nothing to sum. */
    if (tied && s->p > 1 && (r == 0 || r == s->p - 1)) emit(b, r, CDP_OP_REDUCE_TIED_GRADS, -1, -1, -1);
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
 * backwards. */
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

cdp_status cdp_schedule_build(enum cdp_schedule_kind kind, int p, int v, int m, int tied,
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
    if (kind != CDP_SCHEDULE_INTERLEAVED && v != 1)
        return cdp_fail(CDP_ERR_INVALID, "schedule %s: needs 1 chunk per rank, got %d (only interleaved "
                        "takes several)", name, v);
    if (kind == CDP_SCHEDULE_INTERLEAVED) {
        if (v < 2)
            return cdp_fail(CDP_ERR_INVALID, "schedule interleaved: needs at least 2 chunks per rank, got %d", v);
        if (p < 2)
            return cdp_fail(CDP_ERR_INVALID, "schedule interleaved: needs at least 2 stages, got %d", p);
        if (m % p)
            return cdp_fail(CDP_ERR_INVALID, "schedule interleaved: %d micro-batches is not a multiple of "
                            "%d stages", m, p);
    }

    struct builder b = {.s = NULL, .cap = 7 * m * v + 3};
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
        switch (kind) {
        case CDP_SCHEDULE_GPIPE: gen_gpipe(&b, r); break;
        case CDP_SCHEDULE_1F1B: gen_1f1b(&b, r); break;
        default: gen_interleaved(&b, r); break;
        }
        emit_step_end(&b, r, tied);
    }
    /* Every list handed out is proven; a failure here is a generator bug. */
    if ((st = cdp_schedule_validate(s))) {
        st = cdp_error_context(CDP_ERR_INTERNAL, "schedule %s (p=%d, v=%d, m=%d) is broken: ", name, p, v, m);
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
        if (in->op == CDP_OP_REDUCE_TIED_GRADS && s->p == 1)
            return bad_at(s, r, i, "one rank holds the first and the last virtual stage: there are no tied "
                          "gradients to sum");
        if (in->op == CDP_OP_REDUCE_TIED_GRADS && r != 0 && r != s->p - 1)
            return bad_at(s, r, i, "only the ranks holding the first and the last virtual stage (0 and %d) "
                          "reduce tied gradients", s->p - 1);
        return CDP_OK;
    }
    if (in->mb < 0 || in->mb >= s->m)
        return bad_at(s, r, i, "micro-batch %d out of range 0..%d", in->mb, s->m - 1);
    if (in->chunk < 0 || in->chunk >= s->v)
        return bad_at(s, r, i, "chunk %d out of range 0..%d", in->chunk, s->v - 1);
    int k = vstage(s, r, in->chunk);
    if (in->op == CDP_OP_LOAD) {
        if (r != 0 && r != s->p - 1)
            return bad_at(s, r, i, "rank %d holds neither the first nor the last virtual stage: it loads nothing", r);
        int want = r == 0 ? 0 : s->v - 1;
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
enum { P_LOAD, P_RA, P_F, P_SA, P_RG, P_B, P_SG, P_COUNT };

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
        [CDP_OP_RECV_GRAD] = P_RG,
    };
    static const char *const verb[] = {
        [P_LOAD] = "loaded", [P_RA] = "has its input received", [P_F] = "forwarded",
        [P_SA] = "has its activation sent", [P_RG] = "has its output gradient received",
        [P_B] = "backwarded", [P_SG] = "has its input gradient sent",
    };

    for (int i = 0; i < s->len[r]; i++) {
        const struct cdp_instr *in = &s->list[r][i];
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
        mbname(s, mb, c, nm, sizeof nm);
        if (first_step >= 0)
            return bad_at(s, r, i, "%s after the step-end instructions began (instruction %d)", nm, first_step);
        int *at = &POS(mb, c, slot[in->op]);
        if (in->op == CDP_OP_LOAD) at = &POS(mb, 0, P_LOAD); /* one load per micro-batch */
        if (*at >= 0) {
            if (in->op == CDP_OP_SEND_ACT || in->op == CDP_OP_SEND_GRAD)
                return bad_at(s, r, i, "%s sent a second time (first at instruction %d): rank %d has one "
                              "receive for it, so this send has no matching receive", nm, *at, in->peer);
            return bad_at(s, r, i, "%s %s a second time (first at instruction %d)", nm,
                          verb[slot[in->op]], *at);
        }
        switch (in->op) {
        case CDP_OP_FORWARD:
            if ((k == 0 || k == last) && POS(mb, 0, P_LOAD) < 0)
                return bad_at(s, r, i, "forward of %s before its LOAD (L%d)", nm, mb);
            if (k > 0 && vrank(s, k - 1) != r && POS(mb, c, P_RA) < 0)
                return bad_at(s, r, i, "forward of %s before its input is received (no %s before it)", nm,
                              cdp_instr_str(&(struct cdp_instr){CDP_OP_RECV_ACT, mb, c, vrank(s, k - 1)}, v,
                                            b, sizeof b));
            if (k > 0 && vrank(s, k - 1) == r && POS(mb, c - 1, P_F) < 0)
                return bad_at(s, r, i, "forward of %s before the forward of chunk %d that feeds it", nm, c - 1);
            break;
        case CDP_OP_SEND_ACT:
            if (POS(mb, c, P_F) < 0) return bad_at(s, r, i, "sends the activation of %s before its forward", nm);
            break;
        case CDP_OP_BACKWARD:
            if (POS(mb, c, P_F) < 0) return bad_at(s, r, i, "backward of %s before its forward", nm);
            if (k < last && vrank(s, k + 1) != r && POS(mb, c, P_RG) < 0)
                return bad_at(s, r, i, "backward of %s before its output gradient is received (no %s before it)",
                              nm, cdp_instr_str(&(struct cdp_instr){CDP_OP_RECV_GRAD, mb, c, vrank(s, k + 1)},
                                                v, b, sizeof b));
            if (k < last && vrank(s, k + 1) == r && POS(mb, c + 1, P_B) < 0)
                return bad_at(s, r, i, "backward of %s before the backward of chunk %d that feeds it", nm, c + 1);
            break;
        case CDP_OP_SEND_GRAD:
            if (POS(mb, c, P_B) < 0) return bad_at(s, r, i, "sends the input gradient of %s before its backward", nm);
            break;
        default: break;
        }
        *at = i;
    }

    /* Everything that must be there is there. */
    for (int mb = 0; mb < m; mb++) {
        if ((r == 0 || r == s->p - 1) && POS(mb, 0, P_LOAD) < 0)
            return cdp_fail(CDP_ERR_INVALID, "rank %d: micro-batch %d is never loaded (no L%d)", r, mb, mb);
        for (int c = 0; c < v; c++) {
            int k = vstage(s, r, c);
            mbname(s, mb, c, nm, sizeof nm);
            if (POS(mb, c, P_F) < 0) return cdp_fail(CDP_ERR_INVALID, "rank %d: %s is never forwarded", r, nm);
            if (POS(mb, c, P_B) < 0) return cdp_fail(CDP_ERR_INVALID, "rank %d: %s is never backwarded", r, nm);
            if (k < last && vrank(s, k + 1) != r && POS(mb, c, P_SA) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: the activation of %s is never sent to rank %d, "
                                "which receives it", r, nm, vrank(s, k + 1));
            if (k > 0 && vrank(s, k - 1) != r && POS(mb, c, P_SG) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: the input gradient of %s is never sent to rank %d, "
                                "which receives it", r, nm, vrank(s, k - 1));
        }
    }
    if (step_at[CDP_OP_ALLREDUCE_GRADS] < 0)
        return cdp_fail(CDP_ERR_INVALID, "rank %d: no ALLREDUCE_GRADS (A) at the end of the list", r);
    if (step_at[CDP_OP_OPTIMIZER_STEP] < 0)
        return cdp_fail(CDP_ERR_INVALID, "rank %d: no OPTIMIZER_STEP (O) at the end of the list", r);
#undef POS
    return CDP_OK;
}

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
            int other = in->op == CDP_OP_REDUCE_TIED_GRADS ? (r == 0 ? p - 1 : 0) : in->peer;
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
    if (s->p > 1) {
        int has[2] = {0, 0};
        for (int e = 0; e < 2; e++) {
            int r = e ? s->p - 1 : 0;
            for (int i = 0; i < s->len[r]; i++) has[e] |= s->list[r][i].op == CDP_OP_REDUCE_TIED_GRADS;
        }
        if (has[0] != has[1])
            return cdp_fail(CDP_ERR_INVALID, "rank %d reduces tied gradients (T) but rank %d does not",
                            has[0] ? 0 : s->p - 1, has[0] ? s->p - 1 : 0);
    }
    return dry_run(s);
}

int cdp_schedule_peak_in_flight(const struct cdp_schedule *s, int rank)
{
    CDP_ASSERT(s && rank >= 0 && rank < s->p);
    int now = 0, peak = 0;
    for (int i = 0; i < s->len[rank]; i++) {
        if (s->list[rank][i].op == CDP_OP_FORWARD && ++now > peak) peak = now;
        if (s->list[rank][i].op == CDP_OP_BACKWARD) now--;
    }
    return peak;
}
