/* Suite tokenize: the byte-level BPE tokenizers against the Hugging Face
 * tokenizers package, token for token, on a multilingual text
 * (tests/fixtures/tokenize, written by tools/tokenizer-fixture.py), their
 * tokenizer.json errors, and `cdphybrid tokenize` (shards, end-of-text
 * tokens, the validation split, the same bytes with any number of threads). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "model/bpe.h"
#include "model/data.h"
#include "model/tokenize.h"

static const char *fixture(const char *name)
{
    static char path[8][4096];
    static int k;
    char *p = path[k++ & 7];
    snprintf(p, 4096, "%s/%s", cdp_test_source_path("tests/fixtures/tokenize"), name);
    return p;
}

static struct cdp_bpe *gpt2_fixture(void)
{
    struct cdp_bpe *b = NULL;
    cr_assert_eq(cdp_bpe_load(fixture("gpt2/vocab.json"), fixture("gpt2/merges.txt"), &b), CDP_OK, "%s",
                 cdp_last_error());
    return b;
}

static struct cdp_bpe *llama3_fixture(void)
{
    struct cdp_bpe *b = NULL;
    cr_assert_eq(cdp_bpe_load_json(fixture("llama3/tokenizer.json"), &b), CDP_OK, "%s", cdp_last_error());
    return b;
}

/* Every case of expected.json, encoded by b, gives the package's ids; decoding
 * them gives the text back. */
static void check_cases(const struct cdp_bpe *b, const char *key)
{
    json_error_t err;
    json_t *root = json_load_file(fixture("expected.json"), 0, &err);
    cr_assert_not_null(root, "expected.json: %s", err.text);
    size_t i;
    json_t *c;
    int64_t total = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *text = json_object_get(c, "text"), *want = json_object_get(c, key);
        int32_t *ids = NULL;
        int64_t n = -1;
        cr_assert_eq(cdp_bpe_encode(b, json_string_value(text), json_string_length(text), &ids, &n), CDP_OK,
                     "%s: %s", name, cdp_last_error());
        cr_assert_eq((size_t)n, json_array_size(want), "%s, %s: %lld ids, the tokenizers package gives %zu", key,
                     name, (long long)n, json_array_size(want));
        for (int64_t k = 0; k < n; k++)
            cr_assert_eq(ids[k], json_integer_value(json_array_get(want, (size_t)k)),
                         "%s, %s: id %lld is %d, the tokenizers package gives %lld", key, name, (long long)k, ids[k],
                         (long long)json_integer_value(json_array_get(want, (size_t)k)));
        size_t cap = json_string_length(text) + 1, len = 0;
        char *back = malloc(cap);
        for (int64_t k = 0; k < n; k++) {
            size_t l = 0;
            const char *s = cdp_bpe_decode(b, ids[k], &l);
            cr_assert_not_null(s);
            cr_assert_leq(len + l, cap - 1);
            memcpy(back + len, s, l);
            len += l;
        }
        cr_assert_eq(len, json_string_length(text), "%s: decoded length", name);
        cr_assert(!memcmp(back, json_string_value(text), len), "%s: decode gives the text back", name);
        free(back);
        free(ids);
        total += n;
    }
    cr_assert_gt(total, 500, "the fixture holds many ids");
    json_decref(root);
}

Test(tokenize, gpt2_form_matches_the_tokenizers_package)
{
    struct cdp_bpe *b = gpt2_fixture();
    check_cases(b, "gpt2");
    cr_assert_eq(cdp_bpe_token_id(b, "<|endoftext|>"), 0);
    cr_assert_eq(cdp_bpe_token_id(b, "<|end_of_text|>"), -1);
    cdp_bpe_free(b);
}

Test(tokenize, llama3_tokenizer_json_matches_the_tokenizers_package)
{
    struct cdp_bpe *b = llama3_fixture();
    check_cases(b, "llama3");
    cr_assert_eq(cdp_bpe_vocab_size(b), 602);
    cr_assert_eq(cdp_bpe_token_id(b, "<|end_of_text|>"), 601);
    cr_assert_eq(cdp_bpe_token_id(b, "<|begin_of_text|>"), 600);
    size_t len = 0;
    const char *s = cdp_bpe_decode(b, 601, &len);
    cr_assert(s && len == 15 && !memcmp(s, "<|end_of_text|>", 15));
    cdp_bpe_free(b);
}

