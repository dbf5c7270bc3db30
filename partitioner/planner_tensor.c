/* The planner's tensor parallelism (docs/parallelism.md, "How the planner
 * chooses t"): which t the model and the topology allow (every group inside
 * one node's fastest link domain), what a unit becomes on a rank of a group of
 * t (its split work and memory divided by t, layernorm and residual kept
 * whole), and the time of the group's collectives, added to the units' time
 * as not overlapped with compute. */
#include "partitioner/planner.h"
#include "partitioner/planner_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cdp/core.h"
#include "model/costs.h"
#include "model/layer_def.h"
#include "model/layers.h"

/* Units that split over a tensor group in the planner's cost model: the GPT
 * family's (attention by heads, MLP column then row, vocab-parallel embedding
 * and head). */
static int splits(enum cdp_layer_type ty)
{
    return ty == CDP_LAYER_TRANSFORMER_BLOCK || ty == CDP_LAYER_LLAMA_BLOCK || ty == CDP_LAYER_EMBEDDING ||
           ty == CDP_LAYER_LM_HEAD;
}

/* Whether the planner estimates unit u's slice here: a GPT-family unit whose
 * type does not split itself yet (a type that does is built as its slice by
 * cdp_units_build_tensor, and must not be divided twice). */
static int estimated(const struct cdp_unit *u)
{
    return splits(u->desc.type) && !cdp_layer_def(u->desc.type)->tensor_ok;
}

static int is_block(enum cdp_layer_type ty)
{
    return ty == CDP_LAYER_TRANSFORMER_BLOCK || ty == CDP_LAYER_LLAMA_BLOCK;
}

/* A list type that splits itself and sums its [T, C] output over the group
 * (GPT's attention, Llama's rotary_attention and swiglu_mlp): one all-reduce
 * forward, one of its input's gradient backward. */
static int is_list_split(enum cdp_layer_type ty)
{
    return ty == CDP_LAYER_ATTENTION || ty == CDP_LAYER_ROTARY_ATTENTION || ty == CDP_LAYER_SWIGLU_MLP;
}

/* Whether devices [d, d + tp) are one node's and every pair of them is linked
 * by NVLink or an NVSwitch; else why not. */
static int in_domain(const struct cdp_topology *t, int d, int tp, char *why, size_t cap)
{
    for (int a = d; a < d + tp; a++) {
        if (a >= t->n_gpus || t->gpus[a].node != t->gpus[d].node) {
            snprintf(why, cap, "devices %d to %d are not on one node", d, d + tp - 1);
            return 0;
        }
        for (int b = d; b < a; b++) {
            struct cdp_topology_link l;
            if (cdp_topology_link(t, a, b, &l) || (l.cls != CDP_LINK_NVLINK && l.cls != CDP_LINK_NVSWITCH)) {
                char lab[32];
                snprintf(why, cap, "devices %d and %d are linked by %s, not NVLink or NVSwitch", b, a,
                         cdp_topology_link_label(&l, lab, sizeof lab));
                return 0;
            }
        }
    }
    return 1;
}

