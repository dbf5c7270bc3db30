/* Paths (path.h). */
#include "core/path.h"

#include <stdlib.h>
#include <string.h>

char *cdp_path_join(const char *base, const char *rel)
{
    if (rel[0] == '/' || !base || !*base) return strdup(rel);
    size_t nb = strlen(base);
    const size_t nr = strlen(rel);
    while (nb > 1 && base[nb - 1] == '/') nb--;
    const int slash = base[nb - 1] != '/';
    char *s = malloc(nb + (size_t)slash + nr + 1);
    if (!s) return NULL;
    memcpy(s, base, nb);
    if (slash) s[nb] = '/';
    memcpy(s + nb + (size_t)slash, rel, nr + 1);
    return s;
}
