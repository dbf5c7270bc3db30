/* `cdphybrid plot`: the loss curves of a run's metrics.jsonl as one SVG
 * picture: training loss per step, validation loss where it was measured,
 * and the learning rate on a second axis. The picture is written whole or
 * not at all (a temporary file, then renamed). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cli/commands.h"
#include "core/file.h"

static void plot_usage(FILE *f)
{
    fputs("usage: cdphybrid plot METRICS.jsonl -o OUT.svg [--title TEXT]\n"
          "\n"
          "Draws a run's metrics.jsonl (output.metrics) as an SVG picture: the training\n"
          "loss of every step, the validation loss where it was measured (points joined\n"
          "by a line), and the learning rate on the right-hand axis. Any browser shows it.\n"
          "Steps recorded again after a resume replace the earlier records of those steps.\n"
          "\n"
          "options:\n"
          "  -o, --out FILE  the picture to write (written whole: a temporary name, then renamed)\n"
          "  --title TEXT    the title (default: the metrics file's name)\n"
          "  -h, --help      this text\n"
          "\n"
          "example:\n"
          "  cdphybrid plot examples/runs/quickstart-metrics.jsonl -o loss.svg\n"
          "\n"
          "exit codes: 0 written, 1 the picture could not be written, 2 bad usage or a\n"
          "metrics file that cannot be read (the message names the line)\n",
          f);
}

/* One step's figures; NAN where the record has none. */
struct point {
    int64_t step;
    double loss, val, lr;
};

struct series {
    struct point *p;
    size_t n, cap;
};

static int add_point(struct series *s, struct point pt)
{
    /* a resumed run records its steps again from the checkpoint on: the later records win */
    while (s->n && s->p[s->n - 1].step >= pt.step) s->n--;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        struct point *np = realloc(s->p, cap * sizeof *np);
        if (!np) return -1;
        s->p = np;
        s->cap = cap;
    }
    s->p[s->n++] = pt;
    return 0;
}

/* A number member of a step record, NAN when absent; -1 when present and not a number. */
static int number_of(const json_t *o, const char *key, double *out)
{
    const json_t *v = json_object_get(o, key);
    *out = NAN;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return -1;
    *out = json_number_value(v);
    return 0;
}

