// kiln's Python module: kiln.Array (its methods and operators), numpy views
// and DLPack both ways.
#include "common.h"

namespace kiln_python {

// ---- DLPack and numpy views -------------------------------------------------

nb::dlpack::dtype dlpack_dtype(DType d) {
  switch (d) {
    case DType::f32: return nb::dtype<float>();
    case DType::f64: return nb::dtype<double>();
    case DType::bf16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::f16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::i32: return nb::dtype<int32_t>();
    case DType::i64: return nb::dtype<int64_t>();
    case DType::bool_: return nb::dtype<bool>();
  }
  return nb::dtype<float>();
}

DType kiln_dtype(nb::dlpack::dtype t, const char* who) {
  using Code = nb::dlpack::dtype_code;
  auto code = static_cast<Code>(t.code);
  if (t.lanes == 1) {
    if (code == Code::Float && t.bits == 32) return DType::f32;
    if (code == Code::Float && t.bits == 64) return DType::f64;
    if (code == Code::Float && t.bits == 16) return DType::f16;
    if (code == Code::Bfloat && t.bits == 16) return DType::bf16;
    if (code == Code::Int && t.bits == 32) return DType::i32;
    if (code == Code::Int && t.bits == 64) return DType::i64;
    if (code == Code::Bool && t.bits == 8) return DType::bool_;
  }
  static const char* names[] = {"int",    "uint",    "float", "opaque handle",
                                "bfloat", "complex", "bool"};
  std::string name = t.code <= 6 ? names[t.code] : "code " + std::to_string(t.code);
  kiln::fail(who, "an array of " + name + std::to_string(t.bits) +
                      (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "") +
                      " elements; kiln holds float32, float64, bfloat16, float16, int32, int64 "
                      "and bool");
}

// Buffers that a numpy array or a DLPack consumer still reads: donating one
// of them to a jitted function would change what the view shows, so jit
// refuses (as JAX refuses to donate a buffer with external references).
std::mutex exported_mutex;
std::unordered_map<const kiln::Buffer*, int> exported;

struct Export {
  std::shared_ptr<kiln::Buffer> buffer;
  explicit Export(std::shared_ptr<kiln::Buffer> b) : buffer(std::move(b)) {
    std::lock_guard lock(exported_mutex);
    ++exported[buffer.get()];
  }
  ~Export() {
    std::lock_guard lock(exported_mutex);
    if (--exported[buffer.get()] == 0) exported.erase(buffer.get());
  }
};

bool is_exported(const Array& a) {
  if (!a.valid() || !a.is_materialized()) return false;
  std::lock_guard lock(exported_mutex);
  return exported.count(a.buffer().get()) != 0;
}

// A view of a's memory (materialized first) that keeps the memory alive.
template <typename... Tags>
nb::ndarray<Tags...> view_of(const Array& a, bool bits16_as_uint) {
  {
    nb::gil_scoped_release release;
    a.eval();
  }
  void* data = a.raw();  // (fails for a donated array)
  std::vector<size_t> shape(a.shape().begin(), a.shape().end());
  auto* owner = new Export(a.buffer());
  nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<Export*>(p); });
  nb::dlpack::dtype t = dlpack_dtype(a.dtype());
  if (bits16_as_uint && (a.dtype() == DType::bf16 || a.dtype() == DType::f16))
    t = nb::dtype<uint16_t>();
  int device_type =
      a.device().type == DeviceType::cuda ? nb::device::cuda::value : nb::device::cpu::value;
  return nb::ndarray<Tags...>(data, shape.size(), shape.data(), keep, nullptr, t, device_type,
                              a.device().type == DeviceType::cuda ? a.device().index : 0);
}

// The elements of a strided array (strides in elements, any sign) in C
// order: a row of the last dimension at a time, one memcpy per row where the
// row is contiguous.
std::vector<uint8_t> gather(const void* data, const Shape& shape,
                            const std::vector<int64_t>& strides, size_t elem) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> out(static_cast<size_t>(n) * elem);
  if (n == 0) return out;
  const auto* base = static_cast<const uint8_t*>(data);
  const size_t nd = shape.size();
  const int64_t row = nd ? shape[nd - 1] : 1, step = nd ? strides[nd - 1] : 1;
  std::vector<int64_t> idx(nd, 0);
  uint8_t* dst = out.data();
  for (int64_t r = 0; r < n / row; ++r) {
    int64_t off = 0;
    for (size_t d = 0; d + 1 < nd; ++d) off += idx[d] * strides[d];
    const uint8_t* src = base + off * static_cast<int64_t>(elem);
    if (step == 1) {
      std::memcpy(dst, src, row * elem);
    } else {
      for (int64_t j = 0; j < row; ++j)
        std::memcpy(dst + j * elem, src + j * step * static_cast<int64_t>(elem), elem);
    }
    dst += row * elem;
    for (int d = static_cast<int>(nd) - 2; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
  }
  return out;
}

