/* `cdphybrid generate` and `cdphybrid eval`: a trained model (a weights file
 * or a checkpoint, written under any layout) loaded whole into one process on
 * the CPU, or under mpirun one stage's units a rank, then text continued from
 * a prompt, or the validation loss computed as training computes it
 * (docs/generate.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/log.h"
#include "cdp/plan.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "kernels/cpu/ops.h" /* cdp_cpu_set_threads */
#include "model/bpe.h"
#include "model/checkpoint.h"
#include "model/data.h"
#include "model/infer.h"
#include "model/model.h"

static void generate_usage(FILE *f)
{
    fputs("usage: cdphybrid generate --plan FILE [--weights FILE | --checkpoint DIR] --prompt TEXT\n"
          "                          [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
          "                          [--stop-token ID|none] [--vocab vocab.json --merges merges.txt] [-v|-q]\n"
          "       cdphybrid generate --plan FILE --prompt-ids 1,2,3 ...   (token ids in and out)\n"
          "       cdphybrid generate --checkpoint DIR --prompt TEXT ...   (the checkpoint's own plan)\n"
          "\n"
          "Continues TEXT with N tokens of a trained GPT-2 or Llama and prints the prompt and\n"
          "what follows on standard output, token by token. The model is loaded whole into\n"
          "this one process on the CPU, whatever layout trained it (stages and replicas: a\n"
          "checkpoint of any layout loads whole); generation keeps a KV cache, so each new\n"
          "token is one forward of one position.\n"
          "Under mpirun -np P (P > 1) it runs on a pipeline of P stages on the CPU: rank s\n"
          "holds only stage s's units (the plan's /parallel/partition when it has P ranges,\n"
          "else an even split), the activations go stage to stage, the last stage picks\n"
          "each token and rank 0 prints: the same text as one rank for the same seed.\n"
          "\n"
          "Tokens: without --vocab, the prompt's bytes are the tokens and the output is\n"
          "bytes (byte-level models, such as the text data source trains: vocab 256; a\n"
          "larger vocab chooses among ids 0..255 only). With --vocab and --merges, GPT-2's\n"
          "byte-level BPE from those files (exact for ASCII; docs/generate.md says what\n"
          "differs outside it); ids beyond the tokenizer's are never chosen.\n"
          "\n"
          "Context: the model sees at most /model/context tokens; when the prompt and what\n"
          "was generated are longer, the last context tokens are kept (a sliding window).\n"
          "\n"
          "options:\n"
          "  --plan FILE        the plan of the model (its /model); optional with --checkpoint\n"
          "                     (then the plan saved in the checkpoint's manifest)\n"
          "  --weights FILE     a safetensors file (/output/weights, export, Hugging Face, an index)\n"
          "  --checkpoint DIR   a checkpoint folder (its newest complete checkpoint) or one step\n"
          "                     folder; without either, the plan's /model/weights\n"
          "  --prompt TEXT      the text to continue (at least one token)\n"
          "  --prompt-ids IDS   the prompt as token ids (commas or spaces); ids are printed\n"
          "  --tokens N         tokens to generate (default 64; 0 prints the prompt)\n"
          "  --temperature T    softmax(logits / T) (default 1.0); 0: always the most likely\n"
          "                     token (greedy)\n"
          "  --top-k K          sample among the K most likely tokens (default 0: all)\n"
          "  --top-p P          then among the fewest most likely whose probabilities add up\n"
          "                     to P (default 1: all; nucleus sampling)\n"
          "  --stop-token ID    stop at this end-of-text token, not printed (default: the\n"
          "                     tokenizer's <|endoftext|>; none: never stop early)\n"
          "  --seed S           the sampling stream (default 1): the same seed, model and\n"
          "                     options give the same text\n"
          "  --vocab FILE       GPT-2's vocab.json (with --merges)\n"
          "  --merges FILE      GPT-2's merges.txt (with --vocab)\n"
          "  -v, --verbose      say which weights are used and the tokens/s (twice: debug)\n"
          "  -q, --quiet        errors only\n"
          "  -h, --help         this text\n"
          "\n"
          "examples:\n"
          "  cdphybrid generate --plan examples/quickstart.json --weights examples/runs/quickstart.safetensors \\\n"
          "      --prompt \"Permission is \" --tokens 100 --temperature 0.8 --top-k 20\n"
          "  cdphybrid generate --checkpoint runs/gpt/ckpt --prompt \"The \" --temperature 0\n"
          "  mpirun -np 2 cdphybrid generate --checkpoint runs/gpt/ckpt --prompt \"The \" --seed 5\n"
          "  cdphybrid generate --plan gpt2.json --weights model.safetensors --vocab vocab.json \\\n"
          "      --merges merges.txt --prompt \"Hello, I'm a language model,\"\n"
          "\n"
          "exit codes: 0 success, 1 the run failed, 2 bad usage, a bad plan, weights,\n"
          "checkpoint or tokenizer file\n",
          f);
}

