#!/usr/bin/env bash
# Installs the Debian packages vkspec builds and tests with, when any is missing:
# Lavapipe (mesa-vulkan-drivers), the Vulkan loader and headers, the validation
# layers, glslang, fmt and cmake (for the Kompute build).
set -euo pipefail
pkgs=(mesa-vulkan-drivers libvulkan1 libvulkan-dev vulkan-validationlayers glslang-tools
      spirv-tools vulkan-tools libfmt-dev cmake g++ patch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}" >&2
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
