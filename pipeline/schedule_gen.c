/* The schedule IR (schedule.h): one generator per schedule family (GPipe,
 * 1F1B, ZB-H1, ZB-H2, ZB-V, interleaved 1F1B and its batched form for NCCL),
 * each emitting a rank's list through the builder (schedule_build.c). */
#include "pipeline/schedule.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/schedule_internal.h"
#include "plan/schedule_kind.h"

/* GPipe: every forward, then every backward. Backwards run in micro-batch
 * order 0..m-1 (as torch.distributed.pipelining's ScheduleGPipe) rather than
 * the paper's reverse order: both are deadlock-free when every rank uses the
 * same order, and this one accumulates gradients in the order of 1F1B and of
 * the one-rank trainer, so the schedules sum in the same order. */
void sched_gen_gpipe(struct builder *b, int r)
{
    for (int mb = 0; mb < b->s->m; mb++) sched_emit_forward(b, r, mb, 0);
    for (int mb = 0; mb < b->s->m; mb++) sched_emit_backward(b, r, mb, 0);
}

/* 1F1B (PipeDream-Flush): p - r - 1 warm-up forwards, then forward/backward
 * pairs, then the remaining backwards; rank r keeps at most p - r micro-batches
 * in flight. */
void sched_gen_1f1b(struct builder *b, int r)
{
    int m = b->s->m, p = b->s->p;
    int warm = p - r - 1 < m ? p - r - 1 : m, steady = m - warm;
    for (int i = 0; i < warm; i++) sched_emit_forward(b, r, i, 0);
    for (int i = 0; i < steady; i++) {
        sched_emit_forward(b, r, warm + i, 0);
        sched_emit_backward(b, r, i, 0);
    }
    for (int i = steady; i < m; i++) sched_emit_backward(b, r, i, 0);
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
void sched_gen_zb_h1(struct builder *b, int r)
{
    const int m = b->s->m, p = b->s->p;
    int warm = p - r - 1 < m ? p - r - 1 : m, nb = 0, nw = 0;
    for (int i = 0; i < warm; i++) sched_emit_forward(b, r, i, 0);
    for (int i = 0; i < m; i++) {
        if (warm + i < m) sched_emit_forward(b, r, warm + i, 0);
        sched_emit_backward_input(b, r, i, 0);
        if (++nb > r) sched_emit_backward_weight(b, r, nw++, 0);
    }
    while (nw < m) sched_emit_backward_weight(b, r, nw++, 0);
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
cdp_status sched_gen_zb_h2(struct builder *b)
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
                sched_emit_backward_input(b, r, i, 0);
                idone[(size_t)r * m + i] = t + 1;
                ni[r]++;
            } else if (f < m && (r == 0 || fdone[(size_t)(r - 1) * m + f] <= t) && f - nw[r] < lim) {
                sched_emit_forward(b, r, f, 0);
                fdone[(size_t)r * m + f] = t + 1;
                nf[r]++;
            } else if (nw[r] < ni[r]) {
                sched_emit_backward_weight(b, r, nw[r]++, 0);
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
    if (z->f0 < z->m) sched_emit_forward(z->b, z->r, z->f0++, 0);
}
static void zbv_f1(struct zbv_state *z)
{
    if (z->f1 < z->m && z->f1 < z->f0) sched_emit_forward(z->b, z->r, z->f1++, 1);
}
/* chunk c's next input gradient, and its weight gradient when w */
static void zbv_bwd(struct zbv_state *z, int c, int w)
{
    int *n = c ? &z->b1 : &z->b0, lim = c ? z->f1 : z->b1;
    if (*n >= z->m || *n >= lim) return;
    sched_emit_backward_input(z->b, z->r, *n, c);
    if (w) {
        sched_emit_backward_weight(z->b, z->r, *n, c);
        z->wdone[*n * 2 + c] = 1;
    }
    (*n)++;
}

cdp_status sched_gen_zbv(struct builder *b, int r)
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
            sched_emit_backward_weight(b, r, in.mb, in.chunk);
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
 * and 1f1b; for NCCL, sched_gen_interleaved_batched. */
void sched_gen_interleaved(struct builder *b, int r)
{
    const struct cdp_schedule *s = b->s;
    int total = s->m * s->v;
    int warm = (s->p - r - 1) * 2 + (s->v - 1) * s->p;
    if (warm > total) warm = total;
    int mb, c;
    for (int k = 0; k < warm; k++) {
        interleaved_map(s, k, 1, &mb, &c);
        sched_emit_forward(b, r, mb, c);
    }
    for (int k = 0; k < total - warm; k++) {
        interleaved_map(s, k + warm, 1, &mb, &c);
        sched_emit_forward(b, r, mb, c);
        interleaved_map(s, k, 0, &mb, &c);
        sched_emit_backward(b, r, mb, c);
    }
    for (int k = total - warm; k < total; k++) {
        interleaved_map(s, k, 0, &mb, &c);
        sched_emit_backward(b, r, mb, c);
    }
}

/* Interleaved 1F1B for NCCL's rendezvous send/receive: sched_gen_interleaved's
 * order of compute, with communication where Megatron batches it, one
 * exchange after each unit of work: after warm-up forward k, its send and the
 * receive for forward k + 1 (the last warm-up forward adds the receive for
 * backward 0); after a steady pair, both sends and the receives for the next
 * pair; after a cool-down backward, its send and the receive for the next
 * backward. With every send right after its compute and every receive right
 * before its use (sched_gen_interleaved), virtual stages wrapping around the ranks
 * split these exchanges into groups that wait on each other in a cycle under
 * rendezvous semantics (p = 2, v = 2, m = 4 already deadlocks); batched this
 * way every list passes cdp_schedule_validate_rendezvous. Within an exchange
 * the SEND_GRAD goes before the SEND_ACT and the RECV_GRAD before the
 * RECV_ACT: with p = 2 both travel between the same two ranks, and NCCL pairs
 * them in posting order. The LOAD of the next forward stays right before its
 * RECV_ACT, after the rest of the exchange. The price where sends never block
 * (MPI, the simulator), and why cdp_schedule_build keeps sched_gen_interleaved: an
 * activation leaves after the paired backward rather than right after its
 * forward, and the next backward's gradient is awaited before the next
 * forward. */
void sched_gen_interleaved_batched(struct builder *b, int r)
{
    const struct cdp_schedule *s = b->s;
    int total = s->m * s->v;
    int warm = (s->p - r - 1) * 2 + (s->v - 1) * s->p;
    if (warm > total) warm = total;
    int mb, c, bmb, bc;
    interleaved_map(s, 0, 1, &mb, &c);
    sched_emit_forward_in(b, r, mb, c);
    for (int k = 0; k < warm; k++) {
        interleaved_map(s, k, 1, &mb, &c);
        sched_emit(b, r, CDP_OP_FORWARD, mb, c, -1);
        sched_emit_forward_out(b, r, mb, c);
        if (k == warm - 1) {
            interleaved_map(s, 0, 0, &mb, &c);
            sched_emit_backward_in(b, r, mb, c);
        }
        if (k + 1 < total) {
            interleaved_map(s, k + 1, 1, &mb, &c);
            sched_emit_forward_in(b, r, mb, c);
        }
    }
    for (int k = 0; k < total - warm; k++) {
        interleaved_map(s, k + warm, 1, &mb, &c);
        interleaved_map(s, k, 0, &bmb, &bc);
        sched_emit(b, r, CDP_OP_FORWARD, mb, c, -1);
        sched_emit(b, r, CDP_OP_BACKWARD, bmb, bc, -1);
        sched_emit_backward_out(b, r, bmb, bc);
        sched_emit_forward_out(b, r, mb, c);
        interleaved_map(s, k + 1, 0, &bmb, &bc);
        sched_emit_backward_in(b, r, bmb, bc);
        if (k + warm + 1 < total) {
            interleaved_map(s, k + warm + 1, 1, &mb, &c);
            sched_emit_forward_in(b, r, mb, c);
        }
    }
    for (int k = total - warm; k < total; k++) {
        interleaved_map(s, k, 0, &mb, &c);
        sched_emit(b, r, CDP_OP_BACKWARD, mb, c, -1);
        sched_emit_backward_out(b, r, mb, c);
        if (k + 1 < total) {
            interleaved_map(s, k + 1, 0, &mb, &c);
            sched_emit_backward_in(b, r, mb, c);
        }
    }
}

