/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file optim_json.h
 * @brief DeepSpeed-style JSON configuration for the offload optimizer engine.
 *
 * A DeepSpeed config file is accepted as it is: the keys that mean the same
 * thing for zoffload set the matching ::zo_optim_config field (the mapping
 * is in docs/optim.md and beside each field in optim.h), DeepSpeed keys that
 * have no meaning here (train_batch_size, zero_optimization.stage,
 * overlap_comm, ...) are accepted and listed as unused, and our own keys
 * live in a `"zoffload"` section. Unlike DeepSpeed, which silently ignores a
 * misspelt key, an unknown key is an error naming the key and the closest
 * known one ("unknown key zero_optimization.offload_optimzer (did you mean
 * offload_optimizer?)"). Values of the wrong type or out of range are errors
 * naming the key.
 *
 * `"auto"` is accepted wherever DeepSpeed (or the Hugging Face integration)
 * accepts it; zo_optim_json_apply() resolves it from this machine (memory,
 * memlock limit) or from the defaults, and records each resolution in the
 * report (zo_optim_json_report()) and in the log at info level.
 *
 * Thread safety: a zo_optim_json is immutable after parsing except for its
 * report, written by zo_optim_json_apply(): do not apply one handle from two
 * threads at once. Nothing here blocks except zo_optim_json_load() (reads a file).
 */
#ifndef ZOFFLOAD_OPTIM_JSON_H
#define ZOFFLOAD_OPTIM_JSON_H

#include "common.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_optim_json zo_optim_json;

/**
 * Parse and validate a JSON config (text need not be NUL-terminated; len
 * bytes are read). Every key is checked now; machine-dependent `"auto"`
 * values are resolved later by zo_optim_json_apply().
 * @return 0; -EINVAL (NULL out or text); ZO_EFORMAT (not JSON, or the top
 *         level is not an object; the detail gives the position); ZO_ECONFIG
 *         (unknown key, wrong type, value out of range, conflicting keys such
 *         as fp16 and bf16 both enabled; the detail names the key and, for an
 *         unknown one, the closest known key); ZO_ENOTSUP (an optimizer type
 *         or feature zoffload does not have, e.g. "OneBitAdam", amsgrad, or a
 *         build without cJSON); -ENOMEM.
 */
ZO_API int zo_optim_json_parse(const char *text, size_t len, zo_optim_json **out);

/**
 * zo_optim_json_parse() on the contents of a file (at most 16 MiB; a FIFO
 * or a directory is refused).
 * @return as zo_optim_json_parse(); -errno of open/read (-ENOENT...);
 *         -EFBIG (over 16 MiB).
 */
ZO_API int zo_optim_json_load(const char *path, zo_optim_json **out);

/** Free a parsed config. NULL (or *j NULL) ok; clears *j. A config applied
 *  with zo_optim_json_apply() points into it (nvme_path): keep it alive
 *  until zo_optim_create() has returned. */
ZO_API void zo_optim_json_free(zo_optim_json **j);

/**
 * Set the fields of *cfg that the JSON names, resolving "auto"; fields it
 * does not name keep their value (so call zo_optim_config_default() first,
 * then set dev and the groups, before or after). `group`, if not NULL,
 * receives the group-level keys (zoffload.state_dtype) for the caller's
 * groups to copy. String fields point into j.
 * @return 0; -EINVAL (NULL j or cfg, cfg struct_size); ZO_ECONFIG (a value
 *         that contradicts the config, e.g. NVMe placement with neither
 *         nvme_path in the JSON nor in cfg).
 */
ZO_API int zo_optim_json_apply(zo_optim_json *j, zo_optim_config *cfg, zo_optim_group *group);

/**
 * What the last zo_optim_json_apply() did, one line per item: each "auto"
 * resolved ("auto: zero_optimization.sub_group_size = 16777216 (4 buffers
 * of 12 B/element in the 768 MiB pinned budget)") and each DeepSpeed key
 * accepted but not used ("unused: train_batch_size"). Valid until the next
 * apply or free. "" before any apply; never NULL for a valid j.
 */
ZO_API const char *zo_optim_json_report(const zo_optim_json *j);

/**
 * A numeric key of the file that has no engine field (for tools: e.g.
 * "train_micro_batch_size_per_gpu", "steps_per_print"), as a double, by its
 * dotted path. @return 0; -ENOENT (absent or "auto"); ZO_ECONFIG (not a
 * number); -EINVAL (NULL).
 */
ZO_API int zo_optim_json_number(const zo_optim_json *j, const char *path, double *out);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_OPTIM_JSON_H */
