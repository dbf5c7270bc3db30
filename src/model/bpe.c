/* Byte-level BPE (bpe.h): GPT-2's byte table, a pre-tokenizer regex run by
 * PCRE2 (GPT-2's or Llama 3's pattern, or the one a tokenizer.json names), and
 * the merges, kept as a hash table of id pairs. Vocabularies come from
 * vocab.json + merges.txt or from a Hugging Face tokenizer.json. */
#include "model/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"

#define CODEPOINTS 0x200 /* every character of the byte table is below U+0200 */

/* The pre-tokenizer patterns, as the tokenizers library and tiktoken write them. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* One merge: the pair (a, b), its rank and the id of the joined token. */
struct merge {
    uint64_t key; /* (a << 32 | b) + 1; 0: an empty slot */
    int32_t rank, id;
};

struct cdp_bpe {
    json_t *vocab; /* token (byte-table characters) -> id */
    json_t *added; /* tokenizer.json's added tokens: text -> id */
    struct merge *merges;
    uint64_t mcap; /* slots, a power of two */
    int64_t n_merges;
    int64_t n;     /* ids: 0 .. n-1 */
    char **bytes;  /* id -> its bytes (NULL: no token has this id) */
    size_t *len;
    char sym[256][3];        /* byte -> its character, UTF-8, NUL-terminated */
    int byte_of[CODEPOINTS]; /* character -> byte, or -1 */
    int32_t byte_id[256];    /* byte -> the id of its one-character token, or -1 */
    int ignore_merges;       /* a piece that is a token is that token (Llama 3) */
    pcre2_code *re;
    char *pattern;
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
    json_decref(b->added);
    free(b->merges);
    if (b->bytes)
        for (int64_t i = 0; i < b->n; i++) free(b->bytes[i]);
    free(b->bytes);
    free(b->len);
    pcre2_code_free(b->re);
    free(b->pattern);
    free(b);
}

int64_t cdp_bpe_vocab_size(const struct cdp_bpe *b) { return b->n; }

const char *cdp_bpe_decode(const struct cdp_bpe *b, int32_t id, size_t *len)
{
    if (id < 0 || id >= b->n || !b->bytes[id]) return NULL;
    *len = b->len[id];
    return b->bytes[id];
}

int32_t cdp_bpe_token_id(const struct cdp_bpe *b, const char *text)
{
    const json_t *v = b->added ? json_object_get(b->added, text) : NULL;
    if (!v) v = json_object_get(b->vocab, text);
    return v ? (int32_t)json_integer_value(v) : -1;
}

const char *cdp_bpe_pattern(const struct cdp_bpe *b) { return b->pattern; }

/* ---- loading --------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t pair_key(int32_t a, int32_t c) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)c) + 1; }

static const struct merge *merge_find(const struct cdp_bpe *b, int32_t a, int32_t c)
{
    if (!b->mcap) return NULL;
    const uint64_t key = pair_key(a, c);
    for (uint64_t i = mix64(key) & (b->mcap - 1);; i = (i + 1) & (b->mcap - 1)) {
        if (b->merges[i].key == key) return &b->merges[i];
        if (!b->merges[i].key) return NULL;
    }
}

/* The vocabulary: an object of token -> id, ids 0 .. size-1 each once
 * (tokenizer.json's added tokens may come above). */
static cdp_status vocab_from(struct cdp_bpe *b, json_t *obj, const char *path, const char *ptr)
{
    if (!json_is_object(obj) || json_object_size(obj) == 0)
        return cdp_fail(CDP_ERR_INVALID, "%s: %s: expected an object of token -> id", path, ptr);
    b->vocab = json_incref(obj);
    b->n = (int64_t)json_object_size(obj);
    if (b->n > INT32_MAX) return cdp_fail(CDP_ERR_INVALID, "%s: %s: more than 2^31 - 1 tokens", path, ptr);
    b->bytes = calloc((size_t)b->n, sizeof *b->bytes);
    b->len = calloc((size_t)b->n, sizeof *b->len);
    if (!b->bytes || !b->len) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    const char *tok;
    json_t *v;
    json_object_foreach(obj, tok, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= b->n)
            return cdp_fail(CDP_ERR_INVALID, "%s: %s/%s: expected an id in [0, %lld) (one per token)", path, ptr, tok,
                            (long long)b->n);
        const int64_t id = json_integer_value(v);
        if (b->bytes[id])
            return cdp_fail(CDP_ERR_INVALID, "%s: %s/%s: id %lld is given to two tokens", path, ptr, tok,
                            (long long)id);
        const size_t n = strlen(tok);
        if (!(b->bytes[id] = malloc(n + 1))) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
        if (token_bytes(b, tok, b->bytes[id], &b->len[id]))
            return cdp_fail(CDP_ERR_INVALID, "%s: %s/%s: not a byte-level token (a character outside GPT-2's byte "
                            "table)", path, ptr, tok);
    }
    for (int c = 0; c < 256; c++) {
        const json_t *id = json_object_get(obj, b->sym[c]);
        b->byte_id[c] = id ? (int32_t)json_integer_value(id) : -1;
    }
    return CDP_OK;
}

