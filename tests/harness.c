/* Test helpers: running the binary with captured output, temporary files. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct growbuf {
    char *p;
    size_t n, cap;
};

static void growbuf_add(struct growbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

int cdp_test_run(struct cdp_run *r, const char *const *argv)
{
    const char *bin = getenv("CDP_BIN");
    int outp[2], errp[2];
    memset(r, 0, sizeof *r);
    if (!bin) {
        fprintf(stderr, "CDP_BIN is not set (run the tests through meson test)\n");
        return -1;
    }
    if (pipe(outp) || pipe(errp)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        close(outp[0]);
        close(errp[0]);
        size_t n = 0;
        while (argv[n]) n++;
        char **args = calloc(n + 2, sizeof *args);
        args[0] = (char *)bin;
        for (size_t i = 0; i < n; i++) args[i + 1] = (char *)argv[i];
        execv(bin, args);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(outp[1]);
    close(errp[1]);
    struct growbuf out = {0}, err = {0};
    growbuf_add(&out, "", 0);
    growbuf_add(&err, "", 0);
    struct pollfd fds[2] = {{.fd = outp[0], .events = POLLIN}, {.fd = errp[0], .events = POLLIN}};
    int open_fds = 2;
    const time_t deadline = time(NULL) + CDP_TEST_RUN_LIMIT_S;
    int killed = 0;
    while (open_fds > 0) {
        int rc = poll(fds, 2, 1000);
        if (rc < 0 && errno != EINTR) break;
        if (time(NULL) > deadline) {
            kill(pid, SIGKILL);
            killed = 1;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char buf[4096];
            ssize_t k = read(fds[i].fd, buf, sizeof buf);
            if (k <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            } else {
                growbuf_add(i == 0 ? &out : &err, buf, (size_t)k);
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0) close(fds[i].fd);
    int status = 0;
    waitpid(pid, &status, 0);
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (killed) {
        /* say so: a run ended by the limit otherwise reads as exit 137 with nothing on stderr */
        char note[96];
        snprintf(note, sizeof note, "\n[harness: no end after %d s; killed]\n", CDP_TEST_RUN_LIMIT_S);
        growbuf_add(&err, note, strlen(note));
    }
    r->out = out.p;
    r->err = err.p;
    return 0;
}

void cdp_test_run_free(struct cdp_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* The folders this process made, removed when it exits (each Criterion test
 * runs in a process of its own) unless CDP_TEST_KEEP is set, for a look at
 * what a failed test left. A child made by fork inherits the list but not the
 * duty: only the process that made a folder removes it. */
static struct {
    pid_t pid;
    int n;
    char path[64][4096];
} made;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_made(void)
{
    if (made.pid != getpid()) return;
    for (int i = 0; i < made.n; i++) nftw(made.path[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int cdp_test_sample(void)
{
    const char *v = getenv("CDP_TEST_SAMPLE");
    if (!v || !*v) return 1;
    char *end = NULL;
    const long k = strtol(v, &end, 10);
    if (*end || k < 1 || k > 1000) {
        fprintf(stderr, "CDP_TEST_SAMPLE=%s: expected an integer from 1 to 1000\n", v);
        abort();
    }
    return (int)k;
}

size_t cdp_test_sample_cells(void *cells, size_t n, size_t size)
{
    const size_t k = (size_t)cdp_test_sample();
    char *c = cells;
    size_t kept = 0;
    for (size_t i = 0; i < n; i += k, kept++)
        if (kept != i) memcpy(c + kept * size, c + i * size, size);
    return kept;
}

const char *cdp_test_tmpdir(void)
{
    static char path[4096];
    const char *base = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/cdp-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(path)) {
        perror("mkdtemp");
        abort();
    }
    const char *keep = getenv("CDP_TEST_KEEP");
    if (!(keep && *keep)) {
        if (made.pid != getpid()) {
            if (made.pid == 0) atexit(remove_made);
            made.pid = getpid();
            made.n = 0;
        }
        if (made.n < (int)(sizeof made.path / sizeof made.path[0])) snprintf(made.path[made.n++], 4096, "%s", path);
    }
    return path;
}

const char *cdp_test_write_file(const char *dir, const char *name, const char *text)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        abort();
    }
    fputs(text, f);
    fclose(f);
    return path;
}

const char *cdp_test_source_path(const char *rel)
{
    static char path[4096];
    const char *root = getenv("CDP_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", rel);
    return path;
}

char *cdp_test_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct growbuf b = {0};
    growbuf_add(&b, "", 0);
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) growbuf_add(&b, buf, k);
    fclose(f);
    return b.p;
}

