/* Models (model.h): weights in and out of safetensors files (ours, and
 * Hugging Face's GPT-2 names), and the check of what a weights file holds
 * that the plan does not use. */
#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "kernels/ops.h"
#include "model/hf_gpt2.h"
#include "model/model_internal.h"
#include "model/safetensors.h"

/* ---- weights in and out ------------------------------------------------------ */

/* The weights are staged through host memory: a copy of the parameters. */
cdp_status cdp_model_save(struct cdp_model *m, const char *path, const char *const *meta, int n_meta)
{
    cdp_status st;
    struct cdp_safetensors_tensor *ts = calloc((size_t)m->n_tensors + 1, sizeof *ts);
    char *host = malloc((size_t)m->param_floats * 4 + 1);
    if (!ts || !host) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory writing %s", path);
        goto done;
    }
    if ((st = cdp_buffer_read(m->params_buf, 0, host, (uint64_t)m->param_floats * 4))) {
        st = cdp_error_context(st, "writing %s", path);
        goto done;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const struct cdp_model_tensor *t = &m->tensors[i];
        ts[i].name = t->name;
        ts[i].dtype = CDP_DTYPE_F32;
        ts[i].dtype_name = "F32";
        ts[i].ndim = t->ndim;
        memcpy(ts[i].shape, t->shape, sizeof t->shape);
        ts[i].data = host + tensor_offset(m, t);
        ts[i].nbytes = (uint64_t)t->numel * 4;
    }
    st = cdp_safetensors_write(path, ts, m->n_tensors, meta, n_meta);
done:
    free(host);
    free(ts);
    return st;
}

/* Which part of a GPT a unit is, by the Hugging Face names (model/hf_gpt2.h):
 * the embedding (unit 0), the head, or a block (*block its 0-based index). */
static enum cdp_hf_part hf_part(const struct cdp_unit *u, int *block)
{
    *block = u->index - 1;
    if (u->index == 0) return CDP_HF_EMBED;
    return u->desc.type == CDP_LAYER_LM_HEAD ? CDP_HF_HEAD : CDP_HF_BLOCK;
}

/* The tensor of file f that holds parameter `param` of unit u: its own name
 * (ours: "layers.N.param", into buf), or in the Hugging Face layout (hf, with
 * prefix) its name there, where a tied head stored once is found under either
 * name: save_pretrained keeps the embedding (wte.weight), safetensors'
 * save_model the head (lm_head.weight). NULL when the file has none; buf
 * names what was looked for. */
static const struct cdp_safetensors_tensor *file_tensor(const struct cdp_safetensors_file *f, int hf,
                                                        const char *prefix, const struct cdp_unit *u,
                                                        const char *param, char *buf, size_t cap, int *conv1d)
{
    *conv1d = 0;
    if (!hf) {
        snprintf(buf, cap, "layers.%d.%s", u->index, param);
        return cdp_safetensors_find(f, buf);
    }
    int block = 0;
    const enum cdp_hf_part part = hf_part(u, &block);
    if (!cdp_hf_gpt2_name(part, block, param, prefix, buf, cap, conv1d)) {
        snprintf(buf, cap, "layers.%d.%s (no Hugging Face GPT-2 name)", u->index, param);
        return NULL;
    }
    const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, buf);
    if (x) return x;
    char other[96];
    int c;
    if (!strcmp(param, "wte")) cdp_hf_gpt2_name(CDP_HF_HEAD, 0, "lm_head.weight", prefix, other, sizeof other, &c);
    else if (!strcmp(param, "lm_head.weight")) cdp_hf_gpt2_name(CDP_HF_EMBED, 0, "wte", prefix, other, sizeof other, &c);
    else return NULL;
    if ((x = cdp_safetensors_find(f, other))) snprintf(buf, cap, "%s", other);
    return x;
}