static cdp_status merges_reserve(struct cdp_bpe *b, int64_t count, const char *path)
{
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)count + 16) cap *= 2;
    if (!(b->merges = calloc(cap, sizeof *b->merges))) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    b->mcap = cap;
    return CDP_OK;
}

/* Merge rank `rank` joins tokens a and c; where names it in messages ("file:3"
 * or "file: /model/merges/2"). The first rank of a pair listed twice counts, as
 * in GPT-2. */
static cdp_status merge_add(struct cdp_bpe *b, const char *a, const char *c, int64_t rank, const char *where)
{
    const size_t la = strlen(a), lc = strlen(c);
    char *join = malloc(la + lc + 1);
    if (!join) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", where);
    memcpy(join, a, la);
    memcpy(join + la, c, lc + 1);
    const json_t *ia = json_object_get(b->vocab, a), *ic = json_object_get(b->vocab, c),
                 *ij = json_object_get(b->vocab, join);
    const char *miss = !ia ? a : !ic ? c : !ij ? join : NULL;
    if (miss) {
        cdp_status st = cdp_fail(CDP_ERR_INVALID, "%s: \"%s\" is not a token of the vocabulary", where, miss);
        free(join);
        return st;
    }
    free(join);
    if (rank > INT32_MAX) return cdp_fail(CDP_ERR_INVALID, "%s: more than 2^31 - 1 merges", where);
    if ((uint64_t)(b->n_merges + 1) * 2 > b->mcap) { /* grow */
        struct merge *old = b->merges;
        const uint64_t oldcap = b->mcap;
        if (merges_reserve(b, 2 * b->n_merges + 16, where)) {
            b->merges = old;
            b->mcap = oldcap;
            return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", where);
        }
        for (uint64_t i = 0; i < oldcap; i++) {
            if (!old[i].key) continue;
            uint64_t j = mix64(old[i].key) & (b->mcap - 1);
            while (b->merges[j].key) j = (j + 1) & (b->mcap - 1);
            b->merges[j] = old[i];
        }
        free(old);
    }
    const int32_t x = (int32_t)json_integer_value(ia), y = (int32_t)json_integer_value(ic);
    const uint64_t key = pair_key(x, y);
    uint64_t i = mix64(key) & (b->mcap - 1);
    for (; b->merges[i].key; i = (i + 1) & (b->mcap - 1))
        if (b->merges[i].key == key) return CDP_OK;
    b->merges[i] = (struct merge){key, (int32_t)rank, (int32_t)json_integer_value(ij)};
    b->n_merges++;
    return CDP_OK;
}

static cdp_status load_merges(struct cdp_bpe *b, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return cdp_fail(CDP_ERR_INVALID, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    int64_t rank = 0;
    cdp_status st = merges_reserve(b, 1024, path);
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
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", path, lineno);
        st = merge_add(b, line, sp + 1, rank++, where);
    }
    if (!st && ferror(f)) st = cdp_fail(CDP_ERR_IO, "%s: read error", path);
    free(line);
    fclose(f);
    return st;
}

