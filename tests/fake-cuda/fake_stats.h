/* What the stand-in CUDA module (fake_module.c) counts, read by the tests
 * through dlsym("cdp_fake_nccl_stats"). */
#ifndef CDP_TESTS_FAKE_STATS_H
#define CDP_TESTS_FAKE_STATS_H

#include "comm/nccl_module.h"

struct fake_stats {
    int inits, splits, aborts, destroys, live; /* live: communicators made and not yet aborted or destroyed */
    unsigned char last_id[CDP_NCCL_ID_BYTES];  /* the id the last init was given */
    int sharded;                               /* reduce-scatters and all-gathers */
    size_t shard_off, shard_len;               /* this rank's shard in the last of them */
    int starts;                                /* non-blocking collectives started */
    int compute_waits;                         /* ... completed: the compute stream made to wait */
    int in_flight;                             /* started and neither completed nor released */
};

#endif
