/* The schedule IR: for every rank of a pipeline, the ordered instructions of one
 * training step. Generators for GPipe (fill-drain), 1F1B (PipeDream-Flush) and
 * interleaved 1F1B (Megatron, v model chunks per rank); a validator that proves
 * a set of lists well formed and deadlock-free; compact and JSON printing.
 * The executor interprets these lists; the simulator will run the same lists on
 * the cost model.
 *
 * Pipeline shape: p ranks (pipeline stages), v chunks per rank, m micro-batches.
 * There are p*v virtual stages, placed by cdp_schedule_vstage (the one place
 * that knows it): virtual stage k runs as chunk k / p on rank k % p (Megatron's
 * order), so a micro-batch's forward visits rank 0, 1, ..., p-1, then rank 0
 * again with chunk 1, and so on; except zbv, whose two chunks form a V: chunk 0
 * of rank r is virtual stage r, chunk 1 is virtual stage 2p-1-r, so the forward
 * goes down ranks 0..p-1 and comes back up p-1..0, and rank 0 holds the first
 * and the last virtual stage. A backward visits the virtual stages in reverse.
 * With v = 1 the virtual stage is the rank. Data parallelism is orthogonal: every
 * replica of the pipeline runs the same lists.
 *
 * The zero-bubble kinds (zb-h1, zb-h2, zbv; Qi et al., "Zero Bubble Pipeline
 * Parallelism", ICLR 2024) split each backward into BACKWARD_INPUT (the input
 * gradient, which the previous stage waits for) and BACKWARD_WEIGHT (the
 * parameter gradients, deferrable); a micro-batch's activations stay until its
 * BACKWARD_WEIGHT, and between the two it holds a W-state (what the weight
 * gradient reads). */
#ifndef CDP_PIPELINE_SCHEDULE_H
#define CDP_PIPELINE_SCHEDULE_H

#include <stdio.h>

#include "cdp/layout.h"
#include "cdp/plan.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum cdp_op {
    CDP_OP_LOAD = 0,          /* load micro-batch mb's inputs (rank 0, first virtual stage)
                                 or targets (rank p-1, last virtual stage); both when p == 1.
                                 chunk = the chunk whose FORWARD it feeds (0 on rank 0,
                                 v-1 on rank p-1) */
    CDP_OP_FORWARD,           /* forward of micro-batch mb through chunk `chunk` (the last
                                 virtual stage also computes the loss) */
    CDP_OP_SEND_ACT,          /* send chunk's output of mb to the next virtual stage */
    CDP_OP_RECV_ACT,          /* receive chunk's input of mb from the previous virtual stage */
    CDP_OP_BACKWARD,          /* backward of mb through chunk */
    CDP_OP_SEND_GRAD,         /* send the gradient of chunk's input of mb to the previous virtual stage */
    CDP_OP_RECV_GRAD,         /* receive the gradient of chunk's output of mb from the next */
    CDP_OP_BACKWARD_INPUT,    /* the input-gradient half of mb's backward through chunk ("I"): what
                                 SEND_GRAD sends; leaves a W-state for the BACKWARD_WEIGHT */
    CDP_OP_BACKWARD_WEIGHT,   /* the parameter-gradient half ("W"), after its BACKWARD_INPUT; frees
                                 the micro-batch's activations and W-state */
    CDP_OP_REDUCE_TIED_GRADS, /* sum gradients of tied parameters (GPT embedding and head) */
    CDP_OP_ALLREDUCE_GRADS,   /* sum gradients over the stage's data-parallel replicas */
    CDP_OP_OPTIMIZER_STEP,    /* clip and step */
    CDP_OP_COUNT
};

struct cdp_instr {
    enum cdp_op op;
    int mb;    /* micro-batch, 0..m-1; -1 for step-level instructions */
    int chunk; /* model chunk on this rank, 0..v-1; -1 for step-level instructions */
    int peer;  /* SEND_* / RECV_*: the pipeline rank of the other side; else -1 */
};

struct cdp_schedule {
    enum cdp_schedule_kind kind;
    int p, v, m;            /* ranks, chunks per rank, micro-batches */
    int *len;               /* len[r]: instructions of rank r */
    struct cdp_instr **list; /* list[r][i] */
};

