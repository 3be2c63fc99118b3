// kiln's Python module: what its files share (kiln_python::): the includes,
// the GIL release guard, the helpers more than one area uses, and the
// bind_* function of each area (module.cpp calls them in order).
#pragma once

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

#include "kiln/data.h"
#include "kiln/gpt2.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/model.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"
#include "kiln_docstrings.h"

namespace nb = nanobind;
using namespace nb::literals;
using kiln::Array;
using kiln::Device;
using kiln::DeviceType;
using kiln::DType;
using kiln::Shape;

namespace kiln_python {

using NoGil = nb::call_guard<nb::gil_scoped_release>;

// arrays.cpp: whether a numpy or DLPack view still reads a's buffer (a
// jitted function then refuses to donate it); arrays from numpy and DLPack;
// a shape as a Python tuple.
bool is_exported(const Array& a);
// A new kiln array holding a copy of x (any DLPack-capable or numpy array),
// in x's dtype, or `bits_of`: x's bytes read as that dtype.
Array from_ndarray(nb::ndarray<nb::ro> x, std::optional<Device> device,
                   std::optional<DType> bits_of);
nb::tuple shape_tuple(const Shape& s);

// ops.cpp: a Python number (or array) as an operand beside `like`, taking
// its dtype as JAX's weak types do; an axis argument (None, int, sequence).
Array operand(const Array& like, nb::handle x);
bool is_operand(nb::handle x);
std::vector<int> axes_of(nb::handle axis);

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

// transforms.cpp and data.cpp:
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

// nn.cpp: an image size as Python gives and takes it (an int or (h, w)).
nb::object size2d(const kiln::nn::Size2d& s);
kiln::nn::Size2d to_size2d(nb::handle h, const char* what);

void bind_arrays(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_reductions_layout(nb::module_& m);
void bind_transforms(nb::module_& m);
void bind_random(nb::module_& m);
void bind_nn_io(nb::module_& m);
void bind_io(nb::module_& m);
void bind_layers(nb::module_& m);
void bind_models(nb::module_& m);
void bind_optim(nb::module_& m);
void bind_data(nb::module_& m);
void bind_train(nb::module_& m);

}  // namespace kiln_python
