/* This host's CPUs and memory (host.h), read from hwloc, the scheduler's
 * affinity mask, /proc/meminfo and the memory cgroup. */
#include "partitioner/host.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cdp_config.h"

#if CDP_HAVE_HWLOC
#include <hwloc.h>
#endif

#if CDP_HAVE_HWLOC
/* PUs of the allowed cores that the affinity mask holds (taskset, a
 * launcher's binding: never widened), core by core. 0 when hwloc gives nothing. */
static int cpus_hwloc(const cpu_set_t *mask, int *cpus, int *core_of, int cap, int *cores)
{
    hwloc_topology_t topo;
    int n = 0, k = 0;
    if (hwloc_topology_init(&topo) != 0) return 0;
    hwloc_topology_set_all_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_type_filter(topo, HWLOC_OBJ_PU, HWLOC_TYPE_FILTER_KEEP_ALL);
    hwloc_topology_set_type_filter(topo, HWLOC_OBJ_CORE, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (hwloc_topology_load(topo) == 0) {
        hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);
        const int ncore = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
        for (int c = 0; c < ncore; c++) {
            hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)c);
            int any = 0;
            for (int pu = hwloc_bitmap_first(core->cpuset); pu >= 0 && n < cap; pu = hwloc_bitmap_next(core->cpuset, pu))
                if (hwloc_bitmap_isset(allowed, (unsigned)pu) && (!CPU_COUNT(mask) || (pu < CPU_SETSIZE &&
                                                                                     CPU_ISSET(pu, mask)))) {
                    cpus[n] = pu;
                    core_of[n++] = k;
                    any = 1;
                }
            k += any;
        }
    }
    hwloc_topology_destroy(topo);
    *cores = k;
    return n;
}
#endif

cdp_status cdp_host_cpus(int **cpus_out, int **core_out, int *n_out, int *cores_out)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);
    const int cap = CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
    int *cpus = malloc((size_t)cap * sizeof *cpus), *core = malloc((size_t)cap * sizeof *core);
    if (!cpus || !core) {
        free(cpus);
        free(core);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    int n = 0, cores = 0;
#if CDP_HAVE_HWLOC
    n = cpus_hwloc(&set, cpus, core, cap, &cores);
#endif
    if (n == 0) {
        for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
            if (CPU_ISSET(c, &set)) {
                cpus[n] = c;
                core[n] = n;
                n++;
            }
        cores = n;
    }
    if (n == 0) { /* no mask: CPU 0 */
        cpus[0] = 0;
        core[0] = 0;
        n = cores = 1;
    }
    *cpus_out = cpus;
    if (core_out) *core_out = core;
    else free(core);
    *n_out = n;
    *cores_out = cores;
    return CDP_OK;
}

/* A number in bytes from the first line of a file; 0 when absent or "max". */
static uint64_t read_u64(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok ? (uint64_t)v : 0;
}

/* memory.stat's page cache of a cgroup folder ("file" in v2, "total_cache"
 * or "cache" in v1). */
static uint64_t read_cache(const char *dir)
{
    char path[4200], key[64];
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v, cache = 0;
    while (fscanf(f, "%63s %llu", key, &v) == 2)
        if (!strcmp(key, "file") || !strcmp(key, "total_cache")) cache = v;
    fclose(f);
    return (uint64_t)cache;
}

/* The memory cgroup's limit and what it holds besides page cache: v2 along
 * the path to the root (the smallest limit wins), else v1. 0: no limit. */
