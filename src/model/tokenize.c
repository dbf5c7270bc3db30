/* Text to token shards (tokenize.h): a reader that gathers documents into
 * batches, threads that encode a batch's documents, and a writer that appends
 * them in input order to the shards of their split, so the output does not
 * depend on the number of threads. */
#include "model/tokenize.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/file.h"

#define BATCH_BYTES (4u << 20) /* text per batch (a larger document is a batch alone) */
#define BATCH_DOCS 4096
#define NPY_HEADER 128         /* bytes of our .npy headers, padding included */

int cdp_tokenize_is_val(int64_t i, double f)
{
    return f > 0 && floor((double)(i + 1) * f) > floor((double)i * f);
}

/* ---- inputs --------------------------------------------------------------------- */

struct inputs {
    char **files;
    int n, cap;
    int64_t bytes;
};

static cdp_status add_file(struct inputs *in, const char *path, int64_t size)
{
    if (in->n == in->cap) {
        const int nc = in->cap ? 2 * in->cap : 64;
        char **nf = realloc(in->files, (size_t)nc * sizeof *nf);
        if (!nf) return cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
        in->files = nf;
        in->cap = nc;
    }
    if (!(in->files[in->n] = strdup(path))) return cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
    in->n++;
    in->bytes += size;
    return CDP_OK;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A file, or every file under a folder (names starting with "." left out), in
 * name order. */
static cdp_status add_input(struct inputs *in, const char *path, int depth)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return cdp_fail(CDP_ERR_INVALID, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISREG(sb.st_mode)) return add_file(in, path, (int64_t)sb.st_size);
    if (!S_ISDIR(sb.st_mode)) return cdp_fail(CDP_ERR_INVALID, "%s: neither a file nor a folder", path);
    if (depth > 32) return cdp_fail(CDP_ERR_INVALID, "%s: folders nested more than 32 deep", path);
    DIR *d = opendir(path);
    if (!d) return cdp_fail(CDP_ERR_INVALID, "%s: cannot open the folder: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    cdp_status st = CDP_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                st = cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
                break;
            }
            names = nn;
        }
        const size_t l = strlen(path) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(l))) {
            st = cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
            break;
        }
        snprintf(names[n++], l, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (!st) qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n && !st; i++) st = add_input(in, names[i], depth + 1);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

static int is_jsonl(const char *path)
{
    const size_t l = strlen(path);
    return l > 6 && !strcmp(path + l - 6, ".jsonl");
}

/* ---- documents, in batches ------------------------------------------------------ */

struct doc {
    char *text;
    size_t len;
    int file;   /* index into inputs */
    long line;  /* JSONL: its line; text files: 0 */
    int32_t *ids;
    int64_t n_ids;
};

struct reader {
    const struct cdp_tokenize_opts *o;
    struct inputs *in;
    int file;     /* the next file to open, or the open JSONL's */
    FILE *jsonl;  /* open JSONL file */
    long line;
    char *buf;
    size_t cap;
    int64_t bytes_done;
};

static cdp_status read_text_file(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return cdp_fail(CDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *t = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            cap = cap ? 2 * cap : 65536;
            char *nt = realloc(t, cap);
            if (!nt) {
                free(t);
                fclose(f);
                return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory reading it", path);
            }
            t = nt;
        }
        const size_t got = fread(t + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(t);
        return cdp_fail(CDP_ERR_IO, "%s: read error", path);
    }
    *text = t;
    *len = n;
    return CDP_OK;
}

/* The next document into *d; *got 0 at the end of the inputs. Empty
 * documents are skipped. */