// A new kiln array holding a copy of x (any DLPack-capable or numpy array),
// in x's dtype, or `bits_of`: x's bytes read as that dtype (ml_dtypes'
// bfloat16 reaches here as uint16).
Array from_ndarray(nb::ndarray<nb::ro> x, std::optional<Device> device,
                   std::optional<DType> bits_of) {
  DType dt;
  if (bits_of) {
    if (x.dtype().bits != 8 * kiln::size_of(*bits_of) || x.dtype().lanes != 1)
      kiln::fail("asarray", std::to_string(x.dtype().bits) + "-bit elements read as " +
                                kiln::name_of(*bits_of));
    dt = *bits_of;
  } else {
    dt = kiln_dtype(x.dtype(), "asarray");
  }
  Shape shape;
  for (size_t i = 0; i < x.ndim(); ++i) shape.push_back(static_cast<int64_t>(x.shape(i)));
  bool contiguous = true;
  int64_t expect = 1;
  for (int i = static_cast<int>(x.ndim()) - 1; i >= 0; --i) {
    if (x.shape(i) != 1 && x.stride(i) != expect) contiguous = false;
    expect *= static_cast<int64_t>(x.shape(i));
  }
  Device src = Device::cpu();
  if (x.device_type() == nb::device::cuda::value)
    src = Device::cuda(x.device_id());
  else if (x.device_type() != nb::device::cpu::value)
    kiln::fail("asarray", "arrays on DLPack device type " + std::to_string(x.device_type()) +
                              " are not supported (cpu and cuda are)");
  Device dst = device.value_or(src);
  nb::gil_scoped_release release;
  if (src.type == DeviceType::cuda) {
    // Another library's device memory (its writes ordered before kiln's
    // stream by the producer: kiln.from_dlpack passes that stream to
    // __dlpack__), copied on the device before this returns.
    if (!contiguous)
      kiln::fail("asarray", "a strided (non-contiguous) device array of shape " + kiln::str(shape) +
                                ": make it contiguous first (x.contiguous())");
    Array a = Array::from_device_data(x.data(), shape, dt, src);
    return dst == src ? a : a.to(dst);
  }
  if (contiguous) {
    Array a = Array::from_data(x.data(), shape, dt, Device::cpu());
    return dst == Device::cpu() ? a : a.to(dst);
  }
  // A strided view (a transposed or sliced PyTorch tensor): gathered in C
  // order, a row of the last dimension at a time.
  std::vector<int64_t> strides(x.ndim());
  for (size_t i = 0; i < x.ndim(); ++i) strides[i] = x.stride(i);
  std::vector<uint8_t> packed = gather(x.data(), shape, strides, kiln::size_of(dt));
  Array a = Array::from_data(packed.data(), shape, dt, Device::cpu());
  return dst == Device::cpu() ? a : a.to(dst);
}

nb::object item(const Array& a) {
  if (a.size() != 1)
    kiln::fail("item", "array of shape " + kiln::str(a.shape()) + " has " +
                           std::to_string(a.size()) + " elements, expected 1");
  // Read without the GIL: it may run what the array is pending on.
  auto read = [&](auto zero) {
    nb::gil_scoped_release release;
    return a.item<decltype(zero)>();
  };
  if (a.dtype() == DType::bool_) return nb::bool_(read(false));
  if (kiln::is_integral(a.dtype())) return nb::int_(read(int64_t{0}));
  return nb::float_(read(0.0));
}

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (auto d : s) l.append(d);
  return nb::tuple(l);
}