static void eval_usage(FILE *f)
{
    fputs("usage: cdphybrid eval --plan FILE [--weights FILE | --checkpoint DIR] [--batches N] [-v|-q]\n"
          "       cdphybrid eval --checkpoint DIR [--batches N]   (the checkpoint's own plan)\n"
          "\n"
          "The validation loss of a trained model on the plan's data, computed as training's\n"
          "validation computes it (the same micro-batches of /train/micro_batch samples of\n"
          "the validation split, the same sum), so a checkpoint's value equals the val_loss\n"
          "metrics.jsonl recorded at its step. Prints, with 17 significant digits:\n"
          "  val_loss L\n"
          "  perplexity exp(L)\n"
          "  tokens N          (samples N for models that do not read tokens)\n"
          "The model is loaded whole into this one process on the CPU, whatever layout\n"
          "trained it. Under mpirun -np P (P > 1), a pipeline of P stages on the CPU,\n"
          "rank s holding only stage s's units (the plan's /parallel/partition when it has\n"
          "P ranges, else an even split); the last stage sums the loss and rank 0 prints\n"
          "the same value as one rank.\n"
          "\n"
          "options:\n"
          "  --plan FILE        the plan (its /model, /data and /train/micro_batch); optional\n"
          "                     with --checkpoint (then the plan in the checkpoint's manifest)\n"
          "  --weights FILE     a safetensors file\n"
          "  --checkpoint DIR   a checkpoint folder (its newest complete one) or a step folder;\n"
          "                     without either, the plan's /model/weights\n"
          "  --batches N        micro-batches to evaluate (default /train/eval_batches)\n"
          "  -v, --verbose      say which weights are used (twice: debug)\n"
          "  -q, --quiet        only the three lines\n"
          "  -h, --help         this text\n"
          "\n"
          "examples:\n"
          "  cdphybrid eval --checkpoint runs/gpt/ckpt\n"
          "  mpirun -np 2 cdphybrid eval --checkpoint runs/gpt/ckpt\n"
          "  cdphybrid eval --plan examples/quickstart.json --weights examples/runs/quickstart.safetensors --batches 64\n"
          "\n"
          "exit codes: 0 success, 1 the run failed, 2 bad usage, a bad plan, weights or\n"
          "checkpoint\n",
          f);
}

/* What both commands take. */
struct infer_args {
    const char *cmd;
    const char *plan, *weights, *ckpt;
    int verbose, quiet;
};

/* Where this process runs: one rank (world NULL, the whole model), or stage
 * `rank` of a pipeline of `size` stages started by mpirun, holding units
 * [first, end) (docs/generate.md, "On a pipeline"). */
struct ranks {
    cdp_comm_t world;
    int rank, size;
    int first, end;
    double timeout; /* every wait's deadline: /train/timeout_s */
};

/* The world when started by mpirun with several ranks; else one rank. */
static cdp_status ranks_open(struct ranks *r)
{
    memset(r, 0, sizeof *r);
    r->size = 1;
    r->timeout = 300; /* until the plan gives /train/timeout_s */
    if (!cdp_comm_launched_by_mpi()) return CDP_OK;
    cdp_status st = cdp_comm_world(&r->world);
    if (st) return st;
    r->rank = cdp_comm_rank(r->world);
    r->size = cdp_comm_size(r->world);
    if (r->size == 1) {
        cdp_comm_free(r->world);
        r->world = NULL;
    }
    return CDP_OK;
}

static void ranks_close(struct ranks *r)
{
    cdp_comm_free(r->world);
    r->world = NULL;
}

/* Every rank's code (-1: fine) agreed on: the largest, so that all go on or
 * all stop together. A rank that cannot agree ends the job. */
static int ranks_agree(const struct ranks *r, int code)
{
    if (!r->world) return code;
    double c = code;
    if (cdp_comm_allreduce_f64(r->world, &c, 1, CDP_REDUCE_MAX, r->timeout)) {
        fprintf(stderr, "cdphybrid: rank %d: %s\n", r->rank, cdp_last_error());
        cdp_comm_abort(r->world, EXIT_RUN_FAILED);
    }
    return (int)c;
}

/* A failure in the middle of the pipeline: the other ranks may be waiting on
 * this one, so the message, then the whole job ends with its code. */
static void ranks_fail(const struct ranks *r, const char *cmd, cdp_status st)
{
    fprintf(stderr, "cdphybrid %s: rank %d of %d: %s\n", cmd, r->rank, r->size, cdp_last_error());
    fflush(stdout);
    cdp_comm_abort(r->world, cdp_cli_exit_code(st));
}

/* Stage s of p over n units: the plan's /parallel/partition when it has p
 * ranges (contiguous from 0, as the plan checks) ending at n, else n / p units
 * each, the first n % p stages one more. */
static void stage_range(const struct cdp_plan *p, int64_t n, int stages, int s, int *first, int *end)
{
    if (p->parallel.partition && p->parallel.n_partition == stages && p->parallel.partition[stages - 1][1] == n) {
        *first = (int)p->parallel.partition[s][0];
        *end = (int)p->parallel.partition[s][1];
        return;
    }
    const int64_t q = n / stages, extra = n % stages;
    *first = (int)(s * q + (s < extra ? s : extra));
    *end = (int)(*first + q + (s < extra));
}

