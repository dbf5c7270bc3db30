/* Paths: the one rule by which a name is joined to the folder it is relative
 * to (plan keys beside the plan, topology files, checkpoint parts). */
#ifndef CDP_CORE_PATH_H
#define CDP_CORE_PATH_H

#ifdef __cplusplus
extern "C" {
#endif

/* base + "/" + rel, malloc'd: rel as it is when it is absolute or base is NULL
 * or ""; one "/" between them however base ends. NULL only when out of memory. */
char *cdp_path_join(const char *base, const char *rel);

#ifdef __cplusplus
}
#endif

#endif
