/* The plan's C form: one JSON file describing the model, its data, the
 * training run, the parallel layout and the machine (docs/plan.md), after
 * loading: plain structs and enums with every default filled in, and no
 * functions. Every layer may use these types; loading a plan is cdp/plan.h. */
#ifndef CDP_PLAN_TYPES_H
#define CDP_PLAN_TYPES_H

#include <stdint.h>
#include <stdio.h>

#include "cdp/core.h"
#include "cdp/layer_types.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An integer field the plan left as "auto": the planner chooses it. */
#define CDP_AUTO (-1)
/* /parallel/bucket_mb's default: a bucket holds whole units up to 1 MiB (a
 * larger unit is a bucket of its own), so GPT-2 124M's blocks (28 MiB) and
 * the CPU examples' (0.8 MiB) each reduce on their own while the units
 * before them run backward, and many small units share one reduction */
#define CDP_PLAN_BUCKET_MB_DEFAULT 1.0

enum cdp_model_kind {
    CDP_MODEL_GPT = 0, /* a decoder-only language model of one of the families of enum cdp_model_arch:
                        * presets "gpt", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama" */
    CDP_MODEL_MLP,     /* preset "mlp", expanded into layers[] at load */
    CDP_MODEL_CNN,     /* preset "cnn", expanded into layers[] at load */
    CDP_MODEL_LAYERS,  /* an explicit layer list */
    CDP_MODEL_KIND_COUNT
};

/* The layer types (cdp/layer_types.h lists them). */
enum cdp_layer_type {
#define CDP_LAYER_ENUM_(NAME, name) CDP_LAYER_##NAME,
    CDP_LAYER_TYPES(CDP_LAYER_ENUM_)
#undef CDP_LAYER_ENUM_
    CDP_LAYER_TYPE_COUNT
};

/* The largest size or count a plan may give (keeps every product of two below 2^63). */
#define CDP_PLAN_MAX_COUNT INT32_MAX
/* /train/eval_batches at most (docs/plan.md) */
#define CDP_PLAN_MAX_EVAL_BATCHES 100000
/* The longest sequence a model takes (/model/context, an embedding's
 * context): 2^20 tokens; a T x T attention state beyond it is past any device. */
#define CDP_PLAN_MAX_CONTEXT (1 << 20)

/* The most micro-batches one replica may run in a step (/parallel/micro_batches,
 * or what /train/global_batch gives it; the schedule lists every one). */
#define CDP_PLAN_MAX_MICRO_BATCHES (1 << 12)

/* The largest tensor group a plan may give (/parallel/tensor). */
#define CDP_PLAN_MAX_TENSOR_GROUP 1024

/* The most restarts in a row /train/restart/max may allow. */
#define CDP_RESTART_MAX 100

/* The most elements one tensor may hold: a parameter, or one micro-batch's
 * input or output of a layer (2^40, 4 TiB of fp32; the largest of a
 * trillion-parameter model is under 2^36). With it (and the context limit)
 * every unit's sizes fit 64 bits; memory sums saturate (cdp_sat_add). */
#define CDP_PLAN_MAX_TENSOR ((int64_t)1 << 40)
/* The most parameters a model may have in all (2^44, 17.6 trillion). */
#define CDP_PLAN_MAX_PARAMS ((int64_t)1 << 44)

/* Rotary position embeddings (docs/models.md): the frequencies of a head of
 * HD dimensions are theta^(-2i/HD), i < HD/2, rescaled as Llama 3 does when
 * factor > 0 (Hugging Face's rope_type "llama3"); kernels/rope.h computes them. */
struct cdp_rope {
    double theta;            /* base, 10000 for Llama 2, 500000 for Llama 3 */
    double factor;           /* llama3 scaling: 0 = none */
    double low_freq_factor;  /* llama3 scaling */
    double high_freq_factor; /* llama3 scaling */
    int64_t original_context; /* llama3 scaling: the context the model was trained at */
};

