/* Restarts of a launched job (restart.h): the ranks' last words, what failed,
 * the re-plan on what is left, the record. */
#include "cli/restart.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "partitioner/planner.h"

const char *const cdp_rank_end_words[] = {"", "done", "failed device", "failed comm", "failed other",
                                          "stopped waiting", "stopped busy", "killed", "stopped on request", NULL};

/* "..., step 5: ..." -> 5; "after step 5: ..." -> 6 (the next); else -1. */
static int64_t step_of(const char *where)
{
    const char *s = strstr(where, "after step ");
    if (s) return atoll(s + 11) + 1;
    s = strstr(where, ", step ");
    if (s) return atoll(s + 7);
    return -1;
}

cdp_status cdp_restart_read_ends(const char *dir, int n_ranks, int code, int died, struct cdp_job_end *out)
{
    memset(out, 0, sizeof *out);
    out->code = code;
    out->died = died >= 0 && died < n_ranks ? died : -1;
    out->n_ranks = n_ranks;
    out->end = calloc((size_t)n_ranks, sizeof *out->end);
    out->step = calloc((size_t)n_ranks, sizeof *out->step);
    if (!out->end || !out->step) {
        cdp_job_end_clear(out);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n_ranks; i++) {
        char path[4300], line[512] = "", where[512] = "", code_line[64] = "";
        snprintf(path, sizeof path, "%s/rank-%d.end", dir, i);
        out->step[i] = -1;
        FILE *f = fopen(path, "r");
        if (!f) continue; /* CDP_END_SILENT */
        if (!fgets(line, sizeof line, f)) line[0] = '\0';
        if (!fgets(where, sizeof where, f)) where[0] = '\0';
        int rc = 0; /* a failed rank's exit code, its word's third line */
        if (fgets(code_line, sizeof code_line, f) && sscanf(code_line, "exit %d", &rc) == 1 && rc > out->rank_code)
            out->rank_code = rc;
        fclose(f);
        line[strcspn(line, "\n")] = '\0';
        out->end[i] = CDP_END_FAILED_OTHER; /* a word this version does not know */
        for (int w = 1; cdp_rank_end_words[w]; w++)
            if (!strcmp(line, cdp_rank_end_words[w])) out->end[i] = (enum cdp_rank_end)w;
        out->step[i] = step_of(where);
    }
    return CDP_OK;
}

void cdp_job_end_clear(struct cdp_job_end *e)
{
    free(e->end);
    free(e->step);
    memset(e, 0, sizeof *e);
}

void cdp_fault_report_clear(struct cdp_fault_report *f)
{
    free(f->failed);
    memset(f, 0, sizeof *f);
}

