/* Every layer type of cdphybrid, in the order of enum cdp_layer_type
 * (cdp/plan_types.h). X(NAME, name): CDP_LAYER_NAME is the enum value, "name"
 * the plan's "type" (and the unit's name in cost tables and messages), and
 * cdp_layer_name the type's description in src/model/layers/name.c, which
 * holds everything about it. Adding a layer type adds one line here and that
 * file (docs/contributing.md). */
#ifndef CDP_LAYER_TYPES_H
#define CDP_LAYER_TYPES_H

#define CDP_LAYER_TYPES(X)                                                                                   \
    X(LINEAR, linear)                                                                                        \
    X(RELU, relu)                                                                                            \
    X(GELU, gelu)                                                                                            \
    X(LAYERNORM, layernorm)                                                                                  \
    X(EMBEDDING, embedding)                                                                                  \
    X(ATTENTION, attention)                 /* qkv projection + attention + output projection */             \
    X(TRANSFORMER_BLOCK, transformer_block) /* GPT-2 pre-LN block */                                         \
    X(CONV2D, conv2d)                                                                                        \
    X(MAXPOOL2D, maxpool2d)                                                                                  \
    X(FLATTEN, flatten)                                                                                      \
    X(LM_HEAD, lm_head)                     /* GPT: final layernorm + vocabulary projection; GPT presets only */ \
    X(SILU, silu)                                                                                            \
    X(RMSNORM, rmsnorm)                                                                                      \
    X(ROTARY_ATTENTION, rotary_attention)   /* q, k, v projections + rotary + grouped-query attention + o */ \
    X(SWIGLU_MLP, swiglu_mlp)               /* gate, up, SiLU(gate) * up, down; no biases */                 \
    X(LLAMA_BLOCK, llama_block)             /* Llama pre-norm block: rmsnorm, rotary attention, SwiGLU */

#endif
