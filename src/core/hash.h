/* The small algorithms several layers share: SHA-256 (checkpoint files'
 * checksums) and splitmix64 (every seeded stream: parameter initialisation,
 * data order, the planner's random placements). */
#ifndef CDP_CORE_HASH_H
#define CDP_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SHA-256 (FIPS 180-4), incrementally, as 64 lowercase hex digits. */
struct cdp_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t n;
};
void cdp_sha256_init(struct cdp_sha256 *s);
void cdp_sha256_update(struct cdp_sha256 *s, const void *data, size_t n);
void cdp_sha256_final(struct cdp_sha256 *s, char hex[65]);
/* The digest of a whole file. CDP_ERR_IO naming the file when it cannot be read. */
cdp_status cdp_sha256_file(const char *path, char hex[65]);

/* splitmix64 (Steele, Lea, Flood 2014): advances *state and returns the next
 * 64 random bits; every seeded stream of cdphybrid starts from it. */
uint64_t cdp_splitmix64(uint64_t *state);

#ifdef __cplusplus
}
#endif

#endif
