/* The executor's parts (pipeline/run/executor.h is its interface): the state of
 * one rank's run, shared by the step driver (executor.c), the setup
 * (exec_setup.c), the interpreter of the schedule (interpret.c), load
 * balancing (exec_balance.c), checkpoints (exec_checkpoint.c), forward passes
 * alone (exec_forward.c: eval, the decoder) and reporting (report.c). Shapes: B samples per micro-batch, m micro-batches per replica,
 * p stages, v chunks per rank, R replicas, G = R * m * B samples per step. */
#ifndef CDP_PIPELINE_EXEC_INTERNAL_H
#define CDP_PIPELINE_EXEC_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "cdp/device.h"
#include "cdp/plan.h"
#include "comm/comm.h"
#include "model/checkpoint.h"
#include "model/data.h"
#include "model/model.h"
#include "model/optim.h"
#include "model/tensor_group.h"
#include "pipeline/run/fault.h"
#include "pipeline/layout.h"
#include "pipeline/run/monitor.h"
#include "pipeline/schedule.h"
#include "pipeline/trace.h"
#include "cdp/train.h"

/* A gradient bucket of a chunk (exec_buckets.c): floats [from, from + count)
 * of its parameter buffer, whole units from `unit` up. */
struct bucket {
    size_t from, count;
    int unit;          /* its lowest unit: it is ready once that unit's backward is done */
    int late;          /* holds the tied embedding: reduced at ALLREDUCE_GRADS */
    int posted;        /* started this step */
    cdp_request_t req; /* in flight */
    uint64_t t_post;
};

struct exec;

/* One virtual stage of this rank: its model range and what moves through it. */
struct chunk {
    int vstage;
    struct cdp_model *model;
    struct cdp_optimizer *opt;
    int first_unit, end_unit;
    int in_tokens;
    int64_t in_bytes, out_bytes; /* one micro-batch */
    int nslots;
    int *slot_mb, *mb_slot;
    cdp_request_t *slot_send;   /* the SEND_ACT still in flight from a slot's output */
    float *grad_in;             /* RECV_GRAD lands here; the next BACKWARD reads it */
    float **grad_out;           /* a ring of SEND_GRAD buffers */
    cdp_buffer_t grad_in_buf, *grad_out_buf; /* device memory of grad_in and grad_out */
    cdp_request_t *grad_out_req;
    cdp_request_t grad_in_req;  /* the next RECV_GRAD, posted early (after the BACKWARD that read grad_in) */
    int grad_in_mb;             /* its micro-batch */
    uint64_t grad_in_posted;
    int n_grad_out, next_grad_out;
    int *mb_grad_out;           /* mb -> ring index of its input gradient */
    /* split backward: W-state slots, assigned like activation slots (from
     * the BACKWARD_INPUT to the BACKWARD_WEIGHT) */
    int nwslots;
    int *wslot_mb, *mb_wslot;
    /* the chunks of this rank holding the virtual stages before and after
     * this one (zbv's turn of the V on the last rank), -1 when another rank
     * does: activations and gradients pass between them by a device copy */
    int local_prev, local_next;
    /* decoding (exec_forward.c): the chunk's KV-cache decoder and the rows
     * it takes from and gives to other ranks ([context, C] floats each) */
    struct cdp_infer *inf;
    float *dec_in, *dec_out;
    /* gradient buckets (NULL: one reduction at ALLREDUCE_GRADS) */
    struct exec *e;
    struct bucket *bk;
    int nbk, next_bk;           /* next_bk: the next one the backward hook may start */
    int bw_left, last_bw;       /* BACKWARDs left this step; 1 during the last */
    uint64_t bk_first, bk_last; /* this step's first bucket start, last completion */
};

