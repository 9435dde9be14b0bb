"""The Vulkan backend: the dense chain recorded once per step shape and replayed."""
