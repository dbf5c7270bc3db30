/* Training a planned layout (docs/embedding.md): the executor, the same entry
 * the cdphybrid program uses for a one-rank run and on every rank of a
 * launched job. Either this process alone (a layout of one rank: the whole
 * model on one device, every global batch as micro-batches with gradients
 * accumulated) or this process as rank r of an MPI job of the layout's ranks,
 * started by mpirun; every layout of a plan trains to the same result (up to
 * floating-point summation order).
 *
 * Versioning: every struct here starts with `size`, which the caller sets to
 * sizeof the struct as its header declares it (CDP_TRAIN_OPTS_INIT does). The
 * library reads and writes only that many bytes, so a program built against
 * this header keeps working with a later library that has added fields at the
 * end; a size of 0, or larger than the library's, is CDP_ERR_INVALID. */
#ifndef CDP_TRAIN_H
#define CDP_TRAIN_H

#include "cdp/api.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cdp/layout.h"
#include "cdp/plan.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One step's figures, handed to opts.on_step after every step. Every rank
 * gets the same loss, val_loss, grad_norm and bubble (they are reduced over
 * the ranks); time_s and the rates are this rank's. */
struct cdp_step_metrics {
    size_t size;            /* sizeof(struct cdp_step_metrics) of the library: read only what you know */
    int64_t step, steps;    /* this step (1-based) of the plan's /train/steps */
    int rank, ranks;        /* this process in the layout */
    double loss;            /* mean over the global batch */
    double val_loss;        /* validation loss when evaluated after this step (/train/eval_every, the
                               last step), else NAN */
    double lr;              /* this step's learning rate (/train/lr_schedule) */
    double grad_norm;       /* global gradient norm before clipping */
    double time_s;          /* this step's wall time */
    double samples_per_s, tokens_per_s; /* global batch / time_s; tokens 0 for models without tokens */
    double bubble;          /* idle share of the forward/backward phase, over the ranks */
};

/* Where a run trains. */
enum cdp_train_world {
    CDP_TRAIN_SELF = 0, /* this process alone: the layout must have one rank */
    CDP_TRAIN_MPI,      /* this process is one rank of MPI_COMM_WORLD, whose size must be the layout's
                           ranks; rank r runs the layout's rank r. MPI_Init may be the caller's (then
                           the caller finalises) or, when MPI is not yet up, the library's (then MPI is
                           finalised when the run ends and cannot train under MPI again in this
                           process). Under mpirun only; elsewhere it is CDP_TRAIN_SELF. */
};

struct cdp_train_opts {
    size_t size;            /* sizeof(struct cdp_train_opts) */
    FILE *out;              /* step lines and the summary (rank 0 only); NULL = silent */
    int progress;           /* redraw a progress line between logged steps (a terminal) */
    const char *resume;     /* a checkpoint folder (or a folder of them) to continue from, or NULL */
    enum cdp_train_world world;
    /* called on this thread after every step on every rank, before the step's
     * checkpoint; m is valid during the call only. NULL = none. */
    void (*on_step)(const struct cdp_step_metrics *m, void *user);
    void *user;             /* passed to on_step */
    /* with resume: the plan keys that may differ from the checkpoint writer's
     * plan, comma-separated JSON paths ("/data/path,/train/optimizer/lr"; a
     * path takes the keys under it), or NULL. Without them a resume under
     * another /model, /data, /train/seed or /train/optimizer is refused,
     * naming the key (docs/checkpoints.md, "What a resume checks"). */
    const char *resume_allow;
};

#define CDP_TRAIN_OPTS_INIT {.size = sizeof(struct cdp_train_opts)}

struct cdp_train_summary {
    size_t size;                  /* sizeof(struct cdp_train_summary) */
    int64_t steps;
    double first_loss, last_loss; /* mean over the global batch */
    double val_loss;              /* after the last step */
    double seconds;
    double samples_per_s, tokens_per_s, flops_per_s;
    /* per step, averaged over ranks and steps after the first */
    double bubble;       /* idle share of the forward/backward phase */
    double compute_s;    /* loading, forward, backward, optimizer */
    double comm_s;       /* posting sends, all-reduces */
    double idle_s;       /* waiting for a peer's activation or gradient */
    double overhead_s;   /* the executor's own time: everything else in the step */
    double step_s;
    /* this rank's device memory: the accounting's high-water mark and the layout's prediction */
    double peak_memory_bytes, predicted_memory_bytes;
};

#define CDP_TRAIN_SUMMARY_INIT {.size = sizeof(struct cdp_train_summary)}

/* Trains plan as layout says. layout is the planner's for this plan
 * (cdp_planned_layout; not owned); plan is the one cdp_plan_layout planned
 * (it holds the chosen values). opts NULL: CDP_TRAIN_SELF, silent. summary
 * NULL: not wanted; else filled on success. The plan's outputs (metrics,
 * trace, timeline, weights, checkpoints) are written as the plan says.
 *
 * Errors: CDP_ERR_INVALID (bad opts, a loss that is not finite), or the
 * status of what failed, with cdp_last_error() naming the rank, stage,
 * replica and instruction. CDP_ERR_UNSUPPORTED for a layout of several ranks
 * under CDP_TRAIN_SELF. Under CDP_TRAIN_MPI a failed rank leaves the job to
 * its caller: the other ranks may be waiting on it, so end the job with
 * cdp_train_abort (or MPI_Abort). */
CDP_API cdp_status cdp_train(const struct cdp_plan *plan, const struct cdp_layout *layout,
                             const struct cdp_train_opts *opts, struct cdp_train_summary *summary);

/* Asks a cdp_train running in this process to stop early; safe to call from
 * a signal handler (a rank's SIGUSR1, a job's pre-emption). After the step
 * under way, every rank (one rank's request reaches all at the step's end)
 * saves a checkpoint when the plan has /train/checkpoint, and cdp_train
 * returns CDP_OK with summary->steps the last step trained, before
 * /train/steps; the final outputs (weights, trace) are not written. */
CDP_API void cdp_train_request_stop(void);

/* Ends the whole job after a failed cdp_train under MPI (MPI_Abort on the
 * world with code; exit(code) when MPI is not up). Does not return. */
#if defined(__GNUC__)
__attribute__((noreturn))
#endif
CDP_API void cdp_train_abort(int code);

#ifdef __cplusplus
}
#endif

#endif
