// kiln — devices.
#pragma once
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { cpu, cuda };
inline constexpr int kDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;
  static Device cpu() { return {DeviceType::cpu, 0}; }
};

}  // namespace kiln
