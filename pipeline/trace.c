/* Traces of executed (or simulated) schedules: Chrome trace JSON and SVG. */
#include "pipeline/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/file.h"
#include "pipeline/layout.h"

struct cdp_trace {
    int ranks;
    char (*label)[112]; /* per rank, from a layout; NULL: "rank N" */
    struct cdp_event_rec *ev;
    int64_t n, cap, dropped;
    uint64_t origin;
    int has_origin;
};

static const char *const kind_names[] = {"load", "forward", "backward", "optimizer", "eval"};
CDP_TABLE_CHECK(kind_names, CDP_EV_KIND_COUNT);

cdp_status cdp_trace_create(int ranks, int64_t max_events, struct cdp_trace **out)
{
    struct cdp_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->ev = calloc((size_t)max_events, sizeof *t->ev))) {
        free(t);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for a trace of %lld events", (long long)max_events);
    }
    t->ranks = ranks;
    t->cap = max_events;
    *out = t;
    return CDP_OK;
}

void cdp_trace_destroy(struct cdp_trace *t)
{
    if (!t) return;
    free(t->ev);
    free(t->label);
    free(t);
}

void cdp_trace_add(struct cdp_trace *t, int rank, enum cdp_event_kind kind, int step, int mb,
                   uint64_t start_ns, uint64_t end_ns)
{
    if (!t->has_origin) {
        t->origin = start_ns;
        t->has_origin = 1;
    }
    if (t->n == t->cap) {
        t->dropped++;
        return;
    }
    t->ev[t->n++] = (struct cdp_event_rec){rank, kind, step, mb, start_ns - t->origin, end_ns - start_ns};
}

struct cdp_event_rec *cdp_trace_events(struct cdp_trace *t, int64_t *n)
{
    *n = t->n;
    return t->ev;
}

uint64_t cdp_trace_origin(const struct cdp_trace *t) { return t->origin; }

void cdp_trace_set_origin(struct cdp_trace *t, uint64_t origin)
{
    t->origin = origin;
    t->has_origin = 1;
}

cdp_status cdp_trace_set_layout(struct cdp_trace *t, const struct cdp_layout *l)
{
    if (!t->label && !(t->label = calloc((size_t)t->ranks, sizeof *t->label)))
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for trace labels");
    for (int r = 0; r < t->ranks && r < l->n_ranks; r++) {
        const struct cdp_layout_rank *k = &l->rank[r];
        char dev[32];
        cdp_layout_device_name(l, r, dev, sizeof dev);
        snprintf(t->label[r], sizeof t->label[r], "rank %d: stage %d, replica %d, node %d, device %d (%s)", r,
                 k->stage, k->replica, k->node, k->device, dev);
    }
    return CDP_OK;
}

cdp_status cdp_trace_write_chrome(const struct cdp_trace *t, const char *path)
{
    struct cdp_atomic_file out;
    cdp_status st = cdp_atomic_open(path, &out);
    if (st) return st;
    FILE *f = out.stream;
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
    for (int r = 0; r < t->ranks; r++) {
        char name[112];
        if (t->label && t->label[r][0]) snprintf(name, sizeof name, "%s", t->label[r]);
        else snprintf(name, sizeof name, "rank %d", r);
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
                   "\"%s\"}},\n", r, name);
    }
    for (int64_t i = 0; i < t->n; i++) {
        const struct cdp_event_rec *e = &t->ev[i];
        char name[48];
        if (e->mb >= 0)
            snprintf(name, sizeof name, "%c%d", e->kind == CDP_EV_FORWARD ? 'F' : e->kind == CDP_EV_BACKWARD ? 'B' : 'L',
                     e->mb);
        else
            snprintf(name, sizeof name, "%s", kind_names[e->kind]);
        fprintf(f, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, "
                   "\"dur\": %.3f, \"args\": {\"step\": %d, \"micro_batch\": %d}}%s\n",
                name, kind_names[e->kind], e->rank, (double)e->start_ns / 1e3, (double)e->dur_ns / 1e3,
                e->step, e->mb, i + 1 < t->n ? "," : "");
    }
    fprintf(f, "], \"otherData\": {\"producer\": \"cdphybrid\", \"dropped_events\": %lld}}\n",
            (long long)t->dropped);
    return cdp_atomic_commit(&out);
}

cdp_status cdp_trace_write_svg(const struct cdp_trace *t, int step, const char *path)
{
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const struct cdp_event_rec *e = &t->ev[i];
        if (e->step != step) continue;
        if (e->start_ns < t0) t0 = e->start_ns;
        if (e->start_ns + e->dur_ns > t1) t1 = e->start_ns + e->dur_ns;
    }
    if (t0 == UINT64_MAX)
        return cdp_fail(CDP_ERR_INVALID, "%s: no events of step %d to draw", path, step);
    const double W = 1000.0, row = 28.0, left = 70.0, top = 30.0;
    const double span = (double)(t1 - t0 > 0 ? t1 - t0 : 1);
    const double H = top + row * t->ranks + 30.0;
    struct cdp_atomic_file out;
    cdp_status st = cdp_atomic_open(path, &out);
    if (st) return st;
    FILE *f = out.stream;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", left + W + 20, H);
    fprintf(f, "<text x=\"%.0f\" y=\"18\">step %d: %.2f ms (forward light, backward dark, "
               "optimizer grey; blank is idle)</text>\n", left, step, span / 1e6);
    for (int r = 0; r < t->ranks; r++) {
        double y = top + r * row;
        if (t->label && t->label[r][0])
            fprintf(f, "<text x=\"4\" y=\"%.1f\">rank %d<title>%s</title></text>\n", y + row * 0.65, r, t->label[r]);
        else
            fprintf(f, "<text x=\"4\" y=\"%.1f\">rank %d</text>\n", y + row * 0.65, r);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#ccc\"/>\n",
                left, y + 2, W, row - 4);
    }
    for (int64_t i = 0; i < t->n; i++) {
        const struct cdp_event_rec *e = &t->ev[i];
        if (e->step != step || e->kind == CDP_EV_LOAD || e->kind == CDP_EV_EVAL) continue;
        double x = left + W * (double)(e->start_ns - t0) / span, w = W * (double)e->dur_ns / span;
        double y = top + e->rank * row;
        const char *fill = e->kind == CDP_EV_FORWARD ? "#9ecae1" : e->kind == CDP_EV_BACKWARD ? "#3182bd" : "#bdbdbd";
        fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                   "stroke-width=\"0.5\"><title>%s %d</title></rect>\n",
                x, y + 3, w > 0.3 ? w : 0.3, row - 6, fill, kind_names[e->kind], e->mb);
        if (e->mb >= 0 && w > 14)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"%s\">%d</text>\n", x + w / 2,
                    y + row * 0.65, e->kind == CDP_EV_BACKWARD ? "white" : "black", e->mb);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">0 ms</text><text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.2f ms"
               "</text>\n</svg>\n", left, H - 8, left + W, H - 8, span / 1e6);
    return cdp_atomic_commit(&out);
}