/* The plan key of an embedding's context: the GPT's, or the layer's. */
static void context_key(enum cdp_model_kind kind, const struct cdp_unit *u, char *buf, size_t cap)
{
    if (kind == CDP_MODEL_GPT) snprintf(buf, cap, "/model/context");
    else snprintf(buf, cap, "/model/layers/%d/context", u->index);
}

/* Each tensor is read into host memory (and transposed there when the file
 * stores it transposed), then copied to the device. Learned positions (wpe)
 * with more rows than the model's context load their first rows. A tensor
 * group's slice (docs/parallelism.md) is read whole and its part kept. */
cdp_status cdp_model_load(struct cdp_model *m, const char *path)
{
    struct cdp_safetensors_file *f = NULL;
    cdp_status st = cdp_safetensors_open(path, &f);
    if (st) return st;
    int64_t most = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct cdp_param_desc *pd = &cdp_model_unit(m, m->tensors[i].unit_local)->params[m->tensors[i].param];
        const int64_t whole = pd->shard_dim < 0 ? m->tensors[i].numel
                                                : m->tensors[i].numel / pd->shape[pd->shard_dim] * pd->shard_full;
        if (whole > most) most = whole;
    }
    float *host = malloc((size_t)most * 4 + 1), *tmp = NULL, *slice = NULL;
    if (!host) {
        cdp_safetensors_close(f);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    }
    const char *prefix = "";
    const int hf = m->n_tensors > 0 && cdp_hf_gpt2_layout(f, m->tensors[0].name, &prefix);
    for (int i = 0; i < m->n_tensors && !st; i++) {
        /* the whole tensor's shape (a slice's, with its split dimension whole) */
        const struct cdp_param_desc *pd = &cdp_model_unit(m, m->tensors[i].unit_local)->params[m->tensors[i].param];
        struct cdp_model_tensor whole = m->tensors[i], *t = &whole;
        if (pd->shard_dim >= 0) {
            whole.numel = whole.numel / pd->shape[pd->shard_dim] * pd->shard_full;
            whole.shape[pd->shard_dim] = pd->shard_full;
        }
        /* the owning unit: a tied copy's owner may lie outside the range */
        struct cdp_unit owner = {.index = t->unit};
        for (int k = 0; k < m->n_units; k++)
            if (m->units[k].index == t->unit) owner = m->units[k];
        if (owner.index == 0) owner.desc.type = CDP_LAYER_EMBEDDING;
        const char *pname = strchr(strchr(t->name, '.') + 1, '.') + 1;
        char name[128];
        int transposed = 0;
        const struct cdp_safetensors_tensor *x =
            file_tensor(f, hf, prefix, &owner, pname, name, sizeof name, &transposed);
        if (!x) {
            st = cdp_safetensors_read_f32(f, name, t->ndim, t->shape, host); /* names what is missing */
        } else if (!strcmp(pname, "wpe") && x->ndim == 2 && t->ndim == 2 && x->shape[1] == t->shape[1] &&
                   x->shape[0] != t->shape[0]) {
            char key[64];
            context_key(m->kind, &owner, key, sizeof key);
            if (x->shape[0] < t->shape[0]) {
                st = cdp_fail(CDP_ERR_INVALID,
                              "%s: tensor %s: %lld learned positions, fewer than the model's context %lld (%s); "
                              "a context of at most %lld can load it",
                              path, name, (long long)x->shape[0], (long long)t->shape[0], key,
                              (long long)x->shape[0]);
            } else {
                st = cdp_safetensors_read_f32_range(f, name, 0, (uint64_t)t->numel, host);
                if (!st)
                    CDP_INFO(CKPT, "%s: tensor %s has %lld positions; using the first %lld (%s %lld)", path, name,
                             (long long)x->shape[0], (long long)t->shape[0], key, (long long)t->shape[0]);
            }
        } else if (!transposed) {
            st = cdp_safetensors_read_f32(f, name, t->ndim, t->shape, host);
        } else {
            int64_t shape[2] = {t->shape[1], t->shape[0]};
            if (!tmp && !(tmp = malloc((size_t)most * 4 + 1))) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
                break;
            }
            st = cdp_safetensors_read_f32(f, name, 2, shape, tmp);
            for (int64_t r = 0; !st && r < shape[0]; r++)
                for (int64_t c = 0; c < shape[1]; c++) host[c * shape[0] + r] = tmp[r * shape[1] + c];
        }
        const float *mine = host;
        if (!st && pd->shard_dim >= 0) {
            if (!slice && !(slice = malloc((size_t)most * 4 + 1))) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
                break;
            }
            cdp_param_slice_copy(pd, host, slice, 0);
            mine = slice;
        }
        if (!st && (st = cdp_buffer_write(m->params_buf, tensor_offset(m, &m->tensors[i]), mine,
                                          (uint64_t)m->tensors[i].numel * 4)))
            st = cdp_error_context(st, "%s: loading %s", path, t->name);
    }
    free(host);
    free(tmp);
    free(slice);
    cdp_safetensors_close(f);
    if (!st)
        CDP_INFO(CKPT, "loaded %d tensors from %s%s", m->n_tensors, path, hf ? " (Hugging Face GPT-2 layout)" : "");
    return st;
}

