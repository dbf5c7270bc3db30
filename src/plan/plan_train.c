/* The plan's /train: steps and batches, the optimizer and its parameter
 * groups, the learning-rate schedule, checkpoints and restarts. */
#include "cdp/plan.h"
#include "plan/plan_load_internal.h"

#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/path.h"
#include "plan/schedule_header.h"
#include "plan/schedule_kind.h"
#include "cdp/log.h"
#include "cdp/topology_spec.h"
#include "core/json_check.h"
#include "model/hf.h"
#include "model/layer_def.h"
#include "plan/plan_internal.h"

static const char *const train_keys[] = {"steps", "global_batch", "micro_batch", "optimizer", "lr_schedule",
                                         "grad_clip", "precision", "recompute", "seed", "log_every", "eval_every",
                                         "eval_batches", "timeout_s", "checkpoint", "restart", NULL};

static const char *const opt_keys[] = {"type", "lr", "weight_decay", "no_decay", "momentum", "beta1", "beta2",
                                       "eps", NULL};

static const char *const ckpt_keys[] = {"dir", "every", "keep", NULL};

static const char *const restart_keys[] = {"max", "exclude_failed", NULL};

/* /train/restart: null (off) or {"max": N, "exclude_failed": true}; a restart
 * resumes from the last checkpoint, so it needs /train/checkpoint. */
static cdp_status load_restart(struct ld *c, const json_t *r)
{
    struct cdp_train_desc *td = &c->p->train;
    const char *RP = "/train/restart";
    td->restart.max = 0;
    td->restart.exclude_failed = 1;
    if (!r || json_is_null(r)) return CDP_OK;
    if (!json_is_object(r)) return cdp_json_expected(&c->in, RP, "an object or null", r);
    cdp_status st;
    if ((st = cdp_json_check_keys(&c->in, r, RP, restart_keys, RP))) return st;
    if (!json_object_get(r, "max"))
        return cdp_json_fail(&c->in, "/train/restart/max", "missing; how many restarts in a row (1 to %d)",
                             CDP_RESTART_MAX);
    if ((st = cdp_json_get_int(&c->in, r, RP, "max", 1, CDP_RESTART_MAX, 0, &td->restart.max))) return st;
    if ((st = cdp_json_get_bool(&c->in, r, RP, "exclude_failed", &td->restart.exclude_failed))) return st;
    if (!td->checkpoint.dir)
        return cdp_json_fail(&c->in, RP, "needs /train/checkpoint: a restart resumes from the last checkpoint");
    return CDP_OK;
}

/* /train/optimizer/no_decay: the parameter groups weight decay skips, a list
 * of "weight", "embedding", "bias", "norm" (each at most once); [] decays
 * every tensor. */
static cdp_status load_no_decay(struct ld *c, const json_t *v, unsigned *out)
{
    const char *P = "/train/optimizer/no_decay";
    if (!v) return CDP_OK;
    if (!json_is_array(v))
        return cdp_json_expected(&c->in, P, "a list of parameter groups (\"embedding\", \"bias\", \"norm\", "
                                 "\"weight\")", v);
    unsigned mask = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        char kp[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(kp, P, i);
        int g = 0;
        cdp_status st = cdp_json_enum(&c->in, json_array_get(v, i), kp, cdp_plan_param_group_names, &g);
        if (st) return st;
        if (mask & CDP_PARAM_GROUP_BIT(g))
            return cdp_json_fail(&c->in, kp, "\"%s\" is listed twice", cdp_plan_param_group_names[g]);
        mask |= CDP_PARAM_GROUP_BIT(g);
    }
    *out = mask;
    return CDP_OK;
}

/* /train/lr_schedule (after /train/steps and /train/optimizer/lr are known):
 * {"type", "warmup_steps", "min_lr", "decay_steps"}; each key only where its
 * type uses it, and the phases within /train/steps. */
static const char *const lr_schedule_keys[] = {"type", "warmup_steps", "min_lr", "decay_steps", NULL};

