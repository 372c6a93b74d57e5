#!/usr/bin/env python3
"""Rebuilds the tiny corpus bundled in data/tiny_corpus/ (see its README).

    pip install --target /tmp/pydeps tokenizers nltk && PYTHONPATH=/tmp/pydeps python3 tools/make_tiny_corpus.py

Documents: the paragraphs of the licence texts Debian ships in
/usr/share/common-licenses (each permits verbatim copies). Vocabulary: a
GPT-2 style byte-level BPE of VOCAB_SIZE tokens trained on them with Hugging
Face `tokenizers` (vocab.json, merges.txt). Data: the documents tokenised
by tools/preprocess_data.py into tiny_corpus_text_document.bin/.idx, each
ending with <|endoftext|>.

For BERT: a lower-cased WordPiece vocabulary of VOCAB_SIZE tokens trained on
the same text (bert-vocab.txt), laid out like the original BERT vocabularies'
beginning ([PAD] 0, [unused0..98], [UNK] 100, [CLS] 101, [SEP] 102, [MASK]
103), and the documents split into sentences, one sequence each
(tiny_corpus_bert_sentence.bin/.idx).
"""
import json
import os
import re
import subprocess
import sys

from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer

LICENCES = ["Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2", "GPL-3",
            "LGPL-2", "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0"]
VOCAB_SIZE = 2048
OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tiny_corpus"))


def main():
    documents = []
    for name in LICENCES:
        with open(os.path.join("/usr/share/common-licenses", name), encoding="utf-8") as f:
            for paragraph in re.split(r"\n\s*\n", f.read()):
                text = " ".join(paragraph.split())
                if len(text) >= 40:
                    documents.append(text)
    corpus = os.path.join(OUT, "corpus.jsonl")
    with open(corpus, "w", encoding="utf-8") as f:
        for text in documents:
            f.write(json.dumps({"text": text}) + "\n")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(documents, vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok.save_model(OUT)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "preprocess_data.py"),
                    "--input", corpus, "--output-prefix", os.path.join(OUT, "tiny_corpus_text_document"),
                    "--vocab-file", os.path.join(OUT, "vocab.json"), "--merge-file", os.path.join(OUT, "merges.txt"),
                    "--append-eod"], check=True)
    make_bert_data(documents, corpus)


# The first 104 ids of the original BERT vocabularies, so the special tokens
# have their usual ids (tessel-train's defaults).
BERT_SPECIAL_TOKENS = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_bert_data(documents, corpus):
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(documents, vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=BERT_SPECIAL_TOKENS)
    tok.save_model(OUT, "bert")
    vocab = os.path.join(OUT, "bert-vocab.txt")
    for i, token in enumerate(BERT_SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i, (token, tok.token_to_id(token))
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "preprocess_data.py"),
                    "--input", corpus, "--output-prefix", os.path.join(OUT, "tiny_corpus_bert_sentence"),
                    "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", vocab, "--split-sentences"],
                   check=True)


if __name__ == "__main__":
    main()