static uint64_t cgroup_room(uint64_t *limit_out, uint64_t *used_out)
{
    char line[4096], v2[4096] = "", v1[4096] = "";
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            if (!strncmp(line, "0::", 3)) snprintf(v2, sizeof v2, "%s", line + 3);
            char *m = strstr(line, ":memory:");
            if (m) snprintf(v1, sizeof v1, "%s", m + 8);
        }
        fclose(f);
    }
    uint64_t limit = 0, used = 0;
    const uint64_t unlimited = 1ull << 62;
    char dir[4200];
    /* v2: memory.max at every level from the process's cgroup up */
    if (v2[0] == '/') {
        char path[4096];
        snprintf(path, sizeof path, "%s", v2);
        for (;;) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", strcmp(path, "/") ? path : "");
            char file[4300];
            snprintf(file, sizeof file, "%s/memory.max", dir);
            const uint64_t l = read_u64(file);
            if (l && l < unlimited && (!limit || l < limit)) {
                limit = l;
                snprintf(file, sizeof file, "%s/memory.current", dir);
                const uint64_t cur = read_u64(file), cache = read_cache(dir);
                used = cur > cache ? cur - cache : 0;
            }
            if (!strcmp(path, "/")) break;
            char *slash = strrchr(path, '/');
            if (slash == path) snprintf(path, sizeof path, "/");
            else *slash = '\0';
        }
    }
    /* v1: the process's memory cgroup, or the mount's root where the path is
     * not visible (a container's own namespace) */
    if (!limit && v1[0]) {
        const char *dirs[2] = {v1, ""};
        for (int i = 0; i < 2 && !limit; i++) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", strcmp(dirs[i], "/") ? dirs[i] : "");
            char file[4300];
            snprintf(file, sizeof file, "%s/memory.limit_in_bytes", dir);
            const uint64_t l = read_u64(file);
            if (l && l < unlimited) {
                limit = l;
                snprintf(file, sizeof file, "%s/memory.usage_in_bytes", dir);
                const uint64_t cur = read_u64(file), cache = read_cache(dir);
                used = cur > cache ? cur - cache : 0;
            }
        }
    }
    *limit_out = limit;
    *used_out = used;
    return limit ? (limit > used ? limit - used : 0) : 0;
}

cdp_status cdp_host_memory(uint64_t *avail, char *why, size_t cap)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return cdp_fail(CDP_ERR_UNSUPPORTED, "this host does not say how much memory it has (/proc/meminfo)");
    char key[64];
    unsigned long long kb = 0, v;
    char unit[16];
    while (fscanf(f, "%63s %llu %15s", key, &v, unit) >= 2)
        if (!strcmp(key, "MemAvailable:")) kb = v;
    fclose(f);
    if (!kb) return cdp_fail(CDP_ERR_UNSUPPORTED, "this host does not say how much memory it has (MemAvailable)");
    const uint64_t mem = (uint64_t)kb * 1024;
    uint64_t limit = 0, used = 0;
    const uint64_t room = cgroup_room(&limit, &used);
    char a[32], b[32], c[32];
    cdp_format_bytes(mem, a, sizeof a);
    if (limit && room < mem) {
        cdp_format_bytes(limit, b, sizeof b);
        cdp_format_bytes(used, c, sizeof c);
        snprintf(why, cap, "its memory cgroup's limit %s, %s of it in use (MemAvailable %s)", b, c, a);
        *avail = room;
    } else {
        snprintf(why, cap, "MemAvailable %s%s", a, limit ? ", within its memory cgroup's limit" : "");
        *avail = mem;
    }
    return CDP_OK;
}

int64_t cdp_host_oom_kills_in(const char *events_file)
{
    FILE *f = fopen(events_file, "r");
    if (!f) return -1;
    char line[256];
    long long n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "oom_kill %lld", &n) == 1) break;
    fclose(f);
    return n;
}

int64_t cdp_host_oom_kills(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    char line[4096], path[4400];
    int64_t n = -1;
    while (n < 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *rest = NULL;
        if (!strncmp(line, "0::", 3)) { /* v2 */
            rest = line + 3;
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.events", strcmp(rest, "/") ? rest : "");
        } else if ((rest = strstr(line, ":memory:"))) { /* v1 */
            rest += 8;
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.oom_control", strcmp(rest, "/") ? rest : "");
        } else {
            continue;
        }
        n = cdp_host_oom_kills_in(path);
    }
    fclose(f);
    return n;
}