long cdp_test_files_differ(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    long n = 0, at = 0;
    if (fa && fb)
        for (;; n++) {
            int x = fgetc(fa), y = fgetc(fb);
            if (x != y) {
                at = n;
                break;
            }
            if (x == EOF) {
                at = n > 0 ? -1 : 0;
                break;
            }
        }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return at;
}

/* ---- jobs in the background ---------------------------------------------------------- */

/* The tags of the jobs this process started: whatever of them is alive when
 * it exits (a test that failed half way) is killed then, not left to train. */
static struct {
    pid_t pid;
    int n;
    char tag[32][40];
} started;

static void kill_started(void)
{
    if (started.pid != getpid()) return;
    for (int i = 0; i < started.n; i++) {
        int pids[64];
        const int k = cdp_test_tagged(started.tag[i], pids, 64);
        for (int p = 0; p < k && p < 64; p++) kill(pids[p], SIGKILL);
    }
}

int cdp_test_start(struct cdp_job *j, const char *const *argv, const struct cdp_job_opts *o)
{
    const char *bin = getenv("CDP_BIN");
    memset(j, 0, sizeof *j);
    if (!bin) return -1;
    static int serial;
    snprintf(j->tag, sizeof j->tag, "%ld-%d-%ld", (long)getpid(), ++serial, (long)time(NULL));
    if (started.pid != getpid()) {
        if (started.pid == 0) atexit(kill_started);
        started.pid = getpid();
        started.n = 0;
    }
    if (started.n < 32) snprintf(started.tag[started.n++], sizeof started.tag[0], "%s", j->tag);
    const char *dir = cdp_test_tmpdir();
    snprintf(j->out, sizeof j->out, "%s/stdout", dir);
    snprintf(j->err, sizeof j->err, "%s/stderr", dir);
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        int fo = open(j->out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(j->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        setenv("CDP_TEST_TAG", j->tag, 1);
        for (int i = 0; o && o->unset && o->unset[i]; i++) unsetenv(o->unset[i]);
        for (int i = 0; o && o->set && o->set[i]; i++) putenv((char *)o->set[i]);
        struct rlimit r;
        if (o && o->as_bytes) {
            r.rlim_cur = r.rlim_max = o->as_bytes;
            setrlimit(RLIMIT_AS, &r);
        }
        if (o && o->fsize_bytes) {
            r.rlim_cur = r.rlim_max = o->fsize_bytes;
            setrlimit(RLIMIT_FSIZE, &r);
        }
        if (o && o->nofile) {
            r.rlim_cur = r.rlim_max = o->nofile;
            setrlimit(RLIMIT_NOFILE, &r);
        }
        if (o && o->cpus && *o->cpus) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(atoi(o->cpus), &set);
            sched_setaffinity(0, sizeof set, &set);
        }
        size_t n = 0;
        while (argv[n]) n++;
        char **args = calloc(n + 2, sizeof *args);
        args[0] = (char *)bin;
        for (size_t i = 0; i < n; i++) args[i + 1] = (char *)argv[i];
        execv(bin, args);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    j->pid = pid;
    return 0;
}

void cdp_test_finish(struct cdp_job *j, int timeout_s, struct cdp_run *r)
{
    memset(r, 0, sizeof *r);
    int status = 0, done = 0;
    for (int i = 0; i < timeout_s * 20 && !done; i++) {
        const pid_t w = waitpid(j->pid, &status, WNOHANG);
        if (w == j->pid) done = 1;
        else {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (!done) {
        kill(-j->pid, SIGKILL);
        waitpid(j->pid, &status, 0);
    }
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r->out = cdp_test_read_file(j->out);
    char *err = cdp_test_read_file(j->err);
    struct growbuf b = {0};
    growbuf_add(&b, err ? err : "", err ? strlen(err) : 0);
    if (!done) {
        char note[128];
        snprintf(note, sizeof note, "\n[harness: no end after %d s; killed]\n", timeout_s);
        growbuf_add(&b, note, strlen(note));
    }
    free(err);
    r->err = b.p;
    if (!r->out) {
        r->out = malloc(1);
        r->out[0] = '\0';
    }
}

int cdp_test_wait_for(const char *path, const char *text, int timeout_s)
{
    for (int i = 0; i < timeout_s * 20; i++) {
        char *t = cdp_test_read_file(path);
        const int found = t && strstr(t, text);
        free(t);
        if (found) return 1;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Whether process pid's environment holds name=value (value NULL: any). */
static int env_holds(const char *pid, const char *name, const char *value, char *got, size_t cap)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    char *stat = cdp_test_read_file(path);
    const char *paren = stat ? strrchr(stat, ')') : NULL;
    const int zombie = !paren || paren[2] == 'Z' || paren[2] == 'X';
    free(stat);
    if (zombie) return 0;
    snprintf(path, sizeof path, "/proc/%s/environ", pid);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    struct growbuf b = {0};
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) growbuf_add(&b, buf, k);
    fclose(f);
    int found = 0;
    const size_t nl = strlen(name);
    for (size_t at = 0; b.p && at < b.n; at += strlen(b.p + at) + 1) {
        const char *e = b.p + at;
        if (strncmp(e, name, nl) || e[nl] != '=') continue;
        if (value && strcmp(e + nl + 1, value)) continue;
        if (got) snprintf(got, cap, "%s", e + nl + 1);
        found = 1;
        break;
    }
    free(b.p);
    return found;
}

int cdp_test_tagged(const char *tag, int *pids, int cap)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        if (!env_holds(e->d_name, "CDP_TEST_TAG", tag, NULL, 0)) continue;
        if (pids && n < cap) pids[n] = atoi(e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

int cdp_test_rank_pid(const char *tag, int rank)
{
    int pids[64];
    const int n = cdp_test_tagged(tag, pids, 64);
    for (int i = 0; i < n && i < 64; i++) {
        char pid[24], got[32];
        snprintf(pid, sizeof pid, "%d", pids[i]);
        if (env_holds(pid, "OMPI_COMM_WORLD_RANK", NULL, got, sizeof got) && atoi(got) == rank) return pids[i];
    }
    return -1;
}

/* Reads a whole file with its length; NULL if it cannot. */
static char *read_len(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct growbuf b = {0};
    growbuf_add(&b, "", 0);
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) growbuf_add(&b, buf, k);
    fclose(f);
    *n = b.n;
    return b.p;
}

/* Blanks the value of "run":"..." in the first 64 KiB (a safetensors header). */
static void mask_run(char *p, size_t n)
{
    const size_t lim = n < 65536 ? n : 65536;
    for (size_t i = 0; i + 7 < lim; i++) {
        if (memcmp(p + i, "\"run\":\"", 7)) continue;
        for (size_t k = i + 7; k < lim && p[k] != '"'; k++) p[k] = '-';
        return;
    }
}

long cdp_test_parts_differ(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *pa = read_len(a, &na), *pb = read_len(b, &nb);
    long at = 0;
    if (pa && pb) {
        mask_run(pa, na);
        mask_run(pb, nb);
        size_t i = 0;
        while (i < na && i < nb && pa[i] == pb[i]) i++;
        at = i == na && i == nb ? (na ? -1 : 0) : (long)i;
    }
    free(pa);
    free(pb);
    return at;
}