static cdp_status set_pattern(struct cdp_bpe *b, const char *pattern, const char *where)
{
    int err = 0;
    PCRE2_SIZE off = 0;
    if (!(b->pattern = strdup(pattern))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    b->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                          &err, &off, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return cdp_fail(CDP_ERR_INVALID, "%s: the pre-tokenizer pattern does not compile at offset %zu: %s", where,
                        (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); /* faster where PCRE2 has a JIT; the interpreter otherwise */
    return CDP_OK;
}

static cdp_status bpe_new(struct cdp_bpe **out)
{
    *out = NULL;
    struct cdp_bpe *b = calloc(1, sizeof *b);
    if (!b) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    byte_table(b);
    *out = b;
    return CDP_OK;
}

cdp_status cdp_bpe_load_pattern(const char *vocab_path, const char *merges_path, enum cdp_bpe_pretok pretok,
                                struct cdp_bpe **out)
{
    struct cdp_bpe *b;
    cdp_status st = bpe_new(&b);
    if (st) return st;
    json_error_t err;
    json_t *v = json_load_file(vocab_path, JSON_REJECT_DUPLICATES, &err);
    if (!v)
        st = cdp_fail(CDP_ERR_INVALID, "%s:%d:%d: %s (expected GPT-2's vocab.json: an object of token -> id)",
                      vocab_path, err.line, err.column, err.text);
    else if (!json_is_object(v) || json_object_size(v) == 0)
        st = cdp_fail(CDP_ERR_INVALID, "%s: expected an object of token -> id (GPT-2's vocab.json)", vocab_path);
    else
        st = vocab_from(b, v, vocab_path, "");
    json_decref(v);
    if (!st) st = load_merges(b, merges_path);
    if (!st) st = set_pattern(b, pretok == CDP_BPE_PRETOK_LLAMA3 ? llama3_pattern : gpt2_pattern, merges_path);
    if (st) {
        cdp_bpe_free(b);
        return st;
    }
    *out = b;
    return CDP_OK;
}

cdp_status cdp_bpe_load(const char *vocab_path, const char *merges_path, struct cdp_bpe **out)
{
    return cdp_bpe_load_pattern(vocab_path, merges_path, CDP_BPE_PRETOK_GPT2, out);
}

/* ---- tokenizer.json ----------------------------------------------------------- */

static int is_null_or(const json_t *v, const char *empty)
{
    return !v || json_is_null(v) || (empty && json_is_string(v) && !strcmp(json_string_value(v), empty));
}

/* A ByteLevel pre-tokenizer: add_prefix_space must be false; use_regex says
 * whether it splits with GPT-2's pattern itself. */
static cdp_status byte_level(const char *path, const char *ptr, const json_t *o, int *use_regex)
{
    const json_t *aps = json_object_get(o, "add_prefix_space"), *ur = json_object_get(o, "use_regex");
    if (aps && !json_is_false(aps))
        return cdp_fail(CDP_ERR_INVALID, "%s: %s/add_prefix_space: true is not supported (expected false: the text "
                        "is encoded as it is)", path, ptr);
    *use_regex = !ur || json_is_true(ur);
    return CDP_OK;
}

static const char *type_of(const json_t *o)
{
    const json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* The pre-tokenizer: ByteLevel (GPT-2), or a Sequence of one Split by a regex
 * (behavior Isolated) and a ByteLevel without its regex (Llama 3). */
static cdp_status load_pretokenizer(struct cdp_bpe *b, const char *path, const json_t *pt)
{
    const char *t = type_of(pt);
    int use_regex = 0;
    cdp_status st;
    if (t && !strcmp(t, "ByteLevel")) {
        if ((st = byte_level(path, "/pre_tokenizer", pt, &use_regex))) return st;
        if (!use_regex)
            return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer/use_regex: false leaves the text unsplit; expected "
                            "true (GPT-2) or a Sequence with a Split (Llama 3)", path);
        return set_pattern(b, gpt2_pattern, path);
    }
    const json_t *list = json_object_get(pt, "pretokenizers");
    if (!t || strcmp(t, "Sequence") || !json_is_array(list) || json_array_size(list) != 2)
        return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer: expected ByteLevel, or a Sequence of a Split and a "
                        "ByteLevel (Llama 3), got %s", path, t ? t : "no type");
    const json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
    const char *ts = type_of(split), *tb = type_of(bl);
    if (!ts || strcmp(ts, "Split"))
        return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer/pretokenizers/0: expected a Split, got %s", path,
                        ts ? ts : "no type");
    if (!tb || strcmp(tb, "ByteLevel"))
        return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer/pretokenizers/1: expected a ByteLevel, got %s", path,
                        tb ? tb : "no type");
    if ((st = byte_level(path, "/pre_tokenizer/pretokenizers/1", bl, &use_regex))) return st;
    if (use_regex)
        return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer/pretokenizers/1/use_regex: expected false after a Split",
                        path);
    const json_t *beh = json_object_get(split, "behavior"), *inv = json_object_get(split, "invert");
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
        return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer/pretokenizers/0/behavior: expected \"Isolated\"", path);
    if (inv && !json_is_false(inv))
        return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer/pretokenizers/0/invert: expected false", path);
    const json_t *re = json_object_get(json_object_get(split, "pattern"), "Regex");
    if (!json_is_string(re))
        return cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer/pretokenizers/0/pattern: expected {\"Regex\": ...}",
                        path);
    return set_pattern(b, json_string_value(re), path);
}

