// kiln's Python module (kiln._kiln): arrays, ops and transformations over
// libkiln with nanobind. The Python files of python/kiln/ build the public
// interface (trees, keyword arguments, indexing) over these functions.
//
// The GIL: every call that can run kernels (an op in eager mode, eval, a
// jitted call, a transformation) releases it; a Python function that kiln
// calls back (a traced or differentiated function) takes it again, and an
// exception it raises travels through kiln's C++ code back to the caller
// unchanged.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "command_line.h"
#include "kiln/data.h"
#include "kiln/gpt2.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/model.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/tokenizer.h"
#include "kiln_docstrings.h"

namespace nb = nanobind;
using namespace nb::literals;
using kiln::Array;
using kiln::Device;
using kiln::DeviceType;
using kiln::DType;
using kiln::Shape;

namespace {

using NoGil = nb::call_guard<nb::gil_scoped_release>;

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

// ---- Python numbers as operands ---------------------------------------------

// The array a Python operand stands for beside `like`: an Array as it is, a
// Python number as a scalar of like's dtype (a float beside an integer or
// bool array: float32; an int beside a bool array: int32), as JAX's weak
// types make it; anything else (numpy) through asarray.
Array operand(const Array& like, nb::handle x) {
  if (nb::isinstance<Array>(x)) return nb::cast<Array>(x);
  DType dt = like.dtype();
  double v;
  if (nb::isinstance<nb::bool_>(x)) {
    v = nb::cast<bool>(x) ? 1 : 0;
  } else if (nb::isinstance<nb::int_>(x)) {
    v = static_cast<double>(nb::cast<int64_t>(x));
    if (dt == DType::bool_) dt = DType::i32;
  } else if (nb::isinstance<nb::float_>(x)) {
    v = nb::cast<double>(x);
    if (!kiln::is_floating(dt)) dt = DType::f32;
  } else {
    return from_ndarray(nb::cast<nb::ndarray<nb::ro>>(x), like.device(), std::nullopt);
  }
  return kiln::full({}, v, dt, like.device());
}

// Whether a Python object can be an operand beside an array: an array, a
// number, or something with the buffer or array protocol (numpy arrays).
bool is_operand(nb::handle x) {
  return nb::isinstance<Array>(x) || nb::isinstance<nb::bool_>(x) || nb::isinstance<nb::int_>(x) ||
         nb::isinstance<nb::float_>(x) || nb::hasattr(x, "__array_interface__") ||
         nb::hasattr(x, "__dlpack__");
}

// An operator: NotImplemented for other operands (so that `a == None` is
// False, as Python's fallback makes it), else f(a, b) without the GIL.
template <bool Reflected, typename F>
auto operator_of(F f) {
  return [f](const Array& a, nb::handle b) -> nb::object {
    if (!is_operand(b)) return nb::borrow(Py_NotImplemented);
    Array other = operand(a, b);
    Array out;
    {
      nb::gil_scoped_release release;
      out = Reflected ? f(other, a) : f(a, other);
    }
    return nb::cast(std::move(out));
  };
}
template <typename F>
auto binary(F f) {
  return operator_of<false>(f);
}
template <typename F>
auto rbinary(F f) {
  return operator_of<true>(f);
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

std::vector<int> axes_of(nb::handle axis) {
  if (axis.is_none()) return {};
  if (nb::isinstance<nb::int_>(axis)) return {nb::cast<int>(axis)};
  return nb::cast<std::vector<int>>(axis);
}

// ---- Python functions called from kiln ---------------------------------------

// A Python callable that kiln calls (possibly without the GIL held): the
// call takes the GIL, and so do copies' and the last owner's reference counts.
struct PyFn {
  nb::object fn;
  explicit PyFn(nb::object f) : fn(std::move(f)) {}
  ~PyFn() {
    if (nb::detail::cleanup_guard guard{})
      fn.reset();
    else
      fn.release();  // the interpreter has gone: there is nothing to give back
  }
};

kiln::VectorFn vector_fn(nb::callable fn) {
  auto holder = std::make_shared<PyFn>(std::move(fn));
  return [holder](const std::vector<Array>& args) {
    nb::gil_scoped_acquire gil;
    nb::object out = holder->fn(args);
    return nb::cast<std::vector<Array>>(out);
  };
}

nb::dict stats_dict(const kiln::CacheStats& s) {
  nb::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["compiles"] = s.compiles;
  d["evictions"] = s.evictions;
  d["replays"] = s.replays;
  return d;
}

nb::dict compile_dict(const kiln::CompileStats& s) {
  nb::dict d;
  d["nodes_traced"] = s.nodes_traced;
  d["nodes_compiled"] = s.nodes_compiled;
  d["arena_bytes"] = s.arena_bytes;
  d["intermediate_bytes"] = s.intermediate_bytes;
  d["inplace"] = s.inplace;
  d["donated"] = s.donated;
  d["nodes_folded"] = s.nodes_folded;
  d["folded_bytes"] = s.folded_bytes;
  d["compile_ms"] = s.compile_ms;
  return d;
}

// A jitted Python function. The Python function usually reaches back to
// whatever holds this object (a module's globals), a reference cycle through
// C++ that Python's garbage collector sees only through tp_traverse and
// breaks with tp_clear: so the function is held here, where both reach it.
struct PyJitted {
  std::shared_ptr<PyFn> fn;
  kiln::Jitted jitted;
  // One call at a time: the compiled forms and their memory are the
  // function's own (recursive: a traced function may call it again).
  std::recursive_mutex mu;
  PyJitted(nb::callable f, kiln::JitOptions opt)
      : fn(std::make_shared<PyFn>(std::move(f))), jitted(traced_fn(fn), std::move(opt)) {}

  static kiln::VectorFn traced_fn(std::shared_ptr<PyFn> holder) {
    return [holder](const std::vector<Array>& args) {
      nb::gil_scoped_acquire gil;
      if (!holder->fn.is_valid()) kiln::fail("jit", "the jitted function was freed");
      return nb::cast<std::vector<Array>>(holder->fn(args));
    };
  }
};

int jitted_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  PyJitted* j = nb::inst_ptr<PyJitted>(self);
  Py_VISIT(j->fn->fn.ptr());
  return 0;
}

int jitted_clear(PyObject* self) {
  PyJitted* j = nb::inst_ptr<PyJitted>(self);
  j->fn->fn.reset();
  return 0;
}

PyType_Slot jitted_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(jitted_traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(jitted_clear)},
                              {0, nullptr}};

nb::object size2d(const kiln::nn::Size2d& s) {
  if (s.square()) return nb::int_(s.height);
  return nb::make_tuple(s.height, s.width);
}
kiln::nn::Size2d to_size2d(nb::handle h, const char* what) {
  if (nb::isinstance<nb::int_>(h)) return kiln::nn::Size2d(nb::cast<int64_t>(h));
  auto v = nb::cast<std::vector<int64_t>>(h);
  if (v.size() != 2)
    kiln::fail(
        what, "an integer or a (height, width) pair, got " + std::to_string(v.size()) + " numbers");
  return {v[0], v[1]};
}

// One field of a ViTConfig set from Python (ViTConfig's keyword arguments).
void set_config_field(kiln::nn::ViTConfig& c, const std::string& k, nb::handle v) {
  if (k == "hidden_size")
    c.hidden_size = nb::cast<int64_t>(v);
  else if (k == "num_hidden_layers")
    c.num_hidden_layers = nb::cast<int64_t>(v);
  else if (k == "num_attention_heads")
    c.num_attention_heads = nb::cast<int64_t>(v);
  else if (k == "intermediate_size")
    c.intermediate_size = nb::cast<int64_t>(v);
  else if (k == "hidden_dropout_prob")
    c.hidden_dropout_prob = nb::cast<double>(v);
  else if (k == "attention_probs_dropout_prob")
    c.attention_probs_dropout_prob = nb::cast<double>(v);
  else if (k == "initializer_range")
    c.initializer_range = nb::cast<double>(v);
  else if (k == "layer_norm_eps")
    c.layer_norm_eps = nb::cast<double>(v);
  else if (k == "num_channels")
    c.num_channels = nb::cast<int64_t>(v);
  else if (k == "qkv_bias")
    c.qkv_bias = nb::cast<bool>(v);
  else if (k == "num_labels")
    c.num_labels = nb::cast<int64_t>(v);
  else if (k == "id2label")
    c.id2label = nb::cast<std::vector<std::string>>(v);
  else if (k == "image_size")
    c.image_size = to_size2d(v, "image_size");
  else if (k == "patch_size")
    c.patch_size = to_size2d(v, "patch_size");
  else if (k == "hidden_act") {
    auto a = kiln::nn::activation_from_name(nb::cast<std::string>(v));
    if (!a)
      kiln::fail("ViTConfig", "hidden_act '" + nb::cast<std::string>(v) +
                                  "' is not an activation transformers knows");
    c.hidden_act = *a;
  } else {
    throw nb::type_error(("ViTConfig has no field '" + k + "'").c_str());
  }
}

