/* The CDP_FAULT testing knob (fault.h). */
#include "pipeline/run/fault.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"

/* The signals signal:RANK:STEP:SIG:N sends, by name; 0 for another. */
static int signal_of(const char *name)
{
    return !strcmp(name, "USR1")   ? SIGUSR1
           : !strcmp(name, "TERM") ? SIGTERM
           : !strcmp(name, "INT")  ? SIGINT
           : !strcmp(name, "KILL") ? SIGKILL
                                   : 0;
}

void cdp_fault_parse(struct cdp_fault *f)
{
    memset(f, 0, sizeof *f);
    const char *env = getenv("CDP_FAULT");
    if (!env) return;
    /* "...@A": only in attempt A of a run the launcher restarts (CDP_RESTART_ATTEMPT, 0 the first) */
    char v[128];
    snprintf(v, sizeof v, "%s", env);
    char *at = strchr(v, '@');
    int attempt = -1;
    if (at) {
        char *end = NULL;
        long a = strtol(at + 1, &end, 10);
        if (end == at + 1 || *end || a < 0 || a > 1000) {
            CDP_WARN(EXEC, "CDP_FAULT=\"%s\": the attempt after @ is not a number 0 to 1000; ignored", env);
            return;
        }
        attempt = (int)a;
        *at = '\0';
    }
    char name[8];
    if (sscanf(v, "killsave:%d:%d:%15s", &f->rank, &f->step, f->phase) == 3) f->save = 1;
    else if (sscanf(v, "kill:%d:%d", &f->rank, &f->step) == 2) f->kill = 1;
    else if (sscanf(v, "deverr:%d:%d", &f->rank, &f->step) == 2) f->deverr = 1;
    else if (sscanf(v, "sigbus:%d:%d", &f->rank, &f->step) == 2) f->sigbus = 1;
    else if (sscanf(v, "stall:%d:%d:%d", &f->rank, &f->step, &f->seconds) == 3) f->stall = 1;
    else if (sscanf(v, "signal:%d:%d:%7[A-Z0-9]:%d", &f->rank, &f->step, name, &f->nth) == 4 && f->nth >= 1 &&
             (f->sig = signal_of(name)))
        f->signal = 1;
    else if (sscanf(v, "slow:%d:%lf", &f->rank, &f->factor) == 2 && f->factor >= 1.0 && f->factor <= 1000.0)
        f->slow = 1;
    else CDP_WARN(EXEC, "CDP_FAULT=\"%s\" is not kill:RANK:STEP, stall:RANK:STEP:SECONDS, deverr:RANK:STEP, "
                  "sigbus:RANK:STEP, killsave:RANK:STEP:PHASE, signal:RANK:STEP:USR1|TERM|INT|KILL:N (N >= 1) or "
                  "slow:RANK:FACTOR (1 to 1000), with @ATTEMPT or without; ignored", env);
    const char *now = getenv("CDP_RESTART_ATTEMPT");
    if (attempt >= 0 && attempt != (now && *now ? atoi(now) : 0)) {
        CDP_DEBUG(EXEC, "CDP_FAULT=\"%s\" is for attempt %d; not armed", env, attempt);
        memset(f, 0, sizeof *f);
    }
}

cdp_status cdp_fault_at_step(const struct cdp_fault *f, int rank, int step)
{
    if (rank != f->rank || step != f->step) return CDP_OK;
    if (f->kill) raise(SIGKILL);
    if (f->sigbus) raise(SIGBUS);
    if (f->stall) sleep((unsigned)f->seconds);
    if (f->deverr) return cdp_fail(CDP_ERR_DEVICE, "CDP_FAULT=deverr:%d:%d: a device error, as a test asked", rank, step);
    return CDP_OK;
}

void cdp_fault_in_save(const struct cdp_fault *f, int rank, int step, const char *phase)
{
    if (f->save && rank == f->rank && step == f->step && !strcmp(phase, f->phase)) raise(SIGKILL);
}

void cdp_fault_in_wait(struct cdp_fault *f, int rank, int step)
{
    if (!f->signal || rank != f->rank || step != f->step) return;
    if (f->seen != step) f->seen = step, f->waits = 0;
    if (++f->waits != f->nth) return;
    f->signal = 0; /* once */
    /* raised, not sent: a rank takes SIGTERM that is not a user's (SI_USER) as its
     * launcher's, which is how a stop of the job reaches it */
    raise(f->sig);
}

void cdp_fault_slow_down(const struct cdp_fault *f, int rank, uint64_t t0)
{
    if (!f->slow || rank != f->rank) return;
    double extra = (double)(cdp_time_ns() - t0) * (f->factor - 1.0);
    if (extra <= 0) return;
    struct timespec ts = {(time_t)(extra / 1e9), (long)fmod(extra, 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