static cdp_status next_doc(struct reader *r, struct doc *d, int *got)
{
    *got = 0;
    for (;;) {
        if (r->jsonl) {
            const ssize_t l = getline(&r->buf, &r->cap, r->jsonl);
            if (l < 0) {
                const int bad = ferror(r->jsonl);
                fclose(r->jsonl);
                r->jsonl = NULL;
                if (bad) return cdp_fail(CDP_ERR_IO, "%s: read error", r->in->files[r->file]);
                r->file++;
                continue;
            }
            r->line++;
            r->bytes_done += l;
            size_t k = (size_t)l;
            while (k > 0 && (r->buf[k - 1] == '\n' || r->buf[k - 1] == '\r' || r->buf[k - 1] == ' ')) k--;
            if (k == 0) continue; /* blank line */
            json_error_t err;
            json_t *o = json_loadb(r->buf, k, 0, &err);
            if (!o)
                return cdp_fail(CDP_ERR_INVALID, "%s:%ld:%d: %s (expected one JSON object per line)",
                                r->in->files[r->file], r->line, err.column, err.text);
            const json_t *t = json_is_object(o) ? json_object_get(o, r->o->text_field) : NULL;
            if (!json_is_string(t)) {
                json_decref(o);
                return cdp_fail(CDP_ERR_INVALID, "%s:%ld: /%s: expected a string (the document's text; "
                                "--text-field names the key)", r->in->files[r->file], r->line, r->o->text_field);
            }
            const size_t n = json_string_length(t);
            if (n == 0) {
                json_decref(o);
                continue;
            }
            d->text = malloc(n);
            if (!d->text) {
                json_decref(o);
                return cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
            }
            memcpy(d->text, json_string_value(t), n);
            json_decref(o);
            d->len = n;
            d->file = r->file;
            d->line = r->line;
            *got = 1;
            return CDP_OK;
        }
        if (r->file >= r->in->n) return CDP_OK;
        const char *path = r->in->files[r->file];
        if (is_jsonl(path)) {
            if (!(r->jsonl = fopen(path, "r"))) return cdp_fail(CDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
            r->line = 0;
            continue;
        }
        cdp_status st = read_text_file(path, &d->text, &d->len);
        if (st) return st;
        r->bytes_done += (int64_t)d->len;
        d->file = r->file++;
        d->line = 0;
        if (d->len == 0) {
            free(d->text);
            d->text = NULL;
            continue;
        }
        *got = 1;
        return CDP_OK;
    }
}

/* ---- encoding over threads ------------------------------------------------------- */

struct work {
    const struct cdp_tokenize_opts *o;
    const struct inputs *in;
    struct doc *docs;
    int n;
    int next; /* the next document to take (atomic) */
    pthread_mutex_t mu;
    cdp_status st; /* the first failure, and its message */
    char msg[1024];
};

static void *encode_worker(void *arg)
{
    struct work *w = arg;
    for (;;) {
        const int i = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED);
        if (i >= w->n) break;
        struct doc *d = &w->docs[i];
        cdp_status st = cdp_bpe_encode(w->o->bpe, d->text, d->len, &d->ids, &d->n_ids);
        if (st) {
            pthread_mutex_lock(&w->mu);
            if (!w->st) {
                w->st = st;
                if (d->line)
                    snprintf(w->msg, sizeof w->msg, "%s:%ld: %s", w->in->files[d->file], d->line, cdp_last_error());
                else
                    snprintf(w->msg, sizeof w->msg, "%s: %s", w->in->files[d->file], cdp_last_error());
            }
            pthread_mutex_unlock(&w->mu);
        }
    }
    return NULL;
}

static cdp_status encode_batch(const struct cdp_tokenize_opts *o, const struct inputs *in, struct doc *docs, int n)
{
    struct work w = {.o = o, .in = in, .docs = docs, .n = n};
    pthread_mutex_init(&w.mu, NULL);
    int t = o->threads < n ? o->threads : n;
    pthread_t *th = calloc((size_t)t, sizeof *th);
    int started = 0;
    if (th)
        for (; started < t - 1; started++)
            if (pthread_create(&th[started], NULL, encode_worker, &w)) break;
    encode_worker(&w); /* the calling thread works too */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_destroy(&w.mu);
    if (w.st) return cdp_fail(w.st, "%s", w.msg);
    return CDP_OK;
}

/* ---- shards ------------------------------------------------------------------------- */

static const char *const split_names[2] = {"train", "val"};

struct writer {
    const struct cdp_tokenize_opts *o;
    int width; /* bytes per token */
    struct cdp_atomic_file *f[2];
    int64_t in_shard[2];
    int index[2];
    char **done; /* shards committed, removed if the run fails */
    int n_done;
    unsigned char *buf;
    size_t cap;
};

static void shard_path(const struct writer *w, int split, int index, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s_%s_%06d.%s", w->o->out_dir, w->o->prefix, split_names[split], index,
             w->o->format == CDP_SHARD_NPY ? "npy" : "bin");
}

/* The header of a shard of count tokens (written first as a placeholder,
 * then again with the count when the shard is full). */
