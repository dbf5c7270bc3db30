/* The Hugging Face GPT-2 name table (model/hf_gpt2.h). */
#include "model/hf_gpt2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

#define PREFIX "transformer."

/* Every parameter of a GPT, ours and theirs. The names inside a block and
 * the head are the same on both sides; the embedding's and the head's
 * weight differ, and lm_head.weight never takes the prefix. */
static const struct hf_name {
    enum cdp_hf_part part;
    const char *ours, *hf;
    int conv1d;   /* stored in x out by Hugging Face */
    int prefixed; /* under "transformer." in a GPT2LMHeadModel file */
} names[] = {
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
#define N_NAMES (sizeof names / sizeof names[0])

int cdp_hf_gpt2_name(enum cdp_hf_part part, int block, const char *param, const char *prefix, char *out, size_t cap,
                     int *conv1d)
{
    for (size_t i = 0; i < N_NAMES; i++) {
        const struct hf_name *n = &names[i];
        if (n->part != part || strcmp(n->ours, param)) continue;
        const char *pre = n->prefixed ? prefix : "";
        int w = part == CDP_HF_BLOCK ? snprintf(out, cap, "%sh.%d.%s", pre, block, n->hf)
                                     : snprintf(out, cap, "%s%s", pre, n->hf);
        if (w < 0 || (size_t)w >= cap) return 0;
        *conv1d = n->conv1d;
        return 1;
    }
    return 0;
}

/* "h.<digits>." at s: the block index and where the rest starts; NULL when not. */
static const char *block_of(const char *s, int *block)
{
    if (strncmp(s, "h.", 2) || s[2] < '0' || s[2] > '9') return NULL;
    char *end;
    long b = strtol(s + 2, &end, 10);
    if (*end != '.' || b > 1 << 24 || (s[2] == '0' && end != s + 3)) return NULL;
    *block = (int)b;
    return end + 1;
}

int cdp_hf_gpt2_parse(const char *name, enum cdp_hf_part *part, int *block, const char **param, int *conv1d)
{
    const int prefixed = !strncmp(name, PREFIX, strlen(PREFIX));
    const char *s = prefixed ? name + strlen(PREFIX) : name;
    int b = 0;
    const char *rest = block_of(s, &b);
    for (size_t i = 0; i < N_NAMES; i++) {
        const struct hf_name *n = &names[i];
        if (prefixed && !n->prefixed) continue;
        if (n->part == CDP_HF_BLOCK ? !rest || strcmp(rest, n->hf) : rest || strcmp(s, n->hf)) continue;
        *part = n->part;
        *block = n->part == CDP_HF_BLOCK ? b : 0;
        *param = n->ours;
        *conv1d = n->conv1d;
        return 1;
    }
    return 0;
}

int cdp_hf_gpt2_is_buffer(const char *name, int *block)
{
    const char *s = strncmp(name, PREFIX, strlen(PREFIX)) ? name : name + strlen(PREFIX);
    const char *rest = block_of(s, block);
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
        if (!cdp_hf_gpt2_parse(name, &part, &block, &param, &conv1d)) continue;
        hf = 1;
        if (!strncmp(name, PREFIX, strlen(PREFIX))) *prefix = PREFIX;
    }
    return hf;
}
