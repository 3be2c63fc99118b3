// kiln's Python module: the C++ optimizers' update rules over flat name maps.
#include "common.h"

namespace kiln_python {

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
            new (o)
                kiln::optim::AdamW({lr, b1, b2, eps, weight_decay, exempt, std::move(lr_scale)});
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

}  // namespace kiln_python
