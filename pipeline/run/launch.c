/* The launcher (launch.h): the mpirun / srun command line that starts a
 * layout's ranks on their nodes, running it, and stopping it. Binding a rank
 * to its CPUs is launch_bind.c; the hosts (hostfiles, Slurm's node list, the
 * probe of a lost host) are launch_hosts.c. */
#include "pipeline/run/launch.h"
#include "pipeline/run/launch_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

/* ---- the command line -------------------------------------------------------------- */

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
    char *item[256];
    int n;
    char num[4][24];
    char env[96][128]; /* names of variables passed by prefix */
    int n_env;
    char nodelist[4096];
};

static void push(struct args *a, const char *s) { a->item[a->n++] = (char *)s; }

#define ARGS_FOR_ENV 200 /* -x NAME pairs end here: the rest is for the program's own */

extern char **environ;

/* -x NAME for each name of pass (and, for an entry "PREFIX*", every variable
 * of this environment that starts with PREFIX) that is set here. */
static void push_env(struct args *a, const char *const *pass)
{
    for (int i = 0; pass && pass[i]; i++) {
        const size_t n = strlen(pass[i]);
        if (n && pass[i][n - 1] == '*') {
            for (char **e = environ; e && *e && a->n < ARGS_FOR_ENV; e++) {
                const char *eq = strchr(*e, '=');
                if (!eq || strncmp(*e, pass[i], n - 1) != 0) continue;
                /* the name only: -x NAME passes this process's value */
                const size_t len = (size_t)(eq - *e);
                if (len >= sizeof a->env[0] || a->n_env == 96) continue;
                memcpy(a->env[a->n_env], *e, len);
                a->env[a->n_env][len] = '\0';
                push(a, "-x");
                push(a, a->env[a->n_env++]);
            }
        } else if (getenv(pass[i]) && a->n < ARGS_FOR_ENV) {
            push(a, "-x");
            push(a, pass[i]);
        }
    }
}


