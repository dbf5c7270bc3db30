/* Suite schedule: the generators (gpipe, 1f1b, interleaved) give lists the
 * validator proves, with the right counts and activations in flight; those
 * built for NCCL (rendezvous = 1) run under its rendezvous send/receive too,
 * those for MPI (rendezvous = 0, cdp_schedule_build) keep the original order;
 * small cases match lists written by hand; hand-broken lists are rejected with the offending instruction (or,
 * for rendezvous deadlocks, every stuck rank); `cdphybrid --plan P --schedule`
 * prints them. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "pipeline/schedule.h"

static struct cdp_schedule *build(enum cdp_schedule_kind kind, int p, int v, int m, int tied)
{
    struct cdp_schedule *s = NULL;
    cdp_status st = cdp_schedule_build(kind, p, v, m, tied, &s);
    cr_assert_eq(st, CDP_OK, "%s p=%d v=%d m=%d tied=%d: %s", cdp_schedule_name(kind), p, v, m, tied,
                 cdp_last_error());
    return s;
}

/* The lists for one transport: rendezvous = 0 for MPI, 1 for NCCL. */
static struct cdp_schedule *build_ex(enum cdp_schedule_kind kind, int p, int v, int m, int tied, int rendezvous)
{
    struct cdp_schedule *s = NULL;
    cdp_status st = cdp_schedule_build_ex(kind, p, v, m, tied, rendezvous, &s);
    cr_assert_eq(st, CDP_OK, "%s p=%d v=%d m=%d tied=%d rendezvous=%d: %s", cdp_schedule_name(kind), p, v, m,
                 tied, rendezvous, cdp_last_error());
    return s;
}

/* Same ranks, same lists, instruction for instruction. */
static int same_lists(const struct cdp_schedule *a, const struct cdp_schedule *b)
{
    if (a->p != b->p || a->v != b->v || a->m != b->m || a->kind != b->kind) return 0;
    for (int r = 0; r < a->p; r++) {
        if (a->len[r] != b->len[r]) return 0;
        for (int i = 0; i < a->len[r]; i++) {
            const struct cdp_instr *x = &a->list[r][i], *y = &b->list[r][i];
            if (x->op != y->op || x->mb != y->mb || x->chunk != y->chunk || x->peer != y->peer) return 0;
        }
    }
    return 1;
}

/* One rank's list in the compact form, space-separated (static storage). */
static const char *rank_str(const struct cdp_schedule *s, int r)
{
    static char out[8192];
    char b[64];
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < s->len[r]; i++)
        n += (size_t)snprintf(out + n, sizeof out - n, "%s%s", i ? " " : "",
                              cdp_instr_str(&s->list[r][i], s->v, b, sizeof b));
    return out;
}

/* Parses one instruction of the compact form ("L3", "1F0", "sa0>1", "T", ...). */
static struct cdp_instr parse_instr(const char *w, int v)
{
    struct cdp_instr in = {.op = CDP_OP_COUNT, .mb = -1, .chunk = -1, .peer = -1};
    if (!strcmp(w, "T") || !strcmp(w, "A") || !strcmp(w, "O")) {
        in.op = w[0] == 'T' ? CDP_OP_REDUCE_TIED_GRADS : w[0] == 'A' ? CDP_OP_ALLREDUCE_GRADS
                                                                       : CDP_OP_OPTIMIZER_STEP;
        return in;
    }
    int chunk = 0, used = 0;
    if (v > 1 && w[0] != 'L') {
        cr_assert_eq(sscanf(w, "%d%n", &chunk, &used), 1, "bad instruction \"%s\"", w);
        w += used;
    }
    in.chunk = chunk;
    static const struct { const char *pre; enum cdp_op op; } ops[] = {
        {"sa", CDP_OP_SEND_ACT}, {"ra", CDP_OP_RECV_ACT}, {"sg", CDP_OP_SEND_GRAD}, {"rg", CDP_OP_RECV_GRAD},
        {"L", CDP_OP_LOAD},      {"F", CDP_OP_FORWARD},   {"B", CDP_OP_BACKWARD},
        {"I", CDP_OP_BACKWARD_INPUT}, {"W", CDP_OP_BACKWARD_WEIGHT},
    };
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        size_t n = strlen(ops[k].pre);
        if (strncmp(w, ops[k].pre, n)) continue;
        in.op = ops[k].op;
        if (n == 2) cr_assert_eq(sscanf(w + n, "%d%*c%d", &in.mb, &in.peer), 2, "bad instruction \"%s\"", w);
        else cr_assert_eq(sscanf(w + n, "%d", &in.mb), 1, "bad instruction \"%s\"", w);
        return in;
    }
    cr_assert_fail("bad instruction \"%s\"", w);
    return in;
}

/* A schedule from one string per rank; the LOAD's chunk is set as the
 * generators set it. Free with cdp_schedule_free. */
static struct cdp_schedule *parse(int p, int v, int m, const char *const *ranks)
{
    struct cdp_schedule *s = calloc(1, sizeof *s);
    s->kind = CDP_SCHEDULE_1F1B;
    s->p = p, s->v = v, s->m = m;
    s->len = calloc((size_t)p, sizeof *s->len);
    s->list = calloc((size_t)p, sizeof *s->list);
    for (int r = 0; r < p; r++) {
        char *text = strdup(ranks[r]), *save = NULL;
        s->list[r] = calloc(strlen(text) + 1, sizeof *s->list[r]);
        for (char *w = strtok_r(text, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            struct cdp_instr in = parse_instr(w, v);
            if (in.op == CDP_OP_LOAD) in.chunk = r == 0 ? 0 : v - 1;
            s->list[r][s->len[r]++] = in;
        }
        free(text);
    }
    return s;
}

static int count_op(const struct cdp_schedule *s, int r, enum cdp_op op)
{
    int n = 0;
    for (int i = 0; i < s->len[r]; i++) n += s->list[r][i].op == op;
    return n;
}

/* Everything the validator claims, counted again independently. */
static void check_counts(const struct cdp_schedule *s, int tied)
{
    int p = s->p, v = s->v, m = s->m, V = p * v;
    int sa = 0, ra = 0, sg = 0, rg = 0;
    int *seen = calloc((size_t)m * v * 2, sizeof *seen);
    for (int r = 0; r < p; r++) {
        memset(seen, 0, (size_t)m * v * 2 * sizeof *seen);
        for (int i = 0; i < s->len[r]; i++) {
            const struct cdp_instr *in = &s->list[r][i];
            if (in->op == CDP_OP_FORWARD) seen[(in->mb * v + in->chunk) * 2]++;
            if (in->op == CDP_OP_BACKWARD) seen[(in->mb * v + in->chunk) * 2 + 1]++;
        }
        for (int j = 0; j < m * v * 2; j++)
            cr_assert_eq(seen[j], 1, "rank %d: mb %d chunk %d %s %d times", r, j / 2 / v, j / 2 % v,
                         j % 2 ? "backwarded" : "forwarded", seen[j]);
        int loads = (r == 0 || r == p - 1) ? m : 0;
        cr_assert_eq(count_op(s, r, CDP_OP_LOAD), loads, "rank %d loads", r);
        int want_tied = tied && p > 1 && (r == 0 || r == p - 1);
        cr_assert_eq(count_op(s, r, CDP_OP_REDUCE_TIED_GRADS), want_tied, "rank %d T", r);
        cr_assert_geq(s->len[r], 2);
        cr_assert_eq(s->list[r][s->len[r] - 2].op, CDP_OP_ALLREDUCE_GRADS, "rank %d", r);
        cr_assert_eq(s->list[r][s->len[r] - 1].op, CDP_OP_OPTIMIZER_STEP, "rank %d", r);
        sa += count_op(s, r, CDP_OP_SEND_ACT);
        ra += count_op(s, r, CDP_OP_RECV_ACT);
        sg += count_op(s, r, CDP_OP_SEND_GRAD);
        rg += count_op(s, r, CDP_OP_RECV_GRAD);
    }
    free(seen);
    /* Every boundary between virtual stages crosses ranks when p > 1. */
    int crossings = p > 1 ? m * (V - 1) : 0;
    cr_assert_eq(sa, crossings);
    cr_assert_eq(ra, crossings);
    cr_assert_eq(sg, crossings);
    cr_assert_eq(rg, crossings);
}

Test(schedule, every_generated_schedule_validates_with_right_counts)
{
    int cases = 0;
    /* the kinds with a combined backward; the split ones: zero_bubble_* below */
    for (int kind = 0; kind <= CDP_SCHEDULE_INTERLEAVED; kind++)
        for (int p = 1; p <= 8; p++)
            for (int v = 1; v <= 4; v++)
                for (int m = 1; m <= 32; m++)
                    for (int tied = 0; tied <= 1; tied++) {
                        int inter = kind == CDP_SCHEDULE_INTERLEAVED;
                        if (inter ? (v < 2 || p < 2 || m % p) : v != 1) continue;
                        struct cdp_schedule *s = build((enum cdp_schedule_kind)kind, p, v, m, tied);
                        cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
                        check_counts(s, tied);
                        cdp_schedule_free(s);
                        cases++;
                    }
    /* gpipe and 1f1b: 8 x 32 x 2 each; interleaved: sum over p of 3 x (32 / p) x 2 */
    int inter = 0;
    for (int p = 2; p <= 8; p++) inter += 3 * (32 / p) * 2;
    cr_assert_eq(cases, 2 * 8 * 32 * 2 + inter);
}

Test(schedule, build_rejects_shapes_the_kinds_cannot_run)
{
    struct cdp_schedule *s = NULL;
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_1F1B, 2, 2, 4, 0, &s), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "needs 1 chunk per rank"), "%s", cdp_last_error());
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_INTERLEAVED, 2, 1, 4, 0, &s), CDP_ERR_INVALID);
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_INTERLEAVED, 1, 2, 4, 0, &s), CDP_ERR_INVALID);
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_INTERLEAVED, 4, 2, 6, 0, &s), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "6 micro-batches is not a multiple of 4 stages"), "%s", cdp_last_error());
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_GPIPE, 0, 1, 4, 0, &s), CDP_ERR_INVALID);
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_GPIPE, 2, 1, 0, 0, &s), CDP_ERR_INVALID);
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_GPIPE, 1024, 1, 4096, 0, &s), CDP_ERR_INVALID);
    cr_assert_eq(cdp_schedule_build((enum cdp_schedule_kind)7, 2, 1, 4, 0, &s), CDP_ERR_INVALID);
    cr_assert_eq(cdp_schedule_build_ex(CDP_SCHEDULE_1F1B, 2, 2, 4, 0, 1, &s), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "needs 1 chunk per rank"), "%s", cdp_last_error());
    cr_assert_eq(cdp_schedule_build_ex(CDP_SCHEDULE_INTERLEAVED, 4, 2, 6, 0, 1, &s), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "6 micro-batches is not a multiple of 4 stages"), "%s", cdp_last_error());
    cr_assert_eq(cdp_schedule_build_ex(CDP_SCHEDULE_INTERLEAVED, 1, 2, 4, 0, 1, &s), CDP_ERR_INVALID);
    cr_assert_null(s, "nothing is written on failure");
    cdp_schedule_free(NULL);
}

