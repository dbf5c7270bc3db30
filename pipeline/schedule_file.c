/* Schedules from a file: a user's own per-rank lists, in the JSON form
 * cdp_schedule_print_json writes or as CSV (a row per rank, an instruction per
 * cell, as torch.distributed.pipelining's _load_csv lays them out), parsed
 * into the IR and proven by the same validators as generated lists; and the
 * lists a plan's job runs (generated, or its file). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/layout.h"
#include "pipeline/schedule.h"
#include "plan/schedule_header.h"
#include "plan/schedule_kind.h"

/* "12" at *s: the number, and s moved past it; -1 when there are no digits. */
static int number(const char **s)
{
    const char *p = *s;
    if (*p < '0' || *p > '9') return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9' && v < 100000000) v = v * 10 + (*p++ - '0');
    *s = p;
    return (int)v;
}

cdp_status cdp_instr_parse(const char *str, int v, struct cdp_instr *out)
{
    struct cdp_instr in = {.op = CDP_OP_COUNT, .mb = -1, .chunk = -1, .peer = -1};
    const char *s = str;
    if (!strcmp(s, "T") || !strcmp(s, "A") || !strcmp(s, "O")) {
        in.op = s[0] == 'T' ? CDP_OP_REDUCE_TIED_GRADS : s[0] == 'A' ? CDP_OP_ALLREDUCE_GRADS : CDP_OP_OPTIMIZER_STEP;
        *out = in;
        return CDP_OK;
    }
    const char *const expected = v > 1 ? "an instruction such as \"L0\", \"1F0\", \"0B3\", \"0I3\", \"1W3\", "
                                         "\"0sa3>1\", \"1ra3<0\", \"0sg3>0\", \"1rg3<1\", \"T\", \"A\" or \"O\" "
                                         "(the chunk first, but not for L)"
                                       : "an instruction such as \"L0\", \"F0\", \"B3\", \"I3\", \"W3\", \"sa3>1\", "
                                         "\"ra3<0\", \"sg3>0\", \"rg3<1\", \"T\", \"A\" or \"O\"";
    if (s[0] == 'L') {
        s++;
        in.op = CDP_OP_LOAD;
        in.chunk = 0; /* set from the rank by the caller */
        if ((in.mb = number(&s)) < 0 || *s) goto bad;
        *out = in;
        return CDP_OK;
    }
    if (v > 1) {
        if ((in.chunk = number(&s)) < 0) goto bad;
    } else {
        in.chunk = 0;
        if (*s >= '0' && *s <= '9') goto bad;
    }
    static const struct {
        const char *pre;
        enum cdp_op op;
    } ops[] = {{"sa", CDP_OP_SEND_ACT}, {"ra", CDP_OP_RECV_ACT}, {"sg", CDP_OP_SEND_GRAD}, {"rg", CDP_OP_RECV_GRAD},
               {"F", CDP_OP_FORWARD},   {"B", CDP_OP_BACKWARD},  {"I", CDP_OP_BACKWARD_INPUT},
               {"W", CDP_OP_BACKWARD_WEIGHT}};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        const size_t n = strlen(ops[k].pre);
        if (strncmp(s, ops[k].pre, n)) continue;
        s += n;
        in.op = ops[k].op;
        if ((in.mb = number(&s)) < 0) goto bad;
        if (n == 2) {
            const char dir = in.op == CDP_OP_SEND_ACT || in.op == CDP_OP_SEND_GRAD ? '>' : '<';
            if (*s != dir) goto bad;
            s++;
            if ((in.peer = number(&s)) < 0) goto bad;
        }
        if (*s) goto bad;
        *out = in;
        return CDP_OK;
    }
bad:
    return cdp_fail(CDP_ERR_INVALID, "\"%s\": expected %s", str, expected);
}

/* Appends one parsed instruction to rank r's list (grown as needed). */
static cdp_status push(struct cdp_schedule *s, int r, int *cap, const struct cdp_instr *in)
{
    if (s->len[r] == cap[r]) {
        const int nc = cap[r] ? 2 * cap[r] : 64;
        struct cdp_instr *l = realloc(s->list[r], (size_t)nc * sizeof *l);
        if (!l) return cdp_fail(CDP_ERR_NOMEM, "schedule file: out of memory");
        s->list[r] = l;
        cap[r] = nc;
    }
    s->list[r][s->len[r]++] = *in;
    return CDP_OK;
}

