/* The Hugging Face GPT-2 name table (model/hf_gpt2.h). */
#include "model/hf_gpt2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

/* Every parameter of a family, ours and theirs. The names inside a block are
 * the same on both sides; the embedding's differ, and lm_head.weight never
 * takes the prefix. */
struct hf_name {
    enum cdp_hf_part part;
    const char *ours, *hf;
    int conv1d;   /* stored in x out by Hugging Face */
    int prefixed; /* under the family's prefix in a *ForCausalLM / *LMHeadModel file */
};

static const struct hf_name gpt2_names[] = {
    {CDP_HF_EMBED, "wte", "wte.weight", 0, 1},
    {CDP_HF_EMBED, "wpe", "wpe.weight", 0, 1},
    {CDP_HF_BLOCK, "ln_1.weight", "ln_1.weight", 0, 1},
    {CDP_HF_BLOCK, "ln_1.bias", "ln_1.bias", 0, 1},
    {CDP_HF_BLOCK, "attn.c_attn.weight", "attn.c_attn.weight", 1, 1},
    {CDP_HF_BLOCK, "attn.c_attn.bias", "attn.c_attn.bias", 0, 1},
    {CDP_HF_BLOCK, "attn.c_proj.weight", "attn.c_proj.weight", 1, 1},
    {CDP_HF_BLOCK, "attn.c_proj.bias", "attn.c_proj.bias", 0, 1},
    {CDP_HF_BLOCK, "ln_2.weight", "ln_2.weight", 0, 1},
    {CDP_HF_BLOCK, "ln_2.bias", "ln_2.bias", 0, 1},
    {CDP_HF_BLOCK, "mlp.c_fc.weight", "mlp.c_fc.weight", 1, 1},
    {CDP_HF_BLOCK, "mlp.c_fc.bias", "mlp.c_fc.bias", 0, 1},
    {CDP_HF_BLOCK, "mlp.c_proj.weight", "mlp.c_proj.weight", 1, 1},
    {CDP_HF_BLOCK, "mlp.c_proj.bias", "mlp.c_proj.bias", 0, 1},
    {CDP_HF_HEAD, "ln_f.weight", "ln_f.weight", 0, 1},
    {CDP_HF_HEAD, "ln_f.bias", "ln_f.bias", 0, 1},
    {CDP_HF_HEAD, "lm_head.weight", "lm_head.weight", 0, 0},
};

static const struct hf_name llama_names[] = {
    {CDP_HF_EMBED, "wte", "embed_tokens.weight", 0, 1},
    {CDP_HF_BLOCK, "input_layernorm.weight", "input_layernorm.weight", 0, 1},
    {CDP_HF_BLOCK, "self_attn.q_proj.weight", "self_attn.q_proj.weight", 0, 1},
    {CDP_HF_BLOCK, "self_attn.k_proj.weight", "self_attn.k_proj.weight", 0, 1},
    {CDP_HF_BLOCK, "self_attn.v_proj.weight", "self_attn.v_proj.weight", 0, 1},
    {CDP_HF_BLOCK, "self_attn.o_proj.weight", "self_attn.o_proj.weight", 0, 1},
    {CDP_HF_BLOCK, "post_attention_layernorm.weight", "post_attention_layernorm.weight", 0, 1},
    {CDP_HF_BLOCK, "mlp.gate_proj.weight", "mlp.gate_proj.weight", 0, 1},
    {CDP_HF_BLOCK, "mlp.up_proj.weight", "mlp.up_proj.weight", 0, 1},
    {CDP_HF_BLOCK, "mlp.down_proj.weight", "mlp.down_proj.weight", 0, 1},
    {CDP_HF_HEAD, "norm.weight", "norm.weight", 0, 1},
    {CDP_HF_HEAD, "lm_head.weight", "lm_head.weight", 0, 0},
};

/* A family: the prefix of its *ForCausalLM files, its blocks' names, whether
 * a file without the prefix (GPT2Model's) is read as it (not Llama's: a bare
 * LlamaModel's "layers.N." would read as our own names). */