Test(schedule, peak_in_flight_1f1b_is_p_minus_rank_gpipe_is_m)
{
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 32; m++) {
            struct cdp_schedule *f = build(CDP_SCHEDULE_1F1B, p, 1, m, 0);
            struct cdp_schedule *g = build(CDP_SCHEDULE_GPIPE, p, 1, m, 0);
            for (int r = 0; r < p; r++) {
                int want = p - r < m ? p - r : m; /* p - r whenever m >= p */
                cr_assert_eq(cdp_schedule_peak_in_flight(f, r), want, "1f1b p=%d m=%d rank %d", p, m, r);
                cr_assert_eq(cdp_schedule_peak_in_flight(g, r), m, "gpipe p=%d m=%d rank %d", p, m, r);
            }
            cdp_schedule_free(f);
            cdp_schedule_free(g);
        }
}

Test(schedule, peak_in_flight_interleaved_is_warmup_plus_one)
{
    for (int p = 2; p <= 8; p++)
        for (int v = 2; v <= 4; v++)
            for (int m = p; m <= 32; m += p)
                for (int rv = 0; rv <= 1; rv++) { /* batching moves communication, not compute */
                    struct cdp_schedule *s = build_ex(CDP_SCHEDULE_INTERLEAVED, p, v, m, 0, rv);
                    for (int r = 0; r < p; r++) {
                        int warm = (p - r - 1) * 2 + (v - 1) * p;
                        int want = warm >= m * v ? m * v : warm + 1;
                        cr_assert_eq(cdp_schedule_peak_in_flight(s, r), want, "p=%d v=%d m=%d rank %d rendezvous=%d",
                                     p, v, m, r, rv);
                    }
                    cdp_schedule_free(s);
                }
}

Test(schedule, small_1f1b_matches_the_hand_written_lists)
{
    struct cdp_schedule *s = build(CDP_SCHEDULE_1F1B, 2, 1, 4, 0);
    cr_assert_str_eq(rank_str(s, 0), "L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 L2 F2 sa2>1 rg1<1 B1 "
                                     "L3 F3 sa3>1 rg2<1 B2 rg3<1 B3 A O");
    cr_assert_str_eq(rank_str(s, 1), "L0 ra0<0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 L2 ra2<0 F2 B2 sg2>0 "
                                     "L3 ra3<0 F3 B3 sg3>0 A O");
    cdp_schedule_free(s);

    s = build(CDP_SCHEDULE_1F1B, 3, 1, 3, 1);
    cr_assert_str_eq(rank_str(s, 0), "L0 F0 sa0>1 L1 F1 sa1>1 L2 F2 sa2>1 rg0<1 B0 rg1<1 B1 rg2<1 B2 T A O");
    cr_assert_str_eq(rank_str(s, 1), "ra0<0 F0 sa0>2 ra1<0 F1 sa1>2 rg0<2 B0 sg0>0 "
                                     "ra2<0 F2 sa2>2 rg1<2 B1 sg1>0 rg2<2 B2 sg2>0 A O");
    cr_assert_str_eq(rank_str(s, 2), "L0 ra0<1 F0 B0 sg0>1 L1 ra1<1 F1 B1 sg1>1 L2 ra2<1 F2 B2 sg2>1 T A O");
    cdp_schedule_free(s);

    s = build(CDP_SCHEDULE_1F1B, 1, 1, 2, 1);
    cr_assert_str_eq(rank_str(s, 0), "L0 F0 B0 L1 F1 B1 A O", "one rank: no sends, no tied reduction");
    cdp_schedule_free(s);
}

Test(schedule, small_gpipe_matches_the_hand_written_lists)
{
    struct cdp_schedule *s = build(CDP_SCHEDULE_GPIPE, 2, 1, 2, 0);
    cr_assert_str_eq(rank_str(s, 0), "L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 A O");
    cr_assert_str_eq(rank_str(s, 1), "L0 ra0<0 F0 L1 ra1<0 F1 B0 sg0>0 B1 sg1>0 A O");
    cdp_schedule_free(s);
}

Test(schedule, small_interleaved_matches_the_hand_written_lists)
{
    /* Virtual stages: 0 = rank 0 chunk 0, 1 = rank 1 chunk 0, 2 = rank 0 chunk 1,
     * 3 = rank 1 chunk 1. Rank 0 warms up with all 4 forwards, rank 1 with 2. */
    struct cdp_schedule *s = build(CDP_SCHEDULE_INTERLEAVED, 2, 2, 2, 1);
    cr_assert_str_eq(rank_str(s, 0), "L0 0F0 0sa0>1 L1 0F1 0sa1>1 1ra0<1 1F0 1sa0>1 1ra1<1 1F1 1sa1>1 "
                                     "1rg0<1 1B0 1sg0>1 1rg1<1 1B1 1sg1>1 0rg0<1 0B0 0rg1<1 0B1 T A O");
    cr_assert_str_eq(rank_str(s, 1), "0ra0<0 0F0 0sa0>0 0ra1<0 0F1 0sa1>0 L0 1ra0<0 1F0 1B0 1sg0>0 "
                                     "L1 1ra1<0 1F1 1B1 1sg1>0 0rg0<0 0B0 0sg0>0 0rg1<0 0B1 0sg1>0 T A O");
    cdp_schedule_free(s);

    /* Micro-batches go through the chunks in groups of p (Megatron's get_model_chunk_id). */
    s = build(CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 0);
    char b[64];
    const char *want[] = {"0F0", "0F1", "1F0", "1F1", "0F2", "0F3", "1F2", "1F3"};
    int n = 0;
    for (int i = 0; i < s->len[0]; i++)
        if (s->list[0][i].op == CDP_OP_FORWARD)
            cr_assert_str_eq(cdp_instr_str(&s->list[0][i], 2, b, sizeof b), want[n++]);
    cr_assert_eq(n, 8);
    cdp_schedule_free(s);
}

Test(schedule, compact_form_parses_back_to_the_same_lists)
{
    const enum cdp_schedule_kind kinds[] = {CDP_SCHEDULE_GPIPE, CDP_SCHEDULE_1F1B, CDP_SCHEDULE_INTERLEAVED};
    for (int k = 0; k < 3; k++) {
        int v = k == 2 ? 3 : 1;
        struct cdp_schedule *s = build(kinds[k], 4, v, 8, 1);
        char *texts[4];
        for (int r = 0; r < 4; r++) texts[r] = strdup(rank_str(s, r));
        struct cdp_schedule *t = parse(4, v, 8, (const char *const *)texts);
        for (int r = 0; r < 4; r++) {
            cr_assert_eq(t->len[r], s->len[r]);
            cr_assert_eq(memcmp(t->list[r], s->list[r], (size_t)s->len[r] * sizeof *s->list[r]), 0,
                         "%s rank %d", cdp_schedule_name(kinds[k]), r);
            free(texts[r]);
        }
        cdp_schedule_free(s);
        cdp_schedule_free(t);
    }
}

/* Validates a hand-written schedule that must fail with exactly `msg`. */
static void expect_broken(int p, int v, int m, const char *const *ranks, const char *msg)
{
    struct cdp_schedule *s = parse(p, v, m, ranks);
    cr_assert_eq(cdp_schedule_validate(s), CDP_ERR_INVALID, "accepted: %s", ranks[0]);
    cr_assert_str_eq(cdp_last_error(), msg);
    cdp_schedule_free(s);
}

/* The good 1f1b p=2 m=2 lists the broken ones below are edited from. */
#define R0 "L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 A O"
#define R1 "L0 ra0<0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 A O"

Test(schedule, hand_written_good_lists_pass)
{
    struct cdp_schedule *s = parse(2, 1, 2, (const char *[]){R0, R1});
    cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(s);
    /* A receive placed early (not as late as possible) is slower, not wrong. */
    s = parse(2, 1, 2, (const char *[]){R0, "L0 ra0<0 ra1<0 F0 B0 sg0>0 L1 F1 B1 sg1>0 A O"});
    cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(s);
}

Test(schedule, rejects_a_missing_receive)
{
    expect_broken(2, 1, 2, (const char *[]){R0, "L0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 A O"},
                  "rank 1, instruction 1 (F0): forward of micro-batch 0 before its input is received "
                  "(no ra0<0 before it)");
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 B1 A O", R1},
                  "rank 0, instruction 8 (B1): backward of micro-batch 1 before its output gradient is "
                  "received (no rg1<1 before it)");
    /* The receive is there, but after the forward that needs it. */
    expect_broken(2, 1, 2, (const char *[]){R0, "L0 F0 ra0<0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 A O"},
                  "rank 1, instruction 1 (F0): forward of micro-batch 0 before its input is received "
                  "(no ra0<0 before it)");
}

