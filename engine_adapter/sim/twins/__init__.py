"""Engine twins: cache models that decide what a serving engine's own cache decides.

    sglang_radix.py   `SGLangRadixTree`: SGLang's `RadixCache` (token or page keys, node splits,
                      lock references, leaf eviction by SGLang's eviction strategies)
    sglang_model.py   `SGLangModel`: that tree in SGLang's request life cycle (admission,
                      checkpoint, retraction), the simulator's ``sglang`` cache model

Importing this package imports no submodule.
"""

from __future__ import annotations

__all__: list[str] = []
