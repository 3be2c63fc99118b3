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

// "cpu", "ref", "cuda" (cuda:0) or "cuda:N"; fails naming `what` (a flag or
// field) and the text otherwise.
Device parse_device(const std::string& text, const std::string& what = "device");

// The CUDA GPUs this process can use: 0 where kiln was built without the CUDA
// backend or no driver or GPU is present (cuda_unavailable_reason says which).
int cuda_device_count();
std::string cuda_unavailable_reason();
// "NVIDIA H200" for a CUDA device; the device's str() otherwise.
std::string device_name(Device device);

// Waits until everything queued on `device` has run. CUDA ops are queued on
// the device's stream and the host waits only where it reads a value
// (item, to_vector, copy_to_host, to(cpu)); call this before reading a clock.
// The host backends' kernels finish before they return: nothing to wait for.
void synchronize(Device device);

// The stream (a cudaStream_t) that kiln's work on a CUDA device queues on:
// what another library orders its work against when it hands kiln its
// memory (DLPack's `stream` argument). Null on the host devices; fails naming
// the reason where the device is unavailable.
void* device_stream(Device device);

}  // namespace kiln
