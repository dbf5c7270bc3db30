/* Data sources (data.h): fetching samples by (split, global index), every
 * read of mapped data under a SIGBUS guard that names a file that shrank. */
#include "model/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/data_internal.h"

/* ---- guarded reads of mapped files ---------------------------------------------
 * A mapped file that shrinks (truncated, or rewritten in place) under a running
 * job turns the next read of a lost page into SIGBUS. Every read of mapped data
 * in cdp_data_fetch runs armed: a SIGBUS handler, installed once per process,
 * jumps back to the fetch of the thread that faulted, which reports the file
 * that holds the address. A SIGBUS nobody armed for (another mapping, kill -BUS)
 * gets the disposition that was there before ours. Checking the size with fstat
 * before each read would cost a system call per sample and still race with a
 * truncation between the check and the read; the handler costs nothing until
 * the fault and catches every one. SA_NODEFER keeps SIGBUS unblocked in the
 * handler, so the jump needs no signal mask saved (sigsetjmp(.., 0): no system
 * call per fetch). */

static _Thread_local sigjmp_buf *volatile guard_jmp;
static _Thread_local void *volatile guard_addr;
static struct sigaction guard_prev;
pthread_once_t data_guard_once = PTHREAD_ONCE_INIT;

static void guard_handler(int sig, siginfo_t *si, void *uc)
{
    sigjmp_buf *j = guard_jmp;
    if (j) {
        guard_addr = si->si_addr;
        guard_jmp = NULL;
        siglongjmp(*j, 1);
    }
    /* not ours: the previous disposition, then the fault again (a memory fault
     * re-runs its instruction; a sent signal is raised again) */
    sigaction(SIGBUS, &guard_prev, NULL);
    if (si->si_code <= 0) raise(sig);
    (void)uc;
}

void data_guard_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &guard_prev);
}

/* The message for a fault at addr: the file whose map holds it, its size now
 * and when it was opened. */
static cdp_status fault_error(const struct cdp_data *d, const void *addr)
{
    const uint8_t *a = addr;
    const char *path = NULL;
    size_t was = 0;
    for (int s = 0; s < 2 && !path; s++)
        for (int i = 0; i < d->streams[s].n; i++) {
            const struct shard *h = &d->streams[s].sh[i];
            if (h->map && a >= (const uint8_t *)h->map && a < (const uint8_t *)h->map + h->map_size) {
                path = h->path;
                was = h->map_size;
                break;
            }
        }
    if (!path && d->map && a >= (const uint8_t *)d->map && a < (const uint8_t *)d->map + d->map_size)
        path = d->path, was = d->map_size;
    if (!path && d->lmap && a >= (const uint8_t *)d->lmap && a < (const uint8_t *)d->lmap + d->lmap_size)
        path = d->labels_path, was = d->lmap_size;
    if (!path)
        return cdp_fail(CDP_ERR_IO, "data: a data file changed while it was read (bus error at %p)", addr);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return cdp_fail(CDP_ERR_IO, "%s: the file changed while training read it: it is gone now (%s); it had %zu "
                        "bytes when opened", path, strerror(errno), was);
    return cdp_fail(CDP_ERR_IO, "%s: the file changed while training read it: it has %lld bytes now, %zu when "
                    "opened (data files are read in place: do not truncate or rewrite them during a run)",
                    path, (long long)sb.st_size, was);
}

static cdp_status fetch_files(const struct cdp_data *d, enum cdp_split split, int64_t first_index, int count,
                              void *inputs, void *targets)
{
    cdp_status st;
    const struct cdp_sample_shape *s = &d->shape;
    const int64_t D = s->input_numel, TN = s->target_numel;
    struct perm p = {0};
    int64_t epoch = -1, n = d->count[split];
    for (int b = 0; b < count; b++) {
        int64_t i = first_index + b;
        int32_t *iin = (int32_t *)inputs + b * D, *itg = (int32_t *)targets + b * TN;
        float *fin = (float *)inputs + b * D, *ftg = (float *)targets + b * TN;
        int64_t k = i % n;
        if (d->order == CDP_DATA_ORDER_SHUFFLE) {
            if (i / n != epoch) {
                epoch = i / n;
                data_perm_init(&p, (uint64_t)n, data_hash4(d->seed, DOM_PERM, (uint64_t)split, (uint64_t)epoch));
            }
            k = (int64_t)data_perm_apply(&p, (uint64_t)k);
        }
        int64_t item = d->begin[split] + k * d->stride;
        if (s->tokens) {
            /* the window tok[item .. item + T]: inputs its first T, targets its last T */
            const struct stream *str = &d->streams[d->split_stream[split]];
            if ((st = data_read_tokens(d, str, item, D, iin))) return st;
            memcpy(itg, iin + 1, (size_t)(D - 1) * sizeof *itg);
            if ((st = data_read_tokens(d, str, item + D, 1, itg + D - 1))) return st;
        } else {
            const uint8_t *px = d->bytes + item * d->item_numel;
            for (int64_t k = 0; k < D; k++) fin[k] = (float)px[k] * (1.0f / 255.0f);
            int label = d->labels[item];
            if (s->target_is_float) {
                memset(ftg, 0, (size_t)TN * sizeof *ftg);
                ftg[label] = 1.0f;
            } else {
                itg[0] = label;
            }
        }
    }
    return CDP_OK;
}

