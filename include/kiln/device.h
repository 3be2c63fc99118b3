// kiln — devices.
#pragma once
#include <cstdint>
#include <string>

namespace kiln {

// cpu: the host's threads and libraries. ref: the reference backend — every
// primitive in plain loops with f64 accumulation, in host memory; slow, and a
// second real device on every machine. cuda: an NVIDIA GPU.
enum class DeviceType : uint8_t { cpu, cuda, ref };
inline constexpr int kDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;
  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device ref() { return {DeviceType::ref, 0}; }
  static Device cuda(int n = 0) { return {DeviceType::cuda, n}; }
  // Its memory is host memory that the CPU reads and writes directly.
  bool host_visible() const { return type != DeviceType::cuda; }
};

}  // namespace kiln