static cdp_status read_metrics(const char *path, struct series *s)
{
    FILE *f = fopen(path, "r");
    if (!f) return cdp_fail(CDP_ERR_INVALID, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long no = 0;
    cdp_status st = CDP_OK;
    while (!st && (len = getline(&line, &cap, f)) >= 0) {
        no++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        json_error_t err;
        json_t *o = json_loadb(line, (size_t)len, 0, &err);
        if (!o || !json_is_object(o)) {
            st = cdp_fail(CDP_ERR_INVALID, "%s:%ld: expected a JSON object per line (metrics.jsonl), %s%s", path, no,
                          o ? "got another value" : "not JSON: ", o ? "" : err.text);
            json_decref(o);
            break;
        }
        const json_t *step = json_object_get(o, "step");
        if (!step) { /* the run's first record (its layout) has no step */
            json_decref(o);
            continue;
        }
        struct point pt = {0};
        const char *bad = !json_is_integer(step) || json_integer_value(step) < 0 ? "step" : NULL;
        if (!bad) pt.step = json_integer_value(step);
        if (!bad && number_of(o, "loss", &pt.loss)) bad = "loss";
        if (!bad && number_of(o, "val_loss", &pt.val)) bad = "val_loss";
        if (!bad && number_of(o, "lr", &pt.lr)) bad = "lr";
        json_decref(o);
        if (bad) {
            st = cdp_fail(CDP_ERR_INVALID, "%s:%ld: /%s: expected a %s", path, no, bad,
                          !strcmp(bad, "step") ? "non-negative integer" : "number");
            break;
        }
        if (add_point(s, pt)) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    if (!st && ferror(f)) st = cdp_fail(CDP_ERR_INVALID, "%s: cannot read: %s", path, strerror(errno));
    free(line);
    fclose(f);
    if (!st && s->n == 0)
        st = cdp_fail(CDP_ERR_INVALID, "%s: no step records (lines with \"step\"): is it a metrics.jsonl of a run?",
                      path);
    return st;
}

/* ---- the picture ---------------------------------------------------------------- */

#define W 800.0
#define H 450.0
#define X0 70.0  /* plot area: left */
#define X1 710.0 /* right */
#define Y0 50.0  /* top */
#define Y1 390.0 /* bottom */

/* A range with ticks at 1, 2 or 5 x 10^k. */
struct axis {
    double lo, hi, tick;
};

static struct axis axis_of(double lo, double hi, int zero_based)
{
    if (zero_based && lo > 0) lo = 0;
    if (!(hi > lo)) {
        const double pad = lo != 0 ? fabs(lo) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    const double raw = (hi - lo) / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    const double tick = (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
    struct axis a = {floor(lo / tick) * tick, ceil(hi / tick) * tick, tick};
    if (a.hi <= a.lo) a.hi = a.lo + tick;
    return a;
}

/* Tick k of the axis, for k in [0, ticks(a)]; at most 50, so that a range
 * that rounding cannot step through still ends. */
static int ticks(const struct axis *a)
{
    const double n = floor((a->hi - a->lo) / a->tick + 0.5);
    return n >= 0 && n <= 50 ? (int)n : 0;
}

static double tick_at(const struct axis *a, int k) { return a->lo + k * a->tick; }

static double px(const struct axis *a, double v) { return X0 + (v - a->lo) / (a->hi - a->lo) * (X1 - X0); }
static double py(const struct axis *a, double v) { return Y1 - (v - a->lo) / (a->hi - a->lo) * (Y1 - Y0); }

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

/* The polyline of the points whose member (loss, val or lr) is a number. */
static void polyline(FILE *f, const struct series *s, size_t member, const struct axis *ax, const struct axis *ay,
                     const char *style)
{
    fprintf(f, "<polyline fill=\"none\" %s points=\"", style);
    for (size_t i = 0; i < s->n; i++) {
        const double v = *(const double *)((const char *)&s->p[i] + member);
        if (!isnan(v)) fprintf(f, "%.2f,%.2f ", px(ax, (double)s->p[i].step), py(ay, v));
    }
    fputs("\"/>\n", f);
}

static void draw(FILE *f, const struct series *s, const char *title)
{
    double lmin = INFINITY, lmax = -INFINITY, rmin = INFINITY, rmax = -INFINITY;
    int nval = 0, nlr = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct point *p = &s->p[i];
        if (!isnan(p->loss)) {
            lmin = fmin(lmin, p->loss);
            lmax = fmax(lmax, p->loss);
        }
        if (!isnan(p->val)) {
            lmin = fmin(lmin, p->val);
            lmax = fmax(lmax, p->val);
            nval++;
        }
        if (!isnan(p->lr)) {
            rmin = fmin(rmin, p->lr);
            rmax = fmax(rmax, p->lr);
            nlr++;
        }
    }
    if (lmin > lmax) lmin = lmax = 0;
    const struct axis ax = axis_of((double)s->p[0].step, (double)s->p[s->n - 1].step, 0),
                      ay = axis_of(lmin, lmax, 0), ar = nlr ? axis_of(rmin, rmax, 1) : ay;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", W, H, W, H);
    fprintf(f, "<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    fputs("<text x=\"390\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", f);
    xml_text(f, title);
    fputs("</text>\n", f);
    /* grid and ticks: steps below, loss left, lr right */
    for (int k = 0; k <= ticks(&ax); k++) {
        const double v = tick_at(&ax, k);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"#e6e6e6\"/><text x=\"%.2f\" "
                "y=\"%.0f\" text-anchor=\"middle\">%g</text>\n", px(&ax, v), Y0, px(&ax, v), Y1, px(&ax, v), Y1 + 16,
                v);
    }
    for (int k = 0; k <= ticks(&ay); k++) {
        const double v = tick_at(&ay, k);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\" stroke=\"#e6e6e6\"/><text x=\"%.0f\" "
                "y=\"%.2f\" text-anchor=\"end\">%.4g</text>\n", X0, py(&ay, v), X1, py(&ay, v), X0 - 6, py(&ay, v) + 4,
                fabs(v) < ay.tick / 1e6 ? 0.0 : v);
    }
    for (int k = 0; nlr && k <= ticks(&ar); k++) {
        const double v = tick_at(&ar, k);
        fprintf(f, "<text x=\"%.0f\" y=\"%.2f\" fill=\"#2a9d3a\">%.3g</text>\n", X1 + 6, py(&ar, v) + 4,
                    fabs(v) < ar.tick / 1e6 ? 0.0 : v);
    }
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#444\"/>\n", X0, Y0,
            X1 - X0, Y1 - Y0);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n", (X0 + X1) / 2, Y1 + 36);
    fprintf(f, "<text transform=\"translate(18 %.0f) rotate(-90)\" text-anchor=\"middle\">loss</text>\n",
            (Y0 + Y1) / 2);
    if (nlr)
        fprintf(f, "<text transform=\"translate(%.0f %.0f) rotate(90)\" text-anchor=\"middle\" "
                "fill=\"#2a9d3a\">learning rate</text>\n", W - 18, (Y0 + Y1) / 2);
    if (nlr) polyline(f, s, offsetof(struct point, lr), &ax, &ar, "stroke=\"#2a9d3a\" stroke-dasharray=\"5 3\"");
    polyline(f, s, offsetof(struct point, loss), &ax, &ay, "stroke=\"#1f6fb4\" stroke-width=\"1.5\"");
    if (nval) {
        polyline(f, s, offsetof(struct point, val), &ax, &ay, "stroke=\"#e07b00\" stroke-width=\"1.5\"");
        for (size_t i = 0; i < s->n; i++)
            if (!isnan(s->p[i].val))
                fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"#e07b00\"/>\n", px(&ax, (double)s->p[i].step),
                        py(&ay, s->p[i].val));
    }
    /* legend */
    const struct {
        int on;
        const char *style, *name;
    } legend[] = {{1, "stroke=\"#1f6fb4\" stroke-width=\"2\"", "training loss"},
                  {nval > 0, "stroke=\"#e07b00\" stroke-width=\"2\"", "validation loss"},
                  {nlr > 0, "stroke=\"#2a9d3a\" stroke-dasharray=\"5 3\"", "learning rate"}};
    double ly = Y0 + 14;
    for (size_t i = 0; i < sizeof legend / sizeof legend[0]; i++) {
        if (!legend[i].on) continue;
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" %s/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                X1 - 150, ly, X1 - 126, ly, legend[i].style, X1 - 120, ly + 4, legend[i].name);
        ly += 16;
    }
    fputs("</svg>\n", f);
}

