/* Binding a rank to its CPUs (launch.h): hwloc where the build has it, else
 * sched_setaffinity; and the BLAS threads of a CPU set. */
#include "pipeline/run/launch.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cdp_config.h"
#include "kernels/cpu/ops.h"

#if CDP_HAVE_HWLOC
#include <hwloc.h>
#endif

/* ---- binding ------------------------------------------------------------------- */

#if CDP_HAVE_HWLOC
static cdp_status bind_hwloc(const char *cpuset, int *n_cpus)
{
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return cdp_fail(CDP_ERR_UNSUPPORTED, "hwloc_topology_init failed");
    /* CPUs only: no PCI scan */
    hwloc_topology_set_all_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_type_filter(topo, HWLOC_OBJ_PU, HWLOC_TYPE_FILTER_KEEP_ALL);
    hwloc_topology_set_type_filter(topo, HWLOC_OBJ_NUMANODE, HWLOC_TYPE_FILTER_KEEP_ALL);
    cdp_status st = CDP_OK;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set || hwloc_topology_load(topo) != 0) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "hwloc could not read this machine");
    } else if (hwloc_bitmap_list_sscanf(set, cpuset) != 0) {
        st = cdp_fail(CDP_ERR_INVALID, "CPU list \"%.60s\" does not parse", cpuset);
    } else {
        hwloc_bitmap_and(set, set, hwloc_topology_get_allowed_cpuset(topo));
        if (hwloc_bitmap_iszero(set))
            st = cdp_fail(CDP_ERR_INVALID, "none of CPUs %s is available to this process", cpuset);
        else if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) != 0)
            st = cdp_fail(CDP_ERR_UNSUPPORTED, "hwloc_set_cpubind(%s): %s", cpuset, strerror(errno));
        else
            *n_cpus = hwloc_bitmap_weight(set);
    }
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(topo);
    return st;
}
#endif

/* Without hwloc: sched_setaffinity on every thread of the process. */
static cdp_status bind_sched(const char *cpuset, int *n_cpus)
{
    int *cpus = NULL, n = 0;
    cdp_status st = cdp_cpuset_parse_list(cpuset, &cpus, &n);
    if (st) return st;
    cpu_set_t allowed, want;
    CPU_ZERO(&want);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) CPU_ZERO(&allowed);
    for (int i = 0; i < n; i++)
        if (cpus[i] < CPU_SETSIZE && CPU_ISSET(cpus[i], &allowed)) CPU_SET(cpus[i], &want);
    free(cpus);
    const int k = CPU_COUNT(&want);
    if (!k) return cdp_fail(CDP_ERR_INVALID, "none of CPUs %s is available to this process", cpuset);
    DIR *d = opendir("/proc/self/task");
    int bad = 0;
    if (d) {
        for (struct dirent *t; (t = readdir(d));)
            if (t->d_name[0] != '.' && sched_setaffinity((pid_t)atoi(t->d_name), sizeof want, &want) != 0) bad = errno;
        closedir(d);
    } else if (sched_setaffinity(0, sizeof want, &want) != 0) {
        bad = errno;
    }
    if (bad) return cdp_fail(CDP_ERR_UNSUPPORTED, "sched_setaffinity(%s): %s", cpuset, strerror(bad));
    *n_cpus = k;
    return CDP_OK;
}

cdp_status cdp_launch_bind(const char *cpuset, int *n_cpus)
{
#if CDP_HAVE_HWLOC
    cdp_status st = bind_hwloc(cpuset, n_cpus);
    if (st != CDP_ERR_UNSUPPORTED) return st;
    CDP_DEBUG(EXEC, "%s; binding with sched_setaffinity", cdp_last_error());
#endif
    return bind_sched(cpuset, n_cpus);
}

int cdp_launch_blas_threads(int n_cpus) { return cdp_cpu_set_threads(n_cpus); }
