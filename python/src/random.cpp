// kiln's Python module: keys and draws (kiln.random).
#include "common.h"

namespace kiln_python {

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

}  // namespace kiln_python
