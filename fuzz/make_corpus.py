"""Writes the seed corpus under fuzz/corpus/ (run from anywhere: python3 fuzz/make_corpus.py).

npy_header seeds are the first bytes of files numpy itself writes (versions 1.0, 2.0 and 3.0,
simple, structured and sub-array dtypes) plus hand-made malformed variants; dtype_literal seeds
are descr literals as they appear in headers; user_dtype seeds are --dtype arguments.
"""

import io
import os
import struct

import numpy as np
from numpy.lib import format as npf

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def saved(arr, version=None, data_bytes=16):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=True)
    else:
        npf.write_array(buf, arr, version=version, allow_pickle=True)
    raw = buf.getvalue()
    # The header and a few data bytes: the parser ignores what follows the header.
    hlen = raw.index(b"\n", 10) + 1
    return raw[: hlen + data_bytes]


def handmade(text, version=1):
    body = text.encode("latin-1" if version < 3 else "utf-8")
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(body)) + body


structured = np.dtype([("x", "<f4"), ("y", "u1", (3,)), ("z", [("a", "<i2"), ("b", "S3")])])
padded = np.dtype(
    {"names": ["a", "b"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 24}
)
unicode_field = np.dtype([("größe", "<f4"), ("名前", "u1")])

# Valid headers, as numpy writes them.
put("npy_header", "v1_u8_images", saved(np.zeros((4, 3, 31, 31), np.uint8)))
put("npy_header", "v1_f4_rows", saved(np.zeros((5, 7), np.float32)))
put("npy_header", "v1_scalar_records", saved(np.zeros((9,), "<i8")))
put("npy_header", "v1_bool", saved(np.zeros((3, 2), bool)))
put("npy_header", "v1_f2_c16", saved(np.zeros((2, 2), "<c16")))
put("npy_header", "v1_datetime", saved(np.zeros((3,), "<M8[ns]")))
put("npy_header", "v1_bytes_unicode", saved(np.zeros((3,), "<U5")))
put("npy_header", "v1_void", saved(np.zeros((3,), "V7")))
put("npy_header", "v1_structured", saved(np.zeros((3,), structured)))
put("npy_header", "v1_padded_struct", saved(np.zeros((3,), padded)))
put("npy_header", "v1_subarray", saved(np.zeros((3,), np.dtype(("<u2", (2, 3))))))
put("npy_header", "v2_u8", saved(np.zeros((4, 5), np.uint8), version=(2, 0)))
put("npy_header", "v2_structured", saved(np.zeros((3,), structured), version=(2, 0)))
put("npy_header", "v3_unicode_fields", saved(np.zeros((3,), unicode_field), version=(3, 0)))
put("npy_header", "v3_plain", saved(np.zeros((2, 2), "<f8"), version=(3, 0)))

# Malformed or refused: each should be an error, never a panic.
put("npy_header", "bad_empty", b"")
put("npy_header", "bad_magic", b"\x93NUMPX\x01\x00\x10\x00{}")
put("npy_header", "bad_version", b"\x93NUMPY\x04\x00\x10\x00" + b" " * 16)
put("npy_header", "bad_preamble_short", b"\x93NUMPY\x02\x00\x10")
put("npy_header", "bad_hlen_past_end", b"\x93NUMPY\x01\x00\xff\xff{'descr'")
put("npy_header", "bad_hlen_huge_v2", b"\x93NUMPY\x02\x00\xff\xff\xff\xff{")
put(
    "npy_header",
    "bad_v3_not_utf8",
    handmade("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", 3).replace(
        b"|u1", b"|u\xff"
    ),
)
put("npy_header", "bad_fortran", saved(np.asfortranarray(np.zeros((4, 5), np.float32))))
put("npy_header", "bad_big_endian", saved(np.zeros((4, 5), ">f4")))
put("npy_header", "bad_object", saved(np.array([1, "a", None], dtype=object)))
put("npy_header", "bad_scalar", saved(np.float32(3.0)))
put("npy_header", "bad_zero_records", saved(np.zeros((0, 5), np.uint8)))
put(
    "npy_header",
    "bad_zero_itemsize",
    handmade("{'descr': [], 'fortran_order': False, 'shape': (5,), }\n"),
)
put(
    "npy_header",
    "bad_overflow",
    handmade("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }\n"),
)
put(
    "npy_header",
    "bad_huge_int",
    handmade("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999999,), }\n"),
)
put(
    "npy_header",
    "bad_negative_dim",
    handmade("{'descr': '<f8', 'fortran_order': False, 'shape': (-3,), }\n"),
)
put("npy_header", "bad_missing_key", handmade("{'descr': '<f8', 'shape': (3,), }\n"))
put(
    "npy_header",
    "bad_extra_key",
    handmade("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), 'x': 1}\n"),
)
put(
    "npy_header",
    "bad_dup_key",
    handmade("{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}\n"),
)
put("npy_header", "bad_not_dict", handmade("['descr', '<f8']\n"))
put(
    "npy_header",
    "bad_unclosed",
    handmade("{'descr': '<f8', 'fortran_order': False, 'shape': (3,\n"),
)
put(
    "npy_header",
    "bad_deep_nesting",
    handmade("{'descr': " + "[" * 80 + "]" * 80 + ", 'fortran_order': False, 'shape': (3,)}\n"),
)
put(
    "npy_header",
    "bad_fortran_not_bool",
    handmade("{'descr': '<f8', 'fortran_order': 0, 'shape': (3,)}\n"),
)
put(
    "npy_header",
    "bad_shape_list",
    handmade("{'descr': '<f8', 'fortran_order': False, 'shape': [3, 4]}\n"),
)
put(
    "npy_header",
    "bad_latin1_key",
    handmade("{'descr': '<f8', 'fortran_order': False, 'sh\xe4pe': (3,)}\n"),
)

# descr literals.
for name, dt in [
    ("u1", np.dtype("u1")),
    ("f4", np.dtype("<f4")),
    ("c16", np.dtype("<c16")),
    ("m8", np.dtype("<m8[us]")),
    ("S16", np.dtype("S16")),
    ("U8", np.dtype("<U8")),
    ("V4", np.dtype("V4")),
    ("structured", structured),
    ("padded", padded),
    ("unicode_fields", unicode_field),
    ("subarray_field", np.dtype([("a", "<f4", (2, 3))])),
]:
    put("dtype_literal", name, repr(npf.dtype_to_descr(dt)))
for name, text in [
    ("big_endian", "'>f4'"),
    ("object", "'|O'"),
    ("empty_list", "[]"),
    ("bare_str", "'f4'"),
    ("titled", "[(('title', 'x'), '<f4')]"),
    ("padding_field", "[('', '|V4'), ('x', '<f4')]"),
    ("negative_sub", "[('x', '<f4', (-1,))]"),
    ("huge_sub", "[('x', '<f8', (4294967296, 4294967296))]"),
    ("nested_deep", "[('a', " * 40 + "'<f4'" + ")]" * 40),
    ("not_a_descr", "{'a': 1}"),
    ("unterminated", "'<f4"),
    ("escapes", "'<\\x66\\u0034'"),
    ("int", "4"),
    ("none", "None"),
    ("dup_field", "[('x', '<f4'), ('x', '<f4')]"),
]:
    put("dtype_literal", name, text)

# --dtype arguments.
for i, text in enumerate(
    [
        "u8",
        "f32",
        "uint8",
        "float64",
        "complex128",
        "bool",
        "<f4",
        "|u1",
        "<u8",
        ">f4",
        "|S16",
        "<U8",
        "|V4",
        "<M8[ns]",
        "B",
        "d",
        "?",
        "3,31,31B",
        "2,3u8",
        "4,f32",
        "3,,31B",
        "3,31,31",
        "99999999999999999999,B",
        "18446744073709551615,2B",
        "f4",
        "u1",
        "[('x', '<f4'), ('y', '|u1', (3,))]",
        "[]",
        "B,B",
        "",
        " ",
        "quux",
        "3,31,31<f4",
    ]
):
    put("user_dtype", f"seed{i:02d}", text)