static cdp_status load_lr_schedule(struct ld *c, const json_t *v)
{
    struct cdp_train_desc *td = &c->p->train;
    struct cdp_lr_schedule_desc *s = &td->lr_schedule;
    const char *P = "/train/lr_schedule";
    *s = (struct cdp_lr_schedule_desc){.type = CDP_LR_CONSTANT};
    if (!v || json_is_null(v)) return CDP_OK;
    if (!json_is_object(v)) return cdp_json_expected(&c->in, P, "an object or null", v);
    cdp_status st;
    if ((st = cdp_json_check_keys(&c->in, v, P, lr_schedule_keys, P))) return st;
    int t = CDP_LR_CONSTANT;
    if ((st = cdp_json_get_enum(&c->in, v, P, "type", cdp_plan_lr_schedule_names, &t))) return st;
    s->type = (enum cdp_lr_schedule_kind)t;
    const char *tn = cdp_plan_lr_schedule_names[t];
    if (s->type == CDP_LR_CONSTANT && json_object_get(v, "min_lr"))
        return cdp_json_fail(&c->in, "/train/lr_schedule/min_lr",
                             "unknown key for /train/lr_schedule/type \"constant\" (the rate a decay ends at: "
                             "\"cosine\", \"linear\" or \"wsd\")");
    if (s->type != CDP_LR_WSD && json_object_get(v, "decay_steps"))
        return cdp_json_fail(&c->in, "/train/lr_schedule/decay_steps",
                             "unknown key for /train/lr_schedule/type \"%s\" (the length of \"wsd\"'s decay; "
                             "\"%s\" decays from the warmup's end to the last step)", tn, tn);
    if ((st = cdp_json_get_int(&c->in, v, P, "warmup_steps", 0, INT64_MAX, 0, &s->warmup_steps))) return st;
    if (s->warmup_steps > td->steps)
        return cdp_json_fail(&c->in, "/train/lr_schedule/warmup_steps", "%lld is more than /train/steps %lld",
                             (long long)s->warmup_steps, (long long)td->steps);
    if ((st = cdp_json_get_number(&c->in, v, P, "min_lr", CDP_JSON_NONNEG, &s->min_lr))) return st;
    if (s->min_lr > td->optimizer.lr)
        return cdp_json_fail(&c->in, "/train/lr_schedule/min_lr",
                             "%g is above /train/optimizer/lr %g: a decay ends at most at the peak rate", s->min_lr,
                             td->optimizer.lr);
    if ((s->type == CDP_LR_COSINE || s->type == CDP_LR_LINEAR) && s->warmup_steps >= td->steps)
        return cdp_json_fail(&c->in, "/train/lr_schedule/warmup_steps",
                             "%lld leaves no step for the %s decay: expected fewer than /train/steps %lld",
                             (long long)s->warmup_steps, tn, (long long)td->steps);
    if (s->type != CDP_LR_WSD) return CDP_OK;
    if (!json_object_get(v, "decay_steps"))
        return cdp_json_fail(&c->in, "/train/lr_schedule/decay_steps",
                             "missing; \"wsd\" decays over the last decay_steps steps (1 to /train/steps %lld "
                             "minus warmup_steps %lld)", (long long)td->steps, (long long)s->warmup_steps);
    const int64_t room = td->steps - s->warmup_steps;
    if (room < 1)
        return cdp_json_fail(&c->in, "/train/lr_schedule/warmup_steps",
                             "%lld leaves no step for the decay: expected fewer than /train/steps %lld",
                             (long long)s->warmup_steps, (long long)td->steps);
    if ((st = cdp_json_get_int(&c->in, v, P, "decay_steps", 1, INT64_MAX, 0, &s->decay_steps))) return st;
    if (s->decay_steps > room)
        return cdp_json_fail(&c->in, "/train/lr_schedule/decay_steps",
                             "%lld does not fit after warmup_steps %lld within /train/steps %lld: expected at most "
                             "%lld", (long long)s->decay_steps, (long long)s->warmup_steps, (long long)td->steps,
                             (long long)room);
    return CDP_OK;
}

static cdp_status load_optimizer(struct ld *c, const json_t *o)
{
    struct cdp_optimizer_desc *od = &c->p->train.optimizer;
    cdp_status st;
    int t = CDP_OPT_ADAMW;
    const char *P = "/train/optimizer";
    if ((st = cdp_json_need_object(&c->in, o, P))) return st;
    if (o) {
        if ((st = cdp_json_check_keys(&c->in, o, P, opt_keys, "/train/optimizer"))) return st;
        if ((st = cdp_json_get_enum(&c->in, o, P, "type", cdp_plan_optimizer_names, &t))) return st;
    }
    od->type = (enum cdp_optimizer_type)t;
    od->lr = od->type == CDP_OPT_SGD ? 0.01 : 3e-4;
    od->weight_decay = 0;
    od->no_decay = CDP_NO_DECAY_DEFAULT;
    od->momentum = 0.9;
    od->beta1 = 0.9;
    od->beta2 = 0.999;
    od->eps = 1e-8;
    if (!o) return CDP_OK;
    static const char *const sgd_only[] = {"momentum", NULL};
    static const char *const adamw_only[] = {"beta1", "beta2", "eps", NULL};
    const char *const *foreign = od->type == CDP_OPT_SGD ? adamw_only : sgd_only;
    for (int k = 0; foreign[k]; k++) {
        if (json_object_get(o, foreign[k])) {
            char kp[CDP_JSON_PTR_CAP];
            cdp_json_ptr_key(kp, P, foreign[k]);
            return cdp_json_fail(&c->in, kp,
                                 "unknown key for /train/optimizer/type \"%s\" (\"%s\" is a setting of "
                                 "\"%s\")",
                                 cdp_plan_optimizer_names[t], foreign[k], od->type == CDP_OPT_SGD ? "adamw" : "sgd");
        }
    }
    if ((st = cdp_json_get_number(&c->in, o, P, "lr", CDP_JSON_POSITIVE, &od->lr))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "weight_decay", CDP_JSON_NONNEG, &od->weight_decay))) return st;
    if ((st = load_no_decay(c, json_object_get(o, "no_decay"), &od->no_decay))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "momentum", CDP_JSON_UNIT, &od->momentum))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "beta1", CDP_JSON_UNIT, &od->beta1))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "beta2", CDP_JSON_UNIT, &od->beta2))) return st;
    return cdp_json_get_number(&c->in, o, P, "eps", CDP_JSON_POSITIVE, &od->eps);
}

