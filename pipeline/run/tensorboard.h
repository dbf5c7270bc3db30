/* TensorBoard event files (output.tensorboard): the scalars of every step
 * record of metrics.jsonl, as TensorFlow's event-file format — records of
 * (length, masked CRC-32C of the length, an Event protocol buffer, masked
 * CRC-32C of it) — that TensorBoard and tensorboard's EventAccumulator read.
 * Debian has no C library for this format or for CRC-32C, so the few fields
 * are encoded here (docs/training.md#tensorboard). */
#ifndef CDP_PIPELINE_TENSORBOARD_H
#define CDP_PIPELINE_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_tb;

/* Makes dir when missing (its parent must exist) and starts a new event file
 * in it, "events.out.tfevents.<seconds>.<host>.<pid>.cdphybrid", with the
 * file-version record. A run resumed after step0 > 0 also records a session
 * start at step0 + 1, so TensorBoard drops what an earlier file holds from
 * that step on (those steps run again). CDP_ERR_IO naming the file. */
cdp_status cdp_tb_open(const char *dir, int64_t step0, struct cdp_tb **out);
/* One Event of step `step` at wall time `wall` (seconds since the epoch)
 * holding the n scalars tags[i] = values[i]; written and flushed whole.
 * CDP_ERR_IO naming the file. */
cdp_status cdp_tb_scalars(struct cdp_tb *t, int64_t step, double wall, const char *const *tags,
                          const double *values, int n);
/* The file's path (not owned). */
const char *cdp_tb_path(const struct cdp_tb *t);
void cdp_tb_close(struct cdp_tb *t);

/* CRC-32C (Castagnoli) of n bytes, and TensorFlow's masked form of it (the
 * value stored in the records). */
uint32_t cdp_crc32c(const void *data, size_t n);
uint32_t cdp_tb_masked_crc(uint32_t crc);

#ifdef __cplusplus
}
#endif

#endif