/* Bytes of one micro-batch of B samples that stage r sends on (its last unit's
 * output) and receives (its first unit's input). */
static uint64_t stage_output_bytes(struct cdp_model *m, int B, enum cdp_loss loss)
{
    struct cdp_unit_bytes ub;
    cdp_unit_bytes(cdp_model_unit(m, cdp_model_unit_count(m) - 1), B, loss, &ub);
    return ub.output_bytes;
}

static uint64_t stage_input_bytes(struct cdp_model *m, int B, enum cdp_loss loss)
{
    struct cdp_unit_bytes ub;
    cdp_unit_bytes(cdp_model_unit(m, 0), B, loss, &ub);
    return ub.input_bytes;
}

static cdp_status send_wait(const struct ranks *r, const void *buf, uint64_t bytes, int peer)
{
    cdp_request_t q = NULL;
    cdp_status st = cdp_comm_isend(r->world, buf, bytes, peer, 0, &q);
    return st ? st : cdp_comm_wait(q, r->timeout);
}

static cdp_status recv_wait(const struct ranks *r, void *buf, uint64_t bytes, int peer)
{
    cdp_request_t q = NULL;
    cdp_status st = cdp_comm_irecv(r->world, buf, bytes, peer, 0, &q);
    return st ? st : cdp_comm_wait(q, r->timeout);
}

/* One micro-batch through a stage of the pipeline: stage 0's input is at the
 * model's input already; a later stage receives it from the one before; all
 * but the last send their output on (host buffer buf, at least the larger of
 * the input and output bytes). */
static cdp_status stage_forward(const struct ranks *r, struct cdp_model *m, cdp_device_t dev, int B,
                                enum cdp_loss loss, void *buf)
{
    cdp_status st = CDP_OK;
    if (r->rank > 0) {
        const uint64_t in = stage_input_bytes(m, B, loss);
        if ((st = recv_wait(r, buf, in, r->rank - 1)) ||
            (st = cdp_device_write(dev, cdp_model_input(m, 0), buf, in))) {
            cdp_error_context(st, "stage %d: the activation from stage %d", r->rank, r->rank - 1);
            return st;
        }
    }
    if ((st = cdp_model_forward(m, 0))) return st;
    if (r->rank < r->size - 1) {
        const uint64_t out = stage_output_bytes(m, B, loss);
        if ((st = cdp_device_read(dev, buf, cdp_model_output(m, 0), out)) ||
            (st = send_wait(r, buf, out, r->rank + 1)))
            cdp_error_context(st, "stage %d: the activation to stage %d", r->rank, r->rank + 1);
    }
    return st;
}

/* The host buffer stage_forward needs. */
static void *stage_buffer(struct cdp_model *m, int B, enum cdp_loss loss)
{
    const uint64_t in = stage_input_bytes(m, B, loss), out = stage_output_bytes(m, B, loss);
    return malloc(in > out ? in : out);
}

/* The plan (--plan, or the checkpoint's), the whole model on the CPU with its
 * weights. */
struct loaded {
    struct cdp_plan *plan;
    cdp_device_t dev;
    struct cdp_model *model;
    char *ckpt_path; /* the checkpoint folder used, or NULL */
    int64_t step;    /* its step */
    const char *weights; /* the weights file used, or NULL */
};

static void loaded_free(struct loaded *l)
{
    cdp_model_destroy(l->model);
    cdp_device_close(l->dev);
    cdp_plan_free(l->plan);
    free(l->ckpt_path);
}

static int fail(const char *cmd, cdp_status st)
{
    fprintf(stderr, "cdphybrid %s: %s\n", cmd, cdp_last_error());
    return cdp_cli_exit_code(st);
}

/* Fills l (B samples a micro-batch, 0: /train/micro_batch); -1, or an exit
 * code with the message printed. l is loaded_free'd either way. */
