/* The forward-only schedule (schedule.h, cdp_schedule_build_forward): the lists
 * that validation, `cdphybrid eval` and the pipeline's other forward passes run,
 * the same IR as a training step's without its backward and step-end
 * instructions, proven by the same validator. */
#include <stdlib.h>

#include "cdp/core.h"
#include "pipeline/schedule.h"
#include "plan/schedule_kind.h"

cdp_status cdp_schedule_build_forward(enum cdp_schedule_kind kind, int p, int v, int m, struct cdp_schedule **out)
{
    if ((unsigned)kind >= CDP_SCHEDULE_COUNT) return cdp_fail(CDP_ERR_INVALID, "schedule: unknown kind %d", (int)kind);
    if (p < 1 || v < 1 || m < 1)
        return cdp_fail(CDP_ERR_INVALID, "forward schedule: stages, chunks and micro-batches must be positive, "
                        "got %d, %d, %d", p, v, m);
    /* LOAD, RECV_ACT, FORWARD, SEND_ACT at most per micro-batch and chunk */
    if ((int64_t)p * v * m > (1 << 20) || (int64_t)4 * v * m > INT32_MAX / 2)
        return cdp_fail(CDP_ERR_INVALID, "forward schedule: %d stages x %d chunks x %d micro-batches is too many",
                        p, v, m);
    const int cap = 4 * v * m;
    struct cdp_schedule *s = calloc(1, sizeof *s);
    int *order = malloc((size_t)v * sizeof *order);
    cdp_status st = CDP_OK;
    if (!s || !order) goto nomem;
    *s = (struct cdp_schedule){.kind = kind, .p = p, .v = v, .m = m, .forward_only = 1};
    s->len = calloc((size_t)p, sizeof *s->len);
    s->list = calloc((size_t)p, sizeof *s->list);
    if (!s->len || !s->list) goto nomem;
    const int nv = p * v;
    int last_rank, last_chunk;
    cdp_schedule_vstage_place(kind, p, v, nv - 1, &last_rank, &last_chunk);
    for (int r = 0; r < p; r++) {
        if (!(s->list[r] = malloc((size_t)cap * sizeof *s->list[r]))) goto nomem;
        /* this rank's chunks in the order a micro-batch meets them */
        for (int c = 0; c < v; c++) order[c] = c;
        for (int i = 1; i < v; i++)
            for (int j = i; j > 0 && cdp_schedule_vstage(kind, p, v, r, order[j]) <
                                         cdp_schedule_vstage(kind, p, v, r, order[j - 1]); j--) {
                const int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        struct cdp_instr *list = s->list[r];
        int n = 0;
        /* micro-batch after micro-batch, each through this rank's chunks: the
         * order every rank agrees on, so that no receive waits on a send that
         * comes after it anywhere (deadlock-free also under rendezvous sends) */
        for (int mb = 0; mb < m; mb++)
            for (int i = 0; i < v; i++) {
                const int c = order[i], k = cdp_schedule_vstage(kind, p, v, r, c);
                int pr = -1, nr = -1, x;
                if (k > 0) cdp_schedule_vstage_place(kind, p, v, k - 1, &pr, &x);
                if (k < nv - 1) cdp_schedule_vstage_place(kind, p, v, k + 1, &nr, &x);
                /* as a training step: the first virtual stage loads the inputs, the
                 * last the targets, one LOAD where one rank holds both */
                if (k == 0 || (k == nv - 1 && last_rank != 0))
                    list[n++] = (struct cdp_instr){CDP_OP_LOAD, mb, c, -1};
                if (k > 0 && pr != r) list[n++] = (struct cdp_instr){CDP_OP_RECV_ACT, mb, c, pr};
                list[n++] = (struct cdp_instr){CDP_OP_FORWARD, mb, c, -1};
                if (k < nv - 1 && nr != r) list[n++] = (struct cdp_instr){CDP_OP_SEND_ACT, mb, c, nr};
            }
        CDP_ASSERT(n <= cap);
        s->len[r] = n;
    }
    free(order);
    order = NULL;
    /* proven like every list handed out; a failure is a generator bug */
    if ((st = cdp_schedule_validate(s)) || (st = cdp_schedule_validate_rendezvous(s))) {
        st = cdp_error_context(CDP_ERR_INTERNAL, "forward schedule %s (p=%d, v=%d, m=%d) is broken: ",
                               cdp_schedule_name(kind), p, v, m);
        goto fail;
    }
    *out = s;
    return CDP_OK;
nomem:
    st = cdp_fail(CDP_ERR_NOMEM, "forward schedule: out of memory");
fail:
    free(order);
    cdp_schedule_free(s);
    return st;
}
