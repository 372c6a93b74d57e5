#!/usr/bin/env python3
"""Tokenises JSON lines into a Megatron-format indexed dataset (.bin/.idx).

    python3 tools/preprocess_data.py --input corpus.jsonl --output-prefix out/corpus_text_document \\
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt --append-eod

Each line is a JSON object; its --json-key field ("text") is one document,
tokenised with Hugging Face `tokenizers` (GPT-2 byte-level BPE from
vocab.json + merges.txt, or BERT WordPiece from vocab.txt) and written as
one sequence of <prefix>.bin, indexed in <prefix>.idx (MMIDIDX version 1,
the format Megatron-LM's preprocess_data.py writes and tessel-train reads).
With --split-sentences (what BERT's samples need: segment pairs cut at
sentence boundaries) each sentence is a sequence of its own and the index's
document list marks where documents begin; sentences are found by NLTK's
Punkt, trained unsupervised on the input itself (nothing is downloaded).
Needs `pip install tokenizers numpy` (and `nltk` for --split-sentences).
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}


def load_tokenizer(args):
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer

    if args.tokenizer_file:
        tok = Tokenizer.from_file(args.tokenizer_file)
        eod = args.eod_token or "<|endoftext|>"
    elif args.tokenizer_type == "GPT2BPETokenizer":
        if not args.vocab_file or not args.merge_file:
            sys.exit("preprocess_data: GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)")
        tok = ByteLevelBPETokenizer(args.vocab_file, args.merge_file)
        eod = args.eod_token or "<|endoftext|>"
    elif args.tokenizer_type == "BertWordPieceLowerCase":
        if not args.vocab_file:
            sys.exit("preprocess_data: BertWordPieceLowerCase needs --vocab-file (vocab.txt)")
        tok = BertWordPieceTokenizer(args.vocab_file, lowercase=True)
        eod = args.eod_token or "[SEP]"
    else:
        sys.exit(f"preprocess_data: unknown --tokenizer-type {args.tokenizer_type!r}; expected "
                 "GPT2BPETokenizer or BertWordPieceLowerCase (or give --tokenizer-file)")
    eod_id = tok.token_to_id(eod)
    if args.append_eod and eod_id is None:
        sys.exit(f"preprocess_data: --append-eod but the vocabulary has no {eod!r} token")
    return tok, eod_id


def write_indexed_dataset(prefix, documents, vocab_size):
    """Writes documents as <prefix>.bin and <prefix>.idx. A document is a list
    of ids (one sequence) or a list of such lists (one sequence each)."""
    dtype = np.uint16 if vocab_size < 65500 else np.int32
    lengths, offsets, document_starts, position = [], [], [0], 0
    with open(prefix + ".bin", "wb") as bin_file:
        for document in documents:
            sequences = document if document and isinstance(document[0], list) else [document]
            for ids in sequences:
                array = np.asarray(ids, dtype=dtype)
                bin_file.write(array.tobytes(order="C"))
                lengths.append(len(array))
                offsets.append(position)
                position += array.nbytes
            document_starts.append(len(lengths))
    with open(prefix + ".idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00")
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", DTYPE_CODES[dtype]))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(document_starts)))
        idx.write(np.asarray(lengths, dtype=np.int32).tobytes(order="C"))
        idx.write(np.asarray(offsets, dtype=np.int64).tobytes(order="C"))
        idx.write(np.asarray(document_starts, dtype=np.int64).tobytes(order="C"))
    return len(document_starts) - 1, sum(lengths)


def sentence_splitter(texts):
    """NLTK's Punkt sentence tokenizer, trained unsupervised on `texts`."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    return PunktSentenceTokenizer("\n\n".join(texts))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="JSON lines, one document per line")
    p.add_argument("--json-key", default="text", help="the field holding the text (default: text)")
    p.add_argument("--output-prefix", required=True, help="writes <prefix>.bin and <prefix>.idx")
    p.add_argument("--tokenizer-type", default="GPT2BPETokenizer",
                   help="GPT2BPETokenizer (vocab.json + merges.txt) or BertWordPieceLowerCase (vocab.txt)")
    p.add_argument("--tokenizer-file", help="a Hugging Face tokenizer.json instead of the vocabulary files")
    p.add_argument("--vocab-file")
    p.add_argument("--merge-file")
    p.add_argument("--append-eod", action="store_true", help="end every document with the end-of-document token")
    p.add_argument("--eod-token", help="default: <|endoftext|> for BPE, [SEP] for WordPiece")
    p.add_argument("--split-sentences", action="store_true",
                   help="one sequence per sentence (BERT's samples); with --append-eod the token ends each document")
    args = p.parse_args()

    tok, eod_id = load_tokenizer(args)
    texts = []
    with open(args.input, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)[args.json_key]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                sys.exit(f"preprocess_data: {args.input}:{number}: expected a JSON object with a "
                         f"{args.json_key!r} string ({e})")
            texts.append(text)
    documents = []
    splitter = sentence_splitter(texts) if args.split_sentences else None
    # WordPiece adds [CLS] and [SEP] around what it encodes; BERT's samples add their own.
    encode = lambda text: tok.encode(text, add_special_tokens=False).ids
    for text in texts:
        if splitter is None:
            ids = encode(text)
            if args.append_eod:
                ids.append(eod_id)
            documents.append(ids)
            continue
        sentences = [ids for ids in (encode(s) for s in splitter.tokenize(text)) if ids]
        if args.append_eod and sentences:
            sentences[-1].append(eod_id)
        if sentences:
            documents.append(sentences)
    count, tokens = write_indexed_dataset(args.output_prefix, documents, tok.get_vocab_size())
    sequences = sum(len(d) for d in documents) if args.split_sentences else count
    print(f"preprocess_data: {count} documents, {sequences} sequences, {tokens} tokens, vocabulary "
          f"{tok.get_vocab_size()} -> {args.output_prefix}.bin/.idx")


if __name__ == "__main__":
    main()
