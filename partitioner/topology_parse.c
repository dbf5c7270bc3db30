/* The small grammars the topology readers share: rates with their units and
 * PCI bus ids. */
#include "partitioner/topology_internal.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"

cdp_status cdp_parse_rate(const char *s, double *out)
{
    static const struct { const char *unit; double mul; } units[] = {
        {"TB/s", 1e12}, {"GB/s", 1e9}, {"MB/s", 1e6}, {"KB/s", 1e3}, {"kB/s", 1e3}, {"B/s", 1},
        {"TiB/s", 1099511627776.0}, {"GiB/s", 1073741824.0}, {"MiB/s", 1048576.0},
        {"Tb/s", 1e12 / 8}, {"Gb/s", 1e9 / 8}, {"Mb/s", 1e6 / 8}, {"Gbps", 1e9 / 8}, {"Mbps", 1e6 / 8},
    };
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || isinf(v)) goto bad;
    while (*end == ' ') end++;
    if (!*end) {
        *out = v;
        return CDP_OK;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) == 0) {
            *out = v * units[i].mul;
            return CDP_OK;
        }
    }
bad:
    return cdp_fail(CDP_ERR_INVALID, "expected a non-negative rate like \"25GB/s\" (bytes) or \"200Gb/s\" "
                    "(bits), got \"%.40s\"", s);
}

int cdp_busid_parse(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    char tail;
    if (!s) return -1;
    if (sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, fn, &tail) == 4) return 0;
    *dom = 0;
    if (sscanf(s, "%x:%x.%x%c", bus, dev, fn, &tail) == 3) return 0;
    return -1;
}

void cdp_busid_normalize(const char *s, char *out, size_t cap)
{
    unsigned d, b, v, f;
    if (cdp_busid_parse(s, &d, &b, &v, &f) == 0) snprintf(out, cap, "%04x:%02x:%02x.%x", d, b, v, f);
    else cdp_topology_copy_str(out, cap, s);
}
