#!/usr/bin/env python3
"""Rebuilds the tiny corpus bundled in data/tiny_corpus/ (see its README).

    pip install --target /tmp/pydeps tokenizers && PYTHONPATH=/tmp/pydeps python3 tools/make_tiny_corpus.py

Documents: the paragraphs of the licence texts Debian ships in
/usr/share/common-licenses (each permits verbatim copies). Vocabulary: a
GPT-2 style byte-level BPE of VOCAB_SIZE tokens trained on them with Hugging
Face `tokenizers` (vocab.json, merges.txt). Data: the documents tokenised
by tools/preprocess_data.py into tiny_corpus_text_document.bin/.idx, each
ending with <|endoftext|>.
"""
import json
import os
import re
import subprocess
import sys

from tokenizers import ByteLevelBPETokenizer

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


if __name__ == "__main__":
    main()