/* Pages of the token maps a process has touched count in its RSS until it
 * unmaps them, though the kernel may drop them at will (clean file pages):
 * after a long run over a 20 GB data set the RSS would read 20 GB. Every
 * RELEASE_EVERY windows the maps' page-table entries are let go
 * (MADV_DONTNEED on a read-only file map: the pages stay in the page cache and
 * the next read maps them again), so the RSS holds the recent windows only. */
#define RELEASE_EVERY 64

static void release_pages(struct cdp_data *d, int count)
{
    if (__atomic_add_fetch(&d->windows, count, __ATOMIC_RELAXED) < RELEASE_EVERY) return;
    __atomic_store_n(&d->windows, 0, __ATOMIC_RELAXED);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < d->streams[s].n; i++)
            if (d->streams[s].sh[i].map) madvise(d->streams[s].sh[i].map, d->streams[s].sh[i].map_size, MADV_DONTNEED);
}

/* fetch_files under the SIGBUS guard (see guard_handler). */
static cdp_status fetch_guarded(const struct cdp_data *d, enum cdp_split split, int64_t first_index, int count,
                                void *inputs, void *targets)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) {
        guard_jmp = NULL;
        return fault_error(d, guard_addr);
    }
    guard_jmp = &jb;
    cdp_status st = fetch_files(d, split, first_index, count, inputs, targets);
    guard_jmp = NULL;
    return st;
}

cdp_status cdp_data_fetch(struct cdp_data *d, enum cdp_split split, int64_t first_index, int count,
                          void *inputs, void *targets)
{
    CDP_ASSERT(d);
    if ((unsigned)split >= CDP_SPLIT_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "data: unknown split %d", (int)split);
    if (first_index < 0 || count < 0 || first_index > INT64_MAX - count)
        return cdp_fail(CDP_ERR_INVALID, "data: bad sample range %lld + %d", (long long)first_index, count);
    if (count == 0) return CDP_OK;
    CDP_ASSERT(inputs && targets);
    if (d->source != CDP_DATA_SYNTHETIC) {
        cdp_status st = fetch_guarded(d, split, first_index, count, inputs, targets);
        if (!st && d->shape.tokens) release_pages(d, count);
        return st;
    }
    const struct cdp_sample_shape *s = &d->shape;
    int64_t D = s->input_numel, TN = s->target_numel;
    float *h = NULL, *y = NULL;
    if (!s->tokens) {
        h = malloc(TEACHER_HIDDEN * sizeof *h);
        y = malloc((size_t)d->out * sizeof *y);
        if (!h || !y) {
            free(h), free(y);
            return cdp_fail(CDP_ERR_NOMEM, "data: out of memory");
        }
    }
    for (int b = 0; b < count; b++) {
        int64_t i = first_index + b;
        int32_t *iin = (int32_t *)inputs + b * D, *itg = (int32_t *)targets + b * TN;
        float *fin = (float *)inputs + b * D, *ftg = (float *)targets + b * TN;
        struct rng r;
        data_rng_seed(&r, data_hash4(d->seed, DOM_SAMPLE, (uint64_t)split, (uint64_t)i));
        if (s->tokens) {
            data_synth_tokens(d, &r, iin, itg);
            continue;
        }
        data_normal_input(&r, fin, D);
        data_teacher_forward(d, fin, h, y);
        if (s->target_is_float) {
            memcpy(ftg, y, (size_t)TN * sizeof *y);
        } else {
            int64_t best = 0;
            for (int64_t c = 1; c < d->out; c++)
                if (y[c] > y[best]) best = c;
            itg[0] = (int32_t)best;
        }
    }
    free(h);
    free(y);
    return CDP_OK;
}
