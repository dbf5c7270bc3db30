/* The header of a JSON schedule file (schedule_header.h). */
#include "plan/schedule_header.h"

#include <string.h>

#include "cdp/core.h"
#include "cdp/plan.h"

cdp_status cdp_schedule_header_read(const char *path, const json_t *root, struct cdp_schedule_header *out)
{
    const json_t *jp = json_object_get(root, "stages"), *jv = json_object_get(root, "chunks"),
                 *jm = json_object_get(root, "micro_batches"), *jk = json_object_get(root, "schedule");
    if (!json_is_integer(jp) || !json_is_integer(jm) || (jv && !json_is_integer(jv)))
        return cdp_fail(CDP_ERR_INVALID, "%s: expected an object with \"stages\" and \"micro_batches\" (integers), "
                        "\"ranks\" (an array of lists of instructions) and optionally \"chunks\" and \"schedule\", "
                        "as `cdphybrid --plan P --schedule --json` writes", path);
    const json_int_t fp = json_integer_value(jp), fm = json_integer_value(jm), fv = jv ? json_integer_value(jv) : 1;
    if (fp < 1 || fp > CDP_SCHEDULE_FILE_MAX_STAGES || fm < 1 || fm > CDP_SCHEDULE_FILE_MAX_MICRO_BATCHES || fv < 1 ||
        fv > CDP_SCHEDULE_FILE_MAX_CHUNKS)
        return cdp_fail(CDP_ERR_INVALID, "%s: stages %lld, chunks %lld, micro_batches %lld: expected positive "
                        "integers (at most %d, %d and 2^20)", path, (long long)fp, (long long)fv, (long long)fm,
                        CDP_SCHEDULE_FILE_MAX_STAGES, CDP_SCHEDULE_FILE_MAX_CHUNKS);
    if (jk && !json_is_string(jk)) return cdp_fail(CDP_ERR_INVALID, "%s: \"schedule\": expected a string", path);
    out->stages = (int)fp;
    out->chunks = (int)fv;
    out->micro_batches = (int)fm;
    out->kind = -1;
    /* a kind's name gives its placement of virtual stages (zbv: the V) */
    for (int k = 0; jk && k < CDP_SCHEDULE_COUNT; k++)
        if (!strcmp(json_string_value(jk), cdp_schedule_name((enum cdp_schedule_kind)k))) out->kind = k;
    return CDP_OK;
}
