#!/usr/bin/env bash
# Builds llama.cpp's Vulkan backend at the same commit as ../shared/peer/build-llama-cpp.sh's CPU peer
# (0c1e57098, vendored in llama_cpp_python 0.3.36), so that vkspec on Lavapipe can be compared with
# llama.cpp on Lavapipe. Prints the folder of its binaries. Development and benchmarking only.
#
# Why the extra steps: this llama.cpp uses VK_EXT_layer_settings, which Debian 12's Vulkan headers
# (1.3.239) lack. The headers alone come from Debian 13's libvulkan-dev 1.4.309 (unpacked into $PEER,
# nothing installed); the program still runs on the system's Vulkan loader. glslc and the SPIR-V
# headers are Debian 12's.
# Under Lavapipe run the binaries with GGML_VK_VISIBLE_DEVICES=0.
set -euo pipefail
PEER=${PEER:-$HOME/.cache/vkspec-peer}
BIN=$PEER/build-vulkan/bin
if [ -x "$BIN/llama-completion" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$PEER/dl"
need=()
for t in cmake g++ make glslc curl; do command -v $t >/dev/null || need+=("$t"); done
[ -e /usr/lib/x86_64-linux-gnu/libvulkan.so ] || need+=(libvulkan-dev)
[ -d /usr/share/cmake/SPIRV-Headers ] || need+=(spirv-headers)
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq >&2; apt-get install -y -qq "${need[@]}" >&2; fi
[ -f "$PEER/dl/llama_cpp_python-0.3.36.tar.gz" ] || python3 -m pip download -q --no-deps --no-binary :all: \
    llama_cpp_python==0.3.36 -d "$PEER/dl" >&2
[ -d "$PEER/llama_cpp_python-0.3.36" ] || tar -xzf "$PEER/dl/llama_cpp_python-0.3.36.tar.gz" -C "$PEER"
HEADERS=$PEER/vulkan-headers-1.4.309
DEB=libvulkan-dev_1.4.309.0-1_amd64.deb
if [ ! -f "$HEADERS/usr/include/vulkan/vulkan_core.h" ]; then
    [ -f "$PEER/dl/$DEB" ] || curl -fsSL -o "$PEER/dl/$DEB" "https://deb.debian.org/debian/pool/main/v/vulkan-loader/$DEB"
    rm -rf "$HEADERS"; mkdir -p "$HEADERS"
    dpkg-deb -x "$PEER/dl/$DEB" "$HEADERS"
fi
SRC=$PEER/llama_cpp_python-0.3.36/vendor/llama.cpp
cmake -S "$SRC" -B "$PEER/build-vulkan" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$HEADERS/usr/include" \
      -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so \
      -DLLAMA_BUILD_COMMIT=0c1e57098 -DLLAMA_BUILD_TESTS=OFF >&2
cmake --build "$PEER/build-vulkan" -j2 --target llama-bench llama-completion >&2
echo "$BIN"