Test(schedule, rejects_a_send_without_receive)
{
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 sa0>1 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 A O", R1},
                  "rank 0, instruction 3 (sa0>1): micro-batch 0 sent a second time (first at instruction 2): "
                  "rank 1 has one receive for it, so this send has no matching receive");
    expect_broken(2, 1, 2, (const char *[]){R0, "L0 ra0<0 F0 sa0>0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 A O"},
                  "rank 1, instruction 3 (sa0>0): virtual stage 1 is the last: there is no next stage, "
                  "so no matching receive");
    /* To the wrong rank: p = 3, rank 0 sends to rank 2, which expects nothing from it. */
    expect_broken(3, 1, 1,
                  (const char *[]){"L0 F0 sa0>2 rg0<1 B0 A O", "ra0<0 F0 sa0>2 rg0<2 B0 sg0>0 A O",
                                   "L0 ra0<1 F0 B0 sg0>1 A O"},
                  "rank 0, instruction 2 (sa0>2): the peer is rank 2, but virtual stage 1 is on rank 1: "
                  "no matching receive there");
    /* A send removed: the receive on rank 1 would wait forever. */
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 A O", R1},
                  "rank 0: the activation of micro-batch 0 is never sent to rank 1, which receives it");
}

Test(schedule, rejects_a_backward_before_its_forward)
{
    expect_broken(1, 1, 2, (const char *[]){"L0 F0 B1 L1 F1 B0 A O"},
                  "rank 0, instruction 2 (B1): backward of micro-batch 1 before its forward");
    expect_broken(2, 1, 2, (const char *[]){R0, "L0 ra0<0 F0 B0 sg0>0 B1 L1 ra1<0 F1 sg1>0 A O"},
                  "rank 1, instruction 5 (B1): backward of micro-batch 1 before its forward");
    expect_broken(2, 1, 2, (const char *[]){R0, "L0 ra0<0 F0 sg0>0 B0 L1 ra1<0 F1 B1 sg1>0 A O"},
                  "rank 1, instruction 3 (sg0>0): sends the input gradient of micro-batch 0 before its backward");
}

Test(schedule, rejects_a_cyclic_wait_naming_every_pending_instruction)
{
    /* Rank 0 waits for micro-batch 0's gradient before sending its activation. */
    expect_broken(2, 1, 1, (const char *[]){"L0 F0 rg0<1 sa0>1 B0 A O", "L0 ra0<0 F0 B0 sg0>0 A O"},
                  "deadlock: no rank can go on; rank 0 waits at instruction 2 (rg0<1) for rank 1, "
                  "rank 1 waits at instruction 1 (ra0<0) for rank 0");
    /* Three ranks: rank 1 receives micro-batch 1 before 0, but rank 0 sends 1 only
     * after the gradient of 0 came back; rank 2 waits on rank 1. */
    expect_broken(3, 1, 2,
                  (const char *[]){"L0 F0 sa0>1 rg0<1 B0 L1 F1 sa1>1 rg1<1 B1 A O",
                                   "ra1<0 ra0<0 F0 sa0>2 F1 sa1>2 rg0<2 B0 sg0>0 rg1<2 B1 sg1>0 A O",
                                   "L0 ra0<1 F0 B0 sg0>1 L1 ra1<1 F1 B1 sg1>1 A O"},
                  "deadlock: no rank can go on; rank 0 waits at instruction 3 (rg0<1) for rank 1, "
                  "rank 1 waits at instruction 0 (ra1<0) for rank 0, rank 2 waits at instruction 1 (ra0<1) "
                  "for rank 1");
}

Test(schedule, rejects_a_duplicated_forward)
{
    expect_broken(1, 1, 2, (const char *[]){"L0 F0 F0 L1 F1 B0 B1 A O"},
                  "rank 0, instruction 2 (F0): micro-batch 0 forwarded a second time (first at instruction 1)");
    expect_broken(2, 2, 2,
                  (const char *[]){"L0 0F0 0sa0>1 L1 0F1 0sa1>1 1ra0<1 1F0 1sa0>1 1ra1<1 1F1 1sa1>1 1F1",
                                   "A O"},
                  "rank 0, instruction 12 (1F1): micro-batch 1 on chunk 1 forwarded a second time "
                  "(first at instruction 10)");
}

Test(schedule, rejects_a_missing_step_end)
{
    expect_broken(2, 1, 2, (const char *[]){R0, "L0 ra0<0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 A"},
                  "rank 1: no OPTIMIZER_STEP (O) at the end of the list");
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 O", R1},
                  "rank 0: no ALLREDUCE_GRADS (A) at the end of the list");
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 O A", R1},
                  "rank 0, instruction 11 (A): after the optimizer step (instruction 10)");
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 A rg1<1 B1 O", R1},
                  "rank 0, instruction 9 (rg1<1): micro-batch 1 after the step-end instructions began "
                  "(instruction 8)");
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 A T O", R1},
                  "rank 0, instruction 11 (T): tied gradients reduced after the all-reduce (instruction 10)");
}

Test(schedule, rejects_wrong_loads_and_tied_reductions)
{
    expect_broken(2, 1, 2, (const char *[]){R0, "L0 ra0<0 F0 B0 sg0>0 ra1<0 F1 B1 sg1>0 A O"},
                  "rank 1, instruction 6 (F1): forward of micro-batch 1 before its LOAD (L1)");
    expect_broken(3, 1, 1,
                  (const char *[]){"L0 F0 sa0>1 rg0<1 B0 A O", "L0 ra0<0 F0 sa0>2 rg0<2 B0 sg0>0 A O",
                                   "L0 ra0<1 F0 B0 sg0>1 A O"},
                  "rank 1, instruction 0 (L0): rank 1 holds neither the first nor the last virtual stage: "
                  "it loads nothing");
    expect_broken(2, 1, 2, (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 T A O", R1},
                  "rank 0 reduces tied gradients (T) but rank 1 does not");
    expect_broken(1, 1, 1, (const char *[]){"L0 F0 B0 T A O"},
                  "rank 0, instruction 3 (T): one rank holds the first and the last virtual stage: "
                  "there are no tied gradients to sum");
    expect_broken(3, 1, 1,
                  (const char *[]){"L0 F0 sa0>1 rg0<1 B0 T A O", "ra0<0 F0 sa0>2 rg0<2 B0 sg0>0 T A O",
                                   "L0 ra0<1 F0 B0 sg0>1 T A O"},
                  "rank 1, instruction 6 (T): only the ranks holding the first and the last virtual stage "
                  "(0 and 2) reduce tied gradients");
    expect_broken(1, 1, 2, (const char *[]){"L0 F0 B0 F1 B1 A O"},
                  "rank 0, instruction 3 (F1): forward of micro-batch 1 before its LOAD (L1)");
    expect_broken(1, 1, 2, (const char *[]){"L0 F0 B0 L1 F1 B1 L7 A O"},
                  "rank 0, instruction 6 (L7): micro-batch 7 out of range 0..1");
}

Test(schedule, one_rank_with_chunks_orders_them_locally)
{
    /* p = 1, v = 2 is not generated, but the validator still reasons about it:
     * no sends, chunk 1's forward after chunk 0's, backward the other way. */
    struct cdp_schedule *s = parse(1, 2, 1, (const char *[]){"L0 0F0 1F0 1B0 0B0 A O"});
    cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(s);
    expect_broken(1, 2, 1, (const char *[]){"L0 1F0 0F0 1B0 0B0 A O"},
                  "rank 0, instruction 1 (1F0): forward of micro-batch 0 on chunk 1 before the forward "
                  "of chunk 0 that feeds it");
    expect_broken(1, 2, 1, (const char *[]){"L0 0F0 1F0 0B0 1B0 A O"},
                  "rank 0, instruction 3 (0B0): backward of micro-batch 0 on chunk 0 before the backward "
                  "of chunk 1 that feeds it");
    expect_broken(1, 2, 1, (const char *[]){"L0 0F0 0sa0>0 1F0 1B0 0B0 A O"},
                  "rank 0, instruction 2 (0sa0>0): virtual stage 1 is on this rank too: nothing to send");
}

Test(schedule, print_and_json_forms)
{
    struct cdp_schedule *s = build(CDP_SCHEDULE_GPIPE, 2, 1, 1, 0);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    cr_assert_eq(cdp_schedule_print(s, f), CDP_OK);
    fclose(f);
    cr_assert_str_eq(buf, "rank 0: L0 F0 sa0>1 rg0<1 B0 A O\nrank 1: L0 ra0<0 F0 B0 sg0>0 A O\n");
    free(buf);
    f = open_memstream(&buf, &n);
    cr_assert_eq(cdp_schedule_print_json(s, f), CDP_OK);
    fclose(f);
    json_error_t err;
    json_t *j = json_loads(buf, 0, &err);
    cr_assert_not_null(j, "%s: %s", err.text, buf);
    cr_assert_str_eq(json_string_value(json_object_get(j, "schedule")), "gpipe");
    cr_assert_eq(json_integer_value(json_object_get(j, "stages")), 2);
    cr_assert_str_eq(json_string_value(json_array_get(json_array_get(json_object_get(j, "ranks"), 1), 1)), "ra0<0");
    json_decref(j);
    free(buf);
    cdp_schedule_free(s);
}

/* ---- rendezvous (NCCL) semantics -------------------------------------------- */

Test(schedule, p2p_group_end_finds_the_maximal_runs_of_sends_and_receives)
{
    struct cdp_schedule *s = parse(2, 1, 2, (const char *[]){R0, R1});
    /* rank 0: L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 rg1<1 B1 A O */
    const int want0[] = {0, 1, 3, 3, 4, 7, 7, 7, 9, 9, 10, 11, 12};
    for (int i = 0; i <= s->len[0]; i++)
        cr_assert_eq(cdp_schedule_p2p_group_end(s, 0, i), want0[i], "rank 0, instruction %d", i);
    /* rank 1: L0 ra0<0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 A O: the LOAD splits sg0 from ra1 */
    cr_assert_eq(cdp_schedule_p2p_group_end(s, 1, 4), 5);
    cr_assert_eq(cdp_schedule_p2p_group_end(s, 1, 5), 5);
    cr_assert_eq(cdp_schedule_p2p_group_end(s, 1, 6), 7);
    cdp_schedule_free(s);
}

/* Every list a generator gives for NCCL (rendezvous = 1), over the grid the
 * executor will meet, is well formed with the right counts and runs under
 * NCCL's semantics; the groups it forms cover every send and receive once. */
Test(schedule, every_generated_schedule_passes_rendezvous)
{
    int cases = 0, groups = 0;
    for (int kind = 0; kind <= CDP_SCHEDULE_INTERLEAVED; kind++)
        for (int p = 1; p <= 8; p++)
            for (int v = 1; v <= 3; v++)
                for (int m = 1; m <= 16; m++)
                    for (int tied = 0; tied <= 1; tied++) {
                        int inter = kind == CDP_SCHEDULE_INTERLEAVED;
                        if (inter ? (v < 2 || p < 2 || m % p) : v != 1) continue;
                        struct cdp_schedule *s = build_ex((enum cdp_schedule_kind)kind, p, v, m, tied, 1);
                        cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
                        check_counts(s, tied);
                        cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_OK, "%s p=%d v=%d m=%d tied=%d: %s",
                                     cdp_schedule_name((enum cdp_schedule_kind)kind), p, v, m, tied,
                                     cdp_last_error());
                        for (int r = 0; r < p; r++) {
                            int comm = 0, covered = 0;
                            for (int i = 0; i < s->len[r]; i++) {
                                enum cdp_op op = s->list[r][i].op;
                                comm += op == CDP_OP_SEND_ACT || op == CDP_OP_RECV_ACT || op == CDP_OP_SEND_GRAD ||
                                        op == CDP_OP_RECV_GRAD;
                            }
                            for (int i = 0, e; i < s->len[r]; i = e > i ? e : i + 1) {
                                e = cdp_schedule_p2p_group_end(s, r, i);
                                if (e == i) continue;
                                cr_assert(i == 0 || cdp_schedule_p2p_group_end(s, r, i - 1) == i - 1,
                                          "rank %d: a group starts at %d inside a run", r, i);
                                covered += e - i;
                                groups++;
                            }
                            cr_assert_eq(covered, comm, "rank %d", r);
                        }
                        cdp_schedule_free(s);
                        cases++;
                    }
    /* gpipe and 1f1b: 8 x 16 x 2 each; interleaved: sum over p of 2 x (16 / p) x 2 */
    int inter = 0;
    for (int p = 2; p <= 8; p++) inter += 2 * (16 / p) * 2;
    cr_assert_eq(cases, 2 * 8 * 16 * 2 + inter);
    cr_assert_gt(groups, 0);
}