/* The same vocabulary read as vocab.json + merges.txt with Llama 3's pattern
 * cuts text as the tokenizer.json does (digits in threes, a letter run takes
 * the punctuation before it). */
Test(tokenize, llama3_pattern_cuts_digits_in_threes)
{
    struct cdp_bpe *g = gpt2_fixture(), *l = NULL;
    cr_assert_eq(cdp_bpe_load_pattern(fixture("gpt2/vocab.json"), fixture("gpt2/merges.txt"), CDP_BPE_PRETOK_LLAMA3,
                                      &l),
                 CDP_OK, "%s", cdp_last_error());
    cr_assert(strstr(cdp_bpe_pattern(l), "\\p{N}{1,3}"));
    int32_t *a = NULL, *c = NULL;
    int64_t na = 0, nc = 0;
    cr_assert_eq(cdp_bpe_encode(g, "1234567", 7, &a, &na), CDP_OK);
    cr_assert_eq(cdp_bpe_encode(l, "1234567", 7, &c, &nc), CDP_OK);
    cr_assert_geq(nc, 3, "three pieces at least: 123 456 7");
    size_t len;
    const char *last = cdp_bpe_decode(l, c[nc - 1], &len);
    cr_assert(len == 1 && last[0] == '7', "the last piece is \"7\" alone");
    free(a);
    free(c);
    cdp_bpe_free(g);
    cdp_bpe_free(l);
}

/* Bytes that are not UTF-8 are pieces of their own, never an error. */
Test(tokenize, invalid_utf8_is_encoded_byte_by_byte)
{
    struct cdp_bpe *b = llama3_fixture();
    const char text[] = "ab\xff\xfe cd \xc3";
    int32_t *ids = NULL;
    int64_t n = 0;
    cr_assert_eq(cdp_bpe_encode(b, text, sizeof text - 1, &ids, &n), CDP_OK, "%s", cdp_last_error());
    char back[64];
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l;
        const char *s = cdp_bpe_decode(b, ids[i], &l);
        memcpy(back + k, s, l);
        k += l;
    }
    cr_assert(k == sizeof text - 1 && !memcmp(back, text, k));
    free(ids);
    cdp_bpe_free(b);
}

Test(tokenize, bad_tokenizer_json_names_the_key)
{
    const char *dir = cdp_test_tmpdir();
    char *good = cdp_test_read_file(fixture("llama3/tokenizer.json"));
    cr_assert_not_null(good);
    json_error_t err;
    static const struct {
        const char *ptr, *json, *msg;
    } bad[] = {
        {"/normalizer", "{\"type\": \"NFC\"}", "/normalizer: not supported (expected null"},
        {"/model/type", "\"WordPiece\"", "/model/type: expected \"BPE\", got \"WordPiece\""},
        {"/model/byte_fallback", "true", "/model/byte_fallback: not supported"},
        {"/model/dropout", "0.1", "/model/dropout: not supported"},
        {"/model/merges", "[\"a\"]", "/model/merges/0: expected \"a b\" or [\"a\", \"b\"]"},
        {"/model/merges", "[[\"a\", \"zzz\"]]", "/model/merges/0: \"zzz\" is not a token of the vocabulary"},
        {"/pre_tokenizer", "{\"type\": \"Whitespace\"}", "/pre_tokenizer: expected ByteLevel, or a Sequence"},
        {"/pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                           "{\"Regex\": \"(\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
                           "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}",
         "the pre-tokenizer pattern does not compile at offset 1"},
        {"/pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}",
         "/pre_tokenizer/add_prefix_space: true is not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *root = json_loads(good, 0, &err);
        cr_assert_not_null(root);
        json_t *v = json_loads(bad[i].json, JSON_DECODE_ANY, &err);
        cr_assert_not_null(v, "%s", bad[i].json);
        const char *key = strrchr(bad[i].ptr, '/') + 1;
        json_t *parent = strchr(bad[i].ptr + 1, '/') ? json_object_get(root, "model") : root;
        json_object_set_new(parent, key, v);
        char path[4200];
        snprintf(path, sizeof path, "%s/t%zu.json", dir, i);
        cr_assert_eq(json_dump_file(root, path, 0), 0);
        json_decref(root);
        struct cdp_bpe *b = NULL;
        cr_assert_eq(cdp_bpe_load_json(path, &b), CDP_ERR_INVALID, "%s", bad[i].json);
        cr_assert_null(b);
        cr_assert(strstr(cdp_last_error(), bad[i].msg), "got: %s\nwant: %s", cdp_last_error(), bad[i].msg);
        cr_assert(strstr(cdp_last_error(), path), "the message names the file: %s", cdp_last_error());
    }
    free(good);
    struct cdp_bpe *b = NULL;
    cr_assert_eq(cdp_bpe_load_json(cdp_test_write_file(dir, "x.json", "{\"model\": "), &b), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "x.json:1:"), "%s", cdp_last_error());
}

/* ---- cdphybrid tokenize ------------------------------------------------------------ */

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    cr_assert_eq(fread(b, 1, (size_t)l, f), (size_t)l);
    fclose(f);
    *n = (size_t)l;
    return b;
}