static cdp_status parse_one(const char *path, struct cdp_schedule *s, int r, int *cap, const char *word)
{
    struct cdp_instr in;
    if (cdp_instr_parse(word, s->v, &in))
        return cdp_error_context(CDP_ERR_INVALID, "%s: rank %d, instruction %d", path, r, s->len[r]);
    if (in.op == CDP_OP_LOAD && r != 0) { /* the LOAD of the last virtual stage feeds its chunk */
        int lr, lc;
        cdp_schedule_vstage_place(s->kind, s->p, s->v, s->p * s->v - 1, &lr, &lc);
        in.chunk = lc;
    }
    return push(s, r, cap, &in);
}

static struct cdp_schedule *empty(enum cdp_schedule_kind kind, int p, int v, int m, int **cap)
{
    struct cdp_schedule *s = calloc(1, sizeof *s);
    *cap = calloc((size_t)p, sizeof **cap);
    if (!s || !*cap) {
        free(s);
        free(*cap);
        return NULL;
    }
    *s = (struct cdp_schedule){.kind = kind, .p = p, .v = v, .m = m};
    s->len = calloc((size_t)p, sizeof *s->len);
    s->list = calloc((size_t)p, sizeof *s->list);
    if (!s->len || !s->list) {
        cdp_schedule_free(s);
        free(*cap);
        return NULL;
    }
    return s;
}

/* The JSON form: shape from the file, checked against p, v, m where they are
 * given (> 0). */
static cdp_status load_json(const char *path, json_t *root, enum cdp_schedule_kind kind, int p, int v, int m,
                            struct cdp_schedule **out)
{
    const json_t *jr = json_object_get(root, "ranks");
    struct cdp_schedule_header h;
    cdp_status hst = cdp_schedule_header_read(path, root, &h);
    if (hst) return hst;
    if (!json_is_array(jr))
        return cdp_fail(CDP_ERR_INVALID, "%s: \"ranks\": expected an array of lists of instructions, one per stage, "
                        "as `cdphybrid --plan P --schedule --json` writes", path);
    const json_int_t fp = h.stages, fm = h.micro_batches, fv = h.chunks;
    if ((p > 0 && fp != p) || (v > 0 && fv != v) || (m > 0 && fm != m))
        return cdp_fail(CDP_ERR_INVALID, "%s: the file is for %lld stages x %lld chunks x %lld micro-batches; the "
                        "job runs %d x %d x %d", path, (long long)fp, (long long)fv, (long long)fm, p, v, m);
    if (h.kind >= 0) kind = (enum cdp_schedule_kind)h.kind;
    if (cdp_schedule_def(kind)->chunks == CDP_CHUNKS_TWO && fv != 2)
        return cdp_fail(CDP_ERR_INVALID, "%s: \"schedule\": \"%s\" places 2 chunks per rank, the file has %lld", path, cdp_schedule_name(kind),
                        (long long)fv);
    if ((json_int_t)json_array_size(jr) != fp)
        return cdp_fail(CDP_ERR_INVALID, "%s: \"ranks\" has %zu lists; expected one per stage, %lld", path,
                        json_array_size(jr), (long long)fp);
    int *cap;
    struct cdp_schedule *s = empty(kind, (int)fp, (int)fv, (int)fm, &cap);
    if (!s) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    cdp_status st = CDP_OK;
    for (int r = 0; r < s->p && !st; r++) {
        const json_t *l = json_array_get(jr, (size_t)r);
        if (!json_is_array(l)) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: rank %d: expected a list of instructions", path, r);
            break;
        }
        for (size_t i = 0; i < json_array_size(l) && !st; i++) {
            const json_t *w = json_array_get(l, i);
            if (!json_is_string(w))
                st = cdp_fail(CDP_ERR_INVALID, "%s: rank %d, instruction %zu: expected a string such as \"F0\"", path,
                              r, i);
            else
                st = parse_one(path, s, r, cap, json_string_value(w));
        }
    }
    free(cap);
    if (st) {
        cdp_schedule_free(s);
        return st;
    }
    *out = s;
    return CDP_OK;
}

