"""Images of every mode and bit depth become the right 8-bit RGB pixels, or a DatasetError naming the file: the
kit's one image reader (idckit.data.images.load_image) against pixel values worked out by hand."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from idckit.data.images import load_image
from idckit.data.images import resize_uint8
from idckit.errors import DatasetError

GREY16 = [0, 257 * 100, 65535, 0x1234]         # 16-bit values: 0, 100 at 8 bits, white, high byte 0x12
GREY16_AS_8 = [0, 100, 255, 0x12]


def pixels(path) -> np.ndarray:
    img = load_image(path)
    assert img.mode == "RGB"
    return np.asarray(img)


def grey(values) -> np.ndarray:
    """A one-row RGB image whose every channel holds ``values``."""
    return np.repeat(np.asarray(values, dtype=np.uint8)[None, :, None], 3, axis=2)


def png(path: Path, width: int, height: int, depth: int, colour: int, raw: bytes) -> Path:
    """A PNG written chunk by chunk (Pillow cannot write 16-bit colour PNGs): ``raw`` is the unfiltered rows."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\0" + raw[i:i + len(raw) // height] for i in range(0, len(raw), len(raw) // height))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return path


# -- 8-bit modes: what Pillow's conversions give (these were right before; they guard the rewrite) -------------------

def _bilevel(tmp):
    im = Image.new("1", (2, 1))
    im.putpixel((1, 0), 1)
    im.save(tmp / "a.png")
    return tmp / "a.png", grey([0, 255])


def _palette(tmp, mode="P", suffix="png"):
    im = Image.new(mode, (2, 1))
    im.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    im.putpixel((1, 0), (1, 0) if mode == "PA" else 1)
    if mode == "P":
        im.info["transparency"] = 1                 # the transparent index keeps its colour: alpha is dropped
    im.save(tmp / f"a.{suffix}")
    return tmp / f"a.{suffix}", np.array([[[0, 0, 0], [10, 20, 30]]], np.uint8)


def _grey_alpha(tmp):
    Image.new("LA", (1, 1), (77, 0)).save(tmp / "a.png")
    return tmp / "a.png", grey([77])


def _rgba(tmp):
    Image.new("RGBA", (1, 1), (10, 20, 30, 0)).save(tmp / "a.png")
    return tmp / "a.png", np.array([[[10, 20, 30]]], np.uint8)


def _cmyk(tmp):
    Image.new("CMYK", (1, 1), (100, 50, 0, 20)).save(tmp / "a.tif")
    # each channel: 255 (1 - ink/255)(1 - black/255), rounded
    return tmp / "a.tif", np.array([[[round(155 * 235 / 255), round(205 * 235 / 255), 235]]], np.uint8)


def _ycbcr(tmp):
    Image.new("YCbCr", (2, 2), (100, 128, 128)).save(tmp / "a.tif")            # no chroma: grey at luma 100
    return tmp / "a.tif", np.full((2, 2, 3), 100, np.uint8)


@pytest.mark.parametrize("make", [_bilevel, _palette, lambda t: _palette(t, "PA", "tif"), _grey_alpha, _rgba, _cmyk,
                                  _ycbcr], ids=["1", "P+tRNS", "PA", "LA", "RGBA", "CMYK", "YCbCr"])
def test_eight_bit_modes_convert_as_their_formulas_say(make, tmp_path):
    path, want = make(tmp_path)
    assert np.array_equal(pixels(path), want)


# -- deeper and wider modes: scaled, not clipped to white -------------------------------------------------------------

def test_a_16_bit_png_keeps_its_high_byte_not_white(tmp_path):
    Image.frombytes("I;16", (4, 1), np.array(GREY16, "<u2").tobytes()).save(tmp_path / "g.png")
    assert Image.open(tmp_path / "g.png").mode == "I;16"
    assert np.array_equal(pixels(tmp_path / "g.png"), grey(GREY16_AS_8))


def test_a_big_endian_16_bit_tiff_reads_the_same(tmp_path):
    Image.frombytes("I;16B", (4, 1), np.array(GREY16, ">u2").tobytes()).save(tmp_path / "g.tif")
    assert Image.open(tmp_path / "g.tif").mode == "I;16B"
    assert np.array_equal(pixels(tmp_path / "g.tif"), grey(GREY16_AS_8))


def test_16_bit_grey_and_16_bit_colour_of_one_picture_give_the_same_pixels(tmp_path):
    grey16 = png(tmp_path / "grey.png", 4, 1, 16, 0, np.array(GREY16, ">u2").tobytes())
    rgb16 = png(tmp_path / "rgb.png", 4, 1, 16, 2, np.repeat(np.array(GREY16, ">u2"), 3).tobytes())
    assert np.array_equal(pixels(grey16), pixels(rgb16))
    assert np.array_equal(pixels(rgb16), grey(GREY16_AS_8))      # Pillow's own reading of 16-bit colour


@pytest.mark.parametrize("values,want", [([0, 100, 255, 7], [0, 100, 255, 7]),           # 8-bit levels as they are
                                         ([0, 25700, 65535, 300], [0, 100, 255, 1])],    # 16-bit: the high byte
                         ids=["8-bit-range", "16-bit-range"])
def test_a_32_bit_integer_tiff_is_read_at_the_depth_its_values_fit(values, want, tmp_path):
    Image.fromarray(np.array([values], np.int32), "I").save(tmp_path / "i.tif")
    assert Image.open(tmp_path / "i.tif").mode == "I"
    assert np.array_equal(pixels(tmp_path / "i.tif"), grey(want))


@pytest.mark.parametrize("values,want", [([0.0, 0.5, 1.0, 0.2], [0, 128, 255, 51]),     # fractions of white
                                         ([0.0, 100.4, 255.0, 3.0], [0, 100, 255, 3])],  # 8-bit levels, rounded
                         ids=["unit-range", "8-bit-range"])
def test_a_32_bit_float_tiff_is_scaled_by_its_range(values, want, tmp_path):
    Image.fromarray(np.array([values], np.float32), "F").save(tmp_path / "f.tif")
    assert Image.open(tmp_path / "f.tif").mode == "F"
    assert np.array_equal(pixels(tmp_path / "f.tif"), grey(want))


@pytest.mark.parametrize("mode,values,match", [("I", [-5, 10], "32-bit integer image with values -5..10"),
                                               ("I", [0, 70000], "values 0..70000"),
                                               ("F", [-1.0, 2.0], "floating-point image with values -1..2"),
                                               ("F", [0.0, float("nan")], "NaN"),
                                               ("F", [0.0, float("inf")], "infinite")])
def test_a_range_with_no_known_8_bit_scale_is_refused_with_the_path(mode, values, match, tmp_path):
    dtype = np.int32 if mode == "I" else np.float32
    Image.fromarray(np.array([values], dtype), mode).save(tmp_path / "x.tif")
    with pytest.raises(DatasetError, match=match) as err:
        load_image(tmp_path / "x.tif")
    assert str(tmp_path / "x.tif") in str(err.value)


def test_cielab_is_converted_colorimetrically(tmp_path):
    Image.new("LAB", (1, 1), (128, 128, 128)).save(tmp_path / "lab.tif")   # L* = 128/255*100, a* = b* = 0
    lightness = 128 / 255 * 100
    y = ((lightness + 16) / 116) ** 3                                        # CIE: relative luminance of L*
    srgb = 1.055 * y ** (1 / 2.4) - 0.055                                    # sRGB's transfer curve
    assert np.abs(pixels(tmp_path / "lab.tif").astype(int) - round(255 * srgb)).max() <= 1   # 119: mid grey


# -- several frames, damaged files, and every reader alike -------------------------------------------------------

def test_an_animated_gif_and_a_multi_page_tiff_give_their_first_frame(tmp_path):
    red, blue = Image.new("RGB", (2, 2), (255, 0, 0)), Image.new("RGB", (2, 2), (0, 0, 255))
    red.save(tmp_path / "a.gif", save_all=True, append_images=[blue], duration=100, loop=0)
    red.save(tmp_path / "a.tif", save_all=True, append_images=[blue])
    for name in ("a.gif", "a.tif"):
        assert getattr(Image.open(tmp_path / name), "n_frames", 1) == 2
        assert np.array_equal(pixels(tmp_path / name), np.full((2, 2, 3), (255, 0, 0), np.uint8)), name


def _damaged(tmp: Path, kind: str) -> Path:
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8))
    fmt, at, value = {"png-ihdr": ("PNG", 11, 0), "png-chunk": ("PNG", 35, 0), "bmp-bomb": ("BMP", 20, 255),
                      "ppm-header": ("PPM", 3, 0), "png-truncated": ("PNG", None, None),
                      "not-an-image": (None, None, None)}[kind]
    path = tmp / f"{kind}.img"
    if fmt is None:
        path.write_text("before,after\n")
        return path
    picture.save(path, fmt)
    data = bytearray(path.read_bytes())
    if at is None:
        data = data[:len(data) // 2]
    else:
        data[at] = value
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("kind,match", [("png-ihdr", "unreadable image"),      # Pillow: ValueError
                                        ("png-chunk", "unreadable image"),     # SyntaxError
                                        ("bmp-bomb", "too large to decode"),   # 30 x 11 million px declared
                                        ("ppm-header", "unreadable image"),    # ValueError
                                        ("png-truncated", "unreadable image"),
                                        ("not-an-image", "unreadable image")])
def test_a_damaged_file_is_a_dataset_error_naming_it(kind, match, tmp_path):
    path = _damaged(tmp_path, kind)
    with pytest.raises(DatasetError, match=match) as err:
        load_image(path)
    assert str(path) in str(err.value)


def test_a_directory_is_named_as_one(tmp_path):
    with pytest.raises(DatasetError, match="a directory, not an image file"):
        load_image(tmp_path)


def test_every_reader_sees_the_same_pixels(tmp_path):
    """The CLIP4IDC pixel cache, the IDC-PCL feature input and `idckit caption` read one file alike: a 16-bit
    picture as its 8-bit twin, and a JPEG with an EXIF rotation as stored (as the authors' loaders read it)."""
    import torch

    from idckit.data.features import preprocess

    eight = np.array([[0, 100, 255, 18], [18, 255, 100, 0]], np.uint8)
    Image.fromarray(eight, "L").save(tmp_path / "g8.png")
    Image.frombytes("I;16", (4, 2), (eight.astype("<u2") * 257).tobytes()).save(tmp_path / "g16.png")
    assert np.array_equal(resize_uint8(tmp_path / "g16.png", 8), resize_uint8(tmp_path / "g8.png", 8))
    assert torch.equal(preprocess([tmp_path / "g16.png"], 8), preprocess([tmp_path / "g8.png"], 8))

    exif = Image.Exif()
    exif[0x0112] = 6                                                          # "rotate 90° to display"
    Image.new("RGB", (6, 4), (200, 10, 10)).save(tmp_path / "o.jpg", exif=exif)
    stored = np.asarray(Image.open(tmp_path / "o.jpg").convert("RGB"))
    assert np.array_equal(pixels(tmp_path / "o.jpg"), stored) and stored.shape[:2] == (4, 6)


def test_caption_refuses_a_damaged_image_before_any_model_work(tmp_path):
    from idckit.cli.caption import caption_pair

    good = tmp_path / "good.png"
    Image.new("RGB", (4, 4)).save(good)
    bomb = _damaged(tmp_path, "bmp-bomb")
    with pytest.raises(DatasetError, match="too large to decode") as err:
        caption_pair(good, bomb, runs_dir=tmp_path / "no-runs", device="cpu")
    assert str(bomb) in str(err.value)
