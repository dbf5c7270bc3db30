/* Suite simulate: the discrete-event simulator against closed forms (bubble,
 * step time, a transfer on a known link, the ring all-reduce, activations in
 * flight), determinism, and `cdphybrid --plan P --simulate` through the binary. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

#define NDEV 8

/* A simulation of equal stages (forward tf, backward tb per rank, split evenly
 * over v chunks) on NDEV devices, stage s of replica r on device r*p + s. */
struct fixture {
    struct cdp_schedule *sched;
    struct cdp_sim_vstage vs[64];
    int device[64];
    double bw[NDEV * NDEV], lat[NDEV * NDEV];
    struct cdp_sim_config c;
};

static void setup_fx(struct fixture *f, enum cdp_schedule_kind kind, int p, int v, int m, int R, double tf,
                     double tb)
{
    memset(f, 0, sizeof *f);
    cr_assert_eq(cdp_schedule_build(kind, p, v, m, 0, &f->sched), CDP_OK, "%s", cdp_last_error());
    for (int k = 0; k < p * v; k++) f->vs[k] = (struct cdp_sim_vstage){.fwd_s = tf / v, .bwd_s = tb / v};
    for (int s = 0; s < p; s++)
        for (int r = 0; r < R; r++) f->device[s * R + r] = r * p + s;
    f->c = (struct cdp_sim_config){.sched = f->sched, .replicas = R, .vstage = f->vs, .device = f->device,
                                   .n_devices = NDEV, .bandwidth = f->bw, .latency = f->lat,
                                   .samples_per_mb = 1};
}

static struct cdp_sim_result *run_fx(struct fixture *f)
{
    struct cdp_sim_result *r = NULL;
    cr_assert_eq(cdp_sim_run(&f->c, &r), CDP_OK, "%s", cdp_last_error());
    return r;
}

static void done_fx(struct fixture *f, struct cdp_sim_result *r)
{
    cdp_sim_result_free(r);
    cdp_schedule_free(f->sched);
}

/* GPipe and 1F1B, equal stages, no communication: the phase is (m+p-1)(tf+tb)
 * and every rank works m(tf+tb) of it, so the bubble is (p-1)/(m+p-1) and,
 * with no all-reduce or optimizer time, the step is the phase. tf and tb are
 * powers of two so the sums are exact. */
Test(simulate, gpipe_and_1f1b_closed_forms)
{
    const int ps[] = {1, 2, 3, 4, 8}, ms[] = {1, 2, 3, 4, 8, 16};
    for (int kind = CDP_SCHEDULE_GPIPE; kind <= CDP_SCHEDULE_1F1B; kind++)
        for (size_t a = 0; a < sizeof ps / sizeof *ps; a++)
            for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) {
                const int p = ps[a], m = ms[b];
                struct fixture f;
                setup_fx(&f, (enum cdp_schedule_kind)kind, p, 1, m, 1, 1.0, 2.0);
                struct cdp_sim_result *r = run_fx(&f);
                const double want = (double)(p - 1) / (m + p - 1);
                cr_expect_float_eq(r->bubble, want, 1e-12, "%s p=%d m=%d: bubble %.15g, want %.15g",
                                   cdp_schedule_name(kind), p, m, r->bubble, want);
                cr_expect_float_eq(r->bubble, cdp_sim_bubble_closed_form(p, 1, m), 1e-12);
                cr_expect_eq(r->step_s, (m + p - 1) * 3.0, "%s p=%d m=%d: step %.15g", cdp_schedule_name(kind),
                             p, m, r->step_s);
                cr_expect_eq(r->phase_s, r->step_s);
                cr_expect_float_eq(r->samples_per_s, m / r->step_s, 1e-12);
                done_fx(&f, r);
            }
}

/* Interleaved 1F1B, v chunks of tf/v and tb/v: Megatron's bubble time is
 * (p-1)(tf+tb)/v against an ideal m(tf+tb), their ratio (p-1)/(v m) being the
 * paper's "bubble time fraction". As the idle share of the phase (the
 * executor's definition, used here) that is ((p-1)/v) / (m + (p-1)/v)
 * = (p-1)/(v m + p-1): the same reduction by v, over the whole phase. */
Test(simulate, interleaved_closed_form)
{
    const int ps[] = {2, 4}, vs[] = {2, 3}, mult[] = {1, 2, 4};
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 3; c++) {
                const int p = ps[a], v = vs[b], m = p * mult[c];
                struct fixture f;
                setup_fx(&f, CDP_SCHEDULE_INTERLEAVED, p, v, m, 1, 1.0 * v, 2.0 * v);
                struct cdp_sim_result *r = run_fx(&f);
                const double want = (double)(p - 1) / ((double)v * m + p - 1);
                cr_expect_float_eq(r->bubble, want, 1e-12, "p=%d v=%d m=%d: bubble %.15g, want %.15g", p, v,
                                   m, r->bubble, want);
                /* the phase: m(tf+tb) of work plus (p-1)(tf+tb)/v of fill and drain */
                cr_expect_float_eq(r->step_s, (m * v + p - 1) * 3.0, 1e-9, "p=%d v=%d m=%d: step %.15g", p, v,
                                   m, r->step_s);
                done_fx(&f, r);
            }
}

/* Two stages, one micro-batch, 1 MB over a 1 GB/s link with 10 us latency:
 * each direction adds latency + bytes/bandwidth. */
