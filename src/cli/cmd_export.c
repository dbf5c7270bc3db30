/* `cdphybrid export`: a trained model's weights for other tools, from the
 * latest complete checkpoint (its checksums verified) or from a weights file
 * with its plan, as one safetensors file in our names or (--format hf) as a
 * folder Hugging Face transformers loads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/log.h"
#include "cdp/plan.h"
#include "cli/commands.h"
#include "model/checkpoint.h"
#include "model/hf.h"
#include "model/model.h"

static void export_usage(FILE *f)
{
    fputs("usage: cdphybrid export --checkpoint DIR --out FILE [-v|-q]\n"
          "       cdphybrid export --checkpoint DIR --format hf --out DIR [--shard-size SIZE] [-v|-q]\n"
          "       cdphybrid export --plan FILE [--weights FILE] [--format hf] --out PATH ...\n"
          "\n"
          "Writes the model weights of a checkpoint, or of a weights file with the plan\n"
          "that describes its model, for other tools; optimizer state is left out. Two\n"
          "formats:\n"
          "\n"
          "  cdphybrid (the default): PATH is one safetensors file, tensors named by global\n"
          "      unit index (layers.0.wte, layers.1.attn.c_attn.weight, ...; docs/training.md),\n"
          "      whatever stages wrote the checkpoint; metadata {\"format\": \"cdphybrid\",\n"
          "      \"step\": \"N\"}. Python's safetensors reads it; cdphybrid loads it back\n"
          "      (model.weights). Hugging Face transformers does not know these names.\n"
          "  hf: PATH is a folder (made when missing) that Hugging Face transformers loads\n"
          "      with GPT2LMHeadModel.from_pretrained(PATH): config.json,\n"
          "      generation_config.json and model.safetensors in GPT-2's names and layout,\n"
          "      or shards of at most --shard-size listed by model.safetensors.index.json.\n"
          "      GPT models only (docs/models.md).\n"
          "\n"
          "options:\n"
          "  --checkpoint DIR  a checkpoint folder (train.checkpoint.dir: its newest complete\n"
          "                    checkpoint is used), or one step folder (DIR/step-00000100);\n"
          "                    every part's size and SHA-256 are checked first\n"
          "  --plan FILE       the plan of the model (its /model) when exporting a weights file\n"
          "  --weights FILE    a safetensors file (ours, Hugging Face GPT-2, or an index of\n"
          "                    shards); without it, the plan's /model/weights (or /model/from)\n"
          "  --out PATH        the file (cdphybrid) or folder (hf) to write; files are written\n"
          "                    atomically (a temporary name, then renamed)\n"
          "  --format F        cdphybrid (default) or hf\n"
          "  --shard-size SIZE hf: the largest shard (default 5GB, as save_pretrained); the\n"
          "                    weights past it are split over model-0000k-of-0000N.safetensors\n"
          "  -v, --verbose     say which checkpoint is used (twice: debug)\n"
          "  -q, --quiet       errors only\n"
          "  -h, --help        this text\n"
          "\n"
          "examples:\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt --out gpt.safetensors\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt/step-00001000 --out gpt-1000.safetensors\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt --format hf --out gpt-hf\n"
          "      then in Python: GPT2LMHeadModel.from_pretrained(\"gpt-hf\")\n"
          "  cdphybrid export --plan examples/quickstart.json --weights runs/quickstart.safetensors \\\n"
          "      --format hf --shard-size 100MB --out quickstart-hf\n"
          "\n"
          "exit codes: 0 success, 1 the file could not be written, 2 bad usage, a missing,\n"
          "incomplete or corrupt checkpoint, a bad plan or weights file, or (hf) a model\n"
          "that is not a GPT\n",
          f);
}

/* A weights file through the plan's model: loaded whole on the CPU (any
 * layout the loader reads), then written in the chosen format. */
