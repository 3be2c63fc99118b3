// kiln core: Array construction and host access.
#include <atomic>
#include <cstring>

#include "kiln/array.h"

#include "core/array_node.h"

namespace kiln {

ArrayNode::~ArrayNode() {
  drop_inputs();
}

void ArrayNode::drop_inputs() {
  for (auto& in : inputs)
    if (in.node()) in.node()->graph_users.fetch_sub(1, std::memory_order_relaxed);
  inputs.clear();
}

uint64_t next_array_id() {
  static std::atomic<uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

Array Array::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape)
    if (d < 0) fail("array", "negative dimension in shape " + str(shape));
  // A byte count that wraps around would allocate less than the shape holds.
  int64_t bytes = static_cast<int64_t>(size_of(dtype));
  for (auto d : shape)
    if (__builtin_mul_overflow(bytes, d, &bytes))
      fail("array",
           "shape " + str(shape) + " of " + name_of(dtype) + " holds more than 2^63 bytes");
  auto node = std::make_shared<ArrayNode>();
  node->shape = shape;
  node->dtype = dtype;
  node->device = device;
  node->buffer =
      std::make_shared<Buffer>(&allocator_for(device), numel(shape) * size_of(dtype), device);
  node->id = next_array_id();
  return Array(std::move(node));
}

Array Array::from_data(const void* data, const Shape& shape, DType dtype, Device device) {
  if (!device.host_visible()) return from_data(data, shape, dtype, Device::cpu()).to(device);
  Array a = empty(shape, dtype, device);
  if (a.nbytes()) std::memcpy(a.raw(), data, a.nbytes());
  return a;
}

const Shape& Array::shape() const {
  return node_->shape;
}
DType Array::dtype() const {
  return node_->dtype;
}
Device Array::device() const {
  return node_->device;
}
uint64_t Array::id() const {
  return node_->id;
}
bool Array::is_materialized() const {
  return node_->buffer != nullptr;
}
bool Array::has_primitive() const {
  return node_->primitive != nullptr;
}
const std::shared_ptr<Primitive>& Array::primitive() const {
  return node_->primitive;
}
const std::vector<Array>& Array::inputs() const {
  return node_->inputs;
}
std::shared_ptr<Buffer> Array::buffer() const {
  return node_->buffer;
}

int64_t Array::dim(int axis) const {
  return shape()[normalize_axis(axis, ndim(), "array")];
}

void* Array::raw() const {
  if (!node_) fail("array", "use of an empty Array handle");
  if (node_->donated)
    fail("array",
         "this array was donated to a compiled function, which reused its buffer; "
         "use the arrays that function returned");
  if (!node_->buffer) fail("array", "data of an array that has not been evaluated");
  return static_cast<char*>(node_->buffer->data()) + node_->offset;
}

void Array::copy_to_host(void* dst, DType dst_dtype) const {
  eval();
  if (!device().host_visible()) return to(Device::cpu()).copy_to_host(dst, dst_dtype);
  convert(raw(), dtype(), dst, dst_dtype, size());
}

namespace {
template <typename S, typename D>
void convert_typed(const S* s, D* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<D, bool>)
      d[i] = static_cast<float>(s[i]) != 0.0f;
    else if constexpr (std::is_same_v<D, bf16> || std::is_same_v<D, f16>)
      d[i] = D(static_cast<float>(s[i]));
    else if constexpr (std::is_same_v<S, bf16> || std::is_same_v<S, f16>)
      d[i] = static_cast<D>(static_cast<float>(s[i]));
    else
      d[i] = static_cast<D>(s[i]);
  }
}

template <typename S>
void convert_from(const S* s, void* dst, DType dt, int64_t n) {
  switch (dt) {
    case DType::f32: return convert_typed(s, static_cast<float*>(dst), n);
    case DType::f64: return convert_typed(s, static_cast<double*>(dst), n);
    case DType::bf16: return convert_typed(s, static_cast<bf16*>(dst), n);
    case DType::i32: return convert_typed(s, static_cast<int32_t*>(dst), n);
    case DType::i64: return convert_typed(s, static_cast<int64_t*>(dst), n);
    case DType::bool_: return convert_typed(s, static_cast<bool*>(dst), n);
    case DType::f16: return convert_typed(s, static_cast<f16*>(dst), n);
  }
  fail("convert", std::string("conversion to ") + name_of(dt) + " is not supported");
}
}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (n <= 0) return;  // empty arrays may have no storage at all
  if (st == dt) {
    std::memcpy(dst, src, n * size_of(st));
    return;
  }
  switch (st) {
    case DType::f32: return convert_from(static_cast<const float*>(src), dst, dt, n);
    case DType::f64: return convert_from(static_cast<const double*>(src), dst, dt, n);
    case DType::bf16: return convert_from(static_cast<const bf16*>(src), dst, dt, n);
    case DType::i32: return convert_from(static_cast<const int32_t*>(src), dst, dt, n);
    case DType::i64: return convert_from(static_cast<const int64_t*>(src), dst, dt, n);
    case DType::bool_: return convert_from(static_cast<const bool*>(src), dst, dt, n);
    case DType::f16: return convert_from(static_cast<const f16*>(src), dst, dt, n);
  }
  fail("convert", std::string("conversion from ") + name_of(st) + " is not supported");
}

}  // namespace kiln
