# Source at the start of a device call (the GPU machine has no registry): installs the carried wheels in .whl/
# (anchors from ../shared/tools/anchor_wheels.sh, plus gemmi etc. when a call needs them) into /tmp/site.
set -e
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
if [ -f .whl/cueq.tar.xz ]; then tar xJf .whl/cueq.tar.xz -C /tmp/site; fi
export PYTHONPATH=/tmp/site:$PWD/.whl/of3k:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
set +e
