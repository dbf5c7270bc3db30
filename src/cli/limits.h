/* The limits a job runs under (docs/jobs.md, "Limits"), checked before it
 * starts so that a limit too small is a line naming it, not a hang. */
#ifndef CDP_CLI_LIMITS_H
#define CDP_CLI_LIMITS_H

#include "cdp/status.h"
#include "pipeline/layout.h"

/* Checks this process's limits for running layout l here (its node 0 ranks;
 * launching: under mpirun or srun, which also need open files and TMPDIR):
 * the file size limit (launching: Open MPI's files need 16 MiB; CDP_ERR_INVALID
 * naming ulimit -f), the open-file limit (the soft limit is raised to what is needed when the
 * hard one allows; else CDP_ERR_INVALID naming ulimit -n), the address-space
 * limit against the ranks' planned memory plus what the program maps
 * (CDP_ERR_INVALID naming ulimit -v), and the free space of the folder
 * tmpdir (CDP_ERR_IO naming TMPDIR). */
cdp_status cdp_cli_check_limits(const struct cdp_layout *l, int launching, const char *tmpdir);

#endif