/* A corpus: 25 text files (two of them empty) in a folder, and a JSONL file
 * (a blank line and an empty text among its lines). */
static const char *make_corpus(const char *dir)
{
    static char in[4200];
    snprintf(in, sizeof in, "%s/in", dir);
    char sub[4300];
    snprintf(sub, sizeof sub, "%s/in/texts", dir);
    cr_assert_eq(mkdir(in, 0755), 0);
    cr_assert_eq(mkdir(sub, 0755), 0);
    size_t n = 0;
    char *m = read_all(fixture("multilingual.txt"), &n);
    for (int i = 0; i < 25; i++) {
        char name[32], text[2048];
        snprintf(name, sizeof name, "doc%02d.txt", i);
        const size_t k = i == 7 ? 0 : (size_t)(40 * i) % n;
        snprintf(text, sizeof text, "%.*s", (int)k, m);
        cdp_test_write_file(sub, name, text);
    }
    free(m);
    cdp_test_write_file(in, "web.jsonl",
                        "{\"text\": \"first line of the web\", \"id\": 1}\n"
                        "\n"
                        "{\"text\": \"Größe — второй документ, 第三\", \"id\": 2}\n"
                        "{\"text\": \"\", \"id\": 3}\n"
                        "{\"id\": 4, \"text\": \"last one\\nwith a newline\"}\n");
    return in;
}

static struct cdp_run tok(const char *const *argv)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    return r;
}

