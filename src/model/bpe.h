/* Byte-level BPE tokenizers: GPT-2's, read from the vocab.json and merges.txt
 * that GPT-2 checkpoints come with (Radford et al. 2019, openai/gpt-2
 * src/encoder.py), and Llama 3's or any byte-level BPE a Hugging Face
 * tokenizer.json describes (docs/data.md#tokenizers).
 *
 * Every byte is first mapped to one printable character (GPT-2's
 * bytes_to_unicode table: the 188 printable Latin-1 bytes stand for
 * themselves, the other 68 for U+0100 onwards, so a space is "Ġ"); the text
 * is cut into pieces by the pre-tokenizer's pattern, run by PCRE2 with Unicode
 * properties (UTF + UCP), as the tokenizers library runs it: GPT-2's
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Llama 3's
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * or a tokenizer.json's Split regex. Each piece's symbols are merged, lowest
 * merge rank first, every occurrence of the chosen pair at once, until no pair
 * has a rank; with ignore_merges (Llama 3) a piece that is itself a token is
 * that token. Bytes of invalid UTF-8 match no pattern item and form pieces of
 * their own. Special tokens such as <|endoftext|> in the text are encoded as
 * text (cdp_bpe_token_id gives their ids). */
#ifndef CDP_MODEL_BPE_H
#define CDP_MODEL_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_bpe;

enum cdp_bpe_pretok { CDP_BPE_PRETOK_GPT2 = 0, CDP_BPE_PRETOK_LLAMA3, CDP_BPE_PRETOK_COUNT };

/* Reads vocab.json (an object of token -> id, ids 0 .. n-1 each once) and
 * merges.txt (an optional "#version" line, then one "a b" pair per line, in
 * rank order; both halves and their join must be tokens of the vocabulary),
 * with GPT-2's pre-tokenizer (cdp_bpe_load) or the one named.
 * Errors name the file, the line or key and what was expected. */
cdp_status cdp_bpe_load(const char *vocab_path, const char *merges_path, struct cdp_bpe **out);
cdp_status cdp_bpe_load_pattern(const char *vocab_path, const char *merges_path, enum cdp_bpe_pretok pretok,
                                struct cdp_bpe **out);

/* Reads a Hugging Face tokenizer.json of a byte-level BPE: model BPE (vocab,
 * merges as "a b" or ["a", "b"], ignore_merges; no dropout, byte fallback or
 * subword affixes), no normalizer, pre_tokenizer ByteLevel (GPT-2) or a
 * Sequence of a Split by a regex (behavior Isolated) and a ByteLevel without
 * its regex (Llama 3), added_tokens. Anything else is CDP_ERR_INVALID naming
 * the JSON path. */
cdp_status cdp_bpe_load_json(const char *path, struct cdp_bpe **out);
void cdp_bpe_free(struct cdp_bpe *b);

/* Number of ids (the vocabulary's, and added tokens' above it). */
int64_t cdp_bpe_vocab_size(const struct cdp_bpe *b);

/* The id of a token given as its text (an added token such as
 * "<|end_of_text|>", or a vocabulary entry such as "<|endoftext|>"), or -1. */
int32_t cdp_bpe_token_id(const struct cdp_bpe *b, const char *text);

/* The pre-tokenizer's pattern (owned by b). */
const char *cdp_bpe_pattern(const struct cdp_bpe *b);

/* The ids of n bytes of text: *ids malloc'd (NULL when *count is 0). A byte
 * whose character is not in the vocabulary is CDP_ERR_INVALID naming it. */
cdp_status cdp_bpe_encode(const struct cdp_bpe *b, const char *text, size_t n, int32_t **ids, int64_t *count);

/* The bytes of one id (not NUL-terminated; *len of them), or NULL for an id
 * outside the vocabulary. Valid until cdp_bpe_free. Encoding is thread-safe:
 * several threads may encode with one tokenizer at once. */
const char *cdp_bpe_decode(const struct cdp_bpe *b, int32_t id, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
