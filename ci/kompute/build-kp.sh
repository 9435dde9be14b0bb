#!/usr/bin/env bash
# Builds Kompute's Python module (kp 0.9.0, sdist only on PyPI) offline, with
# vkspec's patch (kp-0.9.0-vkspec.patch: a global barrier before every dispatch
# and copy; Debian's Vulkan headers and fmt; pybind11 >= 2.12 from PyPI), and
# caches the wheel so that a second install takes seconds. Prints the wheel's path.
set -euo pipefail
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
key=$(cat "$here/kp-0.9.0-vkspec.patch" "$here/build-kp.sh" | sha256sum | cut -c1-16)
out=${VKSPEC_CACHE:-$HOME/.cache/vkspec}/kp/$key-$tag
if compgen -G "$out/kp-*.whl" > /dev/null; then ls "$out"/kp-*.whl; exit 0; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
pip=("$work/venv/bin/pip" -q --disable-pip-version-check)
"${pip[@]}" install 'pybind11>=2.12' setuptools wheel numpy >&2
"${pip[@]}" download --no-deps --no-binary :all: kp==0.9.0 -d "$work" >&2
tar xzf "$work"/kp-0.9.0.tar.gz -C "$work"
patch -d "$work/kp-0.9.0" -p1 < "$here/kp-0.9.0-vkspec.patch" >&2
echo "building kp 0.9.0 (about 4 minutes on 2 cores)..." >&2
(cd "$work/kp-0.9.0" &&
  PYBIND11_CMAKE_DIR=$("$work/venv/bin/python" -m pybind11 --cmakedir) \
  "${pip[@]}" wheel --no-build-isolation --no-deps . -w "$work/wheel" >&2)
mkdir -p "$(dirname "$out")"
rm -rf "$out.partial" && mv "$work/wheel" "$out.partial" && mv "$out.partial" "$out"
ls "$out"/kp-*.whl
