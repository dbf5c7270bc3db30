/* The live device monitor: every few steps each rank samples how busy its
 * device was and how much memory it holds, and rank 0 gets every rank's
 * figures (one collective), the slowest rank, and a straggler verdict. On the
 * cpu backend a rank's device is its process: utilisation is process CPU time
 * over wall time (above 100% with BLAS threads) and memory its resident set.
 * On a GPU: NVML's utilisation and the device's memory in use (without NVML,
 * the rank's busy share of the interval and the runtime's memory figure). */
#ifndef CDP_PIPELINE_MONITOR_H
#define CDP_PIPELINE_MONITOR_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "cdp/device.h"
#include "cdp/status.h"
#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A rank is a straggler when it has been the slowest of its stage's replicas
 * per micro-batch (so replicas given unequal shares compare fairly), by more
 * than CDP_MONITOR_STRAGGLER_MARGIN over their median, in
 * CDP_MONITOR_STRAGGLER_REPORTS reports running. */
#define CDP_MONITOR_STRAGGLER_MARGIN 0.10
#define CDP_MONITOR_STRAGGLER_REPORTS 3

struct cdp_monitor_rank {
    int stage, replica;
    double util;      /* busy share of the interval: CPU time / wall time (1.0 = one core) */
    double mem_bytes; /* resident set (cpu) or device memory in use */
    double peak_bytes; /* the device accounting's high-water mark (cdp_device_mem_peak) */
    double busy_s;    /* loading, forward and backward time per step, mean over the interval */
    double busy_mb_s; /* the same per micro-batch */
};

struct cdp_monitor_report {
    int size;
    int gpu;                               /* the ranks' devices are GPUs */
    const struct cdp_monitor_rank *ranks; /* size entries, by world rank */
    int slowest;           /* the rank with the most busy time per step */
    int straggler;         /* a rank that just became a straggler (reported once per streak), or -1 */
    double straggler_mb_s, median_mb_s; /* its busy time per micro-batch and its stage group's median */
};


struct cdp_monitor;

/* A monitor of this rank (at `stage`, `replica`) on `dev`; samples from now. */
cdp_status cdp_monitor_create(int stage, int replica, cdp_device_t dev, struct cdp_monitor **out);
void cdp_monitor_destroy(struct cdp_monitor *m);

/* Every rank calls this at the same step (a collective on world): samples this
 * rank since the last call, in which it was busy busy_s seconds over `steps`
 * steps and `mbs` micro-batches, and fills *out (valid until the next call) on
 * every rank. */
cdp_status cdp_monitor_collect(struct cdp_monitor *m, cdp_comm_t world, double busy_s, int steps, int64_t mbs,
                               double timeout, struct cdp_monitor_report *out);

/* "cpu 98-190%  mem 41-52MiB  slowest r3 24ms" for the progress line. */
void cdp_monitor_format(const struct cdp_monitor_report *r, char *buf, size_t cap);
/* The "ranks" list of a metrics.jsonl record: each rank's place in layout l
 * (node, device), its figures, and its measured peak beside the layout's
 * predicted device memory. New reference. */
struct cdp_layout;
json_t *cdp_monitor_ranks_json(const struct cdp_monitor_report *r, const struct cdp_layout *l);

#ifdef __cplusplus
}
#endif

#endif
