"""Megatron-format indexed datasets move both ways between tessel and any
reader or writer of the published MMIDIDX version-1 layout. This test holds
its own reader and writer of that layout (written from the format, with the
standard library only) and checks: files tessel-dataset writes read back
equal here and are byte-identical to what this writer makes of the same
documents; files this writer makes (several sequences per document, int64
and uint8 ids) dump equal through tessel-dataset; the bundled corpus reads
the same both ways. With Hugging Face `tokenizers` and NLTK installable,
also that tools/preprocess_data.py rebuilds the bundled corpus byte for
byte and that its ids are the tokenizer's, and the same for BERT's
sentences (--split-sentences, WordPiece) with the special tokens at the
original BERT vocabularies' ids."""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dist"))
from harness import check, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--tessel-dataset", required=True)
parser.add_argument("--source", required=True)
args = parser.parse_args()

FORMATS = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}  # dtype code -> struct letter


def write(prefix, documents, code):
    """documents: lists of sequences (lists of ids)."""
    letter = FORMATS[code]
    lengths, pointers, doc_idx, position = [], [], [0], 0
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                f.write(struct.pack(f"<{len(seq)}{letter}", *seq))
                lengths.append(len(seq))
                pointers.append(position)
                position += len(seq) * struct.calcsize(letter)
            doc_idx.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(lengths), len(doc_idx)))
        f.write(struct.pack(f"<{len(lengths)}i", *lengths))
        f.write(struct.pack(f"<{len(pointers)}q", *pointers))
        f.write(struct.pack(f"<{len(doc_idx)}q", *doc_idx))