Test(simulate, transfer_on_a_known_link)
{
    struct fixture f;
    setup_fx(&f, CDP_SCHEDULE_1F1B, 2, 1, 1, 1, 1.0, 2.0);
    f.vs[0].out_bytes = 1e6; /* stage 0's output (and its gradient coming back) */
    f.vs[1].out_bytes = 4;   /* the loss side sends nothing onward */
    f.bw[0 * NDEV + 1] = f.bw[1 * NDEV + 0] = 1e9;
    f.lat[0 * NDEV + 1] = f.lat[1 * NDEV + 0] = 1e-5;
    struct cdp_sim_result *r = run_fx(&f);
    const double xfer = 1e-5 + 1e6 / 1e9;
    cr_expect_float_eq(r->step_s, 2 * 3.0 + 2 * xfer, 1e-12, "step %.15g", r->step_s);
    cr_assert_eq(r->n_links, 2);
    for (int l = 0; l < 2; l++) {
        cr_expect_eq(r->links[l].bytes, 1e6);
        cr_expect_float_eq(r->links[l].busy_s, 1e-3, 1e-12);
    }
    done_fx(&f, r);
}

/* Two forwards of an instant stage 0 leave at once and share the link: both
 * arrive after 2 x bytes/bandwidth, so stage 1 starts at 2 ms, not 1 ms. */
Test(simulate, concurrent_transfers_share_a_link)
{
    struct fixture f;
    setup_fx(&f, CDP_SCHEDULE_GPIPE, 2, 1, 2, 1, 1.0, 2.0);
    f.vs[0].fwd_s = 0;
    f.vs[0].out_bytes = 1e6;
    f.bw[0 * NDEV + 1] = f.bw[1 * NDEV + 0] = 1e9;
    struct cdp_sim_result *r = run_fx(&f);
    double first = INFINITY;
    for (int64_t i = 0; i < r->n_events; i++)
        if (r->events[i].rank == 1 && r->events[i].kind == CDP_EV_FORWARD)
            first = fmin(first, (double)r->events[i].start_ns);
    cr_expect_eq(first, 2e6, "stage 1 starts at %g ns", first);
    done_fx(&f, r);
}

/* Ring all-reduce: 2(n-1)/n x bytes over the slowest ring link + 2(n-1) latencies. */
Test(simulate, allreduce_ring)
{
    struct fixture f;
    setup_fx(&f, CDP_SCHEDULE_1F1B, 1, 1, 1, 2, 1.0, 2.0);
    f.vs[0].grad_bytes = 1e9;
    f.vs[0].opt_s = 0.25;
    f.bw[0 * NDEV + 1] = f.bw[1 * NDEV + 0] = 1e10;
    f.lat[0 * NDEV + 1] = f.lat[1 * NDEV + 0] = 1e-5;
    struct cdp_sim_result *r = run_fx(&f);
    cr_expect_float_eq(r->step_s, 3.0 + (1e9 / 1e10 + 2e-5) + 0.25, 1e-12, "step %.15g", r->step_s);
    cr_expect_eq(r->bubble, 0);
    done_fx(&f, r);

    /* four replicas, one slow hop (2 -> 3): it bounds the ring */
    setup_fx(&f, CDP_SCHEDULE_1F1B, 1, 1, 1, 4, 1.0, 2.0);
    f.vs[0].grad_bytes = 1e9;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) f.bw[a * NDEV + b] = a == b ? 0 : 1e10;
    f.bw[2 * NDEV + 3] = 1e9;
    r = run_fx(&f);
    cr_expect_float_eq(r->step_s, 3.0 + 2.0 * 3 / 4 * 1e9 / 1e9, 1e-12, "step %.15g", r->step_s);
    done_fx(&f, r);
}

/* Gradient buckets (issue 17), as the executor runs them: bucket b starts
 * once bucket_ready[b] of the last backward has passed (and the previous one
 * is done), each its share of the all-reduce's time. One stage of two
 * replicas, m = 1, backward [1, 3): the first half is ready at 2 and done at
 * 2.05, the second at 3 and 3.05, so the step is 0.05 shorter than one
 * reduction after the backward, and the all-reduce's event starts at 2. */
Test(simulate, gradient_buckets_overlap_the_last_backward)
{
    struct fixture f;
    setup_fx(&f, CDP_SCHEDULE_1F1B, 1, 1, 1, 2, 1.0, 2.0);
    f.vs[0].grad_bytes = 1e9;
    f.vs[0].opt_s = 0.25;
    f.bw[0 * NDEV + 1] = f.bw[1 * NDEV + 0] = 1e10;
    struct cdp_sim_result *r = run_fx(&f);
    cr_expect_float_eq(r->step_s, 3.0 + 0.1 + 0.25, 1e-12, "no buckets: step %.15g", r->step_s);
    done_fx(&f, r);
    setup_fx(&f, CDP_SCHEDULE_1F1B, 1, 1, 1, 2, 1.0, 2.0);
    f.vs[0].grad_bytes = 1e9;
    f.vs[0].opt_s = 0.25;
    f.bw[0 * NDEV + 1] = f.bw[1 * NDEV + 0] = 1e10;
    f.vs[0].n_buckets = 2;
    f.vs[0].bucket_share[0] = f.vs[0].bucket_share[1] = 0.5;
    f.vs[0].bucket_ready[0] = 0.5;
    f.vs[0].bucket_ready[1] = 1.0;
    r = run_fx(&f);
    cr_expect_float_eq(r->step_s, 3.0 + 0.05 + 0.25, 1e-12, "buckets: step %.15g", r->step_s);
    int seen = 0;
    for (int64_t i = 0; i < r->n_events; i++) {
        const struct cdp_event_rec *e = &r->events[i];
        if (e->kind != CDP_EV_ALLREDUCE) continue;
        seen++;
        cr_expect_float_eq((double)e->start_ns * 1e-9, 2.0, 1e-9, "rank %d: the all-reduce starts at %.9g", e->rank,
                           (double)e->start_ns * 1e-9);
        cr_expect_float_eq((double)(e->start_ns + e->dur_ns) * 1e-9, 3.05, 1e-9);
    }
    cr_expect_eq(seen, 2, "one all-reduce event per replica");
    done_fx(&f, r);
}

