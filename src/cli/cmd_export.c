/* `cdphybrid export`: the whole model of the latest complete checkpoint (its
 * checksums verified) as one safetensors file that other tools read, in our
 * names or (--format hf) as a folder Hugging Face transformers loads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cli/commands.h"
#include "model/checkpoint.h"


static void export_usage(FILE *f)
{
    fputs("usage: cdphybrid export --checkpoint DIR --out FILE [-v|-q]\n"
          "       cdphybrid export --checkpoint DIR --format hf --out DIR [-v|-q]\n"
          "\n"
          "Writes the model weights of a checkpoint for other tools; optimizer state is\n"
          "left out. Two formats:\n"
          "\n"
          "  cdphybrid (the default): PATH is one safetensors file, tensors named by global\n"
          "      unit index (layers.0.wte, layers.1.attn.c_attn.weight, ...; docs/training.md),\n"
          "      whatever stages wrote the checkpoint; metadata {\"format\": \"cdphybrid\",\n"
          "      \"step\": \"N\"}. Python's safetensors reads it; cdphybrid loads it back\n"
          "      (model.weights). Hugging Face transformers does not know these names.\n"
          "  hf: PATH is a folder (made when missing) that Hugging Face transformers loads\n"
          "      with GPT2LMHeadModel.from_pretrained(PATH): model.safetensors in GPT-2's\n"
          "      names and layout, and config.json with the model's shape. GPT presets only\n"
          "      (docs/checkpoints.md).\n"
          "\n"
          "options:\n"
          "  --checkpoint DIR  a checkpoint folder (train.checkpoint.dir: its newest complete\n"
          "                    checkpoint is used), or one step folder (DIR/step-00000100);\n"
          "                    every part's size and SHA-256 are checked first\n"
          "  --out PATH        the file (cdphybrid) or folder (hf) to write; files are written\n"
          "                    atomically (a temporary name, then renamed)\n"
          "  --format F        cdphybrid (default) or hf\n"
          "  -v, --verbose     say which checkpoint is used (twice: debug)\n"
          "  -q, --quiet       errors only\n"
          "  -h, --help        this text\n"
          "\n"
          "examples:\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt --out gpt.safetensors\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt/step-00001000 --out gpt-1000.safetensors\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt --format hf --out gpt-hf\n"
          "      then in Python: GPT2LMHeadModel.from_pretrained(\"gpt-hf\")\n"
          "\n"
          "exit codes: 0 success, 1 the file could not be written, 2 bad usage, a missing,\n"
          "incomplete or corrupt checkpoint, or (hf) a model that is not a GPT\n",
          f);
}

int cdp_cli_export(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL, *format = "cdphybrid";
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
        } else if (!strcmp(s, "-v") || !strcmp(s, "--verbose")) {
            verbose++;
        } else if (!strcmp(s, "-vv")) {
            verbose += 2;
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            quiet = 1;
        } else if (s[0] == '-') {
            static const char *const known[] = {"--checkpoint", "--out", "--format", "--verbose", "--quiet",
                                                "--help", NULL};
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
    if (!ckpt || !*ckpt) return cdp_cli_usage_error("export", "%s", "give --checkpoint DIR");
    const int hf = !strcmp(format, "hf");
    if (!hf && strcmp(format, "cdphybrid"))
        return cdp_cli_usage_error("export", "--format: expected cdphybrid or hf, got \"%s\"", format);
    if (!out || !*out) return cdp_cli_usage_error("export", "%s", hf ? "give --out DIR" : "give --out FILE");
    if (!getenv("CDP_LOG") || !*getenv("CDP_LOG")) {
        if (quiet) cdp_log_set_level(CDP_LOG_ERROR);
        else if (verbose) cdp_log_set_level(verbose > 1 ? CDP_LOG_DEBUG : CDP_LOG_INFO);
    }

    char *path = NULL;
    struct cdp_ckpt_info info = {0};
    cdp_status st = cdp_ckpt_find_latest(ckpt, &path, &info);
    if (st) {
        fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
        return st == CDP_ERR_NOMEM ? EXIT_RUN_FAILED : EXIT_USAGE;
    }
    st = hf ? cdp_ckpt_export_hf(path, out) : cdp_ckpt_export(path, out);
    if (st) {
        fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
    } else if (!quiet) {
        printf("exported step %lld of %s to %s%s\n", (long long)info.step, path, out,
               hf ? " (Hugging Face GPT-2: model.safetensors, config.json)" : "");
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
