/* Topology specs, as a plan's /cluster/topology and --topology take them:
 * "auto", a preset, "N x preset", "N x a + M x b", or a file. Checking a spec
 * reads no topology (loading one: cdp/topology.h). */
#ifndef CDP_TOPOLOGY_SPEC_H
#define CDP_TOPOLOGY_SPEC_H

#include "cdp/api.h"

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks a spec without reading files: "auto", a preset, "N x preset", or an
 * existing regular file (relative to base_dir). On success *normalized (owned by
 * the caller, may be NULL if not wanted) is the spec to keep: the preset or
 * cluster spec as written, or the file's absolute path. On failure the message
 * says what was tried and, for a name close to a preset, "did you mean". */
CDP_API cdp_status cdp_topology_check_spec(const char *spec, const char *base_dir, char **normalized);

/* Where presets are looked for, in order: $CDP_TOPOLOGY_DIR, the source tree's
 * topologies/ (uninstalled builds), <datadir>/cdphybrid/topologies. *path owned
 * by the caller. CDP_ERR_INVALID with a "did you mean" when not found. */
CDP_API cdp_status cdp_topology_preset_path(const char *name, char **path);

/* The preset names found (sorted, no duplicates), NULL-terminated; free with
 * cdp_topology_preset_names_free. */
CDP_API cdp_status cdp_topology_preset_names(char ***names);
CDP_API void cdp_topology_preset_names_free(char **names);

#ifdef __cplusplus
}
#endif

#endif