static int load_model(const struct infer_args *a, int B, struct ranks *r, struct loaded *l)
{
    memset(l, 0, sizeof *l);
    if (a->weights && a->ckpt) return cdp_cli_usage_error(a->cmd, "%s", "give --weights or --checkpoint, not both");
    if (!a->plan && !a->ckpt)
        return cdp_cli_usage_error(a->cmd, "%s", "give --plan FILE (with --weights FILE), or --checkpoint DIR");
    struct cdp_ckpt_info info = {0};
    cdp_status st;
    if (a->ckpt) {
        if ((st = cdp_ckpt_find_latest(a->ckpt, &l->ckpt_path, &info))) {
            fail(a->cmd, st);
            return st == CDP_ERR_NOMEM ? EXIT_RUN_FAILED : EXIT_USAGE;
        }
        l->step = info.step;
    }
    if (a->plan) {
        st = cdp_plan_load(a->plan, &l->plan);
    } else if (!info.plan_json) {
        st = cdp_fail(CDP_ERR_INVALID, "%s/manifest.json: holds no plan: give --plan FILE", l->ckpt_path);
    } else {
        char name[4200];
        snprintf(name, sizeof name, "%s/manifest.json (its plan)", l->ckpt_path);
        st = cdp_plan_load_string(info.plan_json, name, NULL, &l->plan);
    }
    if (st) {
        cdp_ckpt_info_free(&info);
        return fail(a->cmd, st);
    }
    const struct cdp_plan *p = l->plan;
    l->weights = a->weights ? a->weights : !a->ckpt ? p->model.weights : NULL;
    if (!l->ckpt_path && !l->weights) {
        cdp_ckpt_info_free(&info);
        return cdp_cli_usage_error(a->cmd, "%s has no /model/weights: give --weights FILE or --checkpoint DIR "
                                   "(a model without trained weights is noise)", p->source);
    }
    const int64_t units = cdp_plan_model_units(p);
    r->first = 0;
    r->end = (int)units;
    r->timeout = (double)p->train.timeout_s;
    if (r->world) {
        if (r->size > units) {
            cdp_ckpt_info_free(&info);
            char msg[256];
            snprintf(msg, sizeof msg, "%%s: the model has %lld units and %d ranks were started: start at most "
                     "%lld (one stage a rank)", (long long)units, r->size, (long long)units);
            return cdp_cli_usage_error(a->cmd, msg, p->source);
        }
        stage_range(p, units, r->size, r->rank, &r->first, &r->end);
    }
    int code = -1;
    if ((st = cdp_device_open(CDP_BACKEND_CPU, 0, 0, &l->dev)) ||
        (st = cdp_model_create(&p->model, r->first, r->end, B ? B : (int)p->train.micro_batch, 1, p->train.seed,
                               l->dev, &l->model))) {
        code = fail(a->cmd, st);
    } else {
        if (l->ckpt_path) st = cdp_ckpt_load(l->ckpt_path, &info, &l->model, NULL, 1);
        else if (!(st = cdp_model_check_weights(&p->model, l->weights))) st = cdp_model_load(l->model, l->weights);
        /* a weights file or checkpoint that cannot be read or does not fit the model is the user's to fix */
        if (st) {
            fail(a->cmd, st);
            code = st == CDP_ERR_NOMEM ? EXIT_RUN_FAILED : EXIT_USAGE;
        }
    }
    cdp_ckpt_info_free(&info);
    if (code >= 0) return code;
    if (l->ckpt_path) CDP_INFO(CKPT, "%s: step %lld of %s", a->cmd, (long long)l->step, l->ckpt_path);
    else CDP_INFO(CKPT, "%s: weights %s", a->cmd, l->weights);
    if (r->world)
        CDP_INFO(CKPT, "%s: stage %d of %d stages: units [%d, %d) of %lld", a->cmd, r->rank, r->size, r->first,
                 r->end, (long long)units);
    else if (p->parallel.stages > 1)
        CDP_INFO(CKPT, "%s: the plan has %lld stages; this one process holds all %lld units (under mpirun -np %lld "
                 "each rank holds one stage's)", a->cmd, (long long)p->parallel.stages, (long long)units,
                 (long long)p->parallel.stages);
    return -1;
}

/* The options both commands share: 1 when s is one of them (*value: where
 * its value goes, or NULL for a flag), else 0. */
static int common_option(struct infer_args *a, const char *s, const char ***value)
{
    *value = NULL;
    if (!strcmp(s, "--plan")) *value = &a->plan;
    else if (!strcmp(s, "--weights")) *value = &a->weights;
    else if (!strcmp(s, "--checkpoint")) *value = &a->ckpt;
    else if (!strcmp(s, "-v") || !strcmp(s, "--verbose")) a->verbose++;
    else if (!strcmp(s, "-vv")) a->verbose += 2;
    else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) a->quiet = 1;
    else return 0;
    return 1;
}

static int take_value(const char *cmd, int argc, char **argv, int *i, const char **to)
{
    if (*i + 1 >= argc) return cdp_cli_usage_error(cmd, "%s needs a value", argv[*i]);
    *to = argv[++*i];
    return -1;
}

static int parse_count(const char *cmd, const char *opt, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s: expected a whole number in [%lld, %lld], got \"%%s\"", opt, (long long)lo,
                 (long long)hi);
        return cdp_cli_usage_error(cmd, msg, v);
    }
    *out = x;
    return -1;
}

static void set_log(const struct infer_args *a)
{
    if (!getenv("CDP_LOG") || !*getenv("CDP_LOG")) {
        if (a->quiet) cdp_log_set_level(CDP_LOG_ERROR);
        else if (a->verbose) cdp_log_set_level(a->verbose > 1 ? CDP_LOG_DEBUG : CDP_LOG_INFO);
    }
}

static int finish_stdout(const char *cmd)
{
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid %s: cannot write to standard output\n", cmd);
        return EXIT_RUN_FAILED;
    }
    return 0;
}

/* generate after its arguments are read, on one rank or a stage of the pipeline. */
/* The end-of-text token of a tokenizer: the id whose text is
 * "<|endoftext|>" (GPT-2's 50256), or -1. */
