// tributary: the system <vulkan/vulkan.h>, reached through this folder so that
// CMake's FindVulkan (VULKAN_SDK=vendor/vulkan-compat) puts the shim
// <vulkan/vulkan.hpp> next to it first on the include path. vendor/README.md.
#pragma once
#include_next <vulkan/vulkan.h>