/* ZeRO-2 on one stage of two replicas, m micro-batches: after each backward
 * a reduce-scatter of the gradient ((R-1)/R of it on the ring), and at the
 * step's end the all-gather (the same); ZeRO-1 moves one all-reduce's bytes. */
Test(simulate, zero2_reduce_scatters_after_every_backward)
{
    struct fixture f;
    const double g = 1e9, bw = 1e10, lat = 1e-5;
    for (int z = 1; z <= 2; z++) {
        setup_fx(&f, CDP_SCHEDULE_1F1B, 1, 1, 3, 2, 1.0, 2.0);
        f.c.zero = z;
        f.vs[0].grad_bytes = g;
        f.bw[0 * NDEV + 1] = f.bw[1 * NDEV + 0] = bw;
        f.lat[0 * NDEV + 1] = f.lat[1 * NDEV + 0] = lat;
        struct cdp_sim_result *r = run_fx(&f);
        const double rs = 0.5 * g / bw + lat; /* one reduce-scatter or all-gather of two ranks */
        const double want = z == 2 ? 3 * (3.0 + rs) + rs : 3 * 3.0 + 2 * rs;
        cr_expect_float_eq(r->step_s, want, 1e-9, "zero %d: step %.15g, expected %.15g", z, r->step_s, want);
        double bytes = 0;
        for (int l = 0; l < r->n_links; l++) bytes += r->links[l].bytes;
        const double moved = (z == 2 ? 4 : 2) * 0.5 * g * 2; /* both directions of the ring */
        cr_expect_float_eq(bytes, moved, 1e-3, "zero %d: %.0f bytes on the links, expected %.0f", z, bytes, moved);
        done_fx(&f, r);
    }
}

/* Activations in flight: 1F1B holds p - s on stage s (stage 0 the most, p),
 * GPipe m everywhere, as the schedule's own count says. (Memory itself is the
 * layout's, cdp_layout_memory: suite layout checks it against the executor.) */
Test(simulate, activations_in_flight)
{
    const int p = 4, m = 8;
    struct fixture f;
    setup_fx(&f, CDP_SCHEDULE_1F1B, p, 1, m, 1, 1.0, 2.0);
    struct cdp_sim_result *r = run_fx(&f);
    for (int s = 0; s < p; s++) {
        cr_expect_eq(r->peak_in_flight[s], p - s, "1f1b stage %d: %d in flight", s, r->peak_in_flight[s]);
        cr_expect_eq(r->peak_in_flight[s], cdp_schedule_peak_in_flight(f.sched, s));
    }
    done_fx(&f, r);
    setup_fx(&f, CDP_SCHEDULE_GPIPE, p, 1, m, 1, 1.0, 2.0);
    r = run_fx(&f);
    for (int s = 0; s < p; s++) cr_expect_eq(r->peak_in_flight[s], m);
    done_fx(&f, r);
}

/* Ranks sharing a processor (ranks bound to one core, or on one GPU) each
 * compute at its share while they compute together: two replicas on one
 * processor take twice as long; a whole pipeline on one processor keeps it
 * busy with no gaps, so its step is all the ranks' compute; ranks with a
 * processor each are as before. */