/* Validates a hand-written schedule that cdp_schedule_validate accepts (MPI's
 * buffered sends) and cdp_schedule_validate_rendezvous rejects with msg. */
static void expect_rendezvous_broken(int p, int v, int m, const char *const *ranks, const char *msg)
{
    struct cdp_schedule *s = parse(p, v, m, ranks);
    cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "buffered: %s", cdp_last_error());
    cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_ERR_INTERNAL, "accepted: %s", ranks[0]);
    cr_assert_str_eq(cdp_last_error(), msg);
    cdp_schedule_free(s);
}

Test(schedule, rendezvous_completes_a_group_transfer_by_transfer)
{
    /* Rank 0 posts sa1>1 and rg0<1 in one group; rank 1 first posts sg0>0 alone,
     * then (after L1) ra1<0. The group's receive meets rank 1's send while its
     * send is still pending, so rank 1 moves on and posts the receive. */
    struct cdp_schedule *s = parse(2, 1, 2, (const char *[]){R0, R1});
    cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(s);
}

Test(schedule, rendezvous_rejects_sends_both_ranks_post_before_their_receives)
{
    /* GPipe's rank 0 with 1F1B's rank 1: rank 0 sends sa1>1 in a group of its
     * own, then forwards micro-batch 2 before it posts rg0<1; rank 1 sends
     * sg0>0 alone, then loads before it posts ra1<0. With buffered sends both go
     * on; with rendezvous each waits for a receive the other posts only later. */
    expect_rendezvous_broken(
        2, 1, 3,
        (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 L2 F2 sa2>1 rg0<1 B0 rg1<1 B1 rg2<1 B2 A O",
                         "L0 ra0<0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 L2 ra2<0 F2 B2 sg2>0 A O"},
        "deadlock under rendezvous send/receive (one NCCL group per run of consecutive sends and receives): "
        "no group can complete; rank 0 blocks in its group at instruction 5 (sa1>1), unmatched sa1>1, "
        "rank 1 blocks in its group at instruction 4 (sg0>0), unmatched sg0>0");
    /* Three ranks, GPipe's ranks 0 and 1 with 1F1B's rank 2: rank 1 sends sa1>2
     * in a group with ra2<0, rank 2 sends sg0>1 alone; each group is named with
     * what in it is still unmatched. */
    expect_rendezvous_broken(
        3, 1, 3,
        (const char *[]){"L0 F0 sa0>1 L1 F1 sa1>1 L2 F2 sa2>1 rg0<1 B0 rg1<1 B1 rg2<1 B2 A O",
                         "ra0<0 F0 sa0>2 ra1<0 F1 sa1>2 ra2<0 F2 sa2>2 rg0<2 B0 sg0>0 rg1<2 B1 sg1>0 rg2<2 B2 "
                         "sg2>0 A O",
                         "L0 ra0<1 F0 B0 sg0>1 L1 ra1<1 F1 B1 sg1>1 L2 ra2<1 F2 B2 sg2>1 A O"},
        "deadlock under rendezvous send/receive (one NCCL group per run of consecutive sends and receives): "
        "no group can complete; rank 0 blocks in its group at instructions 8-9 (sa2>1 rg0<1), unmatched rg0<1, "
        "rank 1 blocks in its group at instructions 5-6 (sa1>2 ra2<0), unmatched sa1>2, "
        "rank 2 blocks in its group at instruction 4 (sg0>1), unmatched sg0>1");
}

/* What the interleaved generator gives for MPI (rendezvous = 0, as before
 * the NCCL order existed) for p = 2, v = 2, m = 4: every send right after its
 * compute, every receive right before its use. */
#define MPI_INTERLEAVED_2_2_4_R0                                                                               \
    "L0 0F0 0sa0>1 L1 0F1 0sa1>1 1ra0<1 1F0 1sa0>1 1ra1<1 1F1 1sa1>1 L2 0F2 0sa2>1 1rg0<1 "                        \
    "1B0 1sg0>1 L3 0F3 0sa3>1 1rg1<1 1B1 1sg1>1 1ra2<1 1F2 1sa2>1 0rg0<1 0B0 1ra3<1 1F3 "                          \
    "1sa3>1 0rg1<1 0B1 1rg2<1 1B2 1sg2>1 1rg3<1 1B3 1sg3>1 0rg2<1 0B2 0rg3<1 0B3 A O"
#define MPI_INTERLEAVED_2_2_4_R1                                                                               \
    "0ra0<0 0F0 0sa0>0 0ra1<0 0F1 0sa1>0 L0 1ra0<0 1F0 1B0 1sg0>0 L1 1ra1<0 1F1 1B1 1sg1>0 "                      \
    "0ra2<0 0F2 0sa2>0 0rg0<0 0B0 0sg0>0 0ra3<0 0F3 0sa3>0 0rg1<0 0B1 0sg1>0 L2 1ra2<0 1F2 "                      \
    "1B2 1sg2>0 L3 1ra3<0 1F3 1B3 1sg3>0 0rg2<0 0B2 0sg2>0 0rg3<0 0B3 0sg3>0 A O"

Test(schedule, rendezvous_rejects_the_old_interleaved_placement)
{
    /* The MPI order under NCCL's semantics: rank 0 sends 1sa1>1 alone at the
     * end of its warm-up, rank 1 sends 1sg0>0 alone and loads before receiving
     * 1ra1<0. */
    expect_rendezvous_broken(
        2, 2, 4, (const char *[]){MPI_INTERLEAVED_2_2_4_R0, MPI_INTERLEAVED_2_2_4_R1},
        "deadlock under rendezvous send/receive (one NCCL group per run of consecutive sends and receives): "
        "no group can complete; rank 0 blocks in its group at instruction 11 (1sa1>1), unmatched 1sa1>1, "
        "rank 1 blocks in its group at instruction 10 (1sg0>0), unmatched 1sg0>0");
}

Test(schedule, small_interleaved_batches_communication_as_megatron)
{
    /* After each unit of work: its SEND_GRAD, its SEND_ACT, then the RECV_GRAD,
     * LOAD and RECV_ACT of the next. Rank 0 warms up with 4 forwards, rank 1 with 2. */
    struct cdp_schedule *s = build_ex(CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 0, 1);
    cr_assert_str_eq(rank_str(s, 0),
                     "L0 0F0 0sa0>1 L1 0F1 0sa1>1 1ra0<1 1F0 1sa0>1 1ra1<1 1F1 1sa1>1 1rg0<1 L2 0F2 1B0 "
                     "1sg0>1 0sa2>1 1rg1<1 L3 0F3 1B1 1sg1>1 0sa3>1 0rg0<1 1ra2<1 1F2 0B0 1sa2>1 0rg1<1 1ra3<1 "
                     "1F3 0B1 1sa3>1 1rg2<1 1B2 1sg2>1 1rg3<1 1B3 1sg3>1 0rg2<1 0B2 0rg3<1 0B3 A O");
    cr_assert_str_eq(rank_str(s, 1),
                     "0ra0<0 0F0 0sa0>0 0ra1<0 0F1 0sa1>0 L0 1ra0<0 1F0 1B0 1sg0>0 L1 1ra1<0 1F1 1B1 1sg1>0 "
                     "0rg0<0 0ra2<0 0F2 0B0 0sg0>0 0sa2>0 0rg1<0 0ra3<0 0F3 0B1 0sg1>0 0sa3>0 L2 1ra2<0 1F2 "
                     "1B2 1sg2>0 L3 1ra3<0 1F3 1B3 1sg3>0 0rg2<0 0B2 0sg2>0 0rg3<0 0B3 0sg3>0 A O");
    cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(s);
}

