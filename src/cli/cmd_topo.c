/* `cdphybrid topo`: shows a topology (this machine, a preset, a cluster spec or
 * a file) as link-class and bandwidth matrices or JSON, and exports it as hwloc
 * XML or our JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cdp/topology.h"
#include "cli/commands.h"
#include "core/file.h"


static void topo_usage(FILE *f)
{
    char **names = NULL;
    fputs("usage: cdphybrid topo [--topology SPEC] [--json] [--export FILE] [--cpu-devices N] [-v|-q]\n"
          "\n"
          "Shows the machine model the planner uses: a GPU x GPU matrix of link classes\n"
          "(like nvidia-smi topo -m), one of bandwidths (GB/s, one direction), NUMA/CPU\n"
          "affinity, NVSwitches and NICs (docs/topology.md).\n"
          "\n"
          "options:\n"
          "  --topology SPEC   what to show (default auto):\n"
          "                      auto            discover this machine (hwloc, NVML)\n"
          "                      NAME            a preset (list below)\n"
          "                      N x NAME        a cluster of N such nodes, e.g. \"4 x dgx-a100\"\n"
          "                      FILE            hwloc v2 XML, NCCL topology XML or our JSON\n"
          "  --json            print the topology as JSON for scripts\n"
          "  --export FILE     write it: FILE.json in our format, any other name hwloc v2 XML\n"
          "                    (with an NVLinkBandwidth matrix); either loads back identically\n"
          "  --cpu-devices N   with auto on a machine without GPUs: N CPU devices\n"
          "                    (default one per NUMA node)\n"
          "  -v, --verbose     say which discovery steps were used and why (twice: debug)\n"
          "  -q, --quiet       errors only\n"
          "  -h, --help        this text\n"
          "\n"
          "environment:\n"
          "  CDP_TOPOLOGY_DIR=DIR   look for presets here first\n"
          "\n"
          "examples:\n"
          "  cdphybrid topo -v\n"
          "  cdphybrid topo --topology dgx-a100\n"
          "  cdphybrid topo --topology \"4 x hgx-h100\" --json\n"
          "  cdphybrid topo --topology hwloc.xml --export machine.xml\n"
          "\n"
          "exit codes: 0 success, 1 the run failed, 2 bad usage or bad input\n",
          f);
    if (cdp_topology_preset_names(&names) == CDP_OK) {
        fputs("\npresets:", f);
        for (char **p = names; *p; p++) fprintf(f, " %s", *p);
        fputs(names[0] ? "\n" : " none found (set CDP_TOPOLOGY_DIR)\n", f);
        cdp_topology_preset_names_free(names);
    }
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

int cdp_cli_topo(int argc, char **argv)
{
    const char *spec = "auto", *export_path = NULL;
    int json = 0, verbose = 0, quiet = 0, cpu_devices = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char **value = NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            topo_usage(stdout);
            return 0;
        } else if (!strcmp(s, "--json")) {
            json = 1;
        } else if (!strcmp(s, "-v") || !strcmp(s, "--verbose")) {
            verbose++;
        } else if (!strcmp(s, "-vv")) {
            verbose += 2;
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(s, "--topology") || !strncmp(s, "--topology=", 11)) {
            value = &spec;
        } else if (!strcmp(s, "--export") || !strncmp(s, "--export=", 9)) {
            value = &export_path;
        } else if (!strcmp(s, "--cpu-devices") || !strncmp(s, "--cpu-devices=", 14)) {
            const char *eq = strchr(s, '='), *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || !*v || *end || n < 1 || n > 4096)
                return cdp_cli_usage_error("topo", "--cpu-devices needs a number from 1 to 4096, got \"%s\"", v ? v : "");
            cpu_devices = (int)n;
        } else if (s[0] == '-') {
            static const char *const known[] = {"--topology", "--json", "--export", "--cpu-devices", "--verbose",
                                                "--quiet", "--help", NULL};
            return cdp_cli_unknown_option("topo", s, known);
        } else {
            return cdp_cli_usage_error("topo", "unexpected argument \"%s\"", s);
        }
        if (value) {
            const char *eq = strchr(s, '=');
            if (eq) *value = eq + 1;
            else if (i + 1 < argc) *value = argv[++i];
            else return cdp_cli_usage_error("topo", "%s needs a value", s);
            if (!**value) return cdp_cli_usage_error("topo", "%s needs a value", s);
        }
    }
    if (verbose && quiet) return cdp_cli_usage_error("topo", "%s", "-v and -q cannot be used together");
    if (cpu_devices && strcmp(spec, "auto"))
        return cdp_cli_usage_error("topo", "%s", "--cpu-devices goes with --topology auto");
    if (!getenv("CDP_LOG") || !*getenv("CDP_LOG")) {
        if (quiet) cdp_log_set_level(CDP_LOG_ERROR);
        else if (verbose) cdp_log_set_level(verbose > 1 ? CDP_LOG_DEBUG : CDP_LOG_INFO);
    }

    struct cdp_topology *t = NULL;
    cdp_status st;
    if (!strcmp(spec, "auto")) {
        struct cdp_discover_options o = {.cpu_devices = cpu_devices};
        st = cdp_topology_discover(&o, &t);
    } else {
        st = cdp_topology_load(spec, NULL, &t);
    }
    if (st) {
        fprintf(stderr, "cdphybrid topo: %s\n", cdp_last_error());
        return st == CDP_ERR_INVALID || st == CDP_ERR_UNSUPPORTED || st == CDP_ERR_IO ? EXIT_USAGE : EXIT_RUN_FAILED;
    }
    int code = 0;
    if (export_path) {
        if (ends_with(export_path, ".json")) {
            char *text = NULL;
            if (!(st = cdp_topology_to_native_json(t, &text))) {
                struct cdp_atomic_file out;
                if (!(st = cdp_atomic_open(export_path, &out))) {
                    if (fputs(text, out.stream) < 0 || fputc('\n', out.stream) == EOF) {
                        st = cdp_fail(CDP_ERR_IO, "cannot write %s", export_path);
                        cdp_atomic_abort(&out);
                    } else {
                        st = cdp_atomic_commit(&out);
                    }
                }
            }
            free(text);
        } else {
            st = cdp_topology_export_xml(t, export_path);
        }
        if (st) {
            fprintf(stderr, "cdphybrid topo: %s\n", cdp_last_error());
            cdp_topology_free(t);
            return st == CDP_ERR_INVALID ? EXIT_USAGE : EXIT_RUN_FAILED;
        }
        CDP_INFO(TOPO, "wrote %s", export_path);
    }
    if (json) {
        char *text = NULL;
        if ((st = cdp_topology_to_json(t, &text))) {
            fprintf(stderr, "cdphybrid topo: %s\n", cdp_last_error());
            code = EXIT_RUN_FAILED;
        } else {
            fputs(text, stdout);
            fputc('\n', stdout);
        }
        free(text);
    } else if (cdp_topology_print(t, stdout)) {
        code = EXIT_RUN_FAILED;
    }
    if (!json && export_path) printf("\nwrote %s\n", export_path);
    cdp_topology_free(t);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid topo: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return code;
}
