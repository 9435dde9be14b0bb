"""Errors that reach the user as one clear line (exit status 2, no traceback)."""


class VkspecError(Exception):
    """Bad input: a checkpoint, config, request or file that vkspec cannot use."""


class DeviceError(VkspecError, RuntimeError):
    """A device that cannot run vkspec's exact path, or a device call that
    failed (out of device memory, device lost, a failed submission). A leaf
    here, not in backends/vulkan, so that the decoder and the server can catch
    it without importing a backend. (Also a RuntimeError: what it was before.)"""
