#!/usr/bin/env python3
"""Writes tests/fixtures/tokenize/: two small byte-level BPE tokenizers trained
with the Hugging Face `tokenizers` package and the ids it gives for a
multilingual text, which suite tokenize checks cdphybrid's tokenizer against,
token for token.

  gpt2/vocab.json, gpt2/merges.txt   GPT-2's form: ByteLevel pre-tokenizer with
                                     GPT-2's regex, 600 ids
  llama3/tokenizer.json              Llama 3's form: a Split by Llama 3's regex
                                     (behavior Isolated), ByteLevel without its
                                     regex, ignore_merges, <|begin_of_text|> and
                                     <|end_of_text|> as added tokens
  expected.json                      {"cases": [{"name", "text", "gpt2": [ids],
                                     "llama3": [ids]}], "tokenizers": version}

Not part of the build or CI (the product never needs PyPI). Run where the
package is installed, e.g.:

  python3 -m venv /tmp/tok && /tmp/tok/bin/pip install tokenizers
  /tmp/tok/bin/python tools/tokenizer-fixture.py
"""
import json
import os
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenize")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")

# Written for this fixture: many scripts, digits of several kinds, contractions in
# both cases, and every kind of whitespace the patterns treat differently.
MULTILINGUAL = (
    "The quick brown fox jumps over the lazy dog. I'm sure you're right; WE'LL see, DON'T worry, it's fine.\n"
    "Numbers: 12345, 3.14159, 1,000,000 and 2024-05-20; Arabic-Indic ٣٤٥٦, full-width １２３４, Roman Ⅻ.\n"
    "Deutsch: Größe, Straße, übermäßig — „Anführungszeichen“.\n"
    "Français : l'été où la naïve Noël s'écrit « ainsi ».\n"
    "Español: ¿Qué tal? ¡Hola, señor Muñoz!\n"
    "Русский: Привет, как дела? Всё хорошо.\n"
    "Ελληνικά: Καλημέρα κόσμε!\n"
    "中文：我爱自然语言处理。你好，世界！\n"
    "日本語：こんにちは、世界！カタカナとひらがな。\n"
    "한국어: 안녕하세요, 세계!\n"
    "हिन्दी: नमस्ते दुनिया।\n"
    "العربية: مرحبا بالعالم!\n"
    "עברית: שלום עולם\n"
    "ไทย: สวัสดีครับ\n"
    "Emoji: 👋🌍🚀 👨‍👩‍👧 café vs cafe\u0301.\n"
    "Whitespace:\ttab,  two spaces,   three,\u00a0nbsp,\u3000ideographic,\u2003em\u2002en,\u200bzero-width.\r\n"
    "Windows line\r\nand   \n   indented\n\n\n    code: x = y+1; // comment\n"
    "snake_case CamelCase abc123def 3rd 42nd '90s \"quoted\" (parens) [brackets] {braces} <tags>\n"
    "URL https://example.com/a?b=c&d=e#f and e-mail a.b@c.de\n"
    "Trailing spaces   \n"
    "NEL\u0085line sep\u2028para sep\u2029end"
)

CASES = [
    ("multilingual", MULTILINGUAL),
    ("contractions", "I'm you're they've we'd she'll it's IT'S YOU'RE He'D 'tis don't"),
    ("digits", "0 12 123 1234 12345 123456 ١٢٣٤ 1٢3 ¹²³ ½"),
    ("spaces", "a  b   c\t\td \n e\n\n f   "),
    ("newlines", "line\r\n\r\nnext\n \n  \nlast\r"),
    ("punctuation", "...!!?? --- ,,; :: \"'\" ''' ```"),
    ("leading space", " hello  world "),
    ("empty", ""),
]


def train(pre, model, special):
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=special)
    corpus = [MULTILINGUAL] + [t for _, t in CASES] + MULTILINGUAL.split("\n")
    tok.train_from_iterator(corpus, trainer)
    return tok


def main():
    os.makedirs(os.path.join(OUT, "gpt2"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "llama3"), exist_ok=True)

    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), models.BPE(),
                 ["<|endoftext|>"])
    gpt2.model.save(os.path.join(OUT, "gpt2"))

    llama3 = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ]), models.BPE(ignore_merges=True), [])
    llama3.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    llama3.save(os.path.join(OUT, "llama3", "tokenizer.json"))

    # the files as written, read back, give the expected ids
    g = Tokenizer(models.BPE.from_file(os.path.join(OUT, "gpt2", "vocab.json"),
                                       os.path.join(OUT, "gpt2", "merges.txt")))
    g.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    l3 = Tokenizer.from_file(os.path.join(OUT, "llama3", "tokenizer.json"))
    cases = []
    for name, text in CASES:
        cases.append({"name": name, "text": text,
                      "gpt2": g.encode(text, add_special_tokens=False).ids,
                      "llama3": l3.encode(text, add_special_tokens=False).ids})
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "multilingual.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(MULTILINGUAL)
    n = sum(len(c["gpt2"]) for c in cases)
    print(f"wrote {OUT}: {len(cases)} cases, {n} GPT-2-style ids, tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    sys.exit(main())