Test(simulate, ranks_sharing_a_processor_share_its_time)
{
    struct fixture f;
    int proc[8];
    /* 1 stage x 2 replicas on one processor: every micro-batch at half speed */
    setup_fx(&f, CDP_SCHEDULE_1F1B, 1, 1, 4, 2, 1.0, 2.0);
    proc[0] = proc[1] = 0;
    f.c.proc = proc;
    struct cdp_sim_result *r = run_fx(&f);
    cr_expect_float_eq(r->step_s, 2 * 4 * 3.0, 1e-9, "step %.9g", r->step_s);
    cr_expect_float_eq(r->busy_s[0], 2 * 4 * 3.0, 1e-9, "busy is wall time of its compute: %.9g", r->busy_s[0]);
    done_fx(&f, r);
    /* 4 stages on one processor: work-conserving, the sum of every rank's compute */
    setup_fx(&f, CDP_SCHEDULE_1F1B, 4, 1, 8, 1, 1.0, 2.0);
    for (int s = 0; s < 4; s++) proc[s] = 0;
    f.c.proc = proc;
    r = run_fx(&f);
    cr_expect_float_eq(r->step_s, 4 * 8 * 3.0, 1e-9, "step %.9g", r->step_s);
    done_fx(&f, r);
    /* two pairs of stages: each pair shares; faster than one processor, slower than four */
    setup_fx(&f, CDP_SCHEDULE_1F1B, 4, 1, 8, 1, 1.0, 2.0);
    proc[0] = proc[1] = 0;
    proc[2] = proc[3] = 1;
    f.c.proc = proc;
    r = run_fx(&f);
    const double two = r->step_s;
    cdp_sim_result_free(r);
    for (int s = 0; s < 4; s++) proc[s] = s;
    r = run_fx(&f);
    cr_expect_float_eq(r->step_s, (8 + 3) * 3.0, 1e-9, "one each: the closed form (m+p-1)(tf+tb), %.9g", r->step_s);
    cr_expect(two > r->step_s && two < 4 * 8 * 3.0, "shared pairs %.9g between %.9g and %.9g", two, r->step_s,
              4 * 8 * 3.0);
    done_fx(&f, r);
    /* a processor index outside 0..p*R-1 */
    setup_fx(&f, CDP_SCHEDULE_GPIPE, 2, 1, 2, 1, 1.0, 1.0);
    proc[0] = 0;
    proc[1] = 7;
    f.c.proc = proc;
    struct cdp_sim_result *bad = NULL;
    cr_expect_eq(cdp_sim_run(&f.c, &bad), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "processor 7"), "%s", cdp_last_error());
    cdp_schedule_free(f.sched);
}

/* Same input, same output, byte for byte, with communication and sharing. */
Test(simulate, deterministic)
{
    struct cdp_sim_result *r[2];
    struct fixture f[2];
    for (int t = 0; t < 2; t++) {
        setup_fx(&f[t], CDP_SCHEDULE_INTERLEAVED, 2, 2, 4, 2, 1.0, 2.0);
        for (int k = 0; k < 4; k++) {
            f[t].vs[k].out_bytes = 3e5 * (k + 1);
            f[t].vs[k].grad_bytes = 1e7;
        }
        for (int a = 0; a < NDEV; a++)
            for (int b = 0; b < NDEV; b++) {
                f[t].bw[a * NDEV + b] = a == b ? 0 : 1e9 * (1 + (a + b) % 3);
                f[t].lat[a * NDEV + b] = a == b ? 0 : 3e-6;
            }
        r[t] = run_fx(&f[t]);
    }
    cr_assert_eq(r[0]->n_events, r[1]->n_events);
    cr_expect_eq(memcmp(r[0]->events, r[1]->events, (size_t)r[0]->n_events * sizeof *r[0]->events), 0);
    cr_expect_eq(r[0]->step_s, r[1]->step_s);
    cr_expect_eq(r[0]->bubble, r[1]->bubble);
    cr_assert_eq(r[0]->n_links, r[1]->n_links);
    cr_expect_eq(memcmp(r[0]->links, r[1]->links, (size_t)r[0]->n_links * sizeof *r[0]->links), 0);
    for (int t = 0; t < 2; t++) done_fx(&f[t], r[t]);
}

/* --- the command line --- */

Test(simulate, cli_gpu_plan_text_and_json)
{
    const char *plan = cdp_test_source_path("examples/gpt2-dgx.json");
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--simulate", NULL}), 0);
    cr_expect_eq(run.exit_code, 0, "stderr: %s", run.err);
    cr_expect(strstr(run.out, "step time") && strstr(run.out, "bubble") && strstr(run.out, "samples/s") &&
                  strstr(run.out, "Busiest links"), "%s", run.out);
    /* the planner's placement ("topology" in the plan), searched exactly on 8 GPUs */
    cr_expect(strstr(run.out, "placement   exact"), "placement note missing: %s", run.out);
    cdp_test_run_free(&run);

    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--simulate", "--json", NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "stderr: %s", run.err);
    json_error_t e;
    json_t *j = json_loads(run.out, 0, &e);
    cr_assert(j, "not JSON: %s", e.text);
    json_t *pr = json_object_get(j, "predicted");
    cr_expect(json_real_value(json_object_get(pr, "step_s")) > 0);
    const double bubble = json_real_value(json_object_get(pr, "bubble"));
    cr_expect(bubble > 0 && bubble < 0.5, "bubble %g", bubble);
    cr_expect_float_eq(json_real_value(json_object_get(pr, "bubble_closed_form")), 3.0 / (2 * 16 + 3), 1e-9);
    cr_expect_eq(json_array_size(json_object_get(j, "stages")), 4);
    cr_expect_eq(json_array_size(json_object_get(j, "placement")), 8);
    cr_expect_eq(json_array_size(json_object_get(pr, "peak_memory_bytes")), 8);
    json_decref(j);
    cdp_test_run_free(&run);
}

Test(simulate, cli_cpu_plan_writes_trace_and_timeline)
{
    const char *dir = cdp_test_tmpdir();
    char trace[512], svg[512];
    snprintf(trace, sizeof trace, "%s/pred.json", dir);
    snprintf(svg, sizeof svg, "%s/pred.svg", dir);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", cdp_test_source_path("examples/pipeline.json"),
                                                          "--simulate", "--trace", trace, "--timeline", svg, NULL}),
                 0);
    cr_expect_eq(run.exit_code, 0, "stderr: %s", run.err);
    cr_expect(strstr(run.out, "CPU devices"), "%s", run.out);
    cdp_test_run_free(&run);
    char *t = cdp_test_read_file(trace), *s = cdp_test_read_file(svg);
    cr_assert(t && s, "trace or timeline not written");
    cr_expect(strstr(t, "traceEvents") && strstr(t, "forward") && strstr(t, "backward"));
    cr_expect(strstr(s, "<svg"));
    free(t);
    free(s);
}

