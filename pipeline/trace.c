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

static const char *const kind_names[] = {"load",      "forward",   "backward",   "optimizer",
                                         "eval",      "backward input", "backward weight", "send act",  "recv act",   "send grad",
                                         "recv grad", "all-reduce", "reduce-scatter", "all-gather",
                                         "tied all-reduce", "bucket"};
CDP_TABLE_CHECK(kind_names, CDP_EV_KIND_COUNT);

_Static_assert(sizeof(struct cdp_event_rec) == 4 * sizeof(int) + 2 * sizeof(uint64_t) + 4 * sizeof(int) +
                   sizeof(uint64_t),
               "struct cdp_event_rec has padding");

int cdp_event_is_comm(enum cdp_event_kind k) { return k >= CDP_EV_SEND_ACT && k < CDP_EV_KIND_COUNT; }

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

void cdp_trace_add_event(struct cdp_trace *t, const struct cdp_event_rec *e)
{
    if (!t->has_origin) {
        t->origin = e->start_ns;
        t->has_origin = 1;
    }
    if (t->n == t->cap) {
        t->dropped++;
        return;
    }
    struct cdp_event_rec *r = &t->ev[t->n++];
    *r = *e;
    r->start_ns = e->start_ns - t->origin;
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

static const char *group_name(int g)
{
    return g == CDP_EV_GROUP_REPLICAS ? "the stage's replicas"
           : g == CDP_EV_GROUP_TIED   ? "the replica's first and last stage"
                                      : "";
}

/* the timeline's colours */
#define FILL_F "#9ecae1"
#define FILL_B "#3182bd"
#define FILL_I "#e6550d"
#define FILL_W "#31a354"
#define FILL_O "#bdbdbd"

/* "F3", "B3 c1", "send act mb3 c1", "all-reduce c0". */
static void event_name(const struct cdp_event_rec *e, char *buf, size_t cap)
{
    int n;
    if (!cdp_event_is_comm(e->kind) && e->mb >= 0)
        n = snprintf(buf, cap, "%c%d", e->kind == CDP_EV_FORWARD ? 'F' : e->kind == CDP_EV_BACKWARD ? 'B'
                                       : e->kind == CDP_EV_BACKWARD_INPUT ? 'I' : e->kind == CDP_EV_BACKWARD_WEIGHT ? 'W'
                                       : 'L', e->mb);
    else if (e->mb >= 0)
        n = snprintf(buf, cap, "%s mb%d", kind_names[e->kind], e->mb);
    else
        n = snprintf(buf, cap, "%s", kind_names[e->kind]);
    if (e->chunk >= 0 && n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " c%d", e->chunk);
}

cdp_status cdp_trace_write_chrome(const struct cdp_trace *t, const char *path)
{
    struct cdp_atomic_file out;
    cdp_status st = cdp_atomic_open(path, &out);
    if (st) return st;
    FILE *f = out.stream;
    char *comm = calloc((size_t)t->ranks, 1); /* ranks with communication events */
    if (!comm) {
        cdp_atomic_abort(&out);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory writing %s", path);
    }
    for (int64_t i = 0; i < t->n; i++)
        if (cdp_event_is_comm(t->ev[i].kind) && t->ev[i].rank >= 0 && t->ev[i].rank < t->ranks) comm[t->ev[i].rank] = 1;
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
    for (int r = 0; r < t->ranks; r++) {
        char name[112];
        if (t->label && t->label[r][0]) snprintf(name, sizeof name, "%s", t->label[r]);
        else snprintf(name, sizeof name, "rank %d", r);
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
                   "\"%s\"}},\n", r, name);
        fprintf(f, "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
                   "{\"sort_index\": %d}},\n", r, 2 * r);
        if (!comm[r]) continue;
        /* the rank's communication: its own row, under the rank's */
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
                   "\"rank %d comm\"}},\n", t->ranks + r, r);
        fprintf(f, "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
                   "{\"sort_index\": %d}},\n", t->ranks + r, 2 * r + 1);
    }
    free(comm);
    for (int64_t i = 0; i < t->n; i++) {
        const struct cdp_event_rec *e = &t->ev[i];
        const int is_comm = cdp_event_is_comm(e->kind);
        char name[64], args[256];
        event_name(e, name, sizeof name);
        int n = snprintf(args, sizeof args, "\"step\": %d, \"micro_batch\": %d", e->step, e->mb);
        if (e->chunk >= 0) n += snprintf(args + n, sizeof args - (size_t)n, ", \"chunk\": %d", e->chunk);
        if (is_comm)
            n += snprintf(args + n, sizeof args - (size_t)n, ", \"bytes\": %llu", (unsigned long long)e->bytes);
        if (is_comm && e->peer >= 0) n += snprintf(args + n, sizeof args - (size_t)n, ", \"peer\": %d", e->peer);
        if (is_comm && e->group)
            snprintf(args + n, sizeof args - (size_t)n, ", \"group\": \"%s\", \"ranks\": %d", group_name(e->group),
                     e->members);
        fprintf(f, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, "
                   "\"dur\": %.3f, \"args\": {%s}}%s\n",
                name, is_comm ? "comm" : kind_names[e->kind], is_comm ? t->ranks + e->rank : e->rank,
                (double)e->start_ns / 1e3, (double)e->dur_ns / 1e3, args, i + 1 < t->n ? "," : "");
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
    static const struct {
        const char *name, *fill;
    } legend[] = {{"forward", FILL_F}, {"backward", FILL_B}, {"input grad (I)", FILL_I},
                  {"weight grad (W)", FILL_W}, {"optimizer", FILL_O}};
    const double span = (double)(t1 - t0 > 0 ? t1 - t0 : 1);
    const double H = top + row * t->ranks + 30.0;
    struct cdp_atomic_file out;
    cdp_status st = cdp_atomic_open(path, &out);
    if (st) return st;
    FILE *f = out.stream;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", left + W + 20, H);
    fprintf(f, "<text x=\"%.0f\" y=\"18\">step %d: %.2f ms (blank is idle)</text>\n", left, step, span / 1e6);
    /* the legend: every compute colour, on the title line */
    for (int k = 0; k < (int)(sizeof legend / sizeof *legend); k++)
        fprintf(f, "<rect x=\"%.0f\" y=\"8\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.0f\" "
                   "y=\"18\">%s</text>\n", left + 250 + 120 * k, legend[k].fill, left + 266 + 120 * k,
                legend[k].name);
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
        if (e->step != step || e->kind == CDP_EV_LOAD || e->kind == CDP_EV_EVAL || cdp_event_is_comm(e->kind)) continue;
        double x = left + W * (double)(e->start_ns - t0) / span, w = W * (double)e->dur_ns / span;
        double y = top + e->rank * row;
        char chunk[24] = "";
        if (e->chunk >= 0) snprintf(chunk, sizeof chunk, ", chunk %d", e->chunk);
        const char *fill = e->kind == CDP_EV_FORWARD ? FILL_F : e->kind == CDP_EV_BACKWARD ? FILL_B
                           : e->kind == CDP_EV_BACKWARD_INPUT ? FILL_I : e->kind == CDP_EV_BACKWARD_WEIGHT ? FILL_W
                           : FILL_O;
        fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                   "stroke-width=\"0.5\"><title>%s %d%s</title></rect>\n",
                x, y + 3, w > 0.3 ? w : 0.3, row - 6, fill, kind_names[e->kind], e->mb, chunk);
        if (e->mb >= 0 && w > 14)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"%s\">%d</text>\n", x + w / 2,
                    y + row * 0.65, e->kind == CDP_EV_FORWARD || e->kind == CDP_EV_OPTIMIZER ? "black" : "white", e->mb);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">0 ms</text><text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.2f ms"
               "</text>\n</svg>\n", left, H - 8, left + W, H - 8, span / 1e6);
    return cdp_atomic_commit(&out);
}