static cdp_status write_header(struct writer *w, int split, int64_t count)
{
    unsigned char h[1024];
    size_t n;
    if (w->o->format == CDP_SHARD_NPY) {
        memset(h, ' ', NPY_HEADER);
        memcpy(h, "\x93NUMPY\x01\x00", 8);
        h[8] = NPY_HEADER - 10, h[9] = 0;
        const int l = snprintf((char *)h + 10, NPY_HEADER - 10, "{'descr': '%s', 'fortran_order': False, "
                               "'shape': (%lld,), }", w->width == 2 ? "<u2" : "<u4", (long long)count);
        h[10 + l] = ' ';
        h[NPY_HEADER - 1] = '\n';
        n = NPY_HEADER;
    } else {
        memset(h, 0, sizeof h);
        const int32_t v[3] = {w->width == 2 ? 20240520 : 20240801, w->width == 2 ? 1 : 7, (int32_t)count};
        for (int i = 0; i < 3; i++)
            for (int b = 0; b < 4; b++) h[4 * i + b] = (unsigned char)((uint32_t)v[i] >> (8 * b));
        n = sizeof h;
    }
    return cdp_atomic_write(w->f[split], h, n);
}

static cdp_status close_shard(struct writer *w, int split)
{
    struct cdp_atomic_file *f = w->f[split];
    if (!f) return CDP_OK;
    cdp_status st = CDP_OK;
    if (fflush(f->stream) || fseeko(f->stream, 0, SEEK_SET))
        st = cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", f->path, strerror(errno));
    if (!st) st = write_header(w, split, w->in_shard[split]);
    w->f[split] = NULL;
    char *path = strdup(f->path);
    if (st) {
        cdp_atomic_abort(f);
    } else if ((st = cdp_atomic_commit(f)) == CDP_OK) {
        char **nd = path ? realloc(w->done, (size_t)(w->n_done + 1) * sizeof *nd) : NULL;
        if (!nd) {
            if (path) unlink(path);
            st = cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
        } else {
            w->done = nd;
            w->done[w->n_done++] = path;
            path = NULL;
            w->index[split]++;
            w->in_shard[split] = 0;
        }
    }
    free(f);
    free(path);
    return st;
}

static cdp_status write_ids(struct writer *w, int split, const int32_t *ids, int64_t n)
{
    cdp_status st;
    while (n > 0) {
        if (!w->f[split]) {
            char path[4200];
            shard_path(w, split, w->index[split], path, sizeof path);
            struct cdp_atomic_file *f = calloc(1, sizeof *f);
            if (!f) return cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
            if ((st = cdp_atomic_open(path, f))) {
                free(f);
                return st;
            }
            w->f[split] = f;
            w->in_shard[split] = 0;
            if ((st = write_header(w, split, 0))) return st;
        }
        int64_t m = w->o->shard_tokens - w->in_shard[split];
        if (m > n) m = n;
        if ((size_t)m * (size_t)w->width > w->cap) {
            const size_t nc = (size_t)m * (size_t)w->width;
            unsigned char *nb = realloc(w->buf, nc);
            if (!nb) return cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
            w->buf = nb;
            w->cap = nc;
        }
        for (int64_t i = 0; i < m; i++)
            for (int b = 0; b < w->width; b++) w->buf[i * w->width + b] = (unsigned char)((uint32_t)ids[i] >> (8 * b));
        if ((st = cdp_atomic_write(w->f[split], w->buf, (size_t)m * (size_t)w->width))) return st;
        w->in_shard[split] += m;
        ids += m;
        n -= m;
        if (w->in_shard[split] == w->o->shard_tokens && (st = close_shard(w, split))) return st;
    }
    return CDP_OK;
}

/* Shards of this prefix already in the folder would join a glob of the new
 * ones: refuse them. */
static cdp_status check_out_dir(const struct cdp_tokenize_opts *o)
{
    cdp_status st = cdp_check_writable(o->out_dir, 1);
    if (st) return st;
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return cdp_fail(CDP_ERR_IO, "%s: cannot make the folder: %s", o->out_dir, strerror(errno));
    DIR *d = opendir(o->out_dir);
    if (!d) return cdp_fail(CDP_ERR_IO, "%s: cannot open the folder: %s", o->out_dir, strerror(errno));
    const size_t pl = strlen(o->prefix);
    for (struct dirent *e; (e = readdir(d));) {
        for (int s = 0; s < 2; s++) {
            const size_t sl = strlen(split_names[s]);
            if (!strncmp(e->d_name, o->prefix, pl) && e->d_name[pl] == '_' &&
                !strncmp(e->d_name + pl + 1, split_names[s], sl) && e->d_name[pl + 1 + sl] == '_') {
                st = cdp_fail(CDP_ERR_INVALID, "%s/%s: shards of prefix \"%s\" are there already; give an empty "
                              "folder or another --prefix", o->out_dir, e->d_name, o->prefix);
                break;
            }
        }
        if (st) break;
    }
    closedir(d);
    return st;
}

