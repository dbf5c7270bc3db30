/* Suite tokenize: the byte-level BPE tokenizers against the Hugging Face
 * tokenizers package, token for token, on a multilingual text
 * (tests/fixtures/tokenize, written by tools/tokenizer-fixture.py), their
 * tokenizer.json errors, and `cdphybrid tokenize` (shards, end-of-text
 * tokens, the validation split, the same bytes with any number of threads). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/bpe.h"

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