/* One layer of an explicit list; only the fields of its type are meaningful. */
/* How a linear layer splits over a tensor group of t ranks (docs/parallelism.md). */
enum cdp_tensor_split {
    CDP_TSPLIT_NONE = 0, /* replicated: every rank holds all of it */
    CDP_TSPLIT_COLUMN,   /* rank k holds output rows [k out/t, (k+1) out/t) of W and the bias; its output is that slice */
    CDP_TSPLIT_ROW,      /* rank k holds the matching input columns of W and the whole bias; the output is summed */
    CDP_TSPLIT_COUNT
};

struct cdp_layer_desc {
    enum cdp_layer_type type;
    int64_t out;     /* linear: output features; conv2d: output channels */
    int bias;        /* linear, conv2d: 1 when the layer has a bias */
    int64_t kernel;  /* conv2d, maxpool2d: square kernel size */
    int64_t stride;  /* conv2d, maxpool2d */
    int64_t padding; /* conv2d */
    int64_t vocab;   /* embedding: token vocabulary */
    int64_t dim;     /* embedding: embedding width */
    int64_t context; /* embedding: learned positions (0 = none) */
    int64_t heads;   /* attention, transformer_block */
    int causal;      /* attention */
    double eps;      /* layernorm, rmsnorm, llama_block */
    int64_t kv_heads; /* rotary_attention, llama_block: key/value heads (grouped-query), dividing heads */
    int64_t hidden;   /* swiglu_mlp, llama_block: the MLP's width */
    struct cdp_rope rope; /* rotary_attention, llama_block */
    int rms;          /* lm_head: an RMS norm (Llama) rather than a layernorm (GPT-2) */
    enum cdp_tensor_split split; /* linear: how it splits over /parallel/tensor (docs/parallelism.md) */
};

/* The families of decoder-only language models (kind CDP_MODEL_GPT). */
enum cdp_model_arch {
    CDP_ARCH_GPT2 = 0, /* learned positions, layernorm, GELU MLP, biases */
    CDP_ARCH_LLAMA,    /* rotary positions, RMS norm, SwiGLU MLP, grouped-query attention, no biases */
    CDP_ARCH_COUNT
};

enum cdp_loss { CDP_LOSS_CROSS_ENTROPY = 0, CDP_LOSS_MSE, CDP_LOSS_COUNT };
enum cdp_activation { CDP_ACT_RELU = 0, CDP_ACT_GELU, CDP_ACT_COUNT };

#define CDP_MAX_INPUT_DIMS 4

/* What a weights file's tensors that the model does not use are: an error
 * (the default) or a warning (cdp_model_check_weights). */
enum cdp_unused_tensors { CDP_UNUSED_ERROR = 0, CDP_UNUSED_WARN, CDP_UNUSED_COUNT };

struct cdp_model_desc {
    enum cdp_model_kind kind;
    char preset[32]; /* as resolved: "gpt2-medium", "mlp", ...; "" for an explicit list */

    /* GPT family (kind == CDP_MODEL_GPT); embed is a llama plan's "dim" */
    enum cdp_model_arch arch;
    int64_t vocab, context, layers, heads, embed;
    int tie_embeddings;
    /* /parallel/sequence_parallel (the plan loader copies it here): the units
     * run sequence parallel at t > 1 */
    int seq_parallel;
    /* arch CDP_ARCH_LLAMA (docs/models.md) */
    int64_t kv_heads;          /* key/value heads, dividing heads */
    int64_t ffn_hidden;        /* the MLP's width, as given or from the rule below */
    int64_t multiple_of;       /* the rule's rounding, when hidden was not given (0: given) */
    double ffn_dim_multiplier; /* the rule's multiplier (0: none) */
    double norm_eps;           /* the RMS norms' epsilon */
    struct cdp_rope rope;