cdp_status cdp_plan_load_train(struct ld *c, const json_t *t)
{
    struct cdp_train_desc *td = &c->p->train;
    cdp_status st;
    int prec = 0;
    const char *P = "/train";
    if ((st = cdp_json_need_object(&c->in, t, P))) return st;
    if (t && (st = cdp_json_check_keys(&c->in, t, P, train_keys, "/train"))) return st;
    if ((st = load_optimizer(c, t ? json_object_get(t, "optimizer") : NULL))) return st;
    if (!t) return CDP_OK;
    if ((st = cdp_json_get_int(&c->in, t, P, "steps", 1, INT64_MAX, 0, &td->steps))) return st;
    if ((st = load_lr_schedule(c, json_object_get(t, "lr_schedule")))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "global_batch", 1, MAX_COUNT, 1, &td->global_batch))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "micro_batch", 1, MAX_COUNT, 0, &td->micro_batch))) return st;
    if ((st = cdp_json_get_number(&c->in, t, P, "grad_clip", CDP_JSON_NONNEG, &td->grad_clip))) return st;
    if ((st = cdp_json_get_enum(&c->in, t, P, "precision", cdp_plan_precision_names, &prec))) return st;
    td->precision = (enum cdp_precision)prec;
    int rc = td->recompute_auto ? CDP_RECOMPUTE_COUNT : (int)td->recompute;
    if ((st = cdp_json_get_enum(&c->in, t, P, "recompute", cdp_plan_recompute_names, &rc))) return st;
    td->recompute_auto = rc == CDP_RECOMPUTE_COUNT;
    td->recompute = td->recompute_auto ? CDP_RECOMPUTE_NONE : (enum cdp_recompute)rc;
    if ((st = cdp_plan_get_seed(c, t, P, &td->seed))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "log_every", 1, INT64_MAX, 0, &td->log_every))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "eval_every", 0, INT64_MAX, 0, &td->eval_every))) return st;
    /* validation is a check of a few micro-batches, the same each time: a
     * count past this is a mistake (it would outlast the training) */
    if ((st = cdp_json_get_int(&c->in, t, P, "eval_batches", 1, CDP_PLAN_MAX_EVAL_BATCHES, 0, &td->eval_batches)))
        return st;
    if ((st = cdp_json_get_number(&c->in, t, P, "timeout_s", CDP_JSON_POSITIVE, &td->timeout_s))) return st;
    const json_t *ck = json_object_get(t, "checkpoint");
    if (!ck || json_is_null(ck)) return load_restart(c, json_object_get(t, "restart"));
    const char *CP = "/train/checkpoint";
    if (!json_is_object(ck)) return cdp_json_expected(&c->in, CP, "an object or null", ck);
    if ((st = cdp_json_check_keys(&c->in, ck, CP, ckpt_keys, "/train/checkpoint"))) return st;
    const json_t *dir = json_object_get(ck, "dir");
    if (!dir) return cdp_json_fail(&c->in, "/train/checkpoint/dir", "missing; checkpoints need a folder");
    if ((st = cdp_json_get_int(&c->in, ck, CP, "every", 1, INT64_MAX, 0, &td->checkpoint.every))) return st;
    if ((st = cdp_json_get_int(&c->in, ck, CP, "keep", 1, INT64_MAX, 0, &td->checkpoint.keep))) return st;
    if ((st = cdp_plan_get_output_path(c, dir, "/train/checkpoint/dir", 1, &td->checkpoint.dir))) return st;
    return load_restart(c, json_object_get(t, "restart"));
}
