# Sourced before the tests: pin the Lavapipe ICD and turn on the Khronos
# validation layer with synchronization validation, logging to a file that
# tests/conftest.py reads (any message fails the run).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.$(uname -m).json
export VK_DRIVER_FILES=$VK_ICD_FILENAMES
export VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation
export VKSPEC_VK_LOG=${VKSPEC_VK_LOG:-$(mktemp -d)/vk-validation.log}
settings_dir=$(dirname "$VKSPEC_VK_LOG")
sed "s#@LOG@#$VKSPEC_VK_LOG#" "$here/vk_layer_settings.txt.in" > "$settings_dir/vk_layer_settings.txt"
export VK_LAYER_SETTINGS_PATH=$settings_dir/vk_layer_settings.txt
: > "$VKSPEC_VK_LOG"
export VKSPEC_REQUIRE_DEVICE=1
# Lavapipe's compiled pipelines stay in one Mesa cache even where a test gives
# its subprocesses a fresh XDG_CACHE_HOME: a fresh one compiles every shader
# again (a tiered MoE run: 11.5 -> 67 s on a 2-core Zen 3)
export MESA_SHADER_CACHE_DIR=${MESA_SHADER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mesa_shader_cache}
