/* `cdphybrid tokenize`: text files, folders or JSONL to token shards that
 * data.path / data.val_path read (docs/data.md#tokenize), with GPT-2's or a
 * tokenizer.json's byte-level BPE, over every core this process may use, with
 * a progress bar on a terminal. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cli/commands.h"
#include "model/bpe.h"
#include "model/tokenize.h"

static void tokenize_usage(FILE *f)
{
    fputs("usage: cdphybrid tokenize INPUT... --out DIR --tokenizer tokenizer.json [options]\n"
          "       cdphybrid tokenize INPUT... --out DIR --vocab vocab.json --merges merges.txt [options]\n"
          "\n"
          "Encodes text into token shards for training (data.source \"tokens\"). INPUT is a\n"
          "text file (one document), a .jsonl file (one document per line: an object whose\n"
          "--text-field holds the text), or a folder (every file under it, in name order).\n"
          "Each document is preceded by the end-of-text token, as llm.c's data scripts do.\n"
          "Documents are spread over a training and a validation split (--val-fraction),\n"
          "each written as llm.c .bin shards: uint16 tokens (header 20240520, version 1) for\n"
          "vocabularies of up to 65536 ids, else uint32 (20240801, version 7); or .npy.\n"
          "\n"
          "options:\n"
          "  --out DIR            where the shards go (made when missing; it must not hold\n"
          "                       shards of the same prefix)\n"
          "  --tokenizer FILE     a Hugging Face tokenizer.json of a byte-level BPE (GPT-2,\n"
          "                       Llama 3, ...): its vocabulary, merges and pre-tokenizer regex\n"
          "  --vocab FILE, --merges FILE\n"
          "                       GPT-2's vocab.json and merges.txt\n"
          "  --pattern NAME       with --vocab: the pre-tokenizer regex, gpt2 (default) or llama3\n"
          "  --prefix NAME        shard names NAME_train_000000.bin, NAME_val_000000.bin\n"
          "                       (default: data)\n"
          "  --text-field KEY     the text's key in JSONL lines (default: text)\n"
          "  --eot TEXT           the token written before each document (default:\n"
          "                       <|endoftext|>, else <|end_of_text|>)\n"
          "  --no-eot             no token between documents\n"
          "  --val-fraction F     share of the documents in the validation split, spread\n"
          "                       evenly (document i when floor((i+1)F) > floor(iF)); default\n"
          "                       0.01; 0: no validation shards\n"
          "  --shard-tokens N     tokens per shard (default 100000000, llm.c's; accepts 100M)\n"
          "  --format F           bin (default) or npy\n"
          "  --threads N          encoding threads (default: the CPUs this process may use)\n"
          "  -q, --quiet          errors only: no progress bar, no summary\n"
          "  -h, --help           this text\n"
          "\n"
          "examples:\n"
          "  cdphybrid tokenize corpus/ --out shards --vocab vocab.json --merges merges.txt\n"
          "  cdphybrid tokenize web.jsonl --out shards --tokenizer llama3/tokenizer.json\n"
          "then in the plan: \"data\": {\"source\": \"tokens\", \"path\": \"shards/data_train_*.bin\",\n"
          "                           \"val_path\": \"shards/data_val_*.bin\"}\n"
          "\n"
          "exit codes: 0 success, 1 a shard could not be written, 2 bad usage or bad input\n"
          "(nothing is left behind on failure)\n",
          f);
}

struct bar {
    int on;
    double t0, last;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 20500 -> "20.5 k", 112 -> "112" */
static void human(double v, char *out, size_t cap)
{
    if (v >= 1e9) snprintf(out, cap, "%.2f G", v / 1e9);
    else if (v >= 1e6) snprintf(out, cap, "%.2f M", v / 1e6);
    else if (v >= 1e3) snprintf(out, cap, "%.1f k", v / 1e3);
    else snprintf(out, cap, "%.0f", v);
}

static void progress(void *ctx, int64_t done, int64_t total, int64_t tokens)
{
    struct bar *b = ctx;
    const double t = now_s();
    if (!b->on || (t - b->last < 0.1 && done < total)) return;
    b->last = t;
    const double frac = total > 0 ? (double)done / (double)total : 1.0;
    char bar[31], tok[32], rate[32];
    const int full = (int)(frac * 30 + 0.5);
    for (int i = 0; i < 30; i++) bar[i] = i < full ? '#' : '.';
    bar[30] = '\0';
    human((double)tokens, tok, sizeof tok);
    human((double)done / (t - b->t0 > 1e-9 ? t - b->t0 : 1e-9), rate, sizeof rate);
    fprintf(stderr, "\rtokenize [%s] %3.0f%%  %s tokens  %sB/s ", bar, 100 * frac, tok, rate);
    fflush(stderr);
}

