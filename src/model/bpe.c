/* GPT-2's byte-level BPE (bpe.h): the byte table, the pre-tokenizer (GPT-2's
 * pattern, exact for ASCII) and the merges, with vocab.json and the merge
 * ranks held in jansson objects (hash tables). */
#include "model/bpe.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"

#define CODEPOINTS 0x200 /* every character of the byte table is below U+0200 */

struct cdp_bpe {
    json_t *vocab; /* token -> id */
    json_t *ranks; /* "a b" -> merge rank */
    int64_t n;
    char **bytes; /* id -> its bytes */
    size_t *len;
    char sym[256][3]; /* byte -> its character, UTF-8, NUL-terminated */
    int byte_of[CODEPOINTS]; /* character -> byte, or -1 */
};

/* openai/gpt-2 encoder.py bytes_to_unicode(): printable bytes keep their
 * code, the rest take U+0100, U+0101, ... in byte order. */
static void byte_table(struct cdp_bpe *b)
{
    for (int i = 0; i < CODEPOINTS; i++) b->byte_of[i] = -1;
    int next = 256;
    for (int c = 0; c < 256; c++) {
        const int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        const int cp = printable ? c : next++;
        b->byte_of[cp] = c;
        if (cp < 0x80) {
            b->sym[c][0] = (char)cp;
            b->sym[c][1] = '\0';
        } else {
            b->sym[c][0] = (char)(0xC0 | (cp >> 6));
            b->sym[c][1] = (char)(0x80 | (cp & 0x3F));
            b->sym[c][2] = '\0';
        }
    }
}

/* A token's characters back to bytes; -1 when one is not in the byte table. */
static int token_bytes(const struct cdp_bpe *b, const char *tok, char *out, size_t *n)
{
    const unsigned char *s = (const unsigned char *)tok;
    size_t k = 0;
    while (*s) {
        int cp;
        if (s[0] < 0x80) {
            cp = s[0];
            s++;
        } else if ((s[0] & 0xE0) == 0xC0 && (s[1] & 0xC0) == 0x80) {
            cp = ((s[0] & 0x1F) << 6) | (s[1] & 0x3F);
            s += 2;
        } else {
            return -1;
        }
        if (cp >= CODEPOINTS || b->byte_of[cp] < 0) return -1;
        out[k++] = (char)b->byte_of[cp];
    }
    *n = k;
    return 0;
}

void cdp_bpe_free(struct cdp_bpe *b)
{
    if (!b) return;
    json_decref(b->vocab);
    json_decref(b->ranks);
    if (b->bytes)
        for (int64_t i = 0; i < b->n; i++) free(b->bytes[i]);
    free(b->bytes);
    free(b->len);
    free(b);
}

int64_t cdp_bpe_vocab_size(const struct cdp_bpe *b) { return b->n; }

const char *cdp_bpe_decode(const struct cdp_bpe *b, int32_t id, size_t *len)
{
    if (id < 0 || id >= b->n) return NULL;
    *len = b->len[id];
    return b->bytes[id];
}

static cdp_status load_vocab(struct cdp_bpe *b, const char *path)
{
    json_error_t err;
    b->vocab = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!b->vocab)
        return cdp_fail(CDP_ERR_INVALID, "%s:%d:%d: %s (expected GPT-2's vocab.json: an object of token -> id)", path,
                        err.line, err.column, err.text);
    if (!json_is_object(b->vocab) || json_object_size(b->vocab) == 0)
        return cdp_fail(CDP_ERR_INVALID, "%s: expected an object of token -> id (GPT-2's vocab.json)", path);
    b->n = (int64_t)json_object_size(b->vocab);
    if (b->n > INT32_MAX) return cdp_fail(CDP_ERR_INVALID, "%s: more than 2^31 - 1 tokens", path);
    b->bytes = calloc((size_t)b->n, sizeof *b->bytes);
    b->len = calloc((size_t)b->n, sizeof *b->len);
    if (!b->bytes || !b->len) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    const char *tok;
    json_t *v;
    json_object_foreach(b->vocab, tok, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= b->n)
            return cdp_fail(CDP_ERR_INVALID, "%s: /%s: expected an id in [0, %lld) (one per token)", path, tok,
                            (long long)b->n);
        const int64_t id = json_integer_value(v);
        if (b->bytes[id])
            return cdp_fail(CDP_ERR_INVALID, "%s: /%s: id %lld is given to two tokens", path, tok, (long long)id);
        const size_t n = strlen(tok);
        if (!(b->bytes[id] = malloc(n + 1))) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
        if (token_bytes(b, tok, b->bytes[id], &b->len[id]))
            return cdp_fail(CDP_ERR_INVALID, "%s: /%s: not a byte-level token (a character outside GPT-2's byte "
                            "table)", path, tok);
    }
    return CDP_OK;
}

