"""Errors that reach the user as one clear line (exit status 2, no traceback)."""


class VkspecError(Exception):
    """Bad input: a checkpoint, config, request or file that vkspec cannot use."""
