/* GPT-2's byte-level BPE tokenizer, read from the vocab.json and merges.txt
 * that GPT-2 checkpoints come with (Radford et al. 2019, openai/gpt-2
 * src/encoder.py; docs/generate.md#tokenizers).
 *
 * Every byte is first mapped to one printable character (GPT-2's
 * bytes_to_unicode table: the 188 printable Latin-1 bytes stand for
 * themselves, the other 68 for U+0100 onwards, so a space is "Ġ"); the text
 * is cut into pieces by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * and each piece's symbols are merged, lowest merge rank first, every
 * occurrence of the chosen pair at once, until no pair has a rank. The ids are
 * vocab.json's. Decoding maps each id's characters back to bytes.
 *
 * Exact for ASCII text. Outside ASCII the pattern is approximated: every
 * non-ASCII character counts as a letter (\p{L}) and only ASCII whitespace
 * and digits are \s and \p{N}, so text with non-ASCII punctuation, digits or
 * spaces may be cut differently from GPT-2 (still a valid encoding: decode
 * gives the same bytes back). Special tokens such as <|endoftext|> are
 * encoded as text. */
#ifndef CDP_MODEL_BPE_H
#define CDP_MODEL_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_bpe;

/* Reads vocab.json (an object of token -> id, ids 0 .. n-1 each once) and
 * merges.txt (an optional "#version" line, then one "a b" pair per line, in
 * rank order; both halves and their join must be tokens of the vocabulary).
 * Errors name the file, the line or key and what was expected. */
cdp_status cdp_bpe_load(const char *vocab_path, const char *merges_path, struct cdp_bpe **out);
void cdp_bpe_free(struct cdp_bpe *b);

/* Number of ids (vocab.json's entries). */
int64_t cdp_bpe_vocab_size(const struct cdp_bpe *b);

/* The ids of n bytes of text: *ids malloc'd (NULL when *count is 0). A byte
 * whose character is not in the vocabulary is CDP_ERR_INVALID naming it. */
cdp_status cdp_bpe_encode(const struct cdp_bpe *b, const char *text, size_t n, int32_t **ids, int64_t *count);

/* The bytes of one id (not NUL-terminated; *len of them), or NULL for an id
 * outside the vocabulary. Valid until cdp_bpe_free. */
const char *cdp_bpe_decode(const struct cdp_bpe *b, int32_t id, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
