/* The planner's memory prediction: the memory of unit ranges in O(1) (prefix
 * sums and range maxima), what a layout's ranks allocate, and whether they fit
 * their devices' caps and their nodes' host memory. */
#include "partitioner/planner.h"
#include "partitioner/planner_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/optim.h"
#include "partitioner/host.h"
#include "partitioner/partition.h"
#include "partitioner/placement.h"
#include "pipeline/balance.h"
#include "pipeline/schedule.h"
#include "plan/schedule_kind.h"

void cdp_planner_mem_index_free(struct mem_index *m)
{
    free(m->ub);
    free(m->held);
    free(m->act);
    free(m->wst);
    free(m->scr);
    free(m->io);
    free(m->wrk);
    free(m->win);
    free(m->wmx);
    free(m->tie_unit);
    free(m->tie_owner);
    free(m->tie_floats);
    memset(m, 0, sizeof *m);
}

cdp_status cdp_planner_mem_index_build(struct mem_index *m, const struct cdp_plan *plan, const struct cdp_unit *u, int n)
{
    const enum cdp_loss loss = cdp_model_loss_of(&plan->model);
    const int B = (int)plan->train.micro_batch;
    int levels = 1;
    while ((1 << levels) <= n) levels++;
    m->n = n;
    m->levels = levels;
    m->ub = calloc((size_t)n, sizeof *m->ub);
    m->held = calloc((size_t)n + 1, sizeof *m->held);
    m->act = calloc((size_t)n + 1, sizeof *m->act);
    m->wst = calloc((size_t)n + 1, sizeof *m->wst);
    m->scr = calloc((size_t)levels * n, sizeof *m->scr);
    m->io = calloc((size_t)levels * n, sizeof *m->io);
    m->wrk = calloc((size_t)levels * n, sizeof *m->wrk);
    m->win = calloc((size_t)n + 1, sizeof *m->win);
    m->wmx = calloc((size_t)levels * n, sizeof *m->wmx);
    m->tie_unit = calloc((size_t)n, sizeof *m->tie_unit);
    m->tie_owner = calloc((size_t)n, sizeof *m->tie_owner);
    m->tie_floats = calloc((size_t)n, sizeof *m->tie_floats);
    if (!m->ub || !m->held || !m->act || !m->wst || !m->scr || !m->io || !m->wrk || !m->win || !m->wmx || !m->tie_unit ||
        !m->tie_owner || !m->tie_floats)
        return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int i = 0; i < n; i++) {
        cdp_unit_bytes(&u[i], B, loss, &m->ub[i]);
        m->held[i + 1] = m->held[i] + m->ub[i].held_floats;
        m->act[i + 1] = m->act[i] + m->ub[i].act_bytes;
        m->wst[i + 1] = m->wst[i] + m->ub[i].wstate_bytes;
        m->scr[i] = m->ub[i].scratch_bytes;
        m->io[i] = m->ub[i].io_bytes;
        m->wrk[i] = m->ub[i].work_bytes;
        m->win[i + 1] = m->win[i] + m->ub[i].window_floats;
        m->wmx[i] = m->ub[i].window_floats;
        if (m->ub[i].tied_owner >= 0) {
            m->tie_unit[m->n_ties] = i;
            m->tie_owner[m->n_ties] = m->ub[i].tied_owner;
            m->tie_floats[m->n_ties++] = m->ub[i].tied_floats;
        }
    }
    for (int l = 1; l < levels; l++)
        for (int i = 0; i + (1 << l) <= n; i++) {
            const uint64_t *ps = m->scr + (size_t)(l - 1) * n, *pi = m->io + (size_t)(l - 1) * n,
                           *pw = m->wrk + (size_t)(l - 1) * n, *px = m->wmx + (size_t)(l - 1) * n;
            const int h = 1 << (l - 1);
            m->scr[(size_t)l * n + i] = ps[i] > ps[i + h] ? ps[i] : ps[i + h];
            m->io[(size_t)l * n + i] = pi[i] > pi[i + h] ? pi[i] : pi[i + h];
            m->wrk[(size_t)l * n + i] = pw[i] > pw[i + h] ? pw[i] : pw[i + h];
            m->wmx[(size_t)l * n + i] = px[i] > px[i + h] ? px[i] : px[i + h];
        }
    return CDP_OK;
}

/* The terms of units [first, end), as cdp_range_terms_add over them gives. */
static void mem_terms(const struct mem_index *m, int first, int end, struct cdp_range_terms *t, uint64_t *shared,
                      uint64_t *wstate)
{
    const unsigned __int128 w = m->wst[end] - m->wst[first];
    *wstate = w > UINT64_MAX ? UINT64_MAX : (uint64_t)w;
    int l = 0;
    while ((2 << l) <= end - first) l++;
    const size_t a = (size_t)l * m->n + first, b = (size_t)l * m->n + (size_t)(end - (1 << l));
    t->held_floats = m->held[end] - m->held[first];
    const unsigned __int128 act = m->act[end] - m->act[first];
    t->act_bytes = act > UINT64_MAX ? UINT64_MAX : (uint64_t)act; /* as cdp_range_terms_add saturates */
    t->scratch_bytes = m->scr[a] > m->scr[b] ? m->scr[a] : m->scr[b];
    t->io_bytes = m->io[a] > m->io[b] ? m->io[a] : m->io[b];
    t->work_bytes = m->wrk[a] > m->wrk[b] ? m->wrk[a] : m->wrk[b];
    t->window_sum = m->win[end] - m->win[first];
    t->window_max = m->wmx[a] > m->wmx[b] ? m->wmx[a] : m->wmx[b];
    *shared = 0;
    for (int k = 0; k < m->n_ties; k++)
        if (m->tie_unit[k] >= first && m->tie_unit[k] < end && m->tie_owner[k] >= first && m->tie_owner[k] < end)
            *shared += m->tie_floats[k];
}

