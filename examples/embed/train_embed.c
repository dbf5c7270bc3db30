/* A program that embeds cdphybrid (docs/embedding.md): loads a plan, plans
 * it, simulates the planned layout and trains it, counting the steps in a
 * callback and checking that the loss is finite and falls.
 *
 *   cc train_embed.c $(pkg-config --cflags --libs cdphybrid) -o train_embed
 *   ./train_embed mlp.json                                  this process alone
 *   mpirun -np 2 ./train_embed mlp.json --stages 2 --mpi    2 ranks of a 2-stage layout
 *
 * Exit 0 when every check holds; 1 (with the reason on stderr) otherwise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cdp/planner.h>
#include <cdp/simulator.h>
#include <cdp/train.h>

struct progress {
    int64_t steps;             /* callbacks seen */
    double first_loss, last_loss;
    int bad;                   /* a loss that was not finite, or a step out of order */
};

static void on_step(const struct cdp_step_metrics *m, void *user)
{
    struct progress *p = user;
    if (!isfinite(m->loss) || m->step != p->steps + 1) p->bad = 1;
    if (p->steps == 0) p->first_loss = m->loss;
    p->last_loss = m->loss;
    p->steps++;
    if (m->rank == 0 && (m->step % 10 == 0 || !isnan(m->val_loss)))
        printf("step %lld/%lld  loss %.4f  grad_norm %.3f  %.0f samples/s%s\n", (long long)m->step,
               (long long)m->steps, m->loss, m->grad_norm, m->samples_per_s, isnan(m->val_loss) ? "" : "  (validated)");
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    long stages = 0;
    int mpi = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mpi")) mpi = 1;
        else if (!strcmp(argv[i], "--stages") && i + 1 < argc) stages = strtol(argv[++i], NULL, 10);
        else path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: train_embed PLAN [--stages N] [--mpi]\n");
        return 2;
    }

    /* 1. load: every error names the file, the key and what was expected */
    struct cdp_plan *plan = NULL;
    if (cdp_plan_load(path, &plan) != CDP_OK) {
        fprintf(stderr, "train_embed: %s\n", cdp_last_error());
        return 1;
    }
    if (stages > 0) plan->parallel.stages = stages; /* the loaded plan is plain data (cdp/plan_types.h) */

    /* 2. plan: NULL machine = no GPUs, NULL options = the analytic cost model */
    struct cdp_planned *planned = NULL;
    if (cdp_plan_layout(plan, NULL, NULL, &planned) != CDP_OK) {
        fprintf(stderr, "train_embed: %s\n", cdp_last_error());
        cdp_plan_free(plan);
        return 1;
    }
    const struct cdp_layout *l = cdp_planned_layout(planned);
    printf("planned: %d stages x %d replicas, %d micro-batches of %d, %s, %d ranks\n", cdp_layout_stages(l),
           cdp_layout_replicas(l), cdp_layout_micro_batches(l), cdp_layout_micro_batch(l),
           cdp_schedule_name(cdp_layout_schedule(l)), cdp_layout_ranks(l));

    /* 3. simulate the planned layout */
    struct cdp_simulation sim = CDP_SIMULATION_INIT;
    if (cdp_simulate(plan, planned, &sim) != CDP_OK) {
        fprintf(stderr, "train_embed: %s\n", cdp_last_error());
        cdp_planned_free(planned);
        cdp_plan_free(plan);
        return 1;
    }
    printf("simulated: step %.3f ms, bubble %.1f%%, peak memory %.0f bytes a rank\n", sim.step_s * 1e3,
           100 * sim.bubble, sim.peak_memory_bytes);

    /* 4. train, alone or as this rank of the MPI job */
    struct progress prog = {0};
    struct cdp_train_opts opts = CDP_TRAIN_OPTS_INIT;
    opts.world = mpi ? CDP_TRAIN_MPI : CDP_TRAIN_SELF;
    opts.on_step = on_step;
    opts.user = &prog;
    struct cdp_train_summary sum = CDP_TRAIN_SUMMARY_INIT;
    cdp_status st = cdp_train(plan, l, &opts, &sum);
    if (st != CDP_OK) {
        fprintf(stderr, "train_embed: %s (%s)\n", cdp_last_error(), cdp_status_str(st));
        if (mpi) cdp_train_abort(1); /* the other ranks may be waiting on this one */
        cdp_planned_free(planned);
        cdp_plan_free(plan);
        return 1;
    }
    const int64_t want = plan->train.steps;
    int ok = 1;
    if (prog.steps != want || sum.steps != want) {
        fprintf(stderr, "train_embed: %lld callbacks and %lld steps, expected %lld\n", (long long)prog.steps,
                (long long)sum.steps, (long long)want);
        ok = 0;
    }
    if (prog.bad || !(prog.last_loss < prog.first_loss)) {
        fprintf(stderr, "train_embed: the loss went from %g to %g%s\n", prog.first_loss, prog.last_loss,
                prog.bad ? " (a step was not finite or out of order)" : "");
        ok = 0;
    }
    /* %.9g: enough digits to compare a one-rank run with a layout's */
    printf("trained: %lld steps, loss %.9g -> %.9g, val_loss %.9g, %.0f samples/s\n", (long long)sum.steps,
           sum.first_loss, sum.last_loss, sum.val_loss, sum.samples_per_s);
    cdp_planned_free(planned);
    cdp_plan_free(plan);
    return ok ? 0 : 1;
}
