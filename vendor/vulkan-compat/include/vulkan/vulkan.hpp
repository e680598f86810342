// tributary: the system <vulkan/vulkan.hpp>, plus the three VK_EXT_layer_settings
// types that ggml-vulkan uses when the system headers predate them (Vulkan-Headers
// 1.3.272; Debian 12 ships 1.3.239, Ubuntu 22.04 1.3.204). Layout and values as
// in the Vulkan registry; ggml only chains the create-info into the instance's
// pNext, which a loader or driver that lacks the extension ignores. Used by the
// Vulkan build only (scripts/gpu-calibrate.sh sets VULKAN_SDK to this folder's
// parent when the system headers are older). vendor/README.md.
#pragma once
#include_next <vulkan/vulkan.hpp>

#if VK_HEADER_VERSION < 272
#include <cstdint>
#include <vector>

namespace VULKAN_HPP_NAMESPACE {
enum class LayerSettingTypeEXT : int32_t {
  eBool32 = 0,
  eInt32 = 1,
  eInt64 = 2,
  eUint32 = 3,
  eUint64 = 4,
  eFloat32 = 5,
  eFloat64 = 6,
  eString = 7,
};

struct LayerSettingEXT {
  const char * pLayerName;
  const char * pSettingName;
  LayerSettingTypeEXT type;
  uint32_t valueCount;
  const void * pValues;
};

struct LayerSettingsCreateInfoEXT {
  explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT> & settings)
      : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
  VkStructureType sType = static_cast<VkStructureType>(1000496000);  // VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT
  const void * pNext = nullptr;
  uint32_t settingCount;
  const LayerSettingEXT * pSettings;
};
}  // namespace VULKAN_HPP_NAMESPACE
#endif