/* The least memory cap of the devices a layout may use (0: unknown). */
uint64_t cdp_planner_device_cap(const struct cdp_plan *plan, const struct cdp_topology *t, int d)
{
    uint64_t cap = t->gpus[d].memory_bytes;
    if (plan->cluster.device_memory && (!cap || plan->cluster.device_memory < cap)) cap = plan->cluster.device_memory;
    return cap;
}

/* The memory of stage s in the partition's search: the chunk the executor
 * builds for [first, end) with the stage's slots (one chunk per stage). */
double cdp_planner_part_memory(void *vc, int s, int first, int end)
{
    const struct ctx *c = vc;
    struct cdp_range_terms t;
    uint64_t shared, wstate;
    mem_terms(c->mi, first, end, &t, &shared, &wstate);
    struct cdp_rank_memory m;
    /* ZeRO: the largest shard, the first */
    cdp_layout_chunk_memory(c->plan, &t, shared, &c->mi->ub[first], &c->mi->ub[end - 1], end == c->n, s, c->p,
                            c->slots[s], wstate, c->slots[c->p + s], c->hv, c->R > 1 ? c->zero : 0, c->R, 0, &m);
    return (double)m.device;
}

/* What a node's ranks may hold in host memory, and where that figure is from. */
double cdp_planner_node_capacity(const struct cdp_plan *plan, const struct cdp_topology *t, int node, char *from,
                                 size_t cap)
{
    if (plan->cluster.host_memory) {
        snprintf(from, cap, "/cluster/host_memory");
        return (double)plan->cluster.host_memory;
    }
    /* ranks run here: on the cpu backend always (their devices are this host's
     * memory), on cuda when the topology is this machine */
    if (cdp_backend_host_visible(plan->cluster.backend) || !strcmp(plan->cluster.topology, "auto")) {
        uint64_t avail = 0;
        char why[140];
        if (!cdp_host_memory(&avail, why, sizeof why)) {
            snprintf(from, cap, "this host: %.140s", why);
            return (double)avail;
        }
    }
    uint64_t numa = 0;
    for (int i = 0; i < t->n_numa; i++)
        if (t->numa[i].node == node) numa += t->numa[i].memory_bytes;
    snprintf(from, cap, numa ? "the topology's NUMA memory" : "unknown");
    return (double)numa;
}

/* Host bytes of a rank: on the cpu backend its device memory is host memory too. */
double cdp_planner_rank_host_bytes(const struct ctx *c, const struct cdp_layout_rank *k)
{
    return (double)k->memory.host + (c->hv ? (double)k->memory.device : 0);
}

/* Fills every rank's memory (cdp_layout_memory). */
cdp_status cdp_planner_layout_memory(const struct ctx *c, struct cdp_layout *l)
{
    return cdp_layout_memory(c->plan, l, c->u, c->n);
}

/* The fit of a layout whose memory is filled: every rank within its device's
 * cap and every node's ranks within its host memory. 0 when it fits; else a
 * message in why. *peak gets the largest rank's device bytes. */
int cdp_planner_misfit(const struct ctx *c, const struct cdp_layout *l, double *peak, char *why, size_t cap)
{
    double *node = calloc((size_t)c->t->n_nodes, sizeof *node);
    int bad = 0;
    *peak = 0;
    for (int i = 0; i < l->n_ranks; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        *peak = fmax(*peak, (double)k->memory.device);
        if (node) node[k->node] += cdp_planner_rank_host_bytes(c, k);
        const uint64_t dc = cdp_planner_device_cap(c->plan, c->t, k->device);
        if (!bad && dc && k->memory.device > dc) {
            char a[32], b[32];
            snprintf(why, cap, "stage %d needs %s of device memory and the device has %s",
                     k->stage, cdp_format_bytes(k->memory.device, a, sizeof a), cdp_format_bytes(dc, b, sizeof b));
            bad = 1;
        }
    }
    for (int n = 0; node && !bad && n < c->t->n_nodes; n++) {
        char from[160];
        const double hc = cdp_planner_node_capacity(c->plan, c->t, n, from, sizeof from);
        if (hc > 0 && node[n] > hc) {
            char a[32], b[32];
            int ranks = 0;
            for (int i = 0; i < l->n_ranks; i++) ranks += l->rank[i].node == n;
            if (ranks == 1)
                snprintf(why, cap, "the rank on node %d needs %s of host memory and the node has %s (%s)", n,
                         cdp_format_bytes((uint64_t)node[n], a, sizeof a), cdp_format_bytes((uint64_t)hc, b, sizeof b),
                         from);
            else
                snprintf(why, cap, "the %d ranks on node %d need %s of host memory together and the node has %s (%s)",
                         ranks, n, cdp_format_bytes((uint64_t)node[n], a, sizeof a),
                         cdp_format_bytes((uint64_t)hc, b, sizeof b), from);
            bad = 2;
        }
    }
    free(node);
    return bad;
}