int cdp_planner_tensor_choices(const struct cdp_plan *plan, const struct cdp_topology *t, int *out, int cap,
                               char *why, size_t why_cap)
{
    const struct cdp_model_desc *m = &plan->model;
    why[0] = '\0';
    out[0] = 1;
    int n = 1;
    if (plan->parallel.tensor != CDP_AUTO) {
        out[0] = (int)plan->parallel.tensor;
        return 1;
    }
    /* a layer list splits where its linears say so ("split"), every other layer passing slices on */
    int64_t widths = 0; /* the gcd of the column splits' widths */
    if (m->kind != CDP_MODEL_GPT) {
        int any = 0;
        for (int i = 0; i < m->n_layers; i++) {
            const struct cdp_layer_desc *L = &m->layer_list[i];
            if (!cdp_layer_def(L->type)->tensor_ok) {
                snprintf(why, why_cap, "t = 1: layer %d (%s) does not split over a tensor group", i,
                         cdp_layer_name(L->type));
                return 1;
            }
            if ((L->type == CDP_LAYER_LINEAR && L->split != CDP_TSPLIT_NONE) || cdp_layer_def(L->type)->tensor_splits)
                any = 1;
            if (L->type == CDP_LAYER_LINEAR && L->split == CDP_TSPLIT_COLUMN)
                for (int64_t a = widths, b = L->out; ; ) { /* gcd */
                    if (!b) { widths = a; break; }
                    const int64_t r = a % b;
                    a = b, b = r;
                }
        }
        if (!any) {
            snprintf(why, why_cap, "t = 1: no linear of /model/layers has a \"split\" and no layer splits itself "
                     "(a block, attention, rotary_attention, swiglu_mlp)");
            return 1;
        }
    }
    if (t->kind == CDP_TOPOLOGY_CPU || !cdp_backend_is_gpu(plan->cluster.backend)) {
        snprintf(why, why_cap, "t = 1: the devices are CPUs (no NVLink domain)");
        return 1;
    }
    /* the smallest node bounds a group */
    int per_node = t->n_gpus;
    for (int d = 0, run = 0; d < t->n_gpus; d++) {
        run = d > 0 && t->gpus[d].node == t->gpus[d - 1].node ? run + 1 : 1;
        if (d + 1 == t->n_gpus || t->gpus[d + 1].node != t->gpus[d].node)
            if (run < per_node) per_node = run;
    }
    char last[256] = "";
    for (int tp = 2; tp <= per_node && n < cap; tp *= 2) {
        if (m->kind != CDP_MODEL_GPT && widths % tp) {
            snprintf(last, sizeof last, "t = %d does not divide the column splits' widths (their gcd %lld)", tp,
                     (long long)widths);
            break;
        }
        const char *key = NULL;
        int64_t value = 0;
        const int at = cdp_model_desc_tensor_misfit(m, tp, &key, &value);
        if (at >= 0) {
            if (m->kind == CDP_MODEL_GPT)
                snprintf(last, sizeof last, "t = %d does not divide /model/%s (%lld)", tp, key, (long long)value);
            else
                snprintf(last, sizeof last, "t = %d does not divide /model/layers/%d/%s (%lld)", tp, at, key,
                         (long long)value);
            break;
        }
        /* every group of every node inside the fastest domain */
        int ok = 1;
        char w[200] = "";
        for (int d = 0; d + tp <= t->n_gpus && ok;) {
            ok = in_domain(t, d, tp, w, sizeof w);
            d += tp;
            while (d < t->n_gpus && d > 0 && t->gpus[d].node == t->gpus[d - 1].node && t->gpus[d].local % tp) d++;
        }
        if (!ok) {
            snprintf(last, sizeof last, "t = %d would cross the NVLink domain: %s", tp, w);
            break;
        }
        out[n++] = tp;
    }
    if (last[0]) snprintf(why, why_cap, "t <= %d: %s", out[n - 1], last);
    else if (out[n - 1] == per_node) snprintf(why, why_cap, "t <= %d: the devices of a node", per_node);
    return n;
}

/* Megatron-LM's activations of a block per token and width (s b h): 34 + 5 a s / h
 * without tensor parallelism, of which 10 (layernorm inputs, residual,
 * dropout masks) stay whole on every rank and 24 split; attention's saved
 * state splits by heads. */
#define WHOLE_ACT 10.0
#define SPLIT_ACT 24.0

void cdp_planner_tensor_units(const struct cdp_plan *plan, int tp, struct cdp_unit *u, int n)
{
    (void)plan;
    if (tp <= 1) return;
    for (int i = 0; i < n; i++) {
        struct cdp_unit *x = &u[i];
        if (!estimated(x)) continue;
        x->fwd_flops /= tp;
        x->bwd_flops /= tp;
        x->bwd_weight_flops /= tp;
        x->tail_flops /= tp;
        x->recompute_flops /= tp;
        /* matrices and embeddings split; biases and norms stay whole (row-parallel biases do) */
        int64_t owned_cut = 0;
        for (int k = 0; k < x->n_params; k++) {
            struct cdp_param_desc *p = &x->params[k];
            if (p->group != CDP_PARAM_WEIGHT && p->group != CDP_PARAM_EMBEDDING) continue;
            const int64_t cut = p->numel - p->numel / tp;
            if (p->tied_unit < 0) owned_cut += cut;
            p->numel -= cut;
        }
        x->param_count -= owned_cut;
        const double f = (WHOLE_ACT + SPLIT_ACT / tp) / (WHOLE_ACT + SPLIT_ACT);
        if (is_block(x->desc.type)) {
            const int64_t att = x->att_floats, rest = x->act_floats - att;
            const int kept_all = x->keep_floats == x->act_floats;
            x->att_floats = att / tp;
            x->act_floats = x->att_floats + (int64_t)(rest * f);
            x->wstate_floats = (int64_t)(x->wstate_floats * f);
            x->tail_floats = (int64_t)(x->tail_floats * f);
            x->work_floats = (int64_t)(x->work_floats * f);
            /* full recomputation keeps the block's input, which every rank holds whole */
            if (kept_all) x->keep_floats = x->act_floats;
            else if (x->recompute != CDP_RECOMPUTE_FULL) x->keep_floats = (int64_t)(x->keep_floats * f);
        }
    }
}