/* Virtual stage of (rank, chunk) under kind's placement (see the top of this
 * file), for p ranks of v chunks each; -1 when rank or chunk is out of range.
 * cdp_schedule_vstage_place is the inverse: the rank and chunk of virtual
 * stage k (0 <= k < p*v, checked by CDP_ASSERT). Every part that maps virtual
 * stages to ranks (the executor, the layout, the simulator, the planner) goes
 * through these two. */
int cdp_schedule_vstage(enum cdp_schedule_kind kind, int p, int v, int rank, int chunk);
void cdp_schedule_vstage_place(enum cdp_schedule_kind kind, int p, int v, int k, int *rank, int *chunk);

/* Chunks per rank a kind runs with given the plan's /parallel/chunks: zbv
 * always 2, interleaved `chunks`, the others 1. */
int cdp_schedule_chunks_of(enum cdp_schedule_kind kind, int chunks);

/* Whether kind's lists split the backward (BACKWARD_INPUT / BACKWARD_WEIGHT). */
int cdp_schedule_splits_backward(enum cdp_schedule_kind kind);

/* Whether op computes parameter gradients: BACKWARD and BACKWARD_WEIGHT (a
 * step's last of them per chunk is where its gradients are complete). */
static inline int cdp_op_makes_weight_grads(enum cdp_op op)
{
    return op == CDP_OP_BACKWARD || op == CDP_OP_BACKWARD_WEIGHT;
}

/* Builds the lists of one step for p ranks, v chunks, m micro-batches, for
 * MPI's buffered send/receive: cdp_schedule_build_ex(..., rendezvous = 0, ...).
 * The simulator, the planner and the CPU executor use these lists. */
cdp_status cdp_schedule_build(enum cdp_schedule_kind kind, int p, int v, int m, int tied,
                              struct cdp_schedule **out);

/* Builds the lists of one step for p ranks, v chunks, m micro-batches; *out
 * is the caller's (cdp_schedule_free), written only on success.
 * Order within a list is execution order. gpipe: forwards 0..m-1, then
 * backwards 0..m-1. 1f1b: min(p-r-1, m) warm-up forwards, 1F1B pairs,
 * cool-down backwards. interleaved: Megatron's order of compute
 * (pipeline/schedule_gen.c). zb-h1: 1F1B's order with the backward split, rank r
 * deferring its weight gradients by r micro-batches (peak p in flight, as
 * 1F1B's rank 0). zb-h2: a greedy list schedule at unit times that keeps at
 * most 2p-1 micro-batches in flight (peak 2p-1). zbv: two chunks in a V
 * (peak 2p chunk activations, each half a stage's: 1F1B's rank-0 memory).
 * Exact order and bubbles: pipeline/schedule_gen.c and docs/simulator.md.
 * rendezvous selects the transport the lists are for:
 * - 0 (MPI, whose sends never block): each RECV_* sits right before the
 *   instruction that needs it (after the LOAD, if any, so that loading
 *   overlaps the wait), each SEND_* right after the FORWARD / BACKWARD that
 *   produced it, in every kind. The result passes cdp_schedule_validate,
 *   which is run before it is returned; interleaved lists may deadlock under
 *   rendezvous semantics (p = 2, v = 2, m = 4 does).
 * - != 0 (NCCL, whose sends and receives meet in groups): gpipe and 1f1b give
 *   the same lists as with 0, which are already safe; interleaved batches
 *   communication as Megatron does: after each warm-up forward, cool-down
 *   backward or steady forward+backward pair, the SEND_GRAD, then the
 *   SEND_ACT of that work, then the RECV_GRAD, LOAD and RECV_ACT of the next.
 *   The result passes cdp_schedule_validate and
 *   cdp_schedule_validate_rendezvous, both run before it is returned. Where
 *   sends never block this interleaved order is slower (activations leave
 *   later), so use it only where point-to-point goes through NCCL.
 * gpipe, 1f1b, zb-h1 and zb-h2 need v == 1; interleaved needs v >= 2, p >= 2
 * and m a multiple of p (as Megatron requires); zbv needs v == 2. Every list
 * ends with REDUCE_TIED_GRADS (only when tied != 0, and only on the two ranks
 * holding the first and the last virtual stage when they differ),
 * ALLREDUCE_GRADS and OPTIMIZER_STEP.
 * Invalid shapes give CDP_ERR_INVALID with the reason; lists that fail their
 * validation (a generator bug) CDP_ERR_INTERNAL; CDP_ERR_NOMEM if out of
 * memory. */