static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* "100000000", "100M", "2G", "512k" */
static int parse_count(const char *s, int64_t *out)
{
    char *end;
    const double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1e3, end++;
    else if (*end == 'M') mul = 1e6, end++;
    else if (*end == 'G') mul = 1e9, end++;
    if (end == s || *end || !(v > 0) || v * mul > 9e18 || v * mul != floor(v * mul)) return -1;
    *out = (int64_t)(v * mul);
    return 0;
}

int cdp_cli_tokenize(int argc, char **argv)
{
    const char *out = NULL, *tokenizer = NULL, *vocab = NULL, *merges = NULL, *pattern = NULL, *prefix = "data";
    const char *field = "text", *eot = NULL, *val = NULL, *shard = NULL, *format = "bin", *threads = NULL;
    int no_eot = 0, quiet = 0;
    const char **inputs = calloc((size_t)argc, sizeof *inputs);
    int n_inputs = 0;
    if (!inputs) return EXIT_RUN_FAILED;
    int code = -1;
    for (int i = 1; i < argc && code < 0; i++) {
        const char *s = argv[i];
        static const struct {
            const char *name;
            size_t off;
        } opts[] = {{"--out", 0}, {"--tokenizer", 1}, {"--vocab", 2}, {"--merges", 3}, {"--pattern", 4},
                    {"--prefix", 5}, {"--text-field", 6}, {"--eot", 7}, {"--val-fraction", 8},
                    {"--shard-tokens", 9}, {"--format", 10}, {"--threads", 11}};
        const char **slots[] = {&out, &tokenizer, &vocab, &merges, &pattern, &prefix,
                                &field, &eot, &val, &shard, &format, &threads};
        int matched = 0;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0] && !matched; k++) {
            const size_t l = strlen(opts[k].name);
            if (!strcmp(s, opts[k].name)) {
                if (i + 1 >= argc) code = cdp_cli_usage_error("tokenize", "%s needs a value", s);
                else *slots[opts[k].off] = argv[++i];
                matched = 1;
            } else if (!strncmp(s, opts[k].name, l) && s[l] == '=') {
                *slots[opts[k].off] = s + l + 1;
                matched = 1;
            }
        }
        if (matched) continue;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            tokenize_usage(stdout);
            code = 0;
        } else if (!strcmp(s, "--no-eot")) {
            no_eot = 1;
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            quiet = 1;
        } else if (s[0] == '-' && s[1]) {
            static const char *const known[] = {"--out", "--tokenizer", "--vocab", "--merges", "--pattern",
                                                "--prefix", "--text-field", "--eot", "--no-eot", "--val-fraction",
                                                "--shard-tokens", "--format", "--threads", "--quiet", "--help",
                                                NULL};
            code = cdp_cli_unknown_option("tokenize", s, known);
        } else {
            inputs[n_inputs++] = s;
        }
    }
    struct cdp_tokenize_opts o = {.inputs = inputs, .n_inputs = n_inputs, .out_dir = out, .prefix = prefix,
                                  .text_field = field, .val_fraction = 0.01, .shard_tokens = 100000000,
                                  .threads = usable_cpus()};
    if (code < 0) {
        if (!n_inputs) code = cdp_cli_usage_error("tokenize", "%s", "give the text to encode: files, folders or .jsonl");
        else if (!out || !*out) code = cdp_cli_usage_error("tokenize", "%s", "give --out DIR");
        else if (!tokenizer == !vocab) code = cdp_cli_usage_error("tokenize", "%s", "give --tokenizer FILE, or --vocab and --merges");
        else if (vocab && !merges) code = cdp_cli_usage_error("tokenize", "%s", "--vocab needs --merges");
        else if (merges && !vocab) code = cdp_cli_usage_error("tokenize", "%s", "--merges needs --vocab");
        else if (pattern && !vocab) code = cdp_cli_usage_error("tokenize", "%s", "--pattern goes with --vocab (a tokenizer.json names its own)");
        else if (pattern && strcmp(pattern, "gpt2") && strcmp(pattern, "llama3"))
            code = cdp_cli_usage_error("tokenize", "--pattern: expected gpt2 or llama3, got \"%s\"", pattern);
        else if (eot && no_eot) code = cdp_cli_usage_error("tokenize", "%s", "--eot and --no-eot cannot be used together");
        else if (!*prefix || strchr(prefix, '/')) code = cdp_cli_usage_error("tokenize", "--prefix: expected a name without '/', got \"%s\"", prefix);
        else if (!*field) code = cdp_cli_usage_error("tokenize", "%s", "--text-field: expected a key");
        else if (strcmp(format, "bin") && strcmp(format, "npy"))
            code = cdp_cli_usage_error("tokenize", "--format: expected bin or npy, got \"%s\"", format);
    }
    if (code < 0 && val) {
        char *end;
        o.val_fraction = strtod(val, &end);
        o.val_required = 1;
        if (end == val || *end || !(o.val_fraction >= 0 && o.val_fraction < 1))
            code = cdp_cli_usage_error("tokenize", "--val-fraction: expected a number in [0, 1), got \"%s\"", val);
    }
    if (code < 0 && shard && (parse_count(shard, &o.shard_tokens) || o.shard_tokens > 2147483647))
        code = cdp_cli_usage_error("tokenize", "--shard-tokens: expected a count in [1, 2^31 - 1] (100M, 5000000), "
                                   "got \"%s\"", shard);
    if (code < 0 && threads) {
        char *end;
        const long t = strtol(threads, &end, 10);
        if (end == threads || *end || t < 1 || t > 4096)
            code = cdp_cli_usage_error("tokenize", "--threads: expected a count in [1, 4096], got \"%s\"", threads);
        else o.threads = (int)t;
    }
    if (code >= 0) {
        free(inputs);
        return code;
    }
    o.format = !strcmp(format, "npy") ? CDP_SHARD_NPY : CDP_SHARD_BIN;

    struct cdp_bpe *bpe = NULL;
    cdp_status st = tokenizer ? cdp_bpe_load_json(tokenizer, &bpe)
                              : cdp_bpe_load_pattern(vocab, merges,
                                                     pattern && !strcmp(pattern, "llama3") ? CDP_BPE_PRETOK_LLAMA3
                                                                                           : CDP_BPE_PRETOK_GPT2,
                                                     &bpe);
    if (st) {
        fprintf(stderr, "cdphybrid tokenize: %s\n", cdp_last_error());
        free(inputs);
        return cdp_cli_exit_code(st);
    }
    o.bpe = bpe;
    o.eot = -1;
    if (!no_eot) {
        const char *name = eot ? eot : cdp_bpe_token_id(bpe, "<|endoftext|>") >= 0 ? "<|endoftext|>" : "<|end_of_text|>";
        o.eot = cdp_bpe_token_id(bpe, name);
        if (o.eot < 0) {
            if (eot)
                fprintf(stderr, "cdphybrid tokenize: --eot: \"%s\" is not a token of %s\n", eot,
                        tokenizer ? tokenizer : vocab);
            else
                fprintf(stderr, "cdphybrid tokenize: %s has neither <|endoftext|> nor <|end_of_text|>: give --eot "
                        "TEXT (a token of the vocabulary) or --no-eot\n", tokenizer ? tokenizer : vocab);
            cdp_bpe_free(bpe);
            free(inputs);
            return EXIT_USAGE;
        }
    }
    struct bar b = {.on = !quiet && isatty(2), .t0 = now_s()};
    o.progress = progress;
    o.ctx = &b;
    struct cdp_tokenize_stats s;
    st = cdp_tokenize_run(&o, &s);
    if (b.on) fputc('\n', stderr);
    if (st) {
        fprintf(stderr, "cdphybrid tokenize: %s\n", cdp_last_error());
    } else if (!quiet) {
        const double dt = now_s() - b.t0;
        char tt[32], tv[32], by[32], rate[32];
        human((double)s.tokens[0], tt, sizeof tt);
        human((double)s.tokens[1], tv, sizeof tv);
        human((double)s.bytes, by, sizeof by);
        human((double)s.bytes / (dt > 1e-9 ? dt : 1e-9), rate, sizeof rate);
        const char *ext = o.format == CDP_SHARD_NPY ? "npy" : "bin";
        const int64_t docs = s.docs[0] + s.docs[1];
        printf("tokenized %lld document%s (%sB) in %.1f s (%sB/s, %d thread%s)\n", (long long)docs,
               docs == 1 ? "" : "s", by, dt, rate, o.threads, o.threads > 1 ? "s" : "");
        printf("  train: %lld document%s, %s tokens in %d shard%s %s/%s_train_*.%s\n", (long long)s.docs[0],
               s.docs[0] == 1 ? "" : "s", tt, s.shards[0], s.shards[0] == 1 ? "" : "s", out, prefix, ext);
        if (s.shards[1])
            printf("  val:   %lld document%s, %s tokens in %d shard%s %s/%s_val_*.%s\n", (long long)s.docs[1],
                   s.docs[1] == 1 ? "" : "s", tv, s.shards[1], s.shards[1] == 1 ? "" : "s", out, prefix, ext);
        else
            printf("  val:   none (training takes the last 10%% of the training tokens unless data.val_path is set)\n");
        printf("  tokens: uint%d, vocabulary of %lld ids; end-of-text %s\n", 8 * s.token_bytes,
               (long long)cdp_bpe_vocab_size(bpe), o.eot >= 0 ? "before every document" : "none");
        printf("  plan: \"data\": {\"source\": \"tokens\", \"path\": \"%s/%s_train_*.%s\"", out, prefix, ext);
        if (s.shards[1]) printf(", \"val_path\": \"%s/%s_val_*.%s\"", out, prefix, ext);
        printf("}\n");
    }
    cdp_bpe_free(bpe);
    free(inputs);
    if (st) return cdp_cli_exit_code(st);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid tokenize: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return 0;
}
