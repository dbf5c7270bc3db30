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
 * work as Megatron does (sched_gen_interleaved_batched), which costs time where
 * sends do not block.
 *
 * Here: the virtual stages, the printed forms and the queries of a built
 * schedule; building is schedule_build.c, the generators schedule_gen.c, the
 * validator schedule_validate.c, the rendezvous (NCCL) simulation
 * schedule_rendezvous.c. */
#include "pipeline/schedule.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/schedule_internal.h"
#include "plan/schedule_kind.h"

/* ---- virtual stages ------------------------------------------------------- */

int cdp_schedule_vstage(enum cdp_schedule_kind kind, int p, int v, int rank, int chunk)
{
    return sched_vstage_of(cdp_schedule_def(kind)->placement == CDP_VSTAGE_V && v == 2, p, v, rank, chunk);
}

void cdp_schedule_vstage_place(enum cdp_schedule_kind kind, int p, int v, int k, int *rank, int *chunk)
{
    sched_vstage_place_of(cdp_schedule_def(kind)->placement == CDP_VSTAGE_V && v == 2, p, v, k, rank, chunk);
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

void cdp_schedule_free(struct cdp_schedule *s)
{
    if (!s) return;
    if (s->list)
        for (int r = 0; r < s->p; r++) free(s->list[r]);
    free(s->list);
    free(s->len);
    free(s);
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
