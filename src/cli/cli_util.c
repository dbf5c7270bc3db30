/* What every cdphybrid command shares: usage errors in one form, unknown
 * options with a did-you-mean, and statuses turned into exit codes. */
#include <stdio.h>

#include "cdp/core.h"
#include "cli/commands.h"

static void prog(const char *cmd)
{
    fprintf(stderr, cmd ? "cdphybrid %s: " : "cdphybrid: ", cmd);
}

int cdp_cli_usage_error(const char *cmd, const char *fmt, const char *arg)
{
    prog(cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, cmd ? "\n(see cdphybrid %s --help)\n" : "\n(see cdphybrid --help)\n", cmd);
    return EXIT_USAGE;
}

int cdp_cli_unknown_option(const char *cmd, const char *opt, const char *const *known)
{
    const char *near = cdp_closest_word(opt, known);
    if (!near) return cdp_cli_usage_error(cmd, "unknown option %s", opt);
    prog(cmd);
    fprintf(stderr, "unknown option %s (did you mean %s?)\n", opt, near);
    fprintf(stderr, cmd ? "(see cdphybrid %s --help)\n" : "(see cdphybrid --help)\n", cmd);
    return EXIT_USAGE;
}

int cdp_cli_exit_code(cdp_status st)
{
    return st == CDP_ERR_INVALID || st == CDP_ERR_UNSUPPORTED ? EXIT_USAGE : EXIT_RUN_FAILED;
}