/* Ring all-reduce of bytes over tp devices: 2 (t - 1) / t x bytes over the
 * slowest link of the ring, and 2 (t - 1) steps of its latency. */
static double ring(double bytes, int tp, double bw, double lat)
{
    return bw > 0 ? 2.0 * (tp - 1) / tp * bytes / bw + 2.0 * (tp - 1) * lat : 0;
}

/* Ring reduce-scatter or all-gather of bytes (the whole tensor) over tp
 * devices: half an all-reduce, (t - 1) / t x bytes and t - 1 steps. */
static double ring_half(double bytes, int tp, double bw, double lat)
{
    return bw > 0 ? (double)(tp - 1) / tp * bytes / bw + (double)(tp - 1) * lat : 0;
}

void cdp_planner_tensor_links(const struct cdp_topology *t, int tp, double *bw, double *lat)
{
    *bw = INFINITY;
    *lat = 0;
    for (int a = 0; a < tp && a < t->n_gpus; a++) {
        const int b = (a + 1) % tp;
        struct cdp_topology_link l;
        if (a == b || cdp_topology_link(t, a, b, &l)) continue;
        if (l.bandwidth < *bw) *bw = l.bandwidth;
        if (l.latency > *lat) *lat = l.latency;
    }
    if (isinf(*bw)) *bw = 0;
}

/* The bytes one all-reduce of a unit moves (before the ring's 2(t-1)/t), 0 when it runs none. */
static double collective_bytes(const struct cdp_plan *plan, const struct cdp_unit *u)
{
    const double B = (double)plan->train.micro_batch, elem = cdp_cost_tensor_comm_elem_bytes(plan);
    if (u->desc.type == CDP_LAYER_LINEAR && u->desc.split != CDP_TSPLIT_NONE) {
        const struct cdp_shape *whole = u->desc.split == CDP_TSPLIT_ROW ? &u->out : &u->in;
        double numel = 1;
        for (int q = 0; q < whole->ndim; q++) numel *= (double)whole->d[q];
        return B * numel * elem;
    }
    if (is_list_split(u->desc.type)) /* a list's: its output [T, C], and its input's gradient */
        return B * (double)u->out.d[0] * (double)u->out.d[1] * elem;
    return splits(u->desc.type) ? B * (double)plan->model.context * (double)plan->model.embed * elem : 0;
}

double cdp_planner_tensor_collective_s(const struct cdp_plan *plan, int tp, double bw, double lat,
                                       const struct cdp_unit *u, int *count_fwd, int *count_bwd)
{
    *count_fwd = *count_bwd = 0;
    if (tp <= 1) return 0;
    if (u->seq_parallel) {
        /* sequence parallel (cdp_unit_set_sequence_parallel): reduce-scatters and all-gathers of the
         * whole [B, T, C], as transformer_block.c, embedding.c and lm_head.c run them */
        if (is_block(u->desc.type)) {
            /* forward: gather ln_1's output, scatter the attention projection's sums, the same for ln_2
             * and the MLP; backward mirrors it (dout and dres2 gathered, each norm's input gradient
             * scattered); selective recomputation gathers both norms' outputs again, full runs the
             * forward's four again */
            *count_fwd = 4;
            *count_bwd = 4 + (u->recompute == CDP_RECOMPUTE_FULL ? 4 : u->recompute == CDP_RECOMPUTE_SELECTIVE ? 2 : 0);
        } else if (u->desc.type == CDP_LAYER_EMBEDDING) {
            *count_fwd = 1; /* the lookups' sum scattered to the shards */
            *count_bwd = 1; /* the output gradient gathered whole */
        } else if (u->desc.type == CDP_LAYER_LM_HEAD) {
            *count_fwd = 1; /* the final norm's output gathered */
            *count_bwd = 1; /* its input gradient scattered */
        }
        return ring_half(collective_bytes(plan, u), tp, bw, lat);
    }
    if (u->desc.type == CDP_LAYER_LINEAR && u->desc.split != CDP_TSPLIT_NONE) {
        /* a row split sums its output forward; a column split its input's gradient backward */
        if (u->desc.split == CDP_TSPLIT_ROW) *count_fwd = 1;
        else *count_bwd = 1;
    } else if (is_block(u->desc.type)) {
        /* attention's output projection and the MLP's second product: one
         * all-reduce each forward, and their inputs' gradients one each backward;
         * full recomputation runs the forward's two again */
        *count_fwd = 2;
        *count_bwd = 2 + (u->recompute == CDP_RECOMPUTE_FULL ? 2 : 0);
    } else if (is_list_split(u->desc.type)) {
        /* a list's attention or SwiGLU MLP: its output projection's sum forward, its input's gradient backward,
         * the forward's again under full recomputation */
        *count_fwd = 1;
        *count_bwd = 1 + (u->recompute == CDP_RECOMPUTE_FULL ? 1 : 0);
    } else if (u->desc.type == CDP_LAYER_EMBEDDING) {
        *count_fwd = 1; /* after the lookup of each rank's vocab slice */
    } else if (u->desc.type == CDP_LAYER_LM_HEAD) {
        *count_bwd = 1; /* the head's input gradient; its max and sum of exponentials are counted apart */
    } else {
        return 0;
    }
    return ring(collective_bytes(plan, u), tp, bw, lat);
}