/* The predicted trace has the measured trace's communication (issue 19): on
 * each rank's comm track (tid ranks + rank) its sends and receives (with the
 * peer's rank and bytes), and one all-reduce of the gradients per rank among
 * its stage's 2 replicas; the run says where both files went. */
Test(simulate, predicted_trace_has_comm_events_per_rank)
{
    const char *dir = cdp_test_tmpdir();
    char trace[512], svg[512], want[600];
    snprintf(trace, sizeof trace, "%s/pred.json", dir);
    snprintf(svg, sizeof svg, "%s/pred.svg", dir);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", cdp_test_source_path("examples/pipeline.json"),
                                                          "--simulate", "--trace", trace, "--timeline", svg, NULL}),
                 0);
    cr_assert_eq(run.exit_code, 0, "stderr: %s", run.err);
    snprintf(want, sizeof want, "trace written to %s\n", trace);
    cr_expect(strstr(run.out, want), "no \"%s\" in %s", want, run.out);
    snprintf(want, sizeof want, "timeline written to %s\n", svg);
    cr_expect(strstr(run.out, want), "no \"%s\" in %s", want, run.out);
    cdp_test_run_free(&run);
    json_error_t e;
    json_t *j = json_load_file(trace, 0, &e);
    cr_assert(j, "%s: %s", trace, e.text);
    int sends[4] = {0}, recvs[4] = {0}, allreduce[4] = {0};
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(j, "traceEvents"), i, ev) {
        const char *cat = json_string_value(json_object_get(ev, "cat"));
        if (!cat || strcmp(cat, "comm")) continue;
        const int tid = (int)json_integer_value(json_object_get(ev, "tid"));
        cr_assert(tid >= 4, "comm event on tid %d", tid); /* rank tid % 4's comm tracks */
        const char *name = json_string_value(json_object_get(ev, "name"));
        json_t *args = json_object_get(ev, "args");
        cr_assert_gt(json_integer_value(json_object_get(args, "bytes")), 0, "%s", name);
        if (!strncmp(name, "send", 4) || !strncmp(name, "recv", 4)) {
            const int peer = (int)json_integer_value(json_object_get(args, "peer"));
            cr_assert(peer >= 0 && peer < 4 && peer != tid % 4, "%s of rank %d with %d", name, tid % 4, peer);
            if (name[0] == 's') sends[tid % 4]++;
            else recvs[tid % 4]++;
        } else if (!strcmp(name, "all-reduce")) {
            cr_assert_eq(json_integer_value(json_object_get(args, "ranks")), 2);
            allreduce[tid % 4]++;
        }
    }
    for (int r = 0; r < 4; r++) {
        /* 4 micro-batches: activations one way, gradients the other */
        cr_expect_eq(sends[r], 4, "rank %d: %d sends", r, sends[r]);
        cr_expect_eq(recvs[r], 4, "rank %d: %d receives", r, recvs[r]);
        cr_expect_eq(allreduce[r], 1, "rank %d: %d all-reduces", r, allreduce[r]);
    }
    json_decref(j);
    /* a 1F1B run: the timeline's legend names forward and backward, not a split backward's I and W */
    char *s = cdp_test_read_file(svg);
    cr_assert_not_null(s);
    cr_expect(strstr(s, ">forward</text>") && strstr(s, ">backward</text>"), "%s", s);
    cr_expect(!strstr(s, "input grad (I)") && !strstr(s, "weight grad (W)"), "I and W in a 1F1B legend: %.400s", s);
    free(s);
}

/* --simulate plans what the plan leaves "auto", as training would. */
Test(simulate, cli_auto_counts_are_planned)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(
        dir, "auto.json",
        "{\"model\": {\"preset\": \"mlp\", \"input\": [8], \"hidden\": [16], \"classes\": 4},"
        " \"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 1, \"micro_batch\": 2},"
        " \"parallel\": {\"stages\": \"auto\", \"replicas\": 1, \"micro_batches\": 2},"
        " \"cluster\": {\"backend\": \"cpu\", \"devices\": 2}}");
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--simulate", "--json", NULL}), 0);
    cr_expect_eq(run.exit_code, 0, "stdout %s stderr %s", run.out, run.err);
    json_error_t e;
    json_t *j = json_loads(run.out, 0, &e);
    cr_assert(j, "not JSON: %s", run.out);
    const size_t stages = json_array_size(json_object_get(j, "stages"));
    cr_expect(stages == 1 || stages == 2, "%zu stages", stages);
    cr_expect_eq(json_array_size(json_object_get(j, "placement")), stages);
    json_decref(j);
    cdp_test_run_free(&run);
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--trace", "x.json", NULL}), 0);
    cr_expect_eq(run.exit_code, 2, "--trace without --simulate: %s", run.err);
    cdp_test_run_free(&run);
}

/* More CPU ranks than the planner plans: an error naming the key, not a 32 GB
 * link matrix (issue 18). */
