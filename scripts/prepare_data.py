#!/usr/bin/env python
"""Turn a folder of text or JSON-lines files into pre-tokenised shards, and publish them to a dataset bucket.

    python scripts/prepare_data.py FOLDER [--out DIR] [--tokenizer bytes|bpe] [--vocab-size N]
                                   [--tokenizer-file tokenizer.json] [--shard-tokens N] [--chunk-bytes N]
                                   [--upload s3://BUCKET/PREFIX [--storage.endpoint URL]
                                    [--storage.credentials FILE]]

Reads every .txt/.md/.rst/.py file (one document each) and every .jsonl/.ndjson file (one document
per record, from its "text" field) under FOLDER in sorted order, checks it (empty, binary and
non-UTF-8 files are refused, naming the file), tokenises it and writes ``shard-NNNNN.npy`` files plus
``manifest.json`` (each shard's sha256 and token count, and the tokeniser) to DIR (default
FOLDER-shards).  By default (the run's default tokeniser) a byte-level BPE of ``--vocab-size`` ids is
trained from the text first (or ``--tokenizer-file`` is used) and saved beside the shards;
``--tokenizer bytes`` keeps raw bytes.  Then train on it:

    make run ARGS="--data.corpus DIR"

(with a tokeniser other than the default the script prints the ``--set hparams.…`` flags to add).

``--upload s3://BUCKET/PREFIX`` then publishes the shard folder (FOLDER itself when it already is one):
every shard checked against the manifest, the shards, their chunk digests and the tokeniser uploaded,
the manifest last.  Keys as for the nodes: ``--storage.credentials FILE`` (what ``python -m storage.server
provision`` writes) or ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``; the bucket is created if missing.
It prints the data hash (the manifest's hash: the run's ``hparams.data_hash``) and the flags nodes need::

    python neurons/miner.py --data.corpus s3://BUCKET/PREFIX --data.endpoint URL ...

Progress: a bar on a terminal, plain lines otherwise.  Exit status 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dso.config.schema import HParams  # noqa: E402
from dso.data.corpus import DataError, corpus_files, total_bytes  # noqa: E402
from dso.data.shard_writer import iter_all_text, write_shards  # noqa: E402
from dso.data.shards import CHUNK_BYTES, SHARD_TOKENS, is_shard_corpus  # noqa: E402
from dso.data.tokenizer import Tokenizer, train_bpe  # noqa: E402
from dso.util.progress import Progress  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="folder (or single file) of .txt/.md/.rst/.py and .jsonl/.ndjson files")
    p.add_argument("--out", help="output folder (default: FOLDER-shards)")
    defaults = HParams()  # the run's defaults, so `make run ARGS="--data.corpus DIR"` needs no other flag
    p.add_argument("--tokenizer", choices=("bytes", "bpe"), default=defaults.tokenizer,
                   help="bytes: 256 ids; bpe: byte-level BPE trained from the text (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=defaults.model.vocab_size if defaults.tokenizer == "bpe" else 4096,
                   help="BPE vocabulary (default: %(default)s)")
    p.add_argument("--tokenizer-file", help="use this byte-level tokenizer.json instead of training one")
    p.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS, help="ids per shard (default: %(default)s)")
    p.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES,
                   help="bytes per checked piece of a shard, read with one ranged GET from a bucket (a multiple of "
                        "64; default: %(default)s; docs/decisions/0500-chunked-remote-shards.md)")
    p.add_argument("--upload", metavar="s3://BUCKET/PREFIX", help="publish the shards to this dataset bucket")
    p.add_argument("--storage.endpoint", dest="endpoint", default="",
                   help="S3 endpoint of the dataset bucket (default: the credentials file's, else AWS)")
    p.add_argument("--storage.region", dest="region", default="", help="its region (default us-east-1)")
    p.add_argument("--storage.credentials", dest="credentials", default="", metavar="FILE",
                   help="JSON with the write keys (as `python -m storage.server provision` prints them); "
                        "default: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
    args = p.parse_args(argv)
    if args.shard_tokens <= 0 or args.vocab_size <= 0:
        p.error("--shard-tokens and --vocab-size must be positive")
    if args.upload:
        from storage.dataset import CorpusURL
        try:
            CorpusURL.parse(args.upload)
        except ValueError as e:
            p.error(f"--upload {e}")
    return args


def build_tokenizer(args, files: list[Path]) -> Tokenizer:
    if args.tokenizer_file:
        return Tokenizer.from_file(args.tokenizer_file)
    if args.tokenizer == "bytes":
        return Tokenizer.bytes()
    print(f"prepare_data: training a {args.vocab_size}-token byte-level BPE …", file=sys.stderr, flush=True)
    started = time.monotonic()
    tok = train_bpe(iter_all_text(files), args.vocab_size)
    print(f"prepare_data: BPE trained in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return tok


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    source = Path(args.folder).expanduser()
    if args.upload and is_shard_corpus(str(source)):  # already shards: publish them as they are
        return upload(args, source.parent if source.is_file() else source)
    out = Path(args.out).expanduser() if args.out else source.with_name(source.name + "-shards")
    try:
        files = corpus_files(str(source))
        tok = build_tokenizer(args, files)
        total = total_bytes(files)
        print(f"prepare_data: {len(files)} files, {total / 1e6:.1f} MB → {out} ({tok.describe()})", file=sys.stderr)
        with Progress(total, "tokenising") as bar:
            manifest = write_shards(files, tok, out, args.shard_tokens, progress=bar.advance,
                                    chunk_bytes=args.chunk_bytes)
    except DataError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 2
    print(f"prepare_data: {manifest.tokens:,} tokens in {len(manifest.shards)} shards, "
          f"{manifest.documents:,} documents, {total / max(1, manifest.tokens):.2f} bytes per token")
    if args.upload:
        return upload(args, out)
    flags, defaults = f"--data.corpus {out}", HParams()
    if (tok.kind, tok.vocab_size) != (defaults.tokenizer, defaults.model.vocab_size):
        flags += f" --set hparams.tokenizer={tok.kind} --set hparams.model.vocab_size={tok.vocab_size}"
    print(f'train on it: make run ARGS="{flags}"')
    return 0


def upload(args: argparse.Namespace, folder: Path) -> int:
    """Publish the shard folder to ``args.upload``; exit 2 for a folder that does not check out, 1 when the
    store refuses."""
    from dso.data.shards import read_manifest
    from storage.client import StorageError
    from storage.dataset_upload import publish, upload_client
    try:
        client = upload_client(args.endpoint, args.region, args.credentials)
        size = sum((folder / s.file).stat().st_size for s in read_manifest(folder).shards)
        print(f"prepare_data: publishing {folder} to {args.upload} at {client.endpoint or 'AWS'}", file=sys.stderr)
        with Progress(size, "uploading") as bar:
            done = publish(folder, args.upload, client, progress=bar.advance)
    except (DataError, ValueError) as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 2
    except StorageError as e:
        print(f"prepare_data: upload failed: {e}", file=sys.stderr)
        return 1
    print(f"prepare_data: published {done.objects} objects ({done.nbytes / 1e6:.1f} MB) to {done.url}")
    print(f"data hash (the manifest's; the run's hparams.data_hash): {done.data_hash}")
    endpoint = f" --data.endpoint {client.endpoint}" if client.endpoint else ""
    print(f"nodes read it with: --data.corpus {done.url}{endpoint} (keys: --data.access_key_id/"
          "--data.secret_access_key or DSO_DATA_ACCESS_KEY_ID/DSO_DATA_SECRET_ACCESS_KEY; none for a public bucket)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