/* This rank's run. */
struct exec {
    const struct cdp_plan *plan;
    const struct cdp_layout *lay;   /* what runs where (not owned) */
    const struct cdp_layout_rank *me; /* this rank's entry of it */
    /* one communicator per role: the caller's host world (host values: losses,
     * timings, the monitor), and on this rank's device memory the world, the
     * pipeline of its replica, the replicas of its stage and the tied pair;
     * comm/ chose how each carries device memory (cdp_comm_for_device) and
     * cdp_comm_host gives each one's host group */
    cdp_comm_t world, dev_world, pipe, dp, tied;
    /* tensor parallelism (docs/parallelism.md): this rank's tensor group
     * (stage, replica) on device memory, NULL at t = 1; the model's view of
     * it (its split units' collective) and the time spent in it this step */
    cdp_comm_t tpc;
    struct cdp_tensor_group tg;
    /* what the tensor group's collectives and the replicas' gradient
     * reduction travel as (/parallel/comm_dtype); the vocab-parallel loss's
     * statistics, the tied pair and ZeRO's parameter all-gather stay fp32 */
    enum cdp_comm_wire wire_tp, wire_dp;
    uint64_t t_tensor;
    int rank, size, p, R, v, m, s, r, B, nv;
    int t, k; /* tensor group size and this rank's index in it */
    int64_t G;
    /* load balance: micro-batches of each replica this step (the shares sum
     * to R x micro_batches), those of the replicas before this one, and the
     * most this replica may be given (what its slots and buffers hold) */
    int64_t *share;
    int moff, mcap, unit;
    /* rebalancing: this rank's busy time and micro-batches since the last look */
    double rb_busy;
    int64_t rb_mb;
    double timeout;
    cdp_device_t dev;
    int hv;                /* the host sees the device's memory (cpu) */
    int last_rank;         /* the pipeline rank of the last virtual stage (0 under zbv) */
    int tied_local;        /* a tied embedding whose two copies are chunks of this rank (zbv's rank 0) */
    int zero;              /* ZeRO-1: the optimizer steps this replica's shard (layout zero, R > 1) */
    struct chunk *ch;
    struct cdp_schedule *sched;
    struct cdp_data *data;
    const struct cdp_sample_shape *shape;
    void *tgt;             /* [m][B * target_numel] */
    void *in_scratch;      /* inputs read by a last stage that is not the first */
    int64_t tgt_bytes;
    float scale;
    int step;
    double loss_sum;
    double grad_norm; /* before clipping, of the last step */
    double lr;        /* the current step's learning rate (cdp_lr_at) */
    double peak_flops; /* every rank's device peak summed (MFU's denominator); 0 when one is unknown */
    uint64_t t_start;  /* when the steps began (the time left is measured from it) */
    struct cdp_tb *tb; /* rank 0: the TensorBoard event file (output.tensorboard), or NULL */
    /* timing of the current step */
    uint64_t t_compute, t_comm, t_idle, t_fb, fb_end, step_start;
    uint64_t t_reduce; /* ZeRO-2: time in cdp_exec_grad_reduce, so far */
    struct cdp_trace *trace;
    struct cdp_fault fault; /* CDP_FAULT, the testing knob */
    struct cdp_monitor *monitor;
    /* resuming: the checkpoint's step and the samples consumed by then */
    int step0;
    int replicas_same; /* cdp_exec_check_replicas: 1 every replica's weights the same bits, -1 not; 0 unchecked */
    int drift_stage, drift_replica;
    int64_t sample_base;
    FILE *out;
    int ckpt_lock; /* rank 0: the checkpoint folder's lock (an open file), or -1 */
    const char *resume_allow; /* plan keys a resume may change (cdp_train_opts; not owned) */
    /* every rank's host name (CDP_EXEC_HOST_MAX bytes each, by world rank),
     * and how many distinct hosts the job spans (exec_hosts.c) */
    char *hosts;
    int n_hosts;
    /* forward-only mode (cdp_exec_validate): the forward schedule through the
     * same instruction table, LOAD reading the validation split from
     * micro-batch fwd_base on, the last virtual stage summing its loss into
     * fwd_sum, and a slot free again as soon as its output has been taken
     * (no activation is kept for a backward) */
    int fwd;
    int64_t fwd_base;
    double fwd_sum;
    int eval_only; /* set up for forward passes alone (cdp_exec_eval, the decoder): no optimizer */
    int no_data;   /* ... and reading no data (the decoder: its caller gives the tokens) */
    /* decoding mode (cdp_exec_decoder_step): the forward-only schedule of one
     * micro-batch, each FORWARD a step of the chunk's KV-cache decoder on
     * dec_n new positions (the first virtual stage reads dec_tokens, the
     * last writes dec_logits), each RECV_ACT / SEND_ACT their rows */
    int dec;
    const int32_t *dec_tokens;
    int64_t dec_n;
    float *dec_logits;
};

#define CDP_EXEC_HOST_MAX 64