Test(simulate, cpu_ranks_past_the_device_limit_name_their_key)
{
    const char *plan = cdp_test_write_file(cdp_test_tmpdir(), "many.json",
                                           "{\"model\": {\"preset\": \"gpt\", \"layers\": 2}, "
                                           "\"parallel\": {\"stages\": 2, \"replicas\": 32768}, "
                                           "\"cluster\": {\"backend\": \"cpu\"}}");
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--dry-run", NULL}), 0);
    cr_expect_eq(run.exit_code, 2, "stderr: %s", run.err);
    cr_expect(strstr(run.err, "/parallel/stages: 1 nodes x 65536 CPU devices") &&
                  strstr(run.err, "at most 10240 devices"),
              "%s", run.err);
    cdp_test_run_free(&run);
}

/* A unit whose scratch fits no device ends the search at once, naming the
 * unit (it took minutes to find no fit among 1,000 units' splits). */
Test(simulate, a_unit_too_large_for_every_device_is_named_at_once, .timeout = 60)
{
    const char *plan = cdp_test_write_file(cdp_test_tmpdir(), "long.json",
                                           "{\"model\": {\"preset\": \"gpt\", \"context\": 1048576, \"heads\": 16, "
                                           "\"embed\": 64, \"layers\": 1024}, \"train\": {\"micro_batch\": 16}, "
                                           "\"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\"}, "
                                           "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"8 x dgx-a100\"}}");
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--dry-run", NULL}), 0);
    cr_expect_eq(run.exit_code, 2, "stderr: %s", run.err);
    cr_expect(strstr(run.err, "planner: unit 1 (transformer_block) alone needs 4.05 TiB of scratch for a micro-batch "
                              "of 16, more than the largest device has (80.00 GiB)"),
              "%s", run.err);
    cdp_test_run_free(&run);
}

/* ---- zero bubble ------------------------------------------------------------ */

/* Equal stages of a split backward: forward tf, input gradient tb and weight
 * gradient tw per rank, each split evenly over v chunks; no communication. */
static void setup_split(struct fixture *f, enum cdp_schedule_kind kind, int p, int v, int m, double tf, double tb,
                        double tw)
{
    setup_fx(f, kind, p, v, m, 1, tf, tb + tw);
    for (int k = 0; k < p * v; k++) f->vs[k].bwd_w_s = tw / v;
}

/* The closed forms of docs/simulator.md at T_F = T_B = T_W = 1 (powers of two
 * throughout, so the sums are exact): zb-h1 and zb-h2 idle p - 1 of a step of
 * 3m + p - 1 on every rank, so the bubble is (p-1) / (3m + p - 1), a third of
 * 1F1B's (p-1)/(m+p-1) in time ((p-1) against 3(p-1)); zbv, chunks of 1/2,
 * idles (p - 1 + max(0, 2p - 2 - m)) / 2 of a step of (6m + p - 1 + max(0,
 * 2p - 2 - m)) / 2. Over p = 2..8 and m = p..4p. */
Test(simulate, zero_bubble_closed_forms)
{
    for (int p = 2; p <= 8; p++)
        for (int m = p; m <= 4 * p; m++) {
            const enum cdp_schedule_kind kinds[] = {CDP_SCHEDULE_ZB_H1, CDP_SCHEDULE_ZB_H2, CDP_SCHEDULE_ZBV};
            for (int k = 0; k < 3; k++) {
                const int v = kinds[k] == CDP_SCHEDULE_ZBV ? 2 : 1;
                struct fixture f;
                setup_split(&f, kinds[k], p, v, m, 1.0, 1.0, 1.0);
                struct cdp_sim_result *r = run_fx(&f);
                double idle = p - 1, step = 3.0 * m + p - 1;
                if (v == 2) {
                    const int extra = 2 * p - 2 - m > 0 ? 2 * p - 2 - m : 0;
                    idle = (p - 1 + extra) / 2.0;
                    step = (6.0 * m + p - 1 + extra) / 2.0;
                }
                cr_expect_eq(r->step_s, step, "%s p=%d m=%d: step %.15g, want %.15g", cdp_schedule_name(kinds[k]),
                             p, m, r->step_s, step);
                cr_expect_float_eq(r->bubble, idle / step, 1e-12, "%s p=%d m=%d: bubble %.15g, want %.15g",
                                   cdp_schedule_name(kinds[k]), p, m, r->bubble, idle / step);
                cr_expect_float_eq(r->bubble, cdp_sim_bubble_closed_form_kind(kinds[k], p, v, m), 1e-12, "%s p=%d m=%d",
                                   cdp_schedule_name(kinds[k]), p, m);
                for (int s = 0; s < p; s++) {
                    cr_expect_eq(r->peak_in_flight[s], cdp_schedule_peak_in_flight(f.sched, s));
                    cr_expect_eq(r->peak_w_pending[s], cdp_schedule_peak_w_pending(f.sched, s));
                    cr_expect_float_eq(r->busy_s[s], 3.0 * m, 1e-12);
                }
                done_fx(&f, r);
            }
            /* the same pipeline under 1F1B with the backward unsplit (tb + tw): 3(p-1) idle */
            struct fixture f;
            setup_fx(&f, CDP_SCHEDULE_1F1B, p, 1, m, 1, 1.0, 2.0);
            struct cdp_sim_result *r = run_fx(&f);
            cr_expect_eq(r->step_s, 3.0 * (m + p - 1));
            done_fx(&f, r);
        }
}

