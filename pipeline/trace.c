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
                                         "tied all-reduce", "bucket", "tensor all-reduce"};
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
        char tensor[24] = "";
        if (l->tensor > 1) snprintf(tensor, sizeof tensor, ", tensor %d", k->tensor);
        snprintf(t->label[r], sizeof t->label[r], "rank %d: stage %d, replica %d%s, node %d, device %d (%s)", r,
                 k->stage, k->replica, tensor, k->node, k->device, dev);
    }
    return CDP_OK;
}

static const char *group_name(int g)
{
    return g == CDP_EV_GROUP_REPLICAS ? "the stage's replicas"
           : g == CDP_EV_GROUP_TIED   ? "the replica's first and last stage"
           : g == CDP_EV_GROUP_TENSOR ? "the stage's tensor group"
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

/* Communication lanes: Chrome's "X" events on one track must nest (one
 * inside another, or one after another), and a rank's communication overlaps
 * (gradient buckets in flight together, a send beside a receive). Each comm
 * event goes on the first lane of its rank where it nests, lane 0 being the
 * rank's comm track (tid ranks + rank), lane j > 0 a track of its own (tid
 * ranks * (j + 1) + rank). */
#define TRACE_LANES 64

struct lane_ev {
    int64_t i;
    int rank;
    uint64_t start, end;
};

static int lane_ev_cmp(const void *a, const void *b)
{
    const struct lane_ev *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->end != y->end) return x->end > y->end ? -1 : 1; /* the enclosing one first */
    return x->i < y->i ? -1 : x->i > y->i;
}

/* lane[i] for every comm event i (else 0); lanes[r]: how many rank r uses. */
static cdp_status comm_lanes(const struct cdp_trace *t, int *lane, int *lanes)
{
    int64_t n = 0;
    for (int64_t i = 0; i < t->n; i++) n += cdp_event_is_comm(t->ev[i].kind);
    struct lane_ev *ev = malloc((size_t)(n ? n : 1) * sizeof *ev);
    /* per lane, the ends of the events still open on it (a stack: each inside the one below) */
    uint64_t *open[TRACE_LANES] = {NULL};
    int depth[TRACE_LANES], cap[TRACE_LANES] = {0};
    cdp_status st = ev ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "out of memory");
    int64_t k = 0;
    for (int64_t i = 0; !st && i < t->n; i++)
        if (cdp_event_is_comm(t->ev[i].kind))
            ev[k++] = (struct lane_ev){i, t->ev[i].rank, t->ev[i].start_ns, t->ev[i].start_ns + t->ev[i].dur_ns};
    if (!st) qsort(ev, (size_t)n, sizeof *ev, lane_ev_cmp);
    for (int64_t a = 0; !st && a < n;) {
        int64_t b = a;
        while (b < n && ev[b].rank == ev[a].rank) b++;
        memset(depth, 0, sizeof depth);
        int used = 1;
        for (int64_t q = a; !st && q < b; q++) {
            int j = 0;
            for (; j < TRACE_LANES - 1; j++) { /* a bound on tracks: the last lane takes the rest */
                while (depth[j] > 0 && open[j][depth[j] - 1] <= ev[q].start) depth[j]--;
                if (depth[j] == 0 || ev[q].end <= open[j][depth[j] - 1]) break;
            }
            if (depth[j] == cap[j]) {
                const int c = cap[j] ? 2 * cap[j] : 16;
                uint64_t *x = realloc(open[j], (size_t)c * sizeof *x);
                if (!x) {
                    st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                    break;
                }
                open[j] = x;
                cap[j] = c;
            }
            open[j][depth[j]++] = ev[q].end;
            lane[ev[q].i] = j;
            if (j + 1 > used) used = j + 1;
        }
        if (ev[a].rank >= 0 && ev[a].rank < t->ranks) lanes[ev[a].rank] = used;
        a = b;
    }
    for (int j = 0; j < TRACE_LANES; j++) free(open[j]);
    free(ev);
    return st;
}

cdp_status cdp_trace_write_chrome(const struct cdp_trace *t, const char *path)
{
    struct cdp_atomic_file out;
    cdp_status st = cdp_atomic_open(path, &out);
    if (st) return st;
    FILE *f = out.stream;
    int *comm = calloc((size_t)t->ranks + 1, sizeof *comm); /* per rank: comm lanes (0: no comm events) */
    int *lane = calloc((size_t)t->n + 1, sizeof *lane);
    if (!comm || !lane || comm_lanes(t, lane, comm)) {
        free(comm);
        free(lane);
        cdp_atomic_abort(&out);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory writing %s", path);
    }
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
    for (int r = 0; r < t->ranks; r++) {
        char name[112];
        if (t->label && t->label[r][0]) snprintf(name, sizeof name, "%s", t->label[r]);
        else snprintf(name, sizeof name, "rank %d", r);
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
                   "\"%s\"}},\n", r, name);
        fprintf(f, "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
                   "{\"sort_index\": %d}},\n", r, 2 * r);
        /* the rank's communication: its own rows, under the rank's */
        for (int j = 0; j < comm[r]; j++) {
            char more[16] = "";
            if (j) snprintf(more, sizeof more, " %d", j + 1);
            fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
                       "{\"name\": \"rank %d comm%s\"}},\n", t->ranks * (j + 1) + r, r, more);
            fprintf(f, "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
                       "{\"sort_index\": %d}},\n", t->ranks * (j + 1) + r, 2 * r + 1);
        }
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
                name, is_comm ? "comm" : kind_names[e->kind], is_comm ? t->ranks * (lane[i] + 1) + e->rank : e->rank,
                (double)e->start_ns / 1e3, (double)e->dur_ns / 1e3, args, i + 1 < t->n ? "," : "");
    }
    free(lane);
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
        enum cdp_event_kind kind;
    } legend[] = {{"forward", FILL_F, CDP_EV_FORWARD}, {"backward", FILL_B, CDP_EV_BACKWARD},
                  {"input grad (I)", FILL_I, CDP_EV_BACKWARD_INPUT}, {"weight grad (W)", FILL_W, CDP_EV_BACKWARD_WEIGHT},
                  {"optimizer", FILL_O, CDP_EV_OPTIMIZER}};
    /* the legend names the kinds the step drew, not a split backward on a 1F1B run */
    int drawn[sizeof legend / sizeof *legend] = {0};
    for (int64_t i = 0; i < t->n; i++)
        for (size_t k = 0; k < sizeof legend / sizeof *legend; k++)
            drawn[k] |= t->ev[i].step == step && t->ev[i].kind == legend[k].kind;
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
    for (int k = 0, at = 0; k < (int)(sizeof legend / sizeof *legend); k++) {
        if (!drawn[k]) continue;
        fprintf(f, "<rect x=\"%.0f\" y=\"8\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.0f\" "
                   "y=\"18\">%s</text>\n", left + 250 + 120 * at, legend[k].fill, left + 266 + 120 * at,
                legend[k].name);
        at++;
    }
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
