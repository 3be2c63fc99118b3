// kiln io: the safetensors format (https://github.com/huggingface/safetensors):
// 8 bytes little-endian header length N, N bytes of JSON, then the data.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/io.h"

namespace kiln::io {
namespace {

using json = nlohmann::json;

// A generous bound: real headers are kilobytes to a few megabytes.
constexpr uint64_t kMaxHeader = 100ull << 20;
// Elements in one tensor: 2^60 of 8 bytes still count in 64 bits (more would
// wrap the byte count around to match a short data range).
constexpr uint64_t kMaxElements = 1ull << 60;

bool dtype_from_name(const std::string& s, DType& dt) {
  static const std::pair<const char*, DType> names[] = {
      {"F32", DType::f32}, {"F64", DType::f64}, {"BF16", DType::bf16}, {"F16", DType::f16},
      {"I32", DType::i32}, {"I64", DType::i64}, {"BOOL", DType::bool_}};
  for (auto& [n, d] : names)
    if (s == n) {
      dt = d;
      return true;
    }
  return false;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::bool_: return "BOOL";
  }
  return "?";
}

}  // namespace

std::string read_file(const std::string& path, const std::string& origin) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) fail(origin, path + ": cannot open (" + std::strerror(errno) + ")");
  // Read at once into a string of the file's size (not through a growing
  // stream buffer, which copies a large file several times).
  const std::streamoff size = f.tellg();
  std::string out;
  if (size > 0) {
    out.resize(static_cast<size_t>(size));
    f.seekg(0);
    f.read(out.data(), size);
    if (f.gcount() != size) fail(origin, path + ": read error");
  } else {
    std::ostringstream ss;  // a size the stream does not know (a pipe)
    f.clear();
    f.seekg(0);
    ss << f.rdbuf();
    out = ss.str();
  }
  if (f.bad()) fail(origin, path + ": read error");
  return out;
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("write", tmp + ": cannot create (" + std::strerror(errno) + ")");
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t w = ::write(fd, contents.data() + done, contents.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("write", tmp + ": write failed (" + std::strerror(err) + ")");
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail("write", tmp + ": could not flush to disk");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("write", path + ": rename failed (" + std::strerror(err) + ")");
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  // The file is mapped, not read: each tensor is copied once, from the page
  // cache into its array (a 346 MB ViT-B loads in a third of the time).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("safetensors", path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8) {
    ::close(fd);
    return parse_safetensors(read_file(path, "safetensors"), path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return parse_safetensors(read_file(path, "safetensors"), path);
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  return parse_safetensors(std::string_view(static_cast<const char*>(map), size), path);
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path) {
  const std::string origin = "safetensors";
  auto bad = [&](const std::string& what) { fail(origin, path + ": " + what); };
  if (bytes.size() < 8)
    bad("file is " + std::to_string(bytes.size()) + " bytes, too short for a header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  if (n > kMaxHeader || n > bytes.size() - 8)
    bad("header length " + std::to_string(n) + " exceeds the file (" +
        std::to_string(bytes.size()) + " bytes)");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  } catch (const json::exception& e) {
    bad(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) bad("header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;

  SafetensorsFile out;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad("__metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) bad("__metadata__." + k + " is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    auto where = "tensor '" + name + "'";
    if (!entry.is_object()) bad(where + " is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) bad(where + " has no dtype");
    DType dt;
    std::string dts = entry["dtype"].get<std::string>();
    if (!dtype_from_name(dts, dt))
      bad(where + " has dtype " + dts + ", expected one of F32, F64, BF16, F16, I32, I64, BOOL");
    if (!entry.contains("shape") || !entry["shape"].is_array()) bad(where + " has no shape");
    Shape shape;
    uint64_t count = 1;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_unsigned())
        bad(where + " has a shape entry that is not a non-negative integer");
      uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || (v && count > kMaxElements / v))
        bad(where + " has shape " + entry["shape"].dump() +
            ", expected at most 2^60 elements and dimensions of at most 2^40");
      count *= v;
      shape.push_back(static_cast<int64_t>(v));
    }
    auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad(where + " has no valid data_offsets [begin, end]");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad(where + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
          "] outside the " + std::to_string(data_size) + " data bytes");
    if (end - begin != count * size_of(dt))
      bad(where + " has " + std::to_string(end - begin) + " bytes, expected " +
          std::to_string(count * size_of(dt)) + " for " + dts + " " + str(shape));
    ranges.emplace_back(begin, end, name);
    out.tensors.emplace(name, Array::from_data(data + begin, shape, dt));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (std::get<0>(ranges[i]) < std::get<1>(ranges[i - 1]))
      bad("tensors '" + std::get<2>(ranges[i - 1]) + "' and '" + std::get<2>(ranges[i]) +
          "' overlap");
  return out;
}

void save_safetensors(const std::string& path, const Params& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& [name, a] : tensors) {
    if (!a.valid()) fail("safetensors", path + ": tensor '" + name + "' is an empty Array handle");
    uint64_t bytes = a.nbytes();
    header[name] = {{"dtype", dtype_name(a.dtype())},
                    {"shape", a.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + offset);
  for (auto& [name, a] : tensors) {
    // Values on a device whose memory the host cannot read are copied first.
    const Array host = a.device().host_visible() ? a : a.to(Device::cpu());
    host.eval();
    out.append(static_cast<const char*>(host.raw()), host.nbytes());
  }
  write_file_atomic(path, out);
}

}  // namespace kiln::io