static cdp_status load_model(struct cdp_bpe *b, const char *path, const json_t *m)
{
    cdp_status st;
    const char *t = type_of(m);
    if (!json_is_object(m)) return cdp_fail(CDP_ERR_INVALID, "%s: /model: expected an object", path);
    if (t && strcmp(t, "BPE"))
        return cdp_fail(CDP_ERR_INVALID, "%s: /model/type: expected \"BPE\", got \"%s\"", path, t);
    static const char *const must_be_null[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof must_be_null / sizeof must_be_null[0]; i++)
        if (!is_null_or(json_object_get(m, must_be_null[i]), i ? "" : NULL))
            return cdp_fail(CDP_ERR_INVALID, "%s: /model/%s: not supported (expected null)", path, must_be_null[i]);
    const json_t *bf = json_object_get(m, "byte_fallback"), *im = json_object_get(m, "ignore_merges");
    if (bf && !json_is_false(bf))
        return cdp_fail(CDP_ERR_INVALID, "%s: /model/byte_fallback: not supported (expected false: byte-level BPE)",
                        path);
    if (im && !json_is_boolean(im)) return cdp_fail(CDP_ERR_INVALID, "%s: /model/ignore_merges: expected a boolean", path);
    b->ignore_merges = json_is_true(im);
    if ((st = vocab_from(b, json_object_get(m, "vocab"), path, "/model/vocab"))) return st;
    const json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return cdp_fail(CDP_ERR_INVALID, "%s: /model/merges: expected an array", path);
    if ((st = merges_reserve(b, (int64_t)json_array_size(merges), path))) return st;
    size_t k;
    json_t *e;
    json_array_foreach(merges, k, e) {
        char where[4200], pair[2][512];
        snprintf(where, sizeof where, "%s: /model/merges/%zu", path, k);
        const char *a = NULL, *c = NULL;
        if (json_is_string(e)) { /* "a b" (tokenizers before 0.20) */
            const char *s = json_string_value(e), *sp = strchr(s, ' ');
            if (sp && sp > s && sp[1] && !strchr(sp + 1, ' ') && (size_t)(sp - s) < sizeof pair[0] &&
                strlen(sp + 1) < sizeof pair[1]) {
                memcpy(pair[0], s, (size_t)(sp - s));
                pair[0][sp - s] = '\0';
                strcpy(pair[1], sp + 1);
                a = pair[0], c = pair[1];
            }
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) { /* ["a", "b"] */
            a = json_string_value(json_array_get(e, 0));
            c = json_string_value(json_array_get(e, 1));
        }
        if (!a) return cdp_fail(CDP_ERR_INVALID, "%s: expected \"a b\" or [\"a\", \"b\"]", where);
        if ((st = merge_add(b, a, c, (int64_t)k, where))) return st;
    }
    return CDP_OK;
}

/* Added tokens take ids of their own (above the model's, or on top of one). */
static cdp_status load_added(struct cdp_bpe *b, const char *path, const json_t *list)
{
    if (!list || json_is_null(list)) return CDP_OK;
    if (!json_is_array(list)) return cdp_fail(CDP_ERR_INVALID, "%s: /added_tokens: expected an array", path);
    if (!(b->added = json_object())) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    size_t k;
    json_t *e;
    json_array_foreach(list, k, e) {
        const json_t *id = json_object_get(e, "id"), *content = json_object_get(e, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX ||
            !json_is_string(content))
            return cdp_fail(CDP_ERR_INVALID, "%s: /added_tokens/%zu: expected {\"id\": a non-negative integer, "
                            "\"content\": a string}", path, k);
        const int64_t i = json_integer_value(id);
        if (i >= b->n) {
            char **nb = realloc(b->bytes, (size_t)(i + 1) * sizeof *nb);
            if (nb) b->bytes = nb;
            size_t *nl = nb ? realloc(b->len, (size_t)(i + 1) * sizeof *nl) : NULL;
            if (!nl) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
            b->len = nl;
            for (int64_t j = b->n; j <= i; j++) b->bytes[j] = NULL, b->len[j] = 0;
            b->n = i + 1;
        }
        const char *s = json_string_value(content);
        if (!b->bytes[i]) {
            if (!(b->bytes[i] = strdup(s))) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
            b->len[i] = strlen(s);
        }
        if (json_object_set_new(b->added, s, json_integer(i))) return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    }
    return CDP_OK;
}