Test(schedule, rendezvous_rejects_sends_out_of_the_receivers_order)
{
    /* NCCL has no tags: with p = 2 both kinds travel between the same two ranks,
     * so rank 0 sending 0sa2>1 before 1sg0>1 would put the activation into
     * rank 1's receive of the gradient (fine for MPI, which matches by tag). */
    struct cdp_schedule *s = build_ex(CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 0, 1);
    char *r0 = strdup(rank_str(s, 0)), *r1 = strdup(rank_str(s, 1));
    char *at = strstr(r0, "1sg0>1 0sa2>1");
    cr_assert_not_null(at);
    memcpy(at, "0sa2>1 1sg0>1", strlen("0sa2>1 1sg0>1"));
    expect_rendezvous_broken(2, 2, 4, (const char *[]){r0, r1},
                             "rank 0, instruction 16 (0sa2>1) and rank 1, instruction 16 (0rg0<0) are the 5th "
                             "transfer from rank 0 to rank 1: NCCL pairs sends and receives between two ranks "
                             "in the order they are posted, so this send would land in that receive");
    free(r0);
    free(r1);
    cdp_schedule_free(s);
}

Test(schedule, mpi_interleaved_keeps_the_original_order)
{
    /* rendezvous = 0, and cdp_schedule_build, give the lists the generator gave
     * before the NCCL order existed (pinned from that builder); the simulator,
     * the planner and the CPU executor run these. */
    struct cdp_schedule *s = build_ex(CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 0, 0);
    cr_assert_str_eq(rank_str(s, 0), MPI_INTERLEAVED_2_2_4_R0);
    cr_assert_str_eq(rank_str(s, 1), MPI_INTERLEAVED_2_2_4_R1);
    struct cdp_schedule *d = build(CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 0);
    cr_assert(same_lists(s, d), "cdp_schedule_build is rendezvous = 0");
    cdp_schedule_free(d);
    cdp_schedule_free(s);

    s = build_ex(CDP_SCHEDULE_INTERLEAVED, 3, 2, 3, 1, 0);
    cr_assert_str_eq(rank_str(s, 0), "L0 0F0 0sa0>1 L1 0F1 0sa1>1 L2 0F2 0sa2>1 1ra0<2 1F0 1sa0>1 1ra1<2 1F1 "
                                     "1sa1>1 1ra2<2 1F2 1sa2>1 1rg0<1 1B0 1sg0>2 1rg1<1 1B1 1sg1>2 1rg2<1 1B2 "
                                     "1sg2>2 0rg0<1 0B0 0rg1<1 0B1 0rg2<1 0B2 T A O");
    cr_assert_str_eq(rank_str(s, 1), "0ra0<0 0F0 0sa0>2 0ra1<0 0F1 0sa1>2 0ra2<0 0F2 0sa2>2 1ra0<0 1F0 1sa0>2 "
                                     "1ra1<0 1F1 1sa1>2 1ra2<0 1F2 1sa2>2 1rg0<2 1B0 1sg0>0 1rg1<2 1B1 1sg1>0 "
                                     "1rg2<2 1B2 1sg2>0 0rg0<2 0B0 0sg0>0 0rg1<2 0B1 0sg1>0 0rg2<2 0B2 0sg2>0 A O");
    cr_assert_str_eq(rank_str(s, 2), "0ra0<1 0F0 0sa0>0 0ra1<1 0F1 0sa1>0 0ra2<1 0F2 0sa2>0 L0 1ra0<1 1F0 1B0 "
                                     "1sg0>1 L1 1ra1<1 1F1 1B1 1sg1>1 L2 1ra2<1 1F2 1B2 1sg2>1 0rg0<0 0B0 0sg0>1 "
                                     "0rg1<0 0B1 0sg1>1 0rg2<0 0B2 0sg2>1 T A O");
    cdp_schedule_free(s);
}

Test(schedule, only_interleaved_changes_with_the_transport)
{
    /* gpipe and 1f1b: the same lists for MPI and NCCL. Interleaved: the MPI
     * order deadlocks under NCCL's semantics on every shape of the grid but
     * p = m = 2 (where rank 0's warm-up holds every forward), the NCCL order
     * never does; both are well formed. */
    int inter_fail = 0, inter = 0;
    for (int kind = 0; kind <= CDP_SCHEDULE_INTERLEAVED; kind++)
        for (int p = 1; p <= 8; p++)
            for (int v = 1; v <= 3; v++)
                for (int m = 1; m <= 16; m++)
                    for (int tied = 0; tied <= 1; tied++) {
                        int is_inter = kind == CDP_SCHEDULE_INTERLEAVED;
                        if (is_inter ? (v < 2 || p < 2 || m % p) : v != 1) continue;
                        const char *name = cdp_schedule_name((enum cdp_schedule_kind)kind);
                        struct cdp_schedule *mpi = build_ex((enum cdp_schedule_kind)kind, p, v, m, tied, 0);
                        struct cdp_schedule *nccl = build_ex((enum cdp_schedule_kind)kind, p, v, m, tied, 1);
                        struct cdp_schedule *dflt = build((enum cdp_schedule_kind)kind, p, v, m, tied);
                        cr_assert(same_lists(mpi, dflt), "%s p=%d v=%d m=%d tied=%d: build is not rendezvous = 0",
                                  name, p, v, m, tied);
                        cr_assert_eq(cdp_schedule_validate(mpi), CDP_OK, "%s", cdp_last_error());
                        if (!is_inter) {
                            cr_assert(same_lists(mpi, nccl), "%s p=%d v=%d m=%d tied=%d", name, p, v, m, tied);
                        } else {
                            inter++;
                            cr_assert_not(same_lists(mpi, nccl) && !(p == 2 && m == 2), "p=%d v=%d m=%d tied=%d",
                                          p, v, m, tied);
                            cdp_status st = cdp_schedule_validate_rendezvous(mpi);
                            cr_assert_eq(st, p == 2 && m == 2 ? CDP_OK : CDP_ERR_INTERNAL, "p=%d v=%d m=%d tied=%d",
                                         p, v, m, tied);
                            inter_fail += st != CDP_OK;
                        }
                        cr_assert_eq(cdp_schedule_validate_rendezvous(nccl), CDP_OK, "%s", cdp_last_error());
                        cdp_schedule_free(mpi);
                        cdp_schedule_free(nccl);
                        cdp_schedule_free(dflt);
                    }
    cr_assert_eq(inter_fail, inter - 2 * 2, "all but p = m = 2 (v = 2, 3, tied or not)");

    /* The pinned case both ways: the MPI lists fail with the deadlock, the NCCL
     * lists pass. */
    struct cdp_schedule *mpi = build_ex(CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 0, 0);
    struct cdp_schedule *nccl = build_ex(CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 0, 1);
    cr_assert_eq(cdp_schedule_validate_rendezvous(mpi), CDP_ERR_INTERNAL);
    cr_assert(strstr(cdp_last_error(), "no group can complete"), "%s", cdp_last_error());
    cr_assert_eq(cdp_schedule_validate_rendezvous(nccl), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(mpi);
    cdp_schedule_free(nccl);
}

Test(schedule, rendezvous_returns_the_structural_errors_unchanged)
{
    struct cdp_schedule *s = parse(2, 1, 2, (const char *[]){R0, "L0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 A O"});
    cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "rank 1, instruction 1 (F0): forward of micro-batch 0 before its input is "
                                       "received (no ra0<0 before it)");
    cdp_schedule_free(s);
    cr_assert_eq(cdp_schedule_validate_rendezvous(NULL), CDP_ERR_INVALID);
}

/* ---- through the binary --------------------------------------------------- */

static struct cdp_run run(const char *const *argv)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, argv), 0, "could not start the binary");
    return r;
}

Test(schedule, cli_prints_the_lists_of_a_plan)
{
    const char *plan = cdp_test_source_path("examples/gpt-tiny.json");
    struct cdp_run r = run((const char *[]){"--plan", plan, "--schedule", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    /* 2 stages, 1f1b, 4 micro-batches, GPT with tied embeddings */
    cr_assert_str_eq(r.out,
                     "rank 0: L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 B0 L2 F2 sa2>1 rg1<1 B1 L3 F3 sa3>1 rg2<1 B2 "
                     "rg3<1 B3 T A O\n"
                     "rank 1: L0 ra0<0 F0 B0 sg0>0 L1 ra1<0 F1 B1 sg1>0 L2 ra2<0 F2 B2 sg2>0 "
                     "L3 ra3<0 F3 B3 sg3>0 T A O\n");
    cdp_test_run_free(&r);
}

Test(schedule, cli_json_parses)
{
    const char *plan = cdp_test_source_path("examples/gpt-tiny.json");
    struct cdp_run r = run((const char *[]){"--plan", plan, "--schedule", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_error_t err;
    json_t *j = json_loads(r.out, 0, &err);
    cr_assert_not_null(j, "%s: %s", err.text, r.out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "schedule")), "1f1b");
    cr_assert_eq(json_integer_value(json_object_get(j, "stages")), 2);
    cr_assert_eq(json_integer_value(json_object_get(j, "chunks")), 1);
    cr_assert_eq(json_integer_value(json_object_get(j, "micro_batches")), 4);
    json_t *ranks = json_object_get(j, "ranks");
    cr_assert_eq(json_array_size(ranks), 2);
    cr_assert_eq(json_array_size(json_array_get(ranks, 0)), 23);
    cr_assert_str_eq(json_string_value(json_array_get(json_array_get(ranks, 0), 0)), "L0");
    cr_assert_str_eq(json_string_value(json_array_get(json_array_get(ranks, 0), 2)), "sa0>1");
    cr_assert_str_eq(json_string_value(json_array_get(json_array_get(ranks, 1), 22)), "O");
    json_decref(j);
    cdp_test_run_free(&r);
}

Test(schedule, cli_interleaved_plan)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(dir, "p.json",
        "{\"model\": {\"preset\": \"gpt\", \"layers\": 4, \"embed\": 32, \"heads\": 2, \"vocab\": 64, "
        "\"context\": 16, \"tie_embeddings\": false},"
        " \"train\": {\"micro_batch\": 1},"
        " \"parallel\": {\"stages\": 2, \"replicas\": 1, \"micro_batches\": 2, \"schedule\": \"interleaved\","
        " \"chunks\": 2}, \"cluster\": {\"backend\": \"cpu\"}}");
    struct cdp_run r = run((const char *[]){"--plan", plan, "--schedule", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "rank 0: L0 0F0 0sa0>1 L1 0F1 0sa1>1 1ra0<1 1F0"), "%s", r.out);
    cr_assert_null(strstr(r.out, " T "), "untied: no tied reduction\n%s", r.out);
    cdp_test_run_free(&r);
}

/* --schedule runs the planner like every command: "auto" stages and
 * micro-batches are planned, and the lists are those of the layout --dry-run
 * --json shows. */
Test(schedule, cli_auto_stages_or_micro_batches_are_planned)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(dir, "p.json",
        "{\"model\": {\"preset\": \"gpt\", \"layers\": 4}, \"parallel\": {\"stages\": \"auto\", \"replicas\": 1, "
        "\"micro_batches\": 4}, \"cluster\": {\"backend\": \"cpu\", \"devices\": 2}}");
    struct cdp_run r = run((const char *[]){"--plan", plan, "--schedule", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert_not_null(j, "%s", r.out);
    const int stages = (int)json_integer_value(json_object_get(j, "stages"));
    cr_expect(stages == 1 || stages == 2, "%d stages", stages);
    cr_expect_eq(json_array_size(json_object_get(j, "ranks")), (size_t)stages);
    cr_expect_eq(json_integer_value(json_object_get(j, "micro_batches")), 4);
    json_decref(j);
    cdp_test_run_free(&r);
    r = run((const char *[]){"--plan", plan, "--dry-run", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = json_loads(r.out, 0, &e);
    cr_assert_not_null(j, "%s", r.out);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "parallel"), "stages")), stages,
                 "--schedule and --dry-run plan the same stages");
    json_decref(j);
    cdp_test_run_free(&r);

    plan = cdp_test_write_file(dir, "p.json",
        "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2, \"replicas\": 1, "
        "\"micro_batches\": \"auto\"}, \"cluster\": {\"backend\": \"cpu\"}}");
    r = run((const char *[]){"--plan", plan, "--schedule", "--json", NULL});
    cr_assert_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    j = json_loads(r.out, 0, &e);
    cr_assert_not_null(j, "%s", r.out);
    cr_expect_geq(json_integer_value(json_object_get(j, "micro_batches")), 2, "a planned count");
    json_decref(j);
    cdp_test_run_free(&r);
}

