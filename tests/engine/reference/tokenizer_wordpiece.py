#!/usr/bin/python3
"""Reference WordPiece (BERT) tokenizer for tokenizer_wordpiece_test, written from the algorithm
of google-research/bert tokenization.py (BasicTokenizer + WordpieceTokenizer), with Python's
unicodedata for the character classes. Two details follow Hugging Face tokenizers (the format
our tokenizer reads) where BERT's Python differs: lowercasing is per character (str.lower on a
whole word applies the Greek final-sigma rule), and whitespace is the Unicode White_Space set.

usage: tokenizer_wordpiece.py REQUEST.json OUT.json
  REQUEST: {"vocab": {token: id}, "texts": [...], "unk": "[UNK]", "max_chars": 100,
            "lowercase": true, "cls": "[CLS]", "sep": "[SEP]", "add_special_tokens": true,
            "specials": ["[CLS]", ...]}   (written in the text, they are kept whole, as
            transformers' BertTokenizer never_split / added-token trie does)
  OUT: {"ids": [[...], ...]}
"""
import json
import sys
import unicodedata

WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}


def is_whitespace(ch):
    return ch in WHITE_SPACE


def is_control(ch):
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


def is_punctuation(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_chinese(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
            0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF or
            0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text, lowercase):
    # _clean_text
    out = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or is_control(ch):
            continue
        out.append(" " if is_whitespace(ch) else ch)
    text = "".join(out)
    # _tokenize_chinese_chars
    text = "".join(" %s " % ch if is_chinese(ord(ch)) else ch for ch in text)
    tokens = []
    for tok in "".join(" " if is_whitespace(c) else c for c in text).split(" "):
        if not tok:
            continue
        if lowercase:
            tok = "".join(c.lower() for c in tok)
            # _run_strip_accents
            tok = "".join(c for c in unicodedata.normalize("NFD", tok)
                          if unicodedata.category(c) != "Mn")
        # _run_split_on_punc
        word = ""
        for ch in tok:
            if is_punctuation(ch):
                if word:
                    tokens.append(word)
                tokens.append(ch)
                word = ""
            else:
                word += ch
        if word:
            tokens.append(word)
    return tokens


def wordpiece(token, vocab, unk, max_chars):
    chars = list(token)
    if len(chars) > max_chars:
        return [unk]
    pieces = []
    start = 0
    while start < len(chars):
        end = len(chars)
        cur = None
        while start < end:
            sub = "".join(chars[start:end])
            if start > 0:
                sub = "##" + sub
            if sub in vocab:
                cur = sub
                break
            end -= 1
        if cur is None:
            return [unk]
        pieces.append(cur)
        start = end
    return pieces


def split_specials(text, specials):
    """Leftmost-longest split of text on the special tokens: [(piece, is_special)]."""
    out, plain, i = [], 0, 0
    while i < len(text):
        hit = next((s for s in specials if text.startswith(s, i)), None)
        if hit is None:
            i += 1
            continue
        if i > plain:
            out.append((text[plain:i], False))
        out.append((hit, True))
        i = plain = i + len(hit)
    if plain < len(text):
        out.append((text[plain:], False))
    return out


def main():
    req = json.load(open(sys.argv[1], encoding="utf-8"))
    vocab = req["vocab"]
    ids = []
    specials = sorted(req.get("specials", []), key=len, reverse=True)
    for text in req["texts"]:
        toks = []
        for piece, is_special in split_specials(text, specials):
            if is_special:
                toks.append(piece)
                continue
            for word in basic_tokenize(piece, req.get("lowercase", True)):
                toks.extend(wordpiece(word, vocab, req["unk"], req["max_chars"]))
        if req.get("add_special_tokens"):
            toks = [req["cls"]] + toks + [req["sep"]]
        ids.append([vocab[t] for t in toks])
    json.dump({"ids": ids}, open(sys.argv[2], "w", encoding="utf-8"))


if __name__ == "__main__":
    main()
