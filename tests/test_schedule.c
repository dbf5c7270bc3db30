/* Suite schedule: the generators (gpipe, 1f1b, interleaved) give lists the
 * validator proves, with the right counts and activations in flight; small
 * cases match lists written by hand; hand-broken lists are rejected with the
 * offending instruction; `cdphybrid --plan P --schedule` prints them. */
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
    for (int kind = 0; kind < CDP_SCHEDULE_COUNT; kind++)
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
            for (int m = p; m <= 32; m += p) {
                struct cdp_schedule *s = build(CDP_SCHEDULE_INTERLEAVED, p, v, m, 0);
                for (int r = 0; r < p; r++) {
                    int warm = (p - r - 1) * 2 + (v - 1) * p;
                    int want = warm >= m * v ? m * v : warm + 1;
                    cr_assert_eq(cdp_schedule_peak_in_flight(s, r), want, "p=%d v=%d m=%d rank %d", p, v, m, r);
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

Test(schedule, cli_auto_stages_or_micro_batches_exit_2)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(dir, "p.json",
        "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": \"auto\", \"replicas\": 1, "
        "\"micro_batches\": 4}, \"cluster\": {\"backend\": \"cpu\"}}");
    struct cdp_run r = run((const char *[]){"--plan", plan, "--schedule", NULL});
    cr_assert_eq(r.exit_code, 2, "%s%s", r.out, r.err);
    cr_assert(strstr(r.err, "/parallel/stages"), "%s", r.err);
    cr_assert(strstr(r.err, "needs it fixed; --dry-run plans it"), "%s", r.err);
    cr_assert_str_empty(r.out);
    cdp_test_run_free(&r);

    plan = cdp_test_write_file(dir, "p.json",
        "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2, \"replicas\": 1, "
        "\"micro_batches\": \"auto\"}, \"cluster\": {\"backend\": \"cpu\"}}");
    r = run((const char *[]){"--plan", plan, "--schedule", "--json", NULL});
    cr_assert_eq(r.exit_code, 2, "%s%s", r.out, r.err);
    cr_assert(strstr(r.err, "/parallel/micro_batches"), "%s", r.err);
    cr_assert_str_empty(r.out);
    cdp_test_run_free(&r);
}