    /* mlp, cnn and explicit lists */
    int64_t input[CDP_MAX_INPUT_DIMS]; /* input shape of one sample */
    int input_ndim;
    int64_t *hidden; /* mlp: hidden widths (owned) */
    int n_hidden;
    int64_t *channels; /* cnn: channels of each conv block (owned) */
    int n_channels;
    int64_t classes; /* mlp, cnn */
    enum cdp_activation activation; /* mlp */
    struct cdp_layer_desc *layer_list; /* mlp, cnn (expanded) and explicit (owned) */
    int n_layers;
    enum cdp_loss loss;
    char *weights; /* initial weights (safetensors, ours or Hugging Face GPT-2); NULL = random (owned) */
    enum cdp_unused_tensors unused_tensors; /* tensors of the weights file the model does not use */
};

enum cdp_data_source {
    CDP_DATA_SYNTHETIC = 0,
    CDP_DATA_TEXT,
    CDP_DATA_TOKENS,
    CDP_DATA_IDX,
    CDP_DATA_SOURCE_COUNT
};

/* The order file sources are read in (docs/training.md#data-order): a seeded
 * permutation of every sample per epoch, or the file's own order (token
 * sources: consecutive non-overlapping windows, as llm.c's loader reads). */
enum cdp_data_order { CDP_DATA_ORDER_SHUFFLE = 0, CDP_DATA_ORDER_SEQUENTIAL, CDP_DATA_ORDER_COUNT };

struct cdp_data_desc {
    enum cdp_data_source source;
    char *path;   /* text, tokens: the first file; idx: the images file (absolute, owned) */
    char *labels; /* idx: the labels file (absolute, owned); else NULL */
    uint64_t seed;
    enum cdp_data_order order;
    /* text, tokens: every file of data.path in order (a list, globs expanded and
     * sorted), read as one token stream; n_paths 0 means path alone (owned) */
    char **paths;
    int n_paths;
    /* text, tokens: data.val_path's files, the validation split; n_val_paths 0:
     * the last 10% of data.path's tokens are validation (owned) */
    char **val_paths;
    int n_val_paths;
};

enum cdp_optimizer_type { CDP_OPT_SGD = 0, CDP_OPT_ADAMW, CDP_OPT_TYPE_COUNT };

/* What a parameter tensor is, for weight decay (/train/optimizer/no_decay):
 * the matrices (and kernels) of linear, attention, convolution and untied
 * output layers; the token and position embeddings (a tied output layer is
 * the embedding); biases; the gains and shifts of normalisation layers. */
enum cdp_param_group {
    CDP_PARAM_WEIGHT = 0,
    CDP_PARAM_EMBEDDING,
    CDP_PARAM_BIAS,
    CDP_PARAM_NORM,
    CDP_PARAM_GROUP_COUNT
};
#define CDP_PARAM_GROUP_BIT(g) (1u << (g))
/* The plan's default no_decay: embeddings, biases and norms are not decayed;
 * only the weight matrices are. */
#define CDP_NO_DECAY_DEFAULT                                                                               \
    (CDP_PARAM_GROUP_BIT(CDP_PARAM_EMBEDDING) | CDP_PARAM_GROUP_BIT(CDP_PARAM_BIAS) |                    \
     CDP_PARAM_GROUP_BIT(CDP_PARAM_NORM))

struct cdp_optimizer_desc {
    enum cdp_optimizer_type type;
    double lr;
    double weight_decay;
    /* the groups weight decay skips: CDP_PARAM_GROUP_BIT()s; 0 decays every
     * tensor (a plan's default is CDP_NO_DECAY_DEFAULT) */
    unsigned no_decay;
    double momentum;      /* sgd */
    double beta1, beta2;  /* adamw */
    double eps;           /* adamw */
};

enum cdp_precision { CDP_PRECISION_FP32 = 0, CDP_PRECISION_BF16, CDP_PRECISION_COUNT };

/* Activation recomputation (docs/training.md): what a unit keeps from its
 * forward for its backward, and what it computes again. */
enum cdp_recompute {
    CDP_RECOMPUTE_NONE = 0,  /* every activation the backward reads is kept */
    CDP_RECOMPUTE_SELECTIVE, /* the large ones cheap to recompute are dropped (per layer type) */
    CDP_RECOMPUTE_FULL,      /* only each unit's output is kept; its forward runs again before its backward */
    CDP_RECOMPUTE_COUNT
};

