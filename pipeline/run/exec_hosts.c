/* The hosts a job runs on: every rank's host name (for metrics.jsonl and for
 * messages that name a host), and the check that a folder every rank writes
 * into is the same folder on every host (a node-local checkpoint folder would
 * otherwise be committed with the parts of one host only). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "pipeline/run/exec_internal.h"

cdp_status cdp_exec_gather_hosts(struct exec *e)
{
    const size_t w = CDP_EXEC_HOST_MAX;
    char mine[CDP_EXEC_HOST_MAX] = "";
    if (gethostname(mine, w - 1) != 0) snprintf(mine, w, "?");
    mine[w - 1] = '\0';
    free(e->hosts);
    e->n_hosts = 1;
    if (!(e->hosts = calloc((size_t)e->size, w))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if (e->size == 1) {
        memcpy(e->hosts, mine, w);
        return CDP_OK;
    }
    void *all = NULL;
    size_t *lens = NULL;
    cdp_status st = cdp_comm_gather_bytes(e->world, mine, w, &all, &lens, e->timeout);
    if (!st && e->rank == 0) memcpy(e->hosts, all, (size_t)e->size * w);
    free(all);
    free(lens);
    if (!st) st = cdp_comm_bcast_bytes(e->world, e->hosts, (size_t)e->size * w, 0, e->timeout);
    if (st) return st;
    for (int i = 1; i < e->size; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(e->hosts + (size_t)i * w, e->hosts + (size_t)j * w);
        e->n_hosts += !seen;
    }
    return CDP_OK;
}

/* mkdir -p, quietly: a folder that cannot be made is found missing below. */
static void make_dirs(const char *path)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *q = p + 1; *q; q++)
        if (*q == '/') {
            *q = '\0';
            mkdir(p, 0755);
            *q = '/';
        }
    mkdir(p, 0755);
}

cdp_status cdp_exec_check_shared(const struct exec *e, const char *dir, const char *what)
{
    if (e->n_hosts <= 1 || !dir) return CDP_OK;
    const size_t w = CDP_EXEC_HOST_MAX;
    /* rank 0 leaves a file of a name no other run uses; every rank looks for it */
    char name[4400] = "";
    if (e->rank == 0) {
        make_dirs(dir);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(name, sizeof name, "%s/.cdphybrid-shared-%ld-%ld%09ld", dir, (long)getpid(), (long)ts.tv_sec,
                 ts.tv_nsec);
        FILE *f = fopen(name, "w");
        if (!f || fclose(f) != 0)
            return cdp_fail(CDP_ERR_IO, "%s (%s): cannot write there: %s", dir, what, strerror(errno));
    }
    cdp_status st = cdp_comm_bcast_bytes(e->world, name, sizeof name, 0, e->timeout);
    double *missing = calloc((size_t)e->size, sizeof *missing);
    if (!missing) st = st ? st : cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if (!st) {
        missing[e->rank] = access(name, F_OK) != 0;
        st = cdp_comm_allreduce_f64(e->world, missing, (size_t)e->size, CDP_REDUCE_SUM, e->timeout);
    }
    if (e->rank == 0) remove(name);
    if (st) {
        free(missing);
        return st;
    }
    char list[1024] = "";
    size_t o = 0;
    int n = 0;
    for (int i = 0; i < e->size; i++) {
        if (missing[i] == 0) continue;
        const char *h = e->hosts + (size_t)i * w;
        int said = 0; /* each host once */
        for (int j = 0; j < i && !said; j++) said = missing[j] != 0 && !strcmp(h, e->hosts + (size_t)j * w);
        if (!said && o < sizeof list - w - 8) o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", n++ ? ", " : "", h);
    }
    free(missing);
    /* every rank knows; rank 0 alone says it and ends the job (several ranks
     * in MPI_Abort at once can crash Open MPI 4.1's mpirun: exit 139, not 2);
     * the others go on into the next collective, where the abort stops them */
    if (!n || e->rank != 0) return CDP_OK;
    return cdp_fail(CDP_ERR_INVALID, "%s (%s) is not one folder on every host: what rank 0 wrote there on %s is "
                    "not seen on %s; a job over %d hosts needs it on a filesystem they all share (NFS, Lustre, "
                    "...), not a node-local one", dir, what, e->hosts, list, e->n_hosts);
}