/* ---- what a weights file holds that the plan does not use ---------------------------- */

/* The tensor's index in f. */
static int tensor_index(const struct cdp_safetensors_file *f, const struct cdp_safetensors_tensor *x)
{
    for (int i = 0; i < cdp_safetensors_count(f); i++)
        if (cdp_safetensors_at(f, i) == x) return i;
    return -1;
}

/* Two tensors with the same dtype, shape and bytes (a tied head stored twice). */
static int same_tensor(const struct cdp_safetensors_tensor *a, const struct cdp_safetensors_tensor *b)
{
    if (strcmp(a->dtype_name, b->dtype_name) || a->ndim != b->ndim || a->nbytes != b->nbytes) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return memcmp(a->data, b->data, (size_t)a->nbytes) == 0;
}

/* Appends to a message buffer. */
static void add(char *buf, size_t cap, const char *fmt, ...) CDP_PRINTF(3, 4);
static void add(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

#define UNUSED_LISTED 4

cdp_status cdp_model_check_weights(const struct cdp_model_desc *desc, const char *path)
{
    struct cdp_unit *all = NULL;
    int n_all = 0;
    cdp_status st = cdp_units_build(desc, &all, &n_all);
    if (st) return st;
    struct cdp_safetensors_file *f = NULL;
    if ((st = cdp_safetensors_open(path, &f))) {
        free(all);
        return st;
    }
    const int nf = cdp_safetensors_count(f);
    char *used = calloc((size_t)nf + 1, 1);
    if (!used) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory checking %s", path);
        goto done;
    }
    /* the layout, decided as cdp_model_load decides it: by our first tensor's name */
    char first[96] = "";
    for (int u = 0; u < n_all && !first[0]; u++)
        if (all[u].n_params) snprintf(first, sizeof first, "layers.%d.%s", all[u].index, all[u].params[0].name);
    const char *prefix = "";
    const int hf = first[0] && cdp_hf_gpt2_layout(f, first, &prefix);
    const struct cdp_safetensors_tensor *wte = NULL, *head = NULL;
    const int gpt = desc->kind == CDP_MODEL_GPT;
    for (int u = 0; u < n_all; u++) {
        for (int p = 0; p < all[u].n_params; p++) {
            if (all[u].params[p].tied_unit >= 0) continue; /* stored as its owner */
            char name[128];
            int conv1d;
            const struct cdp_safetensors_tensor *x =
                file_tensor(f, hf, prefix, &all[u], all[u].params[p].name, name, sizeof name, &conv1d);
            if (!x) continue; /* the load names what is missing */
            used[tensor_index(f, x)] = 1;
            if (u == 0 && !strcmp(all[u].params[p].name, "wte")) wte = x;
        }
    }
    /* a tied plan: a head stored beside the embedding is used when it is the same tensor */
    if (gpt && desc->tie_embeddings && hf && wte) {
        char name[96];
        int c;
        cdp_hf_gpt2_name(CDP_HF_HEAD, 0, "lm_head.weight", prefix, name, sizeof name, &c);
        head = cdp_safetensors_find(f, name);
        if (head && head != wte && same_tensor(head, wte)) used[tensor_index(f, head)] = 1;
    }
    int n_unused = 0, buffers = 0, lo = -1, hi = -1, untied_head = 0, top_unit = -1;
    char list[512] = "";
    for (int i = 0; i < nf; i++) {
        const char *name = cdp_safetensors_at(f, i)->name;
        int block = -1;
        if (used[i]) continue;
        if (hf && cdp_hf_gpt2_is_buffer(name, &block) && block < desc->layers) {
            buffers++;
            continue;
        }
        if (n_unused < UNUSED_LISTED) add(list, sizeof list, "%s%s", n_unused ? ", " : "", name);
        n_unused++;
        enum cdp_hf_part part = CDP_HF_EMBED;
        const char *param = "";
        int c, unit;
        if (hf && cdp_hf_gpt2_is_buffer(name, &block)) part = CDP_HF_BLOCK;
        else if (hf && !cdp_hf_gpt2_parse(name, &part, &block, &param, &c)) continue;
        if (hf) {
            if (gpt && part == CDP_HF_BLOCK && block >= desc->layers) {
                if (lo < 0 || block < lo) lo = block;
                if (block > hi) hi = block;
            }
            if (gpt && part == CDP_HF_HEAD && !strcmp(param, "lm_head.weight")) untied_head = 1;
        } else if (sscanf(name, "layers.%d.", &unit) == 1) {
            if (unit > top_unit) top_unit = unit;
            const char *dot = strchr(name + 7, '.');
            if (gpt && dot && !strcmp(dot + 1, "lm_head.weight")) untied_head = 1;
        }
    }
    if (buffers) CDP_DEBUG(CKPT, "%s: %d causal-mask buffers (h.N.attn.bias) skipped: not weights", path, buffers);
    if (!n_unused) goto done;

    char msg[2048];
    snprintf(msg, sizeof msg, "%s: %d tensor%s in the file %s not used by the plan's model: %s%s", path, n_unused,
             n_unused == 1 ? "" : "s", n_unused == 1 ? "is" : "are", list,
             n_unused > UNUSED_LISTED ? ", ..." : "");
    if (lo >= 0)
        add(msg, sizeof msg, "; /model/layers: the file has blocks %d-%d (%sh.%d.* .. %sh.%d.*) beyond the plan's "
            "%lld; layers %d would use them", lo, hi, prefix, lo, prefix, hi, (long long)desc->layers, hi + 1);
    if (!hf && top_unit >= 0 && top_unit != n_all - 1)
        add(msg, sizeof msg, "; %s: the file has units 0-%d, the plan's model 0-%d%s", gpt ? "/model/layers" : "/model",
            top_unit, n_all - 1, gpt ? " (a GPT of N blocks has N + 2 units)" : "");
    if (untied_head)
        add(msg, sizeof msg, "; /model/tie_embeddings: the file has an untied head (lm_head.weight, not the "
            "embedding); tie_embeddings false would use it");
    if (desc->unused_tensors == CDP_UNUSED_WARN) {
        CDP_WARN(CKPT, "%s (loaded without them: /model/unused_tensors is \"warn\")", msg);
    } else {
        st = cdp_fail(CDP_ERR_INVALID, "%s; /model/unused_tensors \"warn\" loads the rest with a warning", msg);
    }
done:
    free(used);
    cdp_safetensors_close(f);
    free(all);
    return st;
}
