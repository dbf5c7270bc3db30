/* The limits a job runs under, checked before it starts (limits.h): what
 * this process may open, map and write, and where Open MPI keeps its files,
 * so that a limit too small is one cdphybrid line naming it, not a hang or an
 * Open MPI message (docs/jobs.md, "Limits"). */
#include "cli/limits.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include "cdp/core.h"
#include "cdp/log.h"

/* Open files: mpirun holds about 10 per local rank (pipes, sockets, shared
 * memory), a rank about 40 (MPI's own, the BLAS, the files it writes). */
#define FILES_BASE 64
#define FILES_PER_RANK 16
/* Address space one rank maps besides its planned memory: the program and its
 * libraries with MPI's shared memory (a rank of a tiny model maps about 520
 * MiB here), and per BLAS thread (one per CPU of the rank) OpenBLAS's buffer,
 * which it retries forever when refused, and the thread's stack. */
#define ADDRESS_BASE (640ull << 20)
#define ADDRESS_PER_CPU (64ull << 20)
/* The largest file Open MPI's PMIx makes (its shared-memory store: between 4
 * and 6 MiB here), with room. */
#define FILE_SIZE_MIN (16ull << 20)
/* What Open MPI writes in TMPDIR (its session folder) and the launcher
 * (hostfile, planned.json of a run without outputs). */
#define TMPDIR_MIN (1ull << 20)

static double mib(uint64_t b) { return (double)b / (1 << 20); }

cdp_status cdp_cli_check_limits(const struct cdp_layout *l, int launching, const char *tmpdir)
{
    int here = 0;
    uint64_t most = 0, most_need = 0;
    for (int i = 0; i < l->n_ranks; i++) {
        if (l->rank[i].node != 0) continue;
        here++;
        const uint64_t m = l->rank[i].memory.device + l->rank[i].memory.host;
        int *cpus = NULL, nc = 0;
        if (!l->rank[i].cpuset[0] || cdp_cpuset_parse_list(l->rank[i].cpuset, &cpus, &nc)) nc = 1;
        free(cpus);
        const uint64_t need = ADDRESS_BASE + (uint64_t)(nc > 0 ? nc : 1) * ADDRESS_PER_CPU + m;
        if (need > most_need) {
            most_need = need;
            most = m;
        }
    }
    struct rlimit r;
    if (launching && getrlimit(RLIMIT_NOFILE, &r) == 0) {
        const rlim_t need = FILES_BASE + (rlim_t)FILES_PER_RANK * (rlim_t)here;
        if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < need) {
            if (r.rlim_max == RLIM_INFINITY || r.rlim_max >= need) {
                /* the soft limit may go up to the hard one: mpirun and the ranks inherit it */
                const rlim_t was = r.rlim_cur;
                r.rlim_cur = need;
                if (setrlimit(RLIMIT_NOFILE, &r) == 0)
                    CDP_INFO(CLI, "open-file limit (RLIMIT_NOFILE) raised from %llu to %llu for %d ranks",
                             (unsigned long long)was, (unsigned long long)need, here);
            } else {
                return cdp_fail(CDP_ERR_INVALID, "the open-file limit (ulimit -n, RLIMIT_NOFILE) is %llu: mpirun and "
                                "%d ranks on this host need about %llu (else mpirun hangs ending the job); raise it "
                                "(ulimit -n 1024)", (unsigned long long)r.rlim_cur, here, (unsigned long long)need);
            }
        }
    }
    if (launching && getrlimit(RLIMIT_FSIZE, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur < FILE_SIZE_MIN)
        return cdp_fail(CDP_ERR_INVALID, "the file size limit (ulimit -f, RLIMIT_FSIZE) is %llu bytes: Open MPI's "
                        "PMIx keeps files of several MiB for a job (else its ranks fail to start and mpirun hangs); "
                        "raise it to at least %llu (ulimit -f %llu)", (unsigned long long)r.rlim_cur,
                        FILE_SIZE_MIN, FILE_SIZE_MIN / 1024);
    if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
        const uint64_t need = most_need;
        if ((uint64_t)r.rlim_cur < need)
            return cdp_fail(CDP_ERR_INVALID, "the address-space limit (ulimit -v, RLIMIT_AS) is %.0f MiB: a rank of "
                            "this layout maps about %.0f MiB (%.0f MiB planned, the rest program, OpenBLAS buffers "
                            "and MPI), and OpenBLAS waits forever for memory it is refused; raise it (ulimit -v "
                            "unlimited) or plan smaller ranks", mib(r.rlim_cur), mib(need), mib(most));
    }
    if (launching && tmpdir && *tmpdir) {
        struct statvfs v;
        if (statvfs(tmpdir, &v) == 0) {
            const uint64_t left = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
            if (left < TMPDIR_MIN || (v.f_files && v.f_favail < 16))
                return cdp_fail(CDP_ERR_IO, "TMPDIR %s has %.0f KiB and %llu inodes free: Open MPI keeps its session "
                                "files there and the launcher its own; free some space, or set TMPDIR to another "
                                "folder", tmpdir, (double)left / 1024, (unsigned long long)v.f_favail);
        }
    }
    return CDP_OK;
}
