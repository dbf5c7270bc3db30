/* The launcher: starts the ranks of a layout where it says (mpirun, or srun
 * inside a Slurm allocation, node i of the layout on the i-th host), and binds
 * each rank to its CPU set once it runs (docs/pipeline.md, "Where ranks run"). */
#ifndef CDP_PIPELINE_LAUNCH_H
#define CDP_PIPELINE_LAUNCH_H

#include "cdp/status.h"
#include "pipeline/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Binds every thread of this process to the CPUs of `cpuset` (Linux list
 * form, "0-3,8"), with hwloc where the build has it, else sched_setaffinity
 * thread by thread; *n_cpus gets how many CPUs that is. CDP_ERR_INVALID for a
 * list that does not parse or holds none of the CPUs this process may use;
 * CDP_ERR_UNSUPPORTED where the system refuses. */
cdp_status cdp_launch_bind(const char *cpuset, int *n_cpus);

/* BLAS threads for a rank bound to n CPUs: n, unless the environment fixes a
 * count (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS). Returns the count in use. */
int cdp_launch_blas_threads(int n_cpus);

enum cdp_launcher { CDP_LAUNCHER_MPIRUN = 0, CDP_LAUNCHER_SRUN };

struct cdp_launch_spec {
    const struct cdp_layout *layout; /* not owned */
    const char *program;             /* the binary every rank runs */
    char *const *args;               /* its arguments, NULL-terminated (not owned) */
    const char *hostfile;            /* mpirun: hosts, one per layout node in order (Open MPI hostfile
                                        syntax: the first word of each line; '#' comments); NULL: this host */
    const char *tmpdir;              /* where the launcher may write the hostfile it passes on */
    const char *const *pass_env;     /* mpirun on several nodes: these variables reach every rank (-x NAME);
                                        an entry "PREFIX*": every variable of this environment whose name
                                        starts with PREFIX; NULL-terminated; NULL: none (srun passes the
                                        whole environment) */
    int *died;                       /* not NULL: the launcher's output is read as it passes through, and this
                                        gets the rank it said died first ("process rank N ... exited on
                                        signal", srun's "task N: ..."), else -1 */
    int stop_saves;                  /* a stop asked with SIGTERM, SIGHUP or SIGUSR1 lets the ranks save a
                                        checkpoint first: they get SIGUSR1 and CDP_STOP_GRACE_S seconds */
    /* not NULL: asked about every 250 ms while the job runs whether a rank
     * has failed; grace_s seconds after it first says so, a launcher still
     * running is ended (mpirun waits minutes for the daemon of a host it can
     * no longer reach) */
    int (*failing)(void *ctx);
    void *ctx;
    double grace_s;
    int *stopped; /* not NULL: how the job was stopped: the signal this process got and passed on to the
                     launcher (SIGINT, SIGTERM, SIGHUP, SIGUSR1: a stop), -1 when the launcher was ended
                     grace_s after a rank failed, else 0 */
};

/* Seconds a stop waits for the ranks to save and end before they are made
 * to end (CDP_STOP_GRACE_S, 0 to 3600; default 25: under Slurm's default
 * KillWait of 30 s). */
int cdp_launch_stop_grace(void);

/* Which launcher a job uses: srun inside a Slurm allocation (SLURM_JOB_ID set)
 * when srun is on PATH and no hostfile is given, else mpirun. */
enum cdp_launcher cdp_launch_which(const struct cdp_launch_spec *s);

/* The command line that starts s's ranks with launcher `which`: rank i of the
 * layout on its node, consecutive ranks per node, no binding by the launcher
 * (each rank binds itself); srun with --mpi=pmix unless SLURM_MPI_TYPE is set,
 * --overlap, and --nodelist of the allocation's nodes (SLURM_JOB_NODELIST:
 * node i of the layout on the i-th) that hold ranks. mpirun with several nodes writes
 * tmpdir/hosts.txt ("HOST slots=K" per layout node). *argv is malloc'd and
 * NULL-terminated; its strings live in it (one free). CDP_ERR_INVALID naming
 * the hostfile when it has fewer hosts than the layout has nodes, or the
 * layout when srun cannot place unequal nodes; CDP_ERR_IO. */
cdp_status cdp_launch_argv(const struct cdp_launch_spec *s, enum cdp_launcher which, char ***argv);

/* Starts the ranks and waits for them; *exit_code gets the launcher's exit
 * status (128 + signal when it was killed). The launcher (mpirun, srun) runs
 * in a process group of its own (a terminal's Ctrl-C reaches this process
 * only) and dies with this process (PR_SET_PDEATHSIG: SIGTERM, on which it
 * ends its ranks); ranks it leaves behind are reparented here (a subreaper)
 * and ended, so none is left when this returns.
 * A signal to this process stops the job (docs/jobs.md): SIGINT ends it now
 * (SIGTERM to the launcher); SIGTERM, SIGHUP and SIGUSR1 do the same, or with
 * stop_saves first pass SIGUSR1 on (the ranks save and end) and end it after
 * the grace; a second signal ends it now. *s->stopped says which came.
 * Where the ranks outnumber the CPUs this process may use (its affinity
 * mask, not the CPUs online), the launcher is told to oversubscribe, with a
 * warning. The launcher's stderr (when s->died asks for it) is read while it
 * runs, not to its end: daemons of other hosts may hold it open long after.
 * CDP_ERR_UNSUPPORTED when the launcher cannot be started (named,
 * with the system's reason). */
cdp_status cdp_launch_run(const struct cdp_launch_spec *s, int *exit_code);

/* The hosts of a layout's nodes that do not answer: each host that runs
 * ranks (not this one) is asked to run `true`, all at once: with a hostfile
 * through the agent Open MPI uses (OMPI_MCA_plm_rsh_agent, else ssh; with
 * BatchMode and a ConnectTimeout of timeout_s when it is ssh), under srun as
 * a one-task step on that node of the allocation (srun --overlap --nodelist
 * HOST). lost[node] is set to 1 for a host that did not answer within
 * timeout_s + 2 s. CDP_OK with nothing set where neither a hostfile nor an
 * allocation names the hosts. */
cdp_status cdp_launch_probe_hosts(const struct cdp_launch_spec *s, int timeout_s, unsigned char *lost);

/* The host layout node `node` runs on: the hostfile's line, or under srun the
 * allocation's node (SLURM_JOB_NODELIST) of that place; NULL where neither
 * says, or past its end; malloc'd. */
char *cdp_launch_host_of(const struct cdp_launch_spec *s, int node);

/* The names of a Slurm host list ("h[0-2],gpu07", "n[01-03,7]"), in order,
 * numbers as wide as written; *hosts malloc'd (each name too). CDP_ERR_INVALID
 * naming the list when it does not parse. */
cdp_status cdp_launch_hostlist(const char *list, char ***hosts, int *n);
/* Whether this rank runs where the layout says: under mpirun or srun, its
 * local rank on its host (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) must be
 * its place among its layout node's ranks. CDP_ERR_INVALID saying both, and
 * how to launch so that they agree; CDP_OK when the launcher does not say. */
cdp_status cdp_launch_check_node(const struct cdp_layout *l, int rank);

#ifdef __cplusplus
}
#endif

#endif