cdp_status cdp_schedule_build_ex(enum cdp_schedule_kind kind, int p, int v, int m, int tied, int rendezvous,
                                 struct cdp_schedule **out);
void cdp_schedule_free(struct cdp_schedule *s);

/* Proves the lists well formed: every micro-batch is loaded, forwarded and
 * backwarded exactly once per virtual stage, forward before backward,
 * inputs received before the forward that needs them and gradients before the
 * backward; a backward is either one BACKWARD or a BACKWARD_INPUT followed on
 * the same rank by its BACKWARD_WEIGHT (never both forms for one micro-batch
 * and chunk), the input gradient sent after the BACKWARD_INPUT, and every
 * BACKWARD_WEIGHT before the step-end instructions (T, A, O); every send matched by exactly one receive of the same (kind, mb,
 * virtual stage) on the peer, and a dry co-execution of all ranks together
 * (sends never block, a receive waits for its matching send) finishes. On
 * failure: CDP_ERR_INVALID and a message naming the rank, the position and the
 * instruction ("rank 2, instruction 7 (2B3): backward of micro-batch 3 before
 * its forward"), or, for a deadlock, every rank's pending instruction. */
cdp_status cdp_schedule_validate(const struct cdp_schedule *s);

/* Index one past the maximal run of consecutive point-to-point instructions
 * (SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD) of rank's list that starts at
 * instruction i; i itself when instruction i is not one of them or i is the
 * list's length. The executor on GPUs posts list[rank][i .. end) as one
 * ncclGroupStart/End group and waits for all of it, so a list's groups are:
 * for (i = 0; i < len; i = e > i ? e : i + 1) e = cdp_schedule_p2p_group_end(s, rank, i).
 * Pure; s must hold rank and 0 <= i <= len[rank] (checked by CDP_ASSERT). */
int cdp_schedule_p2p_group_end(const struct cdp_schedule *s, int rank, int i);

/* Proves the lists deadlock-free under NCCL's send/receive semantics, after
 * cdp_schedule_validate (whose failures it returns unchanged, CDP_ERR_INVALID):
 * - groups: each maximal run of consecutive point-to-point instructions of a
 *   rank (cdp_schedule_p2p_group_end) is one group; a rank posts a group when
 *   it reaches it and blocks there until every transfer in it is done;
 * - a transfer (a send and its receive) is done as soon as the groups holding
 *   its two sides are both posted, whatever the rest of either group waits
 *   for; so two ranks' groups that match each other complete together, and a
 *   group completes when its last transfer is done;
 * - NCCL has no tags: the k-th send from rank a to rank b lands in the k-th
 *   receive b posts from a, which must be the matching one (same kind,
 *   micro-batch and virtual stage);
 * - LOAD, FORWARD, BACKWARD, ALLREDUCE_GRADS (between replicas) and
 *   OPTIMIZER_STEP never wait; REDUCE_TIED_GRADS waits for the other tied rank.
 * A run where no rank can go on fails with CDP_ERR_INTERNAL (lists from
 * cdp_schedule_build_ex with rendezvous != 0 never do this; interleaved lists
 * built for MPI can) and a message naming every rank: where it blocks,
 * its group and the group's unmatched instructions ("rank 0 blocks in its group
 * at instruction 5 (sa1>1), unmatched sa1>1, rank 1 blocks ..."), that it
 * waits at its REDUCE_TIED_GRADS, or that it has finished; a send paired with
 * the wrong receive fails with
 * CDP_ERR_INTERNAL naming both. CDP_ERR_NOMEM if out of memory. */
cdp_status cdp_schedule_validate_rendezvous(const struct cdp_schedule *s);