static cdp_status load_merges(struct cdp_bpe *b, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return cdp_fail(CDP_ERR_INVALID, "%s: cannot open: %s", path, strerror(errno));
    if (!(b->ranks = json_object())) {
        fclose(f);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    }
    char *line = NULL, *join = NULL;
    size_t cap = 0, jcap = 0;
    ssize_t got;
    long lineno = 0;
    json_int_t rank = 0;
    cdp_status st = CDP_OK;
    while (!st && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0 || (lineno == 1 && !strncmp(line, "#version", 8))) continue;
        char *sp = strchr(line, ' ');
        if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' ')) {
            st = cdp_fail(CDP_ERR_INVALID, "%s:%ld: expected two tokens separated by one space, got \"%s\"", path,
                          lineno, line);
            break;
        }
        *sp = '\0';
        const size_t la = strlen(line), lb = strlen(sp + 1);
        if (la + lb + 1 > jcap) {
            jcap = 2 * (la + lb + 1);
            char *nj = realloc(join, jcap);
            if (!nj) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
                break;
            }
            join = nj;
        }
        memcpy(join, line, la);
        memcpy(join + la, sp + 1, lb + 1);
        const char *miss = !json_object_get(b->vocab, line) ? line
                           : !json_object_get(b->vocab, sp + 1) ? sp + 1
                           : !json_object_get(b->vocab, join)   ? join
                                                                : NULL;
        if (miss) {
            st = cdp_fail(CDP_ERR_INVALID, "%s:%ld: \"%s\" is not a token of the vocabulary", path, lineno, miss);
            break;
        }
        *sp = ' ';
        /* the first rank of a pair listed twice counts, as in GPT-2 */
        if (!json_object_get(b->ranks, line) && json_object_set_new(b->ranks, line, json_integer(rank)))
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
        rank++;
    }
    if (!st && ferror(f)) st = cdp_fail(CDP_ERR_IO, "%s: read error", path);
    free(line);
    free(join);
    fclose(f);
    return st;
}

cdp_status cdp_bpe_load(const char *vocab_path, const char *merges_path, struct cdp_bpe **out)
{
    *out = NULL;
    struct cdp_bpe *b = calloc(1, sizeof *b);
    if (!b) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    byte_table(b);
    cdp_status st = load_vocab(b, vocab_path);
    if (!st) st = load_merges(b, merges_path);
    if (st) {
        cdp_bpe_free(b);
        return st;
    }
    *out = b;
    return CDP_OK;
}

/* The pre-tokenizer's classes (bpe.h: non-ASCII counts as a letter). */
static int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_letter(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
enum { C_SPACE, C_LETTER, C_DIGIT, C_OTHER };
static int class_of(unsigned char c)
{
    return is_space(c) ? C_SPACE : is_letter(c) ? C_LETTER : is_digit(c) ? C_DIGIT : C_OTHER;
}

/* The end of the piece of GPT-2's pattern that starts at s[i]. */
static size_t piece_end(const unsigned char *s, size_t n, size_t i)
{
    if (s[i] == '\'') { /* 's|'t|'re|'ve|'m|'ll|'d */
        static const char *const c[] = {"s", "t", "re", "ve", "m", "ll", "d"};
        for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
            const size_t l = strlen(c[k]);
            if (i + 1 + l <= n && !memcmp(s + i + 1, c[k], l)) return i + 1 + l;
        }
    }
    size_t j = i;
    if (s[j] == ' ' && j + 1 < n && !is_space(s[j + 1])) j++; /* ` ?` before letters, digits or others */
    const int cls = class_of(s[j]);
    if (cls != C_SPACE) {
        while (j < n && class_of(s[j]) == cls) j++;
        return j;
    }
    size_t k = i;
    while (k < n && is_space(s[k])) k++;
    /* \s+(?!\S): the run, less its last character when text follows; a
     * single whitespace character before text is \s+ */
    if (k < n && k - i >= 2) return k - 1;
    return k;
}

