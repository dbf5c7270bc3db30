/* Internal to the schedule IR's files (pipeline/schedule*.c): the virtual
 * stage helpers, the builder the generators emit into, and what building,
 * validation and the rendezvous simulation share. Not for other files: the
 * interface is pipeline/schedule.h. */
#ifndef CDP_PIPELINE_SCHEDULE_INTERNAL_H
#define CDP_PIPELINE_SCHEDULE_INTERNAL_H

#include "cdp/core.h"
#include "pipeline/schedule.h"
#include "plan/schedule_kind.h"

/* Largest p * v * m a schedule may have: about 100 MB of lists. */
#define MAX_CELLS (1 << 20)

/* The placement of virtual stages (cdp_schedule_vstage and _place are these
 * with the kind's placement looked up): inline, since validation and the
 * rendezvous simulation ask for every instruction of lists of millions. V:
 * the kind places its two chunks in a V. */
static inline int sched_vstage_of(int V, int p, int v, int rank, int chunk)
{
    if (p < 1 || v < 1 || rank < 0 || rank >= p || chunk < 0 || chunk >= v) return -1;
    return V ? (chunk == 0 ? rank : 2 * p - 1 - rank) : chunk * p + rank;
}
static inline void sched_vstage_place_of(int V, int p, int v, int k, int *rank, int *chunk)
{
    CDP_ASSERT(p >= 1 && v >= 1 && k >= 0 && k < p * v);
    *rank = V ? (k < p ? k : 2 * p - 1 - k) : k % p;
    *chunk = V ? k >= p : k / p;
}
/* Whether s's chunks form a V; one chunk per rank never does, so the lists
 * of one chunk need no lookup of the kind. */
static inline int sched_v_shaped(const struct cdp_schedule *s)
{
    return s->v == 2 && cdp_schedule_def(s->kind)->placement == CDP_VSTAGE_V;
}
static inline int vstage(const struct cdp_schedule *s, int rank, int chunk)
{
    return sched_vstage_of(sched_v_shaped(s), s->p, s->v, rank, chunk);
}
static inline int vrank(const struct cdp_schedule *s, int k)
{
    int r, c;
    sched_vstage_place_of(sched_v_shaped(s), s->p, s->v, k, &r, &c);
    return r;
}
static inline int vchunk(const struct cdp_schedule *s, int k)
{
    int r, c;
    sched_vstage_place_of(sched_v_shaped(s), s->p, s->v, k, &r, &c);
    return c;
}
static inline int nvstages(const struct cdp_schedule *s) { return s->p * s->v; }
/* The ranks holding the first and the last virtual stage (the same under zbv
 * and with one rank): they load, and they reduce tied gradients when they differ. */
static inline int last_rank(const struct cdp_schedule *s) { return vrank(s, nvstages(s) - 1); }
static inline int tied_other(const struct cdp_schedule *s, int r) { return r == 0 ? last_rank(s) : 0; }

static inline int is_send(enum cdp_op op) { return op == CDP_OP_SEND_ACT || op == CDP_OP_SEND_GRAD; }
static inline int per_mb_op(enum cdp_op op) { return op >= CDP_OP_LOAD && op <= CDP_OP_BACKWARD_WEIGHT; }
static inline int is_comm(enum cdp_op op)
{
    return op == CDP_OP_SEND_ACT || op == CDP_OP_RECV_ACT || op == CDP_OP_SEND_GRAD ||
           op == CDP_OP_RECV_GRAD;
}

struct builder {
    struct cdp_schedule *s;
    int cap;        /* instructions allocated per rank */
    int rendezvous; /* lists for NCCL's rendezvous send/receive (cdp_schedule_build_ex) */
};

/* ---- schedule_build.c: the emitters (a receive right before the
 * instruction that needs it, a send right after the one that produced it) ---- */

void sched_emit(struct builder *b, int r, enum cdp_op op, int mb, int chunk, int peer);
void sched_emit_forward_in(struct builder *b, int r, int mb, int c);
void sched_emit_forward_out(struct builder *b, int r, int mb, int c);
void sched_emit_backward_in(struct builder *b, int r, int mb, int c);
void sched_emit_backward_out(struct builder *b, int r, int mb, int c);
void sched_emit_forward(struct builder *b, int r, int mb, int c);
void sched_emit_backward(struct builder *b, int r, int mb, int c);
void sched_emit_backward_input(struct builder *b, int r, int mb, int c);
void sched_emit_backward_weight(struct builder *b, int r, int mb, int c);

/* ---- schedule_gen.c: one generator per schedule family (rank r's list, or
 * every rank's) ---- */

void sched_gen_gpipe(struct builder *b, int r);
void sched_gen_1f1b(struct builder *b, int r);
void sched_gen_zb_h1(struct builder *b, int r);
cdp_status sched_gen_zb_h2(struct builder *b);
cdp_status sched_gen_zbv(struct builder *b, int r);
void sched_gen_interleaved(struct builder *b, int r);
void sched_gen_interleaved_batched(struct builder *b, int r);

/* ---- schedule_rendezvous.c ---- */

/* What travels: activation or gradient, micro-batch, and the sending virtual
 * stage. A send and a receive match when these are equal. */
struct wire {
    int grad, mb, from;
};

/* What instruction i of rank r sends or receives. */
struct wire sched_wire_of(const struct cdp_schedule *s, int r, const struct cdp_instr *in);
/* The lists run under rendezvous semantics: CDP_OK, or the deadlock named. */
cdp_status sched_rendezvous_run(const struct cdp_schedule *s);
/* Generator lists for NCCL: every deadlock under rendezvous semantics
 * resolved by delaying sends into the next group (or moving a receive up);
 * *moved: how many moves that took (0: the lists are as given, and proven
 * for both semantics). */
cdp_status sched_rendezvous_fix(struct cdp_schedule *s, int *moved);

#endif