/* Compact form of one instruction, like torch.distributed.pipelining's
 * actions ("2F0"), without the stage since a list belongs to one rank: "F0"
 * forward of mb 0, "B0" backward, "I0" its input half, "W0" its weight half; sends/receives "sa3>1" (send activation of
 * mb 3 to rank 1), "ra3<0", "sg3>0", "rg3<2"; "L3" load; "T" tied reduce;
 * "A" all-reduce; "O" step. When v > 1 the chunk goes in front of every
 * per-micro-batch instruction but L ("1F3" = chunk 1 forward mb 3, "0sa3>1").
 * Writes at most cap bytes into buf and returns buf. */
const char *cdp_instr_str(const struct cdp_instr *in, int v, char *buf, size_t cap);

/* One line per rank: "rank 0: L0 F0 sa0>1 ...". CDP_ERR_IO if f fails. */
cdp_status cdp_schedule_print(const struct cdp_schedule *s, FILE *f);

/* The lists as one JSON object: {"schedule": "1f1b", "stages": p, "chunks": v,
 * "micro_batches": m, "ranks": [["L0", "F0", "sa0>1", ...], ...]}, instructions
 * written as cdp_instr_str does. CDP_ERR_IO if f fails. */
cdp_status cdp_schedule_print_json(const struct cdp_schedule *s, FILE *f);

/* Parses one instruction of rank `rank` in cdp_instr_str's form into *out
 * (v: chunks per rank; the chunk prefix is required when v > 1 and refused
 * when v == 1). Fields are checked only for form here, ranges by
 * cdp_schedule_validate. CDP_ERR_INVALID naming what was expected. */
cdp_status cdp_instr_parse(const char *str, int v, struct cdp_instr *out);

/* Reads a user's lists from a file (docs/pipeline.md): the JSON object
 * cdp_schedule_print_json writes ("stages", "micro_batches", "ranks",
 * optionally "chunks" and "schedule", a kind's name that gives its placement
 * of virtual stages, zbv's V; else kind's), or CSV, a row per rank and an
 * instruction per cell (torch.distributed.pipelining's _load_csv layout, our
 * instructions; empty cells skipped), whose shape is p, v, m. p, v, m > 0 are
 * the job's, which a JSON file must agree with; 0 takes the file's. The result
 * passes cdp_schedule_validate; failures name the file and, from the parser
 * or the validator, the rank, the instruction and what was expected
 * (CDP_ERR_INVALID; CDP_ERR_IO when it cannot be read). */
cdp_status cdp_schedule_load(const char *path, enum cdp_schedule_kind kind, int p, int v, int m,
                             struct cdp_schedule **out);

/* The lists a job runs: its schedule file (path) when it names one
 * (cdp_schedule_load with the job's shape; with tied != 0 the two tied ranks
 * must have their T; under rendezvous != 0 they must pass
 * cdp_schedule_validate_rendezvous), else cdp_schedule_build_ex. */
cdp_status cdp_schedule_for_file(const char *path, enum cdp_schedule_kind kind, int p, int v, int m, int tied,
                                 int rendezvous, struct cdp_schedule **out);
/* The same for the plan's file (/parallel/schedule_file; the planner, before
 * a layout exists) and for a layout's (what runs: the executor, --schedule,
 * the layout's memory), with m micro-batches. */
cdp_status cdp_schedule_for_plan(const struct cdp_plan *plan, enum cdp_schedule_kind kind, int p, int v, int m,
                                 int tied, int rendezvous, struct cdp_schedule **out);
cdp_status cdp_schedule_for_layout(const struct cdp_layout *l, int m, int tied, int rendezvous,
                                   struct cdp_schedule **out);

/* Activations a rank keeps, for tests and the simulator: the maximum over its
 * list of (micro-batches taken - BACKWARDs and BACKWARD_WEIGHTs issued), each
 * (mb, chunk) counting one from the RECV_ACT of its input (the FORWARD when
 * it receives none), as the executor takes a slot: a split backward frees
 * the activations at its W.
 * 1f1b gives p - rank when m >= p; gpipe gives m; zb-h1 p. */
int cdp_schedule_peak_in_flight(const struct cdp_schedule *s, int rank);

/* W-states a rank keeps: the maximum over its list of (BACKWARD_INPUTs issued
 * - BACKWARD_WEIGHTs issued); 0 for lists that do not split the backward. */
int cdp_schedule_peak_w_pending(const struct cdp_schedule *s, int rank);

#ifdef __cplusplus
}
#endif

#endif
