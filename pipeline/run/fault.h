/* CDP_FAULT, a testing knob: kill, stall or slow one rank at a chosen step,
 * kill it in the middle of writing a checkpoint, or signal it inside a
 * transfer, so that the tests can check how a job ends and resumes
 * (docs/pipeline.md, "Failures"). */
#ifndef CDP_PIPELINE_FAULT_H
#define CDP_PIPELINE_FAULT_H

#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "kill:RANK:STEP", "stall:RANK:STEP:SECONDS", "deverr:RANK:STEP" (the rank's
 * step fails as if its device had reported an error, CDP_ERR_DEVICE), "sigbus:RANK:STEP" (the rank gets
 * SIGBUS, as from a mapped file that shrank), "killsave:RANK:STEP:PHASE" (PHASE
 * part: before writing its part; commit: after it, before the manifest) or
 * "slow:RANK:FACTOR" (that rank's forward and backward take FACTOR times as
 * long, 1 to 1000) or "signal:RANK:STEP:SIG:N" (the rank raises SIG,
 * one of USR1, TERM, INT, KILL, in the N-th wait on its peers of that step,
 * N >= 1, while the transfer waited for is in flight; a raised SIGTERM is
 * taken as its launcher's). Any of them with "@A" after it is armed only in attempt A
 * of a run the launcher restarts (train.restart): CDP_RESTART_ATTEMPT, which
 * the launcher sets to 1, 2, ... for its restarts (absent: 0, the first). */
struct cdp_fault {
    int kill, stall, save, slow, deverr, sigbus, signal; /* which one is armed */
    int rank, step, seconds;
    int sig, nth;    /* signal: which signal, in which wait of the step */
    int waits, seen; /* signal: waits counted in step `seen` so far */
    double factor;
    char phase[16];
};

/* Reads CDP_FAULT; text that is none of the above is a warning and arms nothing. */
void cdp_fault_parse(struct cdp_fault *f);

/* At the start of `step` on `rank`: kill or stall it when armed for them, or
 * return the device error of deverr (else CDP_OK). */
cdp_status cdp_fault_at_step(const struct cdp_fault *f, int rank, int step);

/* While `rank` saves `step`'s checkpoint, at `phase` ("part", "commit"): killed when armed. */
void cdp_fault_in_save(const struct cdp_fault *f, int rank, int step, const char *phase);

/* The wait hook (cdp_comm_set_wait_hook) of a rank armed with signal: in
 * the N-th wait of `step` on `rank`, raises the signal. */
void cdp_fault_in_wait(struct cdp_fault *f, int rank, int step);

/* After compute that began at t0 (cdp_time_ns) on `rank`: sleeps (factor - 1)
 * times its length when armed with slow. */
void cdp_fault_slow_down(const struct cdp_fault *f, int rank, uint64_t t0);

#ifdef __cplusplus
}
#endif

#endif
