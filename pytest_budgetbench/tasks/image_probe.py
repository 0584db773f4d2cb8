"""``image_probe``: questions about images earlier in the chat, for vision endpoints.

A generator, deterministic from ``TaskOptions.seed``, that needs no data: each item shows
three small PNG images (drawn here with a minimal PNG encoder: zlib and struct, no
imaging library), each in its own user message as an OpenAI ``image_url`` content part
with a ``data:image/png;base64`` URL, then asks about one of them: its shapes' colour,
their kind (circle / square / triangle), or how many there are (1-4). The other two images
differ from the asked one in the asked attribute, so an answer from the wrong image is
wrong.

Token accounting: text-only counters charge each image part the declared
``pytest_budgetbench.tokens.content.IMAGE_TOKENS``; see that module.

Category: the attribute asked, ``colour``, ``shape`` or ``count``.

Grader ``image-probe-word/1``: the reply's first non-empty line (markdown removed) must
name the gold value and no other value of the same attribute (so "red or blue" is wrong);
counts may be digits or words, shapes may be plural. An empty reply scores 0.

skip_reason: the task is skipped unless the endpoint is known to accept images
(``endpoint_info["vision"] is True``).
"""

from __future__ import annotations

import base64
import random
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from pytest_budgetbench.messages import Message
from pytest_budgetbench.tasks._text import normalize_answer, short_answer
from pytest_budgetbench.tasks.base import Grade, Item, Task

SIZE = 64
IMAGES_PER_ITEM = 3
DEFAULT_ITEMS = 30
ATTRIBUTES = ("colour", "shape", "count")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 160, 60), "blue": (30, 70, 220),
    "yellow": (240, 200, 20), "purple": (130, 40, 170), "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle")
COUNTS = (1, 2, 3, 4)
_COUNT_WORDS = {"1": "one", "2": "two", "3": "three", "4": "four"}

SYSTEM_PROMPT = "Look at the images the user shows you and answer their question in one word."
QUESTIONS = {
    "colour": "What colour are the shapes in image {n}? Answer with one word.",
    "shape": "What kind of shape is in image {n}: circle, square or triangle? Answer with one "
             "word.",
    "count": "How many shapes are in image {n}? Answer with a number.",
}


# -- a minimal PNG encoder ------------------------------------------------------------------
def _chunk(tag: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(tag + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG from ``width * height * 3`` bytes of pixels, row by row."""
    if len(rgb) != width * height * 3:
        raise ValueError(f"expected {width * height * 3} bytes of RGB, got {len(rgb)}")
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b""))


# -- drawing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Picture:
    colour: str
    shape: str
    count: int

    def value(self, attribute: str) -> str:
        return {"colour": self.colour, "shape": self.shape, "count": str(self.count)}[attribute]


def _inside(shape: str, dx: float, dy: float, radius: float) -> bool:
    """Whether offset (dx, dy) from a shape's centre lies inside it."""
    if shape == "circle":
        return dx * dx + dy * dy <= radius * radius
    if shape == "square":
        return abs(dx) <= radius * 0.85 and abs(dy) <= radius * 0.85
    # An upward triangle: its half-width grows from 0 at the top to radius at the bottom.
    if not -radius <= dy <= radius:
        return False
    return abs(dx) <= (dy + radius) / 2


def draw(picture: Picture) -> bytes:
    """The picture as PNG bytes: its shapes in the cells of a 2x2 grid on white."""
    pixels = bytearray(b"\xff" * SIZE * SIZE * 3)
    cell = SIZE // 2
    radius = cell * 0.38 if picture.count > 1 else SIZE * 0.35
    centres = ([(SIZE / 2, SIZE / 2)] if picture.count == 1 else
               [((i % 2 + 0.5) * cell, (i // 2 + 0.5) * cell) for i in range(picture.count)])
    colour = bytes(COLOURS[picture.colour])
    for y in range(SIZE):
        for x in range(SIZE):
            if any(_inside(picture.shape, x + 0.5 - cx, y + 0.5 - cy, radius)
                   for cx, cy in centres):
                at = (y * SIZE + x) * 3
                pixels[at : at + 3] = colour
    return encode_png(SIZE, SIZE, bytes(pixels))


def image_part(png: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return {"type": "image_url", "image_url": {"url": url}}


# -- the task -----------------------------------------------------------------------------
def _options(attribute: str) -> tuple[str, ...]:
    if attribute == "colour":
        return tuple(COLOURS)
    if attribute == "shape":
        return SHAPES
    return tuple(str(c) for c in COUNTS)


def _random_picture(rng: random.Random, attribute: str, value: str) -> Picture:
    values = {"colour": rng.choice(tuple(COLOURS)), "shape": rng.choice(SHAPES),
              "count": str(rng.choice(COUNTS)), attribute: value}
    return Picture(values["colour"], values["shape"], int(values["count"]))


def mentioned(reply: str, attribute: str) -> set[str]:
    """Which values of ``attribute`` a reply names."""
    words = set(normalize_answer(reply).split())
    words |= {w[:-1] for w in words if w.endswith("s")}
    found = set()
    for value in _options(attribute):
        aliases = {value, _COUNT_WORDS.get(value, value)}
        if words & aliases:
            found.add(value)
    return found


class ImageProbeTask(Task):
    name = "image_probe"
    grader_version = "image-probe-word/1"

    def load(self) -> list[Item]:
        count = self.options.items or DEFAULT_ITEMS
        return [self._item(index) for index in range(count)]

    def _item(self, index: int) -> Item:
        rng = random.Random(f"image_probe/{self.options.seed}/{index}")
        attribute = ATTRIBUTES[index % len(ATTRIBUTES)]
        values = rng.sample(_options(attribute), IMAGES_PER_ITEM)
        pictures = [_random_picture(rng, attribute, value) for value in values]
        target = rng.randrange(IMAGES_PER_ITEM)
        messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT}]
        for number, picture in enumerate(pictures, start=1):
            messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Image {number}:"}, image_part(draw(picture))]})
            messages.append({"role": "assistant", "content": f"I have seen image {number}."})
        messages.append({"role": "user",
                         "content": QUESTIONS[attribute].format(n=target + 1)})
        return Item(
            item_id=f"{index:04d}",
            messages=tuple(messages),
            answer=pictures[target].value(attribute),
            category=attribute,
            meta={"image": target + 1, "pictures": [vars(p) for p in pictures],
                  "images": IMAGES_PER_ITEM},
        )

    def grade(self, item: Item, prediction: str) -> Grade:
        answer = short_answer(prediction)
        found = mentioned(answer, item.category) if answer else set()
        quality = float(found == {str(item.answer)})
        return Grade(quality, answer, self.grader_version, {"named": sorted(found)})

    def skip_reason(self, endpoint_info: dict[str, Any]) -> str | None:
        if endpoint_info.get("vision") is True:
            return None
        model = endpoint_info.get("model") or "this endpoint"
        return (f"image_probe needs a vision endpoint; {model} is text-only or not known to "
                "accept images (vision is not true)")
