/* A tensor group as the layer types see it (docs/parallelism.md): the t
 * ranks that hold one stage of one replica, each a slice of its split layers.
 * The model layer has no communicator (docs/layout.md): the executor fills
 * this with its tensor communicator's collective; everywhere else (the
 * planner, one rank, t = 1) a unit has none. */
#ifndef CDP_MODEL_TENSOR_GROUP_H
#define CDP_MODEL_TENSOR_GROUP_H

#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_tensor_group {
    int size, index; /* t, and this rank's index in the group */
    /* Sums buf (n floats, in the memory of the rank's device) over the group,
     * in place, the same on every rank; returns when buf holds the sum. */
    cdp_status (*all_reduce)(void *ctx, float *buf, int64_t n);
    /* The same sum always carried as fp32, whatever /parallel/comm_dtype
     * says: the vocab-parallel loss's statistics (each slice's max and sum of
     * exponentials, and the target's logit), whose rounding to bf16 would
     * move the loss itself by up to 2^-9 of a logit's size. */
    cdp_status (*all_reduce_f32)(void *ctx, float *buf, int64_t n);
    /* Sequence parallelism's pair (cdp_unit_seq_gather and
     * cdp_unit_seq_scatter in layers.h use them), on the same memory:
     * buf holds n floats, n a multiple of size, seen as size equal parts in
     * rank order. reduce_scatter sums buf over the group and leaves this
     * rank's part [index n/size, (index + 1) n/size) holding the sum, the
     * rest unspecified; all_gather copies every rank's part into the same
     * place on the others, so that buf is whole everywhere (what it held
     * outside this rank's part is overwritten). CDP_ERR_INVALID when n is not
     * a multiple of size. */
    cdp_status (*reduce_scatter)(void *ctx, float *buf, int64_t n);
    cdp_status (*all_gather)(void *ctx, float *buf, int64_t n);
    void *ctx; /* the executor's (not owned) */
};

#ifdef __cplusplus
}
#endif

#endif
