/* This host as the planner needs it when ranks run here: the CPUs this
 * process may use, grouped by core, and the memory it may use (the smaller of
 * the kernel's MemAvailable and what the memory cgroup leaves). */
#ifndef CDP_PARTITIONER_HOST_H
#define CDP_PARTITIONER_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPUs (PUs) this process may run on, those of one core next to each
 * other, cores in order: *cpus (malloc'd) has *n entries, core_of[i] (malloc'd,
 * may be NULL if not wanted) numbers the core of cpus[i] from 0, and *cores
 * counts the cores. hwloc groups PUs by core where the build has it; else
 * every CPU is its own core. CDP_ERR_NOMEM. */
cdp_status cdp_host_cpus(int **cpus, int **core_of, int *n, int *cores);

/* What this host lets its processes allocate, in bytes: MemAvailable from
 * /proc/meminfo, lowered to the memory cgroup's limit less what the cgroup
 * already holds besides page cache (cgroup v2 memory.max along the path to
 * the root, or v1 memory.limit_in_bytes). `why` (cap bytes) says which figure
 * it is ("MemAvailable 23.2 GiB", "cgroup limit 4.00 GiB, 0.1 GiB in use").
 * CDP_ERR_UNSUPPORTED where the host does not say (no /proc/meminfo). */
cdp_status cdp_host_memory(uint64_t *avail, char *why, size_t cap);

/* Processes the kernel's OOM killer has ended in this process's memory
 * cgroup (cgroup v2 memory.events "oom_kill", hierarchical; v1
 * memory.oom_control), or -1 where the host does not say. A job's ranks run
 * in the launcher's cgroup (or below it), so the count going up while they ran
 * says one of them was killed for memory. */
int64_t cdp_host_oom_kills(void);
/* The "oom_kill N" of such a file, or -1. */
int64_t cdp_host_oom_kills_in(const char *events_file);

#ifdef __cplusplus
}
#endif

#endif