static int export_weights(const char *plan_path, const char *weights, int hf, const char *out, uint64_t shard,
                          int quiet)
{
    struct cdp_plan *p = NULL;
    cdp_device_t dev = NULL;
    struct cdp_model *m = NULL;
    int code = 0;
    cdp_status st = cdp_plan_load(plan_path, &p);
    if (!st && !weights) weights = p->model.weights;
    if (!st && !weights) {
        code = cdp_cli_usage_error("export", "%s has no /model/weights: give --weights FILE", plan_path);
        goto done;
    }
    if (!st && hf && !cdp_hf_family(&p->model))
        st = cdp_fail(CDP_ERR_INVALID, "%s: /model: --format hf needs a GPT (a gpt or gpt2* preset, or /model/from "
                      "a GPT-2 folder): other models have no Hugging Face form; export them with --format cdphybrid",
                      plan_path);
    if (!st) st = cdp_model_check_weights(&p->model, weights);
    if (!st && !(st = cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev)))
        st = cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), 1, 1, p->train.seed, dev, &m);
    if (!st) st = cdp_model_load(m, weights);
    if (st) {
        fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
        code = st == CDP_ERR_NOMEM ? EXIT_RUN_FAILED : EXIT_USAGE;
        goto done;
    }
    if (hf) {
        const char *meta[2] = {"format", "pt"}; /* transformers refuses another */
        st = cdp_hf_export_model(m, &p->model, out, shard, meta, 1);
    } else {
        const char *meta[2] = {"format", "cdphybrid"};
        st = cdp_model_save(m, out, meta, 1);
    }
    if (st) {
        fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
        code = st == CDP_ERR_NOMEM || st == CDP_ERR_IO ? EXIT_RUN_FAILED : EXIT_USAGE;
    } else if (!quiet) {
        printf("exported %s (the model of %s) to %s%s%s%s\n", weights, plan_path, out, hf ? " (Hugging Face " : "",
               hf ? cdp_hf_family(&p->model) : "", hf ? ")" : "");
    }
done:
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
    return code;
}

/* A checkpoint's model loaded whole on the CPU and written as a Hugging Face folder. */
static int export_checkpoint_model(const struct cdp_plan *p, const char *path, struct cdp_ckpt_info *info,
                                   const char *out, uint64_t shard, int quiet)
{
    cdp_device_t dev = NULL;
    struct cdp_model *m = NULL;
    char step_s[24];
    snprintf(step_s, sizeof step_s, "%lld", (long long)info->step);
    const char *meta[4] = {"format", "pt", "cdphybrid_step", step_s};
    cdp_status st = cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev);
    if (!st) st = cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), 1, 1, p->train.seed, dev, &m);
    if (!st) st = cdp_ckpt_load(path, info, &m, NULL, 1);
    int code = 0;
    if (st) {
        code = st == CDP_ERR_NOMEM ? EXIT_RUN_FAILED : EXIT_USAGE;
    } else if ((st = cdp_hf_export_model(m, &p->model, out, shard, meta, 2))) {
        code = st == CDP_ERR_INVALID ? EXIT_USAGE : EXIT_RUN_FAILED;
    }
    if (st) fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
    else if (!quiet)
        printf("exported step %lld of %s to %s (Hugging Face %s)\n", (long long)info->step, path, out,
               cdp_hf_family(&p->model));
    cdp_model_destroy(m);
    cdp_device_close(dev);
    return code;
}

