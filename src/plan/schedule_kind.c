/* The table of schedule kinds (schedule_kind.h). Rows in enum order: the
 * table check below fails to compile when a kind is added without one. The
 * closed forms: docs/pipeline.md ("Schedules") and the sources there. */
#include "plan/schedule_kind.h"

#include "cdp/core.h"
#include "cdp/plan.h"

/* GPipe and 1F1B idle (p-1)/(m+p-1); interleaving v chunks shrinks it by v. */
static double bubble_loop(int p, int v, int m) { return (double)(p - 1) / ((double)v * m + p - 1); }

/* ZB-H1 and ZB-H2 at T_F = T_B = T_W: (p-1)/(3m+p-1). */
static double bubble_zb(int p, int v, int m)
{
    (void)v;
    return (double)(p - 1) / (3.0 * m + p - 1);
}

/* ZB-V: the V fills the bubble once m >= 2p - 2; below, e = 2p - 2 - m idle slots remain. */
static double bubble_zbv(int p, int v, int m)
{
    (void)v;
    const int extra = 2 * p - 2 - m > 0 ? 2 * p - 2 - m : 0;
    return (double)(p - 1 + extra) / (6.0 * m + p - 1 + extra);
}

static const struct cdp_schedule_def defs[] = {
    {.name = "gpipe", .chunks = CDP_CHUNKS_ONE, .min_stages = 1, .placement = CDP_VSTAGE_LOOP,
     .bubble = bubble_loop, .bubble_text = "(p-1)/(v*m+p-1)", .bubble_assumes = "", .auto_order = 2},
    {.name = "1f1b", .chunks = CDP_CHUNKS_ONE, .min_stages = 1, .placement = CDP_VSTAGE_LOOP,
     .bubble = bubble_loop, .bubble_text = "(p-1)/(v*m+p-1)", .bubble_assumes = "", .auto_order = 1},
    {.name = "interleaved", .chunks = CDP_CHUNKS_PLAN, .min_stages = 2, .mb_multiple_of_stages = 1,
     .rendezvous_order = 1, .placement = CDP_VSTAGE_LOOP, .bubble = bubble_loop,
     .bubble_text = "(p-1)/(v*m+p-1)", .bubble_assumes = "", .auto_order = 0},
    {.name = "zb-h1", .chunks = CDP_CHUNKS_ONE, .min_stages = 1, .splits_backward = 1, .rendezvous_order = 1,
     .placement = CDP_VSTAGE_LOOP, .bubble = bubble_zb, .bubble_text = "(p-1)/(3m+p-1)",
     .bubble_assumes = " and equal F, I and W times", .auto_order = 3},
    {.name = "zb-h2", .chunks = CDP_CHUNKS_ONE, .min_stages = 1, .splits_backward = 1, .rendezvous_order = 1,
     .placement = CDP_VSTAGE_LOOP, .bubble = bubble_zb, .bubble_text = "(p-1)/(3m+p-1)",
     .bubble_assumes = " and equal F, I and W times", .auto_order = 4},
    {.name = "zbv", .chunks = CDP_CHUNKS_TWO, .min_stages = 1, .splits_backward = 1, .rendezvous_order = 1,
     .placement = CDP_VSTAGE_V, .bubble = bubble_zbv, .bubble_text = "(p-1+e)/(6m+p-1+e), e = max(0, 2p-2-m)",
     .bubble_assumes = " and equal F, I and W times", .auto_order = 5},
};
CDP_TABLE_CHECK(defs, CDP_SCHEDULE_COUNT);

const struct cdp_schedule_def *cdp_schedule_def(enum cdp_schedule_kind k)
{
    CDP_ASSERT((unsigned)k < CDP_SCHEDULE_COUNT);
    return &defs[k];
}

void cdp_schedule_names(const char *out[CDP_SCHEDULE_COUNT + 1])
{
    for (int k = 0; k < CDP_SCHEDULE_COUNT; k++) out[k] = defs[k].name;
    out[CDP_SCHEDULE_COUNT] = NULL;
}

const char *cdp_schedule_name(enum cdp_schedule_kind s)
{
    return (unsigned)s < CDP_SCHEDULE_COUNT ? defs[s].name : "?";
}

int cdp_schedule_has_chunks(enum cdp_schedule_kind s) { return cdp_schedule_def(s)->chunks != CDP_CHUNKS_ONE; }