static int32_t bpe_end_of_text(const struct cdp_bpe *b)
{
    static const char eot[] = "<|endoftext|>";
    for (int64_t id = cdp_bpe_vocab_size(b) - 1; id >= 0; id--) {
        size_t len = 0;
        const char *t = cdp_bpe_decode(b, (int32_t)id, &len);
        if (t && len == sizeof eot - 1 && !memcmp(t, eot, len)) return (int32_t)id;
    }
    return -1;
}

/* generate's options past the common ones. */
struct gen_opts {
    const char *prompt;
    int ids; /* --prompt-ids: prompt holds token ids, and ids are printed */
    int64_t n_new, top_k;
    double temperature, top_p;
    const char *topk_s, *stop_s, *vocab, *merges;
    uint64_t seed;
};

static int generate_on(const struct infer_args *ap, struct ranks *rk, const struct gen_opts *o)
{
    const struct infer_args a = *ap;
    const char *prompt = o->prompt, *topk_s = o->topk_s, *vocab = o->vocab, *merges = o->merges;
    const int64_t n_new = o->n_new, top_k = o->top_k;
    const double temperature = o->temperature, top_p = o->top_p;
    const uint64_t seed = o->seed;
    const int printer = rk->rank == 0, last = rk->rank == rk->size - 1;
    cdp_cpu_set_threads(CDP_CPU_EXACT_THREADS); /* the same logits on one rank and on a pipeline */
    int code;
    struct cdp_bpe *bpe = NULL;
    cdp_status st;
    if (vocab && (st = cdp_bpe_load(vocab, merges, &bpe))) return fail(a.cmd, st);
    struct loaded l;
    if ((code = ranks_agree(rk, load_model(&a, 1, rk, &l))) >= 0) {
        cdp_bpe_free(bpe);
        loaded_free(&l);
        return code;
    }
    const struct cdp_plan *p = l.plan;
    const int64_t V = p->model.vocab, T = p->model.context;
    int64_t choose = 256; /* ids that can be decoded */
    code = -1;
    if (p->model.kind != CDP_MODEL_GPT) {
        code = cdp_cli_usage_error(a.cmd, "%s: /model is not a GPT preset: generate continues text with a GPT",
                                   p->source);
    } else if (bpe) {
        choose = cdp_bpe_vocab_size(bpe) < V ? cdp_bpe_vocab_size(bpe) : V;
    } else if (o->ids) {
        choose = V;
    } else if (V < 256) {
        char msg[256];
        snprintf(msg, sizeof msg, "%%s: /model/vocab is %lld: bytes as tokens need 256; give the model's "
                 "tokenizer as --vocab and --merges", (long long)V);
        code = cdp_cli_usage_error(a.cmd, msg, p->source);
    }
    if (code < 0 && top_k > choose) {
        char msg[256];
        snprintf(msg, sizeof msg, "--top-k %%s is more than the %lld tokens the model chooses from", (long long)choose);
        code = cdp_cli_usage_error(a.cmd, msg, topk_s);
    }
    /* the end of the text: --stop-token, else the tokenizer's */
    int32_t stop = bpe ? bpe_end_of_text(bpe) : -1;
    if (code < 0 && o->stop_s) {
        int64_t id = -1;
        if (strcmp(o->stop_s, "none") && (code = parse_count(a.cmd, "--stop-token", o->stop_s, 0, V - 1, &id)) >= 0)
            id = -1;
        stop = (int32_t)id;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    if (code < 0) {
        if (o->ids) {
            /* ids separated by commas or spaces */
            const size_t cap = strlen(prompt) / 2 + 2;
            if (!(ids = malloc(cap * sizeof *ids))) code = fail(a.cmd, cdp_fail(CDP_ERR_NOMEM, "out of memory"));
            for (const char *c = prompt; ids && code < 0 && *c;) {
                if (*c == ',' || *c == ' ') {
                    c++;
                    continue;
                }
                char *end;
                errno = 0;
                const long long x = strtoll(c, &end, 10);
                if (end == c || errno || x < 0 || x > INT32_MAX || (*end && *end != ',' && *end != ' ')) {
                    code = cdp_cli_usage_error(a.cmd, "--prompt-ids: expected token ids separated by commas, got "
                                               "\"%s\"", prompt);
                    break;
                }
                ids[n++] = (int32_t)x;
                c = end;
            }
        } else if (bpe) {
            if ((st = cdp_bpe_encode(bpe, prompt, strlen(prompt), &ids, &n))) {
                cdp_error_context(st, "--prompt");
                code = fail(a.cmd, st);
            }
        } else {
            n = (int64_t)strlen(prompt);
            if (n && !(ids = malloc((size_t)n * sizeof *ids))) code = fail(a.cmd, cdp_fail(CDP_ERR_NOMEM, "out of memory"));
            for (int64_t i = 0; ids && i < n; i++) ids[i] = (unsigned char)prompt[i];
        }
    }
    if (code < 0 && n == 0) code = cdp_cli_usage_error(a.cmd, "%s", "--prompt: give at least one character");
    for (int64_t i = 0; code < 0 && i < n; i++)
        if (ids[i] >= V) {
            char msg[256];
            snprintf(msg, sizeof msg, "--prompt: token %lld of %%s is id %d, and /model/vocab is %lld", (long long)i,
                     ids[i], (long long)V);
            code = cdp_cli_usage_error(a.cmd, msg, prompt);
        }
    if (code < 0 && n > T && !a.quiet && printer)
        fprintf(stderr, "cdphybrid generate: the prompt is %lld tokens and /model/context %lld: the model sees its "
                "last %lld\n", (long long)n, (long long)T, (long long)T);
    int32_t *all = NULL;
    float *logits = NULL, *xin = NULL, *xout = NULL;
    struct cdp_infer *inf = NULL;
    if (code < 0 && (st = cdp_infer_create(l.model, T, &inf))) code = fail(a.cmd, st);
    if (code < 0) {
        all = malloc((size_t)(n + n_new) * sizeof *all);
        logits = malloc((size_t)V * sizeof *logits);
        if (rk->rank > 0) xin = malloc((size_t)cdp_infer_in_floats(inf, T) * sizeof *xin);
        if (!last) xout = malloc((size_t)cdp_infer_out_floats(inf, T) * sizeof *xout);
        if (!all || !logits || (rk->rank > 0 && !xin) || (!last && !xout))
            code = fail(a.cmd, cdp_fail(CDP_ERR_NOMEM, "out of memory"));
        else memcpy(all, ids, (size_t)n * sizeof *all);
    }
    /* the ranks agree that each can start, then stage 0 prints */
    code = ranks_agree(rk, code);
    if (code < 0) {
        if (printer) {
            if (o->ids)
                for (int64_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
            else fputs(prompt, stdout);
            fflush(stdout);
        }
        uint64_t state = seed;
        int64_t from = 0; /* the cache holds the positions of tokens all[from ..] */
        /* timings (-v): the first step (the prompt's positions and the first token), then the rest */
        uint64_t t0 = cdp_time_ns(), t1 = t0;
        int64_t made = 0, prompt_positions = 0;
        for (int64_t k = 0; k < n_new; k++) {
            int32_t next = 0;
            if (k == 1) t1 = cdp_time_ns();
            const int64_t known = n + k, pos = cdp_infer_position(inf);
            /* the newest token alone when the cache holds the rest and has room; else (the start, or the
             * window slides past the context) the window again from position 0 */
            int64_t feed = 1;
            if (!(pos > 0 && from + pos == known - 1 && pos < T)) {
                feed = known < T ? known : T;
                from = known - feed;
                cdp_infer_reset(inf);
            }
            /* stage 0 embeds the tokens; the others take the activations of the stage before; the last
             * stage gives the logits of the newest position (one rank is a pipeline of one stage) */
            const uint64_t in_bytes = (uint64_t)cdp_infer_in_floats(inf, feed) * 4,
                           out_bytes = (uint64_t)cdp_infer_out_floats(inf, feed) * 4;
            st = rk->rank > 0 ? recv_wait(rk, xin, in_bytes, rk->rank - 1) : CDP_OK;
            if (!st) st = cdp_infer_step(inf, rk->rank > 0 ? (const void *)xin : all + known - feed, feed,
                                         last ? logits : xout);
            if (!st && !last) st = send_wait(rk, xout, out_bytes, rk->rank + 1);
            /* the last stage chooses, with the one stream of the seed; the others hear the token */
            if (!st && last) st = cdp_infer_pick(logits, choose, temperature, top_k, top_p, &state, &next);
            if (!st && rk->world)
                st = cdp_comm_bcast_bytes(rk->world, &next, sizeof next, rk->size - 1, rk->timeout);
            if (st) {
                cdp_error_context(st, "token %lld", (long long)k + 1);
                if (printer) fputc('\n', stdout);
                if (rk->world) ranks_fail(rk, a.cmd, st);
                code = fail(a.cmd, st);
                break;
            }
            if (k == 0) prompt_positions = feed;
            made = k + 1;
            if (next == stop) break; /* the end of the text: not printed */
            all[n + k] = next;
            if (!printer) {
            } else if (o->ids) {
                printf(" %d", next);
            } else if (bpe) {
                size_t len = 0;
                const char *b = cdp_bpe_decode(bpe, next, &len);
                fwrite(b, 1, len, stdout);
            } else {
                fputc((unsigned char)next, stdout);
            }
            fflush(stdout);
        }
        if (code < 0) {
            if (printer) fputc('\n', stdout);
            code = finish_stdout(a.cmd);
        }
        const uint64_t t2 = cdp_time_ns();
        if (code == 0 && printer && made > 0) {
            const double first = (double)(t1 - t0) * 1e-9, rest = (double)(t2 - t1) * 1e-9;
            CDP_INFO(EXEC, "%s: the prompt's %lld positions and the first token in %.3f s; %lld more tokens in "
                     "%.3f s: %.2f tokens/s (a forward of one position each, KV cache)", a.cmd,
                     (long long)prompt_positions, first, (long long)(made - 1), made > 1 ? rest : 0.0,
                     made > 1 && rest > 0 ? (double)(made - 1) / rest : 0.0);
        }
    }
    cdp_infer_destroy(inf);
    free(xin);
    free(xout);
    free(all);
    free(logits);
    free(ids);
    cdp_bpe_free(bpe);
    loaded_free(&l);
    return code;
}

int cdp_cli_generate(int argc, char **argv)
{
    struct infer_args a = {.cmd = "generate"};
    const char *prompt = NULL, *tokens_s = "64", *temp_s = "1.0", *topk_s = "0", *seed_s = "1", *vocab = NULL,
               *merges = NULL, *topp_s = "1", *stop_s = NULL;
    int ids = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char **value = NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            generate_usage(stdout);
            return 0;
        }
        if (common_option(&a, s, &value)) {
        } else if (!strcmp(s, "--prompt")) value = &prompt;
        else if (!strcmp(s, "--prompt-ids")) {
            value = &prompt;
            ids = 1;
        }
        else if (!strcmp(s, "--tokens")) value = &tokens_s;
        else if (!strcmp(s, "--temperature")) value = &temp_s;
        else if (!strcmp(s, "--top-k")) value = &topk_s;
        else if (!strcmp(s, "--top-p")) value = &topp_s;
        else if (!strcmp(s, "--stop-token")) value = &stop_s;
        else if (!strcmp(s, "--seed")) value = &seed_s;
        else if (!strcmp(s, "--vocab")) value = &vocab;
        else if (!strcmp(s, "--merges")) value = &merges;
        else if (s[0] == '-') {
            static const char *const known[] = {"--plan", "--weights", "--checkpoint", "--prompt", "--prompt-ids", "--tokens",
                                                "--temperature", "--top-k", "--top-p", "--stop-token", "--seed",
                                                "--vocab", "--merges",
                                                "--verbose", "--quiet", "--help", NULL};
            return cdp_cli_unknown_option(a.cmd, s, known);
        } else {
            return cdp_cli_usage_error(a.cmd, "unexpected argument \"%s\"", s);
        }
        int code;
        if (value && (code = take_value(a.cmd, argc, argv, &i, value)) >= 0) return code;
    }
    if (a.verbose && a.quiet) return cdp_cli_usage_error(a.cmd, "%s", "-v and -q cannot be used together");
    if (!prompt) return cdp_cli_usage_error(a.cmd, "%s", "give --prompt TEXT (or --prompt-ids IDS)");
    int64_t n_new, top_k;
    int code;
    if ((code = parse_count(a.cmd, "--tokens", tokens_s, 0, 1000000000, &n_new)) >= 0) return code;
    if ((code = parse_count(a.cmd, "--top-k", topk_s, 0, INT32_MAX, &top_k)) >= 0) return code;
    char *end;
    errno = 0;
    const double temperature = strtod(temp_s, &end);
    if (!*temp_s || *end || errno || !isfinite(temperature) || temperature < 0)
        return cdp_cli_usage_error(a.cmd, "--temperature: expected a number >= 0 (0: greedy), got \"%s\"", temp_s);
    errno = 0;
    const double top_p = strtod(topp_s, &end);
    if (!*topp_s || *end || errno || !(top_p > 0 && top_p <= 1))
        return cdp_cli_usage_error(a.cmd, "--top-p: expected a number in (0, 1] (1: all tokens), got \"%s\"", topp_s);
    errno = 0;
    uint64_t seed = strtoull(seed_s, &end, 10);
    if (!*seed_s || *end || errno || seed_s[0] == '-')
        return cdp_cli_usage_error(a.cmd, "--seed: expected a whole number in [0, 2^64), got \"%s\"", seed_s);
    if (!vocab != !merges)
        return cdp_cli_usage_error(a.cmd, "%s", "--vocab and --merges go together (GPT-2's vocab.json and merges.txt)");
    set_log(&a);

    struct ranks rk;
    cdp_status st;
    if ((st = ranks_open(&rk))) return fail(a.cmd, st);
    const struct gen_opts o = {.prompt = prompt, .ids = ids, .n_new = n_new, .top_k = top_k, .temperature = temperature,
                               .top_p = top_p, .topk_s = topk_s, .stop_s = stop_s, .vocab = vocab,
                               .merges = merges, .seed = seed};
    code = generate_on(&a, &rk, &o);
    ranks_close(&rk);
    return code;
}

