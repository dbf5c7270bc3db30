/* Execution traces: timed events per rank (forward / backward of a micro-batch,
 * loading, the optimizer step), written as a Chrome trace (Perfetto, chrome://
 * tracing) and as an SVG timeline of one training step, the picture of the
 * GPipe and Megatron papers. The executor records measured events; the
 * simulator will record predicted ones in the same form. */
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
    CDP_EV_KIND_COUNT
};

struct cdp_event_rec {
    int rank;
    enum cdp_event_kind kind;
    int step;  /* 1-based */
    int mb;    /* micro-batch within the step, or -1 */
    uint64_t start_ns, dur_ns; /* from the trace's origin */
};

struct cdp_trace;

/* A trace keeping at most max_events events (later ones are counted, not kept). */
cdp_status cdp_trace_create(int ranks, int64_t max_events, struct cdp_trace **out);
void cdp_trace_destroy(struct cdp_trace *t);

/* Times are taken with cdp_time_ns(); the first event sets the origin. */
void cdp_trace_add(struct cdp_trace *t, int rank, enum cdp_event_kind kind, int step, int mb,
                   uint64_t start_ns, uint64_t end_ns);

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

/* Chrome trace event format (JSON object with "traceEvents"), one track per
 * rank; written atomically (temporary file, then rename). */
cdp_status cdp_trace_write_chrome(const struct cdp_trace *t, const char *path);

/* SVG timeline of one step: a row per rank, a box per forward (light) and
 * backward (dark) of each micro-batch, numbered, idle time left blank.
 * Written atomically. */
cdp_status cdp_trace_write_svg(const struct cdp_trace *t, int step, const char *path);

#ifdef __cplusplus
}
#endif

#endif
