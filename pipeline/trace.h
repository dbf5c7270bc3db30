/* Execution traces: timed events per rank (forward / backward of a micro-batch,
 * loading, the optimizer step, and communication: each send and receive of
 * activations and gradients, each gradient reduction), written as a Chrome
 * trace (Perfetto, chrome://tracing) and as an SVG timeline of one training
 * step, the picture of the GPipe and Megatron papers. The executor records
 * measured events; the simulator records predicted ones in the same form. */
#ifndef CDP_PIPELINE_TRACE_H
#define CDP_PIPELINE_TRACE_H

#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum cdp_event_kind {
    CDP_EV_LOAD = 0,
    CDP_EV_FORWARD,
    CDP_EV_BACKWARD,
    CDP_EV_OPTIMIZER,
    CDP_EV_EVAL,
    CDP_EV_BACKWARD_INPUT,  /* a split backward's input gradient (I) */
    CDP_EV_BACKWARD_WEIGHT, /* ... and its weight gradient (W) */
    /* communication (cdp_event_is_comm): a track of its own per rank */
    CDP_EV_SEND_ACT,       /* a micro-batch's activations to the next stage */
    CDP_EV_RECV_ACT,       /* ... from the previous stage */
    CDP_EV_SEND_GRAD,      /* a micro-batch's input gradient to the previous stage */
    CDP_EV_RECV_GRAD,      /* ... from the next stage */
    CDP_EV_ALLREDUCE,      /* the gradients' sum over the stage's replicas */
    CDP_EV_REDUCE_SCATTER, /* ZeRO: this replica's shard of that sum */
    CDP_EV_ALLGATHER,      /* ZeRO: every replica's updated shard to all */
    CDP_EV_TIED_REDUCE,    /* a tied embedding's gradient over its first and last stage */
    CDP_EV_BUCKET,         /* one gradient bucket's part of the all-reduce (or ZeRO-1 reduce-scatter), from
                            * its start in the backward to its completion; the all-reduce's event spans them */
    CDP_EV_TENSOR_REDUCE,  /* a tensor group's all-reduce of a split layer's activations or their gradient,
                            * within a forward or backward (not overlapped with its compute) */
    CDP_EV_KIND_COUNT
};

/* Who a collective event ran among. */
enum cdp_event_group {
    CDP_EV_GROUP_NONE = 0,
    CDP_EV_GROUP_REPLICAS, /* the replicas of the rank's stage */
    CDP_EV_GROUP_TIED,     /* the first and last stage of the rank's replica */
    CDP_EV_GROUP_TENSOR    /* the rank's tensor group (its stage and replica) */
};

/* No padding: records are compared and sent between ranks as bytes. */
struct cdp_event_rec {
    int rank;
    enum cdp_event_kind kind;
    int step;  /* 1-based */
    int mb;    /* micro-batch within the step, or -1 */
    uint64_t start_ns, dur_ns; /* from the trace's origin */
    int chunk;   /* the chunk of an interleaved schedule (chunks > 1), else -1 */
    int peer;    /* send / receive: the other end's world rank (trace row), else -1 */
    int group;   /* collectives: enum cdp_event_group */
    int members; /* collectives: ranks in the group, else 0 */
    uint64_t bytes; /* communication: bytes this rank sends or receives, its buffer for a collective */
};

/* An event of the communication kinds (CDP_EV_SEND_ACT .. CDP_EV_BUCKET). */
int cdp_event_is_comm(enum cdp_event_kind k);

struct cdp_trace;

/* A trace keeping at most max_events events (later ones are counted, not kept). */
cdp_status cdp_trace_create(int ranks, int64_t max_events, struct cdp_trace **out);
void cdp_trace_destroy(struct cdp_trace *t);

/* Event e, kept as the trace's (its start from the origin). e->start_ns is
 * on cdp_time_ns()'s clock, or the origin's; the first event sets the origin. */
void cdp_trace_add_event(struct cdp_trace *t, const struct cdp_event_rec *e);

/* The events kept so far (times from the trace's origin), and that origin. */
struct cdp_event_rec *cdp_trace_events(struct cdp_trace *t, int64_t *n);
uint64_t cdp_trace_origin(const struct cdp_trace *t);
/* Fixes the origin before the first event (events must not start earlier). */
void cdp_trace_set_origin(struct cdp_trace *t, uint64_t origin);

/* Names each rank's track after its place in a layout ("rank 2: stage 0,
 * replica 1, node 0, device 3 (cuda:3)"), in the Chrome trace and as the
 * timeline rows' tooltips. CDP_ERR_NOMEM. */
struct cdp_layout;
cdp_status cdp_trace_set_layout(struct cdp_trace *t, const struct cdp_layout *l);

/* Chrome trace event format (JSON object with "traceEvents"): one track per
 * rank (tid = rank) for its compute, and one per rank that communicates (tid =
 * ranks + rank, named "rank N comm", shown under the rank's track) for its
 * sends, receives and reductions, with bytes and peer or group in args.
 * Compute events are named F3 / B3 / I3 / W3 / L3 by micro-batch, "F3 c1" with their
 * chunk in an interleaved run; args carry step, micro_batch and chunk.
 * Written atomically (temporary file, then rename). */
cdp_status cdp_trace_write_chrome(const struct cdp_trace *t, const char *path);

/* SVG timeline of one step: a row per rank, a box per forward (light blue)
 * and backward (dark blue) of each micro-batch, a split backward's input
 * gradient (orange) and weight gradient (green) apart, numbered by
 * micro-batch (the tooltip names the chunk when there are several), idle time
 * left blank, with a legend of the colours; communication is in the Chrome
 * trace only. Written atomically. */
cdp_status cdp_trace_write_svg(const struct cdp_trace *t, int step, const char *path);

#ifdef __cplusplus
}
#endif

#endif