/* Validation loss as training's validation computes it (pipeline/run/interpret.c
 * cdp_exec_validate): `batches` micro-batches of B samples of the validation
 * split, micro-batch k starting at sample (k B) mod (split - B + 1), flowing
 * through the stages (one rank: a pipeline of one stage), the loss summed over
 * every row by the last stage, in that order, and divided by batches x B x
 * rows per sample; the sum reaches every rank. *rows: the rows (tokens, or
 * samples for other models) it averaged over. */
static cdp_status val_loss(const struct ranks *rk, struct cdp_model *m, cdp_device_t dev,
                                    struct cdp_data *d, int B, int64_t batches, enum cdp_loss lossk, double *loss,
                                    int64_t *rows)
{
    const struct cdp_sample_shape *sh = cdp_data_shape(d);
    const int64_t per = sh->tokens ? sh->input_numel : 1, avail = cdp_data_split_size(d, CDP_SPLIT_VAL);
    void *in = malloc((size_t)B * (size_t)sh->input_numel * 4), *tgt = malloc((size_t)B * (size_t)sh->target_numel * 4);
    void *buf = rk->world ? stage_buffer(m, B, lossk) : NULL;
    cdp_status st = in && tgt && (buf || !rk->world) ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const int first_stage = rk->rank == 0, last = rk->rank == rk->size - 1;
    double sum = 0;
    for (int64_t k = 0; k < batches && !st; k++) {
        const int64_t first = (k * B) % (avail > B ? avail - B + 1 : 1);
        if ((first_stage || last) && (st = cdp_data_fetch(d, CDP_SPLIT_VAL, first, B, in, tgt))) break;
        if (first_stage &&
            (st = cdp_device_write(dev, cdp_model_input(m, 0), in, (uint64_t)B * (uint64_t)sh->input_numel * 4)))
            break;
        if ((st = stage_forward(rk, m, dev, B, lossk, buf))) break;
        if (last) {
            double s = 0;
            if ((st = cdp_model_loss(m, 0, tgt, 1.0f, &s))) break;
            sum += s;
        }
    }
    free(in);
    free(tgt);
    free(buf);
    if (!st && rk->world) st = cdp_comm_bcast_bytes(rk->world, &sum, sizeof sum, rk->size - 1, rk->timeout);
    if (st) return st;
    *rows = batches * B * per;
    *loss = sum / ((double)batches * B * (double)per);
    return CDP_OK;
}