/* One piece's symbols merged by rank; ids appended to *ids. */
static cdp_status encode_piece(const struct cdp_bpe *b, const unsigned char *s, size_t n, int32_t **ids,
                               int64_t *count, int64_t *cap)
{
    char **sym = calloc(n, sizeof *sym);
    char *key = NULL;
    size_t kcap = 0, m = n;
    cdp_status st = CDP_OK;
    if (!sym) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !st; i++)
        if (!(sym[i] = strdup(b->sym[s[i]]))) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
    while (!st && m > 1) {
        json_int_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            const size_t la = strlen(sym[i]), lb = strlen(sym[i + 1]);
            if (la + lb + 2 > kcap) {
                kcap = 2 * (la + lb + 2);
                char *nk = realloc(key, kcap);
                if (!nk) {
                    st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                    break;
                }
                key = nk;
            }
            memcpy(key, sym[i], la);
            key[la] = ' ';
            memcpy(key + la + 1, sym[i + 1], lb + 1);
            const json_t *r = json_object_get(b->ranks, key);
            if (r && (best < 0 || json_integer_value(r) < best)) {
                best = json_integer_value(r);
                at = i;
            }
        }
        if (st || best < 0) break;
        /* every occurrence of the pair, left to right */
        char *first = sym[at], *second = sym[at + 1];
        char *a = strdup(first), *c = strdup(second);
        if (!a || !c) {
            free(a), free(c);
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            break;
        }
        size_t w = 0;
        for (size_t i = 0; i < m && !st; i++) {
            if (i + 1 < m && !strcmp(sym[i], a) && !strcmp(sym[i + 1], c)) {
                const size_t la = strlen(sym[i]), lc = strlen(sym[i + 1]);
                char *j = malloc(la + lc + 1);
                if (!j) {
                    st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                    break;
                }
                memcpy(j, sym[i], la);
                memcpy(j + la, sym[i + 1], lc + 1);
                free(sym[i]);
                free(sym[i + 1]);
                sym[i + 1] = NULL;
                sym[w++] = j;
                i++;
            } else {
                sym[w++] = sym[i];
            }
        }
        for (size_t i = w; i < m; i++) sym[i] = NULL;
        m = w;
        free(a);
        free(c);
    }
    for (size_t i = 0; i < m && !st; i++) {
        const json_t *id = json_object_get(b->vocab, sym[i]);
        if (!id) {
            st = cdp_fail(CDP_ERR_INVALID, "the text holds \"%s\", which is not a token of the vocabulary", sym[i]);
            break;
        }
        if (*count == *cap) {
            const int64_t nc = *cap ? 2 * *cap : 64;
            int32_t *ni = realloc(*ids, (size_t)nc * sizeof *ni);
            if (!ni) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
                break;
            }
            *ids = ni;
            *cap = nc;
        }
        (*ids)[(*count)++] = (int32_t)json_integer_value(id);
    }
    for (size_t i = 0; i < n; i++) free(sym[i]);
    free(sym);
    free(key);
    return st;
}

cdp_status cdp_bpe_encode(const struct cdp_bpe *b, const char *text, size_t n, int32_t **ids, int64_t *count)
{
    const unsigned char *s = (const unsigned char *)text;
    int64_t cap = 0;
    *ids = NULL;
    *count = 0;
    cdp_status st = CDP_OK;
    for (size_t i = 0; i < n && !st;) {
        const size_t e = piece_end(s, n, i);
        st = encode_piece(b, s + i, e - i, ids, count, &cap);
        i = e;
    }
    if (st) {
        free(*ids);
        *ids = NULL;
        *count = 0;
    }
    return st;
}
