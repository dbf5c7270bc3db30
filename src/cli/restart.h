/* Restarts of a launched job (/train/restart; docs/checkpoints.md,
 * "Restarts"): what the ranks' last words and the launcher's exit code say
 * failed, the re-plan on the devices that are left, and the record of each
 * restart. Here, in the command line, because the re-plan calls the planner
 * (partitioner/), which the pipeline layer that launches the ranks never
 * includes. */
#ifndef CDP_CLI_RESTART_H
#define CDP_CLI_RESTART_H

#include <stdint.h>
#include <stdio.h>

#include "cdp/plan.h"
#include "cdp/status.h"
#include "pipeline/layout.h"

struct cdp_cost_table;
struct cdp_planner_result;
struct cdp_topology;

/* A rank's last word (CDP_RANK_STATUS_DIR/rank-N.end): its first line. */
enum cdp_rank_end {
    CDP_END_SILENT = 0,      /* no file: the rank died (or its node did) */
    CDP_END_DONE,            /* "done" */
    CDP_END_FAILED_DEVICE,   /* "failed device": its device reported an error */
    CDP_END_FAILED_COMM,     /* "failed comm": a wait past its deadline, or a peer gone */
    CDP_END_FAILED_OTHER,    /* "failed other": bad data, memory, a file: a restart would fail the same */
    CDP_END_STOPPED_WAITING, /* "stopped waiting": stopped by the launcher while waiting on a peer */
    CDP_END_STOPPED_BUSY,    /* "stopped busy": stopped while not waiting (computing, or hung) */
    CDP_END_KILLED,          /* "killed": SIGTERM from outside the job (not its launcher): a death */
    CDP_END_STOPPED_ASKED,   /* "stopped on request": asked to stop (SIGUSR1), it saved and ended */
};

/* The words of the files (index: enum cdp_rank_end; [0] unused). */
extern const char *const cdp_rank_end_words[];

/* How a job ended: the launcher's exit code and every rank's last word, with
 * the step it was at (-1: unknown). */
struct cdp_job_end {
    int code;
    int n_ranks;
    enum cdp_rank_end *end; /* n_ranks entries (owned) */
    int64_t *step;          /* n_ranks entries (owned) */
    int died;               /* the rank the launcher said died first, or -1 */
    int rank_code;          /* the largest exit code a failed rank gave in its last word ("exit N"), else 0 */
    int64_t oom_kills;      /* processes the kernel's OOM killer ended in this job's cgroup meanwhile */
};

/* Reads dir/rank-N.end for every rank (RANK_STATUS_FILE's names). */
cdp_status cdp_restart_read_ends(const char *dir, int n_ranks, int code, int died, struct cdp_job_end *out);
void cdp_job_end_clear(struct cdp_job_end *e);

/* What failed, decided from a job's end. */
struct cdp_fault_report {
    int restartable;     /* a death, a hang or a device error (not bad input, not another error) */
    char kind[16];       /* "died", "hang", "device error"; "out of memory" (not restartable) */
    char what[400];      /* one line: "rank 1 (stage 1, replica 0) on device 1 died (signal 9)" */
    int n_failed;        /* ranks found failed (0: a hang whose rank is not known) */
    int *failed;         /* their world ranks (owned) */
    int node;            /* a node whose every rank died, or -1 */
    int64_t step;        /* the step the fault came in (-1: unknown) */
};

/* Decides from e (and the step from metrics, -1 when not known) what failed
 * in layout l. */
cdp_status cdp_restart_decide(const struct cdp_layout *l, const struct cdp_job_end *e, int64_t metrics_last,
                              struct cdp_fault_report *out);
void cdp_fault_report_clear(struct cdp_fault_report *f);

/* Makes f say that node `node` of l was lost (its host does not answer: cut
 * off or gone), whatever its peers' words said (they time out waiting on it,
 * and it on them): every rank of it failed, restartable, the step kept. */
void cdp_restart_node_lost(const struct cdp_layout *l, int node, struct cdp_fault_report *f);

/* What the re-plan is given: the plan file (loaded and resolved again, so
 * that what it leaves "auto" is planned again), the machine, the cost table
 * or NULL, and the topology the first layout was planned on. */
struct cdp_replan_in {
    const char *plan_path;
    const struct cdp_machine_info *machine;
    const struct cdp_cost_table *table;
    const struct cdp_topology *topo;
};

/* Plans the run again on the devices of `old` that are not in dead[]
 * (dead: one flag per device of the planned topology; with tensor groups, a
 * dead device's whole group is out: its slot of t consecutive devices goes,
 * so that what is left comes in whole groups), with the same global
 * batch: the shape, micro-batches, partition and placement are planned on as
 * many devices as are left (nodes that keep some, at most the fewest any of
 * them keeps), and the chosen placement is moved onto the devices that are
 * left. The plan's /parallel/tensor stays (a fixed t), or "auto" chooses
 * again, falling back to the old t when the t it chose would put a group on
 * devices that are not consecutive. *plan_out is the plan with the answer
 * applied (what planned.json holds), *out the planner's result on it.
 * CDP_ERR_INVALID when no device is left or nothing fits them. */
cdp_status cdp_restart_replan(const struct cdp_replan_in *in, const struct cdp_layout *old, const unsigned char *dead,
                              int n_devices, struct cdp_plan **plan_out, struct cdp_planner_result *out);

/* "2x2" (stages x replicas) for the restart's line; "1x1 (tensor 2)" with
 * tensor groups. */
void cdp_restart_shape(const struct cdp_layout *l, char *buf, size_t cap);

/* One restart's record (one line) appended to metrics.jsonl. */
cdp_status cdp_restart_record(const char *metrics, int restart, const struct cdp_fault_report *f,
                              const struct cdp_layout *old, const struct cdp_layout *now, int64_t resumed_from,
                              int64_t steps_lost, int same_layout);

#endif
