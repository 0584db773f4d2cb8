"""image_probe: generated PNGs in image parts, the word grader, skipping, image tokens."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from pytest_budgetbench.tasks import Item, TaskOptions
from pytest_budgetbench.tasks.image_probe import (
    COLOURS,
    SIZE,
    ImageProbeTask,
    Picture,
    draw,
    encode_png,
)
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.content import IMAGE_TOKENS, image_parts


def _decode(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and RGB pixels of one of our PNGs (filter 0 rows, one IDAT)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        tag, data = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", png[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(tag + data) & 0xFFFFFFFF
        chunks[tag] = data
        at += 12 + length
    width, height, depth, colour_type, *_ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, colour_type) == (8, 2)
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = width * 3 + 1
    assert all(raw[y * stride] == 0 for y in range(height))
    pixels = b"".join(raw[y * stride + 1 : (y + 1) * stride] for y in range(height))
    return width, height, pixels


def _pixel(pixels: bytes, x: int, y: int) -> tuple[int, ...]:
    at = (y * SIZE + x) * 3
    return tuple(pixels[at : at + 3])


def test_png_encoder_round_trips() -> None:
    rgb = bytes(range(2 * 3 * 3)) * 1
    width, height, pixels = _decode(encode_png(3, 2, rgb))
    assert (width, height, pixels) == (3, 2, rgb)
    with pytest.raises(ValueError):
        encode_png(3, 2, b"short")


def test_drawn_shapes_have_their_colour() -> None:
    _w, _h, pixels = _decode(draw(Picture("red", "circle", 1)))
    assert _pixel(pixels, SIZE // 2, SIZE // 2) == COLOURS["red"]
    assert _pixel(pixels, 0, 0) == (255, 255, 255)
    _w, _h, four = _decode(draw(Picture("blue", "square", 4)))
    quarter = SIZE // 4
    for x, y in ((quarter, quarter), (3 * quarter, quarter), (quarter, 3 * quarter),
                 (3 * quarter, 3 * quarter)):
        assert _pixel(four, x, y) == COLOURS["blue"]
    assert _pixel(four, SIZE // 2, SIZE // 2) == (255, 255, 255)


def test_pillow_reads_the_png_when_installed() -> None:
    image_module = pytest.importorskip("PIL.Image")
    import io

    image = image_module.open(io.BytesIO(draw(Picture("green", "triangle", 1))))
    assert image.size == (SIZE, SIZE) and image.mode == "RGB"
    assert image.getpixel((SIZE // 2, SIZE // 2 + 10)) == COLOURS["green"]


@pytest.fixture
def items() -> list[Item]:
    return ImageProbeTask(TaskOptions(seed=0)).load()


def test_items_show_images_and_ask_about_one(items: list[Item]) -> None:
    assert [i.category for i in items[:3]] == ["colour", "shape", "count"]
    for item in items:
        images = [m for m in item.messages if image_parts(m)]
        assert len(images) == 3
        part = images[0]["content"][1]
        assert part["image_url"]["url"].startswith("data:image/png;base64,")
        base64.b64decode(part["image_url"]["url"].split(",", 1)[1], validate=True)
        asked = [p[item.category] for p in item.meta["pictures"]]
        assert len(set(asked)) == 3, "other images must differ in the asked attribute"
        assert str(item.answer) == str(asked[item.meta["image"] - 1])
        assert f"image {item.meta['image']}" in item.messages[-1]["content"]
    assert items == ImageProbeTask(TaskOptions(seed=0)).load()


def _grade(item: Item, reply: str) -> float:
    return ImageProbeTask(TaskOptions()).grade(item, reply).quality


def test_grader(items: list[Item]) -> None:
    colour, shape, count = items[0], items[1], items[2]
    other_colour = next(c for c in COLOURS if c != colour.answer)
    assert _grade(colour, str(colour.answer).title()) == 1.0
    assert _grade(colour, f"**{colour.answer}**") == 1.0
    assert _grade(colour, f"{colour.answer} or {other_colour}") == 0.0
    assert _grade(colour, f"{other_colour}\nor maybe {colour.answer}") == 0.0
    assert _grade(shape, f"{shape.answer}s") == 1.0
    words = {"1": "one", "2": "two", "3": "three", "4": "four"}
    assert _grade(count, str(count.answer)) == 1.0
    assert _grade(count, words[str(count.answer)].title() + ".") == 1.0
    assert _grade(count, "1 or 2 or 3 or 4") == 0.0
    for item in (colour, shape, count):
        for bad in ("", "I don't know", "Connection refused"):
            assert _grade(item, bad) == 0.0


def test_skipped_on_text_only_endpoints() -> None:
    task = ImageProbeTask(TaskOptions())
    for vision in (None, False):
        reason = task.skip_reason({"model": "smollm2-135m-instruct-q4_1", "vision": vision})
        assert reason and "vision" in reason and "smollm2" in reason
    assert task.skip_reason({"model": "m"}) is not None
    assert task.skip_reason({"model": "llava", "vision": True}) is None


def test_image_parts_cost_the_declared_tokens(items: list[Item]) -> None:
    counter = ApproxCounter()
    text = {"role": "user", "content": "Image 1:"}
    with_image = {"role": "user", "content": [{"type": "text", "text": "Image 1:"},
                                              items[0].messages[1]["content"][1]]}
    assert counter.count_messages([with_image]) - counter.count_messages([text]) == IMAGE_TOKENS
    assert image_parts(text) == 0 and image_parts(with_image) == 1
