/* The launcher (launch.h): binding a rank to its CPUs, and the mpirun / srun
 * command line that starts a layout's ranks on their nodes. */
#include "pipeline/launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* ---- the command line -------------------------------------------------------------- */

/* Ranks of each layout node, and how many nodes hold any. */
static int ranks_per_node(const struct cdp_layout *l, int *count)
{
    int used = 0;
    for (int i = 0; i < l->n_nodes; i++) count[i] = 0;
    for (int i = 0; i < l->n_ranks; i++) count[l->rank[i].node]++;
    for (int i = 0; i < l->n_nodes; i++) used += count[i] > 0;
    return used;
}

/* The first word of every line of an Open MPI hostfile, in order. */
static cdp_status read_hosts(const char *path, char ***hosts, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return cdp_fail(CDP_ERR_INVALID, "%s: cannot read the hostfile: %s", path, strerror(errno));
    char line[1024];
    char **h = NULL;
    int k = 0, cap = 0;
    cdp_status st = CDP_OK;
    while (!st && fgets(line, sizeof line, f)) {
        char *c = strchr(line, '#');
        if (c) *c = '\0';
        char *w = strtok(line, " \t\r\n");
        if (!w) continue;
        if (k == cap) {
            char **q = realloc(h, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *q);
            if (!q) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                break;
            }
            h = q;
        }
        if (!(h[k] = strdup(w))) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        else k++;
    }
    fclose(f);
    if (!st && k == 0) st = cdp_fail(CDP_ERR_INVALID, "%s: no hosts in the hostfile", path);
    if (st) {
        for (int i = 0; i < k; i++) free(h[i]);
        free(h);
        return st;
    }
    *hosts = h;
    *n = k;
    return CDP_OK;
}

enum cdp_launcher cdp_launch_which(const struct cdp_launch_spec *s)
{
    const char *job = getenv("SLURM_JOB_ID");
    if (s->hostfile || !job || !*job) return CDP_LAUNCHER_MPIRUN;
    const char *path = getenv("PATH");
    char buf[4096];
    for (const char *p = path ? path : ""; *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n && n < sizeof buf - 6) {
            snprintf(buf, sizeof buf, "%.*s/srun", (int)n, p);
            if (access(buf, X_OK) == 0) return CDP_LAUNCHER_SRUN;
        }
        p += n + (e != NULL);
    }
    return CDP_LAUNCHER_MPIRUN;
}

/* argv under construction: strings are copied into one arena at the end. */
struct args {
    char *item[64];
    int n;
    char num[4][24];
};

static void push(struct args *a, const char *s) { a->item[a->n++] = (char *)s; }