cdp_status cdp_tokenize_run(const struct cdp_tokenize_opts *o, struct cdp_tokenize_stats *stats)
{
    CDP_ASSERT(o && o->bpe && stats && o->threads >= 1);
    memset(stats, 0, sizeof *stats);
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return cdp_fail(CDP_ERR_INVALID, "tokenize: the validation fraction must be in [0, 1), got %g", o->val_fraction);
    if (o->shard_tokens < 1 || o->shard_tokens > INT32_MAX)
        return cdp_fail(CDP_ERR_INVALID, "tokenize: tokens per shard must be in [1, 2^31 - 1] (llm.c's headers "
                        "count in int32), got %lld", (long long)o->shard_tokens);
    const int64_t V = cdp_bpe_vocab_size(o->bpe);
    if (o->eot >= V) return cdp_fail(CDP_ERR_INVALID, "tokenize: end-of-text id %d is outside the vocabulary", o->eot);
    struct inputs in = {0};
    struct writer w = {.o = o, .width = V <= 65536 ? 2 : 4};
    struct reader r = {.o = o, .in = &in};
    struct doc *docs = calloc(BATCH_DOCS, sizeof *docs);
    int n = 0;
    int64_t doc_index = 0;
    cdp_status st = docs ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "tokenize: out of memory");
    for (int i = 0; i < o->n_inputs && !st; i++) st = add_input(&in, o->inputs[i], 0);
    if (!st && in.n == 0) st = cdp_fail(CDP_ERR_INVALID, "tokenize: no input files");
    if (!st) st = check_out_dir(o);
    stats->token_bytes = w.width;
    for (int more = 1; !st && more;) {
        /* a batch: documents up to BATCH_BYTES of text (at least one) */
        size_t bytes = 0;
        n = 0;
        while (!st && n < BATCH_DOCS && bytes < BATCH_BYTES) {
            int got = 0;
            st = next_doc(&r, &docs[n], &got);
            if (st || !got) {
                more = 0;
                break;
            }
            bytes += docs[n++].len;
        }
        if (!st && n) st = encode_batch(o, &in, docs, n);
        for (int i = 0; i < n && !st; i++, doc_index++) {
            const int split = cdp_tokenize_is_val(doc_index, o->val_fraction);
            if (o->eot >= 0) st = write_ids(&w, split, &o->eot, 1);
            if (!st) st = write_ids(&w, split, docs[i].ids, docs[i].n_ids);
            stats->docs[split]++;
            stats->tokens[split] += docs[i].n_ids + (o->eot >= 0);
        }
        for (int i = 0; i < n; i++) {
            free(docs[i].text);
            free(docs[i].ids);
            memset(&docs[i], 0, sizeof docs[i]);
        }
        if (!st && o->progress) o->progress(o->ctx, r.bytes_done, in.bytes, stats->tokens[0] + stats->tokens[1]);
    }
    if (!st && stats->docs[0] == 0)
        st = cdp_fail(CDP_ERR_INVALID, "tokenize: %s", doc_index ? "every document went to the validation split"
                                                                  : "the inputs hold no text");
    if (!st && o->val_required && o->val_fraction > 0 && stats->docs[1] == 0)
        st = cdp_fail(CDP_ERR_INVALID, "tokenize: the validation split is empty: %lld documents give none at "
                      "fraction %g (give a larger --val-fraction, or --val-fraction 0 and let training take the "
                      "last 10%% of the tokens)", (long long)doc_index, o->val_fraction);
    for (int s = 0; s < 2 && !st; s++) st = close_shard(&w, s);
    for (int s = 0; s < 2; s++) {
        stats->shards[s] = w.index[s];
        if (w.f[s]) cdp_atomic_abort(w.f[s]);
        free(w.f[s]);
    }
    if (r.jsonl) fclose(r.jsonl);
    free(r.buf);
    for (int i = 0; i < w.n_done; i++) {
        if (st) unlink(w.done[i]);
        free(w.done[i]);
    }
    free(w.done);
    free(w.buf);
    free(docs);
    for (int i = 0; i < in.n; i++) free(in.files[i]);
    free(in.files);
    stats->bytes = r.bytes_done;
    return st;
}