Test(tokenize, shards_hold_every_document_after_its_end_of_text_in_input_order)
{
    const char *dir = cdp_test_tmpdir();
    const char *in = make_corpus(dir);
    char out1[4200], out3[4200];
    snprintf(out1, sizeof out1, "%s/out1", dir);
    snprintf(out3, sizeof out3, "%s/out3", dir);
    const char *tj = fixture("llama3/tokenizer.json");
    struct cdp_run r = tok((const char *[]){"tokenize", in, "--out", out1, "--tokenizer", tj, "--val-fraction",
                                            "0.2", "--shard-tokens", "300", "--threads", "1", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "tokenized 26 documents"), "%s", r.out); /* 23 texts + 3 lines: the empty ones skipped */
    cr_assert(strstr(r.out, "train: 21 documents"), "%s", r.out);
    cr_assert(strstr(r.out, "val:   5 documents"), "%s", r.out);
    cdp_test_run_free(&r);
    r = tok((const char *[]){"tokenize", in, "--out", out3, "--tokenizer", tj, "--val-fraction", "0.2",
                             "--shard-tokens", "300", "--threads", "3", "-q", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_str_eq(r.out, "");
    cdp_test_run_free(&r);

    /* the documents in input order, each encoded here */
    struct cdp_bpe *b = llama3_fixture();
    const int32_t eot = cdp_bpe_token_id(b, "<|end_of_text|>");
    int32_t *want[2] = {NULL, NULL};
    int64_t nw[2] = {0, 0}, doc = 0;
    for (int i = 0; i < 25 + 3; i++) {
        char *text = NULL;
        size_t len = 0;
        if (i < 25) {
            char p[4300];
            snprintf(p, sizeof p, "%s/texts/doc%02d.txt", in, i);
            text = read_all(p, &len);
        } else {
            static const char *const lines[] = {"first line of the web", "Größe — второй документ, 第三",
                                                "last one\nwith a newline"};
            text = strdup(lines[i - 25]);
            len = strlen(text);
        }
        if (len) {
            int32_t *ids;
            int64_t n;
            cr_assert_eq(cdp_bpe_encode(b, text, len, &ids, &n), CDP_OK);
            const int s = cdp_tokenize_is_val(doc++, 0.2);
            want[s] = realloc(want[s], (size_t)(nw[s] + n + 1) * sizeof *want[s]);
            want[s][nw[s]++] = eot;
            memcpy(want[s] + nw[s], ids, (size_t)n * sizeof *ids);
            nw[s] += n;
            free(ids);
        }
        free(text);
    }
    cr_assert_eq(doc, 26);
    /* read back through the data source: every shard, in order, as one stream */
    for (int s = 0; s < 2; s++) {
        char *paths[64];
        int np = 0;
        for (int k = 0; k < 64; k++) {
            char p[4300];
            snprintf(p, sizeof p, "%s/data_%s_%06d.bin", out1, s ? "val" : "train", k);
            if (access(p, F_OK)) break;
            paths[np++] = strdup(p);
            /* the same bytes with 3 threads */
            char q[4300];
            snprintf(q, sizeof q, "%s/data_%s_%06d.bin", out3, s ? "val" : "train", k);
            cr_assert_eq(cdp_test_files_differ(p, q), -1, "%s and %s differ", p, q);
        }
        cr_assert_eq(np, (int)((nw[s] + 299) / 300), "%s: %d shards of 300 for %lld tokens", s ? "val" : "train",
                     np, (long long)nw[s]);
        struct cdp_model_desc g = {.kind = CDP_MODEL_GPT, .vocab = 602, .context = 1, .layers = 1, .heads = 1,
                                   .embed = 8};
        /* val_paths: the same stream again, so that the training split is every token */
        struct cdp_data_desc dd = {.source = CDP_DATA_TOKENS, .path = paths[0], .paths = paths, .n_paths = np,
                                   .val_paths = paths, .n_val_paths = np, .order = CDP_DATA_ORDER_SEQUENTIAL};
        struct cdp_data *d = NULL;
        cr_assert_eq(cdp_data_open(&dd, &g, &d), CDP_OK, "%s", cdp_last_error());
        cr_assert_eq(cdp_data_split_size(d, CDP_SPLIT_TRAIN), nw[s] - 1);
        int32_t *x = malloc((size_t)nw[s] * sizeof *x), *y = malloc((size_t)nw[s] * sizeof *y);
        cr_assert_eq(cdp_data_fetch(d, CDP_SPLIT_TRAIN, 0, (int)(nw[s] - 1), x, y), CDP_OK, "%s", cdp_last_error());
        for (int64_t k = 0; k + 1 < nw[s]; k++) cr_assert_eq(x[k], want[s][k], "%d: token %lld", s, (long long)k);
        cr_assert_eq(y[nw[s] - 2], want[s][nw[s] - 1]);
        cdp_data_close(d);
        free(x), free(y);
        for (int k = 0; k < np; k++) free(paths[k]);
        free(want[s]);
    }
    cdp_bpe_free(b);

    /* a second run into the same folder is refused, and leaves it alone */
    r = tok((const char *[]){"tokenize", in, "--out", out1, "--tokenizer", tj, NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "shards of prefix \"data\" are there already"), "%s", r.err);
    cdp_test_run_free(&r);
}

Test(tokenize, npy_shards_and_uint16_gpt2_form)
{
    const char *dir = cdp_test_tmpdir();
    const char *in = make_corpus(dir);
    char out[4200];
    snprintf(out, sizeof out, "%s/o", dir);
    struct cdp_run r = tok((const char *[]){"tokenize", in, "--out", out, "--vocab", fixture("gpt2/vocab.json"),
                                            "--merges", fixture("gpt2/merges.txt"), "--format", "npy",
                                            "--val-fraction", "0", "--prefix", "web", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "val:   none"), "%s", r.out);
    cr_assert(strstr(r.out, "\"path\": \""), "%s", r.out);
    cdp_test_run_free(&r);
    char p[4300];
    snprintf(p, sizeof p, "%s/web_train_000000.npy", out);
    size_t n = 0;
    char *b = read_all(p, &n);
    cr_assert(n > 128 && !memcmp(b, "\x93NUMPY\x01\x00", 8) && strstr(b + 10, "'descr': '<u2'"));
    const uint16_t *t = (const uint16_t *)(b + 128);
    cr_assert_eq(t[0], 0, "<|endoftext|> (id 0 in the fixture) first");
    free(b);
    char *paths[1] = {p};
    struct cdp_model_desc g = {.kind = CDP_MODEL_GPT, .vocab = 600, .context = 8, .layers = 1, .heads = 1, .embed = 8};
    struct cdp_data_desc dd = {.source = CDP_DATA_TOKENS, .path = p, .paths = paths, .n_paths = 1};
    struct cdp_data *d = NULL;
    cr_assert_eq(cdp_data_open(&dd, &g, &d), CDP_OK, "%s", cdp_last_error());
    cdp_data_close(d);
}

Test(tokenize, bad_input_names_the_file_and_line_and_leaves_nothing)
{
    const char *dir = cdp_test_tmpdir();
    const char *tj = fixture("llama3/tokenizer.json");
    char out[4200];
    snprintf(out, sizeof out, "%s/o", dir);
    char bad[4200], good[4200]; /* cdp_test_write_file's result is reused by its next call */
    snprintf(bad, sizeof bad, "%s", cdp_test_write_file(dir, "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 3}\n"));
    snprintf(good, sizeof good, "%s", cdp_test_write_file(dir, "good.txt", "some text that is fine"));
    struct cdp_run r = tok((const char *[]){"tokenize", good, bad, "--out", out, "--tokenizer", tj, "--shard-tokens",
                                            "2", NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "bad.jsonl:2: /text: expected a string"), "%s", r.err);
    cdp_test_run_free(&r);
    struct dirent *e;
    DIR *dd = opendir(out);
    int left = 0;
    while (dd && (e = readdir(dd)))
        if (e->d_name[0] != '.') left++;
    if (dd) closedir(dd);
    cr_assert_eq(left, 0, "the shards written before the bad line are removed");

    snprintf(bad, sizeof bad, "%s", cdp_test_write_file(dir, "bad2.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated\n"));
    r = tok((const char *[]){"tokenize", bad, "--out", out, "--tokenizer", tj, NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "bad2.jsonl:2:"), "%s", r.err);
    cdp_test_run_free(&r);

    r = tok((const char *[]){"tokenize", good, "--out", out, "--tokenizer", tj, "--val-fraction", "0.5", NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "the validation split is empty: 1 documents give none at fraction 0.5"), "%s", r.err);
    cdp_test_run_free(&r);

    r = tok((const char *[]){"tokenize", good, "--out", out, "--tokenizer", tj, "--eot", "<|nope|>", NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "--eot: \"<|nope|>\" is not a token of"), "%s", r.err);
    cdp_test_run_free(&r);

    r = tok((const char *[]){"tokenize", good, "--out", out, "--vocab", fixture("gpt2/vocab.json"), NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "--vocab needs --merges"), "%s", r.err);
    cdp_test_run_free(&r);

    r = tok((const char *[]){"tokenize", good, "--out", out, "--tokenizer", tj, "--shard-tokens", "3G", NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "--shard-tokens: expected a count in [1, 2^31 - 1]"), "%s", r.err);
    cdp_test_run_free(&r);

    r = tok((const char *[]){"tokenize", "/nonexistent/x.txt", "--out", out, "--tokenizer", tj, NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "/nonexistent/x.txt: cannot open"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* On a terminal (here the pseudo-terminal of util-linux's script(1)), a progress
 * bar goes to stderr; -q leaves it out. */
Test(tokenize, a_progress_bar_on_a_terminal)
{
    if (access("/usr/bin/script", X_OK)) cr_skip_test("no /usr/bin/script (util-linux) to give the run a terminal");
    const char *dir = cdp_test_tmpdir();
    char good[4200], cmd[16384], outp[4300];
    snprintf(good, sizeof good, "%s", cdp_test_write_file(dir, "t.txt", "some text for a bar"));
    for (int quiet = 0; quiet < 2; quiet++) {
        snprintf(outp, sizeof outp, "%s/typescript%d", dir, quiet);
        snprintf(cmd, sizeof cmd, "/usr/bin/script -qec \"'%s' tokenize '%s' --out '%s/o%d' --tokenizer '%s'%s\" '%s' "
                 "> /dev/null 2>&1 < /dev/null",
                 getenv("CDP_BIN"), good, dir, quiet, fixture("llama3/tokenizer.json"), quiet ? " -q" : "", outp);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        char *t = cdp_test_read_file(outp);
        cr_assert_not_null(t);
        if (quiet)
            cr_assert_null(strstr(t, "tokenize ["), "-q: %s", t);
        else
            cr_assert(strstr(t, "\rtokenize [##############################] 100%"), "%s", t);
        free(t);
    }
}
