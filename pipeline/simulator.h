/* Internal: the simulator's inputs and results in full; programs that embed
 * cdphybrid use cdp/simulator.h (cdp_simulate and its summary).
 *
 * The simulator: a discrete-event execution of one training step's schedule
 * lists (pipeline/schedule.h) on every rank of p stages x R replicas, with
 * compute times from the cost model (partitioner/costs.h) and transfers over
 * the links between the ranks' devices, ranks that share a processor (CPU
 * cores, a GPU) sharing its time. Predicts step time, throughput, the
 * bubble, activations in flight and per-link traffic, and records events in the
 * executor's trace form (pipeline/trace.h). Deterministic. Model and limits:
 * docs/simulator.md. */
#ifndef CDP_PIPELINE_SIMULATOR_H
#define CDP_PIPELINE_SIMULATOR_H

#include "cdp/status.h"
#include "pipeline/schedule.h"
#include "pipeline/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One virtual stage (a chunk of a rank), per micro-batch unless said otherwise. */
struct cdp_sim_vstage {
    double fwd_s, bwd_s; /* summed unit times */
    double bwd_w_s;      /* of bwd_s, the weight-gradient part: a split backward's W takes it, its I the
                          * rest (the cost model's bwd_weight_flops share; 0 for no parameters) */
    double out_bytes;    /* output sent to the next virtual stage (its input gradient comes back) */
    double grad_bytes;   /* per step: gradient bytes all-reduced over the replicas (ZeRO-2: reduce-scattered
                          * after each backward) */
    double opt_s;        /* per step: optimizer time */
    /* tensor parallelism: of fwd_s and bwd_s (a split backward's input half),
     * the tensor group's all-reduces, played as CDP_EV_TENSOR_REDUCE events at
     * the end of the compute they belong to, and the bytes they move on each
     * link of the group's ring */
    double tp_fwd_s, tp_bwd_s, tp_fwd_bytes, tp_bwd_bytes;
    /* gradient buckets (the executor's /parallel/bucket_mb): n_buckets > 0
     * reduce over the replicas bucket by bucket during the step's last
     * backward; bucket b holds bucket_share[b] of grad_bytes and is ready
     * once bucket_ready[b] of that backward's time has passed (the last: 1).
     * 0: one reduction at ALLREDUCE_GRADS. */
#define CDP_SIM_MAX_BUCKETS 64
    int n_buckets;
    double bucket_share[CDP_SIM_MAX_BUCKETS], bucket_ready[CDP_SIM_MAX_BUCKETS];
};

struct cdp_sim_config {
    const struct cdp_schedule *sched;     /* p, v, m and the lists (not owned) */
    int replicas;                         /* R >= 1 */
    const struct cdp_sim_vstage *vstage;  /* p*v entries by virtual stage (cdp_schedule_vstage places them) (not owned) */
    double tied_bytes;                    /* REDUCE_TIED_GRADS payload (0 when the lists have none) */
    const int *device;                    /* p*R: device of (stage s, replica r) at [s*R + r] (not owned) */
    int n_devices;
    const double *bandwidth;              /* n_devices^2, [a*n + b]: bytes/s from a to b; <= 0: unlimited */
    const double *latency;                /* n_devices^2: seconds per message */
    double load_s;                        /* time of a LOAD (0: not shown) */
    double samples_per_mb;                /* B, for samples/s */
    const int *trace_rank;                /* p*R: trace row of (s, r); NULL: r*p + s */
    const int *proc;                      /* p*R: the processor (a CPU set, a GPU) (s, r) computes on,
                                             0..p*R-1; ranks on one processor that compute at the same
                                             time each get an equal share of it. NULL: each its own */
    int tensor;                           /* t: (s, r) on device d leads a tensor group on devices d..d+t-1,
                                             whose ring d -> d+1 -> ... -> d carries the tensor all-reduces
                                             (link statistics); 0 or 1: none. Its all-reduces and the
                                             data-parallel collectives hold the ports they leave their
                                             devices by (a device's egress into its node's fabric, or
                                             onto the network, as node says), one after the other */
    const int *node;                      /* n_devices: each device's node (which port a transfer
                                             takes); NULL: one node */
    int zero;                             /* ZeRO stage: 2 reduce-scatters each chunk's gradient over the
                                             stage's replicas after each of its backwards (a collective,
                                             (R-1)/R of grad_bytes), and the step's collective is the
                                             all-gather (the same); 0 and 1: one all-reduce's bytes */
    double reduce_scale;                  /* bytes the gradient reduction moves per byte of grad_bytes
                                             (/parallel/comm_dtype bf16: 0.5); ZeRO's parameter
                                             all-gather moves grad_bytes (fp32) always. 0: 1 */
};

