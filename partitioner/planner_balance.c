/* What the planner reports of the chosen layout besides its step: each
 * stage's time and memory, and the balance of replicas on mixed devices
 * (docs/planner.md, "Mixed GPUs"). */
#include "partitioner/planner.h"
#include "partitioner/planner_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/optim.h"
#include "partitioner/host.h"
#include "partitioner/partition.h"
#include "partitioner/placement.h"
#include "pipeline/balance.h"
#include "pipeline/schedule.h"
#include "plan/schedule_kind.h"

/* A device's model without the vendor's words, for the balance table. */
static const char *short_name(const struct cdp_topology *t, int d)
{
    const char *n = t->gpus[d].name;
    if (t->kind == CDP_TOPOLOGY_CPU) return "CPU";
    if (!strncmp(n, "NVIDIA ", 7)) n += 7;
    if (!strncmp(n, "Tesla ", 6)) n += 6;
    return n;
}

/* How much longer device d takes than device 0, whose rate the costs are in:
 * rate(device 0) / rate(d) for the plan's precision. */
static double slowdown(const struct cdp_plan *plan, const struct cdp_topology *t, const struct cdp_device_rate *r0,
                       int d)
{
    const struct cdp_topology_gpu *a = &t->gpus[0], *g = &t->gpus[d];
    if (a->peak_fp32 == g->peak_fp32 && a->peak_tf32 == g->peak_tf32 && a->peak_bf16 == g->peak_bf16) return 1;
    const struct cdp_device_rate r = cdp_device_rate_of(t, d, plan->train.precision);
    return (r0->flops * r0->efficiency) / (r.flops * r.efficiency);
}

/* "A100-SXM4-80GB x2", or "A100-SXM4-80GB x1 + V100-SXM2-16GB x1": the
 * devices of replica r, models in stage order. */
static void replica_devices(const struct cdp_topology *t, const int *device, int p, int R, int r, char *buf,
                            size_t cap)
{
    enum { MAX_KINDS = 4 };
    const char *name[MAX_KINDS];
    int count[MAX_KINDS], kinds = 0, other = 0;
    for (int s = 0; s < p; s++) {
        const char *n = short_name(t, device[s * R + r]);
        int k = 0;
        while (k < kinds && strcmp(name[k], n)) k++;
        if (k == kinds && kinds == MAX_KINDS) {
            other++;
            continue;
        }
        if (k == kinds) name[kinds] = n, count[kinds++] = 0;
        count[k]++;
    }
    size_t o = 0;
    buf[0] = '\0';
    for (int k = 0; k < kinds && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s x%d", k ? " + " : "", name[k], count[k]);
    if (other && o < cap) snprintf(buf + o, cap - o, " + %d others", other);
}

/* The balance of the chosen plan (docs/planner.md, "Mixed GPUs"): each
 * replica's time per micro-batch on its slowest stage with its own devices,
 * and the shares the plan asks for. The predicted steps are filled once the
 * layout is simulated (cdp_planner_balance_predict). */
cdp_status cdp_planner_balance_result(const struct ctx *c, const int *device, int p, int R, int m,
                                      const struct cdp_planner_stage *stage, struct cdp_planner_balance *b)
{
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    b->kind = pd->balance;
    b->shares = calloc((size_t)R, sizeof *b->shares);
    b->t_s = calloc((size_t)R, sizeof *b->t_s);
    b->devices = calloc((size_t)R, sizeof *b->devices);
    if (!b->shares || !b->t_s || !b->devices) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    const struct cdp_device_rate r0 = cdp_device_rate_of(c->t, 0, c->plan->train.precision);
    for (int r = 0; r < R; r++) {
        double t = 0;
        for (int s = 0; s < p; s++) {
            const double x = (stage[s].fwd_s + stage[s].bwd_s) * slowdown(c->plan, c->t, &r0, device[s * R + r]);
            if (x > t) t = x;
        }
        b->t_s[r] = t;
        replica_devices(c->t, device, p, R, r, b->devices[r], sizeof b->devices[r]);
    }
    switch (pd->balance) {
    case CDP_BALANCE_EXPLICIT:
        if (pd->n_shares != R)
            return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/balance: %d shares for %d replicas", c->plan->source,
                            pd->n_shares, R);
        memcpy(b->shares, pd->shares, (size_t)R * sizeof *b->shares);
        break;
    case CDP_BALANCE_SPEED: {
        if (c->zero >= 2) { /* ZeRO-2: every replica the same micro-batches */
            for (int r = 0; r < R; r++) b->shares[r] = m;
            break;
        }
        /* shares in multiples of p only where the schedule needs them (the
         * table's rule, as the executor's rebalancing takes it): interleaved,
         * not zbv, whose two chunks run any m */
        const int64_t unit = cdp_schedule_def(c->kind)->mb_multiple_of_stages ? p : 1;
        cdp_status st = cdp_balance_shares(b->t_s, R, p, (int64_t)R * m, unit, 0, b->shares);
        if (st) return cdp_error_context(st, "%s: planner", c->plan->source);
        break;
    }
    case CDP_BALANCE_UNIFORM:
    case CDP_BALANCE_KIND_COUNT:
        for (int r = 0; r < R; r++) b->shares[r] = m;
        break;
    }
    return CDP_OK;
}

/* The steps with the shares and with uniform ones (cdp_balance_step_time plus
 * the simulated tail: the step after its forward/backward phase). */
cdp_status cdp_planner_balance_predict(int p, int R, int m, double step_s, double phase_s, struct cdp_planner_balance *b)
{
    int64_t *uniform = malloc((size_t)R * sizeof *uniform);
    if (!uniform) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int r = 0; r < R; r++) uniform[r] = m;
    b->rest_s = step_s > phase_s ? step_s - phase_s : 0;
    b->step_s = cdp_balance_step_time(b->t_s, R, p, b->shares) + b->rest_s;
    b->uniform_step_s = cdp_balance_step_time(b->t_s, R, p, uniform) + b->rest_s;
    b->gain = b->step_s > 0 ? b->uniform_step_s / b->step_s - 1 : 0;
    free(uniform);
    return CDP_OK;
}

/* Per-stage predictions of a layout: forward/backward per micro-batch (all
 * chunks) and the most device memory of its ranks against their least cap. */
void cdp_planner_stage_predictions(const struct ctx *c, const struct cdp_layout *l, struct cdp_planner_stage *stage)
{
    for (int s = 0; s < l->stages; s++) {
        struct cdp_planner_stage *ps = &stage[s];
        memset(ps, 0, sizeof *ps);
        for (int ch = 0; ch < l->chunks; ch++) {
            const int k = cdp_schedule_vstage(l->schedule, l->stages, l->chunks, s, ch);
            for (int64_t i = l->ranges[k][0]; i < l->ranges[k][1]; i++) {
                ps->fwd_s += c->cost[i].fwd_s;
                ps->bwd_s += c->cost[i].bwd_s;
            }
        }
    }
    for (int i = 0; i < l->n_ranks; i++) {
        struct cdp_planner_stage *ps = &stage[l->rank[i].stage];
        ps->memory_bytes = fmax(ps->memory_bytes, (double)l->rank[i].memory.device);
        const double cap = (double)l->rank[i].capacity;
        if (cap > 0 && (ps->capacity_bytes <= 0 || cap < ps->capacity_bytes)) ps->capacity_bytes = cap;
    }
}