static const struct family {
    const char *prefix, *block;
    const struct hf_name *names;
    size_t n;
    int bare;
} families[] = {
    {"transformer.", "h.", gpt2_names, sizeof gpt2_names / sizeof gpt2_names[0], 1},
    {"model.", "layers.", llama_names, sizeof llama_names / sizeof llama_names[0], 0},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

/* The family of a prefix: Llama's "model.", else GPT-2's ("transformer." or ""). */
static const struct family *family_of(const char *prefix)
{
    return !strcmp(prefix, families[1].prefix) ? &families[1] : &families[0];
}

const char *cdp_hf_prefix(enum cdp_model_arch arch)
{
    switch (arch) {
    case CDP_ARCH_GPT2: return families[0].prefix;
    case CDP_ARCH_LLAMA: return families[1].prefix;
    case CDP_ARCH_COUNT: break;
    }
    return families[0].prefix;
}

int cdp_hf_gpt2_name(enum cdp_hf_part part, int block, const char *param, const char *prefix, char *out, size_t cap,
                     int *conv1d)
{
    const struct family *fam = family_of(prefix);
    for (size_t i = 0; i < fam->n; i++) {
        const struct hf_name *n = &fam->names[i];
        if (n->part != part || strcmp(n->ours, param)) continue;
        const char *pre = n->prefixed ? prefix : "";
        int w = part == CDP_HF_BLOCK ? snprintf(out, cap, "%s%s%d.%s", pre, fam->block, block, n->hf)
                                     : snprintf(out, cap, "%s%s", pre, n->hf);
        if (w < 0 || (size_t)w >= cap) return 0;
        *conv1d = n->conv1d;
        return 1;
    }
    return 0;
}

/* "<block><digits>." at s: the block index and where the rest starts; NULL when not. */
static const char *block_of(const char *s, const char *blk, int *block)
{
    const size_t k = strlen(blk);
    if (strncmp(s, blk, k) || s[k] < '0' || s[k] > '9') return NULL;
    char *end;
    long b = strtol(s + k, &end, 10);
    if (*end != '.' || b > 1 << 24 || (s[k] == '0' && end != s + k + 1)) return NULL;
    *block = (int)b;
    return end + 1;
}

/* parse within one family; 1 when name is one of its parameters. */
static int parse_in(const struct family *fam, const char *name, enum cdp_hf_part *part, int *block,
                    const char **param, int *conv1d)
{
    const size_t k = strlen(fam->prefix);
    const int prefixed = !strncmp(name, fam->prefix, k);
    const char *s = prefixed ? name + k : name;
    int b = 0;
    const char *rest = block_of(s, fam->block, &b);
    for (size_t i = 0; i < fam->n; i++) {
        const struct hf_name *n = &fam->names[i];
        if (prefixed && !n->prefixed) continue;
        if (!prefixed && n->prefixed && !fam->bare) continue;
        if (n->part == CDP_HF_BLOCK ? !rest || strcmp(rest, n->hf) : rest || strcmp(s, n->hf)) continue;
        *part = n->part;
        *block = n->part == CDP_HF_BLOCK ? b : 0;
        *param = n->ours;
        *conv1d = n->conv1d;
        return 1;
    }
    return 0;
}

int cdp_hf_gpt2_parse(const char *name, enum cdp_hf_part *part, int *block, const char **param, int *conv1d)
{
    for (size_t f = 0; f < N_FAMILIES; f++)
        if (parse_in(&families[f], name, part, block, param, conv1d)) return 1;
    return 0;
}

int cdp_hf_gpt2_is_buffer(const char *name, int *block)
{
    const char *pre = families[0].prefix;
    const char *s = strncmp(name, pre, strlen(pre)) ? name : name + strlen(pre);
    const char *rest = block_of(s, families[0].block, block);
    return rest && (!strcmp(rest, "attn.bias") || !strcmp(rest, "attn.masked_bias"));
}

int cdp_hf_gpt2_layout(const struct cdp_safetensors_file *f, const char *ours, const char **prefix)
{
    *prefix = "";
    if (ours && cdp_safetensors_find(f, ours)) return 0;
    int hf = 0;
    for (int i = 0; i < cdp_safetensors_count(f); i++) {
        const char *name = cdp_safetensors_at(f, i)->name;
        enum cdp_hf_part part;
        int block, conv1d;
        const char *param;
        for (size_t k = 0; k < N_FAMILIES; k++) {
            if (!parse_in(&families[k], name, &part, &block, &param, &conv1d)) continue;
            hf = 1;
            if (!strncmp(name, families[k].prefix, strlen(families[k].prefix))) *prefix = families[k].prefix;
            break;
        }
    }
    return hf;
}