cdp_status cdp_launch_argv(const struct cdp_launch_spec *s, enum cdp_launcher which, char ***out)
{
    const struct cdp_layout *l = s->layout;
    int *count = calloc((size_t)l->n_nodes, sizeof *count);
    if (!count) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const int used = ranks_per_node(l, count);
    struct args a = {.n = 0};
    char hostpath[4200] = "";
    cdp_status st = CDP_OK;
    snprintf(a.num[0], sizeof a.num[0], "%d", l->n_ranks);
    if (which == CDP_LAUNCHER_SRUN) {
        int per = 0;
        for (int i = 0; i < l->n_nodes; i++)
            if (count[i]) {
                if (per && count[i] != per)
                    st = cdp_fail(CDP_ERR_INVALID, "the layout has %d ranks on one node and %d on another; srun "
                                  "starts the same number on each: start it with mpirun --hostfile", per, count[i]);
                per = count[i];
            }
        snprintf(a.num[1], sizeof a.num[1], "%d", used);
        snprintf(a.num[2], sizeof a.num[2], "%d", per);
        push(&a, "srun");
        push(&a, "--ntasks");
        push(&a, a.num[0]);
        push(&a, "--nodes");
        push(&a, a.num[1]);
        push(&a, "--ntasks-per-node");
        push(&a, a.num[2]);
        push(&a, "--distribution=block");
        push(&a, "--cpu-bind=none");
        push(&a, "--kill-on-bad-exit=1");
    } else {
        push(&a, "mpirun");
        push(&a, "-np");
        push(&a, a.num[0]);
        /* every rank binds itself to the layout's CPUs */
        push(&a, "--bind-to");
        push(&a, "none");
        if (used > 1 || s->hostfile) {
            char **hosts = NULL;
            int nh = 0;
            if (!s->hostfile) {
                st = cdp_fail(CDP_ERR_INVALID, "the layout puts ranks on %d nodes: give the hosts (cdphybrid --plan P "
                              "--hostfile FILE, one host per line), or start it yourself (mpirun --hostfile FILE -np %d "
                              "cdphybrid --plan planned.json)", used, l->n_ranks);
            } else if (!(st = read_hosts(s->hostfile, &hosts, &nh))) {
                if (nh < l->n_nodes)
                    st = cdp_fail(CDP_ERR_INVALID, "%s: %d host%s for a layout of %d nodes (node i runs on the i-th "
                                  "host)", s->hostfile, nh, nh == 1 ? "" : "s", l->n_nodes);
                snprintf(hostpath, sizeof hostpath, "%s/hosts.txt", s->tmpdir ? s->tmpdir : ".");
                FILE *f = st ? NULL : fopen(hostpath, "w");
                if (!st && !f) st = cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", hostpath, strerror(errno));
                for (int i = 0; f && i < l->n_nodes; i++)
                    if (count[i]) fprintf(f, "%s slots=%d max_slots=%d\n", hosts[i], count[i], count[i]);
                if (f && fclose(f) != 0) st = cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", hostpath, strerror(errno));
                for (int i = 0; i < nh; i++) free(hosts[i]);
                free(hosts);
            }
            push(&a, "--hostfile");
            push(&a, hostpath);
            push(&a, "--map-by");
            push(&a, "slot");
            for (int i = 0; s->pass_env && s->pass_env[i] && a.n < 56; i++)
                if (getenv(s->pass_env[i])) {
                    push(&a, "-x");
                    push(&a, s->pass_env[i]);
                }
        }
    }
    free(count);
    if (st) return st;
    push(&a, s->program);
    int nargs = 0;
    while (s->args[nargs]) nargs++;
    size_t bytes = 0;
    for (int i = 0; i < a.n; i++) bytes += strlen(a.item[i]) + 1;
    for (int i = 0; i < nargs; i++) bytes += strlen(s->args[i]) + 1;
    const size_t n = (size_t)(a.n + nargs);
    char **v = malloc((n + 1) * sizeof *v + bytes);
    if (!v) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    char *arena = (char *)(v + n + 1);
    for (size_t i = 0; i < n; i++) {
        const char *src = (int)i < a.n ? a.item[i] : s->args[(int)i - a.n];
        const size_t len = strlen(src) + 1;
        memcpy(arena, src, len);
        v[i] = arena;
        arena += len;
    }
    v[n] = NULL;
    *out = v;
    return CDP_OK;
}

static volatile pid_t launched;

/* The rank a line of mpirun's or srun's output says died, or -1. */
static int died_rank(const char *line)
{
    int r = -1;
    const char *m = strstr(line, "process rank ");
    if (m && strstr(line, "exited on signal") && sscanf(m, "process rank %d", &r) == 1) return r;
    m = strstr(line, ": task ");
    if (m && strstr(line, "srun: error") && sscanf(m, ": task %d", &r) == 1) return r;
    return -1;
}

/* Passes the launcher's stderr (fd) on to ours, line by line, noting the
 * first rank it says died. */
static void pass_through(int fd, int *died)
{
    char buf[4096], line[1024];
    size_t n = 0;
    for (;;) {
        const ssize_t got = read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        ssize_t w = write(2, buf, (size_t)got);
        (void)w;
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] != '\n' && n < sizeof line - 1) {
                line[n++] = buf[i];
                continue;
            }
            line[n] = '\0';
            n = 0;
            if (*died < 0) *died = died_rank(line);
        }
    }
}

/* ---- stopping: signals to this process -------------------------------------------- */

static volatile sig_atomic_t stop_sig;   /* the first signal that asked the job to stop */
static volatile sig_atomic_t stop_level; /* 1: the ranks were asked to save and end; 2: ended; 3: killed */
static volatile sig_atomic_t saves;      /* the spec's stop_saves */
static volatile sig_atomic_t grace_s;    /* cdp_launch_stop_grace(), read before the handlers are set */

