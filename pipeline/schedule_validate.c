/* The schedule IR (schedule.h): the validator, which proves a schedule's
 * lists well formed and deadlock-free under MPI semantics (sends never block)
 * by running every rank together dry. */
#include "pipeline/schedule.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/schedule_internal.h"
#include "plan/schedule_kind.h"

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
            if (POS(mb, c, P_B) < 0 && POS(mb, c, P_I) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: %s is never backwarded", r, NM);
            if (POS(mb, c, P_I) >= 0 && POS(mb, c, P_W) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: %s has its input gradient (I%d at instruction %d) but "
                                "never its weight gradient (no W%d before the step-end instructions)", r, NM, mb,
                                POS(mb, c, P_I), mb);
            if (k < last && vrank(s, k + 1) != r && POS(mb, c, P_SA) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: the activation of %s is never sent to rank %d, "
                                "which receives it", r, NM, vrank(s, k + 1));
            if (k > 0 && vrank(s, k - 1) != r && POS(mb, c, P_SG) < 0)
                return cdp_fail(CDP_ERR_INVALID, "rank %d: the input gradient of %s is never sent to rank %d, "
                                "which receives it", r, NM, vrank(s, k - 1));
        }
    }
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