def read(prefix):
    """-> (dtype code, documents as lists of sequences)."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "bad magic"
    version, code, n, d = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    at = 34
    lengths = struct.unpack_from(f"<{n}i", idx, at)
    pointers = struct.unpack_from(f"<{n}q", idx, at + 4 * n)
    doc_idx = struct.unpack_from(f"<{d}q", idx, at + 12 * n)
    assert at + 12 * n + 8 * d == len(idx), "index size"
    data = open(prefix + ".bin", "rb").read()
    letter = FORMATS[code]
    seqs = [list(struct.unpack_from(f"<{lengths[i]}{letter}", data, pointers[i])) for i in range(n)]
    return code, [seqs[doc_idx[k]:doc_idx[k + 1]] for k in range(d - 1)]


def dump(prefix):
    """tessel-dataset dump -> documents as lists of sequences."""
    code, out, _ = run([args.tessel_dataset, "dump", prefix])
    docs = []
    for line in out.splitlines():
        k, _, ids = line.partition(":")
        k = int(k)
        while len(docs) <= k:
            docs.append([])
        docs[k].append([int(v) for v in ids.split()])
    return code, docs


work = tempfile.mkdtemp(prefix="tessel_interop_")
rng = random.Random(5)

# tessel writes, this reader reads; bytes equal to this writer's.
for dtype, code, top in (("uint16", 8, 65535), ("int32", 4, 2**31 - 1)):
    docs = [[rng.randint(0, top) for _ in range(rng.randint(0, 40))] for _ in range(25)]
    prefix = os.path.join(work, f"tessel_{dtype}")
    proc = subprocess.run([args.tessel_dataset, "write", prefix, dtype], input="\n".join(
        " ".join(map(str, d)) for d in docs) + "\n", text=True, capture_output=True)
    check(f"tessel-dataset write {dtype}", proc.returncode == 0, proc.stderr)
    got_code, got = read(prefix)
    check(f"{dtype}: read here as written by tessel (dtype code {got_code})",
          got_code == code and got == [[d] for d in docs], f"{got[:2]} vs {docs[:2]}")
    mine = os.path.join(work, f"mine_{dtype}")
    write(mine, [[d] for d in docs], code)
    for ext in (".bin", ".idx"):
        check(f"{dtype}: tessel's {ext} is byte-identical to this writer's",
              open(prefix + ext, "rb").read() == open(mine + ext, "rb").read())

# This writer writes, tessel reads: several sequences per document, other dtypes.
for code, top in ((5, 2**40), (1, 255)):
    docs = [[[rng.randint(0, top) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(1, 3))]
            for _ in range(12)]
    prefix = os.path.join(work, f"mine_code{code}")
    write(prefix, docs, code)
    rc, got = dump(prefix)
    check(f"dtype code {code}: tessel-dataset dump equals what was written", rc == 0 and got == docs,
          f"{got[:2]} vs {docs[:2]}")
    rc, out, _ = run([args.tessel_dataset, "info", prefix])
    check(f"dtype code {code}: tessel-dataset info counts",
          f"sequences {sum(len(d) for d in docs)} documents {len(docs)}" in out
          and f"max_token {max(max(s) for d in docs for s in d)}" in out, out)

# The bundled corpus, both ways.
corpus = os.path.join(args.source, "data", "tiny_corpus", "tiny_corpus_text_document")
code, mine = read(corpus)
rc, theirs = dump(corpus)
check("bundled corpus: this reader and tessel agree on every id",
      rc == 0 and mine == theirs and len(mine) == 687 and code == 8)

# preprocess_data.py with Hugging Face tokenizers, when it can be installed.
deps = os.path.join(work, "pydeps")
pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", deps, "tokenizers", "nltk"],
                     capture_output=True, text=True)
if pip.returncode != 0:
    print("skipped: tokenizers not installable here: " + " ".join(pip.stderr.strip().splitlines()[-1:]))
else:
    env = dict(os.environ, PYTHONPATH=deps)
    data_dir = os.path.join(args.source, "data", "tiny_corpus")
    out_prefix = os.path.join(work, "rebuilt")
    proc = subprocess.run([sys.executable, os.path.join(args.source, "tools", "preprocess_data.py"), "--input",
                           os.path.join(data_dir, "corpus.jsonl"), "--output-prefix", out_prefix, "--vocab-file",
                           os.path.join(data_dir, "vocab.json"), "--merge-file", os.path.join(data_dir, "merges.txt"),
                           "--append-eod"], env=env, capture_output=True, text=True)
    check("preprocess_data.py runs", proc.returncode == 0, proc.stderr)
    for ext in (".bin", ".idx"):
        check(f"preprocess_data.py rebuilds the bundled {ext} byte for byte",
              os.path.exists(out_prefix + ext) and open(out_prefix + ext, "rb").read() == open(corpus + ext, "rb").read())
    probe = subprocess.run([sys.executable, "-c", (
        "import json, sys\n"
        "from tokenizers import ByteLevelBPETokenizer\n"
        f"tok = ByteLevelBPETokenizer({os.path.join(data_dir, 'vocab.json')!r}, {os.path.join(data_dir, 'merges.txt')!r})\n"
        "eod = tok.token_to_id('<|endoftext|>')\n"
        f"docs = [json.loads(l)['text'] for l in open({os.path.join(data_dir, 'corpus.jsonl')!r})]\n"
        "print(json.dumps([tok.encode(t).ids + [eod] for t in docs]))\n")], env=env, capture_output=True, text=True)
    expected = json.loads(probe.stdout) if probe.returncode == 0 else None
    check("the bundled ids are the tokenizer's, document by document",
          expected is not None and [d[0] for d in mine] == expected, probe.stderr[-2000:])

    # BERT: sentences (NLTK Punkt trained on the text), WordPiece ids without [CLS]/[SEP].
    bert = os.path.join(data_dir, "tiny_corpus_bert_sentence")
    bert_vocab = os.path.join(data_dir, "bert-vocab.txt")
    out_prefix = os.path.join(work, "rebuilt_bert")
    proc = subprocess.run([sys.executable, os.path.join(args.source, "tools", "preprocess_data.py"), "--input",
                           os.path.join(data_dir, "corpus.jsonl"), "--output-prefix", out_prefix,
                           "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", bert_vocab,
                           "--split-sentences"], env=env, capture_output=True, text=True)
    check("preprocess_data.py --split-sentences runs", proc.returncode == 0, proc.stderr)
    for ext in (".bin", ".idx"):
        check(f"preprocess_data.py rebuilds the bundled BERT sentences' {ext} byte for byte",
              os.path.exists(out_prefix + ext) and open(out_prefix + ext, "rb").read() == open(bert + ext, "rb").read())
    probe = subprocess.run([sys.executable, "-c", (
        "import json\n"
        "from nltk.tokenize.punkt import PunktSentenceTokenizer\n"
        "from tokenizers import BertWordPieceTokenizer\n"
        f"tok = BertWordPieceTokenizer({bert_vocab!r}, lowercase=True)\n"
        f"docs = [json.loads(l)['text'] for l in open({os.path.join(data_dir, 'corpus.jsonl')!r})]\n"
        "punkt = PunktSentenceTokenizer('\\n\\n'.join(docs))\n"
        "out = [[tok.encode(s, add_special_tokens=False).ids for s in punkt.tokenize(t)] for t in docs]\n"
        "print(json.dumps([[ids for ids in d if ids] for d in out]))\n"
        "print(json.dumps([tok.token_to_id(t) for t in ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']]))\n")],
        env=env, capture_output=True, text=True)
    lines = probe.stdout.splitlines() if probe.returncode == 0 else []
    code, sentences = read(bert)
    check("the bundled BERT ids are the WordPiece tokenizer's, sentence by sentence",
          len(lines) == 2 and sentences == json.loads(lines[0]) and code == 8, probe.stderr[-2000:])
    check("the bundled BERT vocabulary has [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103 (tessel-train's "
          "defaults)", len(lines) == 2 and json.loads(lines[1]) == [0, 100, 101, 102, 103], probe.stdout[-300:])
shutil.rmtree(work, ignore_errors=True)
finish()
