#!/usr/bin/env python3
"""Tokenizes text files with a Hugging Face tokenizer into a token file that
train_gpt's --data reads.

  write_tokens.py --tokenizer=DIR_OR_NAME --out=PATH.bin TEXT_FILE...

Each input file is one document; its tokens are followed by the tokenizer's
end-of-sequence token (when it has one; --no_eos to leave it out), so
documents do not run into each other. The output is the ids back to back,
little-endian, no header:

  vocabulary <= 65,535   uint16 (nanoGPT's format)  -> --data=tokens:PATH
  vocabulary  > 65,535   uint32 (Llama 3, Qwen)     -> --data=tokens32:PATH

(--width=16 or 32 forces one; 16 is refused when an id does not fit). The
vocabulary is len(tokenizer), added tokens included. Files are read a block
of lines at a time and written as they are tokenized, so a corpus need not
fit in memory; a block ends only before a line that starts with a
non-space character, where byte-level BPE tokenizers (GPT-2, Llama 3, Qwen)
split anyway, so the ids equal those of the whole file at once (a
SentencePiece tokenizer, Llama 2's or Mistral's, may tokenize a block's
first word as at a document start: a few tokens per 4,096 lines differ).
Prints the --data flag to use.

Needs `pip install transformers numpy` (and the tokenizer's files: a local
directory, or a hub name where the hub is reachable). Not part of any test:
the trainer's reader is tested on files its test writes
(examples/train_data_test.cc).
"""
import argparse
import sys

import numpy as np

# Lines tokenized per call: big enough for the fast tokenizer's batching,
# small enough to bound memory.
BLOCK_LINES = 4096


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__[__doc__.index("\n\n") + 2:])
    parser.add_argument("--tokenizer", required=True,
                        help="a tokenizer directory (or hub name)")
    parser.add_argument("--out", required=True, help="the token file to write")
    parser.add_argument("--width", type=int, choices=(16, 32),
                        help="bits per id (default: 16 when the vocabulary "
                        "is at most 65,535, else 32)")
    parser.add_argument("--no_eos", action="store_true",
                        help="no end-of-sequence token after each file")
    parser.add_argument("inputs", nargs="+", help="UTF-8 text files")
    return parser.parse_args()


def blocks(path):
    """The file's text in blocks of about BLOCK_LINES lines (newlines kept),
    each cut before a line that starts with a non-space character."""
    with open(path, encoding="utf-8") as f:
        lines = []
        for line in f:
            if len(lines) >= BLOCK_LINES and line[:1].strip():
                yield "".join(lines)
                lines = []
            lines.append(line)
        if lines:
            yield "".join(lines)


def main():
    args = parse_args()
    from transformers import AutoTokenizer  # slow import: after --help
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = len(tokenizer)
    width = args.width or (16 if vocab <= 65535 else 32)
    dtype = np.dtype("<u2") if width == 16 else np.dtype("<u4")
    limit = np.iinfo(dtype).max
    eos = None if args.no_eos else tokenizer.eos_token_id
    total = 0
    largest = 0
    with open(args.out, "wb") as out:
        for path in args.inputs:
            for text in blocks(path):
                # No BOS/EOS per block: a block is not a document.
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                array = np.asarray(ids, dtype=np.int64)
                if array.size == 0:
                    continue
                top = int(array.max())
                if top > limit or int(array.min()) < 0:
                    sys.exit(f"{path}: token id {top} does not fit uint{width}"
                             f" (vocabulary {vocab}); use --width=32")
                largest = max(largest, top)
                array.astype(dtype).tofile(out)
                total += array.size
            if eos is not None:
                np.asarray([eos], dtype=dtype).tofile(out)
                largest = max(largest, eos)
                total += 1
    flag = "tokens" if width == 16 else "tokens32"
    print(f"{args.out}: {total} tokens as uint{width} (vocabulary {vocab}, "
          f"largest id {largest}); train with --data={flag}:{args.out}")


if __name__ == "__main__":
    main()