int cdp_cli_export(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL, *format = "cdphybrid", *plan = NULL, *weights = NULL, *shard_s = NULL;
    int verbose = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char **value = NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            export_usage(stdout);
            return 0;
        } else if (!strcmp(s, "--checkpoint")) {
            value = &ckpt;
        } else if (!strncmp(s, "--checkpoint=", 13)) {
            ckpt = s + 13;
        } else if (!strcmp(s, "--out")) {
            value = &out;
        } else if (!strncmp(s, "--out=", 6)) {
            out = s + 6;
        } else if (!strcmp(s, "--format")) {
            value = &format;
        } else if (!strncmp(s, "--format=", 9)) {
            format = s + 9;
        } else if (!strcmp(s, "--plan")) {
            value = &plan;
        } else if (!strcmp(s, "--weights")) {
            value = &weights;
        } else if (!strcmp(s, "--shard-size")) {
            value = &shard_s;
        } else if (!strcmp(s, "-v") || !strcmp(s, "--verbose")) {
            verbose++;
        } else if (!strcmp(s, "-vv")) {
            verbose += 2;
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            quiet = 1;
        } else if (s[0] == '-') {
            static const char *const known[] = {"--checkpoint", "--plan", "--weights", "--out", "--format",
                                                "--shard-size", "--verbose", "--quiet", "--help", NULL};
            return cdp_cli_unknown_option("export", s, known);
        } else {
            return cdp_cli_usage_error("export", "unexpected argument \"%s\"", s);
        }
        if (value) {
            if (i + 1 >= argc) return cdp_cli_usage_error("export", "%s needs a value", s);
            *value = argv[++i];
        }
    }
    if (verbose && quiet) return cdp_cli_usage_error("export", "%s", "-v and -q cannot be used together");
    if (ckpt && (plan || weights))
        return cdp_cli_usage_error("export", "%s", "give --checkpoint DIR, or --plan FILE (with --weights FILE), "
                                   "not both");
    if (weights && !plan)
        return cdp_cli_usage_error("export", "%s", "--weights needs --plan FILE (the plan of the model it holds)");
    if ((!ckpt || !*ckpt) && (!plan || !*plan))
        return cdp_cli_usage_error("export", "%s", "give --checkpoint DIR, or --plan FILE with --weights FILE");
    const int hf = !strcmp(format, "hf");
    if (!hf && strcmp(format, "cdphybrid"))
        return cdp_cli_usage_error("export", "--format: expected cdphybrid or hf, got \"%s\"", format);
    if (!out || !*out) return cdp_cli_usage_error("export", "%s", hf ? "give --out DIR" : "give --out FILE");
    uint64_t shard = CDP_HF_SHARD_BYTES;
    if (shard_s && !hf) return cdp_cli_usage_error("export", "%s", "--shard-size goes with --format hf");
    if (shard_s && (cdp_parse_size(shard_s, &shard) || shard == 0))
        return cdp_cli_usage_error("export", "--shard-size: expected a size such as 500MB or 2GiB, got \"%s\"",
                                   shard_s);
    if (!getenv("CDP_LOG") || !*getenv("CDP_LOG")) {
        if (quiet) cdp_log_set_level(CDP_LOG_ERROR);
        else if (verbose) cdp_log_set_level(verbose > 1 ? CDP_LOG_DEBUG : CDP_LOG_INFO);
    }
    if (plan) {
        int code = export_weights(plan, weights, hf, out, shard, quiet);
        if (!code && fflush(stdout) != 0) {
            fprintf(stderr, "cdphybrid export: cannot write to standard output\n");
            return EXIT_RUN_FAILED;
        }
        return code;
    }

    char *path = NULL;
    struct cdp_ckpt_info info = {0};
    cdp_status st = cdp_ckpt_find_latest(ckpt, &path, &info);
    if (st) {
        fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
        return st == CDP_ERR_NOMEM ? EXIT_RUN_FAILED : EXIT_USAGE;
    }
    if (hf && info.plan_json) {
        /* a Llama through the model (the checkpoint's export streams GPT-2's layout only) */
        struct cdp_plan *p = NULL;
        char name[4200];
        snprintf(name, sizeof name, "%s/manifest.json (its plan)", path);
        if (!cdp_plan_load_string(info.plan_json, name, NULL, &p) && p->model.kind == CDP_MODEL_GPT &&
            p->model.arch == CDP_ARCH_LLAMA) {
            int code = export_checkpoint_model(p, path, &info, out, shard, quiet);
            cdp_plan_free(p);
            free(path);
            cdp_ckpt_info_free(&info);
            return code;
        }
        cdp_plan_free(p);
    }
    st = hf ? cdp_ckpt_export_hf(path, out, shard) : cdp_ckpt_export(path, out);
    if (st) {
        fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
    } else if (!quiet) {
        printf("exported step %lld of %s to %s%s\n", (long long)info.step, path, out,
               hf ? " (Hugging Face GPT-2: config.json, generation_config.json, safetensors)" : "");
    }
    free(path);
    cdp_ckpt_info_free(&info);
    if (st) return st == CDP_ERR_INVALID ? EXIT_USAGE : EXIT_RUN_FAILED;
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid export: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return 0;
}
