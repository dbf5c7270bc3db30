/* The live device monitor (monitor.h). */
#include "pipeline/run/monitor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "pipeline/layout.h"

enum { F_STAGE, F_REPLICA, F_UTIL, F_MEM, F_PEAK, F_BUSY, F_BUSY_MB, F_COUNT };

struct cdp_monitor {
    int stage, replica;
    cdp_device_t dev;
    double cpu0, wall0;
    int size;
    double *buf;                   /* F_COUNT per rank */
    struct cdp_monitor_rank *ranks;
    int *streak;                   /* reports running each rank was its group's slowest */
    double *group;                 /* scratch: one stage group's busy times */
    int *slowest_of;               /* scratch: this report's slowest rank of each group */
};

static double cpu_seconds(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Resident set size from /proc/self/statm (pages), 0 where unknown. */
static double resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, rss = 0;
    int n = fscanf(f, "%llu %llu", &size, &rss);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return n == 2 && page > 0 ? (double)rss * (double)page : 0;
}

cdp_status cdp_monitor_create(int stage, int replica, cdp_device_t dev, struct cdp_monitor **out)
{
    struct cdp_monitor *m = calloc(1, sizeof *m);
    if (!m) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    m->stage = stage;
    m->replica = replica;
    m->dev = dev;
    m->cpu0 = cpu_seconds();
    m->wall0 = (double)cdp_time_ns() / 1e9;
    *out = m;
    return CDP_OK;
}