int cdp_cli_plot(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *title = NULL;
    static const char *const known[] = {"--out", "--title", "--help", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            plot_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--out") || !strcmp(a, "--title")) {
            if (i + 1 >= argc) return cdp_cli_usage_error("plot", "%s needs a value ", a);
            *(!strcmp(a, "--title") ? &title : &out) = argv[++i];
        } else if (!strncmp(a, "--out=", 6)) {
            out = a + 6;
        } else if (!strncmp(a, "--title=", 8)) {
            title = a + 8;
        } else if (a[0] == '-' && a[1]) {
            return cdp_cli_unknown_option("plot", a, known);
        } else if (in) {
            return cdp_cli_usage_error("plot", "one metrics file at a time, got a second: %s ", a);
        } else {
            in = a;
        }
    }
    if (!in) return cdp_cli_usage_error("plot", "which metrics.jsonl? %s", "");
    if (!out) return cdp_cli_usage_error("plot", "-o OUT.svg: where to write the picture %s", "");
    struct series s = {0};
    cdp_status st = read_metrics(in, &s);
    if (st) {
        fprintf(stderr, "cdphybrid plot: %s\n", cdp_last_error());
        free(s.p);
        return cdp_cli_exit_code(st);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) {
        free(s.p);
        fprintf(stderr, "cdphybrid plot: out of memory\n");
        return EXIT_RUN_FAILED;
    }
    draw(m, &s, title ? title : in);
    const int bad = fclose(m) != 0;
    st = bad ? cdp_fail(CDP_ERR_NOMEM, "out of memory drawing the picture") : cdp_write_file_atomic(out, buf, len);
    free(buf);
    if (!st) printf("%zu steps of %s drawn in %s\n", s.n, in, out);
    free(s.p);
    if (st) {
        fprintf(stderr, "cdphybrid plot: %s\n", cdp_last_error());
        return cdp_cli_exit_code(st) == EXIT_USAGE ? EXIT_USAGE : EXIT_RUN_FAILED;
    }
    return 0;
}
