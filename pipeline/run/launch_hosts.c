/* The launcher's hosts (launch.h): a hostfile's lines, Slurm's node list,
 * the host each layout node runs on, the check that a rank started on its
 * node, and the probe that tells a host that no longer answers. */
#include "pipeline/run/launch.h"
#include "pipeline/run/launch_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"

/* Ranks of each layout node, and how many nodes hold any. */
int cdp_launch_ranks_per_node(const struct cdp_layout *l, int *count)
{
    int used = 0;
    for (int i = 0; i < l->n_nodes; i++) count[i] = 0;
    for (int i = 0; i < l->n_ranks; i++) count[l->rank[i].node]++;
    for (int i = 0; i < l->n_nodes; i++) used += count[i] > 0;
    return used;
}

/* The first word of every line of an Open MPI hostfile, in order. */
cdp_status cdp_launch_read_hosts(const char *path, char ***hosts, int *n)
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
    /* Open MPI counts a host once, however many lines name it: two layout
     * nodes on one host would be merged into one and their ranks misplaced */
    for (int i = 1; !st && i < k; i++)
        for (int j = 0; j < i && !st; j++)
            if (!strcmp(h[i], h[j]))
                st = cdp_fail(CDP_ERR_INVALID, "%s: host %d and host %d are both \"%s\": each layout node needs a "
                              "host of its own (Open MPI takes one host once); name each host once, or plan fewer "
                              "/cluster/nodes", path, j + 1, i + 1, h[i]);
    if (st) {
        for (int i = 0; i < k; i++) free(h[i]);
        free(h);
        return st;
    }
    *hosts = h;
    *n = k;
    return CDP_OK;
}

/* Appends host name `name` to *h (k of cap). */
static cdp_status add_host(char ***h, int *k, int *cap, const char *name, size_t len)
{
    if (*k == *cap) {
        char **q = realloc(*h, (size_t)(*cap = *cap ? 2 * *cap : 16) * sizeof *q);
        if (!q) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        *h = q;
    }
    if (!((*h)[*k] = strndup(name, len))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    (*k)++;
    return CDP_OK;
}

cdp_status cdp_launch_hostlist(const char *list, char ***hosts, int *n)
{
    char **h = NULL;
    int k = 0, cap = 0;
    cdp_status st = CDP_OK;
    const char *p = list ? list : "";
    while (!st && *p) {
        /* one item: up to a comma outside brackets */
        const char *e = p;
        int depth = 0;
        while (*e && (depth || *e != ',')) depth += *e == '[' ? 1 : *e == ']' ? -1 : 0, e++;
        const char *open = memchr(p, '[', (size_t)(e - p));
        if (e == p) {
        } else if (!open) {
            st = add_host(&h, &k, &cap, p, (size_t)(e - p));
        } else {
            const char *close = memchr(open, ']', (size_t)(e - open));
            if (!close) {
                st = cdp_fail(CDP_ERR_INVALID, "host list \"%.80s\": a '[' without its ']'", list);
                break;
            }
            /* prefix[a-b,c]suffix: each number keeps the width it is written with */
            if (memchr(close + 1, '[', (size_t)(e - close - 1)))
                st = cdp_fail(CDP_ERR_INVALID, "host list \"%.80s\": one [...] per name is understood", list);
            for (const char *r = open + 1; !st;) {
                char *end = NULL;
                const long a = strtol(r, &end, 10);
                long b = a;
                const int width = (int)(end - r);
                if (*r == '-' || *r == '+' || end == r || width > 18) {
                    st = cdp_fail(CDP_ERR_INVALID, "host list \"%.80s\": \"%.*s\" is not a number range", list,
                                  (int)(close - r), r);
                    break;
                }
                if (*end == '-') {
                    const char *r2 = end + 1;
                    b = strtol(r2, &end, 10);
                    if (end == r2 || b < a || b - a > 100000) {
                        st = cdp_fail(CDP_ERR_INVALID, "host list \"%.80s\": a range that does not count up", list);
                        break;
                    }
                }
                for (long v = a; !st && v <= b; v++) {
                    char name[512];
                    snprintf(name, sizeof name, "%.*s%0*ld%.*s", (int)(open - p), p, width, v, (int)(e - close - 1),
                             close + 1);
                    st = add_host(&h, &k, &cap, name, strlen(name));
                }
                if (st || end == close) break;
                if (*end != ',') {
                    st = cdp_fail(CDP_ERR_INVALID, "host list \"%.80s\": unexpected \"%c\" in brackets", list, *end);
                    break;
                }
                r = end + 1;
            }
        }
        p = *e ? e + 1 : e;
    }
    if (!st && !k) st = cdp_fail(CDP_ERR_INVALID, "host list \"%.80s\" names no host", list ? list : "");
    if (st) {
        for (int i = 0; i < k; i++) free(h[i]);
        free(h);
        return st;
    }
    *hosts = h;
    *n = k;
    return CDP_OK;
}

/* The hosts of the Slurm allocation this process runs in, in Slurm's order
 * (SLURM_JOB_NODELIST): CDP_ERR_UNSUPPORTED, with no message, outside one. */
cdp_status cdp_launch_alloc_hosts(char ***hosts, int *n)
{
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!list || !*list) list = getenv("SLURM_NODELIST");
    if (!list || !*list) return CDP_ERR_UNSUPPORTED;
    cdp_status st = cdp_launch_hostlist(list, hosts, n);
    if (st) return cdp_fail(st, "SLURM_JOB_NODELIST: %s", cdp_last_error());
    return CDP_OK;
}