/* The learning rate over the steps (/train/lr_schedule, docs/training.md):
 * a linear warmup from 0 to /train/optimizer/lr over warmup_steps, then
 * constant, a cosine or linear decay to min_lr at the last step, or
 * warmup-stable-decay (constant, then a linear decay to min_lr over the last
 * decay_steps). cdp_lr_at (model/optim.h) computes it. */
enum cdp_lr_schedule_kind { CDP_LR_CONSTANT = 0, CDP_LR_COSINE, CDP_LR_LINEAR, CDP_LR_WSD, CDP_LR_SCHEDULE_COUNT };

struct cdp_lr_schedule_desc {
    enum cdp_lr_schedule_kind type;
    int64_t warmup_steps; /* 0 = none */
    double min_lr;        /* the rate at the last step (cosine, linear, wsd) */
    int64_t decay_steps;  /* wsd: the steps of the decay, ending at the last step */
};

struct cdp_checkpoint_desc {
    char *dir;     /* absolute; NULL = no checkpoints (owned) */
    int64_t every; /* steps between checkpoints */
    int64_t keep;  /* how many to keep */
};

/* What the launcher does when a job fails (docs/checkpoints.md, "Restarts"):
 * max 0 = off; else at most max restarts in a row that fail at the same step. */
struct cdp_restart_desc {
    int64_t max;        /* 0: no restart */
    int exclude_failed; /* 1: re-plan without the failed devices; 0: the same layout again */
};

struct cdp_train_desc {
    int64_t steps;
    int64_t global_batch; /* = replicas * micro_batches * micro_batch; CDP_AUTO until known */
    int64_t micro_batch;  /* samples per micro-batch */
    struct cdp_optimizer_desc optimizer;
    struct cdp_lr_schedule_desc lr_schedule;
    double grad_clip; /* global-norm clipping threshold; 0 = off */
    enum cdp_precision precision;
    enum cdp_recompute recompute; /* meaningful once recompute_auto is 0 */
    int recompute_auto;           /* "auto" (the default): the planner chooses, the cheapest that fits */
    uint64_t seed;
    int64_t log_every;
    int64_t eval_every;   /* validation loss every N steps; 0 = only after the last step */
    int64_t eval_batches; /* micro-batches of validation data per evaluation */
    double timeout_s;     /* deadline of every wait between ranks */
    struct cdp_checkpoint_desc checkpoint;
    struct cdp_restart_desc restart;
};

enum cdp_schedule_kind {
    CDP_SCHEDULE_GPIPE = 0,
    CDP_SCHEDULE_1F1B,
    CDP_SCHEDULE_INTERLEAVED,
    CDP_SCHEDULE_ZB_H1, /* zero bubble (Qi et al. 2024), split backward: pipeline/schedule.h */
    CDP_SCHEDULE_ZB_H2,
    CDP_SCHEDULE_ZBV,   /* two chunks per rank in a V */
    CDP_SCHEDULE_COUNT
};

enum cdp_placement_kind {
    CDP_PLACEMENT_TOPOLOGY = 0,     /* chosen by the planner from the topology */
    CDP_PLACEMENT_ORDERED_PP_INNER, /* stages of a pipeline on consecutive devices */
    CDP_PLACEMENT_ORDERED_DP_INNER, /* replicas of a stage on consecutive devices */
    CDP_PLACEMENT_EXPLICIT,         /* placement[stage * replicas + replica] */
    CDP_PLACEMENT_KIND_COUNT
};

/* How a global batch's micro-batches are shared among the replicas. */
enum cdp_balance_kind {
    CDP_BALANCE_SPEED = 0, /* in proportion to each replica's speed (equal devices: equal shares) */
    CDP_BALANCE_UNIFORM,   /* micro_batches each */
    CDP_BALANCE_EXPLICIT,  /* the plan's list */
    CDP_BALANCE_KIND_COUNT
};

