/* Names shared by the plan loader (plan.c) and the plan writers (plan_emit.c), so
 * that what is read and what is written use one spelling. Internal to src/plan. */
#ifndef CDP_PLAN_INTERNAL_H
#define CDP_PLAN_INTERNAL_H

#include "cdp/plan.h"

extern const char *const cdp_plan_model_kind_names[CDP_MODEL_KIND_COUNT];
extern const char *const cdp_plan_loss_names[CDP_LOSS_COUNT + 1];
extern const char *const cdp_plan_unused_tensors_names[CDP_UNUSED_COUNT + 1];
extern const char *const cdp_plan_activation_names[CDP_ACT_COUNT + 1];
extern const char *const cdp_plan_source_names[CDP_DATA_SOURCE_COUNT + 1];
extern const char *const cdp_plan_order_names[CDP_DATA_ORDER_COUNT + 1];
extern const char *const cdp_plan_optimizer_names[CDP_OPT_TYPE_COUNT + 1];
extern const char *const cdp_plan_param_group_names[CDP_PARAM_GROUP_COUNT + 1];
extern const char *const cdp_plan_lr_schedule_names[CDP_LR_SCHEDULE_COUNT + 1];
extern const char *const cdp_plan_recompute_names[CDP_RECOMPUTE_COUNT + 2];
extern const char *const cdp_plan_precision_names[CDP_PRECISION_COUNT + 1];
/* Placement strings; CDP_PLACEMENT_EXPLICIT has no string (it is an array). */
extern const char *const cdp_plan_placement_names[CDP_PLACEMENT_KIND_COUNT];

#endif