// ---- data -------------------------------------------------------------------

// A data set written in Python: an object with __len__, image_shape and
// __getitem__(index) -> (image, label) (or get(index, epoch)). kiln's loader
// calls it from its worker threads, each call under the GIL.
class PyDataset final : public kiln::data::Dataset {
 public:
  explicit PyDataset(nb::object obj) : obj_(std::make_shared<PyFn>(std::move(obj))) {
    size_ = nb::cast<int64_t>(obj_->fn.attr("__len__")());
    shape_ = nb::cast<Shape>(obj_->fn.attr("image_shape"));
    with_epoch_ = nb::hasattr(obj_->fn, "get_epoch");
  }
  int64_t size() const override { return size_; }
  Shape image_shape() const override { return shape_; }
  void get(int64_t index, float* image, int32_t* label) const override {
    get(index, 0, image, label);
  }
  void get(int64_t index, int64_t epoch, float* image, int32_t* label) const override {
    nb::gil_scoped_acquire gil;
    nb::object item = with_epoch_ ? obj_->fn.attr("get_epoch")(index, epoch)
                                  : obj_->fn.attr("__getitem__")(index);
    auto pair = nb::cast<nb::tuple>(item);
    if (pair.size() != 2)
      kiln::fail("dataset", "item " + std::to_string(index) +
                                ": __getitem__ must return (image, label), got a tuple of " +
                                std::to_string(pair.size()));
    nb::object np = nb::module_::import_("numpy");
    auto x = nb::cast<nb::ndarray<const float, nb::c_contig, nb::device::cpu>>(
        np.attr("ascontiguousarray")(pair[0], "dtype"_a = np.attr("float32")));
    if (static_cast<int64_t>(x.size()) != kiln::numel(shape_))
      kiln::fail("dataset", "item " + std::to_string(index) + ": an image of " +
                                std::to_string(x.size()) + " values, expected image_shape " +
                                kiln::str(shape_));
    std::memcpy(image, x.data(), x.size() * sizeof(float));
    *label = nb::cast<int32_t>(pair[1]);
  }

 private:
  std::shared_ptr<PyFn> obj_;
  int64_t size_ = 0;
  Shape shape_;
  bool with_epoch_ = false;
};

// A loader whose destruction waits for its worker threads without the GIL
// (a worker may be waiting for it to call a Python data set).
struct PyLoader {
  std::shared_ptr<const kiln::data::Dataset> dataset;
  std::unique_ptr<kiln::data::Loader> loader;
  ~PyLoader() {
    nb::gil_scoped_release release;
    loader.reset();
  }
};

nb::dict step_dict(const kiln::train::StepTiming& s) {
  nb::dict d;
  d["step"] = s.step;
  d["seconds"] = s.seconds;
  d["data_seconds"] = s.data_seconds;
  d["loss"] = s.loss;
  d["lr"] = s.lr;
  return d;
}

nb::dict eval_dict(const kiln::train::EvalResult& e) {
  nb::dict d;
  d["step"] = e.step;
  d["loss"] = e.loss;
  d["accuracy"] = e.accuracy;
  d["top5"] = e.top5;
  d["samples"] = e.samples;
  d["seconds"] = e.seconds;
  if (e.has_ema) {
    d["ema_loss"] = e.ema_loss;
    d["ema_accuracy"] = e.ema_accuracy;
    d["ema_top5"] = e.ema_top5;
  }
  return d;
}

nb::dict report_dict(const kiln::train::TrainReport& r) {
  nb::dict d;
  nb::list steps, evals;
  for (auto& s : r.steps) steps.append(step_dict(s));
  for (auto& e : r.evals) evals.append(eval_dict(e));
  d["steps"] = steps;
  d["evals"] = evals;
  d["mean"] = r.mean;
  d["median"] = r.median;
  d["p90"] = r.p90;
  d["min"] = r.min;
  d["max"] = r.max;
  d["images_per_second"] = r.images_per_second;
  d["data_wait_share"] = r.data_wait_share;
  d["first_step_seconds"] = r.first_step_seconds;
  d["compile_ms"] = r.compile_ms;
  d["compiles"] = r.compiles;
  d["parameters"] = r.parameters;
  d["peak_rss_mib"] = r.peak_rss_mib;
  d["wall_seconds"] = r.wall_seconds;
  d["flops_per_step"] = r.flops_per_step;
  return d;
}

// kiln train with these flags (as the command line takes them), calling
// back into Python after each step, evaluation and save; Ctrl-C (any
// pending signal whose handler raises) stops the run at the next step.
nb::dict train_run(const std::vector<std::string>& flags, nb::object on_step, nb::object on_eval,
                   nb::object on_save) {
  std::vector<std::string> args = {"kiln", "train"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::ostringstream out, err;
  kiln::cli::CommandLine cl = kiln::cli::parse_command_line(args, out, err);
  if (cl.command != kiln::cli::Command::train) {
    std::string msg = err.str().empty() ? out.str() : err.str();
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    kiln::fail("train", msg.empty() ? "nothing to run" : msg);
  }
  if (cl.train.threads > 0) kiln::set_num_threads(cl.train.threads);
  auto call = [](const nb::object& fn, nb::object arg) {
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (!fn.is_none()) fn(arg);
  };
  kiln::train::Callbacks cb;
  cb.on_step = [&](const kiln::train::StepTiming& s) {
    nb::gil_scoped_acquire gil;
    call(on_step, step_dict(s));
  };
  cb.on_eval = [&](const kiln::train::EvalResult& e) {
    nb::gil_scoped_acquire gil;
    call(on_eval, eval_dict(e));
  };
  cb.on_save = [&](int64_t step, const std::string& dir) {
    nb::gil_scoped_acquire gil;
    call(on_save, nb::make_tuple(step, dir));
  };
  kiln::train::TrainReport report;
  {
    nb::gil_scoped_release release;
    kiln::cli::TrainSetup setup = kiln::cli::prepare_train(cl.train);
    report = kiln::train::run(setup.config, std::move(setup.resumed), cb, std::move(setup.init));
  }
  return report_dict(report);
}

struct Lazy {
  std::unique_ptr<kiln::LazyScope> scope;
};

// The bindings of the module's types: errors, dtypes, devices and arrays.
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
          "to", [](const Array& a, const Device& d) { return a.to(d); }, "device"_a, NoGil(),
          "The same values on `device`.")
      .def(
          "astype", [](const Array& a, DType d) { return kiln::astype(a, d); }, "dtype"_a, NoGil())
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
}