/* ---- zero bubble: split backward ------------------------------------------ */

static const enum cdp_schedule_kind zb_kinds[] = {CDP_SCHEDULE_ZB_H1, CDP_SCHEDULE_ZB_H2, CDP_SCHEDULE_ZBV};

/* The counts of a split-backward list, counted again: each (mb, chunk)
 * forwarded, input- and weight-backwarded once, W after I, no combined B,
 * every W before the step end; loads on the ranks of the first and last
 * virtual stage, sends and receives at every boundary that crosses ranks. */
static void check_split_counts(const struct cdp_schedule *s, int tied)
{
    const int p = s->p, v = s->v, m = s->m, V = p * v;
    int crossings = 0;
    for (int k = 0; k + 1 < V; k++) {
        int r0, c0, r1, c1;
        cdp_schedule_vstage_place(s->kind, p, v, k, &r0, &c0);
        cdp_schedule_vstage_place(s->kind, p, v, k + 1, &r1, &c1);
        crossings += r0 != r1;
    }
    int lr, lc, sends = 0;
    cdp_schedule_vstage_place(s->kind, p, v, V - 1, &lr, &lc);
    for (int r = 0; r < p; r++) {
        int *at = malloc((size_t)m * v * 3 * sizeof *at);
        for (int j = 0; j < m * v * 3; j++) at[j] = -1;
        cr_assert_eq(count_op(s, r, CDP_OP_BACKWARD), 0, "rank %d has a combined backward", r);
        for (int i = 0; i < s->len[r]; i++) {
            const struct cdp_instr *in = &s->list[r][i];
            int w = in->op == CDP_OP_FORWARD ? 0 : in->op == CDP_OP_BACKWARD_INPUT ? 1 : in->op == CDP_OP_BACKWARD_WEIGHT ? 2 : -1;
            if (w < 0) continue;
            int *a = &at[(in->mb * v + in->chunk) * 3 + w];
            cr_assert_eq(*a, -1, "rank %d: %d of mb %d chunk %d twice", r, w, in->mb, in->chunk);
            *a = i;
        }
        for (int j = 0; j < m * v; j++) {
            cr_assert(at[j * 3] >= 0 && at[j * 3 + 1] > at[j * 3] && at[j * 3 + 2] > at[j * 3 + 1],
                      "rank %d mb %d chunk %d: F %d, I %d, W %d", r, j / v, j % v, at[j * 3], at[j * 3 + 1],
                      at[j * 3 + 2]);
            cr_assert_lt(at[j * 3 + 2], s->len[r] - 2, "rank %d: W after the step end", r);
        }
        free(at);
        cr_assert_eq(count_op(s, r, CDP_OP_LOAD), r == 0 || r == lr ? m : 0, "rank %d loads", r);
        cr_assert_eq(count_op(s, r, CDP_OP_REDUCE_TIED_GRADS), tied && lr != 0 && (r == 0 || r == lr), "rank %d T", r);
        sends += count_op(s, r, CDP_OP_SEND_ACT);
        cr_assert_eq(count_op(s, r, CDP_OP_SEND_ACT) + count_op(s, r, CDP_OP_SEND_GRAD),
                     count_op(s, r, CDP_OP_RECV_ACT) + count_op(s, r, CDP_OP_RECV_GRAD) +
                         (r == 0 ? 0 : 0) + count_op(s, r, CDP_OP_SEND_ACT) - count_op(s, r, CDP_OP_RECV_GRAD) +
                         count_op(s, r, CDP_OP_SEND_GRAD) - count_op(s, r, CDP_OP_RECV_ACT),
                     "rank %d", r);
        cr_assert_eq(s->list[r][s->len[r] - 1].op, CDP_OP_OPTIMIZER_STEP, "rank %d", r);
    }
    cr_assert_eq(sends, m * crossings);
}

/* The grid: p = 2..8, m = p..4p, tied or not, the lists for MPI
 * through cdp_schedule_validate and those for NCCL through both validators;
 * plus p = 1 and m below p, which the generators take too. */
Test(schedule, zero_bubble_lists_pass_both_validators)
{
    int cases = 0;
    for (size_t k = 0; k < sizeof zb_kinds / sizeof *zb_kinds; k++)
        for (int p = 1; p <= 8; p++)
            for (int m = 1; m <= 4 * p; m++)
                for (int tied = 0; tied <= 1; tied++)
                    for (int rv = 0; rv <= 1; rv++) {
                        const int v = zb_kinds[k] == CDP_SCHEDULE_ZBV ? 2 : 1;
                        struct cdp_schedule *s = build_ex(zb_kinds[k], p, v, m, tied, rv);
                        cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
                        /* the lists for NCCL under its semantics too */
                        if (rv)
                            cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_OK, "%s p=%d m=%d tied=%d: %s",
                                         cdp_schedule_name(zb_kinds[k]), p, m, tied, cdp_last_error());
                        check_split_counts(s, tied);
                        cdp_schedule_free(s);
                        cases++;
                    }
    cr_assert_eq(cases, 3 * 2 * 2 * (4 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8)));
}

/* FNV-1a over every rank's list (op, mb, chunk, peer of each instruction, a
 * mark after each), the form the reference hashes below were taken in. */
static unsigned long long lists_hash(const struct cdp_schedule *s)
{
    unsigned long long h = 1469598103934665603ULL;
    for (int r = 0; r < s->p; r++)
        for (int i = 0; i < s->len[r]; i++) {
            const int x[4] = {(int)s->list[r][i].op, s->list[r][i].mb, s->list[r][i].chunk, s->list[r][i].peer};
            for (int j = 0; j < 4; j++) {
                h ^= (unsigned long long)(unsigned)x[j];
                h *= 1099511628211ULL;
            }
            h ^= 0xabcdef;
            h *= 1099511628211ULL;
        }
    return h;
}

/* The rendezvous fix goes on after each move instead of running every rank
 * again, and puts receives in send order only from the ranks that send:
 * the lists a rank runs are those of the builder before that change (these
 * hashes were taken from it), including lists the fix moves many times
 * (zbv p=12, m=128, which that builder took seconds for). */
Test(schedule, zero_bubble_rendezvous_lists_are_the_reference_builders)
{
    static const struct {
        enum cdp_schedule_kind kind;
        int p, v, m, tied, rv;
        unsigned long long hash;
    } ref[] = {
        {CDP_SCHEDULE_ZB_H1, 4, 1, 8, 1, 1, 0xcceb2566b6366abbULL},
        {CDP_SCHEDULE_ZB_H1, 7, 1, 17, 0, 1, 0xb228495b100f8fb6ULL},
        {CDP_SCHEDULE_ZB_H2, 4, 1, 8, 1, 1, 0x06b1b40ac06a494bULL},
        {CDP_SCHEDULE_ZB_H2, 5, 1, 12, 1, 1, 0x8b77f48b898e3a22ULL},
        {CDP_SCHEDULE_ZB_H2, 8, 1, 32, 0, 1, 0x7ca539501e3724cbULL},
        {CDP_SCHEDULE_ZBV, 2, 2, 3, 1, 1, 0xca80ab5421664c9aULL},
        {CDP_SCHEDULE_ZBV, 4, 2, 8, 1, 1, 0x5f9a894bc34295a9ULL},
        {CDP_SCHEDULE_ZBV, 5, 2, 7, 0, 1, 0x72a6dd3924d256baULL},
        {CDP_SCHEDULE_ZBV, 7, 2, 24, 1, 1, 0x30a7b7a8343c2052ULL},
        {CDP_SCHEDULE_ZBV, 8, 2, 48, 1, 1, 0x61030b3cd1005417ULL},
        {CDP_SCHEDULE_ZBV, 12, 2, 128, 1, 1, 0xeb0245cbcb8983a5ULL},
        {CDP_SCHEDULE_ZBV, 6, 2, 16, 1, 0, 0xb83badbf83c581ddULL},
    };
    for (size_t i = 0; i < sizeof ref / sizeof *ref; i++) {
        struct cdp_schedule *s = build_ex(ref[i].kind, ref[i].p, ref[i].v, ref[i].m, ref[i].tied, ref[i].rv);
        cr_expect_eq(lists_hash(s), ref[i].hash, "%s p=%d m=%d tied=%d rendezvous=%d: lists hash %016llx, the "
                     "reference builder's %016llx", cdp_schedule_name(ref[i].kind), ref[i].p, ref[i].m, ref[i].tied,
                     ref[i].rv, lists_hash(s), ref[i].hash);
        cdp_schedule_free(s);
    }
}

