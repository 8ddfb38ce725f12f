"""``shapes``: CIFAR-sized images generated in code, so a GPU study needs no download.

A convnet search needs data with structure to find: random labels would leave every config
at chance, and a real dataset cannot be fetched here. Each image holds one shape of its class
(disk, ring, square, frame, plus, cross, triangle, diamond, horizontal or vertical bars) at a
random place, size, small rotation and colour, on a textured background with small distractor
blobs and pixel noise. Colour and place tell nothing about the class, so a model must learn
shape, with translation invariance (random crops help) and mirror invariance (every class is
symmetric left to right, so horizontal flips are label-preserving).

``difficulty`` in [0, 1] turns up what makes it hard at once: smaller shapes, less contrast,
more rotation, more distractors, more noise and background texture. The images are a pure
function of ``(samples, difficulty, image_size)``: generated from a fixed seed, in chunks, as
float32 pixel values 0..255 (the layout of an image folder), NCHW.

Example:
    >>> x, y = generate(20, 0.5, 16)
    >>> x.shape, x.dtype, int(x.min()) >= 0, int(x.max()) <= 255, sorted(set(y.tolist()))[:3]
    ((20, 3, 16, 16), dtype('float32'), True, True, [0, 1, 2])
    >>> bool((generate(20, 0.5, 16)[0] == x).all())
    True
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

CLASSES = (
    "disk",
    "ring",
    "square",
    "frame",
    "plus",
    "cross",
    "triangle",
    "diamond",
    "hbars",
    "vbars",
)
"""The class names, in label order."""

SEED = 20_260_101
"""The generator's seed: the dataset is the same everywhere, for the same arguments."""

CHUNK = 2048
"""Images drawn at once (bounds the memory of the masks)."""

Mask = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _bars(t: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (np.cos(np.pi * 2.5 * t) > 0) & (np.maximum(np.abs(u), np.abs(v)) <= 0.9)


_MASKS: dict[str, Mask] = {
    "disk": lambda u, v: u * u + v * v <= 1.0,
    "ring": lambda u, v: (u * u + v * v <= 1.0) & (u * u + v * v >= 0.36),
    "square": lambda u, v: np.maximum(np.abs(u), np.abs(v)) <= 0.8,
    "frame": lambda u, v: (
        (np.maximum(np.abs(u), np.abs(v)) <= 0.85) & (np.maximum(np.abs(u), np.abs(v)) >= 0.5)
    ),
    "plus": lambda u, v: (
        ((np.abs(u) <= 0.25) & (np.abs(v) <= 1.0)) | ((np.abs(v) <= 0.25) & (np.abs(u) <= 1.0))
    ),
    "cross": lambda u, v: (
        ((np.abs(u - v) <= 0.35) | (np.abs(u + v) <= 0.35))
        & (np.abs(u) <= 0.75)
        & (np.abs(v) <= 0.75)
    ),
    "triangle": lambda u, v: (v <= 0.7) & (v >= 1.8 * np.abs(u) - 0.9),
    "diamond": lambda u, v: np.abs(u) + np.abs(v) <= 1.0,
    "hbars": lambda u, v: _bars(v, u, v),
    "vbars": lambda u, v: _bars(u, u, v),
}
"""Each class's shape in its own frame: ``u`` right, ``v`` down, 1 = the shape's radius."""


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel centres, ``(1, size, size)`` each: x to the right, y down."""
    coords = np.arange(size, dtype=np.float32) + 0.5
    ys, xs = np.meshgrid(coords, coords, indexing="ij")
    return xs[None], ys[None]


def _chunk(
    labels: np.ndarray, difficulty: float, size: int, rng: np.random.Generator
) -> np.ndarray:
    """The images of ``labels`` (one chunk), ``(n, 3, size, size)`` float32 in 0..255."""
    n, d = len(labels), float(difficulty)
    xs, ys = _grid(size)
    col = lambda: 255.0 * rng.random((n, 3, 1, 1), dtype=np.float32)  # noqa: E731
    # the background: a colour, a low-frequency wave of random direction, and noise below
    bg, wave_amp = col(), 40.0 * d
    angle, freq = rng.uniform(0, np.pi, (n, 1, 1)), rng.uniform(0.5, 2.0, (n, 1, 1))
    phase = rng.uniform(0, 2 * np.pi, (n, 1, 1))
    along = (xs * np.cos(angle) + ys * np.sin(angle)) * (2 * np.pi * freq / size)
    image = bg + (wave_amp * np.sin(along + phase)).astype(np.float32)[:, None]
    # the shape: its own colour, far enough from the background's
    fg = col()
    gap = fg - bg
    reach = np.sqrt((gap**2).sum(axis=1, keepdims=True)).clip(min=1e-3)
    fg = (bg + gap * np.maximum(1.0, (120.0 - 80.0 * d) / reach)).clip(0, 255)
    radius = rng.uniform(size * (0.24 - 0.1 * d), size * 0.4, (n, 1, 1)).astype(np.float32)
    cx = rng.uniform(radius, size - radius).astype(np.float32)
    cy = rng.uniform(radius, size - radius).astype(np.float32)
    turn = np.radians(rng.uniform(-20.0 * d, 20.0 * d, (n, 1, 1))).astype(np.float32)
    dx, dy = (xs - cx) / radius, (ys - cy) / radius
    u, v = dx * np.cos(turn) + dy * np.sin(turn), -dx * np.sin(turn) + dy * np.cos(turn)
    mask = np.zeros((n, size, size), dtype=bool)
    for label, name in enumerate(CLASSES):
        rows = labels == label
        if rows.any():
            mask[rows] = _MASKS[name](u[rows], v[rows])
    image = np.where(mask[:, None], fg.astype(np.float32), image)
    # distractors: small blobs of random colours anywhere, over shape and background alike
    for _ in range(round(1 + 5 * d)):
        r = rng.uniform(0.04 * size, 0.1 * size, (n, 1, 1)).astype(np.float32)
        bx, by = (size * rng.random((n, 1, 1), dtype=np.float32) for _ in range(2))
        blob = (xs - bx) ** 2 + (ys - by) ** 2 <= r * r
        image = np.where(blob[:, None], col(), image)
    image += (8.0 + 40.0 * d) * rng.standard_normal(image.shape, dtype=np.float32)
    return np.rint(image.clip(0, 255)).astype(np.float32)


def generate(
    samples: int, difficulty: float = 0.5, image_size: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` images (``(samples, 3, image_size, image_size)`` float32, 0..255) and their
    labels (``int64``, each class in turn, so the classes are balanced).

    Raises:
        ValueError: For fewer samples than classes, a difficulty outside [0, 1] or images
            under 8 pixels.
    """
    if samples < len(CLASSES):
        raise ValueError(f"shapes: samples must be at least {len(CLASSES)}, got {samples}")
    if not 0.0 <= difficulty <= 1.0:
        raise ValueError(f"shapes: difficulty must be in [0, 1], got {difficulty}")
    if image_size < 8:
        raise ValueError(f"shapes: image_size must be at least 8, got {image_size}")
    labels = np.arange(samples, dtype=np.int64) % len(CLASSES)
    rng = np.random.default_rng(SEED)
    images = np.empty((samples, 3, image_size, image_size), dtype=np.float32)
    for start in range(0, samples, CHUNK):
        part = labels[start : start + CHUNK]
        images[start : start + len(part)] = _chunk(part, difficulty, image_size, rng)
    return images, labels
