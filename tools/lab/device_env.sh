# Source at the start of a device call (the GPU machine has no registry): installs the carried wheels into /tmp/site,
# those in .whl/ (anchors from ../shared/tools/anchor_wheels.sh) and in .device/whl/ (gemmi and biopython for the
# training runs), whichever the call carries.
set -e
for wheels in .whl .device/whl; do
  if ls $wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels/*.whl
  fi
done
if [ -f .whl/cueq.tar.xz ]; then tar xJf .whl/cueq.tar.xz -C /tmp/site; fi
export PYTHONPATH=/tmp/site:$PWD/.whl/of3k:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader \
  || echo "no nvidia-smi here"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
set +e