/* The bytes of a stage's data-parallel collective at ALLREDUCE_GRADS for
 * grad_bytes of gradients (one collective of `rounds` ring passes, 2 unless
 * ZeRO-2): the all-reduce (ZeRO 0) moves reduce_scale of them; ZeRO-1's
 * reduce-scatter (reduce_scale) and parameter all-gather (whole), as one
 * collective of two passes, their mean; ZeRO-2's all-gather (one pass) all of
 * them. The one home of that rule: the simulator and the planner's quick
 * estimate use it. */
double cdp_sim_step_collective_bytes(double grad_bytes, int zero, double reduce_scale);

struct cdp_sim_link_stat {
    int src, dst;  /* devices, directed */
    double bytes;  /* point-to-point plus all-reduce bytes sent from src to dst */
    double busy_s; /* time with at least one transfer moving bytes, plus collective time */
};

struct cdp_sim_result {
    double step_s;        /* start of the step to the last rank's optimizer step end */
    double phase_s;       /* forward/backward phase: the latest last-backward end */
    double bubble;        /* 1 - sum over ranks of own load+forward+backward / (ranks x phase) */
    double samples_per_s; /* R x m x B / step_s */
    int ranks;            /* p*R; the arrays below are indexed [s*R + r] */
    double *busy_s;       /* own load + forward + backward time */
    double *finish_s;     /* when the rank's list ends */
    int *peak_in_flight;  /* most (micro-batch, chunk) activations held at once, a split backward's until
                             its W (memory: the layout's, cdp_layout_memory, which sizes the executor's
                             buffers) */
    int *peak_w_pending;  /* most W-states held at once (split backward: from I to W), each one chunk's
                             wstate_bytes */
    int n_links;
    struct cdp_sim_link_stat *links; /* sorted by busy time, then bytes, descending */
    int64_t n_events;
    /* forward, backward, load, optimizer, and communication as the executor
     * traces it: sends (no time: they never block), receives (from reaching
     * one to the message's arrival), the collectives (from reaching one to its
     * end, one event for the rank's chunks together); ns from the step start */
    struct cdp_event_rec *events;
};

/* Runs one step. CDP_ERR_INVALID for inconsistent input (a device index out of
 * range, a list shape that does not match), CDP_ERR_INTERNAL if the lists
 * deadlock, CDP_ERR_NOMEM. *out owned by the caller: cdp_sim_result_free. */
cdp_status cdp_sim_run(const struct cdp_sim_config *c, struct cdp_sim_result **out);
void cdp_sim_result_free(struct cdp_sim_result *r);

/* The predicted events as a trace of trace_ranks rows, for the executor's
 * writers (cdp_trace_write_chrome, cdp_trace_write_svg). *out: cdp_trace_destroy. */
cdp_status cdp_sim_trace(const struct cdp_sim_result *r, int trace_ranks, struct cdp_trace **out);

/* The closed-form bubble of uniform stages without communication, as this
 * simulator defines the bubble: (p-1) / (v*m + p-1). */
double cdp_sim_bubble_closed_form(int p, int v, int m);

/* The same for every kind, m >= p: gpipe, 1f1b, interleaved as above (forward
 * and backward in any ratio); zb-h1 and zb-h2 (p-1) / (3m + p-1) and zbv
 * (p-1 + e) / (6m + p-1 + e), e = max(0, 2p-2-m), when the forward, the input
 * gradient and the weight gradient take equal times (docs/simulator.md). */
double cdp_sim_bubble_closed_form_kind(enum cdp_schedule_kind kind, int p, int v, int m);

#ifdef __cplusplus
}
#endif

#endif
