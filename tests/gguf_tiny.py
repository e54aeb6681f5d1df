"""One-block GGUF files derived from the bundled SmolLM2 GGUF, for loading tests.

``one_block(dst, arch=...)`` copies SmolLM2's metadata and tokenizer under another
architecture name and keeps only block 0's tensors: a well-formed file that transformers
dequantizes in about a second. ``nan=True`` writes a NaN into ``output_norm.weight``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def one_block(dst: Path, arch: str = "llama", nan: bool = False) -> Path:
    """Write the one-block GGUF to ``dst`` and return it."""
    import gguf
    from gguf import GGUFValueType as T

    from residual_stream.registry import REGISTRY

    reader = gguf.GGUFReader(REGISTRY["smollm2-135m"].location())
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key, kind = name.replace("llama.", f"{arch}."), field.types[0]
        if key == f"{arch}.block_count":
            writer.add_uint32(key, 1)
        elif kind == T.ARRAY:
            strings = field.types[-1] == T.STRING
            writer.add_array(key, [bytes(field.parts[i]).decode("utf-8", "replace") if strings
                                   else field.parts[i].tolist()[0] for i in field.data])
        elif kind == T.STRING:
            writer.add_string(key, bytes(field.parts[-1]).decode())
        else:
            writer.add_key_value(key, field.parts[-1].tolist()[0], kind)
    if arch != "llama":
        writer.add_float32(f"{arch}.attention.layer_norm_epsilon", 1e-5)
    for t in reader.tensors:
        if t.name.startswith("blk.") and not t.name.startswith("blk.0."):
            continue
        data = np.array(t.data)
        if nan and t.name == "output_norm.weight":
            data[0] = np.nan
        writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