/* Memory: a micro-batch counts from its F to its W. zb-h1 holds p on every
 * rank (1F1B's rank 0) and r + 1 W-states; zb-h2 at most 2p - 1, 2p - 1 on
 * rank 0 once m >= 2p - 1; zbv 2p chunk activations on every rank (each half
 * a stage: p stages' worth, 1F1B's rank 0) once m >= 2p - 1. */
Test(schedule, zero_bubble_peaks)
{
    for (int p = 2; p <= 8; p++)
        for (int m = p; m <= 4 * p; m++) {
            struct cdp_schedule *h1 = build(CDP_SCHEDULE_ZB_H1, p, 1, m, 0);
            struct cdp_schedule *h2 = build(CDP_SCHEDULE_ZB_H2, p, 1, m, 0);
            struct cdp_schedule *zv = build(CDP_SCHEDULE_ZBV, p, 2, m, 0);
            struct cdp_schedule *f1 = build(CDP_SCHEDULE_1F1B, p, 1, m, 0);
            for (int r = 0; r < p; r++) {
                cr_assert_eq(cdp_schedule_peak_in_flight(h1, r), p, "zb-h1 p=%d m=%d rank %d", p, m, r);
                cr_assert_eq(cdp_schedule_peak_w_pending(h1, r), r + 1, "zb-h1 p=%d m=%d rank %d", p, m, r);
                cr_assert_leq(cdp_schedule_peak_in_flight(h2, r), 2 * p - 1, "zb-h2 p=%d m=%d rank %d", p, m, r);
                if (m >= 2 * p - 1) {
                    cr_assert_eq(cdp_schedule_peak_in_flight(zv, r), 2 * p, "zbv p=%d m=%d rank %d", p, m, r);
                }
                cr_assert_leq(cdp_schedule_peak_in_flight(zv, r), 2 * p, "zbv p=%d m=%d rank %d", p, m, r);
                cr_assert_eq(cdp_schedule_peak_w_pending(f1, r), 0);
            }
            if (m >= 2 * p - 1) cr_assert_eq(cdp_schedule_peak_in_flight(h2, 0), 2 * p - 1, "p=%d m=%d", p, m);
            cdp_schedule_free(h1);
            cdp_schedule_free(h2);
            cdp_schedule_free(zv);
            cdp_schedule_free(f1);
        }
}

Test(schedule, vstage_places_the_v_and_megatron_order)
{
    for (int p = 1; p <= 8; p++)
        for (int kind = 0; kind < CDP_SCHEDULE_COUNT; kind++) {
            const int v = kind == CDP_SCHEDULE_ZBV ? 2 : kind == CDP_SCHEDULE_INTERLEAVED ? 3 : 1;
            for (int k = 0; k < p * v; k++) {
                int r, c;
                cdp_schedule_vstage_place((enum cdp_schedule_kind)kind, p, v, k, &r, &c);
                cr_assert_eq(cdp_schedule_vstage((enum cdp_schedule_kind)kind, p, v, r, c), k);
                if (kind == CDP_SCHEDULE_ZBV) {
                    cr_assert_eq(r, k < p ? k : 2 * p - 1 - k);
                    cr_assert_eq(c, k >= p);
                } else {
                    cr_assert_eq(r, k % p);
                    cr_assert_eq(c, k / p);
                }
            }
        }
    /* zbv: rank 0 holds the first and the last virtual stage */
    cr_assert_eq(cdp_schedule_vstage(CDP_SCHEDULE_ZBV, 4, 2, 0, 1), 7);
    cr_assert_eq(cdp_schedule_vstage(CDP_SCHEDULE_ZBV, 4, 2, 3, 1), 4);
    cr_assert_eq(cdp_schedule_vstage(CDP_SCHEDULE_ZBV, 4, 2, 4, 0), -1);
    cr_assert_eq(cdp_schedule_chunks_of(CDP_SCHEDULE_ZBV, 1), 2);
    cr_assert_eq(cdp_schedule_chunks_of(CDP_SCHEDULE_ZB_H1, 4), 1);
}

/* zb-h1 at p = 2, m = 3, written by hand: rank 1 defers its W by one. */
Test(schedule, small_zb_h1_and_zbv_match_the_hand_written_lists)
{
    struct cdp_schedule *s = build(CDP_SCHEDULE_ZB_H1, 2, 1, 3, 0);
    cr_assert_str_eq(rank_str(s, 0), "L0 F0 sa0>1 L1 F1 sa1>1 rg0<1 I0 W0 L2 F2 sa2>1 rg1<1 I1 W1 rg2<1 I2 W2 A O");
    cr_assert_str_eq(rank_str(s, 1), "L0 ra0<0 F0 I0 sg0>0 L1 ra1<0 F1 I1 sg1>0 W0 L2 ra2<0 F2 I2 sg2>0 W1 W2 A O");
    cdp_schedule_free(s);
    /* zbv p = 2, m = 3: rank 0 holds virtual stages 0 and 3, rank 1 stages 1 and 2 */
    s = build(CDP_SCHEDULE_ZBV, 2, 2, 3, 1);
    cr_assert_str_eq(rank_str(s, 0), "L0 0F0 0sa0>1 L1 0F1 0sa1>1 L2 0F2 0sa2>1 1ra0<1 1F0 1I0 1sg0>1 1W0 1ra1<1 "
                                     "1F1 1I1 1sg1>1 1W1 0rg0<1 0I0 0W0 1ra2<1 1F2 1I2 1sg2>1 1W2 0rg1<1 0I1 0W1 "
                                     "0rg2<1 0I2 0W2 A O");
    /* rank 1: one chunk-0 forward, a chunk-1 and a chunk-0 forward, a chunk-1
     * forward and backward; then F0 B0 F1 B1; cool-down I0 I1 (W later), I0 W0,
     * then the pending W1 and W2 */
    cr_assert_str_eq(rank_str(s, 1), "0ra0<0 0F0 1F0 1sa0>0 0ra1<0 0F1 1F1 1sa1>0 1rg0<0 1I0 1W0 0ra2<0 0F2 0I0 "
                                     "0sg0>0 0W0 1F2 1sa2>0 1rg1<0 1I1 1W1 0I1 0sg1>0 1rg2<0 1I2 0I2 0sg2>0 0W2 "
                                     "0W1 1W2 A O");
    cdp_schedule_free(s);
}

/* Hand-broken split lists, each failing with its message. */
#define Z0 "L0 F0 sa0>1 rg0<1 I0 W0 A O"
#define Z1 "L0 ra0<0 F0 I0 sg0>0 W0 A O"
Test(schedule, rejects_broken_split_backwards)
{
    struct cdp_schedule *s = parse(2, 1, 1, (const char *[]){Z0, Z1});
    cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(s);
    expect_broken(2, 1, 1, (const char *[]){Z0, "L0 ra0<0 F0 W0 I0 sg0>0 A O"},
                  "rank 1, instruction 3 (W0): weight gradient of micro-batch 0 before its input gradient (no I0 "
                  "before it)");
    expect_broken(2, 1, 1, (const char *[]){Z0, "L0 ra0<0 F0 I0 sg0>0 A O"},
                  "rank 1: micro-batch 0 has its input gradient (I0 at instruction 3) but never its weight gradient "
                  "(no W0 before the step-end instructions)");
    expect_broken(2, 1, 1, (const char *[]){Z0, "L0 ra0<0 F0 I0 sg0>0 A W0 O"},
                  "rank 1, instruction 6 (W0): micro-batch 0 after the step-end instructions began (instruction 5)");
    expect_broken(2, 1, 1, (const char *[]){Z0, "L0 ra0<0 F0 B0 I0 sg0>0 W0 A O"},
                  "rank 1, instruction 4 (I0): micro-batch 0 has a combined backward at instruction 3 too: a "
                  "backward is either one B or an I and a W");
    expect_broken(2, 1, 1, (const char *[]){Z0, "L0 ra0<0 F0 sg0>0 I0 W0 A O"},
                  "rank 1, instruction 3 (sg0>0): sends the input gradient of micro-batch 0 before its backward");
    expect_broken(2, 1, 1, (const char *[]){Z0, "L0 ra0<0 F0 I0 sg0>0 W0 W0 A O"},
                  "rank 1, instruction 6 (W0): micro-batch 0 weight-gradient backwarded (W) a second time (first "
                  "at instruction 5)");
    expect_broken(2, 1, 1, (const char *[]){"L0 F0 sa0>1 rg0<1 I0 B0 A O", Z1},
                  "rank 0, instruction 5 (B0): micro-batch 0 has a split backward at instruction 4 too: a backward "
                  "is either one B or an I and a W");
}

/* ---- schedules from a file ------------------------------------------------ */

/* Every generated list, printed as JSON and as CSV and read back, is the same
 * lists; cdp_instr_parse takes back what cdp_instr_str writes. */