int cdp_launch_stop_grace(void)
{
    const char *v = getenv("CDP_STOP_GRACE_S");
    if (!v || !*v) return 25;
    char *end = NULL;
    const long g = strtol(v, &end, 10);
    if (*end || g < 0 || g > 3600) {
        CDP_WARN(EXEC, "CDP_STOP_GRACE_S=\"%s\" is not a number of seconds 0 to 3600; 25 is used", v);
        return 25;
    }
    return (int)g;
}

static void stop_escalate(void)
{
    const pid_t p = launched;
    if (p <= 0) return;
    if (stop_level < 2) {
        stop_level = 2;
        kill(p, SIGTERM); /* mpirun and srun end their ranks */
        alarm(10);        /* and if they do not, the whole group goes */
    } else {
        stop_level = 3;
        kill(-p, SIGKILL);
        kill(p, SIGKILL);
    }
}

static void on_stop(int sig)
{
    if (!stop_sig) stop_sig = sig;
    else if (sig != SIGALRM) {
        stop_escalate(); /* a second signal: now */
        return;
    }
    if (sig == SIGALRM) {
        stop_escalate(); /* the grace is over */
        return;
    }
    if (launched <= 0) return;
    if (sig != SIGINT && saves && stop_level == 0) {
        stop_level = 1;
        if (grace_s > 0) {
            kill(launched, SIGUSR1); /* mpirun and srun pass it to every rank: save and end */
            alarm((unsigned)grace_s);
            return;
        }
    }
    stop_escalate();
}

/* The CPUs this process may run on (its affinity mask), or the CPUs online. */
static int allowed_cpus(char *list, size_t cap)
{
    cpu_set_t set;
    list[0] = '\0';
    if (sched_getaffinity(0, sizeof set, &set) != 0) return (int)sysconf(_SC_NPROCESSORS_ONLN);
    size_t o = 0;
    for (int c = 0; c < CPU_SETSIZE && o + 12 < cap; c++)
        if (CPU_ISSET(c, &set)) o += (size_t)snprintf(list + o, cap - o, "%s%d", o ? "," : "", c);
    return CPU_COUNT(&set);
}

/* How many live children this process has (ranks the launcher left behind
 * are reparented here: this process is their subreaper); each gets sig when
 * it is not 0. */
static int children(int sig)
{
    const pid_t me = getpid();
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        const size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = '\0';
        const char *close_paren = strrchr(buf, ')'); /* the name may hold spaces */
        char state = 0;
        long ppid = 0;
        if (!close_paren || sscanf(close_paren + 1, " %c %ld", &state, &ppid) != 2 || ppid != me) continue;
        if (state == 'Z') continue; /* reaped below */
        n++;
        if (sig) kill((pid_t)atol(e->d_name), sig);
    }
    closedir(d);
    return n;
}

/* After the launcher has ended: every rank it left behind (reparented here)
 * is gone before this returns, ended when it outlives a short wait. */