/* A weight gradient cheaper than the forward (tw = 1/2): zb-h1 idles (p-1)
 * (tf + tb - tw), the paper's figure, while zb-h2's deeper warm-up keeps it
 * at (p-1) tf, the start-up no schedule avoids, once m >= 2p. */
Test(simulate, zb_h2_fills_what_zb_h1_cannot)
{
    for (int p = 2; p <= 8; p *= 2)
        for (int m = 2 * p; m <= 4 * p; m += p) {
            struct fixture f;
            setup_split(&f, CDP_SCHEDULE_ZB_H1, p, 1, m, 1.0, 1.0, 0.5);
            struct cdp_sim_result *r = run_fx(&f);
            cr_expect_eq(r->step_s, 2.5 * m + 1.5 * (p - 1), "zb-h1 p=%d m=%d: %.15g", p, m, r->step_s);
            done_fx(&f, r);
            setup_split(&f, CDP_SCHEDULE_ZB_H2, p, 1, m, 1.0, 1.0, 0.5);
            r = run_fx(&f);
            cr_expect_eq(r->step_s, 2.5 * m + (p - 1), "zb-h2 p=%d m=%d: %.15g", p, m, r->step_s);
            done_fx(&f, r);
        }
}

/* A unit without parameters has no weight gradient: the I takes the whole
 * backward and no W event is drawn; the trace names I and W apart. */
Test(simulate, split_backward_events)
{
    struct fixture f;
    setup_split(&f, CDP_SCHEDULE_ZB_H1, 2, 1, 2, 1.0, 1.0, 1.0);
    f.vs[1].bwd_w_s = 0; /* stage 1: nothing to weight-backward */
    struct cdp_sim_result *r = run_fx(&f);
    int ni[2] = {0, 0}, nw[2] = {0, 0};
    for (int64_t i = 0; i < r->n_events; i++) {
        const struct cdp_event_rec *e = &r->events[i];
        cr_assert_neq(e->kind, CDP_EV_BACKWARD);
        if (e->kind == CDP_EV_BACKWARD_INPUT) {
            ni[e->rank]++;
            cr_expect_float_eq(e->dur_ns / 1e9, e->rank ? 2.0 : 1.0, 1e-9);
        }
        if (e->kind == CDP_EV_BACKWARD_WEIGHT) nw[e->rank]++;
    }
    cr_expect_eq(ni[0], 2);
    cr_expect_eq(ni[1], 2);
    cr_expect_eq(nw[0], 2);
    cr_expect_eq(nw[1], 0);
    done_fx(&f, r);
}

/* A zbv plan simulated through the binary: the timeline draws input and
 * weight gradients in their own colours, with the legend; the trace names
 * them I and W by micro-batch and chunk; the closed form printed is zbv's. */
Test(simulate, cli_zbv_timeline_draws_i_and_w_apart)
{
    const char *dir = cdp_test_tmpdir();
    char trace[512], svg[512];
    const char *plan = cdp_test_write_file(
        dir, "zbv.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 64, \"context\": 16, \"layers\": 4, \"heads\": 2, \"embed\": 32}, "
        "\"train\": {\"micro_batch\": 2}, \"parallel\": {\"stages\": 2, \"replicas\": 1, \"micro_batches\": 4, "
        "\"schedule\": \"zbv\"}, \"cluster\": {\"backend\": \"cpu\"}}");
    snprintf(trace, sizeof trace, "%s/zbv-trace.json", dir);
    snprintf(svg, sizeof svg, "%s/zbv.svg", dir);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--simulate", "--trace", trace, "--timeline",
                                                          svg, NULL}),
                 0);
    cr_expect_eq(run.exit_code, 0, "stderr: %s", run.err);
    cr_expect(strstr(run.out, "zbv"), "%s", run.out);
    char want[64];
    snprintf(want, sizeof want, "(p-1+e)/(6m+p-1+e), e = max(0, 2p-2-m) = %.2f%%",
             100.0 * cdp_sim_bubble_closed_form_kind(CDP_SCHEDULE_ZBV, 2, 2, 4));
    cr_expect(strstr(run.out, want), "closed form %s: %s", want, run.out);
    cdp_test_run_free(&run);
    char *t = cdp_test_read_file(trace), *s = cdp_test_read_file(svg);
    cr_assert(t && s, "trace or timeline not written");
    cr_expect(strstr(t, "\"name\": \"I0 c1\"") && strstr(t, "\"name\": \"W3 c0\""), "I and W boxes by chunk");
    cr_expect(!strstr(t, "\"name\": \"B0"), "no combined backward");
    cr_expect(strstr(s, "input grad (I)") && strstr(s, "weight grad (W)"), "the legend");
    cr_expect(strstr(s, "fill=\"#e6550d\" stroke") && strstr(s, "fill=\"#31a354\" stroke"), "I and W boxes");
    cr_expect(strstr(s, "<title>backward input 0, chunk 1</title>"), "%s", s);
    free(t);
    free(s);
}

/* Tensor groups (issue 33): a group's all-reduces end the forward and the
 * backward they belong to, as events of their own on the rank's row; the
 * step is unchanged (they are part of fwd_s and bwd_s), and their bytes and
 * time land on the links of the group's ring (devices d, d+1 for t = 2). Two
 * stages, one replica: stage 0 on device 0 (group 0-1), stage 1 on device 2
 * (group 2-3). */