Test(schedule, files_read_back_every_generated_schedule)
{
    const char *dir = cdp_test_tmpdir();
    char path[4200];
    for (int kind = 0; kind < CDP_SCHEDULE_COUNT; kind++)
        for (int p = 1; p <= 4; p++)
            for (int m = p; m <= 2 * p; m += p) {
                const int v = kind == CDP_SCHEDULE_ZBV || kind == CDP_SCHEDULE_INTERLEAVED ? 2 : 1;
                if (kind == CDP_SCHEDULE_INTERLEAVED && p < 2) continue;
                struct cdp_schedule *s = build((enum cdp_schedule_kind)kind, p, v, m, 1), *t = NULL;
                snprintf(path, sizeof path, "%s/s.json", dir);
                FILE *f = fopen(path, "w");
                cr_assert_eq(cdp_schedule_print_json(s, f), CDP_OK);
                fclose(f);
                cr_assert_eq(cdp_schedule_load(path, CDP_SCHEDULE_1F1B, 0, 0, 0, &t), CDP_OK, "%s", cdp_last_error());
                cr_assert(same_lists(s, t), "%s p=%d m=%d: JSON", cdp_schedule_name(s->kind), p, m);
                cdp_schedule_free(t);
                snprintf(path, sizeof path, "%s/s.csv", dir);
                f = fopen(path, "w");
                char b[64];
                for (int r = 0; r < p; r++)
                    for (int i = 0; i < s->len[r]; i++)
                        fprintf(f, "%s%s", cdp_instr_str(&s->list[r][i], v, b, sizeof b), i + 1 < s->len[r] ? "," : "\n");
                fclose(f);
                cr_assert_eq(cdp_schedule_load(path, s->kind, p, v, m, &t), CDP_OK, "%s", cdp_last_error());
                cr_assert(same_lists(s, t), "%s p=%d m=%d: CSV", cdp_schedule_name(s->kind), p, m);
                cdp_schedule_free(t);
                cdp_schedule_free(s);
            }
}

/* A bad file: the file, the rank, the instruction and what was expected. */
static void expect_bad_file(const char *name, const char *text, int p, int v, int m, const char *msg)
{
    const char *path = cdp_test_write_file(cdp_test_tmpdir(), name, text);
    struct cdp_schedule *s = NULL;
    cr_assert_eq(cdp_schedule_load(path, CDP_SCHEDULE_1F1B, p, v, m, &s), CDP_ERR_INVALID, "accepted %s", text);
    char want[4400];
    snprintf(want, sizeof want, "%s%s", path, msg);
    cr_assert_str_eq(cdp_last_error(), want);
}

Test(schedule, files_name_what_is_wrong)
{
    expect_bad_file("a.json", "{\"stages\": 2, \"micro_batches\": 1, \"ranks\": [[\"" "L0\", \"F0\", \"sa0>1\", \"rg0<1\", "
                    "\"I0\", \"W0\", \"A\", \"O\"], [\"L0\", \"ra0<0\", \"F0\", \"W0\", \"I0\", \"sg0>0\", \"A\", \"O\"]]}",
                    0, 0, 0, ": rank 1, instruction 3 (W0): weight gradient of micro-batch 0 before its input "
                    "gradient (no I0 before it)");
    expect_bad_file("b.json", "{\"stages\": 1, \"micro_batches\": 1, \"ranks\": [[\"L0\", \"F0\", \"X0\"]]}", 0, 0, 0,
                    ": rank 0, instruction 2: \"X0\": expected an instruction such as \"L0\", \"F0\", \"B3\", \"I3\", "
                    "\"W3\", \"sa3>1\", \"ra3<0\", \"sg3>0\", \"rg3<1\", \"T\", \"A\" or \"O\"");
    expect_bad_file("c.json", "{\"stages\": 2, \"micro_batches\": 4, \"ranks\": [[], []]}", 2, 1, 8,
                    ": the file is for 2 stages x 1 chunks x 4 micro-batches; the job runs 2 x 1 x 8");
    expect_bad_file("d.csv", "L0,F0,B0,A,O\nL0,F0\n", 1, 1, 1, ": more than 1 rows; expected one per stage");
    expect_bad_file("e.csv", "L0,F0,sg0>1,A,O\n", 1, 1, 1,
                    ": rank 0, instruction 2 (sg0>1): virtual stage 0 is the first: there is no previous stage, so no "
                    "matching receive");
    /* a deadlock: both ranks receive first, every pending instruction named */
    expect_bad_file("f.json", "{\"stages\": 2, \"micro_batches\": 1, \"ranks\": [[\"L0\", \"F0\", \"rg0<1\", \"sa0>1\", "
                    "\"I0\", \"W0\", \"A\", \"O\"], [\"L0\", \"ra0<0\", \"F0\", \"I0\", \"sg0>0\", \"W0\", \"A\", \"O\"]]}",
                    0, 0, 0, ": deadlock: no rank can go on; rank 0 waits at instruction 2 (rg0<1) for rank 1, rank 1 "
                    "waits at instruction 1 (ra0<0) for rank 0");
}

/* ---- the forward-only schedule (validation, eval) ---- */

/* Every placement (one chunk; interleaved's several; zbv's V) on 1 to 3 stages:
 * the lists pass both validators, hold m x v FORWARDs a rank and nothing of a
 * backward or a step's end, and send every boundary that crosses ranks once. */
Test(schedule, forward_only_lists_validate_for_stages_1_to_3_and_chunks)
{
    const struct {
        enum cdp_schedule_kind kind;
        int v;
    } shapes[] = {{CDP_SCHEDULE_GPIPE, 1}, {CDP_SCHEDULE_1F1B, 1}, {CDP_SCHEDULE_INTERLEAVED, 2},
                  {CDP_SCHEDULE_INTERLEAVED, 3}, {CDP_SCHEDULE_ZBV, 2}};
    int cases = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int p = 1; p <= 3; p++)
            for (int m = 1; m <= 6; m++) {
                const int v = shapes[k].v;
                struct cdp_schedule *s = NULL;
                cr_assert_eq(cdp_schedule_build_forward(shapes[k].kind, p, v, m, &s), CDP_OK, "%s p=%d v=%d m=%d: %s",
                             cdp_schedule_name(shapes[k].kind), p, v, m, cdp_last_error());
                cr_assert(s->forward_only);
                cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
                cr_assert_eq(cdp_schedule_validate_rendezvous(s), CDP_OK, "%s", cdp_last_error());
                int sends = 0, recvs = 0;
                for (int r = 0; r < p; r++) {
                    cr_assert_eq(count_op(s, r, CDP_OP_FORWARD), m * v);
                    for (int op = CDP_OP_BACKWARD; op < CDP_OP_COUNT; op++)
                        if (op != CDP_OP_SEND_ACT && op != CDP_OP_RECV_ACT)
                            cr_assert_eq(count_op(s, r, (enum cdp_op)op), 0, "rank %d: %s", r, rank_str(s, r));
                    sends += count_op(s, r, CDP_OP_SEND_ACT);
                    recvs += count_op(s, r, CDP_OP_RECV_ACT);
                }
                int crossings = 0; /* boundaries k | k + 1 between two ranks */
                for (int b = 0; b + 1 < p * v; b++) {
                    int r0, r1, c;
                    cdp_schedule_vstage_place(shapes[k].kind, p, v, b, &r0, &c);
                    cdp_schedule_vstage_place(shapes[k].kind, p, v, b + 1, &r1, &c);
                    crossings += r0 != r1;
                }
                cr_assert_eq(sends, m * crossings);
                cr_assert_eq(recvs, m * crossings);
                cdp_schedule_free(s);
                cases++;
            }
    cr_assert_eq(cases, 5 * 3 * 6);
}

Test(schedule, forward_only_small_lists_match_the_hand_written_ones)
{
    struct cdp_schedule *s = NULL;
    cr_assert_eq(cdp_schedule_build_forward(CDP_SCHEDULE_1F1B, 2, 1, 2, &s), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(rank_str(s, 0), "L0 F0 sa0>1 L1 F1 sa1>1");
    cr_assert_str_eq(rank_str(s, 1), "L0 ra0<0 F0 L1 ra1<0 F1");
    cdp_schedule_free(s);
    /* one rank, two chunks: chunk 1 takes chunk 0's output on the rank, no transfer */
    cr_assert_eq(cdp_schedule_build_forward(CDP_SCHEDULE_INTERLEAVED, 1, 2, 1, &s), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(rank_str(s, 0), "L0 0F0 1F0");
    cdp_schedule_free(s);
    /* zbv on 2 ranks: down 0, 1 and back up 1, 0; rank 0 loads once for both ends */
    cr_assert_eq(cdp_schedule_build_forward(CDP_SCHEDULE_ZBV, 2, 2, 1, &s), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(rank_str(s, 0), "L0 0F0 0sa0>1 1ra0<1 1F0");
    cr_assert_str_eq(rank_str(s, 1), "0ra0<0 0F0 1F0 1sa0>0");
    cdp_schedule_free(s);
    s = NULL;
    cr_assert_eq(cdp_schedule_build_forward(CDP_SCHEDULE_GPIPE, 0, 1, 2, &s), CDP_ERR_INVALID);
    cr_assert_null(s);
}

Test(schedule, forward_only_rejects_a_backward_and_a_missing_send)
{
    struct cdp_schedule *s = parse(2, 1, 1, (const char *[]){"L0 F0 sa0>1", "L0 ra0<0 F0 B0"});
    s->forward_only = 1;
    cr_assert_eq(cdp_schedule_validate(s), CDP_ERR_INVALID);
    cr_assert_str_eq(cdp_last_error(), "rank 1, instruction 3 (B0): a forward-only schedule holds only LOAD, "
                     "RECV_ACT, FORWARD and SEND_ACT");
    cdp_schedule_free(s);
    s = parse(2, 1, 1, (const char *[]){"L0 F0", "L0 ra0<0 F0"});
    s->forward_only = 1;
    cr_assert_eq(cdp_schedule_validate(s), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "never sent to rank 1"), "%s", cdp_last_error());
    cdp_schedule_free(s);
    /* the same lists are not a training step: a backward is missing */
    s = parse(2, 1, 1, (const char *[]){"L0 F0 sa0>1", "L0 ra0<0 F0"});
    cr_assert_eq(cdp_schedule_validate(s), CDP_ERR_INVALID);
    s->forward_only = 1;
    cr_assert_eq(cdp_schedule_validate(s), CDP_OK, "%s", cdp_last_error());
    cdp_schedule_free(s);
}
