/* `cdphybrid export`: the whole model of the latest complete checkpoint (its
 * checksums verified) as one safetensors file that other tools read. */
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
          "\n"
          "Writes the model weights of a checkpoint as one safetensors file, readable by\n"
          "other tools (Python's safetensors, Hugging Face). Tensors are named by global\n"
          "unit index (layers.0.wte, layers.1.attn.c_attn.weight, ...; docs/training.md),\n"
          "whatever stages wrote the checkpoint; optimizer state is left out. The file's\n"
          "metadata holds {\"format\": \"cdphybrid\", \"step\": \"N\"} (docs/checkpoints.md).\n"
          "\n"
          "options:\n"
          "  --checkpoint DIR  a checkpoint folder (train.checkpoint.dir: its newest complete\n"
          "                    checkpoint is used), or one step folder (DIR/step-00000100);\n"
          "                    every part's size and SHA-256 are checked first\n"
          "  --out FILE        the file to write (atomically: a temporary name, then renamed)\n"
          "  -v, --verbose     say which checkpoint is used (twice: debug)\n"
          "  -q, --quiet       errors only\n"
          "  -h, --help        this text\n"
          "\n"
          "examples:\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt --out gpt.safetensors\n"
          "  cdphybrid export --checkpoint runs/gpt/ckpt/step-00001000 --out gpt-1000.safetensors\n"
          "\n"
          "exit codes: 0 success, 1 the file could not be written, 2 bad usage or a missing,\n"
          "incomplete or corrupt checkpoint\n",
          f);
}

int cdp_cli_export(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL;
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
        } else if (!strcmp(s, "-v") || !strcmp(s, "--verbose")) {
            verbose++;
        } else if (!strcmp(s, "-vv")) {
            verbose += 2;
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            quiet = 1;
        } else if (s[0] == '-') {
            static const char *const known[] = {"--checkpoint", "--out", "--verbose", "--quiet", "--help", NULL};
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
    if (!out || !*out) return cdp_cli_usage_error("export", "%s", "give --out FILE");
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
    st = cdp_ckpt_export(path, out);
    if (st) {
        fprintf(stderr, "cdphybrid export: %s\n", cdp_last_error());
    } else if (!quiet) {
        printf("exported step %lld of %s to %s\n", (long long)info.step, path, out);
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