void bind_arrays(nb::module_& m) {
  nb::exception<kiln::Error>(m, "KilnError", PyExc_RuntimeError);

  nb::enum_<DType>(m, "DType", "An array's element type.")
      .value("float32", DType::f32)
      .value("float64", DType::f64)
      .value("bfloat16", DType::bf16)
      .value("float16", DType::f16)
      .value("int32", DType::i32)
      .value("int64", DType::i64)
      .value("bool_", DType::bool_)
      .def_prop_ro("itemsize", [](DType d) { return kiln::size_of(d); })
      .def_prop_ro("is_floating", [](DType d) { return kiln::is_floating(d); });
  m.def("promote_types", &kiln::promote, "a"_a, "b"_a,
        "The dtype two operands are computed in: the wider float, else the wider int.");

  nb::class_<Device>(m, "Device", "A device: cpu, ref (the reference backend) or cuda:N.")
      .def(
          "__init__",
          [](Device* d, const std::string& text) { new (d) Device(kiln::parse_device(text)); },
          "name"_a)
      .def_prop_ro(
          "type",
          [](const Device& d) {
            return d.type == DeviceType::cpu ? "cpu" : d.type == DeviceType::ref ? "ref" : "cuda";
          })
      .def_ro("index", &Device::index)
      .def("__str__", &Device::str)
      .def("__repr__", [](const Device& d) { return "Device('" + d.str() + "')"; })
      .def(
          "__eq__", [](const Device& a, const Device& b) { return a == b; }, "other"_a.none())
      .def("__hash__", [](const Device& d) { return static_cast<int>(d.type) * 1024 + d.index; });
  m.def("cuda_device_count", &kiln::cuda_device_count, kiln_doc("cuda_device_count"));
  m.def("cuda_unavailable_reason", &kiln::cuda_unavailable_reason,
        kiln_doc("cuda_unavailable_reason"));
  m.def("device_name", &kiln::device_name, "device"_a, kiln_doc("device_name"));
  m.def("synchronize", &kiln::synchronize, "device"_a, NoGil(), kiln_doc("synchronize"));
  m.def("_kernel_profile_report", &kiln::kernel_profile_report);

  nb::class_<Array> array(m, "Array", "An n-dimensional array on a device (kiln::Array).");
  array.def_prop_ro("shape", [](const Array& a) { return shape_tuple(a.shape()); })
      .def_prop_ro("dtype", &Array::dtype)
      .def_prop_ro("ndim", [](const Array& a) { return a.ndim(); })
      .def_prop_ro("size", &Array::size)
      .def_prop_ro("nbytes", &Array::nbytes)
      .def_prop_ro("device", &Array::device)
      .def_prop_ro("is_materialized", &Array::is_materialized)
      .def_prop_ro(
          "T", [](const Array& a) { return kiln::transpose(a); }, NoGil(),
          "The array with its axes reversed.")
      .def("eval", &Array::eval, NoGil(), "Runs whatever is pending to produce this array.")
      .def("item", &item, "The value of a one-element array as a Python number.")
      .def(
          "_to_device", [](const Array& a, const Device& d) { return a.to(d); }, "device"_a,
          NoGil(), "The same values on `device` (a Device; `to` takes its names too).")
      .def(
          "_host_view", [](const Array& a) { return view_of<nb::numpy, nb::ro>(a, true); },
          "A read-only numpy array over this host array's memory (bf16 and f16 as uint16).")
      .def(
          "_dlpack_view", [](const Array& a) { return view_of<nb::array_api>(a, false); },
          "An nb_ndarray over this array's memory, for __dlpack__.")
      .def("__len__",
           [](const Array& a) {
             if (a.ndim() == 0) kiln::fail("len", "len() of a 0-d array");
             return a.shape()[0];
           })
      .def(
          "__neg__", [](const Array& a) { return kiln::neg(a); }, NoGil())
      .def(
          "__abs__", [](const Array& a) { return kiln::abs(a); }, NoGil())
      .def("__add__", binary([](const Array& a, const Array& b) { return kiln::add(a, b); }),
           "other"_a.none())
      .def("__radd__", rbinary([](const Array& a, const Array& b) { return kiln::add(a, b); }),
           "other"_a.none())
      .def("__sub__", binary([](const Array& a, const Array& b) { return kiln::subtract(a, b); }),
           "other"_a.none())
      .def("__rsub__", rbinary([](const Array& a, const Array& b) { return kiln::subtract(a, b); }),
           "other"_a.none())
      .def("__mul__", binary([](const Array& a, const Array& b) { return kiln::multiply(a, b); }),
           "other"_a.none())
      .def("__rmul__", rbinary([](const Array& a, const Array& b) { return kiln::multiply(a, b); }),
           "other"_a.none())
      .def("__truediv__", binary([](const Array& a, const Array& b) { return kiln::divide(a, b); }),
           "other"_a.none())
      .def("__rtruediv__",
           rbinary([](const Array& a, const Array& b) { return kiln::divide(a, b); }),
           "other"_a.none())
      .def("__matmul__", binary([](const Array& a, const Array& b) { return kiln::matmul(a, b); }),
           "other"_a.none())
      .def("__rmatmul__",
           rbinary([](const Array& a, const Array& b) { return kiln::matmul(a, b); }),
           "other"_a.none())
      .def("__eq__", binary([](const Array& a, const Array& b) { return kiln::equal(a, b); }),
           "other"_a.none())
      .def("__ne__", binary([](const Array& a, const Array& b) { return kiln::not_equal(a, b); }),
           "other"_a.none())
      .def("__lt__", binary([](const Array& a, const Array& b) { return kiln::less(a, b); }),
           "other"_a.none())
      .def("__le__", binary([](const Array& a, const Array& b) { return kiln::less_equal(a, b); }),
           "other"_a.none())
      .def("__gt__", binary([](const Array& a, const Array& b) { return kiln::greater(a, b); }),
           "other"_a.none())
      .def("__ge__",
           binary([](const Array& a, const Array& b) { return kiln::greater_equal(a, b); }),
           "other"_a.none());
  // Arrays compare elementwise, so they are not hashable (as numpy's and JAX's).
  nb::setattr(array, "__hash__", nb::none());
  // numpy defers `ndarray + Array` to Array.__radd__.
  nb::setattr(array, "__array_priority__", nb::int_(100));

  // The methods written in Python (python/kiln/_array.py): numpy-style
  // indexing, the numpy and DLPack protocols, and the forms that take
  // Python's dtypes, devices, shapes and axes. Declared here with the rest,
  // so that kiln.Array has this one definition and its type stub (_kiln.pyi)
  // lists every method; each calls its function in kiln._array.
  struct PythonMethod {
    const char* name;  // the method
    const char* impl;  // its function in kiln._array
    const char* sig;   // its signature, for the type stub (_kiln.pyi) and help()
    const char* doc;
  };
  static const PythonMethod kMethods[] = {
      {"__getitem__", "_getitem", "def __getitem__(self, key: typing.Any, /) -> Array",
       "NumPy's indexing: integers, slices, None, ..., integer and boolean arrays."},
      {"__array__", "_array_protocol",
       "def __array__(self, dtype: typing.Any = None, copy: bool | None = None) -> "
       "numpy.ndarray",
       "numpy's view (the host's memory where it can) or copy of the values."},
      {"__dlpack__", "_dlpack",
       "def __dlpack__(self, *, stream: typing.Any = None, max_version: typing.Any = None, "
       "dl_device: typing.Any = None, copy: bool | None = None) -> typing.Any",
       "A DLPack capsule over this array's memory."},
      {"__dlpack_device__", "_dlpack_device", "def __dlpack_device__(self) -> tuple[int, int]",
       "DLPack's (device type, index) of this array."},
      {"__repr__", "_repr", "def __repr__(self) -> str", nullptr},
      {"__iter__", "_iter", "def __iter__(self) -> typing.Iterator[Array]",
       "The rows along the first axis."},
      {"__bool__", "_bool", "def __bool__(self) -> bool", nullptr},
      {"__float__", "_float", "def __float__(self) -> float", nullptr},
      {"__int__", "_int", "def __int__(self) -> int", nullptr},
      {"__index__", "_index", "def __index__(self) -> int", nullptr},
      {"reshape", "_reshape", "def reshape(self, *shape: typing.Any) -> Array",
       "The same values in `shape` (ints, or one sequence; -1 once: inferred)."},
      {"transpose", "_transpose", "def transpose(self, *axes: typing.Any) -> Array",
       "The axes permuted (ints, or one sequence); none: reversed."},
      {"astype", "_astype", "def astype(self, dtype: typing.Any) -> Array",
       "The values converted to `dtype` (a kiln dtype, a name, a numpy dtype or type)."},
      {"to", "_to", "def to(self, device: typing.Any) -> Array",
       "The same values on `device` (a Device or its name: 'cpu', 'ref', 'cuda:0')."},
      {"sum", "_sum", "def sum(self, axis: typing.Any = None, keepdims: bool = False) -> Array",
       nullptr},
      {"mean", "_mean", "def mean(self, axis: typing.Any = None, keepdims: bool = False) -> Array",
       nullptr},
      {"max", "_max", "def max(self, axis: typing.Any = None, keepdims: bool = False) -> Array",
       nullptr},
      {"argmax", "_argmax",
       "def argmax(self, axis: int | None = None, keepdims: bool = False) -> Array",
       "The index of the largest value (of the flattened array when axis is None)."},
      {"flatten", "_flatten", "def flatten(self) -> Array", "The values as one axis."},
      {"tolist", "_tolist", "def tolist(self) -> typing.Any", "The values as nested lists."},
      {"numpy", "_numpy", "def numpy(self) -> numpy.ndarray", "A writable numpy copy."},
  };
  for (const PythonMethod& m : kMethods) {
    const char* impl = m.impl;
    auto call = [impl](nb::handle self, nb::args args, nb::kwargs kwargs) {
      return nb::module_::import_("kiln._array").attr(impl)(self, *args, **kwargs);
    };
    if (m.doc)
      array.def(m.name, call, nb::sig(m.sig), m.doc);
    else
      array.def(m.name, call, nb::sig(m.sig));
  }
}

// The bindings of creation and elementwise ops.

}  // namespace kiln_python
