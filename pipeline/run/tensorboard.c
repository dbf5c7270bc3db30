/* TensorBoard event files (tensorboard.h). The protocol buffers written are
 * three messages of TensorFlow's event.proto and summary.proto, their fields
 * numbered as there:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; SessionLog session_log = 7; }
 *   Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
 *   SessionLog { SessionStatus status = 1; }  (START = 1)
 * A record is: uint64 length, uint32 masked CRC-32C of those 8 bytes, the
 * bytes, uint32 masked CRC-32C of the bytes, every integer little-endian. */
#include "pipeline/run/tensorboard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

struct cdp_tb {
    FILE *f;
    char *path;
};

/* ---- CRC-32C --------------------------------------------------------------------- */

static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1; /* Castagnoli, reflected */
        crc_table[i] = c;
    }
}

uint32_t cdp_crc32c(const void *data, size_t n)
{
    if (!crc_table[1]) crc_init(); /* the table is the same whichever thread fills it */
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t cdp_tb_masked_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

/* ---- protocol buffer encoding ---------------------------------------------------- */

/* A growing byte buffer; `bad` once an allocation failed. */
struct pb {
    unsigned char *b;
    size_t n, cap;
    int bad;
};

static void pb_bytes(struct pb *p, const void *x, size_t n)
{
    if (p->bad || !n) return;
    if (p->n + n > p->cap) {
        size_t cap = p->cap ? p->cap : 256;
        while (cap < p->n + n) cap *= 2;
        unsigned char *nb = realloc(p->b, cap);
        if (!nb) {
            p->bad = 1;
            return;
        }
        p->b = nb;
        p->cap = cap;
    }
    memcpy(p->b + p->n, x, n);
    p->n += n;
}

static void pb_varint(struct pb *p, uint64_t v)
{
    unsigned char b[10];
    int n = 0;
    do {
        b[n] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) b[n] |= 0x80;
        n++;
    } while (v);
    pb_bytes(p, b, (size_t)n);
}

static void pb_le(struct pb *p, uint64_t v, int bytes)
{
    unsigned char b[8];
    for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
    pb_bytes(p, b, (size_t)bytes);
}

/* wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit */
static void pb_key(struct pb *p, int field, int wire) { pb_varint(p, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_double(struct pb *p, int field, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    pb_key(p, field, 1);
    pb_le(p, u, 8);
}

static void pb_float(struct pb *p, int field, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    pb_key(p, field, 5);
    pb_le(p, u, 4);
}

static void pb_len(struct pb *p, int field, const void *x, size_t n)
{
    pb_key(p, field, 2);
    pb_varint(p, n);
    pb_bytes(p, x, n);
}

/* ---- records --------------------------------------------------------------------- */

static cdp_status write_record(struct cdp_tb *t, const struct pb *ev)
{
    if (ev->bad) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory encoding an event", t->path);
    struct pb r = {0};
    pb_le(&r, ev->n, 8);
    const uint32_t hc = cdp_tb_masked_crc(cdp_crc32c(r.b, 8));
    pb_le(&r, hc, 4);
    pb_bytes(&r, ev->b, ev->n);
    pb_le(&r, cdp_tb_masked_crc(cdp_crc32c(ev->b, ev->n)), 4);
    if (r.bad) {
        free(r.b);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory encoding an event", t->path);
    }
    const long at = ftell(t->f);
    const int bad = fwrite(r.b, 1, r.n, t->f) != r.n || fflush(t->f) != 0;
    const int err = errno;
    free(r.b);
    if (!bad) return CDP_OK;
    /* no record is left cut in half: what reached the file goes again */
    if (at >= 0 && ftruncate(fileno(t->f), (off_t)at) != 0) clearerr(t->f);
    return cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", t->path, strerror(err));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

cdp_status cdp_tb_open(const char *dir, int64_t step0, struct cdp_tb **out)
{
    struct stat sb;
    if (mkdir(dir, 0755) != 0 && !(errno == EEXIST && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return cdp_fail(CDP_ERR_IO, "%s: cannot make the TensorBoard folder: %s", dir,
                        errno == EEXIST ? "a file is in the way" : strerror(errno));
    struct cdp_tb *t = calloc(1, sizeof *t);
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    const double wall = now_s();
    const size_t cap = strlen(dir) + strlen(host) + 96;
    if (!t || !(t->path = malloc(cap))) {
        free(t);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    snprintf(t->path, cap, "%s/events.out.tfevents.%lld.%s.%ld.cdphybrid", dir, (long long)wall, host,
             (long)getpid());
    if (!(t->f = fopen(t->path, "wb"))) {
        cdp_status st = cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", t->path, strerror(errno));
        cdp_tb_close(t);
        return st;
    }
    struct pb ev = {0};
    pb_double(&ev, 1, wall);
    if (step0 > 0) {
        pb_key(&ev, 2, 0);
        pb_varint(&ev, (uint64_t)(step0 + 1));
    }
    static const char version[] = "brain.Event:2";
    pb_len(&ev, 3, version, sizeof version - 1);
    cdp_status st = write_record(t, &ev);
    if (!st && step0 > 0) { /* SessionLog START: TensorBoard purges the steps from here on */
        ev.n = 0;
        pb_double(&ev, 1, wall);
        pb_key(&ev, 2, 0);
        pb_varint(&ev, (uint64_t)(step0 + 1));
        const unsigned char start[] = {0x08, 0x01}; /* status = START */
        pb_len(&ev, 7, start, sizeof start);
        st = write_record(t, &ev);
    }
    free(ev.b);
    if (st) {
        cdp_tb_close(t);
        return st;
    }
    *out = t;
    return CDP_OK;
}

cdp_status cdp_tb_scalars(struct cdp_tb *t, int64_t step, double wall, const char *const *tags,
                          const double *values, int n)
{
    struct pb sum = {0}, val = {0}, ev = {0};
    for (int i = 0; i < n; i++) {
        val.n = 0;
        pb_len(&val, 1, tags[i], strlen(tags[i]));
        pb_float(&val, 2, (float)values[i]);
        if (val.bad) sum.bad = 1;
        pb_len(&sum, 1, val.b, val.n);
    }
    pb_double(&ev, 1, wall);
    pb_key(&ev, 2, 0);
    pb_varint(&ev, (uint64_t)step);
    if (sum.bad) ev.bad = 1;
    pb_len(&ev, 5, sum.b, sum.n);
    cdp_status st = write_record(t, &ev);
    free(val.b);
    free(sum.b);
    free(ev.b);
    return st;
}

const char *cdp_tb_path(const struct cdp_tb *t) { return t->path; }

void cdp_tb_close(struct cdp_tb *t)
{
    if (!t) return;
    if (t->f) fclose(t->f);
    free(t->path);
    free(t);
}
