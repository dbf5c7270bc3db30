/* The header of a schedule file in JSON (what `cdphybrid --plan P --schedule
 * --json` writes): its shape and the kind whose placement of virtual stages
 * it uses. One reader, with one set of limits, for the plan loader (which
 * takes the job's shape from it) and the schedule loader (which reads the
 * lists under it). */
#ifndef CDP_PLAN_SCHEDULE_HEADER_H
#define CDP_PLAN_SCHEDULE_HEADER_H

#include <jansson.h>
#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_SCHEDULE_FILE_MAX_STAGES 4096
#define CDP_SCHEDULE_FILE_MAX_CHUNKS 64
#define CDP_SCHEDULE_FILE_MAX_MICRO_BATCHES (1 << 20)

struct cdp_schedule_header {
    int stages, chunks, micro_batches; /* chunks 1 when the file leaves it out */
    int kind;                          /* the kind "schedule" names, or -1 (none, or not a kind's name) */
};

/* Reads root's "stages", "micro_batches" (integers), "chunks" (an integer,
 * optional) and "schedule" (a string, optional), within the limits above.
 * CDP_ERR_INVALID "PATH: ..." naming what is wrong. */
cdp_status cdp_schedule_header_read(const char *path, const json_t *root, struct cdp_schedule_header *out);

#ifdef __cplusplus
}
#endif

#endif