/* eval after its arguments are read, on one rank or a stage of the pipeline. */
static int eval_on(const struct infer_args *a, struct ranks *rk, int64_t batches)
{
    struct loaded l;
    int code;
    if ((code = ranks_agree(rk, load_model(a, 0, rk, &l))) >= 0) {
        loaded_free(&l);
        return code;
    }
    const struct cdp_plan *p = l.plan;
    if (!batches) batches = p->train.eval_batches;
    cdp_cpu_set_threads(CDP_CPU_EXACT_THREADS); /* as training's validation: the same double */
    struct cdp_data *d = NULL;
    double loss = 0;
    int64_t rows = 0;
    cdp_status st = cdp_data_open(&p->data, &p->model, &d);
    if ((code = ranks_agree(rk, st ? fail(a->cmd, st) : -1)) >= 0) {
        cdp_data_close(d);
        loaded_free(&l);
        return code;
    }
    st = val_loss(rk, l.model, l.dev, d, (int)p->train.micro_batch, batches, cdp_model_loss_of(&p->model), &loss,
                  &rows);
    if (st && rk->world) ranks_fail(rk, a->cmd, st);
    if (st) {
        code = fail(a->cmd, st);
    } else if (rk->rank == 0) {
        const int tokens = cdp_data_shape(d)->tokens;
        if (!a->quiet) {
            if (l.ckpt_path) printf("step %lld of %s", (long long)l.step, l.ckpt_path);
            else printf("%s", l.weights);
            printf(", on the validation split of %s: %lld micro-batches of %lld samples",
                   p->data.path ? p->data.path : "the synthetic data", (long long)batches,
                   (long long)p->train.micro_batch);
            if (rk->world) printf(", on %d pipeline stages", rk->size);
            printf("\n");
        }
        printf("val_loss %.17g\nperplexity %.17g\n%s %lld\n", loss, exp(loss), tokens ? "tokens" : "samples",
               (long long)rows);
        code = finish_stdout(a->cmd);
    } else {
        code = 0;
    }
    cdp_data_close(d);
    loaded_free(&l);
    return code;
}