cdp_status cdp_bpe_load_json(const char *path, struct cdp_bpe **out)
{
    struct cdp_bpe *b;
    cdp_status st = bpe_new(&b);
    if (st) return st;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) {
        st = cdp_fail(CDP_ERR_INVALID, "%s:%d:%d: %s (expected a Hugging Face tokenizer.json)", path, err.line,
                      err.column, err.text);
    } else if (!json_is_object(root)) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: expected an object (a Hugging Face tokenizer.json)", path);
    } else if (!is_null_or(json_object_get(root, "normalizer"), NULL)) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: /normalizer: not supported (expected null: byte-level BPE encodes the "
                      "text as it is)", path);
    } else {
        st = load_model(b, path, json_object_get(root, "model"));
        if (!st) st = load_added(b, path, json_object_get(root, "added_tokens"));
        if (!st) {
            const json_t *pt = json_object_get(root, "pre_tokenizer");
            st = json_is_object(pt) ? load_pretokenizer(b, path, pt)
                                    : cdp_fail(CDP_ERR_INVALID, "%s: /pre_tokenizer: expected ByteLevel, or a "
                                               "Sequence of a Split and a ByteLevel (Llama 3)", path);
        }
    }
    json_decref(root);
    if (st) {
        cdp_bpe_free(b);
        return st;
    }
    *out = b;
    return CDP_OK;
}

/* ---- encoding ---------------------------------------------------------------- */

struct ids {
    int32_t *v;
    int64_t n, cap;
};

static cdp_status push_id(struct ids *o, int32_t id)
{
    if (o->n == o->cap) {
        const int64_t nc = o->cap ? 2 * o->cap : 64;
        int32_t *ni = realloc(o->v, (size_t)nc * sizeof *ni);
        if (!ni) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        o->v = ni;
        o->cap = nc;
    }
    o->v[o->n++] = id;
    return CDP_OK;
}

/* Scratch of one encode call, sized for the text: the piece's symbols as a
 * linked list and a min-heap of candidate merges (rank, then position). */
struct scratch {
    int32_t *id, *prev, *next;
    uint64_t *heap; /* rank << 32 | position */
    size_t n_heap, cap; /* cap: the longest piece it holds */
};

/* Room for a piece of n bytes (grown to the longest piece seen, not the text). */
static cdp_status scratch_fit(struct scratch *w, size_t n)
{
    if (n <= w->cap) return CDP_OK;
    size_t c = w->cap ? w->cap : 256;
    while (c < n) c *= 2;
    int32_t *id = realloc(w->id, c * sizeof *id);
    if (id) w->id = id;
    int32_t *pv = id ? realloc(w->prev, c * sizeof *pv) : NULL;
    if (pv) w->prev = pv;
    int32_t *nx = pv ? realloc(w->next, c * sizeof *nx) : NULL;
    if (nx) w->next = nx;
    uint64_t *hp = nx ? realloc(w->heap, 3 * c * sizeof *hp) : NULL;
    if (!hp) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    w->heap = hp;
    w->cap = c;
    return CDP_OK;
}

static void heap_push(struct scratch *w, uint64_t v)
{
    size_t i = w->n_heap++;
    while (i > 0) {
        const size_t up = (i - 1) / 2;
        if (w->heap[up] <= v) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = v;
}

static uint64_t heap_pop(struct scratch *w)
{
    const uint64_t top = w->heap[0], v = w->heap[--w->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->n_heap) break;
        if (c + 1 < w->n_heap && w->heap[c + 1] < w->heap[c]) c++;
        if (v <= w->heap[c]) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->n_heap) w->heap[i] = v;
    return top;
}

static void push_pair(const struct cdp_bpe *b, struct scratch *w, int32_t pos)
{
    const int32_t nx = w->next[pos];
    if (nx < 0) return;
    const struct merge *mg = merge_find(b, w->id[pos], w->id[nx]);
    if (mg) heap_push(w, (uint64_t)(uint32_t)mg->rank << 32 | (uint32_t)pos);
}