cdp_status cdp_restart_decide(const struct cdp_layout *l, const struct cdp_job_end *e, int64_t metrics_last,
                              struct cdp_fault_report *out)
{
    memset(out, 0, sizeof *out);
    out->node = -1;
    out->step = -1;
    const int n = e->n_ranks;
    if (!(out->failed = calloc((size_t)n, sizeof *out->failed))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    int silent = 0, device = 0, comm = 0, other = 0;
    for (int i = 0; i < n; i++) {
        silent += e->end[i] == CDP_END_SILENT;
        device += e->end[i] == CDP_END_FAILED_DEVICE;
        comm += e->end[i] == CDP_END_FAILED_COMM;
        other += e->end[i] == CDP_END_FAILED_OTHER;
    }
    /* which ranks, from the strongest evidence, the ranks' own words first:
     * a deadline some rank reported (with no device or other error) is a
     * hang, whatever mpirun did next (Open MPI 4.1's mpirun may crash while
     * it aborts the job, and a hung rank it never stopped is silent), and the
     * hung ranks are those stopped while not waiting on anyone, else the
     * silent ones; then the rank the launcher saw die; the ranks that said
     * their device failed (a rank without a word beside them was killed in
     * the clean-up before it answered); the silent ranks of a job ended by a
     * signal */
    enum cdp_rank_end pick = CDP_END_SILENT;
    const char *why = "";
    char how[64];
    if (e->code > 128 && e->code < 128 + 65) snprintf(how, sizeof how, "signal %d", e->code - 128);
    else snprintf(how, sizeof how, "exit code %d", e->code);
    /* the ranks' words first: a rank that said its exit was 2 had bad input, even
     * when mpirun crashed on its abort instead of passing the 2 on */
    if (e->code == 2 || e->rank_code == 2) {
        snprintf(out->what, sizeof out->what, "bad input (exit code 2)");
        return CDP_OK;
    }
    /* the kernel's OOM killer: the same layout runs out of memory again, and no
     * device failed (none is excluded) */
    if (e->oom_kills > 0) {
        snprintf(out->kind, sizeof out->kind, "out of memory");
        size_t o = (size_t)snprintf(out->what, sizeof out->what, "out of memory: the kernel's OOM killer ended %lld "
                                    "process%s of this job (its cgroup's memory.events oom_kill)",
                                    (long long)e->oom_kills, e->oom_kills == 1 ? "" : "es");
        for (int i = 0, k = 0; i < n && o < sizeof out->what - 40; i++)
            if (e->end[i] == CDP_END_SILENT) o += (size_t)snprintf(out->what + o, sizeof out->what - o, "%s%d",
                                                                  k++ ? ", " : "; ranks without a word: ", i);
        return CDP_OK;
    }
    int killed = 0;
    for (int i = 0; i < n; i++) killed += e->end[i] == CDP_END_KILLED;
    int only = -1; /* the one rank named by the launcher */
    int busy = 0;
    for (int i = 0; i < n; i++) busy += e->end[i] == CDP_END_STOPPED_BUSY;
    /* a node of a layout over several whose ranks all left no word while
     * ranks elsewhere did: its host went (killed, cut off), and its peers'
     * deadlines and a rank stopped while computing are what followed */
    int silent_node = -1, node_died = 0;
    for (int node = 0; node < l->n_nodes && silent_node < 0 && l->n_nodes > 1 && silent < n; node++) {
        int on = 0, dead = 0;
        for (int i = 0; i < n; i++)
            if (l->rank[i].node == node) on++, dead += e->end[i] == CDP_END_SILENT;
        if (on && dead == on) silent_node = node;
    }
    if (killed) {
        pick = CDP_END_KILLED;
        snprintf(out->kind, sizeof out->kind, "died");
        why = "was killed (SIGTERM from outside the job)";
    } else if (silent_node >= 0 && !device && !other) {
        node_died = 1;
        snprintf(out->kind, sizeof out->kind, "died");
        why = "died";
    } else if (comm && !device && !other) {
        pick = busy ? CDP_END_STOPPED_BUSY : CDP_END_SILENT;
        snprintf(out->kind, sizeof out->kind, "hang");
        why = "hung past the deadline (train.timeout_s)";
    } else if (e->died >= 0 && e->end[e->died] == CDP_END_SILENT) {
        only = e->died;
        snprintf(out->kind, sizeof out->kind, "died");
        why = "died";
    } else if (device) {
        pick = CDP_END_FAILED_DEVICE;
        snprintf(out->kind, sizeof out->kind, "device error");
        why = "reported a device error";
    } else if (silent && (e->code > 128 || (!comm && !other))) {
        snprintf(out->kind, sizeof out->kind, "died");
        why = "died";
    } else {
        snprintf(out->what, sizeof out->what, "%s", other ? "a rank failed (not a device, a hang or a death)"
                                                          : "the job failed");
        return CDP_OK;
    }
    out->restartable = 1;
    if (only >= 0) out->failed[out->n_failed++] = only;
    else if (node_died) /* that node's ranks, not a rank silent elsewhere (killed in the clean-up) */
        for (int i = 0; i < n; i++) {
            if (l->rank[i].node == silent_node) out->failed[out->n_failed++] = i;
        }
    else
        for (int i = 0; i < n; i++)
            if (e->end[i] == pick && !(pick == CDP_END_SILENT && silent == n)) out->failed[out->n_failed++] = i;
    /* a node of a layout over several whose every rank died (not when no
     * rank of any node said a word: nothing tells one node from another) */
    if (!strcmp(out->kind, "died")) out->node = silent_node;
    /* the step: after the last one metrics.jsonl recorded, else the ranks' reports */
    if (metrics_last >= 0) out->step = metrics_last + 1;
    else
        for (int i = 0; i < n; i++)
            if (e->step[i] > out->step) out->step = e->step[i];
    size_t o = 0;
    if (out->node >= 0) {
        o += (size_t)snprintf(out->what, sizeof out->what, "node %d (all its ranks) %s", out->node, why);
    } else if (!out->n_failed && silent == n) {
        o += (size_t)snprintf(out->what, sizeof out->what, "no rank left a word (none started, or all ended at "
                              "once: which one failed is not known)");
    } else if (!out->n_failed) {
        o += (size_t)snprintf(out->what, sizeof out->what, "a rank %s (which one is not known: no rank was "
                              "stopped busy)", why);
    } else {
        for (int k = 0; k < out->n_failed && o < sizeof out->what - 80; k++) {
            const struct cdp_layout_rank *r = &l->rank[out->failed[k]];
            char tx[32] = ""; /* a tensor group's rank: its index */
            if (l->tensor > 1) snprintf(tx, sizeof tx, ", tensor %d", r->tensor);
            o += (size_t)snprintf(out->what + o, sizeof out->what - o, "%srank %d (stage %d, replica %d%s, node %d, "
                                  "device %d)", k ? ", " : "", out->failed[k], r->stage, r->replica, tx, r->node,
                                  r->device);
        }
        if (o < sizeof out->what) o += (size_t)snprintf(out->what + o, sizeof out->what - o, " %s", why);
    }
    if (!strcmp(out->kind, "died") && o < sizeof out->what)
        snprintf(out->what + o, sizeof out->what - o, " (the job ended with %s)", how);
    return CDP_OK;
}

void cdp_restart_node_lost(const struct cdp_layout *l, int node, struct cdp_fault_report *f)
{
    f->restartable = 1;
    f->node = node;
    snprintf(f->kind, sizeof f->kind, "died");
    snprintf(f->what, sizeof f->what, "node %d lost (its host does not answer)", node);
    f->n_failed = 0;
    if (f->failed)
        for (int i = 0; i < l->n_ranks; i++)
            if (l->rank[i].node == node) f->failed[f->n_failed++] = i;
}

/* ---- the re-plan ----------------------------------------------------------------- */

static void drop_partition_and_placement(struct cdp_parallel_desc *pd)
{
    free(pd->partition);
    pd->partition = NULL;
    pd->n_partition = 0;
    free(pd->placement_map);
    pd->placement_map = NULL;
    pd->placement = CDP_PLACEMENT_TOPOLOGY;
    if (pd->balance == CDP_BALANCE_EXPLICIT) {
        free(pd->shares);
        pd->shares = NULL;
        pd->n_shares = 0;
        pd->balance = CDP_BALANCE_SPEED;
    }
}

/* The devices left for tensor groups of tp, node by node, in left[node *
 * n_devices + i] (count[node] of them): the old layout's devices in aligned
 * runs of tp (a node's devices cut from its first, as the groups are) whose
 * every device is the layout's and none dead. With tp the old t, a dead
 * device takes its group's slot with it; a smaller tp may use the rest of
 * the slot. The search runs on keep_nodes nodes of per devices (a multiple
 * of tp). */
struct left {
    int *dev, *count, keep_nodes, per;
};

static int node_of_device(const struct cdp_topology *t, int d, int nodes)
{
    const int node = t->gpus && d < t->n_gpus ? t->gpus[d].node : 0;
    return node >= 0 && node < nodes ? node : 0;
}

static void devices_left(const struct cdp_topology *t, const struct cdp_layout *old, const unsigned char *dead,
                         int n_devices, int nodes, int tp, struct left *lf)
{
    memset(lf->count, 0, (size_t)nodes * sizeof *lf->count);
    lf->keep_nodes = lf->per = 0;
    for (int d0 = 0; d0 < n_devices;) {
        const int node = node_of_device(t, d0, nodes);
        int end = d0 + 1; /* the node's devices [d0, end) */
        while (end < n_devices && node_of_device(t, end, nodes) == node) end++;
        for (int g = d0; g + tp <= end; g += tp) {
            int ok = 1;
            for (int d = g; d < g + tp && ok; d++) {
                int used = 0;
                for (int i = 0; i < old->n_ranks && !used; i++) used = old->rank[i].device == d;
                ok = used && !dead[d];
            }
            for (int d = g; d < g + tp && ok; d++) lf->dev[node * n_devices + lf->count[node]++] = d;
        }
        d0 = end;
    }
    for (int node = 0; node < nodes; node++)
        if (lf->count[node])
            lf->per = lf->keep_nodes++ ? (lf->count[node] < lf->per ? lf->count[node] : lf->per) : lf->count[node];
    lf->per -= lf->per % tp;
}

/* The plan file planned again with tensor groups of tp on what lf leaves:
 * searched on keep_nodes x per devices, the placement moved onto the devices
 * left, then planned on the first topology. */
static cdp_status plan_on(const struct cdp_replan_in *in, const struct cdp_layout *old, const struct left *lf,
                          int n_devices, int nodes, int tp, struct cdp_plan **plan_out, struct cdp_planner_result *out)
{
    const struct cdp_topology *t = in->topo;
    struct cdp_plan *p = NULL;
    struct cdp_topology *t2 = NULL;
    struct cdp_planner_result r1 = {0};
    int *node_of = NULL;
    cdp_status st;
    /* the plan as written, so that its "auto" is planned again; the shape goes too */
    if ((st = cdp_plan_load(in->plan_path, &p)) || (st = cdp_plan_resolve(p, in->machine))) goto done;
    p->parallel.tensor = tp;
    int64_t shares = 0;
    for (int r = 0; r < old->replicas; r++) shares += old->shares[r];
    const int64_t nodes0 = p->cluster.nodes, devices0 = p->cluster.devices;
    p->train.global_batch = shares * old->micro_batch;
    p->parallel.stages = p->parallel.replicas = p->parallel.micro_batches = CDP_AUTO;
    drop_partition_and_placement(&p->parallel);
    /* the search: as many nodes as keep devices, the fewest devices any keeps */
    p->cluster.nodes = lf->keep_nodes;
    p->cluster.devices = lf->per;
    char note[512];
    if ((st = cdp_planner_topology(p, in->machine->gpus, &t2, note, sizeof note))) goto done;
    if ((st = cdp_planner_run(p, t2, in->table, 0, &r1))) goto done;
    cdp_topology_free(t2);
    t2 = NULL;
    if ((st = cdp_planner_apply(&r1, p))) goto done;
    /* the chosen placement, moved onto the devices that are left: device k of
     * the search's node j is the k-th left on the j-th node that keeps any (a
     * group's first: its run of tp is consecutive there too) */
    if (!(node_of = calloc((size_t)lf->keep_nodes, sizeof *node_of))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int node = 0, j = 0; node < nodes; node++)
        if (lf->count[node]) node_of[j++] = node;
    const int64_t n_place = p->parallel.stages * p->parallel.replicas;
    for (int64_t i = 0; i < n_place && p->parallel.placement_map; i++) {
        const int64_t g = p->parallel.placement_map[i];
        const int j = (int)(g / lf->per), k = (int)(g % lf->per);
        const int *on = &lf->dev[node_of[j < lf->keep_nodes ? j : 0] * n_devices];
        for (int x = 1; x < tp; x++)
            if (k + x >= lf->per || on[k + x] != on[k] + x) {
                st = cdp_fail(CDP_ERR_INTERNAL, "the re-plan's tensor group at device %d of the search is not "
                              "consecutive devices", k);
                goto done;
            }
        p->parallel.placement_map[i] = on[k];
    }
    /* planned again on the first topology: the same nodes and devices as before */
    p->cluster.nodes = nodes0;
    p->cluster.devices = devices0;
    if (devices0 == CDP_AUTO && !strcmp(p->cluster.topology, "auto") && !cdp_backend_is_gpu(p->cluster.backend))
        p->cluster.devices = t->n_gpus / nodes; /* a cpu host's devices follow the shape: keep the first count */
    if ((st = cdp_planner_topology(p, in->machine->gpus, &t2, note, sizeof note))) goto done;
    if ((st = cdp_planner_run(p, t2, in->table, 0, out))) goto done;
    if ((st = cdp_planner_apply(out, p))) cdp_planner_result_clear(out);
done:
    free(node_of);
    cdp_planner_result_clear(&r1);
    cdp_topology_free(t2);
    if (st) {
        cdp_plan_free(p);
        return st;
    }
    *plan_out = p;
    return CDP_OK;
}

cdp_status cdp_restart_replan(const struct cdp_replan_in *in, const struct cdp_layout *old, const unsigned char *dead,
                              int n_devices, struct cdp_plan **plan_out, struct cdp_planner_result *out)
{
    const struct cdp_topology *t = in->topo;
    const int nodes = t->n_nodes > 0 ? t->n_nodes : 1;
    struct left lf = {calloc((size_t)nodes * (size_t)n_devices + 1, sizeof *lf.dev),
                      calloc((size_t)nodes, sizeof *lf.count), 0, 0};
    struct cdp_plan *p = NULL, *best = NULL;
    struct cdp_planner_result r = {0};
    cdp_status st = CDP_OK;
    memset(out, 0, sizeof *out);
    if (!lf.dev || !lf.count) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* the plan's t: a fixed one stays; "auto" tries the old t and each half
     * of it (a run of a smaller t inside an old group's slot stays within
     * its link domain) and keeps the fastest predicted */
    if ((st = cdp_plan_load(in->plan_path, &p)) || (st = cdp_plan_resolve(p, in->machine))) goto done;
    const int fixed = p->parallel.tensor != CDP_AUTO, t_old = old->tensor > 0 ? old->tensor : 1;
    const int t_first = fixed ? (int)p->parallel.tensor : t_old;
    cdp_plan_free(p);
    p = NULL;
    int tried = 0;
    for (int tp = t_first; tp >= 1; tp = fixed ? 0 : tp / 2) {
        devices_left(t, old, dead, n_devices, nodes, tp, &lf);
        if (!lf.keep_nodes || lf.per < tp) continue;
        tried++;
        struct cdp_plan *np = NULL;
        cdp_status s2 = plan_on(in, old, &lf, n_devices, nodes, tp, &np, &r);
        if (s2) { /* nothing fits this t: another may; the last error is the one said */
            st = s2;
            continue;
        }
        if (!best || r.predicted.samples_per_s > out->predicted.samples_per_s) {
            cdp_planner_result_clear(out);
            cdp_plan_free(best);
            *out = r;
            best = np;
        } else {
            cdp_planner_result_clear(&r);
            cdp_plan_free(np);
        }
        memset(&r, 0, sizeof r);
    }
    if (best) st = CDP_OK;
    else if (!tried)
        st = t_first > 1 ? cdp_fail(CDP_ERR_INVALID, "no device of the layout is left to plan on (a tensor group "
                                    "needs %d consecutive devices of one node, none failed)", t_first)
                         : cdp_fail(CDP_ERR_INVALID, "no device of the layout is left to plan on");
done:
    free(lf.dev);
    free(lf.count);
    cdp_plan_free(p);
    if (st || !best) {
        cdp_plan_free(best);
        cdp_planner_result_clear(out);
        return st ? st : cdp_fail(CDP_ERR_INTERNAL, "the re-plan chose nothing");
    }
    *plan_out = best;
    return CDP_OK;
}

void cdp_restart_shape(const struct cdp_layout *l, char *buf, size_t cap)
{
    if (l->tensor > 1) snprintf(buf, cap, "%dx%d (tensor %d)", l->stages, l->replicas, l->tensor);
    else snprintf(buf, cap, "%dx%d", l->stages, l->replicas);
}

/* ---- the record -------------------------------------------------------------------- */

static json_t *layout_json(const struct cdp_layout *l)
{
    json_t *shares = json_array(), *devices = json_array();
    for (int r = 0; r < l->replicas; r++) json_array_append_new(shares, json_integer(l->shares[r]));
    for (int i = 0; i < l->n_ranks; i++) json_array_append_new(devices, json_integer(l->rank[i].device));
    return json_pack("{s:i,s:i,s:i,s:i,s:o,s:o}", "stages", l->stages, "replicas", l->replicas, "tensor",
                     l->tensor, "micro_batches", l->micro_batches, "shares", shares, "devices", devices);
}

cdp_status cdp_restart_record(const char *metrics, int restart, const struct cdp_fault_report *f,
                              const struct cdp_layout *old, const struct cdp_layout *now, int64_t resumed_from,
                              int64_t steps_lost, int same_layout)
{
    if (!metrics) return CDP_OK;
    json_t *ranks = json_array(), *devices = json_array();
    for (int k = 0; k < f->n_failed; k++) {
        json_array_append_new(ranks, json_integer(f->failed[k]));
        json_array_append_new(devices, json_integer(old->rank[f->failed[k]].device));
    }
    json_t *o = json_pack("{s:i,s:{s:s,s:s,s:o,s:o,s:o},s:I,s:o,s:I,s:o,s:o,s:b}", "restart", restart, "failed",
                          "kind", f->kind, "what", f->what, "ranks", ranks, "devices", devices, "node",
                          f->node >= 0 ? json_integer(f->node) : json_null(), "resumed_from",
                          (json_int_t)resumed_from, "fault_step",
                          f->step >= 0 ? json_integer(f->step) : json_null(), "steps_lost", (json_int_t)steps_lost,
                          "old_layout", layout_json(old), "new_layout", layout_json(now), "same_layout",
                          same_layout);
    char *text = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "out of memory writing the restart's record");
    FILE *m = fopen(metrics, "a");
    int bad = !m || fputs(text, m) < 0 || fputc('\n', m) == EOF;
    const int err = errno;
    if (m && fclose(m) != 0) bad = 1;
    free(text);
    if (bad) return cdp_fail(CDP_ERR_IO, "%s: cannot write the restart's record: %s", metrics, strerror(err));
    return CDP_OK;
}