/* The hosts layout node i runs on: the hostfile's lines, or under srun the
 * allocation's nodes (CDP_ERR_UNSUPPORTED, with no message: neither is known). */
cdp_status cdp_launch_node_hosts(const struct cdp_launch_spec *s, char ***hosts, int *n)
{
    if (s->hostfile) return cdp_launch_read_hosts(s->hostfile, hosts, n);
    if (cdp_launch_which(s) == CDP_LAUNCHER_SRUN) return cdp_launch_alloc_hosts(hosts, n);
    return CDP_ERR_UNSUPPORTED;
}

void cdp_launch_free_hosts(char **hosts, int n)
{
    for (int i = 0; i < n; i++) free(hosts[i]);
    free(hosts);
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

char *cdp_launch_host_of(const struct cdp_launch_spec *s, int node)
{
    char **hosts = NULL, *h = NULL;
    int nh = 0;
    if (cdp_launch_node_hosts(s, &hosts, &nh)) return NULL;
    if (node >= 0 && node < nh) h = strdup(hosts[node]);
    cdp_launch_free_hosts(hosts, nh);
    return h;
}

cdp_status cdp_launch_probe_hosts(const struct cdp_launch_spec *s, int timeout_s, unsigned char *lost)
{
    const struct cdp_layout *l = s->layout;
    char **hosts = NULL;
    int nh = 0;
    cdp_status st = cdp_launch_node_hosts(s, &hosts, &nh);
    if (st == CDP_ERR_UNSUPPORTED && !hosts) return CDP_OK;
    if (st) return st;
    const int slurm = !s->hostfile;
    int *count = calloc((size_t)l->n_nodes, sizeof *count);
    pid_t *pid = calloc((size_t)l->n_nodes, sizeof *pid);
    if (!count || !pid) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    cdp_launch_ranks_per_node(l, count);
    /* the agent: Open MPI's first choice of "ssh : rsh", in words */
    const char *env = getenv("OMPI_MCA_plm_rsh_agent");
    char agent[1024], *word[16];
    snprintf(agent, sizeof agent, "%s", env && *env ? env : "ssh");
    agent[strcspn(agent, ":")] = '\0';
    int nw = 0;
    for (char *t = strtok(agent, " \t"); t && nw < 8; t = strtok(NULL, " \t")) word[nw++] = t;
    if (!nw) word[nw++] = "ssh";
    const char *base = strrchr(word[0], '/');
    const int is_ssh = !strcmp(base ? base + 1 : word[0], "ssh");
    char opt[64], self[256] = "";
    snprintf(opt, sizeof opt, "ConnectTimeout=%d", timeout_s);
    if (gethostname(self, sizeof self - 1) != 0) self[0] = '\0';
    for (int i = 0; i < l->n_nodes && i < nh; i++) {
        if (!count[i] || !strcmp(hosts[i], self) || !strcmp(hosts[i], "localhost")) continue;
        char *argv[32];
        int k = 0;
        if (slurm) {
            /* a task of one more step there: what a relaunch needs of the host */
            static char *const probe[] = {"srun", "--overlap", "--nodes", "1", "--ntasks", "1", "--mpi=none",
                                          "--quiet", "--nodelist", NULL};
            while (probe[k]) argv[k] = probe[k], k++;
        } else {
            for (int j = 0; j < nw; j++) argv[k++] = word[j];
        }
        if (is_ssh && !slurm) {
            argv[k++] = "-o";
            argv[k++] = "BatchMode=yes";
            argv[k++] = "-o";
            argv[k++] = opt;
        }
        argv[k++] = hosts[i];
        argv[k++] = "true";
        argv[k] = NULL;
        pid[i] = fork();
        if (pid[i] == 0) {
            const int null = open("/dev/null", O_RDWR);
            if (null >= 0) {
                dup2(null, 0);
                dup2(null, 1);
                dup2(null, 2);
            }
            execvp(argv[0], argv);
            _exit(127);
        }
        if (pid[i] < 0) pid[i] = 0;
    }
    const double until = (cdp_time_ns() / 1e9) + timeout_s + 2;
    for (;;) {
        int left = 0;
        for (int i = 0; i < l->n_nodes; i++) {
            if (pid[i] <= 0) continue;
            int status = 0;
            const pid_t w = waitpid(pid[i], &status, WNOHANG);
            if (w == pid[i]) {
                lost[i] = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
                pid[i] = 0;
            } else if (w < 0 && errno != EINTR) {
                pid[i] = 0;
            } else {
                left++;
            }
        }
        if (!left) break;
        if ((cdp_time_ns() / 1e9) > until) {
            for (int i = 0; i < l->n_nodes; i++)
                if (pid[i] > 0) {
                    kill(pid[i], SIGKILL);
                    while (waitpid(pid[i], NULL, 0) < 0 && errno == EINTR) {
                    }
                    lost[i] = 1;
                }
            break;
        }
        poll(NULL, 0, 50);
    }
done:
    cdp_launch_free_hosts(hosts, nh);
    free(count);
    free(pid);
    return st;
}