/* What the executor is doing now ("rank 1/4 (stage 1, replica 0), step 2:
 * RECV_ACT of micro-batch 3, from stage 0"), for failure messages and the
 * signal handler (cdp_exec_where). */
extern char cdp_exec_where_buf[256];

/* exec_setup.c: groups, device, schedule, chunks, data and trace of this rank
 * (in e->plan and e->lay); cdp_exec_free undoes it (partly built too). */
cdp_status cdp_exec_setup(struct exec *e);
/* The model's view of e->tpc (model/tensor_group.h): its all-reduce, and
 * sequence parallelism's reduce-scatter and all-gather, on the device's
 * memory through comm/'s collectives (MPI, or the nccl communicator), their
 * time added to e->t_tensor, deadline e->timeout; size 1 and index 0 when
 * e->tpc is NULL (t = 1). */
struct cdp_tensor_group cdp_exec_tensor_group(struct exec *e);
void cdp_exec_free(struct exec *e);
/* The schedule of this replica's current share (e->m). */
cdp_status cdp_exec_build_schedule(struct exec *e);
/* e->m and e->moff from e->share. */
void cdp_exec_set_share(struct exec *e);

/* interpret.c: this rank's list for the step, instruction by instruction (or
 * NCCL groups), in the mode e says (a step, forward-only, decoding); the sends
 * still in flight. */
cdp_status cdp_exec_run_list(struct exec *e);
/* ZeRO-2's reduce hook (cdp_grad_reduce_fn; ctx is the exec): the window's
 * sum over the stage's replicas, into this replica's part of it. */
cdp_status cdp_exec_grad_reduce(void *ctx, float *buf, uint64_t n, uint64_t from, uint64_t count);
cdp_status cdp_exec_drain_sends(struct exec *e);
/* exec_forward.c: the validation loss over n micro-batches (training's,
 * `cdphybrid eval`'s):
 * replica 0 runs the forward-only schedule (cdp_schedule_build_forward) in
 * windows of at most mcap micro-batches in forward-only mode; *val, on every
 * rank, is the loss summed over every row divided by n x B x rows a sample
 * (*rows_per_sample when not NULL: every token of a token model, else 1). A
 * collective of the world. */
cdp_status cdp_exec_validate(struct exec *e, int64_t n, double *val, double *rows_per_sample);

/* exec_buckets.c: the chunk's gradient buckets and the model's backward hook
 * (when the plan's bucket_mb, the replicas and the dp communicator allow);
 * per step: armed at its start, the last BACKWARD of each chunk starts them,
 * progress after every instruction, ALLREDUCE_GRADS starts what is left and
 * waits for all. cdp_exec_buckets_on: this step reduces by buckets. */
cdp_status cdp_exec_buckets_setup(struct exec *e, struct chunk *c);
int cdp_exec_buckets_on(const struct exec *e);
void cdp_exec_buckets_start_step(struct exec *e);
void cdp_exec_buckets_before_backward(struct exec *e, struct chunk *c);
cdp_status cdp_exec_buckets_progress(struct exec *e);
cdp_status cdp_exec_buckets_finish(struct exec *e);
void cdp_exec_buckets_free(struct chunk *c);

/* exec_balance.c: new shares from the measured times, every N steps. */
cdp_status cdp_exec_rebalance(struct exec *e, int step);

/* exec_checkpoint.c: this rank's part of step's checkpoint (rank 0 commits);
 * resuming from the newest complete one in dir. */
cdp_status cdp_exec_save_checkpoint(struct exec *e, int step);
cdp_status cdp_exec_resume(struct exec *e, const char *dir);
/* exec_ckpt_gather.c, ZeRO-1: replica 0 of a stage writes its part with the
 * optimizer state gathered from the replicas of group (the stage's
 * data-parallel group, host memory) while the others send their shards at the
 * same time (model/checkpoint.h cdp_ckpt_write_part_sharded). A failure on one
 * side leaves the other waiting until timeout_s. */
/* ZeRO: every replica's piece of state s of tensor i of m, in rank order of
 * group: at its rank 0 into *out (malloc'd, nbytes), the others (out NULL)
 * send theirs (exec_ckpt_gather.c). */
cdp_status cdp_exec_ckpt_gather_state(struct cdp_optimizer *o, struct cdp_model *m, int i, int s, cdp_comm_t group,
                                      double timeout, uint64_t nbytes, uint8_t **out);