void cdp_planner_tensor_costs(const struct cdp_plan *plan, int tp, double bw, double lat, const struct cdp_unit *u,
                              int n, struct cdp_unit_cost *cost)
{
    if (tp <= 1) return;
    const double B = (double)plan->train.micro_batch, T = (double)plan->model.context;
    for (int i = 0; i < n; i++) {
        int f, b;
        const double one = cdp_planner_tensor_collective_s(plan, tp, bw, lat, &u[i], &f, &b);
        /* split backward: the collectives are the input half's (B); W stays free of tensor-group traffic */
        cost[i].fwd_s += f * one;
        cost[i].bwd_s += b * one;
        const double link = (u[i].seq_parallel ? 1.0 : 2.0) * (tp - 1) / tp * collective_bytes(plan, &u[i]);
        cost[i].tp_fwd_s = f * one;
        cost[i].tp_bwd_s = b * one;
        cost[i].tp_fwd_bytes = f * link;
        cost[i].tp_bwd_bytes = b * link;
        if (u[i].seq_parallel && u[i].desc.type != CDP_LAYER_EMBEDDING) {
            /* the norms' weight and bias gradients of the rank's rows summed over the group in
             * backward (B under split backward): 4C floats a block, 2C the head's layernorm (C its RMS norm) */
            const double C = (double)plan->model.embed;
            const double bytes = 4.0 * (is_block(u[i].desc.type) ? 4 * C : u[i].desc.rms ? C : 2 * C);
            const double small = ring(bytes, tp, bw, lat);
            cost[i].bwd_s += small;
            cost[i].tp_bwd_s += small;
            cost[i].tp_bwd_bytes += 2.0 * (tp - 1) / tp * bytes;
        }
        if (u[i].desc.type == CDP_LAYER_LM_HEAD) {
            /* the loss: one all-reduce of 2t + 1 floats a token (each slice's max and sum of
             * exponentials in its own place, and the target's logit), as model_pass.c runs it */
            const double bytes = B * T * (2.0 * tp + 1) * 4;
            const double small = ring(bytes, tp, bw, lat);
            cost[i].fwd_s += small;
            cost[i].tp_fwd_s += small;
            cost[i].tp_fwd_bytes += 2.0 * (tp - 1) / tp * bytes;
        }
    }
}

void cdp_planner_tensor_measured(int tp, int measured_tp, const struct cdp_unit *u, int n,
                                 struct cdp_unit_cost *cost)
{
    if (measured_tp < 1) measured_tp = 1;
    if (tp < 1) tp = 1;
    if (tp == measured_tp) return; /* the rank's slices were timed: their times as they are */
    const double f = (double)measured_tp / tp;
    for (int i = 0; i < n; i++)
        if (splits(u[i].desc.type) || u[i].desc.split != CDP_TSPLIT_NONE ||
            cdp_layer_def(u[i].desc.type)->tensor_splits) {
            cost[i].fwd_s *= f;
            cost[i].bwd_s *= f;
            cost[i].bwd_w_s *= f;
        }
}