/* CSV: a row per rank, an instruction per cell; shape from the job. */
static cdp_status load_csv(const char *path, const char *text, enum cdp_schedule_kind kind, int p, int v, int m,
                           struct cdp_schedule **out)
{
    if (p < 1 || v < 1 || m < 1)
        return cdp_fail(CDP_ERR_INVALID, "%s: a CSV schedule has no shape of its own; give /parallel/stages, "
                        "/parallel/micro_batches (and /parallel/chunks)", path);
    int *cap;
    struct cdp_schedule *s = empty(kind, p, v, m, &cap);
    if (!s) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    cdp_status st = CDP_OK;
    int r = 0;
    char word[64];
    for (const char *c = text; *c && !st;) {
        const char *eol = strchr(c, '\n');
        if (!eol) eol = c + strlen(c);
        const char *q = c;
        while (q < eol && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q == eol) { /* blank lines are skipped */
            c = *eol ? eol + 1 : eol;
            continue;
        }
        if (r == p) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: more than %d rows; expected one per stage", path, p);
            break;
        }
        while (c < eol && !st) {
            const char *e = c;
            while (e < eol && *e != ',') e++;
            const char *a = c, *b = e;
            while (a < b && (*a == ' ' || *a == '\t')) a++;
            while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\r')) b--;
            if (b > a) { /* empty cells (idle slots in torch's files) are skipped */
                const size_t n = (size_t)(b - a) < sizeof word - 1 ? (size_t)(b - a) : sizeof word - 1;
                memcpy(word, a, n);
                word[n] = '\0';
                st = parse_one(path, s, r, cap, word);
            }
            c = e < eol ? e + 1 : e;
        }
        r++;
        c = *eol ? eol + 1 : eol;
    }
    if (!st && r != p) st = cdp_fail(CDP_ERR_INVALID, "%s: %d rows; expected one per stage, %d", path, r, p);
    free(cap);
    if (st) {
        cdp_schedule_free(s);
        return st;
    }
    *out = s;
    return CDP_OK;
}

cdp_status cdp_schedule_load(const char *path, enum cdp_schedule_kind kind, int p, int v, int m,
                             struct cdp_schedule **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return cdp_fail(CDP_ERR_IO, "%s: cannot read the schedule: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    for (size_t k; text && (k = fread(text + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (n + 1 == cap) {
            char *t = realloc(text, cap *= 2);
            if (!t) free(text);
            text = t;
        }
    }
    const int err = ferror(f);
    fclose(f);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    if (err) {
        free(text);
        return cdp_fail(CDP_ERR_IO, "%s: cannot read the schedule", path);
    }
    text[n] = '\0';
    const char *c = text;
    while (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r') c++;
    struct cdp_schedule *s = NULL;
    cdp_status st;
    if (*c == '{') {
        json_error_t je;
        json_t *root = json_loads(text, 0, &je);
        st = root ? load_json(path, root, kind, p, v, m, &s)
                  : cdp_fail(CDP_ERR_INVALID, "%s: line %d: %s", path, je.line, je.text);
        json_decref(root);
    } else {
        st = load_csv(path, text, kind, p, v, m, &s);
    }
    free(text);
    if (st) return st;
    if ((st = cdp_schedule_validate(s))) {
        cdp_schedule_free(s);
        return cdp_error_context(st, "%s", path);
    }
    *out = s;
    return CDP_OK;
}

cdp_status cdp_schedule_for_plan(const struct cdp_plan *plan, enum cdp_schedule_kind kind, int p, int v, int m,
                                 int tied, int rendezvous, struct cdp_schedule **out)
{
    return cdp_schedule_for_file(plan ? plan->parallel.schedule_file : NULL, kind, p, v, m, tied, rendezvous, out);
}

cdp_status cdp_schedule_for_layout(const struct cdp_layout *l, int m, int tied, int rendezvous,
                                   struct cdp_schedule **out)
{
    return cdp_schedule_for_file(l->schedule_file, l->schedule, l->stages, l->chunks, m, tied, rendezvous, out);
}

cdp_status cdp_schedule_for_file(const char *path, enum cdp_schedule_kind kind, int p, int v, int m, int tied,
                                 int rendezvous, struct cdp_schedule **out)
{
    if (!path) return cdp_schedule_build_ex(kind, p, v, m, tied, rendezvous, out);
    struct cdp_schedule *s = NULL;
    cdp_status st = cdp_schedule_load(path, kind, p, v, m, &s);
    if (st) return st;
    int lr, lc;
    cdp_schedule_vstage_place(s->kind, s->p, s->v, s->p * s->v - 1, &lr, &lc);
    for (int e = 0; tied && lr != 0 && e < 2; e++) {
        const int r = e ? lr : 0;
        int has = 0;
        for (int i = 0; i < s->len[r]; i++) has |= s->list[r][i].op == CDP_OP_REDUCE_TIED_GRADS;
        if (!has) {
            cdp_schedule_free(s);
            return cdp_fail(CDP_ERR_INVALID, "%s: rank %d: the model ties its embedding and head, which ranks 0 and "
                            "%d hold: their lists need a REDUCE_TIED_GRADS (T) before the ALLREDUCE_GRADS (A)", path,
                            r, lr);
        }
    }
    if (rendezvous && (st = cdp_schedule_validate_rendezvous(s))) {
        cdp_schedule_free(s);
        return cdp_error_context(st, "%s: under NCCL's rendezvous send/receive", path);
    }
    *out = s;
    return CDP_OK;
}