/* One piece: its bytes' tokens merged as the tokenizers library merges them
 * (models/bpe/word.rs): the candidate of lowest rank first, the leftmost of
 * equal ranks, each merge offering the pairs it forms with its neighbours;
 * O(n log n) in the piece's length, so a long run of letters without spaces
 * (Chinese, Japanese) costs no more than its size. */
static cdp_status encode_piece(const struct cdp_bpe *b, const unsigned char *s, size_t n, struct scratch *w,
                               struct ids *o)
{
    if (b->ignore_merges) { /* the whole piece, when it is a token */
        char buf[1024];
        size_t k = 0;
        for (size_t i = 0; i < n && k + 3 < sizeof buf; i++) {
            const size_t l = strlen(b->sym[s[i]]);
            memcpy(buf + k, b->sym[s[i]], l);
            k += l;
        }
        buf[k] = '\0';
        const json_t *id = k + 3 < sizeof buf ? json_object_get(b->vocab, buf) : NULL;
        if (id) return push_id(o, (int32_t)json_integer_value(id));
    }
    cdp_status st = scratch_fit(w, n);
    if (st) return st;
    for (size_t i = 0; i < n; i++) {
        if ((w->id[i] = b->byte_id[s[i]]) < 0)
            return cdp_fail(CDP_ERR_INVALID, "the text holds \"%s\" (byte 0x%02x), which is not a token of the "
                            "vocabulary", b->sym[s[i]], s[i]);
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(b, w, (int32_t)i);
    while (w->n_heap) {
        const uint64_t top = heap_pop(w);
        const int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32);
        if (w->id[pos] < 0) continue; /* merged into its left neighbour */
        const int32_t nx = w->next[pos];
        if (nx < 0) continue;
        const struct merge *mg = merge_find(b, w->id[pos], w->id[nx]);
        if (!mg || mg->rank != rank) continue; /* an expired candidate */
        w->id[pos] = mg->id;
        w->id[nx] = -1;
        w->next[pos] = w->next[nx];
        if (w->next[nx] >= 0) w->prev[w->next[nx]] = pos;
        if (w->prev[pos] >= 0) push_pair(b, w, w->prev[pos]);
        push_pair(b, w, pos);
    }
    for (int32_t i = 0; i >= 0 && !st; i = w->next[i]) st = push_id(o, w->id[i]);
    return st;
}

/* Bytes in a UTF-8 sequence that starts with c (1 for a byte that starts none). */
static size_t utf8_len(unsigned char c) { return c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

cdp_status cdp_bpe_encode(const struct cdp_bpe *b, const char *text, size_t n, int32_t **ids, int64_t *count)
{
    const unsigned char *s = (const unsigned char *)text;
    struct ids o = {0};
    *ids = NULL;
    *count = 0;
    if (n == 0) return CDP_OK;
    if (n > (size_t)INT32_MAX) return cdp_fail(CDP_ERR_INVALID, "a text of %zu bytes: at most 2^31 - 1 at once", n);
    struct scratch w = {0};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->re, NULL);
    cdp_status st = CDP_OK;
    if (!md) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
    /* the pattern's matches are the pieces; bytes no match covers (invalid
     * UTF-8, or what a pattern leaves) are pieces too, as the tokenizers
     * library's Split (behavior Isolated) keeps them */
    size_t pos = 0, gap = 0;
    while (!st && pos < n) {
        const int rc = pcre2_match(b->re, s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            st = cdp_fail(CDP_ERR_INVALID, "pre-tokenizer at byte %zu: %s", pos, (const char *)msg);
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { /* an empty match: its character joins the gap */
            pos = ov[0] + utf8_len(s[ov[0]]);
            continue;
        }
        if (ov[0] > gap) st = encode_piece(b, s + gap, ov[0] - gap, &w, &o);
        if (!st) st = encode_piece(b, s + ov[0], ov[1] - ov[0], &w, &o);
        pos = gap = ov[1];
    }
    if (!st && gap < n) st = encode_piece(b, s + gap, n - gap, &w, &o);
    pcre2_match_data_free(md);
    free(w.id), free(w.prev), free(w.next), free(w.heap);
    if (st) {
        free(o.v);
        return st;
    }
    *ids = o.v;
    *count = o.n;
    return CDP_OK;
}