void cdp_monitor_destroy(struct cdp_monitor *m)
{
    if (!m) return;
    free(m->buf);
    free(m->ranks);
    free(m->streak);
    free(m->group);
    free(m->slowest_of);
    free(m);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

cdp_status cdp_monitor_collect(struct cdp_monitor *m, cdp_comm_t world, double busy_s, int steps, int64_t mbs,
                               double timeout, struct cdp_monitor_report *out)
{
    const int size = cdp_comm_size(world), rank = cdp_comm_rank(world);
    if (m->size != size) {
        free(m->buf);
        free(m->ranks);
        free(m->streak);
        free(m->group);
        free(m->slowest_of);
        m->buf = calloc((size_t)size * F_COUNT, sizeof *m->buf);
        m->ranks = calloc((size_t)size, sizeof *m->ranks);
        m->streak = calloc((size_t)size, sizeof *m->streak);
        m->group = calloc((size_t)size, sizeof *m->group);
        m->slowest_of = calloc((size_t)size, sizeof *m->slowest_of);
        m->size = size;
        if (!m->buf || !m->ranks || !m->streak || !m->group || !m->slowest_of) {
            m->size = 0;
            return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        }
    }
    const double cpu = cpu_seconds(), wall = (double)cdp_time_ns() / 1e9;
    double *mine = m->buf + (size_t)rank * F_COUNT;
    memset(m->buf, 0, (size_t)size * F_COUNT * sizeof *m->buf);
    mine[F_STAGE] = m->stage;
    mine[F_REPLICA] = m->replica;
    if (!cdp_backend_is_gpu(cdp_device_backend_of(m->dev))) {
        mine[F_UTIL] = wall > m->wall0 ? (cpu - m->cpu0) / (wall - m->wall0) : 0;
        mine[F_MEM] = resident_bytes();
    } else {
        /* a GPU rank: NVML's utilisation (else the executor's busy share of the
         * interval) and the device's memory in use */
        double util = -1;
        uint64_t used = 0;
        if (cdp_device_usage(m->dev, &util, &used) != CDP_OK) util = -1;
        mine[F_UTIL] = util >= 0 ? util : (wall > m->wall0 && steps > 0 ? busy_s / (wall - m->wall0) : 0);
        mine[F_MEM] = used ? (double)used : (double)cdp_device_mem_in_use(m->dev);
    }
    mine[F_PEAK] = (double)cdp_device_mem_peak(m->dev);
    mine[F_BUSY] = steps > 0 ? busy_s / steps : 0;
    mine[F_BUSY_MB] = mbs > 0 ? busy_s / (double)mbs : 0;
    m->cpu0 = cpu;
    m->wall0 = wall;
    cdp_status st = cdp_comm_allreduce_f64(world, m->buf, (size_t)size * F_COUNT, CDP_REDUCE_SUM, timeout);
    if (st) return st;

    out->size = size;
    out->gpu = cdp_backend_is_gpu(cdp_device_backend_of(m->dev));
    out->ranks = m->ranks;
    out->slowest = 0;
    out->straggler = -1;
    out->straggler_mb_s = out->median_mb_s = 0;
    int stages = 0;
    for (int r = 0; r < size; r++) {
        const double *b = m->buf + (size_t)r * F_COUNT;
        m->ranks[r] = (struct cdp_monitor_rank){(int)b[F_STAGE], (int)b[F_REPLICA], b[F_UTIL], b[F_MEM], b[F_PEAK],
                                                b[F_BUSY], b[F_BUSY_MB]};
        if (m->ranks[r].busy_s > m->ranks[out->slowest].busy_s) out->slowest = r;
        if (m->ranks[r].stage + 1 > stages) stages = m->ranks[r].stage + 1;
    }
    /* stragglers: within each stage's replicas */
    double *group = m->group;
    int *slowest_of = m->slowest_of;
    memset(slowest_of, 0, (size_t)size * sizeof *slowest_of);
    for (int s = 0; s < stages; s++) {
        int n = 0, worst = -1;
        for (int r = 0; r < size; r++)
            if (m->ranks[r].stage == s) {
                group[n++] = m->ranks[r].busy_mb_s;
                if (worst < 0 || m->ranks[r].busy_mb_s > m->ranks[worst].busy_mb_s) worst = r;
            }
        if (n < 2) continue;
        qsort(group, (size_t)n, sizeof *group, cmp_double);
        const double median = n % 2 ? group[n / 2] : 0.5 * (group[n / 2 - 1] + group[n / 2]);
        if (m->ranks[worst].busy_mb_s <= median * (1.0 + CDP_MONITOR_STRAGGLER_MARGIN)) continue;
        slowest_of[worst] = 1;
        if (++m->streak[worst] == CDP_MONITOR_STRAGGLER_REPORTS && out->straggler < 0) {
            out->straggler = worst;
            out->straggler_mb_s = m->ranks[worst].busy_mb_s;
            out->median_mb_s = median;
        }
    }
    for (int r = 0; r < size; r++)
        if (!slowest_of[r]) m->streak[r] = 0;
    return CDP_OK;
}

static void human_bytes(double b, char *buf, size_t cap)
{
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.1fGiB", b / (1024.0 * 1024 * 1024));
    else snprintf(buf, cap, "%.0fMiB", b / (1024.0 * 1024));
}

void cdp_monitor_format(const struct cdp_monitor_report *r, char *buf, size_t cap)
{
    double umin = INFINITY, umax = 0, mmin = INFINITY, mmax = 0;
    for (int i = 0; i < r->size; i++) {
        umin = fmin(umin, r->ranks[i].util);
        umax = fmax(umax, r->ranks[i].util);
        mmin = fmin(mmin, r->ranks[i].mem_bytes);
        mmax = fmax(mmax, r->ranks[i].mem_bytes);
    }
    char a[32], b[32];
    human_bytes(mmin, a, sizeof a);
    human_bytes(mmax, b, sizeof b);
    if (r->size == 1) {
        snprintf(buf, cap, "%s %.0f%%  mem %s", r->gpu ? "gpu" : "cpu", 100 * umax, b);
        return;
    }
    char mem[80];
    if (strcmp(a, b)) snprintf(mem, sizeof mem, "%s-%s", a, b);
    else snprintf(mem, sizeof mem, "%s", a);
    snprintf(buf, cap, "%s %.0f-%.0f%%  mem %s  slowest r%d %.1fms", r->gpu ? "gpu" : "cpu", 100 * umin,
             100 * umax, mem, r->slowest, 1e3 * r->ranks[r->slowest].busy_s);
}

json_t *cdp_monitor_ranks_json(const struct cdp_monitor_report *r, const struct cdp_layout *l)
{
    json_t *a = json_array();
    for (int i = 0; a && i < r->size; i++) {
        const struct cdp_layout_rank *k = i < l->n_ranks ? &l->rank[i] : NULL;
        char dev[32] = "";
        if (k) cdp_layout_device_name(l, i, dev, sizeof dev);
        const struct cdp_monitor_rank *m = &r->ranks[i];
        json_t *o = json_object();
        json_object_set_new(o, "rank", json_integer(i));
        json_object_set_new(o, "stage", json_integer(m->stage));
        json_object_set_new(o, "replica", json_integer(m->replica));
        json_object_set_new(o, "node", json_integer(k ? k->node : -1));
        json_object_set_new(o, "device", json_integer(k ? k->device : -1));
        json_object_set_new(o, "device_name", json_string(dev));
        json_object_set_new(o, "util", json_real(m->util));
        json_object_set_new(o, "mem_bytes", json_integer((json_int_t)m->mem_bytes));
        json_object_set_new(o, "peak_memory_bytes", json_integer((json_int_t)m->peak_bytes));
        json_object_set_new(o, "predicted_memory_bytes", json_integer(k ? (json_int_t)k->memory.device : 0));
        json_object_set_new(o, "busy_s", json_real(m->busy_s));
        json_object_set_new(o, "busy_per_micro_batch_s", json_real(m->busy_mb_s));
        json_array_append_new(a, o);
    }
    return a;
}