int cdp_cli_eval(int argc, char **argv)
{
    struct infer_args a = {.cmd = "eval"};
    const char *batches_s = NULL;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char **value = NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            eval_usage(stdout);
            return 0;
        }
        if (common_option(&a, s, &value)) {
        } else if (!strcmp(s, "--batches")) value = &batches_s;
        else if (s[0] == '-') {
            static const char *const known[] = {"--plan", "--weights", "--checkpoint", "--batches", "--verbose",
                                                "--quiet", "--help", NULL};
            return cdp_cli_unknown_option(a.cmd, s, known);
        } else {
            return cdp_cli_usage_error(a.cmd, "unexpected argument \"%s\"", s);
        }
        int code;
        if (value && (code = take_value(a.cmd, argc, argv, &i, value)) >= 0) return code;
    }
    if (a.verbose && a.quiet) return cdp_cli_usage_error(a.cmd, "%s", "-v and -q cannot be used together");
    int64_t batches = 0;
    int code;
    if (batches_s && (code = parse_count(a.cmd, "--batches", batches_s, 1, 1 << 30, &batches)) >= 0) return code;
    set_log(&a);
    struct ranks rk;
    cdp_status st;
    if ((st = ranks_open(&rk))) return fail(a.cmd, st);
    code = eval_on(&a, &rk, batches);
    ranks_close(&rk);
    return code;
}