cdp_status cdp_launch_argv(const struct cdp_launch_spec *s, enum cdp_launcher which, char ***out)
{
    const struct cdp_layout *l = s->layout;
    int *count = calloc((size_t)l->n_nodes, sizeof *count);
    if (!count) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const int used = cdp_launch_ranks_per_node(l, count);
    struct args a = {.n = 0, .n_env = 0, .nodelist = ""};
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
        /* node i of the layout on the allocation's i-th node: after a restart
         * that left a node out, the nodes that hold ranks are not the first */
        char **hosts = NULL;
        int nh = 0;
        const cdp_status ha = st ? CDP_ERR_UNSUPPORTED : cdp_launch_alloc_hosts(&hosts, &nh);
        if (ha == CDP_OK && hosts) {
            if (nh < l->n_nodes)
                st = cdp_fail(CDP_ERR_INVALID, "the layout has %d nodes and the Slurm allocation %d "
                              "(SLURM_JOB_NODELIST): ask for as many nodes as the plan's /cluster/nodes",
                              l->n_nodes, nh);
            size_t o = 0;
            for (int i = 0; !st && i < l->n_nodes; i++)
                if (count[i] && o + strlen(hosts[i]) + 2 < sizeof a.nodelist)
                    o += (size_t)snprintf(a.nodelist + o, sizeof a.nodelist - o, "%s%s", o ? "," : "", hosts[i]);
            cdp_launch_free_hosts(hosts, nh);
        } else if (ha != CDP_ERR_UNSUPPORTED) {
            st = ha;
        }
        if (a.nodelist[0]) {
            push(&a, "--nodelist");
            push(&a, a.nodelist);
        }
        push(&a, "--distribution=block");
        push(&a, "--cpu-bind=none");
        push(&a, "--kill-on-bad-exit=1");
        /* a step whose node was lost keeps its CPUs on the other nodes until
         * Slurm declares that node down (SlurmdTimeout): the relaunch on the
         * nodes left may share them (this process runs one step at a time) */
        push(&a, "--overlap");
        /* the ranks find each other through PMIx whatever MpiDefault says
         * (under "none" every task would be a launcher); SLURM_MPI_TYPE set
         * by the user wins */
        const char *mpi = getenv("SLURM_MPI_TYPE");
        if (!mpi || !*mpi) push(&a, "--mpi=pmix");
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
            } else if (!(st = cdp_launch_read_hosts(s->hostfile, &hosts, &nh))) {
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
            push_env(&a, s->pass_env);
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

/* The launcher's stderr passed on to ours, read line by line for the first
 * rank it says died. */
struct relay {
    char line[1024];
    size_t n;
    int *died;
};

static void relay_bytes(struct relay *r, const char *buf, ssize_t got)
{
    ssize_t w = write(2, buf, (size_t)got);
    (void)w;
    for (ssize_t i = 0; i < got; i++) {
        if (buf[i] != '\n' && r->n < sizeof r->line - 1) {
            r->line[r->n++] = buf[i];
            continue;
        }
        r->line[r->n] = '\0';
        r->n = 0;
        if (*r->died < 0) *r->died = died_rank(r->line);
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

/* Reads what fd holds within wait_ms; 0 at its end (or an error), 1 else. */
static int relay_some(struct relay *r, int fd, int wait_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    const int k = poll(&p, 1, wait_ms);
    if (k <= 0) return k == 0 || errno == EINTR;
    char buf[4096];
    const ssize_t got = read(fd, buf, sizeof buf);
    if (got < 0) return errno == EINTR || errno == EAGAIN;
    if (got == 0) return 0;
    relay_bytes(r, buf, got);
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits for the launcher (pid), passing its stderr (fd, or -1) on. It does
 * not wait for the end of that stream: daemons on other hosts hold it open
 * after mpirun is gone (until TCP gives up on a host cut off, minutes), so
 * once mpirun has exited only what is there already is read. While it runs,
 * s->failing says whether a rank has failed; grace_s after that the job is
 * ended (SIGTERM, SIGKILL 3 s later): mpirun itself waits for the daemon of
 * a host it can no longer reach. *ended gets 1 then. */
static int wait_launcher(const struct cdp_launch_spec *s, pid_t pid, int fd, int *ended)
{
    struct relay r = {.n = 0, .died = s->died};
    int status = 0, term_sent = 0;
    double failed_at = -1, term_at = 0;
    *ended = 0;
    for (;;) {
        const pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR)) break;
        if (fd >= 0) {
            if (!relay_some(&r, fd, 250)) {
                close(fd);
                fd = -1;
            }
        } else {
            poll(NULL, 0, 250);
        }
        const double t = now_s();
        if (failed_at < 0 && s->failing && s->failing(s->ctx)) failed_at = t;
        if (failed_at >= 0 && !term_sent && t - failed_at > s->grace_s) {
            CDP_WARN(EXEC, "a rank failed %.0f s ago and the launcher has not ended the job: ending it", s->grace_s);
            kill(pid, SIGTERM);
            term_sent = 1;
            term_at = t;
            *ended = 1;
        } else if (term_sent == 1 && t - term_at > 3) {
            kill(pid, SIGKILL);
            term_sent = 2;
        }
    }
    /* what is in the pipe already: the launcher's last lines */
    if (fd >= 0) {
        const double until = now_s() + 1.0;
        while (now_s() < until && relay_some(&r, fd, 100)) {
        }
        close(fd);
    }
    return status;
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
    if (err_fds[1] >= 0) close(err_fds[1]);
    int ended = 0;
    const int status = wait_launcher(s, pid, err_fds[0], &ended);
    end_orphans();
    alarm(0);
    for (int i = 0; i < 5; i++) sigaction(sigs[i], &old[i], NULL);
    launched = 0;
    if (s->stopped) *s->stopped = stop_sig ? stop_sig : ended ? -1 : 0;
    if (got == (ssize_t)sizeof e) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "%s could not be started (%s)%s", argv[0], strerror(e),
                      e != ENOENT ? "" : which == CDP_LAUNCHER_SRUN ? ": Slurm's srun is not on PATH"
                                                                    : ": install openmpi-bin (Open MPI's mpirun)");
        free(argv);
        return st;
    }
    free(argv);
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    return CDP_OK;
}
