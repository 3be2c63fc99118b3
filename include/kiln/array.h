// kiln — Array: a cheap shared handle to an n-d array.
//
// An Array is either materialized (it holds a Buffer) or pending (it holds the
// Primitive and the input Arrays that will produce it). Eager execution runs
// each primitive as it is created; lazy execution and tracing keep the graph
// and materialize it on eval(). Arrays are contiguous and row-major.
#pragma once
#include <memory>
#include <vector>

#include "kiln/allocator.h"
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/shape.h"

namespace kiln {

class Primitive;
class Array;

// What an Array points to: its buffer, or the primitive and inputs that will
// produce it, and the graph bookkeeping of differentiation. Internal
// (src/core/array_node.h): the API reads it through Array.
struct ArrayNode;

class Array {
 public:
  Array() = default;
  explicit Array(std::shared_ptr<ArrayNode> node) : node_(std::move(node)) {}

  // A new materialized array holding a copy of `data` (n elements of dtype).
  static Array from_data(const void* data, const Shape& shape, DType dtype,
                         Device device = Device::cpu());
  // A new materialized array on `device` holding a copy of `data`, memory on
  // that device itself (another library's device array, through DLPack):
  // the copy is queued on the device's stream, behind the work queued there
  // (device_stream says which stream another library orders its writes
  // before), and has finished when this returns, so that the memory may be
  // freed then. On a host device (cpu, ref): from_data.
  static Array from_device_data(const void* data, const Shape& shape, DType dtype, Device device);
  template <typename T>
  static Array from_vector(const std::vector<T>& v, const Shape& shape) {
    if (static_cast<int64_t>(v.size()) != numel(shape))
      fail("array", "from_vector: " + std::to_string(v.size()) + " values for shape " + str(shape));
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> has no data()
      std::vector<uint8_t> bytes(v.begin(), v.end());
      return from_data(bytes.data(), shape, DType::bool_);
    } else {
      return from_data(v.data(), shape, dtype_of<T>::value);
    }
  }
  template <typename T>
  static Array scalar(T v) {
    return from_data(&v, {}, dtype_of<T>::value);
  }
  // An uninitialized materialized array (kernels fill it).
  static Array empty(const Shape& shape, DType dtype, Device device = Device::cpu());

  bool valid() const { return node_ != nullptr; }
  const Shape& shape() const;
  int64_t dim(int axis) const;  // negative counts from the end
  size_t ndim() const { return shape().size(); }
  int64_t size() const { return numel(shape()); }
  size_t nbytes() const { return size() * size_of(dtype()); }
  DType dtype() const;
  Device device() const;
  uint64_t id() const;

  bool is_materialized() const;
  bool has_primitive() const;
  const std::shared_ptr<Primitive>& primitive() const;  // (opaque: src/ops/primitive.h)
  const std::vector<Array>& inputs() const;
  // The storage of a materialized array (null while pending), shared: what
  // keeps it alive while another library reads it without a copy.
  std::shared_ptr<Buffer> buffer() const;

  // Runs whatever is pending to produce this array (no-op when materialized).
  void eval() const;
  // The same values on `device`: a Copy primitive (run at once in eager
  // mode, recorded under lazy and jit like any op, differentiable); this
  // array itself when it is there already.
  Array to(Device device) const;

  // Raw storage; the array must be materialized.
  void* raw() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Evaluates, then copies to host converting to T: the one point where a
  // value is read (an asynchronous device finishes its work first).
  template <typename T>
  std::vector<T> to_vector() const {
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> has no data()
      std::vector<uint8_t> bytes(size());
      copy_to_host(bytes.data(), DType::bool_);
      return std::vector<bool>(bytes.begin(), bytes.end());
    } else {
      std::vector<T> out(size());
      copy_to_host(out.data(), dtype_of<T>::value);
      return out;
    }
  }
  template <typename T>
  T item() const {
    if (size() != 1)
      fail("item", "array of shape " + str(shape()) + " has " + std::to_string(size()) +
                       " elements, expected 1");
    return to_vector<T>()[0];
  }
  void copy_to_host(void* dst, DType dst_dtype) const;

  // The node behind the handle (opaque here; the engine's code reads it
  // through src/core/array_node.h).
  ArrayNode* node() const { return node_.get(); }
  const std::shared_ptr<ArrayNode>& node_ptr() const { return node_; }
  bool same(const Array& other) const { return node_ == other.node_; }

 private:
  std::shared_ptr<ArrayNode> node_;
};

uint64_t next_array_id();
// Converts n elements between dtypes on the host.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

}  // namespace kiln
