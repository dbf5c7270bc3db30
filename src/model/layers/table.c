/* The table of layer types: cdp/layer_types.h names them, each file under
 * src/model/layers/ describes one. Generated from the one list, so no type
 * can be missing or out of place. */
#include <pthread.h>
#include <string.h>

#include "model/layer_def.h"

#define CDP_LAYER_EXTERN_(NAME, name) extern const struct cdp_layer_def cdp_layer_##name;
CDP_LAYER_TYPES(CDP_LAYER_EXTERN_)
#undef CDP_LAYER_EXTERN_

static const struct cdp_layer_def *const defs[] = {
#define CDP_LAYER_ENTRY_(NAME, name) [CDP_LAYER_##NAME] = &cdp_layer_##name,
    CDP_LAYER_TYPES(CDP_LAYER_ENTRY_)
#undef CDP_LAYER_ENTRY_
};
_Static_assert(sizeof defs / sizeof defs[0] == CDP_LAYER_TYPE_COUNT, "one description per layer type");

/* The listable names, in enum order (the table's listable entries). */
static const char *listable_names[CDP_LAYER_TYPE_COUNT + 1];
static pthread_once_t listable_once = PTHREAD_ONCE_INIT;

static void fill_listable(void)
{
    int n = 0;
    for (int t = 0; t < CDP_LAYER_TYPE_COUNT; t++)
        if (defs[t]->listable) listable_names[n++] = defs[t]->name;
    listable_names[n] = NULL;
}

const struct cdp_layer_def *cdp_layer_def(enum cdp_layer_type t)
{
    return (unsigned)t < CDP_LAYER_TYPE_COUNT ? defs[t] : NULL;
}

const char *cdp_layer_name(enum cdp_layer_type t)
{
    return (unsigned)t < CDP_LAYER_TYPE_COUNT ? defs[t]->name : "?";
}

int cdp_layer_find(const char *name)
{
    for (int t = 0; t < CDP_LAYER_TYPE_COUNT; t++)
        if (defs[t]->listable && !strcmp(defs[t]->name, name)) return t;
    return -1;
}

const char *const *cdp_layer_listable_names(void)
{
    pthread_once(&listable_once, fill_listable);
    return listable_names;
}