// The bindings of creation and elementwise ops.
void bind_ops(nb::module_& m) {
  // ---- creation ----
  m.def("_from_ndarray", &from_ndarray, "x"_a, "device"_a = nb::none(), "bits_of"_a = nb::none(),
        "A new array holding a copy of x (numpy or DLPack), in x's dtype.");
  m.def(
      "_copy",
      [](const Array& a) {
        nb::gil_scoped_release release;
        a.eval();
        return Array::from_device_data(a.raw(), a.shape(), a.dtype(), a.device());
      },
      "a"_a,
      "A new array holding a copy of a's values, on a's device (a DLPack copy=True export).");
  m.def(
      "_stream",
      [](const Device& d) { return reinterpret_cast<uintptr_t>(kiln::device_stream(d)); }, "d"_a,
      "The stream (as an integer) that kiln's work on a CUDA device queues on: DLPack's "
      "`stream` argument to a producer; 0 on host devices.");
  m.def("_exported", &is_exported, "a"_a, "Whether a numpy or DLPack view of a's memory is alive.");
  m.def("zeros", &kiln::zeros, "shape"_a, "dtype"_a = DType::f32, "device"_a = Device::cpu(),
        NoGil(), kiln_doc("zeros"));
  m.def("ones", &kiln::ones, "shape"_a, "dtype"_a = DType::f32, "device"_a = Device::cpu(), NoGil(),
        kiln_doc("ones"));
  m.def("full", &kiln::full, "shape"_a, "value"_a, "dtype"_a = DType::f32,
        "device"_a = Device::cpu(), NoGil(), kiln_doc("full"));
  m.def("arange", nb::overload_cast<int64_t, int64_t, int64_t, DType, Device>(&kiln::arange),
        "start"_a, "stop"_a, "step"_a = 1, "dtype"_a = DType::f32, "device"_a = Device::cpu(),
        NoGil(), kiln_doc("arange"));

  // ---- elementwise ----
#define KILN_UNARY(name) m.def(#name, &kiln::name, "x"_a, NoGil(), kiln_doc(#name))
  KILN_UNARY(neg);
  KILN_UNARY(exp);
  KILN_UNARY(log);
  KILN_UNARY(sqrt);
  KILN_UNARY(rsqrt);
  KILN_UNARY(tanh);
  KILN_UNARY(erf);
  KILN_UNARY(gelu);
  KILN_UNARY(gelu_tanh);
  KILN_UNARY(relu);
  KILN_UNARY(abs);
  KILN_UNARY(square);
  KILN_UNARY(sin);
  KILN_UNARY(cos);
  KILN_UNARY(log1p);
  KILN_UNARY(expm1);
  KILN_UNARY(sign);
  KILN_UNARY(floor);
  KILN_UNARY(round);
  KILN_UNARY(stop_gradient);
#undef KILN_UNARY
#define KILN_BINARY(name)                                                                      \
  m.def(#name, binary([](const Array& a, const Array& b) { return kiln::name(a, b); }), "a"_a, \
        "b"_a, kiln_doc(#name))
  KILN_BINARY(add);
  KILN_BINARY(subtract);
  KILN_BINARY(multiply);
  KILN_BINARY(divide);
  KILN_BINARY(power);
  KILN_BINARY(maximum);
  KILN_BINARY(minimum);
  KILN_BINARY(equal);
  KILN_BINARY(not_equal);
  KILN_BINARY(less);
  KILN_BINARY(less_equal);
  KILN_BINARY(greater);
  KILN_BINARY(greater_equal);
  KILN_BINARY(logical_and);
  KILN_BINARY(logical_or);
  KILN_BINARY(logical_xor);
#undef KILN_BINARY
  m.def("logical_not", &kiln::logical_not, "x"_a, NoGil(), kiln_doc("logical_not"));
  m.def(
      "where",
      [](const Array& c, nb::handle a, nb::handle b) {
        Array x = nb::isinstance<Array>(a)   ? nb::cast<Array>(a)
                  : nb::isinstance<Array>(b) ? operand(nb::cast<Array>(b), a)
                                             : operand(kiln::zeros({}, DType::f32, c.device()), a);
        Array y = operand(x, b);
        nb::gil_scoped_release release;
        return kiln::where(c, x, y);
      },
      "condition"_a, "x"_a, "y"_a, kiln_doc("where"));
  m.def("astype", &kiln::astype, "x"_a, "dtype"_a, NoGil(), kiln_doc("astype"));
  m.def("clip", &kiln::clip, "x"_a, "lo"_a, "hi"_a, NoGil(), kiln_doc("clip"));
  m.def("cumsum", &kiln::cumsum, "x"_a, "axis"_a, "reverse"_a = false, NoGil(), kiln_doc("cumsum"));
}

// A reduction over `axis`: None (all axes), an int or a sequence of ints.
template <Array (*Reduce)(const Array&, std::vector<int>, bool)>
void def_reduction(nb::module_& m, const char* name) {
  m.def(
      name,
      [](const Array& a, nb::handle axis, bool keepdims) {
        auto ax = axes_of(axis);
        nb::gil_scoped_release release;
        return Reduce(a, ax, keepdims);
      },
      "x"_a, "axis"_a = nb::none(), "keepdims"_a = false, kiln_doc(name));
}

// The bindings of reductions, matmul, layout and the fused primitives.
void bind_reductions_layout(nb::module_& m) {
  // ---- reductions ----
  def_reduction<kiln::sum>(m, "sum");
  def_reduction<kiln::mean>(m, "mean");
  def_reduction<kiln::max>(m, "max");
  m.def("argmax", &kiln::argmax, "x"_a, "axis"_a, "keepdims"_a = false, NoGil(),
        kiln_doc("argmax"));
  m.def("sum_to", &kiln::sum_to, "x"_a, "shape"_a, NoGil(), kiln_doc("sum_to"));
  m.def("argsort", &kiln::argsort, "x"_a, "axis"_a = -1, "descending"_a = false, NoGil(),
        kiln_doc("argsort"));
  m.def("sort", &kiln::sort, "x"_a, "axis"_a = -1, "descending"_a = false, NoGil(),
        kiln_doc("sort"));
  m.def("top_k", &kiln::top_k, "x"_a, "k"_a, NoGil(), kiln_doc("top_k"));
  m.def("take_along_axis", &kiln::take_along_axis, "x"_a, "indices"_a, "axis"_a, NoGil(),
        kiln_doc("take_along_axis"));

  // ---- matmul ----
  m.def(
      "matmul",
      [](const Array& a, const Array& b, bool ta, bool tb, std::optional<DType> out) {
        kiln::MatmulOptions o;
        o.transpose_a = ta;
        o.transpose_b = tb;
        o.out = out;
        return kiln::matmul(a, b, o);
      },
      "a"_a, "b"_a, "transpose_a"_a = false, "transpose_b"_a = false, "out_dtype"_a = nb::none(),
      NoGil(), kiln_doc("matmul"));
  m.def(
      "set_matmul_precision",
      [](const std::string& p) {
        if (p == "fp32" || p == "highest" || p == "float32")
          kiln::set_matmul_precision(kiln::MatmulPrecision::fp32);
        else if (p == "tf32" || p == "high" || p == "tensorfloat32")
          kiln::set_matmul_precision(kiln::MatmulPrecision::tf32);
        else
          kiln::fail("set_matmul_precision",
                     "precision '" + p + "': expected fp32 (highest) or tf32 (high)");
      },
      "precision"_a);
  m.def(
      "matmul_precision",
      [] { return kiln::matmul_precision() == kiln::MatmulPrecision::fp32 ? "fp32" : "tf32"; },
      kiln_doc("matmul_precision"));

  // ---- layout ----
  m.def("reshape", &kiln::reshape, "x"_a, "shape"_a, NoGil(), kiln_doc("reshape"));
  m.def("transpose", nb::overload_cast<const Array&, std::vector<int>>(&kiln::transpose), "x"_a,
        "axes"_a, NoGil(), kiln_doc("transpose"));
  m.def("swapaxes", &kiln::swapaxes, "x"_a, "axis1"_a, "axis2"_a, NoGil(), kiln_doc("swapaxes"));
  m.def("broadcast_to", &kiln::broadcast_to, "x"_a, "shape"_a, NoGil(), kiln_doc("broadcast_to"));
  m.def("concatenate", &kiln::concatenate, "arrays"_a, "axis"_a = 0, NoGil(),
        kiln_doc("concatenate"));
  m.def("slice", &kiln::slice, "x"_a, "start"_a, "stop"_a, "step"_a = Shape{}, NoGil(),
        kiln_doc("slice"));
  m.def("take", &kiln::take, "x"_a, "indices"_a, "axis"_a, NoGil(), kiln_doc("take"));
  m.def("dynamic_slice", &kiln::dynamic_slice, "x"_a, "starts"_a, "sizes"_a, NoGil(),
        kiln_doc("dynamic_slice"));
  m.def("dynamic_update_slice", &kiln::dynamic_update_slice, "x"_a, "update"_a, "starts"_a, NoGil(),
        kiln_doc("dynamic_slice"));
  m.def("one_hot", &kiln::one_hot, "labels"_a, "depth"_a, "dtype"_a = DType::f32, NoGil(),
        kiln_doc("one_hot"));

  // ---- fused neural-network primitives ----
  m.def("softmax", &kiln::softmax, "x"_a, "axis"_a = -1, NoGil(), kiln_doc("softmax"));
  m.def("log_softmax", &kiln::log_softmax, "x"_a, "axis"_a = -1, NoGil(), kiln_doc("log_softmax"));
  m.def(
      "layer_norm",
      [](const Array& x, std::optional<Array> w, std::optional<Array> b, double eps) {
        if (w.has_value() != b.has_value())
          kiln::fail("layer_norm", "give both weight and bias, or neither");
        return w ? kiln::layer_norm(x, *w, *b, eps) : kiln::layer_norm(x, eps);
      },
      "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5, NoGil());
  m.def("softmax_cross_entropy", &kiln::softmax_cross_entropy, "logits"_a, "labels"_a, NoGil(),
        kiln_doc("softmax_cross_entropy"));
  m.def("attention", static_cast<Array (*)(const Array&, double)>(&kiln::attention), "qkv"_a,
        "scale"_a, NoGil(), kiln_doc("attention"));
  m.def(
      "attention",
      [](const Array& q, const Array& k, const Array& v, std::optional<double> scale, bool causal,
         std::optional<Array> bias, std::optional<Array> key_padding_mask) {
        return kiln::attention(q, k, v, {scale, causal, bias, key_padding_mask});
      },
      "q"_a, "k"_a, "v"_a, nb::kw_only(), "scale"_a = nb::none(), "causal"_a = false,
      "bias"_a = nb::none(), "key_padding_mask"_a = nb::none(), NoGil(),
      "Scaled dot-product attention (PyTorch's scaled_dot_product_attention) of q [B, T, H, D] "
      "over k and v [B, S, H, D]: causal (query i sees keys j <= i + S - T, aligned to the last "
      "key), an additive bias broadcast to [B, H, T, S], a bool [B, S] key_padding_mask (True: "
      "a real key); scale defaults to 1/sqrt(D). Rows that see no key are zeros. One primitive "
      "whose backward recomputes the probabilities.");

  // ---- convolution, pooling, normalization over channels (kiln/__init__.py
  // takes PyTorch's forms of the arguments and passes them here normalized) ----
  using Pads = std::vector<std::pair<int64_t, int64_t>>;
  m.def(
      "_conv",
      [](const Array& x, const Array& w, std::vector<int64_t> stride, Pads padding, bool same,
         std::vector<int64_t> dilation, int64_t groups, bool channels_last) {
        const kiln::ConvOptions o{stride, dilation, padding, same, groups, channels_last};
        return x.ndim() == 3 ? kiln::conv1d(x, w, o) : kiln::conv2d(x, w, o);
      },
      "x"_a, "weight"_a, "stride"_a, "padding"_a, "same"_a, "dilation"_a, "groups"_a,
      "channels_last"_a, NoGil());
  m.def(
      "_pool",
      [](const Array& x, bool max, std::vector<int64_t> window, std::vector<int64_t> stride,
         Pads padding, bool channels_last, bool count_include_pad) {
        const kiln::PoolOptions o{stride, padding, channels_last, count_include_pad};
        return max ? kiln::max_pool2d(x, window, o) : kiln::avg_pool2d(x, window, o);
      },
      "x"_a, "max"_a, "window"_a, "stride"_a, "padding"_a, "channels_last"_a, "count_include_pad"_a,
      NoGil());
  m.def("adaptive_avg_pool2d", &kiln::adaptive_avg_pool2d, "x"_a, "height"_a, "width"_a,
        "channels_last"_a = false, NoGil(),
        "PyTorch's AdaptiveAvgPool2d((height, width)) on [N, C, H, W] (or channels last).");
  m.def(
      "batch_norm",
      [](const Array& x, std::optional<Array> running_mean, std::optional<Array> running_var,
         std::optional<Array> weight, std::optional<Array> bias, bool training, double momentum,
         double eps, bool channels_last) {
        const kiln::BatchNormResult r = kiln::batch_norm(
            x, weight.value_or(Array()), bias.value_or(Array()), running_mean.value_or(Array()),
            running_var.value_or(Array()), {training, momentum, eps, channels_last});
        auto given = [](const Array& a) {
          return a.valid() ? std::optional<Array>(a) : std::optional<Array>();
        };
        return std::make_tuple(r.y, given(r.running_mean), given(r.running_var));
      },
      "x"_a, "running_mean"_a = nb::none(), "running_var"_a = nb::none(), "weight"_a = nb::none(),
      "bias"_a = nb::none(), "training"_a = false, "momentum"_a = 0.1, "eps"_a = 1e-5,
      "channels_last"_a = false, NoGil(),
      "PyTorch's batch_norm on [N, C, ...]: returns (y, running_mean, running_var), the running "
      "statistics updated in training (None where none were given).");
  m.def(
      "group_norm",
      [](const Array& x, int64_t groups, std::optional<Array> weight, std::optional<Array> bias,
         double eps) {
        return kiln::group_norm(x, groups, weight.value_or(Array()), bias.value_or(Array()), eps);
      },
      "x"_a, "num_groups"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5,
      NoGil(), "PyTorch's group_norm on [N, C, ...].");
  m.def(
      "pad", [](const Array& x, Pads widths, double value) { return kiln::pad(x, widths, value); },
      "x"_a, "widths"_a, "value"_a = 0.0, NoGil(),
      "NumPy's constant pad: (before, after) for the last len(widths) axes; negative crops.");
  m.def("min", &kiln::min, "x"_a, "axes"_a = std::vector<int>{}, "keepdims"_a = false, NoGil(),
        "The smallest element over `axes` (all: empty); NaN propagates.");
}

// The bindings of evaluation, the lazy mode, autodiff, jit.
void bind_transforms(nb::module_& m) {
  // ---- evaluation and transformations ----
  m.def(
      "eval", [](const std::vector<Array>& xs) { kiln::eval(xs); }, "arrays"_a, NoGil(),
      kiln_doc("eval"));
  m.def(
      "mark_step",
      [](const std::vector<Array>& xs) {
        static std::mutex mu;  // the lazy mode's executable cache is the process's
        std::lock_guard lock(mu);
        kiln::mark_step(xs);
      },
      "arrays"_a, NoGil(), kiln_doc("mark_step"));
  m.def(
      "lazy_cache_stats", [] { return stats_dict(kiln::lazy_cache_stats()); },
      kiln_doc("lazy_cache_stats"));
  m.def("is_lazy", &kiln::is_lazy, kiln_doc("is_lazy"));
  nb::class_<Lazy>(m, "_LazyScope")
      .def(nb::init<>())
      .def("__enter__",
           [](Lazy& l) {
             if (l.scope) kiln::fail("lazy", "this scope is entered already");
             l.scope = std::make_unique<kiln::LazyScope>();
           })
      .def("__exit__", [](Lazy& l, nb::args) { l.scope.reset(); });

  m.def(
      "_value_and_grad",
      [](nb::callable fn, const std::vector<Array>& primals) {
        auto holder = std::make_shared<PyFn>(std::move(fn));
        auto f = [holder](const std::vector<Array>& p) {
          nb::gil_scoped_acquire gil;
          return nb::cast<Array>(holder->fn(p));
        };
        nb::gil_scoped_release release;
        return kiln::value_and_grad_vector(f, primals);
      },
      "fn"_a, "primals"_a,
      "fn(primals) -> scalar Array; returns (value, gradients of each primal).");
  m.def(
      "_vjp",
      [](nb::callable fn, const std::vector<Array>& primals, const std::vector<Array>& cts) {
        auto f = vector_fn(std::move(fn));
        nb::gil_scoped_release release;
        return kiln::vjp(f, primals, cts);
      },
      "fn"_a, "primals"_a, "cotangents"_a,
      "fn(primals) -> list of Arrays; returns (outputs, cotangents of the primals).");

  nb::class_<PyJitted>(m, "_Jitted", nb::type_slots(jitted_slots))
      .def(
          "__init__",
          [](PyJitted* j, nb::callable fn, std::vector<int> donate, size_t capacity) {
            new (j) PyJitted(std::move(fn), kiln::JitOptions{std::move(donate), capacity});
          },
          "fn"_a, "donate"_a = std::vector<int>{}, "cache_capacity"_a = 8)
      .def(
          "__call__",
          [](PyJitted& j, const std::vector<Array>& args) {
            std::lock_guard lock(j.mu);
            return j.jitted(args);
          },
          "args"_a, NoGil())
      .def("cache_stats", [](const PyJitted& j) { return stats_dict(j.jitted.cache_stats()); })
      .def("last_compile", [](const PyJitted& j) { return compile_dict(j.jitted.last_compile()); });
}

// The bindings of random keys and draws.
void bind_random(nb::module_& m) {
  // ---- random ----
  nb::class_<kiln::random::Key>(m, "Key", "A counter-based random key (Threefry-2x32).")
      .def(nb::init<uint64_t>(), "seed"_a)
      .def(nb::init<uint32_t, uint32_t>(), "hi"_a, "lo"_a)
      .def_prop_ro("bits",
                   [](const kiln::random::Key& k) { return nb::make_tuple(k.k[0], k.k[1]); })
      .def(
          "__eq__", [](const kiln::random::Key& a, const kiln::random::Key& b) { return a == b; },
          "other"_a.none())
      .def(
          "__hash__",
          [](const kiln::random::Key& k) { return (static_cast<uint64_t>(k.k[0]) << 32) | k.k[1]; })
      .def("__repr__", [](const kiln::random::Key& k) {
        return "Key(" + std::to_string(k.k[0]) + ", " + std::to_string(k.k[1]) + ")";
      });
  m.def("_split", &kiln::random::split, "key"_a, "num"_a = 2);
  m.def("_fold_in", &kiln::random::fold_in, "key"_a, "data"_a);
  m.def("_uniform", &kiln::random::uniform, "key"_a, "shape"_a, "low"_a, "high"_a, "dtype"_a,
        "device"_a, NoGil());
  m.def("_normal", &kiln::random::normal, "key"_a, "shape"_a, "dtype"_a, "device"_a, NoGil());
  m.def("_truncated_normal", &kiln::random::truncated_normal, "key"_a, "shape"_a, "lower"_a,
        "upper"_a, "dtype"_a, "device"_a, NoGil());
  m.def("_bernoulli",
        nb::overload_cast<const kiln::random::Key&, const Shape&, double, Device>(
            &kiln::random::bernoulli),
        "key"_a, "shape"_a, "p"_a, "device"_a, NoGil());
  m.def("_gamma", &kiln::random::gamma, "key"_a, "shape"_a, "a"_a, "dtype"_a, "device"_a, NoGil());
  m.def("_beta", &kiln::random::beta, "key"_a, "shape"_a, "a"_a, "b"_a, "dtype"_a, "device"_a,
        NoGil());
  m.def("_randint", &kiln::random::randint, "key"_a, "shape"_a, "low"_a, "high"_a, "device"_a,
        NoGil());
  m.def("_categorical", &kiln::random::categorical, "key"_a, "logits"_a, "axis"_a, NoGil());
}

// The bindings of the ViT and its config.
void bind_nn_io(nb::module_& m) {
  // ---- nn ----
  using kiln::nn::ViTConfig;
  nb::enum_<kiln::nn::Layout>(m, "Layout")
      .value("NCHW", kiln::nn::Layout::NCHW)
      .value("NHWC", kiln::nn::Layout::NHWC);
  nb::class_<ViTConfig>(m, "ViTConfig",
                        "transformers' ViTConfig, field for field: ViTConfig() is "
                        "transformers' default (ViT-Base/16), ViTConfig(\"vit-tiny\") a preset "
                        "(vit-tiny, vit-small, vit-base, vit-large, vit-fmnist); keyword "
                        "arguments set fields.")
      .def(
          "__init__",
          [](ViTConfig* c, std::optional<std::string> preset, nb::kwargs fields) {
            ViTConfig v = preset ? ViTConfig::preset(*preset) : ViTConfig();
            for (auto [k, val] : fields) set_config_field(v, nb::cast<std::string>(k), val);
            new (c) ViTConfig(std::move(v));
          },
          "preset"_a = nb::none(), "fields"_a)
      .def_static("preset", &ViTConfig::preset, "name"_a)
      .def_static("preset_names", &ViTConfig::preset_names)
      .def_rw("hidden_size", &ViTConfig::hidden_size)
      .def_rw("num_hidden_layers", &ViTConfig::num_hidden_layers)
      .def_rw("num_attention_heads", &ViTConfig::num_attention_heads)
      .def_rw("intermediate_size", &ViTConfig::intermediate_size)
      .def_rw("hidden_dropout_prob", &ViTConfig::hidden_dropout_prob)
      .def_rw("attention_probs_dropout_prob", &ViTConfig::attention_probs_dropout_prob)
      .def_rw("initializer_range", &ViTConfig::initializer_range)
      .def_rw("layer_norm_eps", &ViTConfig::layer_norm_eps)
      .def_rw("num_channels", &ViTConfig::num_channels)
      .def_rw("qkv_bias", &ViTConfig::qkv_bias)
      .def_rw("num_labels", &ViTConfig::num_labels)
      .def_rw("id2label", &ViTConfig::id2label)
      .def_prop_rw(
          "hidden_act", [](const ViTConfig& c) { return kiln::nn::activation_name(c.hidden_act); },
          [](ViTConfig& c, nb::handle v) { set_config_field(c, "hidden_act", v); })
      .def_prop_rw(
          "image_size", [](const ViTConfig& c) { return size2d(c.image_size); },
          [](ViTConfig& c, nb::handle v) { set_config_field(c, "image_size", v); })
      .def_prop_rw(
          "patch_size", [](const ViTConfig& c) { return size2d(c.patch_size); },
          [](ViTConfig& c, nb::handle v) { set_config_field(c, "patch_size", v); })
      .def_prop_ro("num_patches", &ViTConfig::num_patches)
      .def("validate", [](const ViTConfig& c) { c.validate(); })
      .def("train_flops_per_image", [](const ViTConfig& c) { return c.train_flops_per_image(); })
      .def(
          "to_json_file",
          [](const ViTConfig& c, const std::string& path) { kiln::io::save_config(path, c); },
          "path"_a)
      .def_static(
          "from_json_file",
          [](const std::string& path) { return kiln::io::load_config<ViTConfig>(path); }, "path"_a)
      .def("__copy__", [](const ViTConfig& c) { return ViTConfig(c); })
      .def(
          "__deepcopy__", [](const ViTConfig& c, nb::handle) { return ViTConfig(c); }, "memo"_a)
      .def("__repr__", [](const ViTConfig& c) {
        return "ViTConfig(hidden_size=" + std::to_string(c.hidden_size) +
               ", num_hidden_layers=" + std::to_string(c.num_hidden_layers) +
               ", num_attention_heads=" + std::to_string(c.num_attention_heads) +
               ", intermediate_size=" + std::to_string(c.intermediate_size) +
               ", image_size=" + kiln::nn::to_string(c.image_size) +
               ", patch_size=" + kiln::nn::to_string(c.patch_size) +
               ", num_channels=" + std::to_string(c.num_channels) +
               ", num_labels=" + std::to_string(c.num_labels) + ")";
      });

  using kiln::nn::ViTForImageClassification;
  nb::class_<ViTForImageClassification>(m, "_ViT")
      .def(nb::init<ViTConfig>(), "config"_a)
      .def_prop_ro("config", &ViTForImageClassification::config)
      .def("init", &ViTForImageClassification::init, "key"_a, "device"_a = Device::cpu(), NoGil())
      .def("parameter_shapes", &ViTForImageClassification::parameter_shapes)
      .def("check", &ViTForImageClassification::check, "params"_a, "origin"_a)
      .def(
          "apply",
          [](const ViTForImageClassification& vit, const kiln::Params& params, const Array& pixels,
             kiln::nn::Layout layout, bool train, std::optional<kiln::random::Key> key,
             std::optional<Array> key_array, DType matmul_dtype, bool fused_attention,
             bool inference) {
            kiln::nn::ApplyOptions o;
            o.layout = layout;
            o.train = train;
            if (key) o.dropout_key = *key;
            if (key_array) o.dropout_key_array = *key_array;
            o.matmul_dtype = matmul_dtype;
            o.fused_attention = fused_attention;
            o.inference = inference;
            return vit.apply(params, pixels, o);
          },
          "params"_a, "pixels"_a, "layout"_a, "train"_a, "dropout_key"_a.none(),
          "dropout_key_array"_a.none(), "matmul_dtype"_a, "fused_attention"_a,
          "inference"_a = false, NoGil())
      .def("loss", &ViTForImageClassification::loss, "logits"_a, "labels"_a,
           "label_smoothing"_a = 0.0, NoGil());
  m.def("_key_array", &kiln::random::key_array, "key"_a, "device"_a = Device::cpu());
}

// The config of a pretrained ViT (kiln.nn.ViT's from_pretrained); another
// family, DeiT included, is an error pointing to kiln.models.
const kiln::nn::ViTConfig& vit_config_of(const kiln::io::Pretrained& p, const std::string& src) {
  const kiln::nn::ViTForImageClassification* vit = kiln::nn::as_vit(*p.model);
  if (!vit || vit->variant() != kiln::nn::ViTVariant::ViT)
    kiln::fail("model", src + ": a " + p.model->architecture() + " (model_type \"" +
                            p.model->model_type() +
                            "\"), not a ViT; kiln.models.from_pretrained loads every family");
  return vit->config();
}

// The bindings of pretrained models, save_pretrained and safetensors.
void bind_io(nb::module_& m) {
  // ---- io ----
  m.def(
      "_load_pretrained",
      [](const std::string& src) {
        kiln::io::Pretrained p;
        {
          nb::gil_scoped_release release;
          p = kiln::io::load_pretrained(src);
        }
        return nb::make_tuple(vit_config_of(p, src), p.params, p.has_classifier, p.notes, p.dir);
      },
      "src"_a);
  m.def(
      "_adapt_classifier",
      [](const std::string& src, std::vector<std::string> labels, const kiln::random::Key& key,
         std::optional<nb::object> image_size) {
        std::optional<kiln::nn::Size2d> size;
        if (image_size) size = to_size2d(*image_size, "image_size");
        kiln::io::Pretrained p;
        {
          nb::gil_scoped_release release;
          p = kiln::io::load_pretrained(src);
          kiln::io::adapt_classifier(p, labels, key);
          if (size) kiln::io::set_image_size(p, *size);
        }
        return nb::make_tuple(vit_config_of(p, src), p.params, p.notes);
      },
      "src"_a, "labels"_a, "key"_a, "image_size"_a.none());
  m.def(
      "_save_pretrained",
      [](const std::string& dir, const kiln::nn::ViTConfig& cfg, const kiln::Params& params) {
        kiln::io::save_pretrained(dir, *kiln::nn::vit_model(cfg), params);
      },
      "dir"_a, "config"_a, "params"_a, NoGil());
  m.def(
      "load_safetensors",
      [](const std::string& path) { return kiln::io::load_safetensors(path).tensors; }, "path"_a,
      NoGil(), kiln_doc("load_safetensors"));
  m.def("save_safetensors", &kiln::io::save_safetensors, "path"_a, "tensors"_a,
        "metadata"_a = std::map<std::string, std::string>{}, NoGil(), kiln_doc("save_safetensors"));
}

// The bindings of the optimizers' update rules, schedules, clipping.
// Models of every family behind kiln::nn::Model (kiln.models).
// ---- layers (kiln/layers.h) -------------------------------------------------

// What each layer binding shares: its declarations, init, and a forward
// through a Scope of the options Python gives; `call` runs the layer.
template <typename L, typename Call>
void layer_methods(nb::class_<L>& c, Call call) {
  namespace nn = kiln::nn;
  c.def("declarations",
        [](const L& l) {
          nn::Decls d;
          l.declare(d);
          return nn::shapes_of(d);
        })
      .def(
          "init",
          [](const L& l, const kiln::random::Key& key, Device device) {
            nn::Decls d;
            l.declare(d);
            return nn::init_params(d, key, device);
          },
          "key"_a, "device"_a = Device::cpu(), NoGil())
      .def(
          "apply",
          [call](const L& l, const kiln::Params& params, const kiln::Params& state, const Array& x,
                 kiln::nn::Layout in, kiln::nn::Layout out, bool train, bool drop,
                 std::optional<Array> key, DType matmul_dtype, bool fused, bool inference) {
            nn::ModelOptions o{.layout = in,
                               .train = train,
                               .drop = drop,
                               .matmul_dtype = matmul_dtype,
                               .fused_attention = fused,
                               .inference = inference};
            if (key) o.key = *key;
            nn::Scope s(params, state, std::move(o), "nn");
            Array y = call(l, s, x, in, out);
            return std::pair{y, s.take_state()};
          },
          "params"_a, "state"_a, "x"_a, "layout"_a, "out_layout"_a, "train"_a, "drop"_a, "key"_a.none(),
          "matmul_dtype"_a, "fused_attention"_a, "inference"_a, NoGil());
}

void bind_layers(nb::module_& m) {
  namespace nn = kiln::nn;
  using nn::Layout;
  using nn::Scope;
  nb::class_<nn::Init>(m, "_Init")
      .def_static("zeros", &nn::Init::zeros)
      .def_static("ones", &nn::Init::ones)
      .def_static("constant", &nn::Init::constant, "value"_a)
      .def_static("normal", &nn::Init::normal, "std"_a)
      .def_static("truncated_normal", &nn::Init::truncated_normal, "std"_a)
      .def_static("uniform", &nn::Init::uniform, "bound"_a)
      .def_static("kaiming_normal_fan_out", &nn::Init::kaiming_normal_fan_out, "fan_out"_a)
      .def_static("torch_default", &nn::Init::torch_default, "fan_in"_a);

  nb::class_<nn::Linear> linear(m, "_Linear");
  linear.def(nb::init<>())
      .def_rw("name", &nn::Linear::name)
      .def_rw("in_features", &nn::Linear::in)
      .def_rw("out_features", &nn::Linear::out)
      .def_rw("bias", &nn::Linear::bias)
      .def_rw("weight_init", &nn::Linear::weight_init)
      .def_rw("bias_init", &nn::Linear::bias_init);
  layer_methods(linear, [](const nn::Linear& l, Scope& s, const Array& x, Layout, Layout) {
    return l(s, x);
  });

  auto size_prop = [](auto& cls, const char* name, nn::Size2d nn::Conv2d::*field) {
    cls.def_prop_rw(
        name, [field](const nn::Conv2d& c) { return size2d(c.*field); },
        [field, name](nn::Conv2d& c, nb::handle v) { c.*field = to_size2d(v, name); });
  };
  nb::class_<nn::Conv2d> conv(m, "_Conv2d");
  conv.def(nb::init<>())
      .def_rw("name", &nn::Conv2d::name)
      .def_rw("in_channels", &nn::Conv2d::in)
      .def_rw("out_channels", &nn::Conv2d::out)
      .def_rw("padding", &nn::Conv2d::padding)
      .def_rw("same", &nn::Conv2d::same)
      .def_rw("groups", &nn::Conv2d::groups)
      .def_rw("bias", &nn::Conv2d::bias)
      .def_rw("weight_init", &nn::Conv2d::weight_init)
      .def_rw("bias_init", &nn::Conv2d::bias_init)
      .def_rw("patch_matmul", &nn::Conv2d::patch_matmul);
  size_prop(conv, "kernel_size", &nn::Conv2d::kernel);
  size_prop(conv, "stride", &nn::Conv2d::stride);
  size_prop(conv, "dilation", &nn::Conv2d::dilation);
  layer_methods(conv, [](const nn::Conv2d& c, Scope& s, const Array& x, Layout in, Layout out) {
    return c(s, x, in, out);
  });

  nb::class_<nn::LayerNorm> ln(m, "_LayerNorm");
  ln.def(nb::init<>())
      .def_rw("name", &nn::LayerNorm::name)
      .def_rw("dim", &nn::LayerNorm::dim)
      .def_rw("eps", &nn::LayerNorm::eps)
      .def_rw("channels_first", &nn::LayerNorm::channels_first);
  layer_methods(ln, [](const nn::LayerNorm& l, Scope& s, const Array& x, Layout, Layout) {
    return l(s, x);
  });

  nb::class_<nn::BatchNorm> bn(m, "_BatchNorm");
  bn.def(nb::init<>())
      .def_rw("name", &nn::BatchNorm::name)
      .def_rw("dim", &nn::BatchNorm::dim)
      .def_rw("eps", &nn::BatchNorm::eps)
      .def_rw("momentum", &nn::BatchNorm::momentum)
      .def("init_state", [](const nn::BatchNorm& b, Device device) {
        nn::Decls d;
        b.declare_state(d);
        return nn::init_state(d, device);
      }, "device"_a = Device::cpu());
  layer_methods(bn, [](const nn::BatchNorm& b, Scope& s, const Array& x, Layout in, Layout) {
    return b(s, x, in);
  });

  nb::class_<nn::Embedding> emb(m, "_Embedding");
  emb.def(nb::init<>())
      .def_rw("name", &nn::Embedding::name)
      .def_rw("num_embeddings", &nn::Embedding::num)
      .def_rw("dim", &nn::Embedding::dim)
      .def_rw("init_", &nn::Embedding::init);
  layer_methods(emb, [](const nn::Embedding& e, Scope& s, const Array& x, Layout, Layout) {
    return e(s, x);
  });

  // Dropout and DropPath declare nothing; they take `declare` for the shared methods.
  struct DropoutLayer : nn::Dropout {
    void declare(nn::Decls&) const {}
  };
  struct DropPathLayer : nn::DropPath {
    void declare(nn::Decls&) const {}
  };
  nb::class_<DropoutLayer> dropout(m, "_Dropout");
  dropout.def(nb::init<>()).def_prop_rw(
      "p", [](const DropoutLayer& d) { return d.p; }, [](DropoutLayer& d, double p) { d.p = p; });
  layer_methods(dropout, [](const DropoutLayer& d, Scope& s, const Array& x, Layout, Layout) {
    return d(s, x);
  });
  nb::class_<DropPathLayer> drop_path(m, "_DropPath");
  drop_path.def(nb::init<>()).def_prop_rw(
      "p", [](const DropPathLayer& d) { return d.p; }, [](DropPathLayer& d, double p) { d.p = p; });
  layer_methods(drop_path, [](const DropPathLayer& d, Scope& s, const Array& x, Layout, Layout) {
    return d(s, x);
  });

  nb::class_<nn::MultiHeadAttention> mha(m, "_MultiHeadAttention");
  mha.def(nb::init<>())
      .def_rw("query", &nn::MultiHeadAttention::query)
      .def_rw("key", &nn::MultiHeadAttention::key)
      .def_rw("value", &nn::MultiHeadAttention::value)
      .def_rw("output", &nn::MultiHeadAttention::output)
      .def_rw("dim", &nn::MultiHeadAttention::dim)
      .def_rw("heads", &nn::MultiHeadAttention::heads)
      .def_rw("head_dim", &nn::MultiHeadAttention::head_dim)
      .def_rw("qkv_bias", &nn::MultiHeadAttention::qkv_bias)
      .def_rw("dropout", &nn::MultiHeadAttention::dropout)
      .def_rw("weight_init", &nn::MultiHeadAttention::weight_init);
  layer_methods(mha, [](const nn::MultiHeadAttention& a, Scope& s, const Array& x, Layout, Layout) {
    return a(s, x);
  });

  nb::class_<nn::MLP> mlp(m, "_MLP");
  mlp.def(nb::init<>())
      .def_rw("up", &nn::MLP::up)
      .def_rw("down", &nn::MLP::down)
      .def_prop_rw(
          "activation", [](const nn::MLP& p) { return std::string(nn::activation_name(p.act)); },
          [](nn::MLP& p, const std::string& name) {
            auto a = nn::activation_from_name(name);
            if (!a) {
              std::string known;
              for (const auto& n : nn::activation_names()) known += (known.empty() ? "" : ", ") + n;
              kiln::fail("nn.MLP", "unknown activation '" + name + "', expected one of " + known);
            }
            p.act = *a;
          });
  layer_methods(mlp, [](const nn::MLP& p, Scope& s, const Array& x, Layout, Layout) {
    return p(s, x);
  });
}

void bind_models(nb::module_& m) {
  using kiln::nn::Model;
  using Ptr = std::shared_ptr<Model>;
  // The registry's models are const; Python holds them as they are.
  auto held = [](std::shared_ptr<const Model> p) { return std::const_pointer_cast<Model>(p); };
  nb::class_<Model>(m, "_Model")
      .def_prop_ro("model_type", &Model::model_type)
      .def_prop_ro("architecture", &Model::architecture)
      .def_prop_ro("causal_lm", &Model::causal_lm)
      .def_prop_ro("num_logits", &Model::num_logits)
      .def_prop_ro("num_labels", &Model::num_labels)
      .def_prop_ro("num_channels", &Model::num_channels)
      .def_prop_ro("image_size", [](const Model& md) { return size2d(md.image_size()); })
      .def("label_names", &Model::label_names)
      .def("parameter_shapes", &Model::parameter_shapes)
      .def("state_shapes", &Model::state_shapes)
      .def("head_parameters", &Model::head_parameters)
      .def("config_json", &Model::config_json)
      .def(
          "layer_decay_scales",
          [](const Model& md, double decay) { return kiln::nn::layer_decay_scales(md, decay); },
          "decay"_a)
      .def("init", &Model::init, "key"_a, "device"_a = Device::cpu(), NoGil())
      .def("init_state", &Model::init_state, "device"_a = Device::cpu(), NoGil())
      .def("check", &Model::check, "params"_a, "state"_a, "origin"_a)
      .def(
          "apply",
          [](const Model& md, const kiln::Params& params, const kiln::Params& state,
             const Array& pixels, kiln::nn::Layout layout, bool train, std::optional<Array> key,
             DType matmul_dtype, bool inference) {
            kiln::nn::ModelOptions o{.layout = layout,
                                     .train = train,
                                     .matmul_dtype = matmul_dtype,
                                     .inference = inference};
            if (key) o.key = *key;
            kiln::nn::ModelOutput out = md.apply(params, state, pixels, o);
            return std::pair{out.logits, out.state};
          },
          "params"_a, "state"_a, "pixels"_a, "layout"_a, "train"_a, "key"_a.none(),
          "matmul_dtype"_a, "inference"_a = false, NoGil())
      .def("loss", &Model::loss, "logits"_a, "labels"_a, "label_smoothing"_a = 0.0, NoGil())
      .def(
          "with_labels",
          [held](const Model& md, const std::vector<std::string>& names) {
            return held(md.with_labels(names));
          },
          "names"_a)
      .def("train_flops_per_example", [](const Model& md, nb::handle size) {
        return md.train_flops_per_example(to_size2d(size, "image_size"));
      });
  m.def(
      "_model_from_config",
      [held](const std::string& text, const std::string& origin) -> Ptr {
        return held(kiln::nn::model_from_config(text, origin));
      },
      "text"_a, "origin"_a);
  m.def(
      "_model_from_preset",
      [held](const std::string& name) -> Ptr { return held(kiln::nn::model_from_preset(name)); },
      "name"_a);
  m.def(
      "_generate",
      [](const Model& md, const kiln::Params& params, const Array& prompt, int64_t max_new_tokens,
         double temperature, int64_t top_k, double top_p, uint64_t seed, int64_t eos_token_id,
         int64_t pad_token_id, DType matmul_dtype, bool compiled) {
        const kiln::nn::GPT2LMHeadModel* lm = kiln::nn::as_gpt2(md);
        if (!lm)
          kiln::fail("generate", md.architecture() +
                                     " is not a language model (generate takes GPT2LMHeadModel)");
        return kiln::nn::generate(*lm, params, prompt,
                                  {.max_new_tokens = max_new_tokens,
                                   .temperature = temperature,
                                   .top_k = top_k,
                                   .top_p = top_p,
                                   .seed = seed,
                                   .eos_token_id = eos_token_id,
                                   .pad_token_id = pad_token_id,
                                   .matmul_dtype = matmul_dtype,
                                   .compiled = compiled});
      },
      "model"_a, "params"_a, "prompt"_a, "max_new_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a,
      "seed"_a, "eos_token_id"_a, "pad_token_id"_a, "matmul_dtype"_a, "compiled"_a, NoGil());
  m.def(
      "_inference_params",
      [](const Model& md, const kiln::Params& params, DType matmul_dtype) {
        const kiln::nn::GPT2LMHeadModel* lm = kiln::nn::as_gpt2(md);
        if (!lm)
          kiln::fail("inference_params",
                     md.architecture() + " is not a language model (it takes GPT2LMHeadModel)");
        return lm->inference_params(params, matmul_dtype);
      },
      "model"_a, "params"_a, "matmul_dtype"_a, NoGil());
  using kiln::data::Tokenizer;
  nb::class_<Tokenizer>(m, "_Tokenizer")
      .def_static("from_folder", &Tokenizer::from_folder, "dir"_a, NoGil())
      .def_static("from_json_file", &Tokenizer::from_json_file, "path"_a, NoGil())
      .def_static("from_vocab_and_merges", &Tokenizer::from_vocab_and_merges, "vocab"_a, "merges"_a,
                  "special"_a, NoGil())
      .def(
          "encode", [](const Tokenizer& t, const std::string& text) { return t.encode(text); },
          "text"_a, NoGil())
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<int32_t>& ids) {
            // Bytes of a token cut mid-character stay as they are: bytes, not str.
            const std::string s = t.decode(ids);
            return nb::bytes(s.data(), s.size());
          },
          "ids"_a)
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def(
          "token_id", [](const Tokenizer& t, const std::string& token) { return t.token_id(token); },
          "token"_a)
      .def_prop_ro("origin", &Tokenizer::origin);
  m.def("_model_folder", &kiln::io::resolve_model_source, "src"_a, NoGil());
  m.def("_model_types", &kiln::nn::model_types);
  m.def("_model_presets", &kiln::nn::model_presets);
  m.def(
      "_load_model",
      [held](const std::string& src, std::optional<std::vector<std::string>> labels,
             const kiln::random::Key& key) {
        kiln::io::Pretrained p;
        {
          nb::gil_scoped_release release;
          p = kiln::io::load_pretrained(src);
          if (labels) kiln::io::adapt_classifier(p, *labels, key);
        }
        return nb::make_tuple(held(p.model), p.params, p.state, p.has_classifier, p.notes, p.dir);
      },
      "src"_a, "labels"_a.none(), "key"_a);
  m.def(
      "_save_model",
      [](const std::string& dir, const Model& md, const kiln::Params& params,
         const kiln::Params& state) { kiln::io::save_pretrained(dir, md, params, state); },
      "dir"_a, "model"_a, "params"_a, "state"_a, NoGil());
}

void bind_optim(nb::module_& m) {
  // ---- optim: the C++ optimizers' update rules over flat name maps ----
  nb::class_<kiln::optim::Optimizer>(m, "_Optimizer")
      .def_prop_ro("name", &kiln::optim::Optimizer::name)
      .def(
          "init",
          [](const kiln::optim::Optimizer& o, const kiln::Params& p) { return o.init(p).buffers; },
          "params"_a, NoGil())
      .def("scalars", &kiln::optim::Optimizer::scalars, "step"_a, "lr"_a)
      .def(
          "apply",
          [](const kiln::optim::Optimizer& o, const kiln::Params& grads,
             const kiln::Params& buffers, const kiln::Params& params,
             const std::vector<Array>& scalars) {
            auto [out, state] = o.apply(grads, kiln::optim::State{buffers, 0}, params, scalars);
            return std::make_pair(out, state.buffers);
          },
          "grads"_a, "buffers"_a, "params"_a, "scalars"_a, NoGil());
  nb::class_<kiln::optim::SGD, kiln::optim::Optimizer>(m, "_SGD").def(
      "__init__",
      [](kiln::optim::SGD* o, double lr, double momentum, double dampening, double weight_decay,
         bool nesterov, bool exempt, std::map<std::string, double> lr_scale) {
        new (o) kiln::optim::SGD(
            {lr, momentum, dampening, weight_decay, nesterov, exempt, std::move(lr_scale)});
      },
      "lr"_a, "momentum"_a, "dampening"_a, "weight_decay"_a, "nesterov"_a, "exempt_from_decay"_a,
      "lr_scale"_a = std::map<std::string, double>{});
  nb::class_<kiln::optim::AdamW, kiln::optim::Optimizer>(m, "_AdamW")
      .def(
          "__init__",
          [](kiln::optim::AdamW* o, double lr, double b1, double b2, double eps,
             double weight_decay, bool exempt, std::map<std::string, double> lr_scale) {
            new (o) kiln::optim::AdamW({lr, b1, b2, eps, weight_decay, exempt, std::move(lr_scale)});
          },
          "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "exempt_from_decay"_a,
          "lr_scale"_a = std::map<std::string, double>{});
  m.def("no_weight_decay", &kiln::optim::no_weight_decay, "name"_a, kiln_doc("no_weight_decay"));
  m.def(
      "_schedule_factors",
      [](const std::string& kind, int64_t warmup, int64_t total, int64_t n) {
        kiln::optim::Schedule s{kind, warmup, total};
        s.validate();
        std::vector<double> f;
        for (int64_t k = 0; k < n; ++k) f.push_back(s.factor(k));
        return f;
      },
      "kind"_a, "warmup"_a, "total"_a, "n"_a);
  m.def("_clip_by_global_norm", &kiln::optim::clip_by_global_norm, "grads"_a, "max_norm"_a,
        NoGil());
}

// The bindings of data sets, the loader, training runs and the machine.
void bind_data_train(nb::module_& m) {
  // ---- data ----
  using kiln::data::Dataset;
  nb::class_<Dataset>(m, "_Dataset")
      .def("__len__", &Dataset::size)
      .def_prop_ro("image_shape", [](const Dataset& d) { return shape_tuple(d.image_shape()); })
      .def(
          "__getitem__",
          [](const Dataset& d, int64_t i) {
            if (i < 0) i += d.size();
            if (i < 0 || i >= d.size()) throw nb::index_error("data set index out of range");
            std::vector<float> image(kiln::numel(d.image_shape()));
            int32_t label = 0;
            {
              nb::gil_scoped_release release;
              d.get(i, image.data(), &label);
            }
            return nb::make_tuple(Array::from_data(image.data(), d.image_shape(), DType::f32),
                                  label);
          },
          "index"_a);
  m.def(
      "_random_images",
      [](int64_t n, int64_t labels, nb::handle size, int64_t channels, kiln::nn::Layout layout,
         uint64_t seed) {
        return std::shared_ptr<Dataset>(
            std::make_shared<kiln::data::RandomImages>(kiln::data::RandomImagesOptions{
                n, labels, to_size2d(size, "image_size"), channels, layout, seed}));
      },
      "num_samples"_a, "num_labels"_a, "image_size"_a, "channels"_a, "layout"_a, "seed"_a);
  m.def(
      "_fashion_mnist",
      [](const std::string& dir, const std::string& split, kiln::nn::Layout layout, bool hflip,
         uint64_t seed) {
        kiln::data::FashionMnistOptions o;
        o.dir = dir;
        o.split = split;
        o.layout = layout;
        o.hflip = hflip;
        o.seed = seed;
        nb::gil_scoped_release release;
        return std::shared_ptr<Dataset>(std::make_shared<kiln::data::FashionMnist>(o));
      },
      "dir"_a, "split"_a, "layout"_a, "hflip"_a, "seed"_a);
  m.def("_fashion_mnist_classes", &kiln::data::FashionMnist::class_names);
  m.def("_fashion_mnist_dir", [] { return std::string(kiln::data::kFashionMnistDir); });
  m.def(
      "_image_folder",
      [](const std::string& root, const std::string& split, nb::handle size, int64_t channels,
         bool augment, kiln::nn::Layout layout, uint64_t seed) {
        kiln::data::ImageFolderOptions o;
        o.root = root;
        o.split = split;
        o.image_size = to_size2d(size, "image_size");
        o.channels = channels;
        o.augment = augment;
        o.layout = layout;
        o.seed = seed;
        std::shared_ptr<kiln::data::ImageFolder> d;
        {
          nb::gil_scoped_release release;
          d = std::make_shared<kiln::data::ImageFolder>(o);
        }
        return nb::make_tuple(std::shared_ptr<Dataset>(d), d->classes());
      },
      "root"_a, "split"_a, "image_size"_a, "channels"_a, "augment"_a, "layout"_a, "seed"_a);
  m.def(
      "_python_dataset",
      [](nb::object obj) { return std::shared_ptr<Dataset>(std::make_shared<PyDataset>(obj)); },
      "dataset"_a);
  nb::class_<PyLoader>(m, "_Loader")
      .def(
          "__init__",
          [](PyLoader* l, std::shared_ptr<Dataset> dataset, int64_t batch_size, bool shuffle,
             uint64_t seed, bool drop_last, int workers, int prefetch, int64_t start,
             int64_t limit) {
            kiln::data::LoaderOptions o{batch_size, shuffle,  seed,  drop_last,
                                        workers,    prefetch, start, limit};
            new (l) PyLoader{dataset, std::make_unique<kiln::data::Loader>(dataset, o)};
          },
          "dataset"_a, "batch_size"_a, "shuffle"_a, "seed"_a, "drop_last"_a, "workers"_a,
          "prefetch"_a, "start"_a, "limit"_a)
      .def("next",
           [](PyLoader& l) {
             kiln::data::Batch b;
             try {
               nb::gil_scoped_release release;
               b = l.loader->next();
             } catch (const nb::python_error& e) {
               // The loader keeps its worker's error and raises it again on
               // every later call: each raise restores a copy of its own.
               throw nb::python_error(e);
             }
             return nb::make_tuple(b.images, b.labels, b.epoch, b.index);
           })
      .def_prop_ro("batches_per_epoch",
                   [](const PyLoader& l) { return l.loader->batches_per_epoch(); })
      .def_prop_ro("position", [](const PyLoader& l) { return l.loader->position(); })
      .def_prop_ro("wait_seconds", [](const PyLoader& l) { return l.loader->wait_seconds(); });

  // ---- train ----
  m.def("_train_run", &train_run, "flags"_a, "on_step"_a.none(), "on_eval"_a.none(),
        "on_save"_a.none());

  // ---- the machine ----
  m.def("set_num_threads", &kiln::set_num_threads, "n"_a, kiln_doc("set_num_threads"));
  m.def("num_threads", &kiln::num_threads, kiln_doc("num_threads"));
  m.def("cpu_gemm_library", &kiln::cpu_gemm_library, kiln_doc("cpu_gemm_library"));
}

}  // namespace

NB_MODULE(_kiln, m) {
  m.doc() = "kiln's C++ engine (use the kiln package, which builds on this module)";
  bind_arrays(m);
  bind_ops(m);
  bind_reductions_layout(m);
  bind_transforms(m);
  bind_random(m);
  bind_nn_io(m);
  bind_io(m);
  bind_layers(m);
  bind_models(m);
  bind_optim(m);
  bind_data_train(m);
}