Test(simulate, tensor_all_reduces_are_events_on_the_group_ring)
{
    struct fixture f;
    setup_fx(&f, CDP_SCHEDULE_1F1B, 2, 1, 2, 1, 1.0, 2.0);
    f.device[0] = 0, f.device[1] = 2;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) f.bw[a * NDEV + b] = a == b ? 0 : 1e10;
    for (int k = 0; k < 2; k++) {
        f.vs[k].tp_fwd_s = 0.25;
        f.vs[k].tp_bwd_s = 0.5;
        f.vs[k].tp_fwd_bytes = 1e6;
        f.vs[k].tp_bwd_bytes = 2e6;
    }
    struct cdp_sim_result *plain = run_fx(&f);
    const double step = plain->step_s;
    cdp_sim_result_free(plain);
    f.c.tensor = 2;
    struct cdp_sim_result *r = run_fx(&f);
    cr_expect_float_eq(r->step_s, step, 1e-12);
    int tensor = 0, fwd = 0;
    for (int64_t i = 0; i < r->n_events; i++) {
        const struct cdp_event_rec *e = &r->events[i];
        if (e->kind == CDP_EV_TENSOR_REDUCE) {
            tensor++;
            cr_expect_eq(e->group, CDP_EV_GROUP_TENSOR);
            cr_expect_eq(e->members, 2);
            cr_expect(e->dur_ns == 250000000 || e->dur_ns == 500000000, "%llu", (unsigned long long)e->dur_ns);
        }
        if (e->kind == CDP_EV_FORWARD) cr_expect_eq(e->dur_ns, 750000000, "the forward's compute: 1 s - 0.25 s");
        fwd += e->kind == CDP_EV_FORWARD;
    }
    cr_expect_eq(tensor, 2 * fwd, "one after each forward and each backward");
    /* 2 micro-batches x (1e6 + 2e6) on each link of both rings */
    int rings = 0;
    for (int l = 0; l < r->n_links; l++) {
        const struct cdp_sim_link_stat *k = &r->links[l];
        if ((k->src ^ k->dst) == 1 && k->src / 2 == k->dst / 2) {
            rings++;
            cr_expect_float_eq(k->bytes, 6e6, 1e-6, "%d -> %d: %g", k->src, k->dst, k->bytes);
            cr_expect_float_eq(k->busy_s, 1.5, 1e-12);
        }
    }
    cr_expect_eq(rings, 4);
    done_fx(&f, r);
}

/* Tensor groups share their devices' ports with the data-parallel traffic:
 * one stage, two replicas of t = 2 (groups on devices 0-1 and 2-3), a
 * forward of 1 s and a backward of 2 s whose last 0.5 s is the group's
 * all-reduce, and the gradients (3 s on the ring) in two buckets, the first
 * ready a quarter into the backward: it runs from 1.5 s to 3 s, over the
 * tensor all-reduce's [2.5, 3). With both groups on one node the ring 0 -> 2
 * -> 0 leaves devices 0 and 2 by the ports the tensor rings take: the two
 * transfers on one port take the time of both, so the all-reduce ends 0.5 s
 * later than with the groups on two nodes (the same links, the network's
 * ports). */
Test(simulate, tensor_and_data_parallel_traffic_share_a_port)
{
    double end[2] = {0, 0}, step[2] = {0, 0};
    const int two_nodes[NDEV] = {0, 0, 1, 1, 2, 2, 3, 3};
    for (int split = 0; split < 2; split++) {
        struct fixture f;
        setup_fx(&f, CDP_SCHEDULE_1F1B, 1, 1, 1, 2, 1.0, 2.0);
        f.device[0] = 0, f.device[1] = 2;
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) f.bw[a * NDEV + b] = a == b ? 0 : 1e10;
        f.vs[0].tp_bwd_s = 0.5;
        f.vs[0].tp_bwd_bytes = 1e9;
        f.vs[0].grad_bytes = 3e10; /* 2 (R-1)/R x 3e10 over 1e10 B/s: 3 s */
        f.vs[0].opt_s = 0.25;
        f.vs[0].n_buckets = 2;
        f.vs[0].bucket_share[0] = f.vs[0].bucket_share[1] = 0.5;
        f.vs[0].bucket_ready[0] = 0.25;
        f.vs[0].bucket_ready[1] = 1.0;
        f.c.tensor = 2;
        f.c.node = split ? two_nodes : NULL;
        struct cdp_sim_result *r = run_fx(&f);
        step[split] = r->step_s;
        for (int64_t i = 0; i < r->n_events; i++) {
            const struct cdp_event_rec *e = &r->events[i];
            if (e->kind == CDP_EV_ALLREDUCE) end[split] = fmax(end[split], (double)(e->start_ns + e->dur_ns) * 1e-9);
            if (e->kind == CDP_EV_TENSOR_REDUCE)
                cr_expect_float_eq((double)e->start_ns * 1e-9, 2.5, 1e-9, "the tensor all-reduce ends the backward");
        }
        done_fx(&f, r);
    }
    cr_expect_float_eq(end[1], 4.5, 1e-9, "two nodes: buckets [1.5, 3) and [3, 4.5): %.9g", end[1]);
    cr_expect_float_eq(end[0], 5.0, 1e-9, "one node: 0.5 s of the first bucket's port held by the tensor ring: %.9g",
                       end[0]);
    cr_expect_float_eq(step[0] - step[1], 0.5, 1e-9, "%.9g %.9g", step[0], step[1]);
}
