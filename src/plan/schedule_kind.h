/* The schedule kinds, one description each (like the layer types'
 * cdp_layer_def): the plan's name, how many model chunks a rank runs, the
 * shape rules, whether the backward is split, how virtual stages sit on
 * ranks, the closed-form bubble (the number and the text the CLI prints, from
 * one place), and whether "schedule": "auto" tries it. The plan loader, the
 * generators (pipeline/schedule_gen.c, which add the lists themselves), the
 * layout, the simulator, the planner and the CLI ask this table; nothing else
 * compares kinds. Adding a schedule: docs/contributing.md. */
#ifndef CDP_PLAN_SCHEDULE_KIND_H
#define CDP_PLAN_SCHEDULE_KIND_H

#include "cdp/plan_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Model chunks a rank runs. */
enum cdp_schedule_chunks {
    CDP_CHUNKS_ONE,  /* one */
    CDP_CHUNKS_PLAN, /* /parallel/chunks, at least 2 (default 2) */
    CDP_CHUNKS_TWO,  /* exactly 2 */
};

/* Where virtual stage k runs. */
enum cdp_vstage_placement {
    CDP_VSTAGE_LOOP, /* rank k % p, chunk k / p (Megatron's interleaving; one chunk: stage = rank) */
    CDP_VSTAGE_V,    /* chunk 0 down ranks 0..p-1, chunk 1 back up (ZB-V) */
};

struct cdp_schedule_def {
    const char *name;                    /* the plan's "schedule" */
    enum cdp_schedule_chunks chunks;
    int min_stages;                      /* fewer are refused */
    int mb_multiple_of_stages;           /* each replica's micro-batches a multiple of the stages */
    int splits_backward;                 /* BACKWARD_INPUT and BACKWARD_WEIGHT instead of BACKWARD */
    int rendezvous_order;                /* NCCL's rendezvous send/receive get lists of their own order */
    enum cdp_vstage_placement placement;
    /* idle share of the forward/backward phase on equal stages without
     * communication (split kinds: equal F, I and W times), and as printed */
    double (*bubble)(int p, int v, int m);
    const char *bubble_text;
    const char *bubble_assumes;          /* "" or what else the closed form assumes */
    int auto_order;                      /* "auto" tries it, in this order (1 first); 0: not tried */
};

/* The description of kind k (k < CDP_SCHEDULE_COUNT). */
const struct cdp_schedule_def *cdp_schedule_def(enum cdp_schedule_kind k);

/* The names, in enum order, NULL-terminated, for cdp_json_enum. */
void cdp_schedule_names(const char *out[CDP_SCHEDULE_COUNT + 1]);

#ifdef __cplusplus
}
#endif

#endif