/* Tensor groups (exec_ckpt_tensor.c): replica 0's groups write part as whole
 * tensors (every rank of replica 0 calls it; under ZeRO every rank, the
 * other replicas sending their shards of the state); a resume loads the
 * whole tensors and keeps each rank's slices and shards (every rank). */
cdp_status cdp_exec_ckpt_write_tensor(struct exec *e, int step, const char *part);
cdp_status cdp_exec_ckpt_load_tensor(struct exec *e, const char *path, const struct cdp_ckpt_info *info);
cdp_status cdp_exec_ckpt_write_gathered(const char *dir, int64_t step, const char *part,
                                        struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                        cdp_comm_t group, double timeout_s);
cdp_status cdp_exec_ckpt_send_shards(struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                     cdp_comm_t group, double timeout_s);

/* Rank 0 takes the checkpoint folder's lock for the run's life (another run
 * holding it: CDP_ERR_INVALID naming the holder) and hands every rank the
 * run's id, which its parts carry (cdp_ckpt_set_run). A collective. */
cdp_status cdp_exec_hold_checkpoint_dir(struct exec *e);

/* report.c: what a run prints and writes. One step's figures, reduced over the
 * ranks (sums / size where it says mean). */
struct cdp_exec_step {
    int step;
    double loss, bubble, time_s, val_loss; /* val_loss NAN when not validated */
    double compute_s, comm_s, idle_s, step_s; /* mean over ranks */
    double tensor_s;                      /* of comm_s: the split layers' all-reduces (mean over ranks) */
    int report;                           /* a monitor report was taken */
    int stop;                             /* a rank was asked to stop (cdp_exec_request_stop) */
    struct cdp_monitor_report mon;
};

/* The run's totals for the step lines: FLOPs of a step, parameters, tokens per sample. */
struct cdp_exec_totals {
    double flops_per_step, params, sample_tokens;
    int tokens;
};

void cdp_exec_print_shares(FILE *f, const int64_t *share, int R);
cdp_status cdp_exec_write_layout_record(const struct exec *e, FILE *f);
/* metrics.jsonl for this run (rank 0): new, or for a resume after step0 cut
 * back to that step (the lines of later steps, and a line a crash left
 * unfinished, removed; said on e->out) and appended to. */
cdp_status cdp_exec_open_metrics(const struct exec *e, FILE **out);
void cdp_exec_print_header(const struct exec *e, const struct cdp_exec_totals *t, FILE *out);
/* The step's record: a line of metrics.jsonl into f (NULL: none) and, with
 * e->tb, its numbers as one TensorBoard event. */
cdp_status cdp_exec_write_step_record(const struct exec *e, const struct cdp_exec_step *s,
                                      const struct cdp_exec_totals *t, FILE *f);
void cdp_exec_print_step(const struct exec *e, const struct cdp_exec_step *s, const struct cdp_exec_totals *t,
                         int progress, FILE *out);
void cdp_exec_print_summary(const struct exec *e, const struct cdp_train_summary *sum, const double *peaks,
                            FILE *out);
cdp_status cdp_exec_gather_peaks(const struct exec *e, double **out);
cdp_status cdp_exec_write_traces(struct exec *e);
cdp_status cdp_exec_write_weights(struct exec *e);
/* Replicas must not drift apart (their gradient reduction gives every
 * replica the same bits, fp32 or bf16 on the wire): at the end of a run with
 * replicas, each rank's weights are digested (64 bits) and compared with
 * replica 0's of its stage and tensor index. e->replicas_same becomes 1, or
 * -1 with e->drift_stage / e->drift_replica the first that differ (a warning
 * and the summary say so; the run's weights are still written). A
 * collective over the world; fails only where a collective does. */
cdp_status cdp_exec_check_replicas(struct exec *e);

/* exec_hosts.c: every rank's host name into e->hosts and e->n_hosts (a
 * collective). */
cdp_status cdp_exec_gather_hosts(struct exec *e);
/* Whether every host of a job over several sees the same folder `dir` (what
 * rank 0 writes there the others read): CDP_ERR_INVALID on rank 0 naming the
 * folder, `what` it is ("/train/checkpoint/dir") and the hosts that do not
 * (the other ranks return CDP_OK: rank 0's abort ends them). A collective; a
 * job on one host returns CDP_OK at once. */
cdp_status cdp_exec_check_shared(const struct exec *e, const char *dir, const char *what);

#endif
