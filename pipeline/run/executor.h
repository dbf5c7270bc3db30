/* The pipeline x data-parallel executor: one process per rank interprets its
 * rank's schedule (pipeline/schedule.h) over its stage's unit range, moving
 * activations and gradients with the pipeline communicator and summing
 * gradients in its stage's data-parallel communicator, so that every step
 * equals one step of one-rank training on the same global batch. */
#ifndef CDP_PIPELINE_EXECUTOR_H
#define CDP_PIPELINE_EXECUTOR_H

#include "cdp/plan.h"
#include "cdp/status.h"
#include "comm/comm.h"
#include "pipeline/layout.h"
#include "cdp/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this version cannot train (bf16 on the cpu backend), checked before
 * any rank starts: CDP_ERR_UNSUPPORTED naming the key. cdp_exec_run checks it
 * too. */
cdp_status cdp_exec_check(const struct cdp_plan *plan);

/* Trains the plan as `layout` says (not owned; the planner's, for this plan)
 * on the ranks of `world`, whose size must be the layout's ranks: each rank
 * binds to its CPU set, opens its device under its memory cap, builds its
 * stage's chunks and runs its schedule. Rank 0 prints the step lines and
 * writes metrics (the layout first, then one record per step with each rank's
 * measured memory peak beside the prediction), trace, timeline and weights.
 * On any failure the returned status says which rank, stage, replica and
 * instruction; the caller then aborts the job (cdp_comm_abort), since the
 * other ranks may be waiting on this one. */
cdp_status cdp_exec_run(const struct cdp_plan *plan, const struct cdp_layout *layout, cdp_comm_t world,
                        const struct cdp_train_opts *opts, struct cdp_train_summary *summary);

/* A fresh run (resume NULL) into a checkpoint folder that holds committed
 * checkpoints of an earlier run: CDP_ERR_INVALID naming the plan's key and
 * the newest, before any step is trained. */
cdp_status cdp_exec_check_checkpoint_dir(const struct cdp_plan *plan, const char *resume);

/* Asks the running cdp_exec_run of this process to stop (async-signal-safe):
 * after the step under way, every rank (the request of one is shared at the
 * step's end) saves a checkpoint when the plan has /train/checkpoint, and the
 * run returns CDP_OK early. */
void cdp_exec_request_stop(void);
/* The step after which the last run stopped as asked, or -1; *saved (not
 * NULL) gets the step of the checkpoint it saved then, or -1. */
int64_t cdp_exec_stopped(int64_t *saved);

/* "rank 1/4 (stage 1, replica 0): RECV_ACT of micro-batch 3, chunk 0, from stage 0",
 * what this process is doing now; safe to read from a signal handler. */
const char *cdp_exec_where(void);

/* metrics.jsonl of a run resumed after step0: cuts the lines of later steps
 * (which run again) and a line a crash left unfinished; *dropped says how many
 * lines went. A missing file is no error (nothing to cut); CDP_ERR_IO. */
cdp_status cdp_metrics_cut(const char *path, int64_t step0, long *dropped);

/* The highest "step" recorded in metrics.jsonl, or -1 (no file, no step). */
int64_t cdp_metrics_last_step(const char *path);

#ifdef __cplusplus
}
#endif

#endif
