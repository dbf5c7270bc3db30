/* Internal: what launch.c and launch_hosts.c share. */
#ifndef CDP_PIPELINE_RUN_LAUNCH_INTERNAL_H
#define CDP_PIPELINE_RUN_LAUNCH_INTERNAL_H

#include "pipeline/run/launch.h"

/* Ranks of each layout node into count (n_nodes entries), and how many nodes hold any. */
int cdp_launch_ranks_per_node(const struct cdp_layout *l, int *count);
/* The first word of every line of an Open MPI hostfile, in order. */
cdp_status cdp_launch_read_hosts(const char *path, char ***hosts, int *n);
/* The hosts of the Slurm allocation this process runs in (SLURM_JOB_NODELIST):
 * CDP_ERR_UNSUPPORTED, with no message, outside one. */
cdp_status cdp_launch_alloc_hosts(char ***hosts, int *n);
/* The hosts layout node i runs on: the hostfile's lines, or under srun the
 * allocation's nodes (CDP_ERR_UNSUPPORTED, with no message: neither is known). */
cdp_status cdp_launch_node_hosts(const struct cdp_launch_spec *s, char ***hosts, int *n);
void cdp_launch_free_hosts(char **hosts, int n);

#endif