static void end_orphans(void)
{
    for (int i = 0; i < 140; i++) { /* 5 s to finish their own ending, then SIGTERM, then SIGKILL */
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (!children(i == 100 ? SIGTERM : i == 130 ? SIGKILL : 0)) return;
        if (i == 100) CDP_WARN(EXEC, "ranks of the job outlived its launcher: ending them");
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

cdp_status cdp_launch_run(const struct cdp_launch_spec *s, int *exit_code)
{
    const enum cdp_launcher which = cdp_launch_which(s);
    char **argv = NULL;
    cdp_status st = cdp_launch_argv(s, which, &argv);
    if (st) return st;
    /* Open MPI refuses root and more ranks than cores unless told */
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    /* more ranks on this host than the CPUs it lets this process use (taskset,
     * a cpuset): oversubscribed, and said so */
    int here = 0;
    for (int i = 0; i < s->layout->n_ranks; i++) here += s->layout->rank[i].node == 0;
    char cpus[512];
    const int allowed = allowed_cpus(cpus, sizeof cpus);
    if (here > allowed) {
        setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
        CDP_WARN(EXEC, "%d ranks on this host and %d CPU%s this process may use (%s%s): the ranks share them "
                 "(oversubscribed), each runs slower", here, allowed, allowed == 1 ? "" : "s",
                 cpus[0] ? "CPUs " : "", cpus[0] ? cpus : "online");
    }
    if (cdp_log_enabled(CDP_LOG_INFO, CDP_SUBSYS_EXEC)) {
        char line[2048];
        size_t o = 0;
        for (int i = 0; argv[i] && o < sizeof line - 1; i++)
            o += (size_t)snprintf(line + o, sizeof line - o, "%s%s", i ? " " : "", argv[i]);
        CDP_INFO(EXEC, "starting %d ranks: %s", s->layout->n_ranks, line);
    }
    fflush(stdout);
    fflush(stderr);
    int fds[2], err_fds[2] = {-1, -1};
    if (s->died) {
        *s->died = -1;
        if (pipe2(err_fds, O_CLOEXEC) != 0) err_fds[0] = err_fds[1] = -1;
    }
    if (s->stopped_by) *s->stopped_by = 0;
    if (pipe2(fds, O_CLOEXEC) != 0) { /* closed by a successful exec: the read below then returns 0 */
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "cannot start %s: pipe: %s", argv[0], strerror(errno));
        free(argv);
        return st;
    }
    /* ranks the launcher leaves behind are reparented here, to be reaped and
     * ended (Open MPI starts each rank in a process group of its own) */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* the signals that stop the job are held until the child is known */
    sigset_t block, old_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGALRM);
    sigprocmask(SIG_BLOCK, &block, &old_mask);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        close(fds[0]);
        close(fds[1]);
        if (err_fds[0] >= 0) {
            close(err_fds[0]);
            close(err_fds[1]);
        }
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "cannot start %s: fork: %s", argv[0], strerror(errno));
        free(argv);
        return st;
    }
    if (pid == 0) {
        /* a group of its own: a terminal's Ctrl-C reaches this process only,
         * which decides; and when this process dies, so does the launcher */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        close(fds[0]);
        if (err_fds[1] >= 0) dup2(err_fds[1], 2); /* dup2 clears close-on-exec of the copy */
        execvp(argv[0], argv);
        /* tell the parent why, then go */
        const int e = errno;
        ssize_t w = write(fds[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    setpgid(pid, pid); /* also here: whichever runs first */
    close(fds[1]);
    launched = pid;
    stop_sig = 0;
    stop_level = 0;
    saves = s->stop_saves;
    grace_s = cdp_launch_stop_grace();
    struct sigaction sa = {.sa_handler = on_stop}, old[5];
    sigemptyset(&sa.sa_mask);
    const int sigs[5] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGALRM};
    for (int i = 0; i < 5; i++) sigaction(sigs[i], &sa, &old[i]);
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    int e = 0;
    ssize_t got;
    while ((got = read(fds[0], &e, sizeof e)) < 0 && errno == EINTR) {
    }
    close(fds[0]);
    if (err_fds[1] >= 0) {
        close(err_fds[1]);
        pass_through(err_fds[0], s->died);
        close(err_fds[0]);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    end_orphans();
    alarm(0);
    for (int i = 0; i < 5; i++) sigaction(sigs[i], &old[i], NULL);
    launched = 0;
    if (s->stopped_by) *s->stopped_by = stop_sig;
    if (got == (ssize_t)sizeof e) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "%s could not be started (%s)", argv[0], strerror(e));
        free(argv);
        return st;
    }
    free(argv);
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    return CDP_OK;
}

cdp_status cdp_launch_check_node(const struct cdp_layout *l, int rank)
{
    const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!v || !*v) v = getenv("SLURM_LOCALID");
    if (!v || !*v) return CDP_OK;
    const int node = l->rank[rank].node;
    int place = 0;
    for (int i = 0; i < rank; i++) place += l->rank[i].node == node;
    if (atoi(v) == place) return CDP_OK;
    return cdp_fail(CDP_ERR_INVALID, "rank %d is local rank %s on its host, but the layout makes it rank %d of node %d: "
                    "start the ranks node by node in order (cdphybrid --hostfile FILE does; with mpirun give "
                    "--map-by slot and a hostfile with the layout's ranks per node as slots)", rank, v, place, node);
}