struct cdp_parallel_desc {
    int64_t stages;        /* or CDP_AUTO */
    int64_t replicas;      /* or CDP_AUTO */
    int64_t tensor;        /* t: ranks per stage and replica (its tensor group), or CDP_AUTO (the planner's;
                            * until it searches t, "auto" plans t = 1) */
    int sequence_parallel; /* norms and residual on sequence shards of the tensor group (docs/parallelism.md);
                            * with tensor "auto": at every t above 1 the planner tries */
    int sequence_parallel_auto; /* "auto": the planner plans each t with and without it (sequence_parallel
                                 * 0 until then) */
    /* /parallel/comm_dtype (docs/parallelism.md): 1 where bf16 travels, 0
     * fp32 (the default): the tensor group's collectives (its all-reduces,
     * and sequence parallelism's reduce-scatter and all-gather), and the
     * data-parallel gradient reduction (all-reduce, or ZeRO's reduce-scatter) */
    int comm_bf16_tensor, comm_bf16_gradients;
    int64_t micro_batches; /* per replica per step, or CDP_AUTO */
    enum cdp_schedule_kind schedule;
    int schedule_auto;     /* "auto": the planner chooses the kind (schedule holds 1f1b until then) */
    char *schedule_file;   /* a schedule from a file (absolute path; owned), or NULL; schedule then holds
                            * the kind whose placement of virtual stages it uses */
    int64_t file_stages, file_chunks, file_micro_batches; /* a JSON schedule file's shape; 0: CSV */
    int64_t chunks;        /* model chunks per rank (interleaved); 1 otherwise */
    int64_t (*partition)[2]; /* [first, end) unit ranges per stage; NULL = auto (owned) */
    int n_partition;
    enum cdp_placement_kind placement;
    int64_t *placement_map; /* CDP_PLACEMENT_EXPLICIT: stages*replicas device indices (owned) */
    enum cdp_balance_kind balance;
    int64_t *shares;        /* CDP_BALANCE_EXPLICIT: micro-batches of each replica, summing to
                               replicas x micro_batches (owned) */
    int n_shares;
    int64_t rebalance_every; /* re-measure and move micro-batches every N steps; 0 = never */
    /* gradient buckets of the data-parallel reduction, MiB: each reduces as
     * soon as the step's last backward has produced it; 0 = one reduction
     * after the last backward (no overlap) */
    double bucket_mb;
    int64_t zero;            /* sharded state within each stage's replicas: 0 (none), 1 (ZeRO-1: the
                              * optimizer state R ways), 2 (ZeRO-2: the gradients too), or CDP_AUTO:
                              * the planner's */
};

struct cdp_cluster_desc {
    enum cdp_backend backend; /* meaningful once backend_auto is 0 */
    int backend_auto;         /* "auto": cdp_plan_resolve chooses cuda when GPUs are usable, else cpu */
    char *topology;           /* "auto", a preset or "N x preset" as written, or an absolute path (owned) */
    int64_t nodes;
    int64_t devices;          /* per node, or CDP_AUTO */
    uint64_t device_memory;   /* per device cap in bytes; 0 = the device's own */
    uint64_t host_memory;     /* host memory a node's ranks may use together; 0 = what the host has free */
    int64_t ranks_per_device; /* ranks that share one device (1; more to test a pipeline on one GPU) */
    int nodes_given;          /* /cluster/nodes is in the file (else 1; the command line makes it a Slurm
                                 allocation's nodes) */
};

struct cdp_output_desc {
    char *metrics;  /* absolute paths, NULL = not written (owned) */
    char *trace;
    char *timeline;
    char *weights;  /* the trained weights, as safetensors */
    char *tensorboard; /* a folder for TensorBoard event files (docs/training.md#tensorboard) */
};

struct cdp_plan {
    char *source;  /* the plan file as named by the user, for messages (owned) */
    struct cdp_model_desc model;
    struct cdp_data_desc data;
    struct cdp_train_desc train;
    struct cdp_parallel_desc parallel;
    struct cdp_cluster_desc cluster;
    struct cdp_output_desc output;
};

#ifdef __cplusplus
}
#endif

#endif
